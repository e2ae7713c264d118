"""The planner page in a real browser: ``zeroplanner app`` (Voilà) on 127.0.0.1, Playwright driving Debian Chromium.

Checks: no "not registered" / "Failed to load" console errors, bars and lines render as SVG, moving the node-count
slider and changing the network preset change the charts and the JSON preview, and a screenshot
(artifacts/planner.png, gitignored) is saved and is not blank. Run with ``pytest -m browser tests/browser/test_browser.py``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import BAD_CONSOLE, open_page, png_stats  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


@pytest.fixture(scope="module")
def page(browser, app_url):
    """The loaded planner page, with its console messages and page errors recorded in ``page.zp_console``."""
    ctx, pg = open_page(browser, app_url, {"width": 1500, "height": 1250}, failed_requests=True)
    yield pg
    ctx.close()


def widget(pg, kind: str, label: str):
    """The ipywidgets element of ``kind`` (``widget-slider``, ``widget-dropdown``) whose description is ``label``."""
    name = pg.locator("label.widget-label", has_text=re.compile(f"^{re.escape(label)}$"))
    return pg.locator(f".zp-app .{kind}", has=name)


def set_slider(pg, label: str, value) -> None:
    """Type into the slider's editable readout (what a user can do; sends one value, like a released drag)."""
    readout = widget(pg, "widget-slider", label).locator(".widget-readout")
    readout.click()
    pg.keyboard.press("Control+A")
    pg.keyboard.type(str(value))
    pg.keyboard.press("Enter")


def chart_svgs(pg) -> list[str]:
    return pg.locator(".zp-app .bqplot > svg").evaluate_all("els => els.map(e => e.innerHTML)")


def config_text(pg) -> str:
    return pg.locator(".zp-config textarea").input_value()


def wait_changed(get, before, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = get()
        if now != before:
            return now
        time.sleep(0.05)
    raise AssertionError("the page did not change")


def png_is_not_blank(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the decompressed image data). Stdlib only (zlib)."""
    return png_stats(path.read_bytes())


def test_page_loads_without_widget_errors_and_draws_bars_and_lines(page):
    bad = [m for m in page.zp_console if BAD_CONSOLE.search(m)]
    assert not bad, bad
    assert not [m for m in page.zp_console if m.startswith("pageerror")], page.zp_console
    # the memory chart is drawn at once; step time, host RAM and scaling are tabs beside it, drawn when opened
    assert page.locator(".zp-app .bqplot").count() == 1
    assert page.locator(".zp-app .bqplot svg .bargroup rect").count() >= 8 * 6  # 8 variants x 6 memory terms
    for drawn, tab in enumerate(("Step time", "Host RAM", "Scaling"), start=2):
        page.get_by_role("tab", name=tab).click()
        page.wait_for_function("n => document.querySelectorAll('.zp-app .bqplot svg .tick').length > 0 && "
                               "document.querySelectorAll('.zp-app .bqplot').length >= n", arg=drawn,
                               timeout=30_000)
    main_charts = page.locator(".zp-app .bqplot").count() - page.locator(".zp-compare-panel .bqplot").count()
    assert main_charts == 4
    assert page.locator(".zp-app .bqplot svg path.line").count() >= 2  # capacity line + scaling lines
    page.get_by_role("tab", name="Memory per GPU").click()
    body = page.locator("body").inner_text()
    assert "Recommended:" in body and "GiB per GPU" in body and "tokens/s" in body
    assert "Traceback" not in body
    assert config_text(page).lstrip().startswith("{")


def test_node_slider_and_network_preset_change_charts_and_config(page):
    charts, cfg = chart_svgs(page), config_text(page)
    set_slider(page, "Nodes", 4)
    cfg = wait_changed(lambda: config_text(page), cfg)
    assert '"train_batch_size": 256' in cfg  # 1 x 8 accumulation x 32 GPUs (DeepSpeed's batch rule)
    charts = wait_changed(lambda: chart_svgs(page), charts)

    widget(page, "widget-dropdown", "Network").locator("select").select_option("eth-25g")
    wait_changed(lambda: config_text(page), cfg)
    wait_changed(lambda: chart_svgs(page), charts)
    bad = [m for m in page.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]
    assert not bad, bad


def test_screenshot_is_saved_and_not_blank(page):
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "planner.png"
    page.screenshot(path=str(path), full_page=True)
    width, height, distinct = png_is_not_blank(path)
    assert width >= 1000 and height >= 800
    assert distinct > 40, "screenshot looks blank"


def test_dragging_the_node_slider_by_keyboard_ends_in_the_last_value(page):
    """Quick key presses on the slider handle (each one sends a value): the page ends showing the last one. The
    node slider steps over powers of two (1, 2, 4, ...), so three presses multiply the count by 8."""
    slider = widget(page, "widget-slider", "Nodes")
    start = int(slider.locator(".widget-readout").inner_text())
    slider.locator(".noUi-handle").focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    nodes = min(start * 8, 128)
    # samples per GPU per step stay the user's (micro-batch x accumulation = 8), so train_batch_size = 8 x 8 x nodes
    page.wait_for_function(
        "n => document.querySelector('.zp-config textarea').value.includes('\"train_batch_size\": ' + n + ',')",
        arg=8 * 8 * nodes, timeout=20_000)
    assert slider.locator(".widget-readout").inner_text() == str(nodes)


def test_hovering_a_memory_segment_shows_its_term_and_gib(page):
    page.mouse.move(*tallest_segment_center(page))
    term = r"(Parameters|Gradients|Optimizer states|Activations|Buffers|Overhead): [0-9.]+ GiB of [0-9.]+ GiB per GPU"
    tip = page.get_by_text(re.compile(term))
    tip.first.wait_for(timeout=20_000)  # the tooltip widget, filled by the kernel's hover handler
    assert re.search(term, tip.first.inner_text())
    page.mouse.move(5, 5)


def tallest_segment_center(pg) -> tuple[float, float]:
    """Page coordinates of the centre of the memory chart's tallest bar segment."""
    boxes = pg.locator(".zp-app .bqplot").first.locator(".bargroup rect.bar").evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })")
    x, y, width, height = max(boxes, key=lambda b: b[3])
    return x + width / 2, y + height / 2


def test_clicking_a_memory_segment_explains_it(page):
    x, y = tallest_segment_center(page)
    page.mouse.move(x, y)
    page.mouse.click(x, y)
    panel = page.locator(".zp-app .zp-explain-panel")
    panel.locator(".zp-explain").first.wait_for(timeout=20_000)
    text = panel.inner_text()
    assert "GiB" in text and "Term" in text
    page.mouse.move(5, 5)


def test_copy_link_reopens_the_scenario_in_a_fresh_page(page, browser):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.locator(".zp-app button.zp-copy-link").click()
    page.wait_for_function("() => document.querySelector('.zp-app button.zp-copy-link').textContent === 'Link copied'",
                           timeout=10_000)
    link = page.evaluate("() => navigator.clipboard.readText()")
    assert link.startswith("http://127.0.0.1:") and "nodes=" in link and "network=" in link
    nodes = widget(page, "widget-slider", "Nodes").locator(".widget-readout").inner_text()
    network = widget(page, "widget-dropdown", "Network").locator("select").input_value()
    fresh = browser.new_page(viewport={"width": 1500, "height": 1250})
    try:
        fresh.goto(link, timeout=120_000)
        fresh.wait_for_selector(".zp-app .bqplot svg .bargroup rect", timeout=120_000)
        assert widget(fresh, "widget-slider", "Nodes").locator(".widget-readout").inner_text() == nodes
        assert widget(fresh, "widget-dropdown", "Network").locator("select").input_value() == network
        assert config_text(fresh) == config_text(page)
    finally:
        fresh.close()


def test_report_download_is_a_self_contained_html_page(page, tmp_path):
    page.get_by_role("button", name="Build report").click()
    link = page.locator(".zp-app a.zp-report")
    link.wait_for(timeout=20_000)
    with page.expect_download() as info:
        link.click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    text = path.read_text()
    assert info.value.suggested_filename == "zeroplanner-report.html" and "<svg" in text or "data:image/svg" in text


def test_download_and_copy_give_the_previewed_json(page, tmp_path):
    import json

    preview = config_text(page)
    with page.expect_download() as info:
        page.locator(".zp-app a.zp-download").click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    assert info.value.suggested_filename == "ds_config.json"
    assert json.loads(path.read_text()) == json.loads(preview)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.locator(".zp-app button.zp-copy").click()
    page.wait_for_function("() => document.querySelector('.zp-app button.zp-copy').textContent === 'Copied'",
                           timeout=10_000)
    assert json.loads(page.evaluate("() => navigator.clipboard.readText()")) == json.loads(preview)


def test_pasted_config_is_read_and_linted(page):
    import json

    page.get_by_text("Paste your DeepSpeed config", exact=True).click()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
              "fp16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    page.locator(".zp-app textarea[placeholder^='Paste a DeepSpeed config']").fill(json.dumps(config))
    page.get_by_role("button", name="Load config").click()
    page.get_by_text("This config as written:").wait_for(timeout=20_000)
    page.get_by_text("Advanced", exact=True).click()  # its controls are placed when it is first opened
    micro_batch = widget(page, "widget-text", "Micro-batch / GPU").locator("input")
    micro_batch.wait_for(timeout=20_000)
    assert micro_batch.input_value() == "2"
    page.get_by_text("Advanced", exact=True).click()  # closed again, as the next tests expect
    micro_batch.wait_for(state="hidden", timeout=20_000)
    findings = page.locator(".zp-app li", has_text="bf16").all_inner_texts()
    assert any("error" in f for f in findings), findings  # fp16 and bf16 both enabled


def test_pasted_log_is_diagnosed_under_the_verdict(page):
    """A CUDA OOM (PyTorch >= 2.1 wording, inside engine.backward) pasted in "Paste your log": the diagnosis names
    the phase and what PyTorch reports, escaped (the markup in the log is shown as text), and the memory it measured
    is drawn on the step's memory chart."""
    log = "\n".join(['Traceback (most recent call last):', '    engine.backward(loss)',
                     '  File "deepspeed/runtime/engine.py", line 2100, in backward',
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                     "capacity of 79.15 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has "
                     "77.91 GiB memory in use. Of the allocated memory 75.01 GiB is allocated by PyTorch, and 1.45 GiB "
                     "is reserved by PyTorch but unallocated. <b>x</b>"])
    page.get_by_text("Paste your log", exact=True).click()
    page.locator(".zp-app textarea[placeholder^='Paste a training log']").fill(log)
    page.get_by_role("button", name="Diagnose log").click()
    box = page.locator(".zp-app .zp-diagnosis")
    box.wait_for(timeout=20_000)
    text = box.inner_text()
    assert "CUDA out of memory in the backward on GPU 0" in text and "79.15 GiB total" in text
    assert "Fix:" in text or "a problem was found" in text
    # the measured figure beside the prediction: PyTorch's 75.01 GiB held + the 2.00 GiB asked, on "Over one step"
    page.get_by_role("tab", name="Over one step").click()
    page.wait_for_function("() => [...document.querySelectorAll('.zp-app .bqplot svg text')]"
                           ".some(t => t.textContent === 'your log: OOM at >= 77.0 GiB')", timeout=30_000)
    page.get_by_role("tab", name="Memory per GPU").click()
    page.get_by_text("Paste your log", exact=True).click()  # closed again


def test_invalid_input_shows_a_message_not_a_traceback(page):
    checkbox = page.locator(".zp-app .widget-checkbox", has_text="QLoRA").locator("input")
    page.get_by_text("Advanced", exact=True).click()
    page.get_by_text("LoRA / QLoRA", exact=True).click()
    checkbox.check()
    page.wait_for_selector(".zp-error", timeout=20_000)
    text = page.locator(".zp-error").first.inner_text()
    assert "lora_rank" in text and "Traceback" not in page.locator("body").inner_text()
    checkbox.uncheck()
    page.wait_for_selector(".zp-error", state="detached", timeout=20_000)
