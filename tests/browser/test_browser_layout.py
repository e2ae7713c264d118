"""The planner page at 1440 x 900 in Debian Chromium (Voilà on 127.0.0.1, Playwright): one view, readable charts,
bring your own config.json.

- The main sliders, the verdict, the main chart and the DeepSpeed config preview are all inside the viewport
  without scrolling.
- In every chart (each tab opened in turn) no two tick labels overlap and none reaches outside its figure
  (bounding boxes from the DOM); the memory chart's "fits" / "OOM" row lies above the bars and under the title.
- Uploading a HF config.json from tests/data/hf-configs/ changes the verdict and the config; a malformed one shows an
  error naming the key and the page keeps working. A narrower window falls back to one column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import BAD_CONSOLE, open_page  # noqa: E402
from .test_browser import config_text, set_slider, wait_changed, widget  # noqa: E402

VIEWPORT = {"width": 1440, "height": 900}
HF_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf-configs"
"""Published config.json files copied into the clone (their sources: tests/data/hf-configs/README.md)."""
UPLOAD = HF_CONFIGS / "mixtral-8x22b.json"
"""A config the reader supports (``zeroplanner estimate --hf-config`` reads it): model_type mixtral, 141 B."""


@pytest.fixture(scope="module")
def page(browser, app_url):
    ctx, pg = open_page(browser, app_url, VIEWPORT)
    pg.wait_for_timeout(500)
    yield pg
    ctx.close()


def box(locator) -> dict:
    b = locator.bounding_box()
    assert b is not None, f"{locator} is not displayed"
    return b


def assert_in_viewport(name: str, b: dict) -> None:
    inside = (b["x"] >= 0 and b["y"] >= 0 and b["x"] + b["width"] <= VIEWPORT["width"] + 0.5
              and b["y"] + b["height"] <= VIEWPORT["height"] + 0.5)
    assert inside, f"{name} is not inside the 1440 x 900 viewport: {b}"


def test_sliders_verdict_main_chart_and_config_are_in_one_view(page):
    assert page.evaluate("() => [window.scrollX, window.scrollY]") == [0, 0]
    for label in ("Size (B params)", "GPU memory (GiB)", "GPUs per node", "Nodes", "Network Gb/s / node"):
        assert_in_viewport(f"slider {label}", box(widget(page, "widget-slider", label)))
    verdict = page.locator(".zp-app .zp-verdict")
    assert_in_viewport("verdict", box(verdict))
    text = verdict.inner_text()
    assert re.search(r"Recommended: ZeRO-\d", text) and "GiB per GPU" in text and "tokens/s" in text, text
    assert_in_viewport("main chart", box(page.locator(".zp-app .bqplot").first))
    assert_in_viewport("config preview", box(page.locator(".zp-app .zp-config textarea")))
    assert config_text(page).lstrip().startswith("{")


TICKS_JS = """fig => {
  const f = fig.getBoundingClientRect();
  const axes = [...fig.querySelectorAll('g.axis')].map(a => [...a.querySelectorAll('.tick text')]
      .filter(t => t.textContent.trim() !== '')
      .map(t => { const r = t.getBoundingClientRect();
                  return {text: t.textContent, x: r.x, y: r.y, w: r.width, h: r.height}; }));
  return {fig: {x: f.x, y: f.y, w: f.width, h: f.height}, axes};
}"""


def assert_ticks_readable(name: str, data: dict) -> int:
    """No two tick labels of one axis overlap; every tick label lies inside its figure. Returns the count."""
    f = data["fig"]
    count = 0
    for ticks in data["axes"]:
        for t in ticks:
            count += 1
            assert t["w"] > 0 and t["h"] > 0, (name, t)
            inside = (t["x"] >= f["x"] - 0.5 and t["y"] >= f["y"] - 0.5 and t["x"] + t["w"] <= f["x"] + f["w"] + 0.5
                      and t["y"] + t["h"] <= f["y"] + f["h"] + 0.5)
            assert inside, f"{name}: tick {t['text']!r} is clipped by the figure {f}: {t}"
        for i, a in enumerate(ticks):
            for b in ticks[i + 1:]:
                apart = (a["x"] + a["w"] <= b["x"] + 0.5 or b["x"] + b["w"] <= a["x"] + 0.5
                         or a["y"] + a["h"] <= b["y"] + 0.5 or b["y"] + b["h"] <= a["y"] + 0.5)
                assert apart, f"{name}: tick labels {a['text']!r} and {b['text']!r} overlap: {a} {b}"
    return count


STATUS_JS = """fig => {
  const rect = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
  const texts = [...fig.querySelectorAll('svg text')];
  return {fig: rect(fig),
          status: texts.filter(t => ['fits', 'OOM'].includes(t.textContent.trim()))
                       .map(t => ({text: t.textContent, ...rect(t)})),
          title: texts.filter(t => t.textContent.trim() === 'Memory per GPU (GiB)').map(rect),
          plot: rect(fig.querySelector('rect.plotarea_background')),
          bars: [...fig.querySelectorAll('.bargroup rect')].map(rect).filter(b => b.h > 0)};
}"""


def _apart(a: dict, b: dict) -> bool:
    return (a["x"] + a["w"] <= b["x"] + 0.5 or b["x"] + b["w"] <= a["x"] + 0.5
            or a["y"] + a["h"] <= b["y"] + 0.5 or b["y"] + b["h"] <= a["y"] + 0.5)


@pytest.mark.parametrize("query", ["", "?model=llama-2-70b&nodes=4&network=eth-25g"])
def test_fit_row_sits_above_the_bars_under_the_title(browser, app_url, query):
    """The memory chart's "fits" / "OOM" row: one label per bar, inside the figure, above the plot area (so above
    every bar: bars are clipped to it, and off-scale ones reach its top edge), clear of the title and of each
    other."""
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    try:
        pg.goto(app_url + query, timeout=120_000)
        pg.wait_for_selector(".zp-app .bqplot svg .bargroup rect", timeout=120_000)
        pg.wait_for_timeout(500)
        data = visible_figure(pg).evaluate(STATUS_JS)
    finally:
        ctx.close()
    f, status, bars = data["fig"], data["status"], data["bars"]
    assert len(status) == len({round(b["x"]) for b in bars}) >= 8, data
    assert len(data["title"]) == 1, data
    plot_top = data["plot"]["y"]
    for t in status:
        assert t["x"] >= f["x"] and t["x"] + t["w"] <= f["x"] + f["w"] and t["y"] >= f["y"], (t, f)
        assert t["y"] + t["h"] <= plot_top + 0.5, f"{t['text']!r} reaches into the plot: {t}, plot top {plot_top}"
        assert _apart(t, data["title"][0]), (t, data["title"][0])
    for i, a in enumerate(status):
        for b in status[i + 1:]:
            assert _apart(a, b), (a, b)
    if query:  # ZeRO-0 of a 70B model is off the scale and does not fit
        assert any(t["text"] == "OOM" for t in status), status


def upload(pg, path: Path) -> None:
    """Choose ``path`` in the FileUpload's file dialog (its <input type=file> is not in the DOM; the button opens
    the chooser)."""
    with pg.expect_file_chooser() as chooser:
        pg.locator(".zp-app button.widget-upload").click()
    chooser.value.set_files(str(path))


def visible_figure(pg):
    return pg.locator(".zp-app .bqplot:visible").first


@pytest.mark.parametrize("tab", ["Memory per GPU", "Step time", "Host RAM", "Scaling"])
def test_no_tick_label_overlaps_or_is_clipped(page, tab):
    page.get_by_role("tab", name=tab).click()
    fig = visible_figure(page)
    fig.locator("svg .tick text").first.wait_for(timeout=30_000)
    page.wait_for_timeout(300)
    data = fig.evaluate(TICKS_JS)
    assert len(data["axes"]) >= 2
    assert assert_ticks_readable(tab, data) >= 4
    page.get_by_role("tab", name="Memory per GPU").click()


def test_uploaded_config_json_changes_the_verdict_and_the_config(page, tmp_path):
    set_slider(page, "Nodes", 4)
    page.wait_for_function("() => document.querySelector('.zp-config textarea').value"
                           ".includes('\"train_batch_size\": 256,')", timeout=20_000)
    verdict, cfg = page.locator(".zp-verdict").inner_text(), config_text(page)
    page.get_by_text("Your model: HF config.json", exact=True).click()
    upload(page, UPLOAD)
    page.get_by_text(re.compile(r"Model from mixtral-8x22b\.json")).wait_for(timeout=30_000)
    assert wait_changed(lambda: config_text(page), cfg) != cfg
    new_verdict = wait_changed(lambda: page.locator(".zp-verdict").inner_text(), verdict)
    assert "140.62 B parameters" in page.locator(".zp-hf-message").inner_text()
    assert new_verdict != verdict
    note = page.locator(".zp-uploaded-note")
    note.wait_for(timeout=20_000)
    assert "uploaded config.json" in note.inner_text()

    bad = json.loads(UPLOAD.read_text())
    del bad["num_attention_heads"]
    path = tmp_path / "broken-config.json"
    path.write_text(json.dumps(bad))
    upload(page, path)
    error = page.locator(".zp-hf-message .zp-error")
    error.wait_for(timeout=30_000)
    assert "num_attention_heads" in error.inner_text() and "broken-config.json" in error.inner_text()
    assert "Traceback" not in page.locator("body").inner_text()
    # the page keeps working: the last valid setup stays and a slider still drives the config
    cfg = config_text(page)
    set_slider(page, "Nodes", 8)
    assert '"train_batch_size"' in wait_changed(lambda: config_text(page), cfg)
    bad_console = [m for m in page.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
    assert not bad_console, bad_console


def test_a_narrow_window_stacks_the_columns(browser, app_url):
    ctx = browser.new_context(viewport={"width": 1000, "height": 900})
    try:
        pg = ctx.new_page()
        pg.goto(app_url, timeout=120_000)
        pg.wait_for_selector(".zp-app .bqplot svg .bargroup rect", timeout=120_000)
        controls = box(pg.locator(".zp-app .zp-controls"))
        chart = box(pg.locator(".zp-app .bqplot").first)
        config = box(pg.locator(".zp-app .zp-config textarea"))
        assert controls["y"] + controls["height"] <= chart["y"] + 1 <= config["y"] + 1, (controls, chart, config)
        assert pg.evaluate("() => document.documentElement.scrollWidth") <= 1000 + 1
    finally:
        ctx.close()
