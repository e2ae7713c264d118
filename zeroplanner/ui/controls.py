"""The planner's input widgets: main controls and the collapsed "Advanced" section.

Each widget is made by :func:`make_widget` from its input's row of :data:`zeroplanner.inputs.INPUTS` (kind,
description, shown range; bounds from the spec field), and shows what :meth:`~zeroplanner.inputs.Input.shown` reads
from the state's scenario. Only the layout (which section, in which order) is written here.

:class:`Controls` builds every widget once and knows two things: how to show a state (:meth:`Controls.show`, which
sets the widgets without reporting changes) and how to report a user's change (``on_change(key, value)`` with the
keys of :data:`zeroplanner.ui.state.SETTERS`). It computes nothing. Sliders use ``continuous_update=False`` so a drag
sends one value, not dozens.

What the controls show besides values are pure functions of the state, called by :meth:`Controls.show`:
:func:`shown_values` (a GPU or network menu says :data:`CUSTOM_PRESET` once a slider leaves its preset, and its
name again when the values match it) and :func:`no_effect_notes` (controls that change nothing in this scenario,
such as the inter-node network at one node: the page says why, next to them).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import ipywidgets as w
from ipywidgets.widgets.widget_bool import CheckboxStyle
from ipywidgets.widgets.widget_description import DescriptionStyle
from ipywidgets.widgets.widget_int import SliderStyle
from ipywidgets.widgets.widget_string import HTMLStyle

from .. import catalog
from ..inputs import BY_CONTROL, Input
from ..specs import Scenario
from ..units import GIB
from .state import CUSTOM_MODEL, AppState

_DESC = {"description_width": "140px"}
SECTIONS = {"training": "Training", "zero": "ZeRO buckets and ZeRO++", "offload": "Offload and host",
            "lora": "LoRA / QLoRA"}
"""The Advanced sections, in order (an input's ``Widget.section`` names one; ``"main"`` is above them)."""
_WIDE = w.Layout(width="97%")
CUSTOM_PRESET = "(custom)"
"""GPU / Network menu entry shown when the scenario's values are no preset's (a slider moved off it, a probed GPU);
choosing it changes nothing, choosing a preset applies it."""
PRESET_KEYS = ("gpu", "network")
TYPE_HINT = "Type a value: click any number (a slider's readout or a box), type, press Enter."
"""The line under the controls' title: readouts and boxes take typed values (3 nodes, 7.5 B parameters)."""
_SLIDER_TOOLTIP = "Drag, use the arrow keys, or click the number and type a value"
NOTE_GROUPS: tuple[tuple[str, ...], ...] = (("network", "inter_node_gbps"), ("freeze_vision", "images_per_sample"))
"""Controls whose no-effect note (:func:`no_effect_notes`) is shown together, under the group's last control."""


class SharedStyles:
    """One Style / Layout model per kind, shared by every control (ipywidgets lets widgets share them): a page
    loads one ``SliderStyle`` instead of one per slider, and one ``Layout`` instead of one per checkbox or note.
    Nothing may mutate these in place; give a widget its own ``Layout`` to change it."""

    def __init__(self, description_width: str = _DESC["description_width"]) -> None:
        self.slider = SliderStyle(description_width=description_width)
        self.description = DescriptionStyle(description_width=description_width)
        self.checkbox = CheckboxStyle()
        self.html_style = HTMLStyle()
        self.wide = w.Layout(width="97%")
        self.plain = w.Layout()

    def style_for(self, kind: str):
        return {"log_slider": self.slider, "int_slider": self.slider, "float_slider": self.slider,
                "checkbox": self.checkbox}.get(kind, self.description)

    def html(self, value: str = "", **kwargs) -> w.HTML:
        """An HTML widget with the shared style and (unless ``layout=`` is given) the shared plain layout."""
        kwargs.setdefault("layout", self.plain)
        return w.HTML(value, style=self.html_style, **kwargs)


def _without_echo(cls: type) -> type:
    """``cls`` (an ipywidgets slider) whose ``value`` is synced without ipywidgets 8's echo: the kernel does not send
    a slider's own new value back to the page (``Widget.set_state`` skips a trait tagged ``echo_update=False``,
    ipywidgets/widgets/widget.py). The page already shows the value; the echo is for other pages viewing the same
    kernel, which a planner page does not have (Voilà gives each visitor a kernel; JupyterLab's views of one output
    share one model). Saves one kernel message per slider change and the page's handling of it: the slider's view
    update, whose readout check (``readout_overflow``, ``scrollWidth``) forces a layout. Measured with the planner
    page served twice, with and without, both open at once, 60 node-slider changes each (benchmarks/bench_app.py's
    method): slider -> chart painted, median 29.4 / 32.6 ms without the echo against 32.7 / 34.8 ms with it.

    The subclass keeps the slider's model and view names, so the page uses the stock slider; its bounds still clamp
    the value (the ``@validate("value")`` of the bounded base classes applies to the re-declared trait)."""
    old = cls.class_traits()["value"]
    metadata = {k: v for k, v in old.metadata.items() if k != "help"}  # help is a constructor argument
    value = type(old)(old.default_value, allow_none=old.allow_none, help=old.help).tag(**metadata, echo_update=False)
    return type(cls.__name__, (cls,), {"value": value, "__module__": __name__,
                                       "__doc__": f"``ipywidgets.{cls.__name__}`` without the echo of its value."})


IntSlider, FloatSlider, FloatLogSlider = (_without_echo(c) for c in (w.IntSlider, w.FloatSlider, w.FloatLogSlider))


def _log_slider(description: str, value: float, lo: float, hi: float, step: float = 0.01, fmt: str = ".3g",
                style: dict = _DESC, layout: w.Layout | None = _WIDE, base: float = 10.0):
    """A slider over exponents of ``base`` (``lo``..``hi`` in values): base 2 with step 1 stops at powers of two,
    and a value typed into its readout is kept as typed (FloatLogSlider clamps it to the range, nothing more)."""
    return FloatLogSlider(value=value, base=base, min=math.log(lo, base), max=math.log(hi, base), step=step,
                          description=description, readout_format=fmt, continuous_update=False, style=style,
                          tooltip=_SLIDER_TOOLTIP, **({} if layout is None else {"layout": layout}))


def widget_options(inp: Input) -> list:
    """A dropdown's options: the row's labels, the catalog's names, or the spec field's choices."""
    spec = inp.widget
    if spec.labels:
        return list(spec.labels)
    if inp.kind == "model":
        return [CUSTOM_MODEL, *catalog.model_names()]
    if inp.kind == "gpu":
        return catalog.gpu_names()
    if inp.kind == "network":
        return catalog.network_names()
    return list(inp.choices)


def make_widget(inp: Input, value: Any, *, style: Any = _DESC, layout: w.Layout | None = _WIDE,
                shared: SharedStyles | None = None, **overrides: Any) -> w.Widget:
    """The widget of one input of :data:`zeroplanner.inputs.INPUTS` (its ``Widget`` row: kind, description,
    shown range), showing ``value`` (widget units). Text boxes are bounded by the spec field's own bounds.
    ``overrides`` replace the row's settings (the tutorial's shorter node slider: ``high=64``)."""
    spec = inp.widget
    if shared is not None:
        style, layout = shared.style_for(spec.kind), shared.wide
    lo = overrides.get("low", spec.low)
    hi = overrides.get("high", spec.high)
    desc = overrides.get("description", spec.description)
    layout_kw = {} if layout is None else {"layout": layout}
    kind = spec.kind
    if kind == "dropdown":
        return w.Dropdown(options=overrides.get("options", widget_options(inp)), value=value, description=desc,
                          style=style, **layout_kw)
    if kind == "checkbox":
        extra = {} if shared is None else {"style": shared.checkbox, "layout": shared.plain}
        return w.Checkbox(value=value, description=desc, indent=False, **extra)
    if kind == "log_slider":
        return _log_slider(desc, value, lo, hi, step=spec.step or 0.01, fmt=spec.fmt or ".3g", style=style,
                           layout=layout, base=spec.base)
    if kind == "int_slider":
        return IntSlider(value=value, min=int(lo), max=int(hi), description=desc, continuous_update=False,
                         style=style, tooltip=_SLIDER_TOOLTIP, **layout_kw)
    if kind == "float_slider":
        return FloatSlider(value=value, min=lo, max=hi, step=spec.step, description=desc,
                           readout_format=spec.fmt or ".2f", continuous_update=False, style=style,
                           tooltip=_SLIDER_TOOLTIP, **layout_kw)
    low, high = inp.low / spec.scale, inp.high / spec.scale
    if kind == "int_text":
        return w.BoundedIntText(value=value, min=int(low), max=int(high), description=desc, style=style,
                                **layout_kw)
    if kind == "float_text":
        return w.BoundedFloatText(value=value, min=low, max=high, description=desc, style=style, **layout_kw)
    raise AssertionError(f"unknown widget kind {kind!r} of input {inp.key}")  # pragma: no cover


def lazy_accordion(panels: list[tuple[str, w.Widget]], layout: w.Layout | None = None) -> w.Accordion:
    """A collapsed ``Accordion`` whose panels are placed in it the first time each is opened.

    Until then each panel is an empty ``VBox``: its widgets exist (their models are on the page, their values
    are set and read as usual) but the page builds no views for them, and a page opens faster. Measured with
    ``benchmarks/bench_app.py``: the Advanced section holds most of the planner's controls. ``layout`` (a shared,
    never mutated ``Layout``) is given to the holders and the accordion so they add no Layout models."""
    kw = {} if layout is None else {"layout": layout}
    holders = [w.VBox([], **kw) for _ in panels]
    accordion = w.Accordion(children=holders, selected_index=None, **kw)
    for i, (title, _) in enumerate(panels):
        accordion.set_title(i, title)

    def opened(change: dict) -> None:
        index = change["new"]
        if index is not None and 0 <= index < len(panels) and not holders[index].children:
            holders[index].children = [panels[index][1]]

    accordion.observe(opened, names="selected_index")
    return accordion


def _same(a: float, b: float, rel: float = 1e-3) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def shown_presets(state: AppState) -> dict[str, str]:
    """What the GPU and Network menus show: the selected preset while the scenario has its values, else
    :data:`CUSTOM_PRESET`. The GPU's memory is compared at the slider's 0.1 GiB (the slider moved off the preset's
    memory: custom; typed back: the preset again); the network's bandwidth per node to 4 digits (the slider's
    readout), its kind, efficiency and latency exactly (a pasted or linked network of its own is custom)."""
    cluster = state.scenario.cluster
    gpu = state.gpu_name if state.gpu_name in catalog.gpu_names() else CUSTOM_PRESET
    if gpu != CUSTOM_PRESET and cluster.gpu_memory_bytes is not None:
        if round(cluster.gpu_memory_bytes / GIB, 1) != round(catalog.gpu(gpu).memory_bytes / GIB, 1):
            gpu = CUSTOM_PRESET
    network = state.network_name if state.network_name in catalog.network_names() else CUSTOM_PRESET
    if network != CUSTOM_PRESET:
        preset, net = catalog.network(network), cluster.network
        if not (_same(net.link_gbps * net.nics_per_node, preset.link_gbps * preset.nics_per_node)
                and (net.kind, net.efficiency, net.latency_seconds)
                == (preset.kind, preset.efficiency, preset.latency_seconds)):
            network = CUSTOM_PRESET
    return {"gpu": gpu, "network": network}


def shown_values(state: AppState) -> dict[str, Any]:
    """Control key -> the value its widget shows for ``state`` (catalog dropdowns show the state's selection, or
    :data:`CUSTOM_PRESET` where a slider left it: :func:`shown_presets`)."""
    values = {key: inp.shown(state.scenario) for key, inp in BY_CONTROL.items()}
    values.update(model=state.model_name, **shown_presets(state))
    return values


def no_effect_notes(scenario: Scenario) -> dict[str, str]:
    """Control key -> why the control changes nothing in ``scenario`` (controls not named have an effect).

    - Network and its Gb/s at one node: every collective stays inside the node (the cost model prices the
      inter-node link only across nodes; the step time is the same for every network).
    - Freeze vision tower, Images / sample on a text-only model (no vision parameters or tokens).

    (4-bit storage without QLoRA is not listed: the specs refuse it, and the page says so when it is set.)
    """
    notes: dict[str, str] = {}
    if scenario.cluster.nodes == 1:
        reason = ("no effect at 1 node (all traffic stays inside the node, on NVLink / PCIe); set Nodes to 2 or "
                  "more to compare networks")
        notes.update(network=reason, inter_node_gbps=reason)
    if not scenario.model.vision_params:
        notes.update(freeze_vision="no effect on a text-only model", images_per_sample="no effect on a text-only "
                     "model")
    return notes


def note_html(keys: tuple[str, ...], notes: dict[str, str]) -> str:
    """The note under a :data:`NOTE_GROUPS` group: the controls without effect and why ('' when all act)."""
    import html

    quiet = [k for k in keys if k in notes]
    if not quiet:
        return ""
    names = ", ".join(BY_CONTROL[k].widget.description for k in quiet)
    return f"<small class='zp-no-effect'>{html.escape(names)}: {html.escape(notes[quiet[-1]])}.</small>"


class Controls(w.VBox):
    """Main controls (model, GPU, cluster, network) and an Advanced accordion (training, ZeRO, offload, LoRA,
    assumptions). ``widgets`` maps each control key to its widget."""

    def __init__(self, state: AppState, on_change: Callable[[str, Any], None]) -> None:
        self._on_change = on_change
        self._quiet = False
        shown = self._shown = shown_values(state)
        self.shared = shared = SharedStyles()
        presets = {key: [CUSTOM_PRESET, *widget_options(BY_CONTROL[key])] for key in PRESET_KEYS}
        self.widgets: dict[str, w.Widget] = {
            key: make_widget(inp, shown[key], shared=shared, **({"options": presets[key]} if key in presets else {}))
            for key, inp in BY_CONTROL.items()}
        for key, widget in self.widgets.items():
            widget.observe(self._make_handler(key), names="value")
        self.notes: dict[tuple[str, ...], w.HTML] = {keys: shared.html() for keys in NOTE_GROUPS}
        for note in self.notes.values():
            note.add_class("zp-note")
        self._inactive: set[str] = set()
        self._show_notes(state.scenario)

        def above(text: str) -> w.HTML:
            return shared.html(f"<code style='font-size:12px;margin-left:8px'>{text}</code>")

        boxes: dict[str, list[w.Widget]] = {name: [] for name in ("main", *SECTIONS)}
        boxes["zero"].append(shared.html("<small>Bucket sizes in elements, as DeepSpeed's keys.</small>"))
        for key, inp in BY_CONTROL.items():  # table order within each section
            box = boxes[inp.widget.section]
            if inp.key == "zero_hpz_partition_size":
                box.append(shared.html(
                    "<small>ZeRO++ (<code>zero_hpz_partition_size</code>, <code>zero_quantized_*</code>): needs "
                    "stage 3 (setting it makes the scenario ZeRO-3) and adds a 'ZeRO-3 + ZeRO++' variant to the "
                    "charts; the planner itself already tries hpZ = GPUs per node with qwZ + qgZ on multi-node "
                    "runs.</small>"))
            if inp.widget.kind == "log_slider" and not inp.widget.description:
                box.append(above(inp.key))  # DeepSpeed's key, too long for a description
            box.append(self.widgets[key])
            box.extend(note for keys, note in self.notes.items() if keys[-1] == key)
        main = w.VBox(boxes["main"])

        def section(title: str, box: w.VBox) -> list[w.Widget]:
            return [shared.html(f"<div style='margin-top:6px;border-bottom:1px solid #ddd'><b>{title}</b></div>"),
                    box]

        self.advanced = w.VBox([x for name, title in SECTIONS.items() for x in section(title, w.VBox(boxes[name]))])
        self.outer = lazy_accordion([("Advanced", self.advanced)], layout=shared.plain)
        self.extra = w.VBox([])
        self.title = shared.html(f"<b>Model and cluster</b><small class='zp-hint'>{TYPE_HINT}</small>")
        super().__init__([self.title, main, self.outer, self.extra],
                         layout=w.Layout(width="380px", min_width="340px", flex="0 0 auto"))
        self.add_class("zp-controls")

    def _make_handler(self, key: str):
        def handler(change: dict) -> None:
            if self._quiet:
                return
            if key in PRESET_KEYS and change["new"] == CUSTOM_PRESET:  # not a preset: nothing to apply
                self.set_values({key: self._shown[key]})
                return
            self._on_change(key, change["new"])

        return handler

    def _show_notes(self, scenario: Scenario) -> None:
        """The no-effect notes (:func:`no_effect_notes`) and the dimmed look (class ``zp-inactive``) of the controls
        they name; a widget whose state is unchanged sends nothing."""
        notes = no_effect_notes(scenario)
        for keys, note in self.notes.items():
            note.value = note_html(keys, notes)
        for key in self._inactive - set(notes):
            self.widgets[key].remove_class("zp-inactive")
        for key in set(notes) - self._inactive:
            self.widgets[key].add_class("zp-inactive")
        self._inactive = set(notes)

    def set_values(self, values: dict[str, Any]) -> None:
        """Set widget values without reporting them as user changes."""
        self._quiet = True
        try:
            for key, value in values.items():
                widget = self.widgets[key]
                if widget.value != value:
                    widget.value = value
        finally:
            self._quiet = False

    def show(self, state: AppState) -> None:
        """Make the widgets show ``state`` (after a model/GPU/network preset or a loaded config changed several
        values at once)."""
        values = self._shown = shown_values(state)
        self.set_values(values)
        self._show_notes(state.scenario)
