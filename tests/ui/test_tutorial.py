"""The ZeRO tutorial: every number it renders is the cost model's, for whatever scenario is set; exercises check
their answers; the notebook executes (nbclient) and opens on a link's query string."""

from __future__ import annotations

import html as html_mod
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from zeroplanner.costmodel import estimate  # noqa: E402
from zeroplanner.explain import fmt_bytes_text, fmt_seconds_text  # noqa: E402
from zeroplanner.planner import DEFAULT_TOLERANCE, plan  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.specs import replace  # noqa: E402
from zeroplanner.ui.tutorial import (  # noqa: E402
    PREFERENCES,
    STEPS,
    RuleRow,
    Tutorial,
    rule_candidates,
    rule_html,
    rule_pick,
    with_checkpointing,
    with_zero,
)
from zeroplanner.units import GIB  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "zero_tutorial.ipynb"


def _numbers(e) -> dict[str, float]:
    """The estimate's number for each explained key (reference: zeroplanner.costmodel.estimate)."""
    out = {k: getattr(e.per_gpu_bytes, k) for k in ("parameters", "gradients", "optimizer_states", "activations",
                                                      "buffers", "overhead")}
    out.update(host_memory=e.per_node_cpu_bytes, communication_volume=e.communication.bytes_per_gpu_per_step,
               compute=e.compute_seconds_per_step, communication=e.communication.exposed_seconds_per_step,
               offload=e.offload_seconds_per_step, optimizer=e.optimizer_seconds_per_step, step=e.step_seconds)
    return out


def _shown(value: float, unit: str) -> str:
    return fmt_bytes_text(value) if unit == "bytes" else fmt_seconds_text(value)


SCENARIOS = [
    dict(),
    dict(model="llama-2-13b", nodes=2),
    dict(model="mixtral-8x7b", gpu="H100-80GB", gpus_per_node=4, nodes=4, network="eth-25g"),
    dict(model="qwen2.5-72b", nodes=8, network="ib-ndr"),
]


DEFAULTS = dict(model="llama-2-7b", gpu="A100-80GB", gpus_per_node=8, nodes=1, network="ib-hdr")


@pytest.fixture(scope="module")
def tutorial():
    return Tutorial(build_scenario())


@pytest.mark.parametrize("changes", SCENARIOS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_rendered_numbers_equal_the_estimate_after_a_scenario_change(tutorial, changes):
    tutorial.set(**{**DEFAULTS, **changes})
    expected_base = build_scenario(**changes)
    assert tutorial.scenario == expected_base
    for key, _ in STEPS:
        step = tutorial.step(key)
        numbers = _numbers(estimate(step.scenario))
        page = step.math.value
        assert step.explanations, key
        for e in step.explanations:
            shown = _shown(numbers[e.key], e.unit)
            # the bold result and the last term of the substituted formula are the estimate's number
            assert f"<b class='zp-explain-value'>{shown}</b>" in page, (key, e.key, shown)
            number, unit = shown.split()
            assert e.substituted.endswith(rf"{number}\,\mathrm{{{unit}}}"), (key, e.key)
            assert f"$${e.substituted}$$" in page
        # N_d of the scenario appears in the partitioned formulas
        if key in ("zero1", "zero2", "zero3"):
            assert f"/{step.scenario.cluster.data_parallel_degree}" in page


def _states(s):
    return sum(getattr(estimate(s).per_gpu_bytes, k) for k in ("parameters", "gradients", "optimizer_states"))


def _doubled(s):
    return s.model_copy(update={"cluster": replace(s.cluster, nodes=2 * s.cluster.nodes)})


def _paper(s):
    return s.model_copy(update={"assumptions": replace(s.assumptions, accounting="paper")})


def test_exercise_answers_are_the_cost_model_numbers(tutorial):
    """Each exercise asks for a number the reader computes from the step's formulas for another input (twice the
    GPUs, twice the micro-batch, the planner's headroom factor or tolerance); the expected answer is the cost
    model's (or the planner's) number for that input; the right answer is accepted, a wrong one refused with the
    hint, and neither the refusal nor the hint gives the answer away."""
    tutorial.set(model="llama-2-13b", nodes=2, gpu="A100-80GB", gpus_per_node=8, network="ib-hdr")
    base = tutorial.scenario
    comm_stage = tutorial.step("comm").knobs["stage"].value
    peak = tutorial.step("peak").scenario
    twice_b = peak.model_copy(update={"training": replace(peak.training, micro_batch=2 * peak.training.micro_batch)})
    loss = next(p for p in estimate(twice_b).step_peak.timeline if p.phase == "loss backward")
    p = plan(base)
    fastest = plan(base, tolerance=0.0, advice=False)
    expected = {
        "dp": _states(with_zero(_doubled(base), 0)) / GIB,
        "zero1": estimate(with_zero(_doubled(base), 1)).per_gpu_bytes.optimizer_states / GIB,
        "zero2": (_states(with_zero(base, 1)) - _states(with_zero(base, 2))) / GIB,
        "zero3": _states(with_zero(_doubled(base), 3)) / GIB,
        "offload": estimate(with_zero(base, 2, "cpu")).per_node_cpu_bytes * base.assumptions.host_buffer_factor / GIB,
        "comm": estimate(with_zero(_doubled(base), comm_stage)).communication.bytes_per_gpu_per_step / GIB,
        "peak": loss.bytes["logits"] / GIB,
        "choose": (1 - DEFAULT_TOLERANCE) * fastest.estimate.tokens_per_second,
    }
    assert p.fits and fastest.estimate.tokens_per_second >= p.estimate.tokens_per_second
    assert expected["peak"] == pytest.approx(12 * 2 * peak.training.micro_batch * peak.training.seq_len
                                             * peak.model.vocab_size / GIB)
    for key, value in expected.items():
        ex = tutorial.step(key).exercise
        assert ex.expected() == pytest.approx(value, rel=1e-9), key
        assert ex.feedback.value == ""
        assert ex.check(value) is True
        assert "Correct" in ex.feedback.value and ex._shown(value) in ex.feedback.value
        for wrong in (value * 1.5 + 1, value * 0.5):
            assert ex.check(wrong) is False
            assert "Not quite" in ex.feedback.value and "Hint:" in ex.feedback.value, key
            assert ex._shown(value) not in ex.feedback.value, key  # a refusal does not give the answer
        ex.reveal()
        assert "Answer:" in ex.feedback.value and ex._shown(value) in ex.feedback.value


def test_memory_exercises_name_their_accounting_and_refuse_the_other_one(tutorial):
    """Section 1 counts DeepSpeed's measured 20 bytes per parameter (2 + 2 + 4 fp32 gradient copies + 4 + 8) and
    says so: the ZeRO paper's 16 Psi is refused with the reason, and the hint names both accountings."""
    tutorial.set(**DEFAULTS)
    base = tutorial.scenario
    psi = base.trainable_parameters
    assert base.assumptions.accounting == "deepspeed"
    assert _states(with_zero(base, 0)) == pytest.approx(20 * psi)
    assert _states(with_zero(_paper(base), 0)) == pytest.approx(16 * psi)
    ex = tutorial.step("dp").exercise
    assert ex.expected() == pytest.approx(20 * psi / GIB)
    assert ex.check(16 * psi / GIB) is False
    text = ex.feedback.value
    assert "ZeRO paper" in text and "16 bytes per parameter" in text and "(20)" in text
    assert "20 bytes of model states per trained parameter" in text and "fp32 copies" in text
    for key in ("dp", "zero1", "zero2", "zero3", "offload"):
        hint = tutorial.step(key).exercise.hint()
        assert "Accounting:" in hint and "DeepSpeed's measured accounting" in hint and "16" in hint, key
    # the paper's answer to the ZeRO-3 question (16 Psi / N_d) is named too
    z3 = tutorial.step("zero3").exercise
    paper = _states(with_zero(_doubled(_paper(base)), 3)) / GIB
    assert z3.check(paper) is False and "ZeRO paper" in z3.feedback.value
    # a scenario in the paper's accounting asks for the paper's numbers
    t = Tutorial(_paper(base))
    assert t.step("dp").exercise.expected() == pytest.approx(16 * psi / GIB)
    assert t.step("dp").exercise.check(16 * psi / GIB) is True


def _widget_texts(widget) -> list[str]:
    """Every string a widget tree sends to the page: values, descriptions, placeholders, option labels."""
    out = []
    for name in ("value", "description", "placeholder", "tooltip"):
        v = getattr(widget, name, None)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            out.append(str(v))
    for label in getattr(widget, "_options_labels", ()) or ():
        out.append(str(label))
    for child in getattr(widget, "children", ()) or ():
        out += _widget_texts(child)
    return out


def _answer_forms(ex) -> list[str]:
    x = ex.expected()
    if ex.unit == "tokens/s":
        return [f"{x:,.0f}", f"{x:.0f}", f"{x:,.1f}"]
    return [f"{x:.2f}", fmt_bytes_text(x * GIB).split()[0] + " GiB"]


@pytest.mark.parametrize("changes", SCENARIOS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_exercises_hide_their_answers_until_checked(tutorial, changes):
    """No exercise's answer is anywhere in its step's rendered widget tree (formulas, summary, question, answer
    box) before Check or Show answer."""
    tutorial.set(**{**DEFAULTS, **changes})
    for key, _ in STEPS:
        step = tutorial.step(key)
        ex = step.exercise
        ex.refresh()
        page = "\n".join(_widget_texts(step))
        assert ex.feedback.value == ""
        for form in _answer_forms(ex):
            assert form not in page, (key, form)
        ex.reveal()
        assert _answer_forms(ex)[0] in ex.feedback.value
        ex.refresh()


def test_where_a_step_peaks_shows_the_models_timeline_and_moves_with_stage_and_checkpointing(tutorial):
    """Section "Where a step peaks": the peak, its phase, the 12 bytes per logit of the loss backward and the fp32
    gradient partition of the optimizer step are the cost model's numbers for the section's scenario; the table of
    stages x checkpointing is one estimate each; the exercise's answer is the peak's phase."""
    tutorial.set(**DEFAULTS)
    step = tutorial.step("peak")
    loss_activations = {}
    for stage, mode in ((2, "none"), (2, "full"), (3, "none"), (1, "full")):
        step.knobs["stage"].value = stage
        step.knobs["checkpointing"].value = mode
        s = step.scenario
        assert s == with_checkpointing(with_zero(tutorial.scenario, stage), mode)
        e = estimate(s)
        peak = e.step_peak
        page = step.summary.value.replace("&#x27;", "'")
        assert peak.verdict() in page
        loss = next(p for p in peak.timeline if p.phase == "loss backward")
        logits = s.training.micro_batch * s.training.seq_len * s.model.vocab_size
        assert loss.bytes["logits"] == 12 * logits  # log-softmax output + its gradient + the gradient it produces
        assert f"12 &times; {logits:,} logits = <b>{fmt_bytes_text(loss.bytes['logits'])}</b>" in page
        opt = peak.timeline[-1]
        end = [p for p in peak.timeline if p.phase == "backward"][-1]
        partition = 4 * e.trainable_parameters / e.data_parallel_degree
        assert opt.phase == "optimizer step"
        assert opt.bytes["gradients"] - end.bytes["gradients"] == pytest.approx(partition, abs=1)
        assert f"= <b>{fmt_bytes_text(partition)}</b>" in page
        for other_stage in (1, 2, 3):
            for other_mode in ("none", "full"):
                p = estimate(with_checkpointing(with_zero(tutorial.scenario, other_stage), other_mode)).step_peak
                assert f"{fmt_bytes_text(p.bytes)} in the {p.phase}" in page
        ex = step.exercise  # the logits' bytes at twice the micro-batch: 12 x 2b x s x V
        assert ex.expected() == pytest.approx(24 * logits / GIB)
        assert ex.check(24 * logits / GIB) is True and ex.check(12 * logits / GIB) is False
        loss_activations[(stage, mode)] = loss.bytes["activations"]
    assert loss_activations[(2, "full")] < loss_activations[(2, "none")]  # checkpointing shrinks the loss's activations
    tutorial.set(nodes=2)  # the shared scenario drives the section too
    assert step.scenario.cluster.nodes == 2
    assert estimate(step.scenario).step_peak.verdict() in step.summary.value.replace("&#x27;", "'")


def test_answer_box_and_buttons_drive_the_check(tutorial):
    ex = tutorial.step("zero1").exercise
    ex.answer_box.value = round(ex.expected(), 2)
    ex.check_button.click()
    assert "Correct" in ex.feedback.value
    ex.answer_box.value = 0.0
    ex.check_button.click()
    assert "Not quite" in ex.feedback.value
    ex.reveal_button.click()
    assert f"{ex.expected():.2f} GiB" in ex.feedback.value


def test_step_knobs_change_the_explained_scenario(tutorial):
    tutorial.set(**DEFAULTS)
    comm = tutorial.step("comm")
    comm.knobs["stage"].value = 2
    assert comm.scenario.zero.stage == 2
    v2 = comm.explanations[0].value
    comm.knobs["stage"].value = 3
    assert comm.scenario.zero.stage == 3
    assert comm.explanations[0].value == estimate(comm.scenario).communication.bytes_per_gpu_per_step
    assert comm.explanations[0].value != v2
    off = tutorial.step("offload")
    off.knobs["variant"].value = (3, "cpu", "cpu")
    assert off.scenario.zero.offload_param.device == "cpu"
    assert "parameter partition" in off.math.value


def test_controls_update_every_step(tutorial):
    tutorial.set(**DEFAULTS)
    before = tutorial.step("zero3").math.value
    tutorial.widgets["nodes"].value = 4
    assert tutorial.scenario.cluster.nodes == 4
    assert tutorial.step("zero3").math.value != before
    assert tutorial.step("zero3").scenario.cluster.data_parallel_degree == 32


def test_invalid_change_shows_a_message_and_keeps_the_scenario(tutorial):
    tutorial.set(**DEFAULTS)
    tutorial.set(gpus_per_node=0)
    assert "gpus_per_node" in tutorial.message.value
    assert tutorial.scenario.cluster.gpus_per_node == 8


def test_tutorial_opens_on_the_query_string(monkeypatch):
    monkeypatch.setenv("QUERY_STRING", "model=llama-2-70b&nodes=4&network=ib-hdr")
    t = Tutorial()
    assert t.scenario == build_scenario(model="llama-2-70b", nodes=4, network="ib-hdr")
    assert t.widgets["model"].value == "llama-2-70b" and t.widgets["nodes"].value == 4
    monkeypatch.setenv("QUERY_STRING", "nodes=-3")
    t = Tutorial()
    assert "nodes" in t.message.value and t.scenario == build_scenario()


def test_tutorial_applies_a_link_with_one_bad_key_and_names_it(monkeypatch):
    """As the planner page does (zeroplanner.share.read_link): the typo is left out and named, the rest applied,
    so the tutorial and the planner open the same scenario from one workshop link."""
    monkeypatch.setenv("QUERY_STRING", "model=llama-2-13b&nodez=4")
    t = Tutorial()
    assert t.scenario == build_scenario(model="llama-2-13b")
    assert "nodez" in t.message.value and "did you mean nodes" in t.message.value


def test_unknown_step_is_refused():
    with pytest.raises(KeyError, match="steps: dp, zero1"):
        Tutorial(build_scenario()).step("zero4")


@pytest.mark.timeout(300)
def test_notebook_executes_with_a_query_string_and_shows_the_numbers(tmp_path):
    """nbclient runs the tutorial in a real kernel with Voilà's QUERY_STRING set; the saved widget state holds the
    HTMLMath formulas with the linked scenario's numbers."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert all(len(src.splitlines()) <= 4 for src in code), "the notebook stays thin: widgets come from the package"
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3", store_widget_state=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    env = {**os.environ, "QUERY_STRING": "model=llama-2-13b&nodes=2"}
    client.execute(env=env)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    maths = [m["state"]["value"] for m in state.values() if m["model_name"] == "HTMLMathModel"]
    feedback = [v for v in maths if not v]  # each exercise's verdict (HTMLMath: its hint quotes formulas), empty
    maths = [v for v in maths if v]
    assert len(maths) == len(feedback) == len(STEPS)
    s = with_zero(build_scenario(model="llama-2-13b", nodes=2), 1)
    shown = fmt_bytes_text(estimate(s).per_gpu_bytes.optimizer_states)
    assert any(f"<b class='zp-explain-value'>{shown}</b>" in m for m in maths)
    assert all(re.search(r"\$\$.+\$\$", m) for m in maths)
    json.dumps(state)  # the state is plain JSON (what Voilà sends to the page)
    # each step, as the page was sent it, holds nowhere its exercise's answer (checked in the kernel)
    steps = [m for m in state.values() if "zp-tutorial-step" in m["state"].get("_dom_classes", ())]
    assert len(steps) == len(STEPS)
    linked = Tutorial(build_scenario(model="llama-2-13b", nodes=2))
    for (key, title), model in zip(STEPS, steps):
        sent = json.dumps(_state_tree(state, model))
        assert f"<h3>{html_mod.escape(title)}</h3>" in sent and "<b>Exercise.</b>" in sent, key
        for form in _answer_forms(linked.step(key).exercise):
            assert form not in sent, (key, form)


def _state_tree(state: dict, model: dict) -> list[dict]:
    """A widget model and every model under it (children, by their IPY_MODEL_ references), from saved state."""
    out = [model["state"]]
    for ref in model["state"].get("children", ()):
        out += _state_tree(state, state[ref.removeprefix("IPY_MODEL_")])
    return out


def test_choose_step_shows_the_planners_advice(tutorial):
    """Two nodes over 1 Gbit/s Ethernet: the choose step says first that one node is faster, with the planner's
    own figures (zeroplanner.advice.cluster_advice), as the step's intro promises."""
    import html as html_mod

    tutorial.set(**dict(DEFAULTS, nodes=2, network="eth-1g"))
    p = plan(tutorial.scenario)
    assert p.cluster_advice is not None and p.cluster_advice.fewer_nodes == 1 and p.cluster_advice.speedup > 10
    shown = tutorial.step("choose").summary.value
    assert f"<b>Advice:</b> {html_mod.escape(p.cluster_advice.text)}" in shown
    assert html_mod.escape(p.assumptions[0][1:]) in shown  # the network preset it assumed
    tutorial.set(**DEFAULTS)


# ----------------------------------------------------------------------------------------------------------------
# "Choosing a stage": the stated rule is the planner's
# ----------------------------------------------------------------------------------------------------------------
class _TableRows(HTMLParser):
    """The rows of the choose step's table as displayed: (cells' text, whether the row is marked recommended)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[list[str], bool]] = []
        self._cells: list[str] | None = None
        self._marked = False

    def handle_starttag(self, tag, attrs):
        cls = dict(attrs).get("class") or ""
        if tag == "tr" and "zp-plan-row" in cls.split():
            self._cells, self._marked = [], "zp-recommended" in cls.split()
        elif tag == "td" and self._cells is not None:
            self._cells.append("")

    def handle_endtag(self, tag):
        if tag == "tr" and self._cells is not None:
            self.rows.append((self._cells, self._marked))
            self._cells = None

    def handle_data(self, data):
        if self._cells:
            self._cells[-1] += data


def _gib_shown(text: str) -> float:
    number, unit = text.split()
    return float(number) * (GIB if unit == "GiB" else 2**20)


def _displayed_rows(summary: str, scenario) -> list[RuleRow]:
    """What a participant reads in the table, as the rule's inputs: the label says stage, offload, ZeRO++, Ulysses
    and AutoTP; the cells fit, peak, free memory and tokens/s (as rounded on screen)."""
    parser = _TableRows()
    parser.feed(summary)
    rows = []
    for cells, marked in parser.rows:
        mark, label, fit, peak, free, tps = cells
        assert ("recommended" in mark) == marked
        zpp = re.search(r"ZeRO\+\+ \(([^)]*)\)", label)
        sp, tp = re.search(r"Ulysses SP (\d+)", label), re.search(r"AutoTP (\d+)", label)
        rows.append(RuleRow(
            label=label, fits=fit.startswith("fits"), proven=fit == "fits", stage=int(re.match(r"ZeRO-(\d)", label)[1]),
            offloads=len(re.findall(r"(?:CPU|NVMe) (?:optimizer|params)", label)),
            param_offload=bool(re.search(r"(?:CPU|NVMe) params", label)),
            sp=int(sp[1]) if sp else 1, tp=int(tp[1]) if tp else scenario.cluster.tensor_parallel_size,
            zeropp=bool(zpp and re.search(r"hpZ|qwZ", zpp[1])),
            peak_bytes=_gib_shown(peak), free_bytes=_gib_shown(free) if fit.startswith("fits") else float("-inf"),
            tokens_per_second=float(tps.replace(",", "")), recommended=marked))
    return rows


CHOOSE_SCENARIOS = [
    dict(),
    dict(model="llama-2-13b", nodes=2),  # the fastest fitting row offloads: the planner picks ZeRO-2 without
    dict(model="llama-2-70b"),  # needs optimizer offload (NVMe)
    dict(model="llama-2-70b", gpu="A100-40GB", gpus_per_node=1),  # parameter offload: nothing fits without it
    dict(model="qwen2.5-0.5b"),  # a small model: ZeRO-0/1/2 all fit
    dict(model="llama-2-13b", nodes=2, network="eth-1g"),  # ZeRO++ across a slow network
    dict(model="mixtral-8x7b", gpu="H100-80GB", gpus_per_node=4, nodes=4, network="eth-25g"),
]


@pytest.mark.parametrize("changes", CHOOSE_SCENARIOS,
                         ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_the_stated_rule_applied_to_the_table_picks_the_planners_row(tutorial, changes):
    """Section "Choosing a stage" states the planner's rule from its constants (the tolerance, the order of
    preferences) and shows the recommended row, marked; the stated rule applied to the rows as displayed picks
    exactly that row, which is plan()'s choice."""
    tutorial.set(**{**DEFAULTS, **changes})
    p = plan(tutorial.scenario)
    assert p.fits
    step = tutorial.step("choose")
    summary = step.summary.value
    rule = rule_html(tutorial.scenario)
    assert rule in step.summary.value
    assert f"within {DEFAULT_TOLERANCE:.0%} of the fastest row left" in rule
    positions = [rule.index(f"<li>{pref.text}</li>") for pref in PREFERENCES]
    assert positions == sorted(positions)  # stated in the order the rule applies them
    assert "lower stages" not in summary  # the old, wrong rule
    rows = _displayed_rows(summary, tutorial.scenario)
    marked = [r for r in rows if r.recommended]
    assert len(marked) == 1 and marked[0].label == p.choice.label  # the recommended row is in the table, marked
    assert f"Recommended: {html_mod.escape(p.choice.label)}" in summary
    picked = rule_pick(rows)
    assert picked is not None and picked.label == p.choice.label, (picked, p.choice.label)
    # the table holds the fastest candidate the planner kept, so "the fastest row left" is the planner's fastest
    fastest = plan(tutorial.scenario, tolerance=0.0, advice=False)
    kept, proven = rule_candidates(rows)
    assert proven and max(r.tokens_per_second for r in kept) == pytest.approx(fastest.estimate.tokens_per_second,
                                                                              abs=1)
    tutorial.set(**DEFAULTS)


def test_the_rule_when_nothing_fits(tutorial):
    tutorial.set(**dict(DEFAULTS, model="qwen2.5-72b", gpus_per_node=1, gpu="V100-16GB"))
    assert not plan(tutorial.scenario).fits
    step = tutorial.step("choose")
    rows = _displayed_rows(step.summary.value, tutorial.scenario)
    assert rows and not any(r.recommended or r.fits for r in rows) and rule_pick(rows) is None
    assert "Nothing fits this cluster." in step.summary.value
    ex = step.exercise
    assert ex.unit == "GiB" and ex.expected() > min(r.peak_bytes for r in rows) / GIB
    tutorial.set(**DEFAULTS)


def _rank_candidates():
    """The planner's ranking function (a module of the planner package, or the planner module)."""
    import importlib

    for name in ("zeroplanner.planner", "zeroplanner.planner.rank"):
        try:
            fn = getattr(importlib.import_module(name), "rank_candidates", None)
        except ImportError:
            fn = None
        if fn is not None:
            return fn
    pytest.skip("zeroplanner.planner has no rank_candidates")


def test_the_stated_preferences_are_the_ranking_codes_order():
    """PREFERENCES (the text's order) against rank_candidates itself on synthetic candidates: random fits, proven
    or not, offloads, stages, ZeRO++, Ulysses and AutoTP degrees, peaks and speeds with near-ties around the
    tolerance. The stated rule's pick is the ranking's first on every draw."""
    from zeroplanner.costmodel import Candidates

    rank = _rank_candidates()
    rng = np.random.default_rng(30)
    mem = 80 * GIB
    for _ in range(400):
        n = int(rng.integers(1, 12))
        stage = rng.integers(0, 4, n)
        oo = rng.integers(0, 3, n) * (rng.random(n) < 0.5)
        op = np.where(stage == 3, rng.integers(0, 3, n) * (rng.random(n) < 0.3), 0)
        hpz = np.where((stage == 3) & (rng.random(n) < 0.3), 8, 1)
        qwz = ((stage == 3) & (rng.random(n) < 0.2)).astype(int)
        sp = rng.choice([1, 1, 2, 4], n)
        tp = rng.choice([1, 1, 2], n)
        tps = rng.choice([1.0, 0.97, 0.91, 0.899, 0.8], n) * 1e4 * (1 + 1e-6 * rng.random(n))
        peak = rng.uniform(0.3, 1.1, n) * mem
        fits = peak <= mem
        risky = fits & (rng.random(n) < 0.3)
        one = np.ones(n, dtype=np.int64)
        cand = Candidates(stage=stage, offload_optimizer=oo, offload_param=op, checkpointing=0 * one,
                          micro_batch=one, grad_accum=one, nodes=one, hpz=hpz, qwz=qwz, qgz=0 * one,
                          overlap=-one, reduce_bucket=one * 5 * 10**8, sp=sp)
        # the fields of an Evaluation that the ranking reads
        values = SimpleNamespace(fits=fits, tokens_per_second=tps, step_peak=SimpleNamespace(risky=risky, bytes=peak))
        ranked = rank(values, cand, DEFAULT_TOLERANCE, mem, tp)
        rows = [RuleRow(label=str(i), fits=bool(fits[i]), proven=not risky[i], stage=int(stage[i]),
                        offloads=int(oo[i] > 0) + int(op[i] > 0), param_offload=bool(op[i] > 0), sp=int(sp[i]),
                        tp=int(tp[i]), zeropp=bool(hpz[i] > 1 or qwz[i]), peak_bytes=float(peak[i]),
                        free_bytes=float(mem - peak[i]), tokens_per_second=float(tps[i])) for i in range(n)]
        picked = rule_pick(rows, DEFAULT_TOLERANCE)
        if ranked.size == 0:
            assert picked is None
        else:
            assert picked is not None and int(picked.label) == int(ranked[0]), (rows, ranked)
