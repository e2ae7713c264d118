"""The planner app's state and the pure functions that derive everything it shows.

One typed, frozen :class:`AppState` holds the :class:`~zeroplanner.specs.Scenario` plus the UI's own choices
(which catalog entries are selected, which variant the config preview shows). A control change is applied by
:func:`apply_changes`, which returns a *new* validated state (``ValidationError`` / ``ValueError`` / ``KeyError``
for invalid input; the app shows :func:`error_message` of it). Everything on screen is :func:`derive`-d from the
state by pure functions: the plan (``zeroplanner.planner.plan``), chart arrays in GiB / seconds / tokens/s, the
recommendation text and the DeepSpeed config text. Nothing here imports ipywidgets or bqplot, so these functions
are tested directly.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from .. import catalog
from ..advice import sentence
from ..costmodel import Estimate
from ..costmodel.terms import MEMORY_SEGMENTS, TIME_SEGMENTS, segment_value
from ..inputs import BY_KEY, INPUTS, Input, input_for_error, set_path
from ..report import TIMELINE_SERIES
from ..specs import Scenario
from ..units import GIB

if TYPE_CHECKING:
    from ..planner import Plan

CUSTOM_MODEL = "(custom size)"
"""Model dropdown entry meaning "a Llama-shaped model of the slider's size" (Architecture.from_parameter_count)."""
RECOMMENDED = "Recommended"
"""Config-preview entry meaning "the planner's choice"."""

MEMORY_TERMS: tuple[tuple[str, str], ...] = tuple((s.key, s.label) for s in MEMORY_SEGMENTS)
"""Keys of ``Estimate.per_gpu_bytes`` stacked in the memory chart, bottom to top, with their on-screen names
(from the cost model's term registry, ``costmodel.terms.MEMORY_SEGMENTS``)."""

TIME_PARTS: tuple[tuple[str, str], ...] = tuple((s.key, s.label) for s in TIME_SEGMENTS)
"""Segments of the step-time chart, bottom to top (``costmodel.terms.TIME_SEGMENTS``)."""

TIMELINE_PARTS: tuple[tuple[str, str], ...] = tuple((key, label) for key, label, _ in TIMELINE_SERIES)
"""Terms of the "Memory over one step" chart (keys of ``TimelinePoint.bytes``), bottom to top, with their names
(``zeroplanner.report.TIMELINE_SERIES``, which the report's timeline uses too)."""

PHASE_TICKS: dict[str, str] = {"forward": "forward", "loss forward": "loss", "loss backward": "loss",
                               "backward": "backward", "optimizer step": "optimizer step"}
"""Tick text of each phase of the step (``costmodel.timeline.PHASES``) under the timeline chart: one tick per run of
points with the same text, so the two one-point loss phases share one ("loss"); their full names are in the bars'
tooltips and in the peak label."""

SCALING_NODES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
"""Node counts of the scaling chart. Fixed (the current node count is a vertical line, not an extra point), so a
node-count change redraws only the lines whose configuration changed."""

ConfigMode = Literal["deepspeed", "hf_trainer"]


class AppState(BaseModel):
    """Everything the app's output depends on. Frozen: a change makes a new state (:func:`apply_changes`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: Scenario
    model_name: str = CUSTOM_MODEL
    gpu_name: str
    network_name: str
    config_variant: str = RECOMMENDED
    config_mode: ConfigMode = "deepspeed"

    @property
    def zeropp(self) -> bool:
        """Whether the scenario sets any ZeRO++ option (the app then adds a "ZeRO-3 + ZeRO++" chart variant)."""
        z = self.scenario.zero
        return z.zero_hpz_partition_size > 1 or z.zero_quantized_weights or z.zero_quantized_gradients


def default_state() -> AppState:
    """The app's opening state: ``zeroplanner.scenarios.default_scenario()`` (a 7B model on one node of 8
    A100-80GB), with the catalog entries it came from selected."""
    from ..scenarios import default_scenario

    scenario = default_scenario()
    return state_from_scenario(scenario)


def _catalog_match(names: list[str], wanted: str) -> str | None:
    low = {n.lower(): n for n in names}
    return low.get(wanted.lower())


def state_from_scenario(scenario: Scenario, **ui: Any) -> AppState:
    """Wrap a scenario, selecting the catalog entries whose names match its model, GPU and network."""
    model_name = _catalog_match(catalog.model_names(), scenario.model.name) or CUSTOM_MODEL
    gpu_name = _catalog_match(catalog.gpu_names(), scenario.cluster.gpu.name) or scenario.cluster.gpu.name
    net_name = (_catalog_match(catalog.network_names(), scenario.cluster.network.name)
                or _catalog_match(catalog.network_names(), scenario.cluster.network.name.split(" at ")[0])
                or catalog.network_names()[0])
    return AppState(scenario=scenario, model_name=model_name, gpu_name=gpu_name, network_name=net_name, **ui)


# --------------------------------------------------------------------------------------------------------------
# Changes
# --------------------------------------------------------------------------------------------------------------
def _ui(key: str):
    def setter(data: dict, ui: dict, value: Any) -> None:
        ui[key] = value

    return setter


_UI_NAMES = {"model": "model_name", "gpu": "gpu_name", "network": "network_name"}


def _input_setter(inp: Input):
    """How the control of ``inp`` changes the state: the table's own ``apply`` (the same code the CLI and links
    go through), plus the catalog selection shown in the dropdowns, plus what the input needs in the app, which
    has no stage control (ZeRO++ -> stage 3).

    A text value (a box or a menu sends text, ``app.set(model="Qwen/Qwen3-8B", micro_batch="4")``) is read by
    the input's one grammar, :meth:`zeroplanner.inputs.Input.parse`, in the input's unit (``"7B"`` for the size),
    as the CLI and share links read it: a catalog name or hub id, ``7B``, ``1e9``. A menu's own entries (the
    ``overlap_comm`` menu's "default") and numbers from sliders and number boxes are in widget units."""
    ui_name = _UI_NAMES.get(inp.key)
    widget_words = {shown for shown, _ in inp.widget.values} if inp.widget is not None else set()

    def setter(data: dict, ui: dict, value: Any) -> None:
        if inp.key == "model" and value == CUSTOM_MODEL:
            ui["model_name"] = CUSTOM_MODEL
            return
        if isinstance(value, str) and value not in widget_words:
            value = inp.parse(value)  # InputError (a ValueError) names the input and the allowed values
        else:
            value = inp.from_widget(value)
        inp.apply(data, value)
        if inp.key == "params":
            ui["model_name"] = CUSTOM_MODEL
        if ui_name is not None:
            ui[ui_name] = value
        if value != inp.default:
            for path, implied in inp.app_implies:
                set_path(data, path, implied)

    return setter


SETTERS = {
    **{inp.control_key: _input_setter(inp) for inp in INPUTS if inp.control_key},
    # UI-only choices
    "config_variant": _ui("config_variant"),
    "config_mode": _ui("config_mode"),
}
"""Control key -> how its value changes the state: one per input of :data:`zeroplanner.inputs.INPUTS` that has a
widget (keys as :mod:`zeroplanner.ui.controls` uses them), and the config preview's choices."""


def apply_changes(state: AppState, changes: Mapping[str, Any]) -> AppState:
    """A new state with ``changes`` (control key -> value) applied in order and validated once.

    Raises ``KeyError`` for an unknown control key or catalog name, ``pydantic.ValidationError`` or ``ValueError``
    for values the specs reject (the message names the field and the allowed range).
    """
    data = state.scenario.model_dump()
    ui = state.model_dump(exclude={"scenario"})
    for key, value in changes.items():
        if key not in SETTERS:
            raise KeyError(f"unknown control {key!r}")
        SETTERS[key](data, ui, value)
    scenario = Scenario.model_validate(data)
    return AppState(scenario=scenario, **ui)


_RANGE_ERRORS = ("greater_than_equal", "greater_than", "less_than_equal", "less_than")


def error_message(exc: BaseException) -> str:
    """One or a few plain lines for an invalid input, naming the field (no traceback)."""
    if isinstance(exc, ValidationError):
        lines = []
        for err in exc.errors()[:4]:
            loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
            msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
            key = input_for_error(tuple(err.get("loc", ())), msg) if err.get("type") in _RANGE_ERRORS else None
            if key is not None and key in BY_KEY and BY_KEY[key].low is not None:
                inp = BY_KEY[key]  # the range in the control's unit (GiB, not bytes)
                got = err.get("input")
                got = got / inp.scale if isinstance(got, (int, float)) and inp.scale != 1 else got
                msg = f"{inp.label} must be in {inp.range_text} (got {got!r})"
            lines.append(f"{loc}: {msg}" if loc else msg)
        return "; ".join(lines)
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__


# --------------------------------------------------------------------------------------------------------------
# Derived view
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryView:
    """Per-GPU memory per variant. ``gib[t, v]`` is term ``t`` of :data:`MEMORY_TERMS` for variant ``v``, GiB."""

    labels: tuple[str, ...]
    gib: np.ndarray
    total_gib: np.ndarray
    capacity_gib: float
    usable_gib: float
    fits_gpu: tuple[bool, ...]
    fits: tuple[bool, ...]
    host_gib: np.ndarray
    host_capacity_gib: float
    fits_cpu: tuple[bool, ...]
    estimates: tuple[Estimate, ...] = field(default=(), repr=False, compare=False)
    """The cost-model ``Estimate`` of each variant (what :attr:`term_formulas` is read from)."""

    @cached_property
    def term_formulas(self) -> tuple[tuple[str, ...], ...]:
        """``term_formulas[t][v]``: names and formulas of the cost-model terms summed into segment (t, v).
        Built when first read (a bar's tooltip), not per change: it was 8% of a node-slider change (cProfile)."""
        formulas = [[""] * len(self.estimates) for _ in MEMORY_TERMS]
        for v, est in enumerate(self.estimates):
            terms = _term_text(est)
            for t, (key, _) in enumerate(MEMORY_TERMS):
                formulas[t][v] = "<br>".join(terms.get(key, []))
        return tuple(tuple(row) for row in formulas)


@dataclass(frozen=True)
class TimeView:
    """Step time per variant, seconds: ``seconds[p, v]`` is part ``p`` of :data:`TIME_PARTS`."""

    labels: tuple[str, ...]
    seconds: np.ndarray
    step_seconds: np.ndarray
    tokens_per_second: np.ndarray
    fits: tuple[bool, ...]


@dataclass(frozen=True)
class ScalingView:
    """Tokens/s against node count, one row per variant (NaN where the variant does not fit)."""

    labels: tuple[str, ...]
    nodes: np.ndarray
    tokens_per_second: np.ndarray
    current_nodes: int


@dataclass(frozen=True)
class StepView:
    """Memory per GPU over one training step of one variant (``Estimate.step_peak``), GiB.

    ``gib[t, p]`` is term ``t`` of :data:`TIMELINE_PARTS` at timeline point ``p`` (step order); ``total_gib[p]``
    their sum. ``peak_index`` is the peak point, ``peak_gib`` / ``peak_phase`` the model's peak (GiB, phase name),
    ``headroom_gib`` what it leaves of ``capacity_gib`` (the GPU's memory, GiB; negative: does not fit) and
    ``headroom_fraction`` that as a fraction of the GPU's memory. ``verdict`` is ``StepPeak.verdict()``.
    ``ticks``: (x position in point indices, text) per phase group (:data:`PHASE_TICKS`); ``boundaries``: x positions
    between phase groups."""

    variant: str
    labels: tuple[str, ...]
    phases: tuple[str, ...]
    gib: np.ndarray
    total_gib: np.ndarray
    capacity_gib: float
    peak_index: int
    peak_gib: float
    peak_phase: str
    headroom_gib: float
    headroom_fraction: float
    risky: bool
    verdict: str
    ticks: tuple[tuple[float, str], ...]
    boundaries: tuple[float, ...]

    @property
    def fits(self) -> bool:
        """Whether the step's peak is within the GPU's memory."""
        return self.headroom_gib >= 0

    @property
    def peak_label(self) -> str:
        """The peak marker's text, e.g. "peak 55.0 GiB in backward" (GiB per GPU); "" without a timeline."""
        return f"peak {self.peak_gib:.1f} GiB in {self.peak_phase}" if self.labels else ""


def _estimate_of(plan: AnyPlan, variant: str) -> tuple[str, Estimate]:
    """(label, estimate) of ``variant``: the recommendation (the scenario as requested when nothing fits) or a named
    chart variant; an unknown name falls back to the recommendation."""
    if variant != RECOMMENDED:
        for label, _, est in _variants(plan):
            if label == variant:
                return label, est
    if plan.fits:
        return RECOMMENDED, plan.estimate
    return "your settings (nothing fits)", plan.estimate


def step_view(plan: AnyPlan, variant: str = RECOMMENDED) -> StepView:
    """Timeline data for the "Memory over one step" chart of ``variant`` (the config preview's choice), from its
    estimate's ``step_peak``: bytes by term per point in GiB, the peak point, the headroom line. An estimate
    without a step timeline gives an empty view (no points)."""
    label, est = _estimate_of(plan, variant)
    peak = est.step_peak
    points = list(peak.timeline) if peak is not None else []
    n = len(points)
    gib = np.zeros((len(TIMELINE_PARTS), n))
    for p, point in enumerate(points):
        for t, (key, _) in enumerate(TIMELINE_PARTS):
            gib[t, p] = float(point.bytes.get(key, 0) or 0) / GIB
    total = gib.sum(axis=0)
    phases = tuple(pt.phase for pt in points)
    phase = peak.phase if peak is not None else ""
    in_phase = [i for i in range(n) if phases[i] == phase] or list(range(n))
    at = max(in_phase, key=lambda i: (total[i], -i)) if n else -1
    ticks, boundaries = [], []
    start = 0
    for i in range(1, n + 1):
        if i == n or PHASE_TICKS.get(phases[i], phases[i]) != PHASE_TICKS.get(phases[start], phases[start]):
            ticks.append(((start + i - 1) / 2.0, PHASE_TICKS.get(phases[start], phases[start])))
            if i < n:
                boundaries.append(i - 0.5)
            start = i
    capacity = float((peak.gpu_memory_bytes if peak is not None else 0) or est.gpu_memory_bytes) / GIB
    return StepView(
        variant=label,
        labels=tuple(pt.label for pt in points),
        phases=phases,
        gib=gib,
        total_gib=total,
        capacity_gib=capacity,
        peak_index=int(at),
        peak_gib=float(peak.bytes) / GIB if peak is not None else 0.0,
        peak_phase=phase,
        headroom_gib=float(peak.headroom_bytes) / GIB if peak is not None else 0.0,
        headroom_fraction=float(peak.headroom_fraction) if peak is not None else 0.0,
        risky=peak.risky if peak is not None else False,
        verdict=peak.verdict() if peak is not None else "",
        ticks=tuple(ticks),
        boundaries=tuple(boundaries),
    )


def step_peak_html(estimate: Estimate, prefix: str = "Over one step") -> str:
    """The headroom line under the verdict: ``StepPeak.verdict()`` of ``estimate`` (peak GiB per GPU, its phase, the
    headroom in GiB and %), amber when the headroom is below the model's error ("risky"), red when the peak exceeds
    the GPU's memory. "" when the estimate has no step timeline."""
    peak = estimate.step_peak
    if peak is None:
        return ""
    kind = " zp-peak-over" if peak.headroom_bytes < 0 else " zp-peak-risky" if peak.risky else ""
    return (f"<div class='zp-step-peak{kind}'><b>{html.escape(prefix)}:</b> {html.escape(peak.verdict())}."
            "</div>")


@dataclass(frozen=True)
class View:
    """Everything the app draws, derived from one :class:`AppState`."""

    state: AppState
    plan: AnyPlan
    memory: MemoryView
    banner_html: str
    variant_options: tuple[str, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)
    variant_scenarios: tuple = ()
    """Scenario of each chart bar, in :attr:`MemoryView.labels` order."""

    # What a change does not need before its chart and verdict are sent is computed when first read: the app
    # reads the config preview in its follow-up (after the chart's messages have left the kernel) and the step-time
    # view only while that tab is open. Profiled on the default scenario (180 node-slider derives, cProfile), the
    # preview's json.dumps(indent=2) alone was about a tenth of derive's time (the indented encoder is pure Python).

    @cached_property
    def time(self) -> TimeView:
        """Step time by part of every variant (:func:`time_view`), computed the first time it is read."""
        return time_view(self.plan)

    @cached_property
    def step(self) -> StepView:
        """Memory over one step of the config preview's variant (:func:`step_view`), computed the first time it is
        read (only the "Memory over one step" tab draws it)."""
        return step_view(self.plan, self.state.config_variant)

    @cached_property
    def _config(self) -> tuple[str, str, str | None]:
        variant = self.state.config_variant if self.state.config_variant in self.variant_options else RECOMMENDED
        return config_text(self.plan, variant, self.state.config_mode)

    @property
    def config_text(self) -> str:
        """The config preview's text: the selected variant's DeepSpeed config (:func:`config_text`), computed the
        first time it is read; "" when there is none (see :attr:`config_error`)."""
        return self._config[0]

    @property
    def config_filename(self) -> str:
        """File name for the preview's download (``ds_config.json`` or ``ds_config_hf_trainer.json``)."""
        return self._config[1]

    @property
    def config_error(self) -> str | None:
        """Why there is no config text (None when there is one)."""
        return self._config[2]

    @cached_property
    def scaling(self) -> ScalingView:
        """Tokens/s of every variant against node count (:func:`scaling_view`), computed the first time it is read:
        only the scaling chart reads it, and the app draws that chart only while its tab is open. Profiled on
        the default scenario (30 node-slider changes, cProfile), it was about a quarter of :func:`derive`'s time
        per change (one vectorised evaluation of the recommended variant's row), spent for a chart nobody saw."""
        return scaling_view(self.plan, self.state.scenario)


def _variants(plan: AnyPlan) -> list[tuple[str, Scenario, Estimate]]:
    """(label, scenario, estimate) of every chart bar: the planner's recommendation first (when something fits;
    it may differ from every fixed variant in micro-batch, checkpointing or ZeRO++), then ``Plan.variants``, then
    the app's extra variants."""
    out = []
    if plan.fits and plan.choice is not None:
        out.append((RECOMMENDED, plan.scenario, plan.estimate))
    for v in plan.variants:
        out.append((v.label, v.scenario, v.estimate))
    for label, scenario, estimate in (plan.extra_variants if isinstance(plan, PlanWithExtras) else ()):
        out.append((str(label), scenario, estimate))
    return out


def zeropp_label(state: AppState) -> str:
    """Chart label of the ZeRO++ variant, e.g. 'ZeRO-3 + ZeRO++ (hpZ 8, qwZ, qgZ)' (the planner's words,
    :func:`zeroplanner.planner.zeropp_parts`)."""
    from ..planner import zeropp_parts

    z = state.scenario.zero
    parts = zeropp_parts(z.zero_hpz_partition_size, z.zero_quantized_weights, z.zero_quantized_gradients)
    return f"ZeRO-3 + ZeRO++ ({parts})"


def zeropp_scenario(state: AppState) -> Scenario:
    """The state's scenario at ZeRO-3 without offload, with its ZeRO++ settings (validated: raises
    ``ValidationError`` naming the field)."""
    data = state.scenario.model_dump()
    data["zero"]["stage"] = 3
    for block in ("offload_optimizer", "offload_param"):
        data["zero"][block]["device"] = "none"
    return Scenario.model_validate(data)


@dataclass(frozen=True)
class PlanWithExtras:
    """A planner Plan plus the app's extra chart variants (``extra_variants``: label, scenario, estimate). Reads
    the plan's fields as the plan's own (``fits``, ``estimate``, ...): the app's views take either."""

    plan: Plan
    extra_variants: tuple[tuple[str, Scenario, Estimate], ...] = ()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)


AnyPlan = Union["Plan", PlanWithExtras]
"""What the views read: a planner :class:`~zeroplanner.planner.Plan`, or one with the app's extra variants."""


def _term_text(estimate: Estimate) -> dict[str, list[str]]:
    """Category -> "name: formula" lines from ``Estimate.terms``."""
    by_cat: dict[str, list[str]] = {}
    for term in estimate.terms:
        line = f"{term.name} = {term.formula} = {term.bytes / GIB:.2f} GiB" if term.formula else term.name
        by_cat.setdefault(term.category, []).append(line)
    return by_cat


def memory_view(plan: AnyPlan) -> MemoryView:
    """Stacked-bar data for the per-GPU memory chart (GiB) and host RAM per node (GiB) of every variant."""
    variants = _variants(plan)
    n = len(variants)
    gib = np.zeros((len(MEMORY_TERMS), n))
    host = np.zeros(n)
    fits_gpu, fits_cpu, fits = [], [], []
    capacity = usable = host_cap = 0.0
    for v, (_, scenario, est) in enumerate(variants):
        for t, seg in enumerate(MEMORY_SEGMENTS):  # each segment's terms, where the registry says they live
            gib[t, v] = segment_value(est, seg) / GIB
        # what the verdict compares with the node's RAM: held bytes x host_buffer_factor (Estimate.summary)
        host[v] = float(est.host_required_bytes or est.per_node_cpu_bytes) / GIB
        fits_gpu.append(est.fits_gpu)
        fits_cpu.append(est.fits_cpu)
        fits.append(est.fits)
        capacity = scenario.cluster.memory_per_gpu_bytes / GIB
        usable = capacity * (1.0 - scenario.assumptions.gpu_memory_margin_fraction)
        host_cap = scenario.cluster.cpu_memory_bytes / GIB
    total = gib.sum(axis=0)
    return MemoryView(
        labels=tuple(label for label, _, _ in variants),
        gib=gib,
        total_gib=total,
        capacity_gib=capacity,
        usable_gib=usable,
        fits_gpu=tuple(fits_gpu),
        fits=tuple(fits),
        host_gib=host,
        host_capacity_gib=host_cap,
        fits_cpu=tuple(fits_cpu),
        estimates=tuple(est for _, _, est in variants),
    )


def time_view(plan: AnyPlan) -> TimeView:
    """Stacked-bar data for the step-time chart (seconds) and tokens/s of every variant."""
    variants = _variants(plan)
    n = len(variants)
    seconds = np.zeros((len(TIME_PARTS), n))
    step = np.zeros(n)
    tps = np.zeros(n)
    fits = []
    for v, (_, _, est) in enumerate(variants):
        for t, seg in enumerate(TIME_SEGMENTS):  # "offload" stacks the offload time and the optimizer step
            seconds[t, v] = segment_value(est, seg)
        step[v] = est.step_seconds
        tps[v] = est.tokens_per_second
        fits.append(est.fits)
    return TimeView(
        labels=tuple(label for label, _, _ in variants),
        seconds=seconds,
        step_seconds=step,
        tokens_per_second=tps,
        fits=tuple(fits),
    )


def scaling_nodes(current: int) -> np.ndarray:
    """Node counts for the scaling chart: :data:`SCALING_NODES`, extended by powers of two up to the current
    count when it is larger."""
    nodes = list(SCALING_NODES)
    while nodes[-1] < current:
        nodes.append(nodes[-1] * 2)
    return np.array(nodes, dtype=float)


def _scaling_row(scenario: Scenario, nodes: np.ndarray) -> dict[str, Any]:
    """Tokens/s and fit of one scenario's configuration at each node count (vectorised cost-model call)."""
    from ..costmodel import Candidates, evaluate, make_context

    base = Candidates.from_scenario(scenario)
    arrays = {name: getattr(base, name) for name in base.__dataclass_fields__}
    arrays["nodes"] = nodes.astype(np.int64)
    out = evaluate(make_context(scenario), Candidates.build(**arrays))
    return {"tokens_per_second": out.tokens_per_second, "fits": out.fits}


@lru_cache(maxsize=64)
def _scaling_table(scenario_one_node: Scenario, nodes: tuple[int, ...]) -> dict[str, dict[str, list]]:
    from ..planner import scaling

    return scaling(scenario_one_node, nodes=list(nodes))


def scaling_view(plan: AnyPlan, scenario: Scenario) -> ScalingView:
    """Tokens/s of each chart variant at each node count (NaN where it does not fit), per GPU batch fixed, from
    ``zeroplanner.planner.scaling`` (one vectorised evaluation). The table does not depend on the scenario's own
    node count (nodes is a candidate axis), so it is cached on the scenario with ``nodes=1``: moving the node
    slider does not recompute it."""
    nodes = scaling_nodes(scenario.cluster.nodes)
    one_node = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"nodes": 1})})
    table = _scaling_table(one_node, tuple(int(n) for n in nodes))
    labels = tuple(label for label, _, _ in _variants(plan)) or tuple(table)
    tps = np.full((len(labels), len(nodes)), np.nan)
    extra = {label: sc for label, sc, _ in _variants(plan) if label not in table}  # recommended, ZeRO++
    for v, label in enumerate(labels):
        row = table.get(label)
        if row is None and label in extra:
            row = _scaling_row(extra[label], nodes)
        if row is None:
            continue
        ok = np.asarray(row["fits"], dtype=bool)
        tps[v] = np.where(ok, np.asarray(row["tokens_per_second"], dtype=float), np.nan)
    return ScalingView(labels=labels, nodes=nodes, tokens_per_second=tps, current_nodes=int(scenario.cluster.nodes))


def _fmt_gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def _fmt_rate(tps: float) -> str:
    if not math.isfinite(tps):
        return "n/a"
    if tps >= 1e6:
        return f"{tps / 1e6:.2f} M tokens/s"
    if tps >= 1e3:
        return f"{tps / 1e3:.1f} k tokens/s"
    return f"{tps:.0f} tokens/s"


def choice_text(choice: Any) -> str:
    """The chosen candidate's name: :attr:`zeroplanner.planner.Choice.label`, the one label the CLI, the JSON
    ``choice``, the reasons and the chart's Recommended column use (a dict of Choice fields is accepted too)."""
    from ..planner import Choice

    if isinstance(choice, Choice):
        return choice.label
    return Choice.model_validate(dict(choice)).label


def banner_html(plan: AnyPlan) -> str:
    """The recommendation banner (HTML), in the order a reader needs it: the headline (the planner's choice and its
    key numbers, ``zp-headline``), the step's peak, the warnings, the advice, the assumptions, then the reasons in a
    collapsed ``<details>`` ("Why this pick"). The page shows the banner in a box of bounded height; the headline and
    the first warning come first so that they are read without scrolling it."""
    est = plan.estimate
    scenario = plan.scenario
    reasons = [str(r) for r in plan.reasons]
    warnings = [str(w) for w in plan.warnings]
    esc = html.escape
    if not plan.fits:
        head = (
            '<div class="zp-banner zp-bad"><div class="zp-headline"><b>Does not fit.</b> No ZeRO stage or offload '
            "choice fits this model on this cluster.</div>"
        )
    else:
        # the step's peak (costmodel/timeline.py), the figure the fit is decided by
        peak = est.step_peak
        total = (peak.bytes if peak is not None else est.per_gpu_bytes.total) or 0.0
        cap = scenario.cluster.memory_per_gpu_bytes if scenario is not None else 0
        head = (
            f'<div class="zp-banner zp-good"><div class="zp-headline"><b>Recommended: '
            f'{esc(choice_text(plan.choice))}.</b> '
            f"peak {_fmt_gib(total)} of {_fmt_gib(cap)} per GPU, step {float(est.step_seconds):.3g} s, "
            f"{_fmt_rate(float(est.tokens_per_second))}.</div>"
        )
    head += step_peak_html(est, "Over one step" if plan.fits else "Your settings over one step")
    witems = "".join(f"<li>{esc(w)}</li>" for w in warnings)
    # warnings right under the headline: the banner is a box of bounded height, and a warning must not scroll away
    body = f"<div class='zp-warn-title'>Warnings</div><ul class='zp-warnings'>{witems}</ul>" if witems else ""
    advice = [str(a) for a in plan.advice]
    if advice:
        body += "<ul class='zp-advice'>" + "".join(f"<li><b>Advice:</b> {esc(a)}</li>" for a in advice) + "</ul>"
    assumed = [str(a) for a in plan.assumptions]
    # the defaults the verdict rests on, with the verdict (before the reasons)
    body += "".join(f"<div class='zp-assume'>{esc(sentence(a))}</div>" for a in assumed)
    if reasons:
        items = "".join(f"<li>{esc(r)}</li>" for r in reasons)
        why = "Why this pick" if plan.fits else "How the candidates compare"
        body += (f"<details class='zp-why'><summary>{why} ({len(reasons)} reason"
                 f"{'s' if len(reasons) != 1 else ''})</summary><ul class='zp-reasons'>{items}</ul></details>")
    return head + body + "</div>"


def variant_scenario(plan: AnyPlan, variant: str) -> Scenario:
    """The scenario of the config preview's selection: the plan's chosen one, or the named variant's.

    Raises ``KeyError`` naming the known variants if ``variant`` is unknown.
    """
    if variant == RECOMMENDED:
        return plan.scenario
    for label, scenario, _ in _variants(plan):
        if label == variant:
            return scenario
    raise KeyError(f"unknown variant {variant!r}; known: {[label for label, _, _ in _variants(plan)]}")


def config_text(plan: AnyPlan, variant: str, mode: ConfigMode) -> tuple[str, str, str | None]:
    """(JSON text, file name, error) of the DeepSpeed config for the selected variant, via
    ``zeroplanner.deepspeed.to_deepspeed_config(scenario, mode=...)``. On failure the text is empty and error says
    why (e.g. the selected variant does not fit, or the generator failed)."""
    filename = "ds_config_hf_trainer.json" if mode == "hf_trainer" else "ds_config.json"
    from ..deepspeed import to_deepspeed_config

    try:
        scenario = variant_scenario(plan, variant)
        if scenario is None:
            return "", filename, "No configuration fits, so there is no config to show."
        config = to_deepspeed_config(scenario, mode=mode)
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        return "", filename, error_message(exc)
    if not isinstance(config, str):
        config = json.dumps(config, indent=2)
    return config, filename, None


def data_uri(text: str, mime: str = "application/json") -> str:
    """``data:`` URI of ``text`` (base64), for a download link that needs no server round trip."""
    return f"data:{mime};base64,{base64.b64encode(text.encode('utf-8')).decode('ascii')}"


def derive(state: AppState) -> View:
    """Everything the app shows for ``state``: one call to ``zeroplanner.planner.plan`` and pure functions of it.

    Raises what the planner raises for an impossible scenario (``ValueError``); the app shows the message.
    """
    from ..costmodel import estimate
    from ..planner import plan as make_plan

    plan = make_plan(state.scenario)
    if state.zeropp:
        zs = zeropp_scenario(state)
        plan = PlanWithExtras(plan, ((zeropp_label(state), zs, estimate(zs)),))
    bars = _variants(plan)
    return View(
        state=state,
        plan=plan,
        memory=memory_view(plan),
        banner_html=banner_html(plan),
        variant_options=(RECOMMENDED, *(label for label, _, _ in bars if label != RECOMMENDED)),
        warnings=tuple(str(w) for w in plan.warnings),
        variant_scenarios=tuple(sc for _, sc, _ in bars),
    )
