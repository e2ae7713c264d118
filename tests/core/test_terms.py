"""One statement per cost term: the number explain mode, the tutorial and the report show for a term is the number
the chart's bar draws, computed by the same function (the vectorised ``evaluate`` at that candidate).

Reference: :func:`zeroplanner.costmodel.evaluate` for the scenario's one candidate (the chart bars are
``Estimate`` fields built from it, bytes rounded to integers), for each term, across scenarios that take every
branch that matters (stages 0-3, optimizer and parameter offload to CPU and NVMe, LoRA, QLoRA, fp32, full
checkpointing, gradient accumulation, the paper accounting).
"""

from __future__ import annotations

import html
import math

import numpy as np
import pytest

from zeroplanner.costmodel import Candidates, evaluate, make_context
from zeroplanner.costmodel.terms import (
    MEMORY_SEGMENTS,
    TERM_INFO,
    TIME_SEGMENTS,
    estimate_value,
    segment_value,
    term_value,
)
from zeroplanner.explain import KEYS, explain, fmt_bytes_text, fmt_seconds_text
from zeroplanner.planner import plan
from zeroplanner.scenarios import build_scenario
from zeroplanner.units import GIB

SCENARIOS = {
    "stage0": dict(stage=0),
    "stage1-ga4": dict(stage=1, grad_accum=4),
    "stage2-cpu": dict(stage=2, offload_optimizer="cpu"),
    "stage2-nvme-fp32": dict(stage=2, offload_optimizer="nvme", precision="fp32"),
    "stage3-2nodes": dict(stage=3, nodes=2, checkpointing="full"),
    "stage3-cpu+param": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
    "stage3-nvme+param": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", model="llama-2-13b"),
    "stage3-lora": dict(stage=3, lora_rank=16, model="mixtral-8x7b", nodes=2),
    "stage2-qlora": dict(stage=2, lora_rank=8, qlora=True),
    "stage3-qlora-gpt2": dict(stage=3, lora_rank=8, qlora=True, model="gpt2", checkpointing="selective"),
}


def _scenario(name):
    kw = dict(SCENARIOS[name.removesuffix("-paper")])
    s = build_scenario(**kw)
    if name.endswith("-paper"):
        s = s.model_copy(update={"assumptions": s.assumptions.model_copy(update={"accounting": "paper"})})
    return s


NAMES = [*SCENARIOS, "stage1-ga4-paper", "stage3-2nodes-paper"]


def _evaluated(scenario) -> dict[str, float]:
    values = evaluate(make_context(scenario), Candidates.from_scenario(scenario))
    return {k: float(np.asarray(term_value(values, k)).reshape(-1)[0]) for k in KEYS}


def _shown(value: float, unit: str) -> str:
    return fmt_bytes_text(value) if unit == "bytes" else fmt_seconds_text(value)


def _close(a: float, b: float, unit: str) -> bool:
    """Equal up to the estimate's rounding of bytes to integers (seconds: to float rounding)."""
    return abs(a - b) <= 0.5 if unit == "bytes" else math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("name", NAMES)
def test_explain_mode_shows_the_vectorised_number_of_every_term(name):
    scenario = _scenario(name)
    reference = _evaluated(scenario)
    for key in KEYS:
        e = explain(scenario, key)
        assert e.value == reference[key], (name, key, e.value, reference[key])  # the same function: equal
        assert e.display == _shown(reference[key], e.unit)
        assert math.isclose(sum(p.value for p in e.parts), e.value, rel_tol=1e-12, abs_tol=1e-9), (name, key)


@pytest.mark.parametrize("name", NAMES)
def test_chart_bars_and_explain_mode_agree_for_every_variant(name):
    """The app's memory and step-time bars (ui.state views of the plan) against explain mode of each bar's
    scenario, segment by segment; the compare view and the report read the same segments."""
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.compare import side
    from zeroplanner.ui.state import _variants, memory_view, time_view

    p = plan(_scenario(name))
    mem, tim = memory_view(p), time_view(p)
    for v, (label, scenario, est) in enumerate(_variants(p)):
        for t, seg in enumerate(MEMORY_SEGMENTS):
            (key,) = seg.terms
            e = explain(scenario, key)
            bar = mem.gib[t, v] * GIB
            assert _close(e.value, bar, "bytes"), (name, label, key, e.value, bar)
            assert segment_value(est, seg) == bar
        for t, seg in enumerate(TIME_SEGMENTS):
            shown = sum(explain(scenario, k).value for k in seg.terms)
            assert _close(shown, tim.seconds[t, v], "seconds"), (name, label, seg.key, shown, tim.seconds[t, v])
    current = side(_scenario(name))
    for seg, gib in zip(MEMORY_SEGMENTS, current.memory_gib):
        assert _close(explain(current.plan.scenario if current.plan.fits else current.scenario, seg.key).value,
                      gib * GIB, "bytes")


@pytest.mark.parametrize("name", ["stage0", "stage2-cpu", "stage3-lora", "stage3-nvme+param", "stage1-ga4-paper"])
def test_report_shows_the_vectorised_number_of_every_term(name):
    from zeroplanner.report import build_report, report_parts

    scenario = _scenario(name)
    d = report_parts(scenario)
    p = d["plan"]
    shown_scenario = p.scenario if p.fits else scenario
    reference = _evaluated(shown_scenario)
    page = build_report(scenario)
    for key, e in d["explanations"].items():
        assert e.value == reference[key], (name, key)
        assert f"<td class='num'>{html.escape(e.display)}</td>" in page
    if p.fits:  # the recommended bar of the report's memory chart: the estimate of the scenario explained
        for seg in MEMORY_SEGMENTS:
            value = estimate_value(p.estimate, seg.key)
            assert _close(reference[seg.key], value, "bytes")
            if value > 0:
                assert f"<title>Recommended: {seg.label} {value / GIB:.3g}</title>" in d["memory_svg"]


def test_tutorial_shows_the_vectorised_number_of_every_term():
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.tutorial import STEPS, Tutorial

    tutorial = Tutorial(build_scenario())
    for changes in (dict(), dict(model="llama-2-13b", nodes=2)):
        tutorial.set(**changes)
        for key, _ in STEPS:
            step = tutorial.step(key)
            reference = _evaluated(step.scenario)
            assert step.explanations, key
            for e in step.explanations:
                assert e.value == reference[e.key], (key, e.key)
                assert f"data-value='{e.value!r}'" in step.math.value


def test_every_term_is_stated_once_in_the_registry():
    """Names and colours the charts, the compare view and the report draw come from costmodel.terms."""
    pytest.importorskip("bqplot")
    from zeroplanner import report
    from zeroplanner.ui import charts, compare, explain_panel, state

    assert set(TERM_INFO) == set(KEYS)
    memory = tuple((s.key, s.label) for s in MEMORY_SEGMENTS)
    time = tuple((s.key, s.label) for s in TIME_SEGMENTS)
    assert state.MEMORY_TERMS == compare.MEMORY_TERMS == memory
    assert state.TIME_PARTS == compare.TIME_PARTS == explain_panel.TIME_SEGMENTS == time
    assert charts.TERM_COLORS == compare.TERM_COLORS == tuple(c for _, _, c in report.TERM_SERIES)
    assert charts.TIME_COLORS == compare.TIME_COLORS == tuple(c for _, _, c in report.TIME_SERIES)
    assert len(set(charts.TERM_COLORS)) == len(MEMORY_SEGMENTS)
    for info in TERM_INFO.values():
        assert info.label and info.title and info.symbol and info.words and info.formula and info.source


def test_terms_docstring_examples_run():
    import doctest

    from zeroplanner.costmodel import terms

    result = doctest.testmod(terms)
    assert result.attempted >= 3 and result.failed == 0


def test_an_expression_may_only_use_known_inputs_and_min_max():
    from zeroplanner.costmodel.terms import evaluate_expr

    with pytest.raises(ValueError, match="unknown input 'nope'"):
        evaluate_expr("w*nope", {"w": 2.0})
    with pytest.raises(ValueError, match=r"only min\(\) and max\(\)"):
        evaluate_expr("abs(w)", {"w": 2.0})
    with pytest.raises(ValueError, match="not allowed"):
        evaluate_expr("w**2", {"w": 2.0})


def test_max_min_take_any_number_of_arguments_elementwise():
    from zeroplanner.costmodel.terms import evaluate_expr

    x = {"t_gf": np.array([1.0, 3.0]), "t_cf": np.array([2.0, 2.0]), "lam": 0.5}
    assert evaluate_expr("max(0, t_gf - t_cf) + lam*min(t_gf, t_cf)", x).tolist() == [0.5, 2.0]
    assert evaluate_expr("max(t_gf, t_cf, 2.5)", x).tolist() == [2.5, 3.0]
    assert evaluate_expr("min(t_gf, t_cf, 1.5)", x).tolist() == [1.0, 1.5]


def test_define_makes_a_quantity_an_input_of_the_next_expressions():
    """A quantity's value is its parts' sum, where each applies (the condition is the expressions' ``where``)."""
    from zeroplanner.costmodel.terms import define

    env = {"GA": np.array([2.0, 4.0]), "t_gf": np.array([1.0, 3.0]), "t_cf": np.array([2.0, 2.0]), "lam": 0.5}
    overlap = np.array([True, False])
    tp = define(env, "e_f", [("overlapped", "max(0, t_gf - t_cf) + lam*min(t_gf, t_cf)", overlap),
                             ("not overlapped", "t_gf", ~overlap)])
    assert env["e_f"].tolist() == [0.5, 3.0] and tp.inputs is env
    define(env, "t_coll", [("micro-steps", "GA*e_f", True)])
    assert env["t_coll"].tolist() == [1.0, 12.0]
    with pytest.raises(ValueError, match="unknown quantity"):
        define(env, "nope", [("x", "GA", True)])


def test_latex_leaves_out_addends_that_are_zero_but_keeps_max_and_min():
    from zeroplanner.costmodel.terms import input_names, is_sum, latex

    zero = {"t_bnd": 0.0, "e_f": 0.0, "t_tp": 0.0, "e_b": 1.0, "GA": 8.0}
    z = lambda n: zero.get(n, 1.0) == 0.0  # noqa: E731
    assert latex("t_bnd + GA*(e_f + e_b + t_tp)", zero=z) == r"GA\,e_{bwd}"
    assert latex("t_bnd + GA*(e_f + e_b + t_tp)") == r"t_{boundary} + GA(e_{fwd}+e_{bwd}+t_{TP})"
    assert not is_sum("t_bnd + GA*(e_f + e_b + t_tp)", z) and is_sum("t_bnd + GA*(e_f + e_b + t_tp)")
    assert input_names("t_bnd + GA*(e_f + e_b + t_tp)", z) == ["GA", "e_b"]
    # a product with a zero factor goes; max(0, ...) stays even where its argument is 0
    assert latex("GA*e_f + max(0, e_f - e_b)", zero=z) == r"\max(0,e_{fwd}-e_{bwd})"
    assert latex("GA*e_f", zero=z) == r"GA\,e_{fwd}"  # all of it 0: shown whole


def test_a_substituted_power_of_ten_divides_as_one_number():
    from zeroplanner.costmodel.terms import latex

    numbers = {"Psi_t": r"1.3\times10^{10}", "N_d": "16", "beta": "34", "BW_HBM": r"2.04\times10^{12}"}.get
    assert latex("beta*(Psi_t/N_d)/BW_HBM", numbers) == r"34\times1.3\times10^{10}/16/(2.04\times10^{12})"
