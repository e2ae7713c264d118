"""The planner's controls and verdict in Debian Chromium (Voilà on 127.0.0.1, Playwright), at 1440 x 900 (three
columns) and 800 x 900 (one column). Each test runs at both sizes, on one page per size.

- Every slider track is at least 180 px long (the label sits above the track in the 300 px controls column).
- No control label, tab title, button or section title is cut (scrollWidth <= clientWidth), Advanced open.
- Nodes steps over powers of two: dragging the handle to 4, 2, 1 gives three different node counts, and a value
  typed into the readout (3) is kept; a visible line says that the numbers take typed values.
- The verdict shows its headline and its first warning without scrolling inside it.
- The GPU and Network menus say "(custom)" once a slider leaves their preset, and the preset again when the value
  is typed back; the network controls say why they do nothing at one node.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import BAD_CONSOLE, open_page  # noqa: E402
from .test_browser import set_slider, widget  # noqa: E402

VIEWPORTS = ({"width": 1440, "height": 900}, {"width": 800, "height": 900})
WARNED = "?model=llama-2-70b&nodes=4&network=eth-25g"
"""A link whose verdict has two long warnings, advice and assumptions (the tallest verdict of the tests)."""
SAMPLES_PER_NODE = 64
"""train_batch_size per node of the default scenario: 8 GPUs x micro-batch 1 x 8 accumulation steps."""


@pytest.fixture(scope="module", params=VIEWPORTS, ids=lambda v: f"{v['width']}x{v['height']}")
def page(request, browser, app_url):
    ctx, pg = open_page(browser, app_url, request.param)
    pg.zp_viewport = request.param
    pg.wait_for_timeout(500)
    yield pg
    bad = [m for m in pg.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
    ctx.close()
    assert not bad, bad


def open_advanced(pg) -> None:
    header = pg.locator(".zp-controls .jupyter-widget-Collapse-header", has_text="Advanced")
    if "Advanced" in pg.locator(".zp-controls").inner_text() and not pg.locator(
            ".zp-controls .widget-label", has_text=re.compile("^Precision$")).count():
        header.click()
    pg.locator(".zp-controls .widget-label", has_text=re.compile("^Precision$")).wait_for(timeout=20_000)
    pg.wait_for_timeout(300)


def wait_batch(pg, nodes: int) -> None:
    """Wait until the config preview's train_batch_size is that of ``nodes`` nodes (the scenario's node count)."""
    pg.wait_for_function("n => document.querySelector('.zp-config textarea').value"
                         ".includes('\"train_batch_size\": ' + n + ',')", arg=SAMPLES_PER_NODE * nodes,
                         timeout=20_000)


def shown_option(pg, label: str) -> str:
    return widget(pg, "widget-dropdown", label).locator("select").evaluate(
        "s => s.options[s.selectedIndex].textContent")


TRACKS_JS = """() => [...document.querySelectorAll('.zp-app .widget-slider')].filter(s => s.offsetParent !== null)
  .map(s => ({label: (s.querySelector('.widget-label') || {}).textContent || '',
              track: s.querySelector('.noUi-target').getBoundingClientRect().width}))"""


def test_every_slider_track_is_at_least_180_px(page):
    open_advanced(page)
    tracks = page.evaluate(TRACKS_JS)
    assert len(tracks) >= 9, tracks  # 5 main sliders, MFU, 3 bucket sliders
    short = [t for t in tracks if t["track"] < 180]
    assert not short, f"slider tracks under 180 px at {page.zp_viewport}: {short}"


CUT_JS = """() => {
  const sel = ['.widget-label', '.widget-label-basic', '.lm-TabBar-tabLabel', '.jupyter-widget-Collapse-header',
               'button', '.widget-toggle-button'].map(s => '.zp-app ' + s).join(', ');
  return [...document.querySelectorAll(sel)].filter(e => e.offsetParent !== null && e.textContent.trim())
    .map(e => ({text: e.textContent.trim().slice(0, 60), cls: String(e.className).slice(0, 60),
                scroll: e.scrollWidth, client: e.clientWidth}));
}"""


def test_no_control_label_tab_title_or_button_is_cut(page):
    open_advanced(page)
    labels = page.evaluate(CUT_JS)
    texts = {item["text"] for item in labels}
    assert {"Gradient accumulation", "CPU-Adam params/s/node", "4-bit storage (quant_storage)", "Nodes",
            "Memory per GPU", "DeepSpeed JSON"} <= texts, sorted(texts)
    cut = [item for item in labels if item["scroll"] > item["client"]]
    assert not cut, f"cut labels at {page.zp_viewport}: {cut}"


def test_a_line_says_the_numbers_take_typed_values(page):
    hint = page.locator(".zp-controls .zp-hint")
    assert hint.is_visible() and re.search(r"type", hint.inner_text(), re.I), hint.inner_text()
    box = hint.bounding_box()
    assert box["height"] > 0 and box["y"] + box["height"] <= page.zp_viewport["height"], box  # above the fold
    readout = widget(page, "widget-slider", "Nodes").locator(".widget-readout")
    assert readout.get_attribute("contenteditable") == "true"
    assert readout.evaluate("e => getComputedStyle(e).borderTopStyle") == "solid"  # drawn as a box


def test_dragging_nodes_to_4_2_1_gives_three_node_counts_and_a_typed_3_is_kept(page):
    set_slider(page, "Nodes", 1)
    wait_batch(page, 1)
    slider = widget(page, "widget-slider", "Nodes")
    handle, track = slider.locator(".noUi-handle"), slider.locator(".noUi-target")
    track.scroll_into_view_if_needed()
    seen = []
    for nodes in (4, 2, 1):
        h, t = handle.bounding_box(), track.bounding_box()
        page.mouse.move(h["x"] + h["width"] / 2, h["y"] + h["height"] / 2)
        page.mouse.down()
        # the track spans exponents 0..7 of base 2 (1..128 nodes); the handle's centre marks its value
        x = t["x"] + t["width"] * {1: 0, 2: 1, 4: 2}[nodes] / 7
        page.mouse.move(x, h["y"] + h["height"] / 2, steps=8)
        page.mouse.up()
        wait_batch(page, nodes)
        seen.append(slider.locator(".widget-readout").inner_text())
    assert seen == ["4", "2", "1"]
    set_slider(page, "Nodes", 3)  # not a power of two: typed values stay what was typed
    wait_batch(page, 3)
    assert slider.locator(".widget-readout").inner_text() == "3"


def test_the_network_says_why_it_does_nothing_at_one_node(page):
    set_slider(page, "Nodes", 1)
    wait_batch(page, 1)
    note = page.locator(".zp-controls .zp-no-effect", has_text="no effect at 1 node")
    note.wait_for(timeout=20_000)
    assert "Network" in note.inner_text() and note.is_visible()
    assert "zp-inactive" in widget(page, "widget-slider", "Network Gb/s / node").get_attribute("class")
    set_slider(page, "Nodes", 2)
    wait_batch(page, 2)
    note.wait_for(state="detached", timeout=20_000)
    for kind, label in (("widget-slider", "Network Gb/s / node"), ("widget-dropdown", "Network")):
        page.wait_for_function("e => !e.classList.contains('zp-inactive')",
                               arg=widget(page, kind, label).element_handle(), timeout=20_000)


def test_presets_say_custom_when_a_slider_leaves_them(page):
    assert shown_option(page, "GPU") == "A100-80GB" and shown_option(page, "Network") == "ib-hdr"
    set_slider(page, "GPU memory (GiB)", 40)
    page.wait_for_function("() => [...document.querySelectorAll('.zp-controls select')]"
                           ".some(s => s.options[s.selectedIndex].textContent === '(custom)')", timeout=20_000)
    assert shown_option(page, "GPU") == "(custom)"
    set_slider(page, "GPU memory (GiB)", 79.1)  # the preset's memory again
    page.wait_for_function("() => ![...document.querySelectorAll('.zp-controls select')]"
                           ".some(s => s.options[s.selectedIndex].textContent === '(custom)')", timeout=20_000)
    assert shown_option(page, "GPU") == "A100-80GB"
    set_slider(page, "Network Gb/s / node", 100)
    page.wait_for_function("() => [...document.querySelectorAll('.zp-controls select')]"
                           ".some(s => s.options[s.selectedIndex].textContent === '(custom)')", timeout=20_000)
    assert shown_option(page, "Network") == "(custom)"
    widget(page, "widget-dropdown", "Network").locator("select").select_option("ib-hdr")  # the preset again
    gbps = widget(page, "widget-slider", "Network Gb/s / node").locator(".widget-readout")
    page.wait_for_function("e => e.textContent.trim() === '200.0'", arg=gbps.element_handle(), timeout=20_000)
    assert shown_option(page, "Network") == "ib-hdr"


VERDICT_JS = """() => {
  const v = document.querySelector('.zp-app .zp-verdict');
  const r = e => { const b = e.getBoundingClientRect(); return {top: b.top, bottom: b.bottom}; };
  const first = v.querySelector('.zp-warnings li');
  return {box: r(v), scrollTop: v.scrollTop, scrollHeight: v.scrollHeight, clientHeight: v.clientHeight,
          headline: r(v.querySelector('.zp-headline')), warning: first ? r(first) : null,
          text: v.innerText};
}"""


def test_the_default_verdict_needs_no_inner_scrolling(page):
    data = page.evaluate(VERDICT_JS)
    assert re.search(r"Recommended: ZeRO-\d", data["text"]), data["text"]
    assert data["scrollHeight"] <= data["clientHeight"], data


def test_the_headline_and_first_warning_are_inside_the_verdicts_visible_box(page, browser, app_url):
    ctx, pg = open_page(browser, app_url + WARNED, page.zp_viewport)
    try:
        pg.wait_for_timeout(500)
        data = pg.evaluate(VERDICT_JS)
    finally:
        ctx.close()
    assert data["warning"] is not None, data["text"]
    box = data["box"]
    visible_bottom = box["top"] + data["clientHeight"] + 0.5
    assert data["scrollTop"] == 0
    for part in ("headline", "warning"):
        assert box["top"] - 0.5 <= data[part]["top"] and data[part]["bottom"] <= visible_bottom, (part, data)
