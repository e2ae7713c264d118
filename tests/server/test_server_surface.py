"""What an unauthenticated client can make the planner's server do, beyond opening the page (issue 33, items 1, 5, 6).

Each test first makes the request that misbehaved on the server before this issue (the attack), then checks the
answer. Before: ``/logout`` and ``/voila/templates/foo`` answered HTTP 500 with a traceback in the server log, 404s
under ``/voila/api/themes/`` and ``/voila/labextensions/`` logged "Uncaught exception in write_error", a frame that is
not a Jupyter message closed the page's websocket with a traceback, a scripted ``comm_open`` got a traceback naming
server paths back, and every plain ``GET /`` held a kernel until the 600 s cull.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
import uuid

import pytest

from ..browserkit import read_frames, serve_app

pytest.importorskip("voila")

KERNEL_ID = re.compile(r'"kernelId":\s*"([0-9a-f-]{36})"')
PATH_LEAK = re.compile(r"Traceback \(most recent|File \"/|site-packages|/root/|/home/|/usr/")
"""What a reply must not show: a Python traceback or a server file path."""


def _get(url: str) -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, r.read().decode(errors="replace"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace"), dict(e.headers)


def _no_traceback(log_text: str) -> None:
    assert "Traceback" not in log_text and "Uncaught exception" not in log_text, log_text[-3000:]


@pytest.mark.timeout(240)
def test_routes_a_page_does_not_need_answer_plain_errors_and_log_no_traceback(tmp_path):
    log = tmp_path / "server.log"
    with serve_app(log_path=log, timeout=90.0, check_log=False) as server:
        probes = ["logout", "login", "voila/templates/foo", "voila/templates/%2e%2e/%2e%2e/etc/passwd",
                  "voila/templates/zeroplanner/static/%2e%2e/%2e%2e/conf.json", "voila/templates/lab/static/x.css",
                  "voila/templates/zeroplanner/static//etc/passwd", "voila/api/themes/nope",
                  "voila/api/themes/%2e%2e/%2e%2e/x", "voila/labextensions/nope", "voila/labextensions/%2e%2e/x",
                  "voila/static/nope", "voila/files/nope.png", "voila/api/shutdown/nope", "api/kernels",
                  "api/kernels/00000000-0000-0000-0000-000000000000/channels", "voila/query/nope", "nope/at/all"]
        for path in probes:
            status, body, headers = _get(server.url + path)
            assert 400 <= status < 500, (path, status, body[:300])
            assert not PATH_LEAK.search(body), (path, body[:500])
        # what the page itself loads still loads: the template's static files (the light theme among them)
        for path in ("voila-style.js", "theme-light.css", "index.css"):
            status, body, headers = _get(server.url + "voila/templates/zeroplanner/static/" + path)
            assert status == 200 and body, (path, status)
        _no_traceback(log.read_text(errors="replace"))
        # an unknown route's error is the plain text line, not a rendered template
        status, body, headers = _get(server.url + "voila/api/themes/nope")
        assert status == 404 and body == "404: Not Found\n" and headers["Content-Type"].startswith("text/plain")


@pytest.mark.timeout(240)
def test_every_response_carries_the_page_content_security_policy(tmp_path):
    from zeroplanner.pagejs import content_security_policy

    with serve_app(log_path=tmp_path / "server.log", timeout=90.0) as server:
        status, body, headers = _get(server.url)
        assert status == 200
        assert headers["Content-Security-Policy"] == content_security_policy()
        assert "script-src-attr 'unsafe-hashes' 'sha256-" in headers["Content-Security-Policy"]
        status, _, headers = _get(server.url + "voila/api/themes/nope")
        assert headers["Content-Security-Policy"] == content_security_policy()


def _message(msg_type: str, content: dict, channel: str = "shell") -> str:
    return json.dumps({
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": uuid.uuid4().hex,
                   "username": "visitor", "date": "2026-01-01T00:00:00Z", "version": "5.3"},
        "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": []})


MALFORMED_FRAMES: tuple[str | bytes, ...] = (
    "not json", "{}", "[]", '{"channel": "shell"}', json.dumps({"header": {}, "channel": "shell"}),
    json.dumps({"header": None, "content": None, "channel": "shell"}), "\u0000" * 8, b"\x00\x01\x02\xffgarbage",
    b"\x08\x00\x00\x00\x00\x00\x00\x00" * 3,
)
"""Frames that are not Jupyter messages (text and binary)."""


@pytest.mark.timeout(240)
def test_malformed_frames_and_bogus_comms_are_dropped_with_one_line_and_no_paths(tmp_path):
    from tornado.websocket import websocket_connect

    log = tmp_path / "server.log"
    with serve_app(log_path=log, timeout=90.0, check_log=False) as server:
        status, html, _ = _get(server.url)
        assert status == 200
        kernel_id = KERNEL_ID.search(html).group(1)
        url = f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
        bogus_comms = [
            _message("comm_open", {"comm_id": uuid.uuid4().hex, "target_name": "jupyter.widget",
                                   "data": {"state": {"_model_name": "Nope", "_model_module": "x"}}}),
            _message("comm_open", {"comm_id": uuid.uuid4().hex, "target_name": "jupyter.widget", "data": {}}),
            _message("comm_open", {"comm_id": uuid.uuid4().hex, "target_name": "no.such.target", "data": {}}),
            _message("comm_msg", {"comm_id": "no-such-comm", "data": {"method": "update", "state": {}}}),
            _message("comm_close", {"comm_id": "no-such-comm", "data": {}}),
        ]

        async def attack() -> tuple[list[str], bool]:
            ws = await websocket_connect(url)
            for frame in (*MALFORMED_FRAMES, *bogus_comms):
                await ws.write_message(frame, binary=isinstance(frame, bytes))
            await ws.write_message(_message("kernel_info_request", {}))  # the socket still works after all that
            received = await read_frames(ws, 30, 3)  # the comm errors' output, if any, arrives by then
            alive = any('"kernel_info_reply"' in text for text in received)
            ws.close()
            return received, alive

        received, alive = asyncio.run(attack())
        assert alive, "the page's websocket closed after malformed frames"
        for text in received:
            assert not PATH_LEAK.search(text), text[:1500]
        server_log = log.read_text(errors="replace")
        _no_traceback(server_log)
        dropped = re.findall(rf"kernel {kernel_id}: dropped a malformed websocket message", server_log)
        assert len(dropped) == len(MALFORMED_FRAMES), server_log[-3000:]


@pytest.mark.timeout(240)
def test_a_kernel_no_page_connects_to_is_shut_down_and_one_address_cannot_fill_the_server(tmp_path):
    """A bounded loop of plain GETs (no browser, so no websocket) on 127.0.0.1: before, each GET held a kernel until
    the idle cull (600 s) and 4 GETs filled ``--max-kernels 4``. Now each such kernel is shut down
    ``--connect-timeout-seconds`` after its page was sent, and one address gets at most
    ``--max-pending-per-client`` of them at once (HTTP 503 with the retrying page over it)."""
    log = tmp_path / "server.log"
    args = ["--max-kernels", "4", "--pool", "0", "--connect-timeout-seconds", "4", "--max-pending-per-client", "2"]
    with serve_app(args, log_path=log, timeout=90.0) as server:
        statuses, kernels = [], []
        for _ in range(4):  # bounded: 4 requests
            status, body, headers = _get(server.url)
            statuses.append(status)
            if status == 200:
                kernels.append(KERNEL_ID.search(body).group(1))
            else:
                assert "Too many planner pages are opening from your address" in body, body[:500]
                assert headers.get("Retry-After") == "30"
        assert statuses == [200, 200, 503, 503], statuses
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if all(f"Kernel shutdown: {k}" in text for k in kernels):
                break
            time.sleep(0.5)
        text = log.read_text(errors="replace")
        for k in kernels:
            assert f"kernel {k}: no page connected within 4 s of its page being sent to 127.0.0.1" in text, text
            assert f"Kernel shutdown: {k}" in text, text[-3000:]
        status, _, _ = _get(server.url)  # the address may open pages again
        assert status == 200
