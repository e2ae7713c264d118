"""What one slider change sends to the page: the chart on screen and the verdict first, the config preview after
(in the follow-up), and nothing for a widget whose value did not change.

Counted with ``ipywidgets.Widget._send`` (each call is one comm message to the browser); benchmarks/bench_app.py
counts the same messages in the real page (websocket frames, kernel status messages included).
"""

from __future__ import annotations

import asyncio
import html
import json

import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

from ipywidgets.widgets.widget import Widget

from zeroplanner.deepspeed import to_deepspeed_config
from zeroplanner.planner import plan as make_plan
from zeroplanner.scenarios import build_scenario
from zeroplanner.ui import PlannerApp
from zeroplanner.ui import app as app_module


@pytest.fixture()
def sent(monkeypatch):
    """The widgets that sent a state update, in order, with the trait names each message carried."""
    log: list[tuple[Widget, tuple[str, ...]]] = []
    original = Widget._send

    def record(self, msg, buffers=None):
        if msg.get("method") == "update":
            log.append((self, tuple(sorted(msg.get("state", {})))))
        return original(self, msg, buffers)

    monkeypatch.setattr(Widget, "_send", record)
    return log


def test_a_node_change_sends_chart_and_verdict_before_the_config_preview(sent):
    app = PlannerApp(debounce_seconds=0.05)
    slider = app.controls.widgets["nodes"]
    before_text = app.config_area.value
    seen_before_follow_up: list = []
    sent.clear()

    async def change():
        slider.value = slider.value + 3
        seen_before_follow_up.extend(w for w, _ in sent)  # the follow-up has not run: it waits on the loop
        await asyncio.sleep(app_module.FOLLOW_UP_DELAY_SECONDS + 0.1)

    asyncio.run(change())
    assert app.memory_chart.bars in seen_before_follow_up and app.banner in seen_before_follow_up
    assert app.config_area not in seen_before_follow_up
    widgets = [w for w, _ in sent]
    assert app.config_area in widgets  # sent by the follow-up
    assert app.config_area.value != before_text  # train_batch_size follows the data-parallel degree
    assert json.loads(app.config_area.value) == to_deepspeed_config(make_plan(app.state.scenario).scenario)


def test_the_config_buttons_are_not_resent_when_only_the_config_text_changes(sent):
    app = PlannerApp()
    sent.clear()
    app.controls.widgets["nodes"].value = 5
    widgets = [w for w, _ in sent]
    assert app.config_area in widgets
    assert app.config_actions not in widgets  # Download / Copy read the preview's text in the browser
    assert "querySelector('.zp-config textarea').value" in html.unescape(app.config_actions.value)


def test_each_message_carries_only_changed_traits_and_each_widget_sends_once(sent):
    app = PlannerApp()
    sent.clear()
    app.controls.widgets["nodes"].value = 5
    widgets = [w for w, _ in sent]
    assert len(widgets) == len(set(map(id, widgets)))  # one message per widget (hold_sync batches its traits)
    bars = [keys for w, keys in sent if w is app.memory_chart.bars]
    assert bars == [("y",)]  # the variants (x) are the same; only the GiB change
    assert app.memory_chart.x_scale not in widgets and app.memory_chart.legend not in widgets


def test_a_change_that_leaves_the_state_as_it_is_costs_no_recompute_and_sends_nothing(sent):
    scenario = build_scenario()
    app = PlannerApp()
    recomputes = app.recomputes
    sent.clear()
    app.set(nodes=scenario.cluster.nodes)  # the value it already has
    assert [w for w, _ in sent] == []
    assert app.recomputes == recomputes


def test_a_slider_change_from_the_page_is_not_echoed_back(monkeypatch):
    """The page's own slider change (``set_state``, as a comm message from the page applies it) sends no
    ``echo_update`` back (ipywidgets 8 echoes every synced trait not tagged ``echo_update=False``); a stock slider
    does; a value the slider's bounds clamp is still sent back, as an ``update``."""
    import ipywidgets as w
    from ipywidgets.widgets import widget as widget_module

    monkeypatch.setattr(widget_module, "JUPYTER_WIDGETS_ECHO", True)  # the default; JUPYTER_WIDGETS_ECHO=0 is off
    methods: list[tuple[Widget, str]] = []
    original = Widget._send

    def record(self, msg, buffers=None):
        methods.append((self, msg.get("method")))
        return original(self, msg, buffers)

    monkeypatch.setattr(Widget, "_send", record)
    app = PlannerApp(debounce_seconds=0)
    sliders = [widget for widget in app.controls.widgets.values()
               if isinstance(widget, (w.IntSlider, w.FloatSlider, w.FloatLogSlider))]
    assert {"FloatSlider", "FloatLogSlider"} <= {type(s).__name__ for s in sliders}  # nodes: a log slider
    nodes = app.controls.widgets["nodes"]
    methods.clear()
    nodes.set_state({"value": nodes.value + 1})
    assert not [m for widget, m in methods if m == "echo_update"]
    assert app.state.scenario.cluster.nodes == nodes.value  # the change reached the planner
    methods.clear()
    top = nodes.base ** nodes.max  # a log slider's max is an exponent
    nodes.set_state({"value": top + 100})
    assert nodes.value == top and (nodes, "update") in methods
    stock = w.IntSlider(value=1, min=0, max=10)
    methods.clear()
    stock.set_state({"value": 2})
    assert (stock, "echo_update") in methods
