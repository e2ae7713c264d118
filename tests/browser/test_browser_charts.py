"""The charts, the tutorial's formulas and the config.json upload in Debian Chromium (Voilà on 127.0.0.1,
Playwright), at 1440 x 900 and 800 x 900: what a new user reported.

- No tick label of any chart is written with an exponent ("3e+3" on the step-time axis of a 70B model on 25 Gb/s
  Ethernet): plain digits with separators, or SI prefixes named in the axis label.
- The Compare tab's legends lie outside the plot areas (bqplot drew them over the bars).
- Every scaling line shows: its markers lie inside the plot (the first node count sat on the plot's edge, under the
  current-nodes line) and markers of lines that coincide are spread apart, not drawn over each other.
- A 12 MB config.json is refused in the page with the CLI's size message and the page keeps working.
- The tutorial's formula blocks fit the window (they scroll inside their own box) and the page does not scroll
  sideways.
- The capacity labels of the memory and host-RAM charts lie whole inside the plot ("node 1024 G" was cut).
- The page logs no "Unsatisfied version" warning on load (expected to fail with Voila 0.5.13: see the test).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import serve_app  # noqa: E402
from .test_browser import config_text, set_slider, wait_changed  # noqa: E402
from .test_browser_layout import upload, visible_figure  # noqa: E402

VIEWPORTS = [{"width": 1440, "height": 900}, {"width": 800, "height": 900}]
SLOW_NETWORK = "?model=llama-2-70b&nodes=4&network=eth-25g"
"""A 70B model on 4 nodes of 25 Gb/s Ethernet: steps of thousands of seconds (".3~g" wrote "3e+3")."""
EXPONENT = re.compile(r"\d[eE][+-]?\d")
CHART_TABS = ("Memory per GPU", "Over one step", "Step time", "Host RAM", "Scaling")


def _ids(v: dict) -> str:
    return f"{v['width']}x{v['height']}"


@pytest.fixture(scope="module", params=VIEWPORTS, ids=_ids)
def slow_page(request, browser, app_url):
    """The planner on :data:`SLOW_NETWORK`, at each viewport."""
    from ..browserkit import open_page

    ctx, pg = open_page(browser, app_url + SLOW_NETWORK, request.param)
    pg.wait_for_timeout(500)
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def tutorial_url(tmp_path_factory):
    """``zeroplanner app --page tutorial`` (notebooks/zero_tutorial.ipynb)."""
    with serve_app(("--page", "tutorial"), log_path=tmp_path_factory.mktemp("voila-tutorial") / "server.log",
                   timeout=60.0) as server:
        yield server.url


TICK_TEXTS_JS = """fig => [...fig.querySelectorAll('g.axis .tick text')].map(t => t.textContent.trim())
                     .filter(t => t !== '')"""


def _open_tab(pg, name: str):
    pg.get_by_role("tab", name=name).click()
    fig = visible_figure(pg)
    fig.locator("svg .tick text").first.wait_for(timeout=30_000)
    pg.wait_for_timeout(300)
    return fig


def test_no_tick_label_is_written_with_an_exponent(slow_page):
    seen = {}
    for tab in CHART_TABS:
        ticks = _open_tab(slow_page, tab).evaluate(TICK_TEXTS_JS)
        assert ticks, tab
        seen[tab] = ticks
    slow_page.get_by_role("tab", name="Compare").click()
    slow_page.get_by_role("button", name="Pin current").click()
    slow_page.locator(".zp-compare-panel .bqplot svg .bargroup rect").first.wait_for(timeout=30_000)
    slow_page.wait_for_timeout(500)
    for i, fig in enumerate(slow_page.locator(".zp-compare-panel .bqplot").all()):
        seen[f"compare {i}"] = fig.evaluate(TICK_TEXTS_JS)
    bad = {tab: [t for t in ticks if EXPONENT.search(t)] for tab, ticks in seen.items()}
    assert not any(bad.values()), (bad, seen)
    step = seen["Step time"]
    assert any("," in t for t in step), step  # thousands of seconds, written "1,000"
    slow_page.get_by_role("button", name="Unpin").click()
    slow_page.get_by_role("tab", name="Memory per GPU").click()


LEGEND_JS = """panel => [...panel.querySelectorAll('.bqplot')].map(fig => {
  const r = e => { const b = e.getBoundingClientRect(); return {x: b.x, y: b.y, w: b.width, h: b.height}; };
  const column = fig.parentElement;
  return {plot: r(fig.querySelector('rect.plotarea_background')),
          legends: [...column.querySelectorAll('.zp-compare-legend')].map(r),
          svg_legends: [...fig.querySelectorAll('g.g_legend')].map(r).filter(b => b.w > 0 && b.h > 0)};
})"""


def _apart(a: dict, b: dict) -> bool:
    return (a["x"] + a["w"] <= b["x"] + 0.5 or b["x"] + b["w"] <= a["x"] + 0.5
            or a["y"] + a["h"] <= b["y"] + 0.5 or b["y"] + b["h"] <= a["y"] + 0.5)


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=_ids)
def test_compare_legends_lie_outside_the_plot_areas(browser, app_url, viewport):
    from ..browserkit import open_page

    ctx, pg = open_page(browser, app_url, viewport)
    try:
        pg.get_by_role("tab", name="Compare").click()
        pg.get_by_role("button", name="Pin current").click()
        panel = pg.locator(".zp-compare-panel")
        panel.locator(".bqplot svg .bargroup rect").first.wait_for(timeout=30_000)
        pg.wait_for_timeout(500)
        figures = panel.evaluate(LEGEND_JS)
    finally:
        ctx.close()
    assert len(figures) == 2, figures
    for fig in figures:
        assert fig["svg_legends"] == [], fig  # bqplot's own legend (drawn inside the plot) is off
        assert len(fig["legends"]) == 1 and fig["legends"][0]["h"] > 0, fig
        assert _apart(fig["legends"][0], fig["plot"]), f"legend {fig['legends'][0]} covers the plot {fig['plot']}"


DOTS_JS = """fig => {
  const p = fig.querySelector('rect.plotarea_background').getBoundingClientRect();
  const dots = [...fig.querySelectorAll('svg path.dot')].filter(d => {
    const s = getComputedStyle(d); return s.display !== 'none' && s.visibility !== 'hidden' && d.closest('g[visibility=hidden]') === null;
  }).map(d => { const b = d.getBoundingClientRect();
                return {x: b.x + b.width / 2, y: b.y + b.height / 2, w: b.width, fill: getComputedStyle(d).fill}; })
    .filter(d => d.w > 0);
  return {plot: {x: p.x, y: p.y, w: p.width, h: p.height}, dots};
}"""


def _expected_scaling(query: str = "") -> tuple[int, int]:
    """(points drawn in all, points of the Recommended line) for the page's scenario, from the same chart code."""
    import os

    from zeroplanner.ui import PlannerApp

    os.environ.pop("QUERY_STRING", None)
    app = PlannerApp(debounce_seconds=0)
    app.show_tab("scaling")
    lines = [line for line in app.scaling_chart.lines if line.visible]
    return sum(len(line.x) for line in lines), len(app.scaling_chart.lines[0].x)


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=_ids)
def test_every_scaling_line_and_point_is_drawn_apart(browser, app_url, viewport):
    from ..browserkit import open_page

    ctx, pg = open_page(browser, app_url, viewport)
    try:
        data = _open_tab(pg, "Scaling").evaluate(DOTS_JS)
    finally:
        ctx.close()
    total, recommended = _expected_scaling()
    dots, plot = data["dots"], data["plot"]
    assert len(dots) == total, (len(dots), total)
    black = [d for d in dots if d["fill"] in ("rgb(0, 0, 0)", "#000000")]  # the Recommended line (LINE_COLORS[0])
    assert len(black) == recommended >= 8, black
    for d in dots:  # whole markers inside the plot: none on its edge, half clipped
        assert plot["x"] + 2 <= d["x"] <= plot["x"] + plot["w"] - 2, (d, plot)
        assert plot["y"] + 2 <= d["y"] <= plot["y"] + plot["h"] - 2, (d, plot)
    for i, a in enumerate(dots):  # markers of different lines never drawn on top of each other
        for b in dots[i + 1:]:
            if a["fill"] != b["fill"]:
                assert np.hypot(a["x"] - b["x"], a["y"] - b["y"]) >= 4.0, (a, b)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("viewport", VIEWPORTS, ids=_ids)
def test_a_12_mb_config_json_gets_the_size_message_and_the_page_keeps_working(browser, app_url, viewport,
                                                                              tmp_path):
    from zeroplanner.catalog.hfconfig import too_large_message

    from ..browserkit import open_page

    big = tmp_path / "big-config.json"
    big.write_text(json.dumps({"model_type": "llama", "pad": "x" * 12_000_000}))
    ctx, pg = open_page(browser, app_url, viewport)
    try:
        pg.get_by_text("Your model: HF config.json", exact=True).click()
        upload(pg, big)
        refused = pg.locator(".zp-hf-message .zp-upload-refused[role=alert]")
        refused.wait_for(timeout=20_000)
        assert refused.inner_text() == (f"Cannot use {big.name}: {too_large_message(big.name, big.stat().st_size)}. "
                                        "The planner keeps the last valid setup.")
        cfg = config_text(pg)
        set_slider(pg, "Nodes", 2)
        assert '"train_batch_size"' in wait_changed(lambda: config_text(pg), cfg)
        assert pg.locator("#zp-session-ended").count() == 0
    finally:
        ctx.close()


FORMULAS_JS = """() => {
  const blocks = [...document.querySelectorAll(
      '.zp-tutorial .zp-explain-formula, .zp-tutorial .zp-explain-numbers, .zp-tutorial mjx-container[display]')]
    .filter(e => e.offsetParent !== null);
  return {inner: innerWidth, scroll: document.scrollingElement.scrollWidth,
          blocks: blocks.map(e => { const b = e.getBoundingClientRect();
            return {cls: e.className || e.tagName, right: b.right, width: b.width, scrolls: e.scrollWidth > e.clientWidth + 1}; })};
}"""


@pytest.mark.parametrize("viewport", VIEWPORTS, ids=_ids)
def test_tutorial_formulas_fit_the_window(browser, tutorial_url, viewport):
    from ..browserkit import open_page

    ctx, pg = open_page(browser, tutorial_url, viewport, wait_for=".zp-tutorial-step .zp-explain")
    try:
        pg.wait_for_selector(".zp-tutorial mjx-container", timeout=60_000)
        pg.wait_for_timeout(1500)  # MathJax typesets every step
        data = pg.evaluate(FORMULAS_JS)
    finally:
        ctx.close()
    assert len(data["blocks"]) >= 16, data
    wide = [b for b in data["blocks"] if b["right"] > data["inner"] + 0.5]
    assert not wide, wide
    assert data["scroll"] <= data["inner"], data["scroll"]
    if viewport["width"] == 800:  # the long substituted formulas scroll inside their own box
        assert any(b["scrolls"] for b in data["blocks"]), data["blocks"]


@pytest.mark.xfail(strict=True, reason=(
    "Voila 0.5.13's page shares JupyterLab 4.2.5 modules (_JUPYTERLAB.CORE_OUTPUT) while the prebuilt extensions "
    "it loads ask for newer ones: jupyterlab_widgets 3.0.17's @jupyter-widgets/jupyterlab-manager (^4.6.2, 9 "
    "warnings) and Voila's own @voila-dashboards/widgets-manager8 (^4.5.10, 4). Not the widgets' model versions, "
    "which match. The page cannot drop jupyterlab-manager (it registers @jupyter-widgets/base and controls) and no "
    "other release of either is available; this passes, and must be un-marked, once Voila ships a matching page."))
def test_no_unsatisfied_version_warning_on_load(browser, app_url):
    from ..browserkit import open_page

    ctx, pg = open_page(browser, app_url, VIEWPORTS[0])
    try:
        pg.wait_for_timeout(500)
        found = [m for m in pg.zp_console if "Unsatisfied version" in m or "No satisfying version" in m]
    finally:
        ctx.close()
    assert not found, found


CAPACITY_LABEL_JS = """fig => {
  const r = e => { const b = e.getBoundingClientRect(); return {x: b.x, y: b.y, w: b.width, h: b.height}; };
  return {plot: r(fig.querySelector('rect.plotarea_background')),
          labels: [...fig.querySelectorAll('svg text')].filter(t => /^(GPU|node|host RAM) [0-9,]+ GiB$/
                   .test(t.textContent.trim())).map(t => ({text: t.textContent.trim(), ...r(t)}))};
}"""


def test_the_capacity_labels_lie_whole_inside_the_plot(slow_page):
    """The dashed capacity line's label of the memory and host-RAM charts: whole inside the plot area (the host
    chart's "node 1024 GiB" ran past the plot's right edge and was cut to "node 1024 G")."""
    for tab in ("Memory per GPU", "Host RAM"):
        got = _open_tab(slow_page, tab).evaluate(CAPACITY_LABEL_JS)
        assert len(got["labels"]) == 1, (tab, got)
        p, lab = got["plot"], got["labels"][0]
        assert p["x"] - 0.5 <= lab["x"] and lab["x"] + lab["w"] <= p["x"] + p["w"] + 0.5, (tab, got)
    slow_page.get_by_role("tab", name="Memory per GPU").click()
