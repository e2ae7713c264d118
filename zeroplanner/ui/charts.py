"""bqplot charts of the planner: per-GPU memory, host RAM per node, step time, scaling.

Each chart is a ``bqplot.Figure`` subclass that builds its scales, axes and marks once and exposes ``update(view)``,
which replaces the marks' data inside ``with mark.hold_sync():`` so each mark sends one message per update. The data
come from :mod:`zeroplanner.ui.state` (GiB, seconds, tokens/s); nothing is computed here beyond placing labels.
"""

from __future__ import annotations

import html

import bqplot as bq
import ipywidgets as w
import numpy as np

from ..costmodel.terms import MEMORY_SEGMENTS, TIME_SEGMENTS
from ..report import TIMELINE_SERIES
from .state import MEMORY_TERMS, TIME_PARTS, TIMELINE_PARTS, MemoryView, ScalingView, StepView, TimeView

TERM_COLORS = tuple(s.colour for s in MEMORY_SEGMENTS)
TIME_COLORS = tuple(s.colour for s in TIME_SEGMENTS)
TIMELINE_COLORS = tuple(colour for _, _, colour in TIMELINE_SERIES)
"""Segment colours, bottom to top, from the cost model's term registry (the report and compare view use the same)."""
LINE_COLORS = ("#000000", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#bcbd22")
LINE_MARKERS = ("circle", "square", "triangle-up", "diamond", "cross", "triangle-down", "circle", "square",
                "diamond", "cross")
"""Scaling lines differ by colour and by marker (eight lines are hard to tell apart by colour alone)."""
FIT_COLOR = "#2e7d32"
RISKY_COLOR = "#8a5a00"
HOST_COLOR = "#9d755d"
OOM_COLOR = "#c62828"
MEASURED_COLOR = "#1565c0"
"""Figures measured in the user's log ("Paste your log"), drawn beside the predictions."""

FIGURE_WIDTH_PX, FIGURE_HEIGHT_PX = 680, 360
_FIG_LAYOUT = dict(width=f"{FIGURE_WIDTH_PX}px", height=f"{FIGURE_HEIGHT_PX}px", flex="0 0 auto")
"""Fixed figure sizes: a figure whose size follows its container is re-laid out (axes, every bar) whenever text
elsewhere on the page changes width, which costs hundreds of ms in the browser."""
_MARGIN = {"top": 36, "bottom": 52, "left": 64, "right": 16}
_STATUS_ROW_PX = 42
"""Extra top margin of the memory chart: its "fits" / "OOM" row sits between the title and the plot. bqplot puts
the title's 20 px text box 2 px below the middle of the top margin (Chromium's bounding boxes), so a 78 px margin
ends the title 2 px above the row."""
_STATUS_BASELINE_PX = 17
"""How far above the plot's top edge the row's labels are placed. A bqplot Label's 12 px text box runs from about
4 px above to 10 px below its offset point (Chromium's bounding boxes), so at 17 px the row ends 1 px above the
edge and stays clear of off-scale bars, which reach it (tests/browser/test_browser_layout.py)."""
_X_TICKS = {"font-size": "11px"}
PLAIN_TICKS = ",.6~r"
"""Tick format of linear axes whose values span decades (seconds per step, the compare charts): d3-format's ``r``
is decimal notation (never an exponent: 3000 -> "3,000", 0.005 -> "0.005", where ``.3~g`` wrote "3e+3"), with a
thousands separator and trailing zeros trimmed (``~``); 6 significant digits keep every nice tick value exact."""
GIB_TICKS = ",.0f"
"""Whole GiB (and node counts) with a thousands separator: "1,400", not "1400"."""
RATE_TICKS = "~s"
"""Tokens/s on the scaling chart's log axis: SI prefixes without trailing zeros ("1k", "10k", "1M"); the axis label
says what k and M are."""
"""Variant ticks are short names (:func:`short_label`) written level, so they neither overlap nor reach past the
figure; the full names are in the legend's key and in every bar's tooltip."""
OFFSCALE_FACTOR = 1.6
"""The memory axis runs to about the GPU's memory: to ``nice_ceiling(OFFSCALE_FACTOR x capacity)`` at most. Bars
beyond it are drawn to the top edge and labelled with their value (ZeRO-0 of a 70B model is 1,400 GiB; on its
scale every configuration that fits would be a sliver at the bottom)."""


def _same(old, new) -> bool:
    try:
        a, b = np.asarray(old), np.asarray(new)
    except (TypeError, ValueError):
        return old == new
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.array_equal(a.astype(float), b.astype(float), equal_nan=True))
    return bool(np.array_equal(a, b))


def assign(widget, **traits) -> int:
    """Set only the traits whose value differs, in one message (``hold_sync``); returns how many changed. Each
    message makes bqplot redraw the mark, so unchanged data is not sent again."""
    changed = {k: v for k, v in traits.items() if not _same(getattr(widget, k), v)}
    if changed:
        with widget.hold_sync():
            for key, value in changed.items():
                setattr(widget, key, value)
    return len(changed)


def nice_ceiling(x: float) -> float:
    """Smallest of 1, 1.5, 2, 3, 4, 5, 6, 8 x 10^k that is >= x (axis tops that do not move with small changes)."""
    if not np.isfinite(x) or x <= 0:
        return 1.0
    k = np.floor(np.log10(x))
    for m in (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0):
        if m * 10**k >= x * (1 - 1e-12):
            return float(m * 10**k)
    return float(10 ** (k + 1))


def legend_html(items: list[tuple[str, str, str]], key: str = "") -> str:
    """An HTML legend row: (kind "box" or "dash", colour, text) per entry. Kept outside the SVG so it never covers
    a bar."""
    parts = []
    for kind, color, text in items:
        if kind == "dash":
            style = f"width:18px;border-top:2px dashed {color};margin:0 4px 3px 0"
        elif kind == "line":
            style = f"width:18px;border-top:3px solid {color};margin:0 4px 3px 0"
        else:
            style = f"width:11px;height:11px;background:{color};margin:0 4px -1px 0"
        mark = f"<span style='display:inline-block;{style}'></span>"
        parts.append(f"<span style='margin-right:10px;white-space:nowrap'>{mark}{html.escape(text)}</span>")
    return f"<div style='font-size:12px;line-height:1.5;padding-left:8px'>{''.join(parts)}</div>{key}"


class _SegmentClicks:
    """Clicks on stacked bars, as (bar index, segment index). bqplot's click selects a whole bar (``selected``);
    the segment is the last one hovered (bqplot's hover datum carries ``index`` and ``subIndex``). The selection
    is cleared after each click so the same bar can be clicked again; unselected bars keep their look."""

    @staticmethod
    def install(figure, bars: bq.Bars, segments: int) -> None:
        figure._select_callbacks = []
        figure._last_segment = 0
        bars.interactions = {"hover": "tooltip", "click": "select"}
        bars.unselected_style = {}
        bars.selected_style = {}

        def hovered(mark, event) -> None:
            point = event.get("data") or {}
            sub = point.get("subIndex", point.get("sub_index"))
            if isinstance(sub, int) and 0 <= sub < segments:
                figure._last_segment = sub

        def selected(change) -> None:
            picked = change["new"]
            if picked is None or len(picked) == 0:
                return
            index = int(list(picked)[-1])
            bars.selected = None
            for callback in figure._select_callbacks:
                callback(index, figure._last_segment)

        bars.on_hover(hovered)
        bars.observe(selected, names="selected")
        figure.on_select = lambda callback: figure._select_callbacks.append(callback)


_SHORT = (("ZeRO-", "Z"), (" + NVMe optimizer & params", " NVMe-op"), (" + CPU optimizer & params", " CPU-op"),
          (" + CPU optimizer", " CPU-o"), (" + NVMe optimizer", " NVMe-o"), (" + ZeRO++", "++"))


def short_label(label: str) -> str:
    """Axis tick text for a variant label, short enough to sit level under its bar: 'ZeRO-3 + CPU optimizer &
    params' -> 'Z3 CPU-op', 'Recommended' -> 'Rec.' (the legend's key and the tooltips give the full name)."""
    if label == "Recommended":
        return "Rec."
    for old, new in _SHORT:
        label = label.replace(old, new)
    return label if len(label) <= 10 else label[:9] + "…"


_short = short_label


def ticks_key_html(labels) -> str:
    """The legend's key from short tick names to full variant names."""
    items = [f"<b>{html.escape(short_label(lab))}</b>&nbsp;{html.escape(lab)}" for lab in labels
             if short_label(lab) != lab]
    if not items:
        return ""
    return ("<div class='zp-tick-key' style='font-size:11px;color:#555;padding-left:8px'>"
            + " · ".join(items) + "</div>")


def _figure(title: str, marks, axes, legend: str = "top-right", margin_top_px: int = _MARGIN["top"],
            **layout) -> dict:
    """Figure settings shared by the charts (legends are HTML under the figure, never over the data)."""
    return dict(
        marks=marks,
        axes=axes,
        title=title,
        fig_margin={**_MARGIN, "top": margin_top_px},
        layout=w.Layout(**{**_FIG_LAYOUT, **layout}),
        legend_location=legend,
        legend_style={"stroke-width": 0, "fill": "white", "fill-opacity": 0.8},
        animation_duration=0,
    )


class MemoryChart(bq.Figure):
    """Stacked bars: per-GPU memory of every variant by term (GiB), the GPU's capacity as a labelled dashed line,
    and "fits" / "OOM" / "RAM" / "NVMe" for each bar in a row above the plot (:func:`short_word`). The axis runs to about the GPU's memory
    (:data:`OFFSCALE_FACTOR`); bars beyond it reach the top edge and carry their value. Hovering a segment shows
    its GiB and the cost-model terms (formula names)."""

    def __init__(self) -> None:
        self.x_scale = bq.OrdinalScale()
        self.y_scale = bq.LinearScale(min=0.0)
        scales = {"x": self.x_scale, "y": self.y_scale}
        self.bars = bq.Bars(
            x=[], y=[], type="stacked", colors=list(TERM_COLORS), labels=[name for _, name in MEMORY_TERMS],
            display_legend=False, scales=scales, padding=0.25, stroke="white", opacity_mode="auto",
        )
        self.capacity = bq.Lines(
            x=[], y=[], colors=[OOM_COLOR], line_style="dashed", stroke_width=2, labels=["GPU memory"],
            display_legend=False, scales=scales,
        )
        self.capacity_label = bq.Label(x=[], y=[], text=[], colors=[OOM_COLOR], align="start", default_size=11,
                                       y_offset=-7, x_offset=-30, scales=scales)
        self.legend = w.HTML()
        # "fits" / "OOM" in a row above the plot (y = the axis top, unclipped), not on each bar's top: labels that
        # move with their bars are a second bqplot mark redrawn on nearly every change (its data update, draw and
        # the figure's legend rebuild were a third of the browser's script time per node-slider change, Chrome
        # profiler); the row is redrawn only when a verdict or the axis top changes.
        def status_row(colour: str) -> bq.Label:
            return bq.Label(x=[], y=[], text=[], colors=[colour], align="middle", default_size=12,
                            font_weight="bold", y_offset=-_STATUS_BASELINE_PX, scales=scales, apply_clip=False)

        self.fit_labels, self.oom_labels = status_row(FIT_COLOR), status_row(OOM_COLOR)
        self.offscale_labels = bq.Label(x=[], y=[], text=[], colors=["white"], align="middle", default_size=11,
                                        font_weight="bold", scales=scales)
        self.tooltip_html = w.HTML(layout=w.Layout(max_width="420px"))
        self.bars.tooltip = self.tooltip_html
        self.bars.on_hover(self._on_hover)
        self._view: MemoryView | None = None
        _SegmentClicks.install(self, self.bars, len(MEMORY_TERMS))
        axes = [
            bq.Axis(scale=self.x_scale, label="ZeRO variant", label_offset="36px", tick_style=_X_TICKS),
            bq.Axis(scale=self.y_scale, side="left", label="GiB per GPU", tick_format=GIB_TICKS,
                    label_offset="45px", grid_lines="dashed"),
        ]
        super().__init__(**_figure("Memory per GPU (GiB)",
                                   [self.bars, self.capacity, self.capacity_label, self.fit_labels,
                                    self.oom_labels, self.offscale_labels], axes,
                                   margin_top_px=_MARGIN["top"] + _STATUS_ROW_PX))

    def update(self, view: MemoryView) -> None:
        self._view = view
        ticks = [_short(label) for label in view.labels]
        cap = float(view.capacity_gib)
        peak = float(view.total_gib.max(initial=0.0))
        top = nice_ceiling(max(min(peak, OFFSCALE_FACTOR * cap), cap) * 1.1)
        assign(self.x_scale, domain=ticks)
        assign(self.y_scale, max=top)
        assign(self.bars, x=ticks, y=view.gib)
        assign(self.capacity, x=ticks, y=[cap] * len(ticks), labels=[f"GPU memory ({cap:.0f} GiB)"])
        assign(self.capacity_label, x=ticks[-1:], y=[cap], text=[f"GPU {cap:.0f} GiB"])
        legend = legend_html([("box", c, n) for c, (_, n) in zip(TERM_COLORS, MEMORY_TERMS)]
                             + [("dash", OOM_COLOR, f"GPU memory ({cap:.0f} GiB)")], ticks_key_html(view.labels))
        if self.legend.value != legend:
            self.legend.value = legend
        # the whole verdict, not the GPU's alone: an offload bar within GPU memory whose host RAM (or NVMe) is short
        # does not fit either, and its word says what is short
        words = [short_word(view, i) for i in range(len(ticks))]
        for mark, keep in ((self.fit_labels, lambda word: word == "fits"), (self.oom_labels, lambda word: word != "fits")):
            idx = [i for i, word in enumerate(words) if keep(word)]
            assign(mark, x=[ticks[i] for i in idx], y=[top for _ in idx], text=[words[i] for i in idx])
        off = [i for i, t in enumerate(view.total_gib) if t > top]
        assign(self.offscale_labels, x=[ticks[i] for i in off], y=[top * 0.8 for _ in off],
               text=[f"{view.total_gib[i]:,.0f}↑" for i in off])

    def _on_hover(self, mark, event) -> None:
        view = self._view
        # bqplot 0.13.1 sends {"event": "hover", "data": {"index": bar, "subIndex": stacked segment, ...}}
        point = event.get("data") or event.get("point") or {}
        v = point.get("index")
        t = point.get("subIndex", point.get("sub_index"))
        if view is None or v is None or t is None or not (0 <= v < len(view.labels)) or not (
                0 <= t < len(MEMORY_TERMS)):
            return
        self.tooltip_html.value = segment_tooltip(view, int(t), int(v))


SHORT_WORDS = {"fits": "fits", "OOM": "does not fit in GPU memory", "RAM": "fits in GPU memory; host RAM is short",
               "NVMe": "fits in GPU memory; NVMe capacity is short"}
"""The memory chart's status row (above each bar) and what each word means in its tooltip."""


def short_word(view: MemoryView, variant: int) -> str:
    """The status-row word of one bar: "fits", "OOM" (over GPU memory), "RAM" (host RAM per node short: offload
    holds more than the node has) or "NVMe" (NVMe capacity short), from the estimate's whole verdict."""
    if view.fits[variant]:
        return "fits"
    if not view.fits_gpu[variant]:
        return "OOM"
    return "RAM" if not view.fits_cpu[variant] else "NVMe"


def segment_tooltip(view: MemoryView, term: int, variant: int) -> str:
    """HTML for one bar segment: variant, term name, GiB, the cost-model terms summed into it."""
    name = MEMORY_TERMS[term][1]
    detail = view.term_formulas[term][variant]
    fits = SHORT_WORDS[short_word(view, variant)]
    return (
        f"<div style='padding:4px 6px;font-size:12px'><b>{html.escape(view.labels[variant])}</b> ({fits})<br>"
        f"{name}: <b>{view.gib[term, variant]:.2f} GiB</b> of {view.total_gib[variant]:.2f} GiB per GPU"
        + (f"<br><span style='color:#555'>{detail}</span>" if detail else "")
        + "</div>"
    )


def step_tooltip(view: TimeView, part: int, variant: int) -> str:
    """HTML for one step-time segment: variant, part name, seconds, share of the step, tokens/s."""
    total = float(view.seconds[:, variant].sum())
    secs = float(view.seconds[part, variant])
    share = 100.0 * secs / total if total > 0 else 0.0
    rate = view.tokens_per_second[variant]
    fits = "fits" if view.fits[variant] else "does not fit in GPU memory"
    return (
        f"<div style='padding:4px 6px;font-size:12px'><b>{html.escape(view.labels[variant])}</b> ({fits})<br>"
        f"{TIME_PARTS[part][1]}: <b>{secs:.3g} s</b> of {total:.3g} s per step ({share:.0f}%)<br>"
        f"{rate:,.0f} tokens/s</div>"
    )


class HostMemoryChart(bq.Figure):
    """Host RAM per node (GiB) of every variant, with the node's RAM as a labelled dashed line."""

    def __init__(self) -> None:
        self.x_scale = bq.OrdinalScale()
        self.y_scale = bq.LinearScale(min=0.0)
        scales = {"x": self.x_scale, "y": self.y_scale}
        self.bars = bq.Bars(x=[], y=[], colors=[HOST_COLOR], scales=scales, padding=0.25,
                            labels=["Host RAM used"], display_legend=False)
        self.capacity = bq.Lines(x=[], y=[], colors=[OOM_COLOR], line_style="dashed", stroke_width=2,
                                 labels=["Host RAM per node"], display_legend=False, scales=scales)
        # ending at the last bar's centre: "node 1024 GiB" started 30 px left of it ran past the plot and was cut
        self.capacity_label = bq.Label(x=[], y=[], text=[], colors=[OOM_COLOR], align="end", default_size=11,
                                       y_offset=-7, scales=scales)
        self.bars.tooltip = bq.Tooltip(fields=["x", "y"], labels=["variant", "GiB per node"], formats=["", ",.1f"])
        self.legend = w.HTML()
        axes = [
            bq.Axis(scale=self.x_scale, label="ZeRO variant", label_offset="36px", tick_style=_X_TICKS),
            bq.Axis(scale=self.y_scale, side="left", label="GiB per node", tick_format=GIB_TICKS,
                    label_offset="45px", grid_lines="dashed"),
        ]
        super().__init__(**_figure("Host RAM per node (GiB)", [self.bars, self.capacity, self.capacity_label],
                                   axes))

    def update(self, view: MemoryView) -> None:
        ticks = [_short(label) for label in view.labels]
        cap = float(view.host_capacity_gib)
        top = nice_ceiling(float(max(view.host_gib.max(initial=0.0), cap)) * 1.15)
        assign(self.x_scale, domain=ticks)
        assign(self.y_scale, max=top)
        assign(self.bars, x=ticks, y=view.host_gib)
        assign(self.capacity, x=ticks, y=[cap] * len(ticks), labels=[f"Host RAM per node ({cap:.0f} GiB)"])
        assign(self.capacity_label, x=ticks[-1:], y=[cap], text=[f"node {cap:.0f} GiB"])
        legend = legend_html([("box", HOST_COLOR, "Host RAM needed per node (held + headroom)"),
                              ("dash", OOM_COLOR, f"Host RAM per node ({cap:.0f} GiB)")],
                             ticks_key_html(view.labels))
        if self.legend.value != legend:
            self.legend.value = legend


def _rate(tps: float) -> str:
    if not np.isfinite(tps) or tps <= 0:
        return ""
    return f"{tps / 1e3:.3g}k" if tps >= 1e3 else f"{tps:.3g}"


def _draw_measured_line(chart, ends: list, room: float) -> None:
    """Draw ``chart._measured`` ((value, label) or None) as its ``measured`` line across ``ends`` (x values of the
    chart's scale) with its ``measured_label``, raising the y scale to ``room`` x the value when it is higher."""
    if chart._measured is None or not ends:
        assign(chart.measured, x=[], y=[])
        assign(chart.measured_label, x=[], y=[], text=[])
        return
    value, label = chart._measured
    assign(chart.y_scale, max=max(float(chart.y_scale.max or 0.0), nice_ceiling(value * room)))
    assign(chart.measured, x=ends, y=[value, value])
    assign(chart.measured_label, x=ends[:1], y=[value], text=[label])


class StepTimeChart(bq.Figure):
    """Stacked bars: step time of every variant split into compute, exposed communication and offload/CPU
    optimizer time (s); tokens/s over each bar (thousands, "k"); "OOM" over variants that do not fit."""

    def __init__(self) -> None:
        self.x_scale = bq.OrdinalScale()
        self.y_scale = bq.LinearScale(min=0.0)
        self.bars = bq.Bars(
            x=[], y=[], type="stacked", colors=list(TIME_COLORS), labels=[name for _, name in TIME_PARTS],
            display_legend=False, scales={"x": self.x_scale, "y": self.y_scale}, padding=0.25, stroke="white",
        )
        self.legend = w.HTML(legend_html([("box", c, n) for c, (_, n) in zip(TIME_COLORS, TIME_PARTS)]))
        self.tooltip_html = w.HTML(layout=w.Layout(max_width="420px"))
        self.bars.tooltip = self.tooltip_html
        self.bars.on_hover(self._on_hover)
        self._view: TimeView | None = None
        _SegmentClicks.install(self, self.bars, len(TIME_PARTS))
        self.rate_labels = bq.Label(x=[], y=[], text=[], colors=["#333333"], align="middle", default_size=11,
                                    y_offset=-6, scales={"x": self.x_scale, "y": self.y_scale})
        self.oom_labels = bq.Label(x=[], y=[], text=[], colors=[OOM_COLOR], align="middle", default_size=11,
                                   font_weight="bold", y_offset=-6, scales={"x": self.x_scale, "y": self.y_scale})
        axes = [
            bq.Axis(scale=self.x_scale, label="ZeRO variant (tokens/s over bars)", label_offset="36px",
                    tick_style=_X_TICKS),
            bq.Axis(scale=self.y_scale, side="left", label="seconds per step", tick_format=PLAIN_TICKS,
                    label_offset="45px", grid_lines="dashed"),
        ]
        # a step time measured in the user's log (app "Paste your log"), drawn beside the predicted bars
        self.measured = bq.Lines(x=[], y=[], colors=[MEASURED_COLOR], line_style="dashed", stroke_width=2,
                                 display_legend=False, scales={"x": self.x_scale, "y": self.y_scale})
        self.measured_label = bq.Label(x=[], y=[], text=[], colors=[MEASURED_COLOR], align="start", default_size=11,
                                       y_offset=-6, scales={"x": self.x_scale, "y": self.y_scale})
        self._measured: tuple[float, str] | None = None
        self._ticks: list[str] = []
        super().__init__(**_figure("Step time (s) and tokens/s", [self.bars, self.rate_labels, self.oom_labels,
                                                                  self.measured, self.measured_label],
                                   axes, legend="top-left"))

    def show_measured(self, seconds: float | None, label: str = "") -> None:
        """Draw (or, with None, remove) a dashed line at a step time measured in a log, labelled."""
        self._measured = (float(seconds), label) if seconds else None
        self._draw_measured()

    def _draw_measured(self) -> None:
        ends = [self._ticks[0], self._ticks[-1]] if self._ticks else []
        _draw_measured_line(self, ends, 1.12)

    def _on_hover(self, mark, event) -> None:
        view = self._view
        point = event.get("data") or event.get("point") or {}
        v, p = point.get("index"), point.get("subIndex", point.get("sub_index"))
        if view is None or v is None or p is None or not (0 <= v < len(view.labels)) or not (0 <= p < len(TIME_PARTS)):
            return
        self.tooltip_html.value = step_tooltip(view, int(p), int(v))

    def update(self, view: TimeView) -> None:
        self._view = view
        ticks = [_short(label) for label in view.labels]
        legend = legend_html([("box", c, n) for c, (_, n) in zip(TIME_COLORS, TIME_PARTS)],
                             ticks_key_html(view.labels))
        if self.legend.value != legend:
            self.legend.value = legend
        totals = view.seconds.sum(axis=0)
        top = nice_ceiling(float(totals.max(initial=0.0)) * 1.12)
        assign(self.x_scale, domain=ticks)
        assign(self.y_scale, max=top)
        assign(self.bars, x=ticks, y=view.seconds)
        fit = [i for i, ok in enumerate(view.fits) if ok]
        oom = [i for i, ok in enumerate(view.fits) if not ok]
        assign(self.rate_labels, x=[ticks[i] for i in fit], y=[float(totals[i]) for i in fit],
               text=[_rate(view.tokens_per_second[i]) for i in fit])
        assign(self.oom_labels, x=[ticks[i] for i in oom], y=[float(totals[i]) for i in oom],
               text=["OOM" for _ in oom])
        self._ticks = ticks
        self._draw_measured()


SCALING_MARKER_PX = 7
"""Scaling markers whose centres would be closer than this vertically (px) are spread side by side this far apart:
a ``marker_size`` 28 marker (bqplot's size is its area, px^2) is about 6 px across."""
SCALING_PAD = 1.3
"""The scaling chart's node axis runs from the fewest nodes / 1.3 to the most x 1.3 (log scale): a marker on the
first or last node count would otherwise sit on the plot's edge, half clipped away."""


def dodge_nodes(nodes: np.ndarray, tokens_per_second: np.ndarray, *, x_decades: float, y_decades: float,
                width_px: float, height_px: float, marker_px: float = SCALING_MARKER_PX) -> np.ndarray:
    """x positions (node counts) of the scaling chart's points, ``tokens_per_second``'s shape (lines, nodes):
    ``nodes`` where a point stands apart; where points of several lines at one node count would be drawn within
    ``marker_px`` of each other vertically (their tokens/s coincide or nearly, e.g. a variant with and without a
    CPU optimizer on many nodes), they are spread side by side, ``marker_px`` apart, centred on the node count.
    ``x_decades`` / ``y_decades``: the log axes' spans in decades, drawn over ``width_px`` / ``height_px``."""
    y = np.asarray(tokens_per_second, dtype=float)
    x = np.broadcast_to(np.asarray(nodes, dtype=float), y.shape).copy()
    if y.size == 0 or x_decades <= 0 or y_decades <= 0:
        return x
    close = marker_px * y_decades / height_px  # decades of tokens/s within one marker
    step = marker_px * x_decades / width_px  # decades of nodes between side-by-side markers
    for j in range(y.shape[1]):
        rows = [i for i in np.argsort(y[:, j], kind="stable") if np.isfinite(y[i, j]) and y[i, j] > 0]
        groups: list[list[int]] = []
        for i in rows:
            if groups and np.log10(y[i, j]) - np.log10(y[groups[-1][-1], j]) < close:
                groups[-1].append(i)
            else:
                groups.append([i])
        for group in groups:
            for k, i in enumerate(sorted(group)):
                x[i, j] *= 10 ** ((k - (len(group) - 1) / 2) * step)
    return x


class ScalingChart(bq.Figure):
    """Tokens/s against node count (log axes), one line per variant over the node counts where it fits (each with
    its own colour and marker, named in the HTML legend under the figure), and the current node count as a
    vertical dotted line drawn under them. Points of lines that coincide are spread side by side
    (:func:`dodge_nodes`) so every line's markers show; ``node_counts(i)`` gives line ``i``'s exact node counts
    (its ``x`` may be dodged). One ``Lines`` mark per variant, created once (more are added only if a plan ever has
    more variants than before); the Recommended line (the first) is drawn on top."""

    def __init__(self) -> None:
        self.x_scale = bq.LogScale()
        self.y_scale = bq.LogScale()
        self.lines: list[bq.Lines] = []
        self._nodes: list[np.ndarray] = []
        self.legend = w.HTML()
        self.current = bq.Lines(x=[1.0, 1.0], y=[1.0, 10.0], colors=["#555555"], line_style="dotted",
                                stroke_width=2, labels=["current nodes"], display_legend=False,
                                scales={"x": self.x_scale, "y": self.y_scale})
        axes = [
            bq.Axis(scale=self.x_scale, label="nodes (log)", tick_format=GIB_TICKS, label_offset="32px"),
            bq.Axis(scale=self.y_scale, side="left", label="tokens/s (log; k = thousand, M = million)",
                    tick_format=RATE_TICKS, label_offset="45px", grid_lines="dashed"),
        ]
        super().__init__(**_figure("Scaling: tokens/s vs nodes", [self.current], axes))

    def node_counts(self, i: int) -> np.ndarray:
        """The node counts of line ``i``'s points (its ``x`` before spreading coinciding points)."""
        return self._nodes[i] if i < len(self._nodes) else np.zeros(0)

    def _line(self, i: int) -> bq.Lines:
        while len(self.lines) <= i:
            k = len(self.lines)
            line = bq.Lines(x=[], y=[], colors=[LINE_COLORS[k % len(LINE_COLORS)]],
                            marker=LINE_MARKERS[k % len(LINE_MARKERS)], marker_size=28, stroke_width=2,
                            display_legend=False, labels=[""], scales={"x": self.x_scale, "y": self.y_scale})
            # tokens/s only: a point's x may be spread off its node count (dodge_nodes); the axis gives the nodes
            line.tooltip = bq.Tooltip(fields=["y"], labels=["tokens/s"], formats=[",.0f"])
            self.lines.append(line)
            self.marks = [self.current, *reversed(self.lines)]  # the current-nodes line under every point
        return self.lines[i]

    def update(self, view: ScalingView) -> None:
        y = view.tokens_per_second
        finite = np.isfinite(y) & (y > 0)
        if finite.any():  # whole decades that hold every point
            bottom = float(10 ** np.floor(np.log10(y[finite].min())))
            top = float(10 ** np.ceil(np.log10(y[finite].max() * 1.05)))
            if top <= bottom:
                top = bottom * 10
        else:
            bottom, top = 1.0, 10.0
        low = float(min(view.nodes.min(), view.current_nodes)) / SCALING_PAD
        high = float(max(view.nodes.max(), view.current_nodes)) * SCALING_PAD
        assign(self.x_scale, min=low, max=high)
        assign(self.y_scale, min=bottom, max=top)
        decades = 10.0 ** np.arange(np.log10(bottom), np.log10(top) + 0.5)
        assign(self.axes[1], tick_values=decades)
        margin = self.fig_margin
        x = dodge_nodes(view.nodes, np.where(finite, y, np.nan), x_decades=float(np.log10(high / low)),
                        y_decades=float(np.log10(top / bottom)),
                        width_px=FIGURE_WIDTH_PX - margin["left"] - margin["right"],
                        height_px=FIGURE_HEIGHT_PX - margin["top"] - margin["bottom"])
        items = []
        self._nodes = []
        for i, label in enumerate(view.labels):
            line = self._line(i)
            ok = finite[i]
            name = label if ok.any() else f"{label} (does not fit)"
            assign(line, x=x[i][ok], y=y[i][ok], labels=[name], visible=bool(ok.any()))
            self._nodes.append(np.asarray(view.nodes, dtype=float)[ok])
            symbol = _MARKER_SYMBOLS.get(LINE_MARKERS[i % len(LINE_MARKERS)], "")
            items.append(("line", LINE_COLORS[i % len(LINE_COLORS)], f"{symbol} {name}" if symbol else name))
        for line in self.lines[len(view.labels):]:
            assign(line, visible=False)
        assign(self.current, x=[float(view.current_nodes)] * 2, y=[bottom, top])
        legend = legend_html(items + [("dash", "#555555", f"current: {view.current_nodes} nodes")])
        if self.legend.value != legend:
            self.legend.value = legend


_MARKER_SYMBOLS = {"circle": "●", "square": "■", "triangle-up": "▲", "diamond": "◆", "cross": "✚",
                   "triangle-down": "▼"}
"""The legend names each scaling line's marker too (lines are told apart by colour and marker)."""


def _tick_key(x: float) -> str:
    """A tick value as JavaScript's ``String(x)`` writes it (bqplot looks ``tick_labels`` up by that text): 1.5 ->
    '1.5', 4.0 -> '4'."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def timeline_tooltip(view: StepView, point: int) -> str:
    """HTML for one timeline bar: the point's label and phase, each non-zero term in GiB, the total."""
    rows = "".join(f"{html.escape(name)}: {view.gib[t, point]:.2f} GiB<br>"
                   for t, (_, name) in enumerate(TIMELINE_PARTS) if view.gib[t, point] > 0)
    peak = " (the step's peak)" if point == view.peak_index else ""
    return (f"<div style='padding:4px 6px;font-size:12px'><b>{html.escape(view.labels[point])}</b>{peak}<br>"
            f"{rows}<b>{view.total_gib[point]:.2f} GiB</b> per GPU of {view.capacity_gib:.1f} GiB</div>")


_TIMELINE_RIGHT_PX = 44
"""Right margin of the timeline chart: its last tick ("optimizer step") is centred on the last bar and is wider
than the bar's slot."""


class StepTimelineChart(bq.Figure):
    """Memory per GPU over one training step of one variant (GiB): one bar per timeline point in step order,
    stacked by term (:data:`~zeroplanner.ui.state.TIMELINE_PARTS`), ticks grouped by phase with dotted lines
    between the phases, the GPU's memory as a labelled dashed line, and the peak point marked (a triangle over its
    bar) and labelled with its GiB and phase ("peak 55.0 GiB in backward"; amber when the headroom is below the
    model's error, red when over the GPU's memory). The HTML ``legend`` under the figure names the terms and carries
    the headroom line (``StepPeak.verdict()``). Hovering a bar shows its point's terms."""

    def __init__(self) -> None:
        self.x_scale = bq.LinearScale(min=-0.5, max=0.5)
        self.y_scale = bq.LinearScale(min=0.0)
        scales = {"x": self.x_scale, "y": self.y_scale}
        self.bars = bq.Bars(
            x=[], y=[], type="stacked", colors=list(TIMELINE_COLORS), labels=[name for _, name in TIMELINE_PARTS],
            display_legend=False, scales=scales, padding=0.2, stroke="white", opacity_mode="auto",
        )
        self.separators = bq.Lines(x=[], y=[], colors=["#9e9e9e"], line_style="dotted", stroke_width=1,
                                   scales=scales, display_legend=False)
        self.capacity = bq.Lines(x=[], y=[], colors=[OOM_COLOR], line_style="dashed", stroke_width=2,
                                 labels=["GPU memory"], display_legend=False, scales=scales)
        self.capacity_label = bq.Label(x=[], y=[], text=[], colors=[OOM_COLOR], align="start", default_size=11,
                                       y_offset=-7, x_offset=2, scales=scales)
        self.peak_marker = bq.Scatter(x=[], y=[], marker="triangle-down", colors=["#222222"], default_size=48,
                                      scales=scales, display_legend=False)
        self.peak_label = bq.Label(x=[], y=[], text=[], colors=["#222222"], align="middle", default_size=12,
                                   font_weight="bold", y_offset=-14, scales=scales)
        self.tooltip_html = w.HTML(layout=w.Layout(max_width="420px"))
        self.bars.tooltip = self.tooltip_html
        self.bars.interactions = {"hover": "tooltip"}
        self.bars.on_hover(self._on_hover)
        self.legend = w.HTML()
        self._view: StepView | None = None
        axes = [
            bq.Axis(scale=self.x_scale, label="phase of one training step (points in step order)",
                    label_offset="36px", tick_style=_X_TICKS, tick_values=[], grid_lines="none"),
            bq.Axis(scale=self.y_scale, side="left", label="GiB per GPU", tick_format=GIB_TICKS,
                    label_offset="45px", grid_lines="dashed"),
        ]
        self.measured = bq.Lines(x=[], y=[], colors=[MEASURED_COLOR], line_style="dashed", stroke_width=2,
                                 display_legend=False, scales=scales)
        self.measured_label = bq.Label(x=[], y=[], text=[], colors=[MEASURED_COLOR], align="start", default_size=11,
                                       y_offset=14, x_offset=2, scales=scales)
        self._measured: tuple[float, str] | None = None
        self._edges: list[float] = []
        super().__init__(**_figure("Memory over one step (GiB per GPU)",
                                   [self.bars, self.separators, self.capacity, self.capacity_label,
                                    self.peak_marker, self.peak_label, self.measured, self.measured_label], axes))
        self.fig_margin = {**_MARGIN, "right": _TIMELINE_RIGHT_PX}

    def show_measured(self, gib: float | None, label: str = "") -> None:
        """Draw (or, with None, remove) a dashed line at a memory figure measured in a log (GiB), labelled."""
        self._measured = (float(gib), label) if gib else None
        self._draw_measured()

    def _draw_measured(self) -> None:
        _draw_measured_line(self, self._edges, 1.15)

    def update(self, view: StepView) -> None:
        self._view = view
        n = len(view.labels)
        x = np.arange(n, dtype=float)
        cap = float(view.capacity_gib)
        peak = float(view.total_gib.max(initial=0.0))
        top = nice_ceiling(max(peak, cap) * 1.15)
        assign(self, title=f"Memory over one step: {view.variant} (GiB per GPU)")
        assign(self.x_scale, min=-0.5, max=max(n - 0.5, 0.5))
        assign(self.y_scale, max=top)
        # the labels first, in their own message: bqplot redraws the ticks for new tick_values in a d3 transition
        # that writes the text with the formatter of that moment, after any redraw the labels' own change makes
        assign(self.axes[0], tick_labels={_tick_key(pos): text for pos, text in view.ticks})
        assign(self.axes[0], tick_values=np.array([pos for pos, _ in view.ticks], dtype=float))
        assign(self.bars, x=x, y=view.gib)
        edges = [-0.5, max(n - 0.5, 0.5)]
        self._edges = edges
        self._draw_measured()
        assign(self.capacity, x=edges, y=[cap, cap], labels=[f"GPU memory ({cap:.0f} GiB)"])
        assign(self.capacity_label, x=edges[:1], y=[cap], text=[f"GPU {cap:.0f} GiB"])
        if view.boundaries:
            assign(self.separators, x=np.array([[b, b] for b in view.boundaries], dtype=float),
                   y=np.array([[0.0, top] for _ in view.boundaries], dtype=float), visible=True)
        else:
            assign(self.separators, visible=False)
        at = view.peak_index
        colour = OOM_COLOR if not view.fits else RISKY_COLOR if view.risky else "#222222"
        if 0 <= at < n:
            align = "end" if at >= n - 2 else "start" if at <= 1 else "middle"
            offset = 12 if align == "end" else -12 if align == "start" else 0
            assign(self.peak_marker, x=[float(at)], y=[float(view.total_gib[at])], colors=[colour])
            assign(self.peak_label, x=[float(at)], y=[float(view.total_gib[at])], text=[view.peak_label],
                   align=align, x_offset=offset, colors=[colour])
        else:
            assign(self.peak_marker, x=[], y=[])
            assign(self.peak_label, x=[], y=[], text=[])
        used = [(TIMELINE_COLORS[t], name) for t, (_, name) in enumerate(TIMELINE_PARTS) if view.gib[t].any()]
        cls = "zp-step-verdict" + (" zp-peak-over" if not view.fits else " zp-peak-risky" if view.risky else "")
        verdict = (f"<div class='{cls}' style='font-size:12px;padding-left:8px'><b>{html.escape(view.variant)}"
                   f"</b>: {html.escape(view.verdict)}. <span class='zp-muted'>The variant is the one "
                   "“Config for” shows.</span></div>" if view.verdict else
                   "<div class='zp-muted'>No step timeline for this variant.</div>")
        legend = legend_html([("box", c, name) for c, name in used]
                             + [("dash", OOM_COLOR, f"GPU memory ({cap:.0f} GiB)")], verdict)
        if self.legend.value != legend:
            self.legend.value = legend

    def _on_hover(self, mark, event) -> None:
        view = self._view
        point = event.get("data") or event.get("point") or {}
        p = point.get("index")
        if view is None or p is None or not (0 <= p < len(view.labels)):
            return
        self.tooltip_html.value = timeline_tooltip(view, int(p))


def largest_limit_text(limit: dict) -> str:
    """The Largest-model table's "limited by" cell: :func:`zeroplanner.planner.largest_limit_text` (the CLI's
    words)."""
    from ..planner import largest_limit_text as text

    return text(limit)
