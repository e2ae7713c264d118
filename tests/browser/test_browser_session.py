"""A lost session says so, and uploads are size-checked in the browser (issue 33, items 3 and 4), in a real browser.

Reproduces issue 33 item 3: with the old template (no session script), a visitor's kernel killed with SIGKILL was
restarted empty by jupyter_server and the page showed broken-link icons, ignored its controls and said nothing,
so :func:`test_a_killed_kernel_says_so_and_reload_starts_again` and :func:`test_a_culled_kernel_says_so` fail
there (no ``#zp-session-ended``). Now the page replaces its cells with "This session ended: reload to start again"
and a Reload button that gives a fresh, working planner. A busy kernel, and a websocket the server closes for an
oversized message (it reconnects by itself, test_browser_reliability.py's case), show nothing.

Reproduces issue 33 item 4: a 12 MB config.json chosen in "Upload config.json" never reached the kernel (tornado
closes a websocket over 10 MiB) and nothing was said, so
:func:`test_an_oversized_upload_is_refused_in_the_page_and_a_real_one_loads` fails on the old template (no
message, the page's kernel socket dropped). Now the page refuses it before sending, with the app's own message for
an oversized config.json, and a real config.json still loads. The template's scripts:
zeroplanner/server/share/voila/templates/zeroplanner/index.html.j2. Run with
``pytest -m browser tests/browser/test_browser_session.py``.
"""

from __future__ import annotations

import html
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import BAD_CONSOLE  # noqa: E402
from .test_browser import config_text, set_slider, wait_changed  # noqa: E402
from .test_browser_layout import UPLOAD, upload  # noqa: E402

ENDED = "This session ended: reload to start again"
DRAWN = ".zp-app .bqplot svg .bargroup rect"
OVER_WEBSOCKET_LIMIT = 11 * 2**20
"""A paste longer than tornado's 10 MiB websocket message limit: the server closes the page's kernel socket."""


def open_page(browser, url: str):
    """A new page on ``url``, drawn; records console messages (``zp_console``) and kernel sockets (``zp_sockets``)."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 1250})
    pg = ctx.new_page()
    pg.zp_console, pg.zp_sockets = [], []
    pg.on("console", lambda m: pg.zp_console.append(f"{m.type}: {m.text}"))
    pg.on("pageerror", lambda e: pg.zp_console.append(f"pageerror: {e}"))
    pg.on("websocket", lambda ws: pg.zp_sockets.append(ws.url) if "/channels" in ws.url else None)
    pg.goto(url, timeout=120_000)
    pg.wait_for_selector(DRAWN, timeout=120_000)
    return pg


def kernel_id(pg) -> str:
    """The page's kernel id (Voilà's ``#jupyter-config-data`` JSON)."""
    return json.loads(pg.locator("#jupyter-config-data").text_content())["kernelId"]


def kernel_pid(kid: str) -> int:
    """The pid of the kernel process ``python -m zeroplanner.server.kernel -f .../kernel-<kid>.json``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"zeroplanner.server.kernel" in argv and any(kid.encode() in a for a in argv):
            return int(proc.name)
    raise AssertionError(f"no kernel process for {kid}")


def kernel_status(url: str, kid: str) -> int:
    """HTTP status of the server's ``GET /api/kernels/<kid>`` (200 while the kernel exists, 404 after)."""
    try:
        with urllib.request.urlopen(f"{url}api/kernels/{kid}", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def wait_until(check, timeout: float, what: str, pg=None) -> None:
    """Poll ``check()`` until true; AssertionError(``what``) after ``timeout`` s. With ``pg``, wait through the page
    (Playwright's sync API hands its events, e.g. ``websocket``, to the handlers only while it is called)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if pg is not None:
            pg.wait_for_timeout(200)
        else:
            time.sleep(0.2)
    raise AssertionError(what)


def assert_ended(pg, timeout_ms: int = 20_000) -> None:
    """The page shows the session-ended alert in place of its cells."""
    alert = pg.locator("#zp-session-ended[role=alert]")
    alert.wait_for(timeout=timeout_ms)
    assert ENDED in alert.inner_text()
    assert pg.get_by_role("button", name="Reload").is_visible()
    assert not pg.locator("#rendered_cells").is_visible()
    assert not pg.locator(".zp-app .widget-slider").first.is_visible()


def assert_not_ended(pg) -> None:
    assert pg.locator("#zp-session-ended").count() == 0
    assert pg.locator("#rendered_cells").is_visible()


def bad_console(pg) -> list[str]:
    return [m for m in pg.zp_console if BAD_CONSOLE.search(m) or m.startswith("pageerror")]


def nodes_change_works(pg, nodes: int) -> None:
    """Moving the Nodes slider redraws the config preview: the kernel answers."""
    cfg = config_text(pg)
    set_slider(pg, "Nodes", nodes)
    wait_changed(lambda: config_text(pg), cfg, timeout=60)


def open_paste_box(pg):
    """The DeepSpeed paste box, its accordion panel opened (the kernel fills a panel when it is first opened)."""
    area = pg.locator(".zp-app textarea[placeholder^='Paste a DeepSpeed config']")
    if not area.is_visible():
        pg.get_by_text("Paste your DeepSpeed config", exact=True).click()
        area.wait_for(timeout=30_000)
    return area


def paste_over_websocket_limit(pg) -> None:
    """Paste text over the websocket limit into the DeepSpeed paste box (the box sends its value as it changes;
    Load if it did not): the server closes the page's socket and the page opens a new one. The box is emptied."""
    sockets = len(pg.zp_sockets)
    area = open_paste_box(pg)
    area.fill(json.dumps({"train_batch_size": 8, "pad": "x" * OVER_WEBSOCKET_LIMIT}))  # the text box syncs it
    try:
        wait_until(lambda: len(pg.zp_sockets) > sockets, 15, "", pg)
    except AssertionError:
        pg.get_by_role("button", name="Load config").click()
        wait_until(lambda: len(pg.zp_sockets) > sockets, 60, "the page's kernel socket did not reconnect", pg)
    area.fill("")


@pytest.fixture(scope="module")
def page(browser, app_url):
    pg = open_page(browser, app_url)
    yield pg
    pg.context.close()


def test_a_normal_page_says_nothing_over_control_changes(page):
    for nodes in (2, 4, 3):
        nodes_change_works(page, nodes)
    page.wait_for_timeout(2000)  # a late message would come with the kernel's busy/idle after the last change
    assert_not_ended(page)
    assert len(page.zp_sockets) == 1, page.zp_sockets
    assert not bad_console(page), bad_console(page)


@pytest.mark.timeout(300)
def test_an_oversized_upload_is_refused_in_the_page_and_a_real_one_loads(page, tmp_path):
    from zeroplanner.ui import PlannerApp

    big = tmp_path / "big-config.json"
    big.write_text(json.dumps({"model_type": "llama", "pad": "x" * 12_000_000}))
    size = big.stat().st_size
    page.get_by_text("Your model: HF config.json", exact=True).click()
    upload(page, big)
    refused = page.locator(".zp-hf-message .zp-upload-refused[role=alert]")
    refused.wait_for(timeout=20_000)
    # word for word what the app says of an oversized config.json that reaches it
    app = PlannerApp()
    assert app.load_hf_config(big.read_bytes(), big.name) is None
    expected = html.unescape(re.sub(r"<[^>]+>", "", app.hf_message.value))
    assert refused.inner_text() == expected, (refused.inner_text(), expected)
    assert f"'{big.name}' is {size} bytes; the limit is 1000000 bytes" in expected  # the CLI's --hf-config words
    # not sent: the kernel socket stayed up, and the planner still answers
    page.wait_for_timeout(1000)
    assert len(page.zp_sockets) == 1, page.zp_sockets
    nodes_change_works(page, 2)

    verdict = page.locator(".zp-verdict").inner_text()
    upload(page, UPLOAD)
    page.get_by_text(re.compile(r"Model from mixtral-8x22b\.json")).wait_for(timeout=30_000)
    assert "140.62 B parameters" in page.locator(".zp-hf-message").inner_text()
    assert page.locator(".zp-upload-refused").count() == 0  # a new choice clears the refusal
    wait_changed(lambda: page.locator(".zp-verdict").inner_text(), verdict)
    assert_not_ended(page)
    assert not bad_console(page), bad_console(page)


@pytest.mark.timeout(300)
def test_an_oversized_message_reconnects_without_the_session_message(page):
    """The server closes the socket for a message over 10 MiB and the page reconnects to its kernel: no alert."""
    paste_over_websocket_limit(page)
    page.wait_for_timeout(3000)  # the page's check of its kernel (GET /api/kernels/<id>) answers 200
    assert_not_ended(page)
    nodes_change_works(page, 8)
    assert_not_ended(page)


@pytest.mark.timeout(300)
def test_a_killed_kernel_says_so_and_reload_starts_again(browser, app_url):
    pg = open_page(browser, app_url)
    try:
        kid = kernel_id(pg)
        os.kill(kernel_pid(kid), signal.SIGKILL)
        started = time.monotonic()
        assert_ended(pg, timeout_ms=20_000)
        assert time.monotonic() - started < 20
        # the kernel the server restarted empty for the page is shut down by the page
        wait_until(lambda: kernel_status(app_url, kid) == 404, 30, f"kernel {kid} was not shut down")

        pg.get_by_role("button", name="Reload").click()
        pg.wait_for_selector(DRAWN, timeout=120_000)
        assert kernel_id(pg) != kid
        assert_not_ended(pg)
        nodes_change_works(pg, 4)
        assert_not_ended(pg)
    finally:
        pg.context.close()


@pytest.mark.timeout(300)
def test_a_culled_kernel_says_so(browser, app_url):
    """The page's socket closes while its kernel is gone (as after a cull, or a server restart): the page finds
    ``GET /api/kernels/<id>`` answering 404 and says so."""
    pg = open_page(browser, app_url)
    try:
        kid = kernel_id(pg)
        open_paste_box(pg)
        status = pg.evaluate("""async (kid) => {
            const form = new FormData();
            const r = await fetch('voila/api/shutdown/' + kid, {method: 'POST', body: form});
            return r.status;
        }""", kid)
        assert status == 204
        assert kernel_status(app_url, kid) == 404
        assert_not_ended(pg)  # its socket is still open: nothing has told the page yet
        # the text box sends its value, over the websocket limit: the server closes the page's socket
        open_paste_box(pg).fill(json.dumps({"pad": "x" * OVER_WEBSOCKET_LIMIT}))
        assert_ended(pg, timeout_ms=20_000)
    finally:
        pg.context.close()
