"""Comparison view: pin a scenario, keep moving the controls, and see the pinned and the current plan side by side
(memory per GPU by term, step time by component, throughput, and what differs in the inputs and in the DeepSpeed
config).

``ComparePanel`` is an ipywidgets container; the app calls ``panel.update(scenario)`` on every change and the
"Pin current" button pins what is shown. The pure helpers (:func:`comparison`, :func:`config_diff`,
:func:`inputs_diff`) compute everything and are tested without widgets.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

import bqplot as bq
import ipywidgets as w
import numpy as np

from ..costmodel.terms import MEMORY_SEGMENTS, TIME_SEGMENTS, segment_value
from ..explain import fmt_bytes_text, fmt_seconds_text
from ..specs import Scenario
from ..units import GIB

MEMORY_TERMS = tuple((s.key, s.label) for s in MEMORY_SEGMENTS)
TIME_PARTS = tuple((s.key, s.label) for s in TIME_SEGMENTS)
TERM_COLORS = tuple(s.colour for s in MEMORY_SEGMENTS)
TIME_COLORS = tuple(s.colour for s in TIME_SEGMENTS)
"""The charts' segments, names and colours, from the cost model's term registry (``costmodel.terms``)."""


@dataclass(frozen=True)
class Side:
    """One side of the comparison: the scenario, the planner's plan, the estimate shown (the recommendation, or
    the scenario as given when nothing fits) and its DeepSpeed config (None when nothing fits)."""

    scenario: Scenario
    plan: Any
    estimate: Any
    config: dict | None

    @property
    def memory_gib(self) -> np.ndarray:
        return np.array([segment_value(self.estimate, s) / GIB for s in MEMORY_SEGMENTS])

    @property
    def time_seconds(self) -> np.ndarray:
        return np.array([segment_value(self.estimate, s) for s in TIME_SEGMENTS])

    @property
    def label(self) -> str:
        return self.plan.choice.label if self.plan.fits and self.plan.choice is not None else "nothing fits"


def side(scenario: Scenario) -> Side:
    """Plan ``scenario`` and keep what the comparison shows."""
    from ..costmodel import estimate
    from ..deepspeed import to_deepspeed_config
    from ..planner import plan

    p = plan(scenario)
    if p.fits:
        return Side(scenario, p, p.estimate, to_deepspeed_config(p.scenario))
    return Side(scenario, p, estimate(scenario), None)


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


def config_diff(a: dict | None, b: dict | None) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every DeepSpeed config key whose value differs (missing = None),
    sorted by key."""
    fa, fb = _flatten(a or {}), _flatten(b or {})
    return [(k, fa.get(k), fb.get(k)) for k in sorted(fa.keys() | fb.keys()) if fa.get(k) != fb.get(k)]


def inputs_diff(a: Scenario, b: Scenario) -> list[tuple[str, Any, Any]]:
    """(key, pinned value, current value) for the shareable inputs (the link's keys) that differ."""
    from ..share import scenario_inputs

    ia, _ = scenario_inputs(a, approximate_model=True)
    ib, _ = scenario_inputs(b, approximate_model=True)
    return [(k, ia.get(k), ib.get(k)) for k in dict.fromkeys([*ia, *ib]) if ia.get(k) != ib.get(k)]


def comparison(pinned: Side, current: Side) -> list[tuple[str, str, str]]:
    """Rows (what, pinned, current) of the side-by-side table: plan, memory terms, fit, host RAM, step-time
    components, step, tokens/s."""
    rows = [("Plan", pinned.label, current.label)]
    for (key, name), a, b in zip(MEMORY_TERMS, pinned.memory_gib, current.memory_gib):
        rows.append((name, f"{a:.2f} GiB", f"{b:.2f} GiB"))
    pe, ce = pinned.estimate, current.estimate
    rows.append(("Total per GPU", fmt_bytes_text(pe.per_gpu_bytes.total), fmt_bytes_text(ce.per_gpu_bytes.total)))
    rows.append(("Fits", "yes" if pe.fits else "no", "yes" if ce.fits else "no"))
    rows.append(("Host RAM per node", fmt_bytes_text(pe.per_node_cpu_bytes), fmt_bytes_text(ce.per_node_cpu_bytes)))
    for (key, name), a, b in zip(TIME_PARTS, pinned.time_seconds, current.time_seconds):
        rows.append((name, fmt_seconds_text(a), fmt_seconds_text(b)))
    rows.append(("Step", fmt_seconds_text(pe.step_seconds), fmt_seconds_text(ce.step_seconds)))
    rows.append(("Tokens/s", f"{pe.tokens_per_second:,.0f}", f"{ce.tokens_per_second:,.0f}"))
    return rows


def _table_html(rows: list[tuple[str, str, str]]) -> str:
    esc = html.escape
    body = "".join(
        f"<tr{' class=zp-diff' if a != b else ''}><th>{esc(k)}</th><td>{esc(a)}</td><td>{esc(b)}</td></tr>"
        for k, a, b in rows)
    return ("<table class='zp-compare'><tr><th></th><th>Pinned</th><th>Current</th></tr>" + body + "</table>")


def _diff_html(title: str, diff: list[tuple[str, Any, Any]]) -> str:
    esc = html.escape
    if not diff:
        return f"<div><b>{esc(title)}</b>: no differences.</div>"
    show = lambda v: "—" if v is None else json.dumps(v) if not isinstance(v, str) else v  # noqa: E731
    rows = "".join(f"<tr><td><code>{esc(k)}</code></td><td>{esc(show(a))}</td><td>{esc(show(b))}</td></tr>"
                   for k, a, b in diff)
    return (f"<div><b>{esc(title)}</b> ({len(diff)})</div><table class='zp-compare-diff'><tr><th>key</th>"
            f"<th>pinned</th><th>current</th></tr>{rows}</table>")


_CSS = """<style>
.zp-compare th, .zp-compare td, .zp-compare-diff th, .zp-compare-diff td { padding: 2px 8px; text-align: left;
  border-bottom: 1px solid #ddd; }
.zp-compare tr.zp-diff td { background: #fff8e1; }
</style>"""


class ComparePanel(w.VBox):
    """Pinned vs current, side by side. ``pin()`` pins the current scenario (or a given one); ``update(scenario)``
    sets the current one. ``table``, ``inputs``, ``config`` (HTML) and ``memory_chart`` / ``time_chart`` (bqplot,
    two stacked bars each; None until the first pin) show them; before anything is pinned the panel says how to
    start."""

    def __init__(self, current: Scenario | None = None) -> None:
        self.pinned: Side | None = None
        self.current: Side | None = None
        self._current_scenario: Scenario | None = None
        self.pin_button = w.Button(description="Pin current", icon="", tooltip="Keep this setup for comparison",
                                   layout=w.Layout(width="120px"))
        self.unpin_button = w.Button(description="Unpin", layout=w.Layout(width="90px"), disabled=True)
        self.pin_button.on_click(lambda _: self.pin())
        self.unpin_button.on_click(lambda _: self.unpin())
        self.status = w.HTML("<span class='zp-muted'>Pin the current setup, then change the controls to compare."
                             "</span>")
        self.table = w.HTML()
        self.inputs = w.HTML()
        self.config = w.HTML()
        # the two charts are built at the first pin, when the body is shown: a bqplot figure drawn inside a hidden
        # (zero-size) box logs "<rect> attribute height: A negative value" errors in the browser console (12 per
        # page load, seen in every benchmarks/load_voila.py run), and unbuilt charts are ~20 fewer widget models
        # for the page to load
        self.memory_chart: bq.Figure | None = None
        self.time_chart: bq.Figure | None = None
        self.body = w.VBox([])
        self.body.layout.display = "none"
        super().__init__([w.HTML(_CSS), w.HBox([self.pin_button, self.unpin_button, self.status]), self.body])
        self.add_class("zp-compare-panel")
        if current is not None:
            self.update(current)

    @staticmethod
    def _chart(title: str, labels: list[str], colors: tuple[str, ...], unit: str) -> bq.Figure:
        """Two stacked bars (pinned, current). The legend is HTML under the figure (``figure.legend``, placed by
        :meth:`_render`): bqplot's own legend is drawn inside the plot area, over the bars."""
        from .charts import PLAIN_TICKS, legend_html

        xs, ys = bq.OrdinalScale(domain=["Pinned", "Current"]), bq.LinearScale(min=0.0)
        bars = bq.Bars(x=["Pinned", "Current"], y=np.zeros((len(labels), 2)), type="stacked", colors=list(colors),
                       labels=labels, display_legend=False, scales={"x": xs, "y": ys}, padding=0.4)
        bars.tooltip = bq.Tooltip(fields=["x", "y"], labels=["", unit], formats=["", PLAIN_TICKS])
        axes = [bq.Axis(scale=xs), bq.Axis(scale=ys, side="left", label=unit, tick_format=PLAIN_TICKS,
                                          label_offset="42px")]
        figure = bq.Figure(marks=[bars], axes=axes, title=title, animation_duration=0,
                           fig_margin={"top": 40, "bottom": 30, "left": 60, "right": 10},
                           layout=w.Layout(width="100%", height="300px"))
        legend = w.HTML(legend_html([("box", c, n) for c, n in zip(colors, labels)]))
        legend.add_class("zp-compare-legend")
        figure.legend = legend
        return figure

    def update(self, scenario: Scenario) -> None:
        """Make ``scenario`` the current side and redraw. Planned only while something is pinned (the app calls
        this on every change; unpinned it costs nothing)."""
        self._current_scenario = scenario
        self.current = side(scenario) if self.pinned is not None else None
        self._render()

    def pin(self, scenario: Scenario | None = None) -> None:
        """Pin ``scenario`` (default: the current one)."""
        scenario = scenario if scenario is not None else self._current_scenario
        if scenario is None:
            return
        self.pinned = side(scenario)
        if self.current is None and self._current_scenario is not None:
            self.current = side(self._current_scenario)
        self.unpin_button.disabled = False
        self._render()

    def unpin(self) -> None:
        self.pinned = None
        self.unpin_button.disabled = True
        self._render()

    def _render(self) -> None:
        if self.pinned is None or self.current is None:
            self.body.layout.display = "none"
            self.status.value = ("<span class='zp-muted'>Pin the current setup, then change the controls to "
                                 "compare.</span>")
            return
        self.body.layout.display = ""
        if self.memory_chart is None:  # first pin: build the charts now that the body is visible
            self.memory_chart = self._chart("Memory per GPU (GiB)", [n for _, n in MEMORY_TERMS], TERM_COLORS,
                                            "GiB per GPU")
            self.time_chart = self._chart("Step time (s)", [n for _, n in TIME_PARTS], TIME_COLORS,
                                          "seconds per step")
            column = dict(width="50%", min_width="300px")
            charts = [w.VBox([fig, fig.legend], layout=w.Layout(**column))
                      for fig in (self.memory_chart, self.time_chart)]
            self.body.children = [w.HBox(charts, layout=w.Layout(flex_flow="row wrap")), self.table, self.inputs,
                                  self.config]
        self.status.value = f"<span class='zp-muted'>Pinned: {html.escape(self.pinned.label)}</span>"
        a, b = self.pinned, self.current
        for fig, values in ((self.memory_chart, (a.memory_gib, b.memory_gib)),
                            (self.time_chart, (a.time_seconds, b.time_seconds))):
            bars = fig.marks[0]
            with bars.hold_sync():
                bars.y = np.stack(values, axis=1)
        self.table.value = _table_html(comparison(a, b))
        self.inputs.value = _diff_html("Inputs that differ", inputs_diff(a.scenario, b.scenario))
        self.config.value = _diff_html("DeepSpeed config keys that differ", config_diff(a.config, b.config))
