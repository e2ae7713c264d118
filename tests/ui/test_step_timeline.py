"""Memory over one training step (issue 27 item 6): the "Over one step" tab's view and chart follow the estimate's
``step_peak`` timeline for the config preview's variant, the verdict carries the headroom line (with the "risky"
wording when the headroom is below the model's error), and the report draws the timeline."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("bqplot")

from zeroplanner.costmodel import estimate  # noqa: E402
from zeroplanner.report import build_report, report_parts, timeline_ticks  # noqa: E402
from zeroplanner.scenarios import build_scenario, default_scenario  # noqa: E402
from zeroplanner.ui import PlannerApp  # noqa: E402
from zeroplanner.ui.state import (  # noqa: E402
    PHASE_TICKS,
    TIMELINE_PARTS,
    default_state,
    derive,
    state_from_scenario,
    step_peak_html,
    step_view,
)
from zeroplanner.units import GIB  # noqa: E402

PHASES = ("forward", "loss forward", "loss backward", "backward", "optimizer step")


def _variant_estimate(view, label):
    return view.memory.estimates[view.memory.labels.index(label)]


def _assert_view_is_the_estimate(sv, est):
    peak = est.step_peak
    points = peak.timeline
    assert sv.labels == tuple(p.label for p in points) and sv.phases == tuple(p.phase for p in points)
    for p, point in enumerate(points):
        for t, (key, _) in enumerate(TIMELINE_PARTS):
            assert sv.gib[t, p] * GIB == pytest.approx(point.bytes.get(key, 0), abs=1.0), (p, key)
        assert sv.total_gib[p] * GIB == pytest.approx(point.total, rel=1e-9)
    assert sv.peak_phase == peak.phase and sv.peak_gib * GIB == pytest.approx(peak.bytes)
    assert sv.phases[sv.peak_index] == peak.phase
    assert sv.total_gib[sv.peak_index] * GIB == pytest.approx(peak.bytes, rel=1e-9)
    assert sv.verdict == peak.verdict() and sv.risky == peak.risky
    assert sv.peak_label == f"peak {peak.bytes / GIB:.1f} GiB in {peak.phase}"


def test_the_step_view_is_the_estimates_timeline_for_the_chosen_variant():
    view = derive(default_state())
    _assert_view_is_the_estimate(view.step, view.plan.estimate)  # Recommended by default
    assert view.step.variant == "Recommended"
    # one tick per phase group, in step order, each inside its points; boundaries between the groups
    names = [text for _, text in view.step.ticks]
    assert names == list(dict.fromkeys(PHASE_TICKS[p] for p in view.step.phases))
    assert all(0 <= pos <= len(view.step.labels) - 1 for pos, _ in view.step.ticks)
    assert len(view.step.boundaries) == len(names) - 1
    for label in ("ZeRO-1", "ZeRO-3"):
        sv = step_view(view.plan, label)
        assert sv.variant == label
        _assert_view_is_the_estimate(sv, _variant_estimate(view, label))


def test_the_chart_draws_the_view_and_follows_variant_and_slider_changes():
    app = PlannerApp()
    assert "step" not in app._charts  # built when its tab opens
    app.show_tab("step")
    chart = app.step_chart
    assert app._tab_boxes[app.tab_index("step")].children[0] is chart

    def check():
        sv = app.view.step
        assert np.allclose(np.asarray(chart.bars.y), sv.gib)
        assert list(chart.peak_label.text) == [sv.peak_label]
        assert "peak" in sv.peak_label and sv.peak_phase in sv.peak_label and sv.peak_phase in PHASES
        assert list(chart.peak_marker.x) == [sv.peak_index]
        assert float(chart.peak_marker.y[0]) == pytest.approx(sv.total_gib[sv.peak_index])
        assert list(chart.capacity.y) == [pytest.approx(sv.capacity_gib)] * 2
        assert chart.y_scale.max >= max(sv.capacity_gib, float(sv.total_gib.max()))
        assert sorted(chart.axes[0].tick_labels.values()) == sorted(text for _, text in sv.ticks)
        assert sv.variant in chart.title and sv.verdict in chart.legend.value
        return sv

    before = check()
    app.set(config_variant="ZeRO-3")
    zero3 = check()
    assert zero3.variant == "ZeRO-3" and not np.allclose(zero3.gib, before.gib)
    app.set(nodes=4)
    four = check()
    assert not np.allclose(four.gib, zero3.gib)  # a slider change redraws it
    _assert_view_is_the_estimate(four, _variant_estimate(app.view, "ZeRO-3"))


def test_the_hidden_timeline_is_not_redrawn_and_catches_up_when_opened():
    app = PlannerApp()
    app.show_tab("step")
    before = np.asarray(app.step_chart.bars.y).copy()
    app.show_tab("memory")
    app.set(nodes=4)
    assert np.array_equal(np.asarray(app._charts["step"].bars.y), before) and "step" in app._stale
    app.show_tab("step")
    assert not np.array_equal(np.asarray(app._charts["step"].bars.y), before)
    assert np.allclose(np.asarray(app._charts["step"].bars.y), app.view.step.gib)


def test_checkpointing_moves_the_peak_of_a_fixed_variant():
    app = PlannerApp()
    app.set(config_variant="ZeRO-2", checkpointing="none")
    app.show_tab("step")
    none = app.view.step
    app.set(checkpointing="full")
    full = app.view.step
    assert full.peak_gib < none.peak_gib
    loss = [i for i, ph in enumerate(full.phases) if ph == "loss backward"]
    act = [k for k, _ in TIMELINE_PARTS].index("activations")
    assert full.gib[act, loss].max() < none.gib[act, loss].max()  # checkpointing shrinks the loss's activations
    assert list(app.step_chart.peak_label.text) == [full.peak_label]


def test_the_verdict_carries_the_headroom_line_and_says_risky():
    view = derive(default_state())
    peak = view.plan.estimate.step_peak
    assert peak.verdict() in view.banner_html.replace("&#x27;", "'")
    assert "zp-step-peak" in view.banner_html
    risky = view.plan.estimate.model_copy(update={"step_peak": peak.model_copy(update={"risky": True})})
    line = step_peak_html(risky)
    assert "risky" in line and "zp-peak-risky" in line
    over = view.plan.estimate.model_copy(update={"step_peak": peak.model_copy(
        update={"headroom_bytes": -GIB, "risky": True})})
    assert "does not fit" in step_peak_html(over) and "zp-peak-over" in step_peak_html(over)
    # nothing fits: the line is the requested scenario's
    nothing = derive(state_from_scenario(build_scenario(model="llama-3.1-405b", cpu_memory_gib=64)))
    assert not nothing.plan.fits
    assert "Your settings over one step" in nothing.banner_html and "does not fit" in nothing.banner_html
    assert nothing.step.variant.startswith("your settings") and not nothing.step.fits


def test_the_report_draws_the_timeline_with_its_peak():
    scenario = default_scenario()
    d = report_parts(scenario)
    est = d["plan"].estimate
    assert d["step_peak"] == est.step_peak.verdict()
    svg = d["step_svg"]
    assert svg.startswith("<svg") and f"in the {est.step_peak.phase}" in svg and ">peak</text>" in svg
    for tick in timeline_ticks(est.step_peak.timeline):
        assert f">{tick}</text>" in svg
    assert [p for p, _ in d["phase_peaks"]] == list(dict.fromkeys(p.phase for p in est.step_peak.timeline))
    page = build_report(scenario, "html")
    assert "class=\"chart step\"" in page and "class='step-peak'" in page and "step-phases" in page
    markdown = build_report(scenario, "markdown")
    assert "![Memory over one step](data:image/svg+xml;base64," in markdown and "**Over one step:**" in markdown


def test_timeline_ticks_are_short_and_distinct():
    ticks = timeline_ticks(estimate(default_scenario()).step_peak.timeline)
    assert len(set(ticks)) == len(ticks) and max(map(len, ticks)) <= 10
    assert ticks[0] == "fwd 1/4" and ticks[-1] == "opt step"
