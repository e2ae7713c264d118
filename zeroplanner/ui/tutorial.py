"""Inline widgets for the ZeRO tutorial (``notebooks/zero_tutorial.ipynb``): data parallelism -> ZeRO-1 -> ZeRO-2
-> ZeRO-3 -> offload -> communication and networks -> where a step peaks -> choosing a stage.

``t = Tutorial()`` holds one shared scenario (model, GPU, GPUs per node, nodes, network; opened from the page's
query string when there is one, :func:`zeroplanner.share.link_from_environment`: what a link gets wrong is left out
and named). ``t.controls`` changes it;
``t.step("zero2")`` is the widget of one step: a short text, the formulas rendered as math (``ipywidgets.HTMLMath``)
with the scenario's numbers substituted, and an exercise whose answer the widget checks. Every formula and every
answer comes from :mod:`zeroplanner.explain` (the cost model's own terms), so the numbers a student reads are the
numbers the planner uses.

Exercises ask for a number the reader computes from the formulas for another input (twice the GPUs, twice the
micro-batch, the planner's headroom factor or tolerance), so no answer is on the page before Check or Show answer;
a wrong answer gets a hint that names the accounting the answer uses (:func:`accounting_note`: DeepSpeed's
measured 20 bytes of model states per parameter without ZeRO, or the ZeRO paper's 16). "Choosing a stage" states
the planner's rule (:func:`rule_html`: its tolerance, ``zeroplanner.planner.DEFAULT_TOLERANCE``, and
:data:`PREFERENCES`, the order of ``rank_candidates``) and shows it applied to :func:`plan_rows`, the recommended
row marked; :func:`rule_pick` is the stated rule as code (tests/ui/test_tutorial.py: it picks the planner's row).
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
    """A question whose answer the widget checks; the answer stays hidden until the reader checks or reveals it.

    ``question()`` returns the question text (HTML). It asks for a number the reader computes from the formulas
    shown (for another input than the one shown: twice the GPUs, twice the micro-batch, ...), so the answer is
    nowhere on the page before :meth:`check` or :meth:`reveal`. ``answer()`` is the expected answer in ``unit``,
    accepted within ``rel_tol`` relative or ``abs_tol`` absolute. ``hint()`` says how to compute it and names the
    accounting the answer uses (DeepSpeed's measured 20 bytes per parameter of model states without ZeRO, or the
    ZeRO paper's 16): shown with a wrong answer and with the revealed answer. ``others()`` lists known other
    answers as (value, why it is not this one), e.g. what the other accounting gives: a typed value that matches one
    is refused with its reason.
    """

    def __init__(self, question: Callable[[], str], answer: Callable[[], float], *,
                 unit: str | Callable[[], str] = "GiB", rel_tol: float | Callable[[], float] = 0.02,
                 abs_tol: float = 0.01, hint: Callable[[], str] = lambda: "",
                 others: Callable[[], list[tuple[float, str]]] = lambda: []) -> None:
        self._question, self._answer, self._hint, self._others = question, answer, hint, others
        self._unit, self._rel_tol, self.abs_tol = unit, rel_tol, abs_tol
        self.question_html = w.HTML()
        self.answer_box = w.FloatText(value=0.0, description=f"Answer ({self.unit})", style=_DESC,
                                      layout=w.Layout(width="260px"))
        self.check_button = w.Button(description="Check", button_style="primary", layout=w.Layout(width="90px"))
        self.reveal_button = w.Button(description="Show answer", layout=w.Layout(width="110px"))
        self.feedback = w.HTMLMath()  # the hints quote the formulas above ($...$)
        self.check_button.on_click(lambda _: self.check())
        self.reveal_button.on_click(lambda _: self.reveal())
        super().__init__([self.question_html, w.HBox([self.answer_box, self.check_button, self.reveal_button]),
                          self.feedback])
        self.add_class("zp-exercise")
        self.refresh()

    @property
    def unit(self) -> str:
        return self._unit() if callable(self._unit) else self._unit

    @property
    def rel_tol(self) -> float:
        return self._rel_tol() if callable(self._rel_tol) else self._rel_tol

    def expected(self) -> float:
        return float(self._answer())

    def hint(self) -> str:
        """How to compute the answer and which accounting it uses (HTML; never the answer itself)."""
        return self._hint()

    def others(self) -> list[tuple[float, str]]:
        return list(self._others())

    def refresh(self) -> None:
        """Re-ask for the current scenario (clears the verdict)."""
        try:
            self.question_html.value = f"<b>Exercise.</b> {self._question()}"
        except ValueError as exc:  # its other input is out of range (e.g. twice a micro-batch at the limit)
            self.question_html.value = (f"<b>Exercise.</b> <span class='zp-muted'>None for this scenario: "
                                        f"{html.escape(str(exc))}</span>")
        self.answer_box.description = f"Answer ({self.unit})"
        self.feedback.value = ""

    def _close(self, value: Any, expected: float) -> bool:
        try:
            x = float(value)
        except (TypeError, ValueError):
            return False
        return math.isfinite(x) and abs(x - expected) <= max(self.abs_tol, self.rel_tol * abs(expected))

    def is_correct(self, value: Any) -> bool:
        return self._close(value, self.expected())

    def _shown(self, value: Any) -> str:
        try:
            x = float(value)
        except (TypeError, ValueError):
            return str(value)
        return f"{x:,.0f} {self.unit}" if self.unit == "tokens/s" else f"{x:.2f} {self.unit}"

    def check(self, value: Any = None) -> bool:
        """Check ``value`` (default: what is in the answer box), show the verdict, return whether it is right. A
        wrong answer gets the hint (and, when it is a known other answer, why it is not this one), not the answer."""
        value = self.answer_box.value if value is None else value
        try:
            ok = self.is_correct(value)
        except ValueError as exc:  # the exercise's other input is out of range in this scenario
            self.feedback.value = f"<span class='zp-no'>No exercise for this scenario</span>: {html.escape(str(exc))}"
            return False
        hint = self.hint()
        if ok:
            self.feedback.value = (f"<span class='zp-ok'>Correct</span>: {html.escape(self._shown(self.expected()))}."
                                   f"<div class='zp-muted zp-hint'>{hint}</div>")
            return True
        why = next((reason for v, reason in self.others() if self._close(value, v)), "")
        self.feedback.value = (f"<span class='zp-no'>Not quite</span> ({html.escape(self._shown(value))})."
                               + (f" <span class='zp-other'>{why}</span>" if why else "")
                               + f"<div class='zp-muted zp-hint'><b>Hint:</b> {hint}</div>")
        return False

    def reveal(self) -> None:
        try:
            self.expected()
        except ValueError as exc:
            self.feedback.value = f"<span class='zp-no'>No exercise for this scenario</span>: {html.escape(str(exc))}"
            return
        self.feedback.value = (f"Answer: <b>{html.escape(self._shown(self.expected()))}</b>"
                               f"<div class='zp-muted zp-hint'>{self.hint()}</div>")


# --------------------------------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------------------------------
@dataclass
class _StepSpec:
    intro: str
    terms: tuple[str, ...]
    scenario: Callable[["TutorialStep"], Scenario]
    question: Callable[["TutorialStep"], str]
    answer: Callable[["TutorialStep"], float]
    hint: Callable[["TutorialStep"], str]
    others: Callable[["TutorialStep"], list[tuple[float, str]]] = lambda step: []
    unit: str | Callable[["TutorialStep"], str] = "GiB"
    rel_tol: float | Callable[["TutorialStep"], float] = 0.02


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
        self.exercise = Exercise(lambda: spec.question(self), lambda: spec.answer(self),
                                 unit=(lambda: spec.unit(self)) if callable(spec.unit) else spec.unit,
                                 rel_tol=(lambda: spec.rel_tol(self)) if callable(spec.rel_tol) else spec.rel_tol,
                                 hint=lambda: spec.hint(self), others=lambda: spec.others(self))
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


def _nd(step: TutorialStep) -> int:
    return step.scenario.cluster.data_parallel_degree


def with_nodes(scenario: Scenario, nodes: int) -> Scenario:
    """``scenario`` on ``nodes`` nodes (validated)."""
    return scenario.model_copy(update={"cluster": replace(scenario.cluster, nodes=nodes)})


def with_micro_batch(scenario: Scenario, micro_batch: int) -> Scenario:
    """``scenario`` with another micro-batch (validated; the accumulation steps unchanged)."""
    return scenario.model_copy(update={"training": replace(scenario.training, micro_batch=micro_batch)})


def with_accounting(scenario: Scenario, accounting: str) -> Scenario:
    """``scenario`` under another memory accounting (``Assumptions.accounting``: "deepspeed" or "paper")."""
    return scenario.model_copy(update={"assumptions": replace(scenario.assumptions, accounting=accounting)})


def _doubled(step: TutorialStep) -> Scenario:
    """The step's scenario on twice as many nodes (twice N_d): what the exercises ask about."""
    return with_nodes(step.scenario, 2 * step.scenario.cluster.nodes)


def _twice_nd(step: TutorialStep) -> str:
    d = _doubled(step).cluster
    return (f"on twice as many GPUs ({d.nodes} node{'s' if d.nodes > 1 else ''} of {d.gpus_per_node}: "
            f"N<sub>d</sub> = {d.data_parallel_degree} instead of {_nd(step)})")


# --------------------------------------------------------------------------------------------------------------
# Accounting: which bytes per parameter the answers count
# --------------------------------------------------------------------------------------------------------------
ACCOUNTING_NAMES = {"deepspeed": "DeepSpeed's measured accounting", "paper": "the ZeRO paper's accounting"}
"""``Assumptions.accounting`` -> its name in the exercises' hints."""


def _other_accounting(scenario: Scenario) -> str:
    return "paper" if scenario.assumptions.accounting != "paper" else "deepspeed"


def bytes_per_parameter(scenario: Scenario) -> list[tuple[str, float]]:
    """Model states without ZeRO (stage 0) per trainable parameter, by part, in the scenario's accounting:
    (term: part label, bytes), the cost model's parts (:func:`zeroplanner.explain.explain`) divided by Ψ_t; parts
    of 0 bytes left out. DeepSpeed's accounting: 2 + 2 + 4 + 4 + 8 = 20 for bf16 Adam; the paper's 2 + 2 + 12 = 16.
    Counted for a full fine-tune of the scenario's model (with LoRA only the adapters train; the frozen base adds
    its weights, not per trained parameter)."""
    s0 = with_zero(scenario, 0)
    if s0.training.lora_rank or s0.training.qlora:
        s0 = s0.model_copy(update={"training": replace(s0.training, lora_rank=0, qlora=False)})
    psi = s0.trainable_parameters
    out = []
    for key in MODEL_STATES:
        e = explain(s0, key)
        title = e.title.lower()
        out += [(p.label if title in p.label else f"{title}: {p.label}", p.value / psi)
                for p in e.parts if p.value > 0]
    return out


def _per_param_text(parts: list[tuple[str, float]]) -> str:
    return " + ".join(f"{b:g} ({html.escape(label)})" for label, b in parts)


def accounting_note(scenario: Scenario) -> str:
    """Which accounting the answers use, its bytes per parameter of model states without ZeRO part by part, what
    the other accounting counts and why they differ (HTML; the numbers are the cost model's parts)."""
    acc, other = scenario.assumptions.accounting, _other_accounting(scenario)
    mine, theirs = bytes_per_parameter(scenario), bytes_per_parameter(with_accounting(scenario, other))
    total, total_other = sum(b for _, b in mine), sum(b for _, b in theirs)
    lora = (" (with LoRA only the adapters train: the frozen base adds its weights alone)"
            if scenario.training.lora_rank else "")
    text = (f"<b>Accounting:</b> every number here is {ACCOUNTING_NAMES[acc]} (assumptions.accounting = "
            f"'{acc}'): {total:g} bytes of model states per trained parameter without ZeRO = "
            f"{_per_param_text(mine)}{lora}. "
            f"{ACCOUNTING_NAMES[other][0].upper() + ACCOUNTING_NAMES[other][1:]} counts {total_other:g}")
    extra = [(label, b) for label, b in mine if (label, b) not in theirs]
    if acc == "deepspeed" and total > total_other:
        text += (f": it leaves out {_per_param_text(extra)}, which DeepSpeed allocates: its bf16/fp16 optimizer "
                 "wrapper keeps fp32 copies of the gradients for the step (under ZeRO, the fp32 gradient partition "
                 "it hands to the optimizer), measured by a census of live tensors on DeepSpeed 0.19.8 "
                 f"(docs/validation.md). Answer with {total:g} bytes per parameter, not {total_other:g}.")
    elif acc == "paper" and total < total_other:
        text += (" (DeepSpeed also keeps fp32 copies of the gradients for the step). Answer with the paper's "
                 f"{total:g} bytes per parameter, not {total_other:g}.")
    else:
        text += "."
    return text


def _accounting_others(step: TutorialStep, answer: Callable[[Scenario], float]) -> list[tuple[float, str]]:
    """The answer under the other accounting (``answer`` of the step's scenario with the other accounting), when
    it differs: a reader who counts the other way is told so."""
    s = step.tutorial.scenario
    acc, other = s.assumptions.accounting, _other_accounting(s)
    mine = answer(s)
    theirs = answer(with_accounting(s, other))
    if abs(theirs - mine) <= max(0.01, 0.02 * abs(mine)):
        return []
    per = {a: sum(b for _, b in bytes_per_parameter(with_accounting(s, a))) for a in (acc, other)}
    return [(theirs, f"That is {ACCOUNTING_NAMES[other]} ({per[other]:g} bytes per parameter without ZeRO); the "
                     f"answer counts {ACCOUNTING_NAMES[acc]} ({per[acc]:g}), as every number on this page does.")]


def _formula(e: Explanation) -> str:
    return f"${e.latex}$"


# --------------------------------------------------------------------------------------------------------------
# Choosing a stage: the planner's rule, stated from its constants, and the rows it is applied to
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuleRow:
    """One row of the "Choosing a stage" table: a configuration the planner evaluated, with what its rule reads."""

    label: str
    fits: bool
    proven: bool
    """Fits with at least the model's error of its peak free (``StepPeak.risky`` is False)."""
    stage: int
    offloads: int
    """How many of the optimizer states and the parameters are offloaded (0, 1 or 2)."""
    param_offload: bool
    sp: int
    tp: int
    zeropp: bool
    peak_bytes: float
    free_bytes: float
    tokens_per_second: float
    recommended: bool = False


def rule_row(label: str, choice, est, scenario: Scenario, recommended: bool = False) -> RuleRow:
    """The :class:`RuleRow` of a planner choice (``zeroplanner.planner.Choice``) and its estimate."""
    peak = est.step_peak
    peak_bytes = float(peak.bytes) if peak is not None else float(est.per_gpu_bytes.total)
    free = float(peak.headroom_bytes) if peak is not None else float(est.gpu_memory_bytes) - peak_bytes
    return RuleRow(label=label, fits=bool(est.fits), proven=bool(peak is not None and not peak.risky),
                   stage=int(choice.stage),
                   offloads=int(choice.offload_optimizer != "none") + int(choice.offload_param != "none"),
                   param_offload=choice.offload_param != "none",
                   sp=int(choice.sequence_parallel_size),
                   tp=int(choice.autotp_size or scenario.cluster.tensor_parallel_size),
                   zeropp=bool(choice.zero_hpz_partition_size > 1 or choice.zero_quantized_weights),
                   peak_bytes=peak_bytes, free_bytes=free, tokens_per_second=float(est.tokens_per_second),
                   recommended=recommended)


@dataclass(frozen=True)
class Preference:
    """One preference of the planner among rows of equal speed: ``text`` (HTML), ``key`` (smaller is preferred)."""

    text: str
    key: Callable[[RuleRow], float]


_ROW_KEYS: dict[str, Callable[[RuleRow], float]] = {
    "offloads": lambda r: r.offloads, "sequence_parallel": lambda r: r.sp, "autotp": lambda r: r.tp,
    "stage3": lambda r: int(r.stage == 3), "zeropp": lambda r: int(r.zeropp), "headroom": lambda r: -r.free_bytes,
    "tokens_per_second": lambda r: -r.tokens_per_second,
}
"""Each tie-break of ``zeroplanner.planner.PREFERENCE_ORDER`` read from a table row (smaller is preferred)."""


def _preferences() -> tuple[Preference, ...]:
    from ..planner import PREFERENCE_ORDER, PREFERENCE_TEXT

    return tuple(Preference(PREFERENCE_TEXT[k], _ROW_KEYS[k]) for k in PREFERENCE_ORDER)


PREFERENCES: tuple[Preference, ...] = _preferences()
"""The planner's order of preference among candidates within the tolerance of the fastest, primary first: its
order and sentences are the planner's own (``zeroplanner.planner.PREFERENCE_ORDER``, the keys ``rank_candidates``
sorts on, and ``PREFERENCE_TEXT``), so the stated rule follows the ranking; tests/ui/test_tutorial.py also checks
it against ``rank_candidates`` on synthetic candidates and against ``plan()`` on scenarios."""


def _tolerance() -> float:
    from ..planner import DEFAULT_TOLERANCE

    return DEFAULT_TOLERANCE


def rule_candidates(rows: list[RuleRow]) -> tuple[list[RuleRow], bool]:
    """The rows the rule's speed comparison runs on (fits; proven fits only when there is one; parameter offload
    only when nothing fits without it) and whether they are proven fits."""
    kept = [r for r in rows if r.fits]
    proven = [r for r in kept if r.proven]
    if proven:
        kept = proven
    without = [r for r in kept if not r.param_offload]
    return (without or kept), bool(proven)


def rule_pick(rows: list[RuleRow], tolerance: float | None = None) -> RuleRow | None:
    """The row the stated rule (:func:`rule_html`) picks from ``rows``; None when nothing fits."""
    tolerance = _tolerance() if tolerance is None else tolerance
    kept, proven = rule_candidates(rows)
    if not kept:
        return None
    if not proven:
        return max(kept, key=lambda r: r.free_bytes)
    fastest = max(r.tokens_per_second for r in kept)
    equal = [r for r in kept if r.tokens_per_second >= (1.0 - tolerance) * fastest]
    return min(equal, key=lambda r: tuple(p.key(r) for p in PREFERENCES))


def rule_html(scenario: Scenario, tolerance: float | None = None) -> str:
    """The planner's rule in words, from its constants: the tolerance (``zeroplanner.planner.DEFAULT_TOLERANCE``),
    the model's error of the peak (``memory_error_fraction``), the scenario's margin and host buffer factor, and
    :data:`PREFERENCES` in order."""
    from ..costmodel.timeline import memory_error_fraction

    tolerance = _tolerance() if tolerance is None else tolerance
    a = scenario.assumptions
    err = memory_error_fraction(a.device)
    margin = f" less the {a.gpu_memory_margin_fraction:.0%} margin" if a.gpu_memory_margin_fraction else ""
    prefs = "".join(f"<li>{p.text}</li>" for p in PREFERENCES)
    return ("<div class='zp-rule'><b>The planner's rule</b>, applied to every candidate it evaluates (the table "
            "below shows the recommended one and the fastest of each other kind):<ol>"
            f"<li>Keep what fits: the step's peak within the GPU's memory{margin}, the offloaded states "
            f"&times;{a.host_buffer_factor:g} within host RAM, and NVMe.</li>"
            f"<li>A fit is <i>proven</i> when it leaves at least the model's error of its peak free ({err:.1%} of "
            "the peak): if any fit is proven, drop the others.</li>"
            "<li>Parameter offload only when nothing fits without it: if a row without it is left, drop the rows "
            "that offload parameters.</li>"
            "<li>If no proven fit is left, pick the one with the most GPU memory free. Otherwise:</li>"
            f"<li>Rows within {tolerance:.0%} of the fastest row left count as equally fast (the model's step-time "
            "error is of that order): drop the slower ones.</li>"
            "<li>Among the equally fast rows prefer, in this order (the first preference that tells two rows apart "
            f"decides):<ol type='a' class='zp-preferences'>{prefs}</ol></li></ol></div>")


def _plan(step: TutorialStep):
    """The planner's plan of the tutorial's scenario (computed once per scenario)."""
    from ..planner import plan

    t = step.tutorial
    if t._plan_cache is None or t._plan_cache[0] is not t.scenario:
        t._plan_cache = (t.scenario, plan(t.scenario))
    return t._plan_cache[1]


def _fastest_plan(step: TutorialStep):
    """The plan at tolerance 0 with every alternative: its choice is the fastest candidate the ranking keeps, its
    alternatives the fastest of every other (stage, offload, ZeRO++, AutoTP) group (computed once per scenario)."""
    from ..planner import plan

    t = step.tutorial
    if t._fastest_cache is None or t._fastest_cache[0] is not t.scenario:
        t._fastest_cache = (t.scenario, plan(t.scenario, tolerance=0.0, alternatives=1000, advice=False))
    return t._fastest_cache[1]


def plan_rows(step: TutorialStep) -> list[RuleRow]:
    """The rows of the "Choosing a stage" table: the recommended configuration, the fastest candidate the
    planner's ranking keeps of every (stage, offload, ZeRO++, AutoTP) group (so the fastest row is the fastest
    candidate it kept), and the chart variants that do not fit (the scenario's own checkpointing and micro-batch).
    Fitting rows fastest first, then the rest by peak."""
    p = _plan(step)
    base = step.tutorial.scenario
    rows: list[RuleRow] = []
    seen: set[str] = set()

    def add(choice, est, recommended=False):
        key = choice.model_dump_json()
        if key not in seen:
            seen.add(key)
            rows.append(rule_row(choice.label, choice, est, base, recommended))

    if p.fits and p.choice is not None:
        add(p.choice, p.estimate, True)
        f = _fastest_plan(step)
        if f.fits and f.choice is not None:
            add(f.choice, f.estimate)
            for alt in f.alternatives:
                add(alt.choice, alt.estimate)
        for v in p.variants:
            if not v.estimate.fits:
                add(v.choice, v.estimate)
    else:
        for v in p.variants:
            add(v.choice, v.estimate)
    fitting = sorted((r for r in rows if r.fits), key=lambda r: -r.tokens_per_second)
    return fitting + sorted((r for r in rows if not r.fits), key=lambda r: r.peak_bytes)


def _threshold(step: TutorialStep) -> float:
    """Tokens/s below which a row no longer counts as fast as the fastest row the rule compares."""
    kept, _ = rule_candidates(plan_rows(step))
    return (1.0 - _tolerance()) * max(r.tokens_per_second for r in kept)


def _choose_answer(step: TutorialStep) -> float:
    if _plan(step).fits:
        return _threshold(step)
    from ..costmodel.timeline import memory_error_fraction

    smallest = min(r.peak_bytes for r in plan_rows(step))
    return _gib(smallest * (1.0 + memory_error_fraction(step.scenario.assumptions.device)))


def _choose_question(step: TutorialStep) -> str:
    tol = _tolerance()
    if _plan(step).fits:
        return (f"Rows within {tol:.0%} of the fastest row the rule compares count as equally fast. Below how many "
                "tokens/s would a row no longer count as equally fast in this scenario?")
    return ("Nothing fits. How many GiB of memory per GPU would the row with the smallest peak need to be a "
            "proven fit (its peak plus the model's error of the peak, as the rule says)?")


def _choose_hint(step: TutorialStep) -> str:
    tol = _tolerance()
    if _plan(step).fits:
        return (f"(1 &minus; {tol:g}) &times; the tokens/s of the fastest row that fits (a proven fit, without "
                f"parameter offload when there is one): {tol:.0%} is the planner's tolerance "
                "(zeroplanner.planner.DEFAULT_TOLERANCE).")
    return "Peak &times; (1 + the error fraction in rule 2), with the smallest peak in the table."


def _logit_bytes(est) -> float | None:
    """The logits' bytes in the loss backward of ``est``'s step timeline (None without one)."""
    peak = est.step_peak
    point = _point(peak.timeline, "loss backward") if peak is not None and peak.timeline else None
    return float(point.bytes.get("logits", 0)) if point is not None else None


def _twice_b(step: TutorialStep) -> Scenario:
    """The step's scenario at twice the micro-batch (raises ValueError past the input's limit)."""
    return with_micro_batch(step.scenario, 2 * step.scenario.training.micro_batch)


def _peak_question(step: TutorialStep) -> str:
    b = step.scenario.training.micro_batch
    return (f"With twice the micro-batch (b = {_twice_b(step).training.micro_batch} instead of {b}), how many GiB "
            "would the logits' fp32 gradients take in the loss backward?")


def _peak_answer(step: TutorialStep) -> float:
    return _gib(_logit_bytes(_estimate(step, _twice_b(step))) or 0.0)


def _states_gib(s: Scenario) -> float:
    return _gib(model_state_bytes(s))


_SPECS: dict[str, _StepSpec] = {
    "dp": _StepSpec(
        intro="Plain data parallelism (DeepSpeed stage 0) copies the whole model to every GPU: each GPU keeps all "
              "parameters, all gradients and all optimizer states, and the GPUs all-reduce the gradients every "
              "step. Adding GPUs adds throughput, not memory.",
        terms=MODEL_STATES,
        scenario=_dp_scenario,
        question=lambda s: (f"How many GiB of model states (parameters + gradients + optimizer states) would each "
                            f"GPU hold with plain data parallelism {_twice_nd(s)}?"),
        answer=lambda s: _states_gib(with_zero(_doubled(s), 0)),
        hint=lambda s: ("Add the three terms above; plain data parallelism divides none of them by "
                        "N<sub>d</sub>. " + accounting_note(s.scenario)),
        others=lambda s: _accounting_others(s, lambda sc: _states_gib(with_zero(sc, 0))),
    ),
    "zero1": _StepSpec(
        intro="ZeRO-1 (P<sub>os</sub>) splits the optimizer states, the largest part of the model states for Adam "
              "(fp32 master weights + momentum + variance = 12 bytes per parameter), into N<sub>d</sub> partitions: "
              "each GPU updates only its 1/N<sub>d</sub> of the parameters.",
        terms=("optimizer_states", "gradients"),
        scenario=_stage(1),
        question=lambda s: f"How many GiB of optimizer states would each GPU hold with ZeRO-1 {_twice_nd(s)}?",
        answer=lambda s: _gib(explain(with_zero(_doubled(s), 1), "optimizer_states").value),
        hint=lambda s: (f"The formula above, {_formula(s.explanations[0])}, with N<sub>d</sub> = "
                        f"{_doubled(s).cluster.data_parallel_degree}. " + accounting_note(s.scenario)),
        others=lambda s: _accounting_others(
            s, lambda sc: _gib(explain(with_zero(with_nodes(sc, 2 * sc.cluster.nodes), 1), "optimizer_states").value)),
    ),
    "zero2": _StepSpec(
        intro="ZeRO-2 (P<sub>os+g</sub>) also partitions the gradients: each gradient bucket is reduced to the GPU "
              "that owns it and the others free it. DeepSpeed keeps a 16-bit and an fp32 gradient partition.",
        terms=("gradients", "optimizer_states"),
        scenario=_stage(2),
        question=lambda s: "How many GiB of model states per GPU does ZeRO-2 save compared with ZeRO-1 in this "
                           "scenario? (Compare with step 2's numbers.)",
        answer=lambda s: _states_gib(with_zero(s.tutorial.scenario, 1)) - _states_gib(s.scenario),
        hint=lambda s: (f"Only the gradients differ (the parameters are whole and the optimizer states split "
                        f"N<sub>d</sub> ways at both stages): ZeRO-1 "
                        f"{_formula(explain(with_zero(s.tutorial.scenario, 1), 'gradients'))} (step 2), ZeRO-2 "
                        f"{_formula(s.explanations[0])} (above). " + accounting_note(s.scenario)),
        others=lambda s: _accounting_others(
            s, lambda sc: _states_gib(with_zero(sc, 1)) - _states_gib(with_zero(sc, 2))),
    ),
    "zero3": _StepSpec(
        intro="ZeRO-3 (P<sub>os+g+p</sub>) partitions the parameters too: each layer's parameters are gathered "
              "just before they are used (forward and again in backward) and released afterwards. The price: a "
              "working set of gathered parameters (buffers) and 3&Psi; instead of 2&Psi; of communication.",
        terms=("parameters", "buffers"),
        scenario=_stage(3),
        question=lambda s: (f"How many GiB of model states (parameters + gradients + optimizer states) would each "
                            f"GPU hold with ZeRO-3 {_twice_nd(s)}?"),
        answer=lambda s: _states_gib(with_zero(_doubled(s), 3)),
        hint=lambda s: ("ZeRO-3 divides all three by N<sub>d</sub>: the parameters above "
                        f"({_formula(s.explanations[0])}), and the gradients and optimizer states as in steps 2 and "
                        f"3, each with N<sub>d</sub> = {_doubled(s).cluster.data_parallel_degree}. "
                        + accounting_note(s.scenario)),
        others=lambda s: _accounting_others(
            s, lambda sc: _states_gib(with_zero(with_nodes(sc, 2 * sc.cluster.nodes), 3))),
    ),
    "offload": _StepSpec(
        intro="ZeRO-Offload moves the optimizer states (and with ZeRO-3 optionally the parameters) to host RAM; "
              "the optimizer step runs on the CPU (DeepSpeed CPU-Adam). GPU memory falls, host RAM per node rises, "
              "and PCIe traffic and CPU time are added to the step.",
        terms=("optimizer_states", "host_memory", "offload", "optimizer"),
        scenario=_offload_scenario,
        question=lambda s: ("How many GiB of host RAM must each node have for the planner to accept this offload "
                            "(the offloaded states of all its GPUs, with the planner's headroom)?"),
        answer=lambda s: _gib(_estimate(s).host_required_bytes),
        hint=lambda s: (f"The host RAM above &times; {s.scenario.assumptions.host_buffer_factor:g}, DeepSpeed's "
                        "additional_buffer_factor, which the planner requires. " + accounting_note(s.scenario)),
        others=lambda s: _accounting_others(
            s, lambda sc: _gib(_estimate(s, with_zero(sc, *s.knobs["variant"].value)).host_required_bytes)),
    ),
    "comm": _StepSpec(
        intro="Every step the GPUs exchange gradients (and with ZeRO-3 parameters). Ring collectives send "
              "(N<sub>d</sub>-1)/N<sub>d</sub> of the data per GPU per reduce-scatter or all-gather; an all-reduce "
              "is both. The time depends on the slowest link: NVLink inside a node, the network between nodes. "
              "Change the network above and watch the exposed time.",
        terms=("communication_volume", "communication"),
        scenario=_comm_scenario,
        question=lambda s: f"How many GiB would each GPU send per optimizer step with this stage {_twice_nd(s)}?",
        answer=lambda s: _gib(explain(_doubled(s), "communication_volume").value),
        hint=lambda s: (f"The formula above, {_formula(s.explanations[0])}, with N<sub>d</sub> = "
                        f"{_doubled(s).cluster.data_parallel_degree}: the messages (S, all the step's micro-steps "
                        "together) do not depend on N<sub>d</sub>, only the share (N<sub>d</sub>-1)/N<sub>d</sub> "
                        "each GPU sends does."),
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
        question=_peak_question,
        answer=_peak_answer,
        hint=lambda s: ("12 bytes per logit (fp32: the log-softmax output, its incoming gradient and the gradient "
                        "it produces) &times; b&middot;s&middot;V logits, as in the loss backward's line above, "
                        "with b doubled."),
    ),
    "choose": _StepSpec(
        intro="The planner evaluates every stage, offload choice, checkpointing mode and micro-batch (and, where "
              "they apply, ZeRO++, Ulysses and AutoTP degrees), then picks one by the rule below: the rule its "
              "ranking code applies, in the same order, with its own tolerance. Try a bigger model or fewer GPUs "
              "above and see the choice move. Before the stage it says what an experienced engineer says first: "
              "which defaults it assumed, whether fewer nodes would be faster (try 2 nodes on eth-1g: one node is "
              "an order of magnitude faster) and whether a cheaper method (LoRA, QLoRA) avoids offload.",
        terms=("step",),
        scenario=lambda s: _plan(s).scenario if _plan(s).fits else s.tutorial.scenario,
        question=_choose_question,
        answer=_choose_answer,
        hint=_choose_hint,
        unit=lambda s: "tokens/s" if _plan(s).fits else "GiB",
        rel_tol=lambda s: 0.005 if _plan(s).fits else 0.02,
    ),
}


def _summary(step: TutorialStep) -> str:
    s = step.scenario
    if step.key == "dp":  # no total here: with plain DP it is also the exercise's answer at any N_d
        return (f"<div class='zp-muted'>GPU memory: {fmt_bytes_text(s.cluster.memory_per_gpu_bytes)} per GPU "
                f"(N<sub>d</sub> = {s.cluster.data_parallel_degree}). Add the three terms: do the model states "
                "alone fit?</div>")
    if step.key in ("zero1", "zero2", "zero3"):
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


def _fit_text(r: RuleRow) -> str:
    if not r.fits:
        return "does not fit"
    return "fits" if r.proven else "fits, not proven"


def _plan_table(step: TutorialStep) -> str:
    """The planner's rule (:func:`rule_html`) and the rows it is applied to (:func:`plan_rows`), the recommended
    row marked; then the defaults the plan assumed and its advice."""
    p = _plan(step)
    s = step.tutorial.scenario
    rows = plan_rows(step)
    body = []
    for r in rows:
        attrs = " class='zp-plan-row zp-recommended' style='font-weight:bold'" if r.recommended else \
            " class='zp-plan-row'"
        body.append(f"<tr{attrs}><td>{'&#9733; recommended' if r.recommended else ''}</td>"
                    f"<td>{html.escape(r.label)}</td><td>{_fit_text(r)}</td><td>{fmt_bytes_text(r.peak_bytes)}</td>"
                    f"<td>{fmt_bytes_text(r.free_bytes) if r.fits else '&mdash;'}</td>"
                    f"<td>{r.tokens_per_second:,.0f}</td></tr>")
    head = ("<b>Recommended: " + html.escape(p.choice.label) + "</b>") if p.fits and p.choice else \
        "<b>Nothing fits this cluster.</b>"
    # what an experienced engineer says before the stage: the defaults assumed, fewer nodes, a cheaper method
    head += "".join(f"<div class='zp-assume'>{html.escape(sentence(a))}</div>" for a in p.assumptions)
    head += "".join(f"<div class='zp-advice'><b>Advice:</b> {html.escape(a)}</div>" for a in p.advice)
    return (f"<div>{head}</div>{rule_html(s)}"
            f"<div class='zp-muted'>GPU memory {fmt_bytes_text(s.cluster.memory_per_gpu_bytes)} per GPU, host RAM "
            f"{fmt_bytes_text(s.cluster.cpu_memory_bytes)} per node. Free: GPU memory less the step's peak.</div>"
            "<table class='zp-plan-rows'><tr><th></th><th>configuration</th><th>fit</th><th>peak per GPU</th>"
            f"<th>free per GPU</th><th>tokens/s</th></tr>{''.join(body)}</table>")


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
            # a link is applied as far as it can be, as on the planner page (zeroplanner.share.read_link): an
            # unknown key or a bad value is left out and named, so one typo in a workshop link does not put a
            # participant on a different scenario than the planner page shows
            from ..share import ShareError, link_from_environment

            try:
                link = link_from_environment()
            except ShareError as exc:  # refused as a whole (too long, malformed)
                self.message.value = (f"<div class='zp-no'>The link's scenario was not used: "
                                      f"{html.escape(str(exc))}</div>")
            else:
                if link is not None:
                    scenario = link.scenario
                    if link.note:
                        self.message.value = f"<div class='zp-no'>{html.escape(link.note)}</div>"
        self.scenario = scenario or build_scenario()
        self._steps: dict[str, TutorialStep] = {}
        self._quiet = False
        self._plan_cache: tuple[Scenario, Any] | None = None
        self._fastest_cache: tuple[Scenario, Any] | None = None
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
