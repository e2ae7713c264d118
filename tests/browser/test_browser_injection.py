"""Script payloads in everything a visitor can put into the page fire nothing (issue 33, item 1).

Reproduces the attack of issue 33: ``/?theme="><img src=x onerror=alert(4)>`` made a dialog fire in the visitor's
page (Voilà handed the theme name to JupyterLab's theme manager and wrote it into the page). The planner's server
now ignores ``?theme=`` (``VoilaConfiguration.allow_theme_override = "NO"``) and sends a Content-Security-Policy that
allows only the page's own inline handlers (:mod:`zeroplanner.pagejs`).

Every query key the server or Voilà reads (``theme``, ``template``, Voilà's tree/contents keys, which a
single-notebook server does not mount, and every scenario key of :mod:`zeroplanner.share`) and the other inputs a
visitor controls (an uploaded config.json's file name and fields, a pasted config.json, a pasted DeepSpeed config)
carry each payload of :data:`PAYLOADS`; a dialog in any page fails the test. The scenario keys' refusals are
rendered by a real browser from the app's own message HTML (one page for all keys: a page load per key would take
minutes); the server-read keys and the other inputs go through the served page.
"""

from __future__ import annotations

import html
import json
import time
from urllib.parse import quote

import pytest

pytestmark = pytest.mark.browser

pytest.importorskip("playwright.sync_api")

PAYLOADS = (
    '"><img src=x onerror=alert(4)>',
    "'><svg onload=alert(5)>",
    "</script><script>alert(6)</script>",
    "javascript:alert(7)",
    '" onmouseover="alert(8)" x="',
    "<iframe srcdoc='<script>parent.alert(9)</script>'></iframe>",
)
"""Script payloads: attribute break-outs, a tag, a script element, a URL scheme, an inline handler, a frame."""

SERVER_KEYS = ("theme", "template", "voila-theme", "voila-template", "classic-tree", "format", "content",
               "no_track_activity", "download", "token")
"""Query keys Voilà or jupyter_server read (voila/handler.py, tornado/treehandler.py, tornado/contentshandler.py,
jupyter_server/base/handlers.py)."""

WATCH = """(() => {
  window.__zpViolations = [];
  document.addEventListener('securitypolicyviolation',
    e => window.__zpViolations.push(e.violatedDirective + ' ' + (e.sample || '')));
})();"""
"""Init script recording the page's CSP violations (Playwright's init scripts are not subject to the page's CSP)."""

HF_CONFIG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
             "max_position_embeddings": 2048, "tie_word_embeddings": False, "architectures": ["LlamaForCausalLM"]}
"""TinyLlama-1.1B's shape (TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T, config.json), a valid model."""


def _page(browser, url: str | None = None):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    page.zp_dialogs = []
    page.on("dialog", lambda d: (page.zp_dialogs.append(d.message), d.dismiss()))
    page.add_init_script(WATCH)
    if url is not None:
        page.goto(url, timeout=180_000)
        page.wait_for_selector(".zp-config textarea", timeout=180_000)
    return page


def _settle_and_check(page) -> None:
    page.mouse.move(300, 300)
    page.mouse.move(700, 500)
    time.sleep(1.5)
    assert page.zp_dialogs == [], page.zp_dialogs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("payload", PAYLOADS[:2])
def test_payloads_in_every_server_read_query_key_fire_nothing(app_url, browser, payload):
    query = "&".join(f"{key}={quote(payload, safe='')}" for key in SERVER_KEYS)
    page = _page(browser, f"{app_url}?{query}")
    try:
        _settle_and_check(page)
        # the page is the planner in its light theme, whatever the link said
        assert page.evaluate("() => document.body.dataset.jpThemeName") == "JupyterLab Light"
        assert "<img" not in page.content().split("<body", 1)[1].split("rendered_cells", 1)[0]
        assert page.evaluate("() => window.__zpViolations") == []
    finally:
        page.context.close()


@pytest.mark.timeout(300)
def test_payloads_in_every_scenario_key_fire_nothing(browser):
    """The refusal each scenario key's payload gets (``initial_state``, the message the app shows) rendered in
    Chromium with no CSP: the escaping alone must hold."""
    from zeroplanner.share import KEYS
    from zeroplanner.ui.app import initial_state

    blocks = []
    for key in KEYS:
        for payload in PAYLOADS:
            _, problem = initial_state({"QUERY_STRING": f"{key}={quote(payload, safe='')}"})
            assert problem, (key, payload)  # refused, so the default opens
            blocks.append(f"<div class='zp-error'>{html.escape(problem)}</div>")  # as PlannerApp shows it
        _, problem = initial_state({"QUERY_STRING": f"{quote(PAYLOADS[0], safe='')}=1"})  # the payload as a key
        blocks.append(f"<div class='zp-error'>{html.escape(problem)}</div>")
    page = _page(browser)
    try:
        page.set_content("<html><body>" + "".join(blocks) + "</body></html>")
        _settle_and_check(page)
        assert page.locator("img, svg, iframe, script").count() == 0
    finally:
        page.context.close()


@pytest.mark.timeout(600)
def test_payloads_in_model_files_and_pasted_configs_fire_nothing(app_url, browser, tmp_path):
    from tests.browser.test_browser import widget

    page = _page(browser, app_url)
    try:
        page.get_by_text("Your model: HF config.json").click()
        # an uploaded config.json whose file name and fields carry payloads (a valid shape: the model is used)
        hostile = dict(HF_CONFIG, _name_or_path=PAYLOADS[0], architectures=[PAYLOADS[1]], torch_dtype=PAYLOADS[2])
        upload = tmp_path / f"{PAYLOADS[1].replace('/', '_')}.json"
        upload.write_text(json.dumps(hostile))
        with page.expect_file_chooser(timeout=60_000) as chooser:
            page.locator(".zp-app .widget-upload").first.click()
        chooser.value.set_files(str(upload))
        page.wait_for_function("() => document.querySelector('.zp-hf-message') && "
                               "document.querySelector('.zp-hf-message').textContent.length > 0", timeout=60_000)
        _settle_and_check(page)
        # pasted config.json texts: a refused model_type, and payloads as keys and values
        area = page.locator(".zp-app textarea[placeholder^='or paste a HF config.json']")
        for text in (json.dumps(dict(HF_CONFIG, model_type=PAYLOADS[0])),
                     json.dumps({PAYLOADS[2]: PAYLOADS[3], "model_type": PAYLOADS[4]}), PAYLOADS[5]):
            area.fill(text)
            page.get_by_role("button", name="Use this model").click()
            time.sleep(1.0)
            _settle_and_check(page)
        # pasted DeepSpeed configs: payloads as keys, values and as the whole text
        page.get_by_text("Paste your DeepSpeed config").click()
        paste = page.locator(".zp-app textarea[placeholder^='Paste a DeepSpeed config']")
        for text in (json.dumps({PAYLOADS[0]: 1, "zero_optimization": {"stage": PAYLOADS[1], PAYLOADS[4]: 2}}),
                     json.dumps({"train_micro_batch_size_per_gpu": PAYLOADS[2], "optimizer": {"type": PAYLOADS[5]}}),
                     PAYLOADS[0]):
            paste.fill(text)
            page.get_by_role("button", name="Load config").click()
            time.sleep(1.0)
            _settle_and_check(page)
        assert page.evaluate("() => window.__zpViolations") == []
        assert widget(page, "widget-slider", "Nodes").count() == 1  # the planner is still there
    finally:
        page.context.close()


@pytest.mark.timeout(300)
def test_the_policy_refuses_an_injected_handler_and_runs_the_pages_own(app_url, browser):
    """What the CSP adds beyond escaping: were some HTML widget to carry an unescaped ``onerror``, nothing runs
    (a ``script-src-attr`` violation instead), while the page's own Copy link handler still runs."""
    page = _page(browser, app_url)
    try:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        page.evaluate("""() => {
          const box = document.querySelector('.zp-app .widget-html-content') || document.body;
          box.insertAdjacentHTML('beforeend', '<img src=x onerror="alert(13)"><b onclick="alert(14)">x</b>');
          box.querySelector('b[onclick]').click();
        }""")
        _settle_and_check(page)
        violations = page.evaluate("() => window.__zpViolations")
        assert any(v.startswith("script-src-attr") for v in violations), violations
        page.locator(".zp-app button.zp-copy-link").click()
        page.wait_for_function("() => document.querySelector('.zp-app button.zp-copy-link').textContent === "
                               "'Link copied'", timeout=10_000)
        assert page.evaluate("() => navigator.clipboard.readText()").startswith("http://127.0.0.1:")
        assert page.zp_dialogs == []
    finally:
        page.context.close()
