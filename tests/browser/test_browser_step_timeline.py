"""The "Over one step" tab in Debian Chromium at 1440 x 900 (Voilà on 127.0.0.1, Playwright): the memory timeline of
one training step is drawn (bars, the GPU-memory line, the peak marker and its label naming a phase), its phase
ticks neither overlap nor leave the figure, the verdict carries the headroom line, and the chart follows a slider
and the config preview's variant (ZeRO stage). Screenshot: artifacts/step_timeline.png (gitignored)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import BAD_CONSOLE, open_page  # noqa: E402
from .test_browser import set_slider, wait_changed, widget  # noqa: E402
from .test_browser_layout import TICKS_JS, assert_ticks_readable  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("forward", "loss forward", "loss backward", "backward", "optimizer step")
PEAK = re.compile(r"^peak \d+(\.\d)? GiB in (" + "|".join(PHASES) + r")$")

STEP_JS = """fig => {
  const rect = e => { const r = e.getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, h: r.height}; };
  const texts = [...fig.querySelectorAll('svg text')];
  const peak = texts.filter(t => t.textContent.trim().startsWith('peak '));
  return {fig: rect(fig),
          bars: fig.querySelectorAll('.bargroup rect').length,
          lines: fig.querySelectorAll('path.line').length,
          markers: fig.querySelectorAll('.dot, path.dot, .object_grp path').length,
          peak: peak.map(t => ({text: t.textContent.trim(), ...rect(t)})),
          title: (texts.find(t => t.textContent.startsWith('Memory over one step')) || {}).textContent || ''};
}"""


BARS_JS = """fig => [...fig.querySelectorAll('.bargroup rect')].map(r => r.getAttribute('y') + ':' +
                                                                    r.getAttribute('height')).join(',')"""


@pytest.fixture(scope="module")
def page(browser, app_url):
    ctx, pg = open_page(browser, app_url, {"width": 1440, "height": 900})
    yield pg
    ctx.close()


def _figure(pg):
    return pg.locator(".zp-app .bqplot:visible", has_text="Memory over one step").first


def _state(pg) -> dict:
    return _figure(pg).evaluate(STEP_JS)


def test_the_timeline_is_drawn_labelled_and_follows_the_controls(page):
    verdict = page.locator(".zp-app .zp-verdict .zp-step-peak")
    assert re.search(r"peak in the .+ GiB per GPU; headroom", verdict.inner_text()), verdict.inner_text()

    page.get_by_role("tab", name="Over one step").click()
    page.wait_for_function("() => [...document.querySelectorAll('.zp-app .bqplot svg text')]"
                           ".some(t => t.textContent.startsWith('peak '))", timeout=30_000)
    page.wait_for_timeout(300)
    first = _state(page)
    assert first["bars"] >= 12 * 4, first  # ~12 points x the non-zero terms
    assert first["lines"] >= 1, first  # the GPU-memory line (and the phase separators)
    assert first["markers"] >= 1, first
    assert len(first["peak"]) == 1 and PEAK.match(first["peak"][0]["text"]), first["peak"]
    f, label = first["fig"], first["peak"][0]
    assert f["x"] <= label["x"] and label["x"] + label["w"] <= f["x"] + f["w"], (label, f)
    assert "Recommended" in first["title"], first["title"]
    ticks = _figure(page).evaluate(TICKS_JS)
    assert assert_ticks_readable("Over one step", ticks) >= 6
    assert {"forward", "backward"} <= {t["text"] for t in ticks["axes"][0]}, ticks["axes"][0]
    ROOT.joinpath("artifacts").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "artifacts" / "step_timeline.png"))

    bars = lambda: _figure(page).evaluate(BARS_JS)  # noqa: E731
    before = bars()
    set_slider(page, "Nodes", 4)
    wait_changed(bars, before)
    after_nodes = _state(page)
    assert PEAK.match(after_nodes["peak"][0]["text"]), after_nodes["peak"]

    widget(page, "widget-dropdown", "Config for").locator("select").select_option("ZeRO-3")
    page.wait_for_function("() => [...document.querySelectorAll('.zp-app .bqplot svg text')]"
                           ".some(t => t.textContent.startsWith('Memory over one step: ZeRO-3'))", timeout=20_000)
    zero3 = _state(page)
    assert PEAK.match(zero3["peak"][0]["text"]), zero3["peak"]
    assert zero3["peak"][0]["text"] != after_nodes["peak"][0]["text"]  # ZeRO-3 holds less per GPU
    bad = [m for m in page.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
    assert not bad, bad
