"""Inline widgets for the ZeRO tutorial (``notebooks/zero_tutorial.ipynb``): data parallelism -> ZeRO-1 -> ZeRO-2
-> ZeRO-3 -> offload -> communication and networks -> where a step peaks -> choosing a stage.

``t = Tutorial()`` holds one shared scenario (model, GPU, GPUs per node, nodes, network; opened from the page's
query string when there is one, :func:`zeroplanner.share.scenario_from_environment`). ``t.controls`` changes it;
``t.step("zero2")`` is the widget of one step: a short text, the formulas rendered as math (``ipywidgets.HTMLMath``)
with the scenario's numbers substituted, and an exercise whose answer the widget checks. Every formula and every
answer comes from :mod:`zeroplanner.explain` (the cost model's own terms), so the numbers a student reads are the
numbers the planner uses.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable

import ipywidgets as w

from ..advice import sentence
from ..explain import Explanation, explain, explanation_html, fmt_bytes_text
from ..scenarios import build_scenario
from ..specs import Scenario, replace
from ..inputs import BY_KEY, CATALOG_KINDS
from ..units import GIB
from .controls import make_widget, widget_options

_DESC = {"description_width": "120px"}

STEPS: tuple[tuple[str, str], ...] = (
    ("dp", "1. Data parallelism"),
    ("zero1", "2. ZeRO-1: partition the optimizer states"),
    ("zero2", "3. ZeRO-2: partition the gradients too"),
    ("zero3", "4. ZeRO-3: partition the parameters too"),
    ("offload", "5. Offload to the CPU"),
    ("comm", "6. Communication and networks"),
    ("peak", "7. Where a step peaks"),
    ("choose", "8. Choosing a stage"),
)
"""Step keys and titles, in order."""

MODEL_STATES = ("parameters", "gradients", "optimizer_states")

TUTORIAL_CONTROLS: dict[str, dict[str, Any]] = {"model": {}, "gpu": {}, "gpus_per_node": {}, "nodes": {"high": 64},
                                                "network": {}}
"""Inputs of :data:`zeroplanner.inputs.INPUTS` the tutorial shows (its widget row, with these changes)."""

_CSS = """
<style>
.zp-tutorial .zp-explain { border-left: 3px solid #4c78a8; padding: 4px 10px; margin: 6px 0; background: #f7f9fc; }
.zp-tutorial .zp-muted { color: #666; font-size: 12px; }
.zp-tutorial .zp-ok { color: #2e7d32; font-weight: bold; }
.zp-tutorial .zp-no { color: #c62828; font-weight: bold; }
.zp-tutorial table { border-collapse: collapse; }
.zp-tutorial td, .zp-tutorial th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left; }
.zp-tutorial .zp-tutorial-step, .zp-tutorial .widget-htmlmath, .zp-tutorial .widget-htmlmath-content,
.zp-tutorial .zp-explain { min-width: 0; max-width: 100%; box-sizing: border-box; }
.zp-tutorial .zp-explain-formula, .zp-tutorial .zp-explain-numbers,
.zp-tutorial mjx-container[display="true"], .zp-tutorial .MathJax_Display {
  max-width: 100%; overflow-x: auto; overflow-y: hidden; }
</style>
"""
"""The tutorial's styles. Formula blocks (``$$...$$`` in ``zp-explain-formula`` / ``zp-explain-numbers``, typeset by
MathJax as ``mjx-container[display]``) are at most as wide as their step and scroll sideways inside their own box
(``min-width: 0`` on the HTMLMath widget's content: a flex item, it otherwise grows to its widest formula):
a substituted formula is up to twice as wide as an 800 px window, and was cut off at the page's edge
(tests/browser/test_browser_charts.py)."""


def with_zero(scenario: Scenario, stage: int, offload_optimizer: str = "none", offload_param: str = "none") -> Scenario:
    """``scenario`` at another ZeRO stage / offload choice (validated; raises ``ValidationError`` for an impossible
    combination, e.g. offload_param below stage 3)."""
    zero = replace(scenario.zero, stage=stage,
                   offload_optimizer=scenario.zero.offload_optimizer.model_copy(update={"device": offload_optimizer}),
                   offload_param=scenario.zero.offload_param.model_copy(update={"device": offload_param}))
    return scenario.model_copy(update={"zero": zero})


def model_state_bytes(scenario: Scenario) -> float:
    """Parameters + gradients + optimizer states per GPU, bytes (the explained terms summed)."""
    return sum(explain(scenario, k).value for k in MODEL_STATES)


# --------------------------------------------------------------------------------------------------------------
# Exercise
# --------------------------------------------------------------------------------------------------------------
class Exercise(w.VBox):
    """A question whose answer the widget checks.

    ``question()`` returns the question text (HTML); ``answer()`` the expected answer: a number (in ``unit``,
    accepted within ``rel_tol`` relative or ``abs_tol`` absolute) or, when ``choices`` is given, one of them.
    :meth:`check` compares the typed/picked value and writes the verdict; :meth:`reveal` shows the answer.
    """

    def __init__(self, question: Callable[[], str], answer: Callable[[], Any], *, unit: str = "GiB",
                 rel_tol: float = 0.02, abs_tol: float = 0.01, choices: list[tuple[str, Any]] | None = None) -> None:
        self._question, self._answer = question, answer
        self.unit, self.rel_tol, self.abs_tol, self.choices = unit, rel_tol, abs_tol, choices
        self.question_html = w.HTML()
        if choices is not None:
            self.answer_box = w.Dropdown(options=choices, value=None, description="Answer", style=_DESC)
        else:
            self.answer_box = w.FloatText(value=0.0, description=f"Answer ({unit})", style=_DESC,
                                          layout=w.Layout(width="260px"))
        self.check_button = w.Button(description="Check", button_style="primary", layout=w.Layout(width="90px"))
        self.reveal_button = w.Button(description="Show answer", layout=w.Layout(width="110px"))
        self.feedback = w.HTML()
        self.check_button.on_click(lambda _: self.check())
        self.reveal_button.on_click(lambda _: self.reveal())
        super().__init__([self.question_html, w.HBox([self.answer_box, self.check_button, self.reveal_button]),
                          self.feedback])
        self.add_class("zp-exercise")
        self.refresh()

    def expected(self) -> Any:
        return self._answer()

    def refresh(self) -> None:
        """Re-ask for the current scenario (clears the verdict)."""
        self.question_html.value = f"<b>Exercise.</b> {self._question()}"
        self.feedback.value = ""

    def is_correct(self, value: Any) -> bool:
        expected = self.expected()
        if self.choices is not None:
            return value == expected
        try:
            x = float(value)
        except (TypeError, ValueError):
            return False
        return math.isfinite(x) and abs(x - float(expected)) <= max(self.abs_tol, self.rel_tol * abs(float(expected)))

    def _shown(self, value: Any) -> str:
        if self.choices is not None:
            return next((label for label, v in self.choices if v == value), str(value))
        return f"{float(value):.2f} {self.unit}"

    def check(self, value: Any = None) -> bool:
        """Check ``value`` (default: what is in the answer box), show the verdict, return whether it is right."""
        value = self.answer_box.value if value is None else value
        if value is None:
            self.feedback.value = "<span class='zp-no'>Pick an answer first.</span>"
            return False
        ok = self.is_correct(value)
        if ok:
            self.feedback.value = f"<span class='zp-ok'>Correct</span>: {html.escape(self._shown(self.expected()))}."
        else:
            self.feedback.value = (f"<span class='zp-no'>Not quite</span> ({html.escape(self._shown(value))}). "
                                   "Read the numbers in the formulas above and try again.")
        return ok

    def reveal(self) -> None:
        self.feedback.value = f"Answer: <b>{html.escape(self._shown(self.expected()))}</b>"


# --------------------------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------------------------
@dataclass
class _StepSpec:
    intro: str
    terms: tuple[str, ...]
    scenario: Callable[["TutorialStep"], Scenario]
    question: Callable[["TutorialStep"], str]
    answer: Callable[["TutorialStep"], Any]
    choices: list[tuple[str, Any]] | None = None


def _gib(x: float) -> float:
    return x / GIB


class TutorialStep(w.VBox):
    """One step: intro text, its own small control(s), the formulas with the numbers substituted (``math``, an
    ``HTMLMath``), a summary line and an :class:`Exercise`. ``explanations`` are the terms currently shown;
    ``scenario`` the scenario they describe."""

    def __init__(self, key: str, title: str, tutorial: Tutorial) -> None:
        self.key, self.title, self.tutorial = key, title, tutorial
        self.knobs: dict[str, w.Widget] = {}
        self.math = w.HTMLMath()
        self.summary = w.HTML()
        self.explanations: list[Explanation] = []
        self.scenario: Scenario = tutorial.scenario
        self.error = w.HTML()
        spec = _SPECS[key]
        self._spec = spec
        knob_box = w.HBox(self._make_knobs())
        self.exercise = Exercise(lambda: spec.question(self), lambda: spec.answer(self), choices=spec.choices)
        super().__init__([w.HTML(f"<h3>{html.escape(title)}</h3><p>{spec.intro}</p>"), knob_box, self.error,
                          self.math, self.summary, self.exercise])
        self.add_class("zp-tutorial-step")
        self.update()

    def _make_knobs(self) -> list[w.Widget]:
        if self.key == "offload":
            self.knobs["variant"] = w.Dropdown(
                options=[("ZeRO-2 + CPU optimizer", (2, "cpu", "none")), ("ZeRO-3 + CPU optimizer", (3, "cpu", "none")),
                         ("ZeRO-3 + CPU optimizer & params", (3, "cpu", "cpu"))],
                value=(2, "cpu", "none"), description="Offload", style=_DESC, layout=w.Layout(width="380px"))
        if self.key == "peak":
            self.knobs["stage"] = w.Dropdown(options=[("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3)], value=2,
                                             description="Stage", style=_DESC)
            self.knobs["checkpointing"] = w.Dropdown(options=[("none", "none"), ("selective", "selective"),
                                                              ("full", "full")], value="none",
                                                     description="Checkpointing", style=_DESC)
        if self.key == "comm":
            self.knobs["stage"] = w.Dropdown(options=[("ZeRO-0 (plain DP)", 0), ("ZeRO-1", 1), ("ZeRO-2", 2),
                                                      ("ZeRO-3", 3)], value=3, description="Stage", style=_DESC)
        for knob in self.knobs.values():
            knob.observe(lambda _: self.update(), names="value")
        return list(self.knobs.values())

    def update(self) -> None:
        """Recompute for the tutorial's current scenario and this step's knobs."""
        try:
            self.scenario = self._spec.scenario(self)
            self.explanations = [explain(self.scenario, k) for k in self._spec.terms]
        except (ValueError, KeyError) as exc:
            self.error.value = f"<div class='zp-no'>{html.escape(str(exc))}</div>"
            return
        self.error.value = ""
        self.math.value = "".join(explanation_html(e) for e in self.explanations)
        self.summary.value = _summary(self)
        self.exercise.refresh()


def _dp_scenario(step: TutorialStep) -> Scenario:
    return with_zero(step.tutorial.scenario, 0)


def _stage(n: int) -> Callable[[TutorialStep], Scenario]:
    return lambda step: with_zero(step.tutorial.scenario, n)


def _offload_scenario(step: TutorialStep) -> Scenario:
    stage, opt, par = step.knobs["variant"].value
    return with_zero(step.tutorial.scenario, stage, opt, par)


def _comm_scenario(step: TutorialStep) -> Scenario:
    return with_zero(step.tutorial.scenario, step.knobs["stage"].value)


def with_checkpointing(scenario: Scenario, checkpointing: str) -> Scenario:
    """``scenario`` with another activation-checkpointing mode ("none", "selective", "full"; validated)."""
    return scenario.model_copy(update={"training": replace(scenario.training, checkpointing=checkpointing)})


def _peak_scenario(step: TutorialStep) -> Scenario:
    return with_checkpointing(with_zero(step.tutorial.scenario, step.knobs["stage"].value),
                              step.knobs["checkpointing"].value)


def _estimate(step: TutorialStep, scenario: Scenario | None = None):
    """The cost model's estimate of ``scenario`` (default: the step's), cached on the tutorial per scenario."""
    from ..costmodel import estimate

    scenario = step.scenario if scenario is None else scenario
    cache = step.tutorial._estimates
    if scenario not in cache:
        if len(cache) > 64:
            cache.clear()
        cache[scenario] = estimate(scenario)
    return cache[scenario]


def _peak_phase(step: TutorialStep) -> str:
    peak = _estimate(step).step_peak
    return peak.phase if peak is not None else "none"


def _nd(step: TutorialStep) -> int:
    return step.scenario.cluster.data_parallel_degree


def _plan(step: TutorialStep):
    """The planner's plan of the tutorial's scenario (computed once per scenario)."""
    from ..planner import plan

    t = step.tutorial
    if t._plan_cache is None or t._plan_cache[0] is not t.scenario:
        t._plan_cache = (t.scenario, plan(t.scenario))
    return t._plan_cache[1]


def _chosen_stage(step: TutorialStep) -> Any:
    p = _plan(step)
    return p.choice.stage if p.fits and p.choice is not None else "none"


_SPECS: dict[str, _StepSpec] = {
    "dp": _StepSpec(
        intro="Plain data parallelism (DeepSpeed stage 0) copies the whole model to every GPU: each GPU keeps all "
              "parameters, all gradients and all optimizer states, and the GPUs all-reduce the gradients every "
              "step. Adding GPUs adds throughput, not memory: the model states per GPU do not depend on N_d.",
        terms=MODEL_STATES,
        scenario=_dp_scenario,
        question=lambda s: (f"How many GiB of model states (parameters + gradients + optimizer states) does each of "
                            f"the {_nd(s)} GPUs hold?"),
        answer=lambda s: _gib(model_state_bytes(s.scenario)),
    ),
    "zero1": _StepSpec(
        intro="ZeRO-1 (P<sub>os</sub>) splits the optimizer states, the largest part of the model states for Adam "
              "(fp32 master weights + momentum + variance = 12 bytes per parameter), into N<sub>d</sub> partitions: "
              "each GPU updates only its 1/N<sub>d</sub> of the parameters.",
        terms=("optimizer_states", "gradients"),
        scenario=_stage(1),
        question=lambda s: f"How many GiB of optimizer states does each GPU hold with ZeRO-1 on {_nd(s)} GPUs?",
        answer=lambda s: _gib(explain(s.scenario, "optimizer_states").value),
    ),
    "zero2": _StepSpec(
        intro="ZeRO-2 (P<sub>os+g</sub>) also partitions the gradients: each gradient bucket is reduced to the GPU "
              "that owns it and the others free it. DeepSpeed keeps a 16-bit and an fp32 gradient partition.",
        terms=("gradients", "optimizer_states"),
        scenario=_stage(2),
        question=lambda s: "How many GiB of model states per GPU does ZeRO-2 save compared with ZeRO-1 in this "
                           "scenario? (Compare with step 2's numbers.)",
        answer=lambda s: _gib(model_state_bytes(with_zero(s.tutorial.scenario, 1)) - model_state_bytes(s.scenario)),
    ),
    "zero3": _StepSpec(
        intro="ZeRO-3 (P<sub>os+g+p</sub>) partitions the parameters too: each layer's parameters are gathered "
              "just before they are used (forward and again in backward) and released afterwards. The price: a "
              "working set of gathered parameters (buffers) and 3&Psi; instead of 2&Psi; of communication.",
        terms=("parameters", "buffers"),
        scenario=_stage(3),
        question=lambda s: f"How many GiB of parameters does each GPU keep with ZeRO-3 on {_nd(s)} GPUs?",
        answer=lambda s: _gib(explain(s.scenario, "parameters").value),
    ),
    "offload": _StepSpec(
        intro="ZeRO-Offload moves the optimizer states (and with ZeRO-3 optionally the parameters) to host RAM; "
              "the optimizer step runs on the CPU (DeepSpeed CPU-Adam). GPU memory falls, host RAM per node rises, "
              "and PCIe traffic and CPU time are added to the step.",
        terms=("optimizer_states", "host_memory", "offload", "optimizer"),
        scenario=_offload_scenario,
        question=lambda s: "How many GiB of host RAM does each node need for the offloaded states (all its GPUs "
                           "together)?",
        answer=lambda s: _gib(explain(s.scenario, "host_memory").value),
    ),
    "comm": _StepSpec(
        intro="Every step the GPUs exchange gradients (and with ZeRO-3 parameters). Ring collectives send "
              "(N<sub>d</sub>-1)/N<sub>d</sub> of the data per GPU per reduce-scatter or all-gather; an all-reduce "
              "is both. The time depends on the slowest link: NVLink inside a node, the network between nodes. "
              "Change the network above and watch the exposed time.",
        terms=("communication_volume", "communication"),
        scenario=_comm_scenario,
        question=lambda s: "How many GiB does each GPU send per optimizer step with this stage?",
        answer=lambda s: _gib(explain(s.scenario, "communication_volume").value),
    ),
    "peak": _StepSpec(
        intro="A step does not hold every term at its largest at once. Memory rises through the forward as each "
              "layer saves its activations, the loss adds the logits, the backward frees the activations layer by "
              "layer while the gradients grow, and the optimizer step adds what only it needs. The step peaks in "
              "one phase, and that peak is what must fit in the GPU's memory. Two phases are often the highest: the "
              "<b>loss backward</b>, which still holds the forward's activations and the logits' fp32 gradients "
              "(the log-softmax output, its incoming gradient and the gradient it produces: 4 + 4 + 4 = 12 bytes "
              "per logit), and the <b>optimizer step</b>, which holds the optimizer states and the fp32 gradient "
              "partition (4 bytes per parameter the GPU updates) it steps with. Activation checkpointing shrinks "
              "the first (only each layer's input is saved); a higher ZeRO stage shrinks the second (the states "
              "and gradients are split over N<sub>d</sub> GPUs). Change the stage and checkpointing here and watch "
              "the peak move.",
        terms=("activations", "optimizer_states"),
        scenario=_peak_scenario,
        question=lambda s: "In which phase does this step peak?",
        answer=_peak_phase,
        choices=[("forward", "forward"), ("loss forward", "loss forward"), ("loss backward", "loss backward"),
                 ("backward", "backward"), ("optimizer step", "optimizer step")],
    ),
    "choose": _StepSpec(
        intro="The planner evaluates every stage, offload choice, checkpointing mode and micro-batch, keeps what "
              "fits (with a safety margin) and prefers the fastest; within 10% it prefers no offload and lower "
              "stages. Try a bigger model or fewer GPUs above and see the choice move. Before the stage it says what an "
              "experienced engineer says first: which defaults it assumed, whether fewer nodes would be faster "
              "(try 2 nodes on eth-1g: one node is an order of magnitude faster) and whether a cheaper method "
              "(LoRA, QLoRA) avoids offload.",
        terms=("step",),
        scenario=lambda s: _plan(s).scenario if _plan(s).fits else s.tutorial.scenario,
        question=lambda s: "Which ZeRO stage does the planner recommend for this scenario?",
        answer=_chosen_stage,
        choices=[("ZeRO-0", 0), ("ZeRO-1", 1), ("ZeRO-2", 2), ("ZeRO-3", 3), ("nothing fits", "none")],
    ),
}


def _summary(step: TutorialStep) -> str:
    s = step.scenario
    if step.key in ("dp", "zero1", "zero2", "zero3"):
        cap = s.cluster.memory_per_gpu_bytes
        return (f"<div class='zp-muted'>Model states per GPU at this stage: <b>"
                f"{fmt_bytes_text(model_state_bytes(s))}</b> of {fmt_bytes_text(cap)} GPU memory "
                f"(N<sub>d</sub> = {s.cluster.data_parallel_degree}).</div>")
    if step.key == "offload":
        return (f"<div class='zp-muted'>Host RAM per node: {fmt_bytes_text(s.cluster.cpu_memory_bytes)}; the "
                f"planner also requires x{s.assumptions.host_buffer_factor} headroom (DeepSpeed's "
                "additional_buffer_factor).</div>")
    if step.key == "choose":
        return _plan_table(step)
    if step.key == "peak":
        return _peak_summary(step)
    return ""


def _point(points, phase: str, last: bool = False):
    """The first (or last) timeline point of ``phase``, None if there is none."""
    found = [p for p in points if p.phase == phase]
    return (found[-1] if last else found[0]) if found else None


def _peak_summary(step: TutorialStep) -> str:
    """The step's timeline as a table (the largest point of each phase, GiB per GPU; the peak in bold), what the
    loss backward and the optimizer step hold (the model's bytes, with the 12 bytes per logit and the 4 bytes per
    updated parameter worked out from the scenario), and where the peak goes at other stages and checkpointing
    modes (one estimate each)."""
    s = step.scenario
    est = _estimate(step)
    peak = est.step_peak
    if peak is None or not peak.timeline:
        return "<div class='zp-muted'>The cost model gives no step timeline for this scenario.</div>"
    points, t = peak.timeline, s.training
    phases: dict[str, float] = {}
    for p in points:
        phases[p.phase] = max(phases.get(p.phase, 0.0), float(p.total))
    top = max(phases.values()) or 1.0
    bold = " class='zp-peak-row' style='font-weight:bold'"
    rows = "".join(
        f"<tr{bold if ph == peak.phase else ''}><td>{html.escape(ph)}</td><td>{fmt_bytes_text(b)}</td><td><div "
        f"style='background:#4c78a8;height:10px;width:{int(220 * b / top)}px'></div></td></tr>"
        for ph, b in phases.items())
    parts = [f"<div class='zp-peak-verdict'><b>Over one step</b> (ZeRO-{s.zero.stage}, {t.checkpointing} "
             f"activation checkpointing): {html.escape(peak.verdict())}.</div>",
             f"<table class='zp-peak-phases'><tr><th>phase</th><th>largest point, per GPU</th><th></th></tr>{rows}"
             "</table>"]
    loss_bwd = _point(points, "loss backward")
    if loss_bwd is not None:
        logit_bytes = float(loss_bwd.bytes.get("logits", 0))
        logits = t.micro_batch * t.seq_len * s.model.vocab_size
        if logits and abs(logit_bytes - 12 * logits) < 1:
            how = (f"12 B &times; b&middot;s&middot;V = 12 &times; {t.micro_batch} &times; {t.seq_len:,} &times; "
                   f"{s.model.vocab_size:,} = 12 &times; {logits:,} logits = <b>{fmt_bytes_text(logit_bytes)}</b>")
        else:  # a tiled loss, soft-capping or sequence parallelism change the bytes per logit on this GPU
            how = f"<b>{fmt_bytes_text(logit_bytes)}</b> in this configuration"
        act = float(loss_bwd.bytes.get("activations", 0))
        parts.append(f"<p>The <b>loss backward</b> holds the logits' fp32 gradients: {how}, on top of "
                     f"{fmt_bytes_text(act)} of saved activations: {fmt_bytes_text(loss_bwd.total)} per GPU.</p>")
    opt, end_bwd = _point(points, "optimizer step"), _point(points, "backward", last=True)
    if opt is not None and end_bwd is not None:
        added = float(opt.bytes.get("gradients", 0)) - float(end_bwd.bytes.get("gradients", 0))
        psi, nd = est.trainable_parameters, est.data_parallel_degree
        partition = 4 * psi / nd
        how = (f"4 B &times; &Psi;/N<sub>d</sub> = 4 &times; {psi:,} / {nd} = <b>{fmt_bytes_text(partition)}</b>"
               if abs(added - partition) < 1 else f"<b>{fmt_bytes_text(added)}</b> more gradient bytes")
        parts.append(f"<p>The <b>optimizer step</b> adds the fp32 gradient partition it steps with: {how}, beside "
                     f"{fmt_bytes_text(opt.bytes.get('optimizer_states', 0))} of optimizer states: "
                     f"{fmt_bytes_text(opt.total)} per GPU.</p>")
    parts.append(_peak_moves(step))
    return "<div class='zp-peak'>" + "".join(parts) + "</div>"


def _peak_moves(step: TutorialStep) -> str:
    """Peak (GiB per GPU) and its phase at ZeRO-1/2/3 without and with full activation checkpointing (the step's
    own choice in bold)."""
    base = step.tutorial.scenario
    modes = ("none", "full")
    head = "".join(f"<th>checkpointing {m}</th>" for m in modes)
    rows = []
    for stage in (1, 2, 3):
        cells = []
        for mode in modes:
            peak = _estimate(step, with_checkpointing(with_zero(base, stage), mode)).step_peak
            text = f"{fmt_bytes_text(peak.bytes)} in the {html.escape(peak.phase)}" if peak is not None else "n/a"
            mine = stage == step.scenario.zero.stage and mode == step.scenario.training.checkpointing
            cells.append(f"<td>{'<b>' + text + '</b>' if mine else text}</td>")
        rows.append(f"<tr><td>ZeRO-{stage}</td>{''.join(cells)}</tr>")
    return ("<div><b>Where the peak goes</b> (peak per GPU and its phase): checkpointing shrinks the forward's and "
            "the loss's activations, a higher stage shrinks what the optimizer step holds.</div>"
            f"<table class='zp-peak-moves'><tr><th>stage</th>{head}</tr>{''.join(rows)}</table>")


def _plan_table(step: TutorialStep) -> str:
    p = _plan(step)
    rows = []
    for v in p.variants:
        e = v.estimate
        rows.append(f"<tr><td>{html.escape(v.label)}</td><td>{fmt_bytes_text(e.per_gpu_bytes.total)}</td>"
                    f"<td>{'fits' if e.fits else 'does not fit'}</td><td>{e.tokens_per_second:,.0f}</td></tr>")
    head = ("<b>Recommended: " + html.escape(p.choice.label) + "</b>") if p.fits and p.choice else \
        "<b>Nothing fits this cluster.</b>"
    # what an experienced engineer says before the stage: the defaults assumed, fewer nodes, a cheaper method
    head += "".join(f"<div class='zp-assume'>{html.escape(sentence(a))}</div>" for a in p.assumptions)
    head += "".join(f"<div class='zp-advice'><b>Advice:</b> {html.escape(a)}</div>" for a in p.advice)
    return (f"<div>{head}</div><table><tr><th>variant</th><th>GiB per GPU</th><th>fit</th><th>tokens/s</th></tr>"
            + "".join(rows) + "</table>")


# --------------------------------------------------------------------------------------------------------------
# The tutorial
# --------------------------------------------------------------------------------------------------------------
class Tutorial:
    """The shared scenario, its controls, and the step widgets (built on first use).

    ``Tutorial()`` opens on the page's query string when there is one (``?model=llama-2-13b&nodes=2``), else on a
    Llama-2-7B on one node of 8 A100-80GB. ``set(**inputs)`` changes the scenario like the controls do (keys of
    :func:`zeroplanner.scenarios.build_scenario`) and updates every step.
    """

    def __init__(self, scenario: Scenario | None = None) -> None:
        self.message = w.HTML()
        if scenario is None:
            from ..share import ShareError, scenario_from_environment

            try:
                scenario = scenario_from_environment()
            except ShareError as exc:
                self.message.value = (f"<div class='zp-no'>The link's scenario was not used: "
                                      f"{html.escape(str(exc))}</div>")
        self.scenario = scenario or build_scenario()
        self._steps: dict[str, TutorialStep] = {}
        self._quiet = False
        self._plan_cache: tuple[Scenario, Any] | None = None
        self._estimates: dict[Scenario, Any] = {}
        self.widgets: dict[str, w.Widget] = {}
        for key, overrides in TUTORIAL_CONTROLS.items():
            inp = BY_KEY[key]
            value = inp.read(self.scenario)
            options = widget_options(inp)
            if inp.kind == "model":
                options = options[1:]  # no "(custom size)": the tutorial's models are catalog models
            if inp.kind in CATALOG_KINDS and value not in options:
                value = None
            self.widgets[key] = make_widget(inp, value, style=_DESC, layout=None, options=options, **overrides)
        for key, widget in self.widgets.items():
            widget.observe(lambda ch, k=key: self._changed(k, ch["new"]), names="value")
        self.controls = w.VBox([w.HTML(_CSS + "<b>Scenario for every step below</b>"),
                                w.HBox([self.widgets["model"], self.widgets["gpu"], self.widgets["network"]]),
                                w.HBox([self.widgets["gpus_per_node"], self.widgets["nodes"]]), self.message])
        self.controls.add_class("zp-tutorial")

    def step(self, key: str) -> TutorialStep:
        """The widget of step ``key`` (see :data:`STEPS`); raises ``KeyError`` naming the steps otherwise."""
        titles = dict(STEPS)
        if key not in titles:
            raise KeyError(f"unknown step {key!r}; steps: {', '.join(titles)}")
        if key not in self._steps:
            widget = TutorialStep(key, titles[key], self)
            widget.add_class("zp-tutorial")
            self._steps[key] = widget
        return self._steps[key]

    def all_steps(self) -> w.VBox:
        """Controls and every step in one container (for a single-cell page)."""
        return w.VBox([self.controls, *(self.step(k) for k, _ in STEPS)])

    def _changed(self, key: str, value: Any) -> None:
        if value is None or self._quiet:
            return
        self.set(**{key: value})

    def set(self, **changes: Any) -> None:
        """Rebuild the scenario with ``changes`` (build_scenario keywords: model, gpu, gpus_per_node, nodes,
        network, ...) on top of the current inputs and update every step. Invalid values show a message."""
        from ..share import ShareError, scenario_inputs, scenario_from_inputs

        inputs, _ = scenario_inputs(self.scenario, approximate_model=True)
        inputs.update(changes)
        try:
            self.scenario = scenario_from_inputs({k: v for k, v in inputs.items() if v is not None})
        except ShareError as exc:
            self.message.value = f"<div class='zp-no'>{html.escape(str(exc))}</div>"
            return
        self.message.value = ""
        self._quiet = True
        try:
            for key, widget in self.widgets.items():
                if key in changes and widget.value != changes[key]:
                    widget.value = changes[key]
        finally:
            self._quiet = False
        for step in self._steps.values():
            step.update()
