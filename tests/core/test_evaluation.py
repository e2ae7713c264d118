"""evaluate() returns one typed result (issue 30, item 4): a frozen :class:`~zeroplanner.costmodel.Evaluation` whose
fields are named like :class:`~zeroplanner.costmodel.Estimate`'s, the maps of where each term lives derived from the
term registry (:data:`~zeroplanner.costmodel.terms.TERM_INFO`), and an app that reads fields, not strings."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from zeroplanner.costmodel import Candidates, Estimate, Evaluation, estimate, evaluate, make_context
from zeroplanner.costmodel.evaluate import PHASES, REPORTED_APART, TIME_TERM_SYMBOLS, step_terms
from zeroplanner.costmodel import explain_terms as et
from zeroplanner.costmodel.evaluation import field_value
from zeroplanner.costmodel.terms import (MEMORY_TERM_KEYS, TERM_FIELDS, TERM_INFO, TIME_TERM_QUANTITIES,
                                         term_value)
from zeroplanner.explain import KEYS, explain
from zeroplanner.scenarios import build_scenario

ROOT = Path(__file__).resolve().parents[2] / "zeroplanner"

SCENARIOS = {
    "default": {},
    "stage3-2nodes": dict(stage=3, nodes=2),
    "stage3-nvme": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", model="llama-2-13b"),
    "stage2-cpu-lora": dict(stage=2, offload_optimizer="cpu", lora_rank=16),
    "ulysses": dict(model="llama-3.1-8b", seq_len=65536, sequence_parallel_size=8, stage=3),
    "checkpoint-offload": dict(model="llama-3.1-8b", seq_len=32768, checkpoint_offload=True, stage=3),
}

ESTIMATE_ELSEWHERE = {
    "fits_nvme": "part of Estimate.fits",
    "batch_data_parallel_degree": "data_parallel_degree / sequence_parallel_size",
    "autotp_seconds_per_step": "inside communication.exposed_seconds_per_step",
    "communication.collectives_exposed_seconds_per_step": "communication.exposed_seconds_per_step less the hooks",
    "communication.all_reduce": "communication.by_collective['all_reduce']",
    "communication.reduce_scatter": "communication.by_collective['reduce_scatter']",
    "communication.all_gather": "communication.by_collective['all_gather']",
    "communication.all_to_all": "communication.by_collective['all_to_all'] (when not 0)",
    "step_peak.phase_index": "step_peak.phase (its name in timeline.PHASES)",
}
"""Evaluation fields Estimate has in another form (every other field has Estimate's name and path)."""


def _leaves(obj, prefix: str = "") -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name == "timeline":  # the timeline's points: one leaf per point and term, as the candidates' arrays
            out.update({f"{prefix}timeline[{k}]": a for k, a in v.by_point().items()})
        elif dataclasses.is_dataclass(v):
            out.update(_leaves(v, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = v
    return out


def _scenario(name):
    return build_scenario(**SCENARIOS[name])


def _one(scenario) -> Evaluation:
    return evaluate(make_context(scenario), Candidates.from_scenario(scenario))


def _has_path(obj, path: str) -> bool:
    try:
        field_value(obj, path)
    except AttributeError:
        return False
    return True


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_field_has_estimates_name_and_value(name):
    """Each Evaluation field is the Estimate's field of the same dotted path (bytes rounded to integers there), or
    is one of the few Estimate shows in another form."""
    s = _scenario(name)
    ev, est = _one(s), estimate(s)
    at = ev.at(0)
    for path, value in _leaves(at).items():
        if path.startswith("step_peak.timeline["):  # a list of points in the Estimate: compared below
            continue
        if path in ESTIMATE_ELSEWHERE:
            assert not _has_path(est, path), path
            continue
        assert _has_path(est, path), f"Evaluation.{path} has no Estimate field of the same name"
        want = field_value(est, path)
        if isinstance(want, bool):
            assert bool(value) == want, path
        elif isinstance(want, int):  # bytes are rounded in the Estimate
            assert int(round(value)) == want, path
        else:
            assert float(value) == want, path
    assert at.step_peak.phase_index == PHASES.index(est.step_peak.phase)
    assert [(p.phase, p.label, p.bytes) for p in est.step_peak.timeline] == [
        (phase, label, {k: int(round(x)) for k, x in terms.items()})
        for phase, label, terms in at.step_peak.timeline.points()]
    assert {k: int(round(getattr(at.communication, k))) for k in est.communication.by_collective} \
        == est.communication.by_collective


def test_the_maps_of_where_terms_live_are_derived_from_the_registry():
    """TERM_FIELDS, the step-time quantities and explain mode's numbers all come from TermInfo.field /
    TermInfo.quantity: every term resolves on an Evaluation and an Estimate to the number explain mode shows."""
    assert TERM_FIELDS == {k: t.field for k, t in TERM_INFO.items()}
    assert TIME_TERM_SYMBOLS == TIME_TERM_QUANTITIES == {k: t.quantity for k, t in TERM_INFO.items() if t.quantity}
    assert not hasattr(et, "EVALUATE_KEYS")  # explain mode keeps no map of its own
    assert set(TERM_INFO) == set(KEYS)
    assert all(TERM_INFO[k].field == f"per_gpu_bytes.{k}" for k in MEMORY_TERM_KEYS)
    evaluation_paths = set(_leaves(_one(build_scenario())))
    estimate_paths = {f"{name}.{sub}" if sub else name
                      for name, f in Estimate.model_fields.items()
                      for sub in (list(f.annotation.model_fields) if hasattr(f.annotation, "model_fields")
                                  else [None])}
    for key, info in TERM_INFO.items():
        assert info.field in evaluation_paths, (key, info.field)
        assert info.field in estimate_paths, (key, info.field)
    for name in SCENARIOS:
        s = _scenario(name)
        ev, est = _one(s), estimate(s)
        steps = step_terms(make_context(s), Candidates.from_scenario(s))
        for key, info in TERM_INFO.items():
            value = float(term_value(ev.at(0), key))
            assert explain(s, key).value == value, (name, key)
            assert abs(float(term_value(est, key)) - value) <= (0.5 if info.unit == "bytes" else 0.0), (name, key)
            if info.quantity:
                assert np.array_equal(steps.values[info.quantity], term_value(ev, key)), (name, key)
        for symbol, path in REPORTED_APART.items():
            assert float(field_value(est, path)) == float(field_value(ev.at(0), path)), (name, symbol)


def test_evaluation_is_frozen_typed_and_has_no_string_interface():
    ev = _one(build_scenario())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.step_seconds = 0.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.per_gpu_bytes.total = 0.0  # type: ignore[misc]
    for cls in (Evaluation, type(ev.per_gpu_bytes), type(ev.communication), type(ev.step_peak)):
        assert not hasattr(cls, "__getitem__") and not hasattr(cls, "keys") and not hasattr(cls, "get"), cls


def test_take_split_concat_and_at_keep_every_value():
    s = build_scenario(stage=3, nodes=2)
    ctx = make_context(s)
    base = Candidates.from_scenario(s)
    grid = Candidates.build(**{f: getattr(base, f) for f in base.__dataclass_fields__ if f not in ("stage", "nodes")},
                            stage=np.array([[0], [1], [2], [3]]), nodes=np.array([[1, 2, 4]]))
    full = evaluate(ctx, grid)
    assert full.shape == (4, 3)
    a, b = grid.take(slice(0, 2)), grid.take(slice(2, 4))
    joined = Evaluation.concat(evaluate(ctx, a), evaluate(ctx, b))
    back = joined.split((2, 3), (2, 3))
    for part, rows in zip(back, (slice(0, 2), slice(2, 4))):
        want = _leaves(full.take(rows))
        for path, value in _leaves(part).items():
            assert np.array_equal(value, want[path]), path
    for path, value in _leaves(full.at((3, 1))).items():
        assert value == np.asarray(_leaves(full)[path]).reshape(4, 3)[3, 1], path
    assert full.at((3, 1)) == full.at(3 * 3 + 1)


def _string_subscripts_of_values(path: Path) -> list[str]:
    """``values["fits"]``-style reads (a string subscript of a name the evaluation is usually bound to)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {"values", "vvalues", "v", "v2", "out", "vals"}
    old_keys = {"fits", "fits_gpu", "fits_cpu", "fits_nvme", "peak", "headroom", "memory_risky", "total",
                "tokens_per_second", "step_seconds", "compute_seconds", "comm_exposed_seconds", "offload_seconds",
                "optimizer_seconds", "host_per_node", "nvme_per_node", "comm_wire_bytes", "activations",
                "autotp_seconds", "peak_phase", "collectives_exposed_seconds", "fetch_overhead_seconds",
                "hook_seconds", "sequence_parallel_size", "sp_all_to_all_seconds", "checkpoint_offload_seconds"}
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names
                and isinstance(node.slice, ast.Constant) and node.slice.value in old_keys):
            bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {node.value.id}[{node.slice.value!r}]")
    return bad


def test_consumers_read_fields_not_strings():
    """No consumer of evaluate() indexes its result by string; the app (ui/state.py) reads the planner's results
    and estimates through their fields: no untyped ``_attr(obj, "name")`` helper, no ``getattr`` with a constant
    name."""
    files = [*sorted((ROOT / "planner").glob("*.py")), *sorted((ROOT / "costmodel").glob("*.py")),
             ROOT / "pitfalls.py", ROOT / "deepspeed" / "lint.py", ROOT / "ui" / "state.py"]
    bad = [b for f in files for b in _string_subscripts_of_values(f)]
    assert not bad, bad
    state = ROOT / "ui" / "state.py"
    text = state.read_text(encoding="utf-8")
    assert "_attr(" not in text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            assert not (len(node.args) > 1 and isinstance(node.args[1], ast.Constant)), \
                f"ui/state.py:{node.lineno}: {node.func.id} with a constant name"


@pytest.mark.parametrize("name", list(SCENARIOS) + ["qlora", "grid"])
def test_parts_that_apply_nowhere_are_zero_without_being_computed(name, monkeypatch):
    """terms.term skips the expression of a part whose condition is False for every candidate (issue 35: half the
    parts of a one-candidate evaluate). Every value, array shape and dtype must be what np.where over the computed
    expression gives: evaluate once with the skip, once with every expression computed, and compare leaf by leaf."""
    from zeroplanner.costmodel import activations, communication, memory, terms
    from zeroplanner.planner.grid import candidate_grid

    kw = {"qlora": dict(model="llama-2-13b", lora_rank=16, qlora=True, stage=3), "grid": {}}.get(name)
    s = build_scenario(**kw) if kw is not None else _scenario(name)
    cand = candidate_grid(s) if name == "grid" else Candidates.from_scenario(s)
    fast = _leaves(evaluate(make_context(s), cand))

    def computing(key, inputs, parts, *, shared=False):  # term() as it was: every expression computed
        out = []
        for label, expr, when in parts:
            value = terms.evaluate_expr(expr, inputs)
            if when is True:
                out.append(terms.PartValue(label, expr, terms._ALL, np.asarray(value, dtype=np.float64)))
            else:
                applies = np.asarray(when, dtype=bool)
                out.append(terms.PartValue(label, expr, applies, np.where(applies, value, 0.0)))
        return terms.TermParts(key, inputs if shared else dict(inputs), tuple(out))

    for module in (terms, memory, activations, communication):
        if hasattr(module, "term"):
            monkeypatch.setattr(module, "term", computing)
    slow = _leaves(evaluate(make_context(s), cand))
    assert set(fast) == set(slow)
    for k, a in slow.items():
        b = fast[k]
        assert np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype, k
        assert np.array_equal(np.asarray(a), np.asarray(b)), k


@pytest.mark.parametrize("name", list(SCENARIOS) + ["grid"])
def test_memory_only_fits_are_evaluates(name):
    """costmodel.evaluate.fits (the planner's largest-model and longest-sequence sweeps) skips the step time and
    ZeRO-3's fetch-schedule replay; what fits must be evaluate's, field by field."""
    from zeroplanner.costmodel.evaluate import fits
    from zeroplanner.planner.grid import candidate_grid

    s = build_scenario() if name == "grid" else _scenario(name)
    cand = candidate_grid(s) if name == "grid" else Candidates.from_scenario(s)
    ctx = make_context(s)
    full, only = evaluate(ctx, cand), fits(ctx, cand)
    for field in ("fits_gpu", "fits_cpu", "fits_nvme", "fits"):
        assert np.array_equal(getattr(full, field), getattr(only, field)), field


def test_one_scenario_is_one_candidate_of_shape_1():
    # Candidates.build broadcasts scalars to one candidate, shape (1,), as np.ascontiguousarray of the broadcast
    # did (at least 1-D): an estimate's values index, take and concatenate like any evaluation's
    s = build_scenario()
    cand = Candidates.from_scenario(s)
    assert cand.shape == (1,) and all(getattr(cand, f.name).shape == (1,) for f in dataclasses.fields(cand))
    v = evaluate(make_context(s), cand)
    assert v.shape == (1,) and isinstance(v.data_parallel_degree, np.ndarray)
    assert v.take(np.array([0])).tokens_per_second.tolist() == v.tokens_per_second.tolist()
    assert Evaluation.concat(v, v).shape == (2,)
    assert v.split((1,))[0].tokens_per_second.tolist() == v.tokens_per_second.tolist()
    assert v.split(1)[0].shape == (1,)  # an int shape, as np.prod accepted


def test_timeline_bytes_beyond_int64_are_exact():
    # the Estimate's timeline rounds every point's bytes in one numpy call below 2**63 and with int(round(x)) above
    # it: a 4M-token eager-attention step at ZeRO-0 holds more than 2**63 bytes (no overflow to negative numbers)
    s = build_scenario(model="llama-2-70b", seq_len=2**22, flash_attention=False, checkpointing="none",
                       micro_batch=64, grad_accum=1, stage=0)
    est = estimate(s)
    v = evaluate(make_context(s), Candidates.from_scenario(s)).at(0)
    want = [{k: int(round(x)) for k, x in terms.items()} for _, _, terms in v.step_peak.timeline.points()]
    got = [p.bytes for p in est.step_peak.timeline]
    assert got == want
    assert max(max(b.values()) for b in got) > 2**63 and min(min(b.values()) for b in got) >= 0
