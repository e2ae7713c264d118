"""Explain mode for the planner: pick (or click) a bar segment of the memory or step-time chart and see its
formula, the numbers that went into it, its unit and its source (:mod:`zeroplanner.explain`), rendered as math.

``ExplainPanel`` knows the chart's variants (``set_variants([(label, scenario), ...])``, called on every app
update) and shows one term of one variant: ``show(variant, key)``. ``attach(memory_bars, time_bars)`` wires bqplot
marks: clicking a bar explains the segment last hovered in it (bqplot 0.13.1's hover datum carries ``index`` = the
bar and ``subIndex`` = the segment; a click may identify only the bar). The app wires its charts itself
(``on_select`` in charts.py) and calls :meth:`show`.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

import ipywidgets as w

from ..costmodel import terms
from ..costmodel.terms import TERM_INFO
from ..explain import MEMORY_KEYS, explain, explain_time_segment, explanation_html
from ..specs import Scenario

MEMORY_LABELS = {k: TERM_INFO[k].label for k in MEMORY_KEYS}
TIME_SEGMENTS = tuple((s.key, s.label) for s in terms.TIME_SEGMENTS)
"""Step-time chart segments (the app's ``TIME_PARTS`` order) and their names (``costmodel.terms``)."""
TERM_OPTIONS: tuple[tuple[str, str], ...] = (
    *((f"{MEMORY_LABELS[k]} (memory)", k) for k in MEMORY_KEYS),
    (TERM_INFO["host_memory"].title, "host_memory"),
    (TERM_INFO["communication_volume"].title, "communication_volume"),
    *((f"{name} (time)", f"time:{k}") for k, name in TIME_SEGMENTS),
    (TERM_INFO["step"].title, "step"),
)
"""Dropdown entries: (label, key); time segments are prefixed "time:"."""


def explanations_for(scenario: Scenario, key: str) -> list:
    """The explanation(s) behind ``key`` (an entry of :data:`TERM_OPTIONS`) for ``scenario``."""
    if key.startswith("time:"):
        return explain_time_segment(scenario, key.split(":", 1)[1])
    return [explain(scenario, key)]


class ExplainPanel(w.VBox):
    """Formula, numbers, unit and source of one term of one chart variant."""

    def __init__(self) -> None:
        self._scenarios: dict[str, Scenario] = {}
        self._hover: dict[str, int | None] = {"memory": None, "time": None}
        self.variant = w.Dropdown(options=[], description="Variant", style={"description_width": "60px"},
                                  layout=w.Layout(width="330px"))
        self.term = w.Dropdown(options=list(TERM_OPTIONS), value="optimizer_states", description="Term",
                               style={"description_width": "45px"}, layout=w.Layout(width="300px"))
        self.math = w.HTMLMath()
        self.hint = w.HTML("<span class='zp-muted'>Click a bar segment in the memory or step-time chart, or pick a "
                           "variant and a term.</span>")
        self._quiet = False
        self.variant.observe(lambda _: self._quiet or self.render(), names="value")
        self.term.observe(lambda _: self._quiet or self.render(), names="value")
        super().__init__([self.hint, w.HBox([self.variant, self.term]), self.math])
        self.add_class("zp-explain-panel")

    def set_variants(self, variants: Sequence[tuple[str, Scenario]]) -> None:
        """The chart's variants in bar order (label, scenario); keeps the selected label when it still exists."""
        self._scenarios = {label: scenario for label, scenario in variants if scenario is not None}
        labels = list(self._scenarios)
        keep = self.variant.value if self.variant.value in labels else (labels[0] if labels else None)
        self._quiet = True
        try:
            if list(self.variant.options) != labels:
                self.variant.options = labels
            if self.variant.value != keep:
                self.variant.value = keep
        finally:
            self._quiet = False
        self.render()

    def show(self, variant: str, key: str) -> None:
        """Explain ``key`` (see :data:`TERM_OPTIONS`) of the variant labelled ``variant``; raises ``KeyError`` for
        an unknown variant or key."""
        if variant not in self._scenarios:
            raise KeyError(f"unknown variant {variant!r}; known: {list(self._scenarios)}")
        if key not in dict((k, v) for v, k in TERM_OPTIONS):
            raise KeyError(f"unknown term {key!r}")
        self._quiet = True
        try:
            self.variant.value = variant
            self.term.value = key
        finally:
            self._quiet = False
        self.render()

    def render(self) -> None:
        scenario = self._scenarios.get(self.variant.value)
        if scenario is None or self.term.value is None:
            self.math.value = ""
            return
        try:
            parts = explanations_for(scenario, self.term.value)
        except (ValueError, KeyError) as exc:
            self.math.value = f"<div class='zp-error'>{html.escape(str(exc))}</div>"
            return
        head = f"<div class='zp-muted'>{html.escape(self.variant.value)}</div>"
        self.math.value = head + "".join(explanation_html(e) for e in parts)

    # -- chart wiring ---------------------------------------------------------------------------------------------
    def attach(self, memory_bars: Any = None, time_bars: Any = None) -> None:
        """Explain the segment of ``memory_bars`` / ``time_bars`` (bqplot stacked Bars, bars in the order of
        :meth:`set_variants`, segments in MEMORY_KEYS / TIME_SEGMENTS order) that a click selects."""
        if memory_bars is not None:
            memory_bars.on_hover(lambda mark, event: self._hovered("memory", event))
            memory_bars.on_element_click(lambda mark, event: self.clicked("memory", event))
        if time_bars is not None:
            time_bars.on_hover(lambda mark, event: self._hovered("time", event))
            time_bars.on_element_click(lambda mark, event: self.clicked("time", event))

    def _hovered(self, chart: str, event: dict) -> None:
        self._hover[chart] = _segment(event.get("data") or {})

    def clicked(self, chart: str, event: dict) -> None:
        """Handle bqplot's element_click on the ``chart`` ("memory" or "time") bars: the bar index picks the
        variant, the last hovered segment the term (the first segment if none was hovered)."""
        data = event.get("data") or {}
        index = data.get("index", event.get("index"))
        labels = list(self._scenarios)
        if not isinstance(index, int) or not 0 <= index < len(labels):
            return
        sub = _segment(data)
        if sub is None:
            sub = self._hover.get(chart) or 0
        if chart == "memory":
            key = MEMORY_KEYS[min(sub, len(MEMORY_KEYS) - 1)]
        else:
            key = "time:" + TIME_SEGMENTS[min(sub, len(TIME_SEGMENTS) - 1)][0]
        self.show(labels[index], key)


def _segment(datum: dict) -> int | None:
    """The segment index of a stacked-bar datum: bqplot 0.13.1 names it ``subIndex`` (older releases
    ``sub_index``); None when the event identifies only the bar (a click on the bar group)."""
    for name in ("subIndex", "sub_index"):
        value = datum.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
