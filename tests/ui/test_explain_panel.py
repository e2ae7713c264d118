"""Explain mode panel: a clicked bar segment (bqplot element_click payload) shows that term's formula and numbers."""

from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets")
bq = pytest.importorskip("bqplot")

from zeroplanner.costmodel import estimate  # noqa: E402
from zeroplanner.explain import fmt_bytes_text, fmt_seconds_text  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui.explain_panel import ExplainPanel  # noqa: E402
from zeroplanner.ui.tutorial import with_zero  # noqa: E402

BASE = build_scenario(model="llama-2-13b", nodes=2)
VARIANTS = [("ZeRO-2", with_zero(BASE, 2)), ("ZeRO-3", with_zero(BASE, 3)),
            ("ZeRO-3 + CPU optimizer", with_zero(BASE, 3, "cpu"))]


def test_click_on_a_memory_segment_explains_that_term_of_that_variant():
    panel = ExplainPanel()
    panel.set_variants(VARIANTS)
    # bqplot's element_click content for a stacked bar: the clicked rect's datum
    panel.clicked("memory", {"event": "element_click", "data": {"index": 1, "sub_index": 2, "x": "Z3", "y": 1.0}})
    assert panel.variant.value == "ZeRO-3" and panel.term.value == "optimizer_states"
    shown = fmt_bytes_text(estimate(VARIANTS[1][1]).per_gpu_bytes.optimizer_states)
    assert f"<b class='zp-explain-value'>{shown}</b>" in panel.math.value
    assert "$$M_{opt}" in panel.math.value and "Source:" in panel.math.value


def test_click_on_a_time_segment_explains_it_and_offload_includes_the_optimizer():
    panel = ExplainPanel()
    panel.set_variants(VARIANTS)
    panel.clicked("time", {"event": "element_click", "data": {"index": 0, "sub_index": 1}})
    e = estimate(VARIANTS[0][1])
    assert panel.term.value == "time:communication"
    assert fmt_seconds_text(e.communication.exposed_seconds_per_step) in panel.math.value
    panel.clicked("time", {"event": "element_click", "data": {"index": 2, "sub_index": 2}})
    e = estimate(VARIANTS[2][1])
    assert fmt_seconds_text(e.optimizer_seconds_per_step) in panel.math.value
    assert "Exposed offload time" in panel.math.value and "Optimizer step time" in panel.math.value


def test_hover_then_click_without_sub_index_uses_the_hovered_segment():
    panel = ExplainPanel()
    panel.set_variants(VARIANTS)
    panel._hovered("memory", {"event": "hover", "data": {"index": 2, "subIndex": 3}})  # bqplot 0.13.1's name
    panel.clicked("memory", {"event": "element_click", "index": 2})
    assert panel.variant.value == "ZeRO-3 + CPU optimizer" and panel.term.value == "activations"


def test_out_of_range_clicks_are_ignored_and_variants_follow_the_chart():
    panel = ExplainPanel()
    panel.set_variants(VARIANTS)
    panel.show("ZeRO-3", "buffers")
    panel.clicked("memory", {"data": {"index": 9, "sub_index": 0}})
    assert panel.term.value == "buffers"
    panel.set_variants(VARIANTS[1:])  # the selected variant survives a chart update
    assert panel.variant.value == "ZeRO-3"
    with pytest.raises(KeyError, match="unknown variant"):
        panel.show("ZeRO-9", "buffers")


def test_attach_registers_on_real_bqplot_marks():
    panel = ExplainPanel()
    panel.set_variants(VARIANTS)
    bars = bq.Bars(x=["a", "b", "c"], y=[[1, 2, 3]] * 6, type="stacked",
                   scales={"x": bq.OrdinalScale(), "y": bq.LinearScale()})
    panel.attach(memory_bars=bars)
    # deliver the front end's custom message as the widget would
    bars._handle_custom_msgs(None, {"event": "element_click", "data": {"index": 0, "sub_index": 4}})
    assert panel.variant.value == "ZeRO-2" and panel.term.value == "buffers"
