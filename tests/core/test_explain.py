"""Explanations are generated from the cost model itself: every explained value equals the estimate's number.

The reference in these tests is ``zeroplanner.costmodel.estimate`` (the explanation must never drift from it) and,
for the ideal accounting, the ZeRO paper's model-state formulas (Rajbhandari et al., arXiv 1910.02054, Sec. 3.1
and Fig. 1: (2 + 2 + K)Ψ with K = 12 for mixed-precision Adam; stage 3 keeps 2Ψ/N_d of the parameters).
"""

from __future__ import annotations

import itertools
import math

import pytest

from zeroplanner.costmodel import estimate
from zeroplanner.costmodel import explain_terms as et
from zeroplanner.explain import (
    KEYS,
    MEMORY_KEYS,
    explain,
    explain_all,
    explain_time_segment,
    explanation_html,
    fmt_bytes_text,
    fmt_seconds_text,
)
from zeroplanner.scenarios import build_scenario

OFFLOADS = {"none": ("none", "none"), "cpu": ("cpu", "none"), "nvme": ("nvme", "none"), "cpu+param": ("cpu", "cpu"),
            "nvme+param": ("nvme", "nvme")}


def _grid():
    for model, stage, off, nodes, lora, ck, prec, ga in itertools.product(
            ["llama-2-7b", "mixtral-8x7b", "gpt2"], [0, 1, 2, 3], list(OFFLOADS), [1, 2], [0, 8], ["none", "full"],
            ["bf16", "fp32"], [1, 4]):
        if (stage == 0 and off != "none") or ("param" in off and stage != 3):
            continue
        # thin the grid deterministically (keeps every stage x offload x accounting combination)
        if (nodes + lora + len(ck) + len(prec) + ga + len(model)) % 3:
            continue
        opt, par = OFFLOADS[off]
        yield dict(model=model, stage=stage, offload_optimizer=opt, offload_param=par, nodes=nodes, lora_rank=lora,
                   checkpointing=ck, precision=prec, grad_accum=ga)


GRID = list(_grid())


def _with_accounting(scenario, accounting):
    return scenario.model_copy(update={"assumptions": scenario.assumptions.model_copy(
        update={"accounting": accounting})})


def _estimate_numbers(e) -> dict[str, float]:
    out = {k: getattr(e.per_gpu_bytes, k) for k in MEMORY_KEYS}
    out.update(host_memory=e.per_node_cpu_bytes, communication_volume=e.communication.bytes_per_gpu_per_step,
               compute=e.compute_seconds_per_step, communication=e.communication.exposed_seconds_per_step,
               offload=e.offload_seconds_per_step, optimizer=e.optimizer_seconds_per_step, step=e.step_seconds)
    return out


def test_grid_covers_every_stage_offload_combination():
    combos = {(kw["stage"], kw["offload_optimizer"], kw["offload_param"]) for kw in GRID}
    assert len(combos) == 1 + 2 * 3 + 5  # stage 0; stages 1-2 x 3 optimizer offloads; stage 3 x 5


@pytest.mark.parametrize("accounting", ["deepspeed", "paper"])
def test_every_explained_value_equals_the_estimate(accounting):
    """Reference: the estimate (the cost model's own output). Bytes are rounded to integers in the estimate."""
    for kw in GRID:
        scenario = _with_accounting(build_scenario(**kw), accounting)
        expected = _estimate_numbers(estimate(scenario))
        for key, ref in expected.items():
            tv = et.ALL_FUNCTIONS[key](scenario)
            if isinstance(ref, int):
                assert abs(tv.value - ref) <= 1, (key, kw, accounting, tv.value, ref)
            else:
                assert math.isclose(tv.value, ref, rel_tol=1e-12, abs_tol=1e-15), (key, kw, tv.value, ref)
            assert math.isclose(sum(tv.parts.values()), tv.value, rel_tol=1e-12, abs_tol=1e-9), (key, kw)


def test_rendered_numbers_follow_the_scenario():
    """Change the scenario: the displayed result of each term is the estimate's number, formatted."""
    for kw in (dict(), dict(model="llama-2-13b", nodes=2, stage=3), dict(stage=1, offload_optimizer="cpu"),
               dict(model="qwen2.5-7b", micro_batch=4, checkpointing="selective", stage=3, offload_optimizer="cpu",
                    offload_param="cpu")):
        scenario = build_scenario(**kw)
        expected = _estimate_numbers(estimate(scenario))
        for key, e in explain_all(scenario).items():
            shown = fmt_bytes_text(expected[key]) if e.unit == "bytes" else fmt_seconds_text(expected[key])
            assert e.display == shown, (key, kw)
            number, unit = shown.split()
            assert e.substituted.endswith(rf"{number}\,\mathrm{{{unit}}}"), (key, e.substituted)
            page = explanation_html(e)
            assert f"<b class='zp-explain-value'>{shown}</b>" in page


def test_paper_accounting_reproduces_the_zero_paper_model_states():
    """ZeRO paper Sec. 3.1: mixed-precision Adam keeps 2Ψ + 2Ψ + 12Ψ = 16Ψ bytes per GPU without ZeRO; Fig. 1:
    P_os+g+p keeps (2 + 2 + 12)Ψ/N_d."""
    s0 = _with_accounting(build_scenario(params=7_500_000_000, stage=0), "paper")
    states = sum(explain(s0, k).value for k in ("parameters", "gradients", "optimizer_states"))
    assert states == 16 * 7_500_000_000
    s3 = _with_accounting(build_scenario(params=7_500_000_000, stage=3, nodes=8), "paper")  # N_d = 64
    states = sum(explain(s3, k).value for k in ("parameters", "gradients", "optimizer_states"))
    assert states == pytest.approx(16 * 7_500_000_000 / 64)
    assert explain(s3, "parameters").latex == r"M_{params} = w\Psi/N_d"


def test_formula_shows_the_branch_that_applies():
    s2 = build_scenario(stage=2)
    assert explain(s2, "gradients").latex == r"M_{grads} = w\Psi_t/N_d + 4\Psi_t/N_d"
    assert r"/8" in explain(s2, "gradients").substituted  # N_d = 8 GPUs substituted
    off = build_scenario(stage=2, offload_optimizer="cpu", grad_accum=1)
    assert explain(off, "optimizer_states").latex == r"M_{opt} = 0"
    assert explain(off, "host_memory").value > 0
    s3 = build_scenario(stage=3, nodes=2)
    comm = explain(s3, "communication")
    where = {d.name: d for d in comm.definitions}
    # overlap_comm: what compute does not hide, plus overlap_loss of the overlapped part (issue 30: the panel had
    # only the max term)
    assert comm.case == "overlap" and comm.latex == r"t_{comm} = t_{coll} + t_{host}"
    assert where["e_f"].latex == (r"e_{fwd} = \max(0,t^{comm}_{fwd}-t^{comp}_{fwd}) + "
                                  r"\lambda\min(t^{comm}_{fwd},t^{comp}_{fwd})")
    no = explain(build_scenario(stage=3, nodes=2, overlap_comm=False), "communication")
    assert no.case == "no_overlap"
    assert {d.name: d.latex for d in no.definitions}["e_f"] == r"e_{fwd} = t^{comm}_{fwd}"


def test_time_segment_offload_is_offload_plus_optimizer():
    scenario = build_scenario(stage=2, offload_optimizer="cpu")
    parts = explain_time_segment(scenario, "offload")
    e = estimate(scenario)
    assert [p.key for p in parts] == ["offload", "optimizer"]
    assert sum(p.value for p in parts) == pytest.approx(e.offload_seconds_per_step + e.optimizer_seconds_per_step)


def test_every_key_has_words_source_and_escaped_html():
    scenario = build_scenario(stage=3, nodes=2, offload_optimizer="nvme", offload_param="nvme")
    for key in KEYS:
        e = explain(scenario, key)
        assert e.words and e.source and e.latex.startswith("M_") or e.latex.startswith(("V_", "t_"))
        page = explanation_html(e)
        assert "<script" not in page and page.count("$$") == 4 + 4 * len(e.definitions)


def test_unknown_key_is_refused_with_the_known_keys():
    with pytest.raises(KeyError, match="known: parameters"):
        explain(build_scenario(), "everything")


def test_printed_formulas_are_the_expressions_that_computed_each_part():
    """Every part of every term (memory, host, communication volume and step time) and of every step-time
    where-line is printed from the expression the cost model evaluated: the expression, evaluated with the inputs
    explain lists, gives the part's value exactly, and both LaTeX forms (symbols, numbers) are rendered from it
    (without its addends that are 0)."""
    from zeroplanner.costmodel.terms import evaluate_expr, latex

    for kw in GRID:
        scenario = build_scenario(**kw)
        for key in KEYS:
            tv = et.ALL_FUNCTIONS[key](scenario)
            e = explain(scenario, key)
            assert [d.name for d in e.definitions] == [d.key for d in tv.definitions]
            for t, parts in ((tv, e.parts), *((d, x.parts) for d, x in zip(tv.definitions, e.definitions))):
                assert t.formulas.keys() == t.parts.keys(), (key, kw)
                for label, expr in t.formulas.items():
                    assert float(evaluate_expr(expr, t.inputs)) == t.parts[label], (key, t.key, label)
                zero = lambda n, t=t: t.inputs.get(n, 1.0) == 0.0  # noqa: E731
                for part in parts:
                    sym = latex(t.formulas[part.label], zero=zero)
                    assert part.latex in (sym, f"({sym})"), (key, part.label)
