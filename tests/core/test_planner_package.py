"""The planner package stays readable: ``plan()`` is a short composition (grid -> one evaluation -> ranking ->
reasons -> Plan) with no English in it (every sentence lives in ``zeroplanner/planner/reasons.py``), and no module
of the package grows past 600 lines."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import numpy as np
import pytest

import zeroplanner.planner as planner
from zeroplanner import build_scenario
from zeroplanner.planner import grid, search

PACKAGE = Path(planner.__file__).parent
MAX_PLAN_LINES = 60
MAX_FILE_LINES = 600


def _plan_node() -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(planner.plan))).body[0]
    assert isinstance(node, ast.FunctionDef) and node.name == "plan"
    return node


def test_plan_is_under_60_lines():
    lines = inspect.getsource(planner.plan).splitlines()  # signature, docstring and body
    assert len(lines) < MAX_PLAN_LINES, f"plan() is {len(lines)} lines"
    node = _plan_node()
    assert node.end_lineno - node.lineno + 1 == len(lines)


def test_plan_writes_no_english():
    """No f-string and no string literal with a space in plan()'s body (its docstring aside): its sentences are
    written in reasons.py."""
    body = _plan_node().body[1:]  # [0] is the docstring
    found = [ast.unparse(n) for stmt in body for n in ast.walk(stmt)
             if isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                                                 and any(ch.isspace() for ch in n.value))]
    assert found == []


def test_no_planner_file_over_600_lines():
    files = sorted(PACKAGE.glob("*.py"))
    assert {"__init__.py", "grid.py", "rank.py", "reasons.py", "sweeps.py", "models.py", "search.py"} <= {
        p.name for p in files}
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    assert {name: n for name, n in sizes.items() if n > MAX_FILE_LINES} == {}, sizes


def test_plan_evaluates_once(monkeypatch):
    """One evaluate call for the grid and the chart variants together (a scenario where ZeRO-0/1/2 fit, so no
    Ulysses or AutoTP grid is added). Counted where the planner calls it."""
    calls = []

    def counting(real):
        def evaluate(ctx, cand):
            calls.append(cand.stage.size)
            return real(ctx, cand)
        return evaluate

    for module in (search, grid):
        monkeypatch.setattr(module, "evaluate", counting(module.evaluate))
    p = planner.plan(build_scenario(), advice=False)
    assert p.fits and len(calls) == 1
    assert calls[0] == p.candidates_evaluated + len(planner.VARIANTS)


def test_every_name_of_the_former_module_is_still_importable():
    names = ["AUTOTP_DEGREES", "DEFAULT_TOLERANCE", "GRID_TOP", "LIMIT_NAMES", "LONGEST_SEQUENCE_QUANTUM",
             "SEARCH_INPUTS", "SP_MIN_SEQUENCE_TOKENS", "VARIANTS", "ZERO_PP_PAPER", "Choice", "Option", "Plan",
             "apply_choice", "autotp_degrees", "candidate_grid", "choice_changes", "largest_limit_text",
             "largest_model", "largest_model_limits", "longest_sequence", "nearest_fit", "plan",
             "quantized_zeropp_allowed", "rank_candidates", "scaling", "sequence_parallel_options", "step_breakdown",
             "sweep", "variant_options", "varied_axes", "zeropp_parts", "_split_values", "_variant_candidates"]
    assert [n for n in names if not hasattr(planner, n)] == []
    assert all(hasattr(planner, n) for n in planner.__all__)


def test_every_tie_break_has_its_sentence():
    """rank_candidates sorts on PREFERENCE_ORDER and the tutorial states it from PREFERENCE_TEXT: one entry each."""
    from zeroplanner.planner import PREFERENCE_ORDER, PREFERENCE_TEXT

    assert len(set(PREFERENCE_ORDER)) == len(PREFERENCE_ORDER) and set(PREFERENCE_TEXT) == set(PREFERENCE_ORDER)


def _largest_by_scanning_every_size(scenario, points=81):
    """largest_model_limits as it was before the top-down search: every size of the grid evaluated, ascending."""
    from zeroplanner.costmodel import evaluate, make_context
    from zeroplanner.costmodel.ulysses import check_ulysses
    from zeroplanner.planner.sweeps import GRID_TOP, LIMIT_NAMES, VARIANTS, variant_candidates
    from zeroplanner.specs import Architecture

    labels = [v[0] for v in VARIANTS]
    best, seen = dict.fromkeys(labels, 0), {label: [] for label in labels}
    for p in np.geomspace(1e8, 1e13, points):
        arch = Architecture.from_parameter_count(int(p))
        try:
            check_ulysses(n_heads=arch.n_heads, kv_heads=arch.kv_heads,
                          sp_size=scenario.cluster.sequence_parallel_size, linear_mixer=arch.linear_mixer)
        except ValueError:
            continue
        sc = scenario.model_copy(update={"model": arch})
        values = evaluate(make_context(sc), variant_candidates(sc, np.array([sc.cluster.nodes]))[1])
        for i, label in enumerate(labels):
            seen[label].append((int(p), {k: bool(getattr(values, k)[i, 0]) for k in LIMIT_NAMES}))
            if values.fits[i, 0]:
                best[label] = int(p)
    out = {}
    for label in labels:
        above = [(size, ok) for size, ok in seen[label] if size > best[label]]
        if not above:
            out[label] = {"parameters": best[label], "next_parameters": 0, "limited_by": (GRID_TOP,)}
        else:
            out[label] = {"parameters": best[label], "next_parameters": above[0][0],
                          "limited_by": tuple(n for k, n in LIMIT_NAMES.items() if not above[0][1][k])}
    return out


@pytest.mark.parametrize("kw", [{}, {"nodes": 4}, {"model": "llama-2-70b", "nodes": 4}, {"gpus_per_node": 1},
                                {"model": "llama-3.1-8b", "seq_len": 65536, "sequence_parallel_size": 8},
                                {"gpu": "rtx-4090", "gpus_per_node": 2, "cpu_memory_gib": 64}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_largest_model_top_down_equals_scanning_every_size(kw):
    """largest_model_limits searches from the largest size down and stops once every variant fits (recommend's
    time, benchmarks/bench_cli.py); it must give what evaluating every size gives, limits included."""
    from zeroplanner.planner import largest_model_limits

    s = build_scenario(**kw)
    assert largest_model_limits(s) == _largest_by_scanning_every_size(s)


@pytest.mark.parametrize("kw", [{"model": "llama-2-70b", "nodes": 4}, {"gpus_per_node": 1},
                                {"model": "llama-3.1-8b", "seq_len": 65536}, {"model": "qwen2.5-vl-7b"}],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_each_candidates_fit_does_not_depend_on_the_others_evaluated_with_it(kw):
    """longest_sequence evaluates every variant at every Ulysses degree at each length once (costmodel's memory-only
    fits) and reads one variant's row for its bisection: that row must be what evaluating the row alone gives (what
    it did before), and what evaluate says fits."""
    from zeroplanner.costmodel import Candidates, evaluate, make_context
    from zeroplanner.costmodel.evaluate import fits
    from zeroplanner.planner.grid import sequence_parallel_options
    from zeroplanner.planner.sweeps import variant_candidates

    s = build_scenario(**kw)
    sps = sequence_parallel_options(s, within_node=False)
    for seq in (1024, 8192, 131072):
        sc = s.model_copy(update={"training": s.training.model_copy(update={"seq_len": seq})})
        ctx = make_context(sc)
        _, base = variant_candidates(sc, np.array([sc.cluster.nodes]))
        n_var = base.shape[0]
        cand = Candidates.build(**{f: np.repeat(getattr(base, f).reshape(n_var, 1), len(sps), axis=1)
                                   for f in base.__dataclass_fields__ if f != "sp"},
                                sp=np.asarray(sps, dtype=np.int64)[None, :])
        together = fits(ctx, cand).fits
        assert np.array_equal(together, evaluate(ctx, cand).fits)
        for i in range(n_var):
            assert np.array_equal(fits(ctx, cand.take(slice(i, i + 1))).fits[0], together[i]), (seq, i)
