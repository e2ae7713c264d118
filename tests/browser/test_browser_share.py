"""Shareable scenarios in a real browser: Voilà pages opened with a query string start on that scenario.

The tutorial page (``notebooks/zero_tutorial.ipynb``) is served by Voilà with the planner's own settings and
template; Playwright drives Debian Chromium. Run with ``pytest -m browser tests/browser/test_browser_share.py``.
Screenshots: artifacts/tutorial.png.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

sync_api = pytest.importorskip("playwright.sync_api")

from zeroplanner.costmodel import estimate  # noqa: E402
from zeroplanner.explain import fmt_bytes_text  # noqa: E402
from zeroplanner.scenarios import build_scenario  # noqa: E402
from zeroplanner.ui.tutorial import Tutorial, with_zero  # noqa: E402
from zeroplanner.server import voila_argv, voila_env  # noqa: E402

from ..browserkit import BAD_CONSOLE, CHROMIUM, CHROMIUM_ARGS, open_page, png_stats, serve_app  # noqa: E402
from .test_browser import set_slider  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def tutorial_url(tmp_path_factory):
    """Voila itself (``python -m voila``) serving the tutorial notebook with the planner's settings; at teardown its
    log must hold no traceback (read before the server is stopped)."""
    notebook = ROOT / "notebooks" / "zero_tutorial.ipynb"
    with serve_app(command=lambda port: [sys.executable, "-m", "voila", *voila_argv(notebook, port=port)],
                   env=voila_env(), log_path=tmp_path_factory.mktemp("voila-tutorial") / "server.log",
                   timeout=90.0) as server:
        yield server.url


def _open(browser, url: str, selector: str):
    return open_page(browser, url, {"width": 1300, "height": 1000}, wait_for=selector, timeout_ms=180_000)


def _dropdown_value(page, scope: str, label: str) -> str:
    box = page.locator(f"{scope} .widget-dropdown", has=page.locator("label.widget-label",
                                                                      has_text=re.compile(f"^{label}$")))
    return box.locator("select").evaluate("s => s.options[s.selectedIndex].text")


def _slider_value(page, scope: str, label: str) -> str:
    box = page.locator(f"{scope} .widget-slider", has=page.locator("label.widget-label",
                                                                    has_text=re.compile(f"^{label}$")))
    return box.locator(".widget-readout").inner_text().strip()


def test_tutorial_page_opens_on_the_query_string_with_typeset_formulas(browser, tutorial_url):
    ctx, page = _open(browser, tutorial_url + "?model=llama-2-13b&nodes=2&network=ib-ndr",
                      ".zp-tutorial-step .zp-explain")
    try:
        assert _dropdown_value(page, ".zp-tutorial", "Model") == "llama-2-13b"
        assert _dropdown_value(page, ".zp-tutorial", "Network") == "ib-ndr"
        assert _slider_value(page, ".zp-tutorial", "Nodes") == "2"
        # MathJax (bundled with Voilà's lab template, no CDN) typesets the formulas
        page.wait_for_selector(".zp-explain mjx-container", timeout=60_000)
        assert page.locator(".zp-explain mjx-container").count() >= 2 * 7
        # the ZeRO-1 step shows the linked scenario's optimizer states, as the cost model computes them
        s1 = with_zero(build_scenario(model="llama-2-13b", nodes=2, network="ib-ndr"), 1)
        shown = fmt_bytes_text(estimate(s1).per_gpu_bytes.optimizer_states)
        step = page.locator(".zp-tutorial-step", has_text="2. ZeRO-1")
        assert step.locator(".zp-explain-value").first.inner_text() == shown
        # answering the exercise in the page (ZeRO-1 on twice the GPUs): type the number, press Check
        answer = Tutorial(build_scenario(model="llama-2-13b", nodes=2, network="ib-ndr")).step("zero1").exercise
        box = step.locator(".zp-exercise input[type=number]")
        box.fill(f"{answer.expected():.2f}")
        box.press("Enter")
        step.locator(".zp-exercise button", has_text="Check").click()
        step.locator(".zp-exercise", has_text="Correct").wait_for(timeout=20_000)
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / "tutorial.png"
        page.screenshot(path=str(path), full_page=True)
        width, height, distinct = png_stats(path.read_bytes())
        assert width >= 1000 and height >= 1000 and distinct > 40
        bad = [m for m in page.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
        assert not bad, bad
        assert "Traceback" not in page.locator("body").inner_text()
    finally:
        ctx.close()


def test_tutorial_page_refuses_a_hostile_query_with_a_message(browser, tutorial_url):
    """A hostile value is left out (never evaluated) and named; the rest of the link, here nothing, applies."""
    ctx, page = _open(browser, tutorial_url + "?nodes=__import__('os')", ".zp-tutorial-step .zp-explain")
    try:
        page.get_by_text("Not used from the link", exact=False).wait_for(timeout=30_000)
        body = page.locator("body").inner_text()
        assert "nodes (must be an integer" in body and "Traceback" not in body
        assert _slider_value(page, ".zp-tutorial", "Nodes") == "1"  # the default scenario
    finally:
        ctx.close()


# ----------------------------------------------------------------------------------------------------------------
# The planner page (zeroplanner app): a link opens the app on its scenario; "Copy link" reproduces the scenario
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with serve_app(log_path=tmp_path_factory.mktemp("voila-app") / "server.log", timeout=90.0) as server:
        yield server.url  # teardown: no "Traceback" in the server log, then the server stops


APP_BARS = ".zp-app .bqplot svg .bargroup rect"


def _config(page) -> str:
    return page.locator(".zp-config textarea").input_value()


def _wait_config(page, pattern: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    text = _config(page)
    while time.monotonic() < deadline:
        text = _config(page)
        if re.search(pattern, text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"config never matched {pattern!r}: {text[:300]}")


def test_planner_page_opens_on_the_links_scenario(browser, app_url):
    from zeroplanner.planner import plan

    ctx, page = _open(browser, app_url + "?model=llama-2-70b&nodes=4&network=ib-ndr", APP_BARS)
    try:
        assert _dropdown_value(page, ".zp-app", "Model") == "llama-2-70b"
        assert _dropdown_value(page, ".zp-app", "Network") == "ib-ndr"
        assert _slider_value(page, ".zp-app", "Nodes") == "4"
        # 1 x 8 accumulation x 32 GPUs: DeepSpeed's batch rule for the linked cluster
        _wait_config(page, r'"train_batch_size": 256\b')
        p = plan(build_scenario(model="llama-2-70b", nodes=4, network="ib-ndr"))
        banner = page.locator(".zp-banner").first.inner_text()
        assert f"peak {p.estimate.step_peak.bytes / 2**30:.1f} GiB" in banner
        assert page.locator(APP_BARS).count() >= 8 * 6
        bad = [m for m in page.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
        assert not bad, bad
    finally:
        ctx.close()


def test_copied_link_reproduces_the_scenario_in_a_fresh_page(browser, app_url):
    ctx, page = _open(browser, app_url + "?model=llama-2-13b&nodes=2", APP_BARS)
    try:
        ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=app_url.rstrip("/"))
        # the user changes the setup in the page: 3 nodes, Ethernet 100G
        set_slider(page, "Nodes", 3)  # typed into the readout, as a user can
        _wait_config(page, r'"train_batch_size": 192\b')  # 1 x 8 x 24 GPUs
        page.locator(".zp-app .widget-dropdown", has=page.locator("label.widget-label", has_text=re.compile(
            "^Network$"))).locator("select").select_option("eth-100g")
        button = page.locator(".zp-copy-link")
        deadline = time.monotonic() + 30
        while "eth-100g" not in (button.get_attribute("title") or "") and time.monotonic() < deadline:
            time.sleep(0.1)
        config_before = _config(page)
        button.click()
        page.get_by_text("Link copied").wait_for(timeout=10_000)
        link = page.evaluate("navigator.clipboard.readText()")
        assert link.startswith(app_url) and "nodes=3" in link and "network=eth-100g" in link
        assert "model=llama-2-13b" in link
    finally:
        ctx.close()
    ctx2, fresh = _open(browser, link, APP_BARS)
    try:
        assert _dropdown_value(fresh, ".zp-app", "Model") == "llama-2-13b"
        assert _dropdown_value(fresh, ".zp-app", "Network") == "eth-100g"
        assert _slider_value(fresh, ".zp-app", "Nodes") == "3"
        _wait_config(fresh, r'"train_batch_size": 192\b')
        assert _config(fresh) == config_before
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / "planner_from_link.png"
        fresh.screenshot(path=str(path), full_page=True)
        assert png_stats(path.read_bytes())[2] > 40
    finally:
        ctx2.close()


def test_clicking_a_memory_segment_explains_it(browser, app_url):
    from zeroplanner.explain import MEMORY_KEYS
    from zeroplanner.planner import plan

    ctx, page = _open(browser, app_url + "?model=llama-2-13b&nodes=2", APP_BARS)
    try:
        group = page.locator(".zp-app .bqplot").first.locator("svg .bargroup").first  # the Recommended bar
        rects = group.locator("rect")
        heights = rects.evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
        segment = max(range(len(heights)), key=lambda i: heights[i])
        panel = page.locator(".zp-explain-panel")
        for attempt in range(2):  # a click that lands while the bars still move is not a segment click: once more
            rects.nth(segment).click()
            try:
                panel.locator(".zp-explain").first.wait_for(timeout=15_000 if attempt == 0 else 30_000)
                break
            except sync_api.TimeoutError:
                if attempt:
                    raise
        key = MEMORY_KEYS[segment]
        p = plan(build_scenario(model="llama-2-13b", nodes=2))
        shown = fmt_bytes_text(getattr(p.estimate.per_gpu_bytes, key))
        assert panel.locator(".zp-explain-value").first.inner_text() == shown
        panel.locator("mjx-container").first.wait_for(timeout=30_000)  # the formula is typeset
        assert "Source:" in panel.inner_text()
    finally:
        ctx.close()


def test_compare_panel_pins_and_shows_both_setups(browser, app_url):
    ctx, page = _open(browser, app_url + "?model=llama-2-13b&nodes=2", APP_BARS)
    try:
        page.get_by_role("tab", name="Compare").click()  # a tab beside the memory chart (was an accordion)
        page.locator(".zp-compare-panel button", has_text="Pin current").click()
        page.locator(".zp-compare-panel table.zp-compare").wait_for(timeout=30_000)
        set_slider(page, "Nodes", 4)  # typed into the readout, as a user can
        diff = page.locator(".zp-compare-panel table.zp-compare-diff").first
        diff.get_by_text("nodes").wait_for(timeout=30_000)
        rows = diff.locator("tr", has_text="nodes").first.inner_text().split()
        assert rows[-2:] == ["2", "4"]
        assert page.locator(".zp-compare-panel .bqplot svg .bargroup").count() >= 4  # 2 bars x 2 charts
    finally:
        ctx.close()
