"""The ZeRO tutorial: every number it renders is the cost model's, for whatever scenario is set; exercises check
their answers; the notebook executes (nbclient) and opens on a link's query string."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("ipywidgets")

from zeroplanner.costmodel import estimate  # noqa: E402
from zeroplanner.explain import fmt_bytes_text, fmt_seconds_text  # noqa: E402
from zeroplanner.planner import plan  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui.tutorial import STEPS, Tutorial, with_checkpointing, with_zero  # noqa: E402
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


def test_exercise_answers_are_the_cost_model_numbers(tutorial):
    tutorial.set(model="llama-2-13b", nodes=2, gpu="A100-80GB", gpus_per_node=8, network="ib-hdr")
    base = tutorial.scenario
    states = lambda s: sum(getattr(estimate(s).per_gpu_bytes, k) for k in  # noqa: E731
                           ("parameters", "gradients", "optimizer_states"))
    expected = {
        "dp": states(with_zero(base, 0)) / GIB,
        "zero1": estimate(with_zero(base, 1)).per_gpu_bytes.optimizer_states / GIB,
        "zero2": (states(with_zero(base, 1)) - states(with_zero(base, 2))) / GIB,
        "zero3": estimate(with_zero(base, 3)).per_gpu_bytes.parameters / GIB,
        "offload": estimate(with_zero(base, 2, "cpu")).per_node_cpu_bytes / GIB,
        "comm": estimate(with_zero(base, 3)).communication.bytes_per_gpu_per_step / GIB,
        "choose": plan(base).choice.stage,
    }
    for key, value in expected.items():
        ex = tutorial.step(key).exercise
        got = ex.expected()
        if isinstance(value, float):
            assert got == pytest.approx(value, abs=1e-6), key
        else:
            assert got == value, key
        assert ex.check(value) is True
        assert "Correct" in ex.feedback.value
        wrong = value * 1.5 + 1 if isinstance(value, float) else (value + 1) % 4
        assert ex.check(wrong) is False
        assert "Not quite" in ex.feedback.value
        ex.reveal()
        assert "Answer:" in ex.feedback.value


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
        ex = step.exercise
        assert ex.expected() == peak.phase and ex.check(peak.phase) is True
        wrong = next(ph for ph in ("forward", "optimizer step") if ph != peak.phase)
        assert ex.check(wrong) is False
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
    assert len(maths) == len(STEPS)
    s = with_zero(build_scenario(model="llama-2-13b", nodes=2), 1)
    shown = fmt_bytes_text(estimate(s).per_gpu_bytes.optimizer_states)
    assert any(f"<b class='zp-explain-value'>{shown}</b>" in m for m in maths)
    assert all(re.search(r"\$\$.+\$\$", m) for m in maths)
    json.dumps(state)  # the state is plain JSON (what Voilà sends to the page)


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
