"""Shared helpers for the real-browser and served-page tests (and benchmarks/bench_app.py): Debian Chromium's launch
settings, loopback ports, starting and stopping the planner's Voila server (``serve_app``), a stdlib PNG check.

Playwright's own browser download is not reachable here; the tests launch /usr/bin/chromium (override with
ZEROPLANNER_CHROMIUM) with the flags below.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

CHROMIUM = os.environ.get("ZEROPLANNER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]
BAD_CONSOLE = re.compile(r"not registered|failed to load", re.IGNORECASE)
"""Console text of widgets that did not load (voila #1188, #1472)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until something listens on 127.0.0.1:port; RuntimeError if ``proc`` exits, TimeoutError after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


ROOT = Path(__file__).resolve().parents[1]
"""The repository root: the servers run with it as their working directory."""


def stop_process(proc: subprocess.Popen, grace_seconds: float = 15.0) -> None:
    """Stop ``proc``: SIGTERM, then SIGKILL if it has not exited after ``grace_seconds``; waits for it (reaped, no
    zombie). Safe to call on a process that has already exited."""
    proc.terminate()
    try:
        proc.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def app_command(port: int, args: Sequence[str] = ()) -> list[str]:
    """``python -m zeroplanner.cli app --port PORT --no-browser *args`` (the planner page, as users start it)."""
    return [sys.executable, "-m", "zeroplanner.cli", "app", "--port", str(port), "--no-browser", *args]


class Server(NamedTuple):
    """A server started by :func:`serve_app`: its page ``url`` (``http://127.0.0.1:PORT/``), ``port``, the process,
    and the file holding its stdout and stderr (None when the output is discarded)."""

    url: str
    port: int
    proc: subprocess.Popen
    log_path: Path | None


def log_tail(log_path: Path | None, chars: int = 3000) -> str:
    """The last ``chars`` characters of a server log ('' when there is no log)."""
    return log_path.read_text(errors="replace")[-chars:] if log_path is not None and log_path.exists() else ""


@contextlib.contextmanager
def serve_app(args: Sequence[str] = (), *, log_path: Path | None = None, timeout: float = 60.0,
              command: Callable[[int], Sequence[str]] | None = None, env: Mapping[str, str] | None = None,
              check_log: bool = True) -> Iterator[Server]:
    """Run a Voila server on a free loopback port for the duration of a ``with`` block.

    The default command is :func:`app_command` (``zeroplanner app --port P --no-browser *args``, e.g.
    ``args=("--max-kernels", "2")``); ``command(port)`` replaces it (e.g. ``python -m voila`` with
    ``zeroplanner.server.voila_argv``), ``env`` replaces the environment (default: inherited). The working
    directory is the repository root. stdout and stderr go to ``log_path`` (discarded when None).

    Yields a :class:`Server` once something listens on the port. Raises RuntimeError (the server exited) or
    TimeoutError (nothing listening after ``timeout`` seconds), with the log's tail.
    When the block ends normally and ``check_log`` is set, asserts that the log holds no "Traceback"; the log is
    read BEFORE the server is stopped, because at shutdown a pre-heated kernel killed mid-wait can log a ZMQ
    traceback that says nothing about the pages served. The server is always stopped (:func:`stop_process`).
    """
    port = free_port()
    cmd = list(command(port)) if command is not None else app_command(port, args)
    with open(log_path, "wb") if log_path is not None else contextlib.nullcontext(subprocess.DEVNULL) as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=dict(env) if env is not None else None)
    try:
        try:
            wait_for_port(port, proc, timeout)
        except (RuntimeError, TimeoutError) as e:
            raise type(e)(f"{' '.join(cmd[1:5])}: {e}\n{log_tail(log_path, 2000)}") from e
        yield Server(f"http://127.0.0.1:{port}/", port, proc, log_path)
        if check_log and log_path is not None:
            server_log = log_path.read_text(errors="replace")
            assert "Traceback" not in server_log, server_log[-3000:]
    finally:
        stop_process(proc)


PLANNER_DRAWN = ".zp-app .bqplot svg .bargroup rect"
"""The selector that appears once the planner page has drawn its first chart."""


def open_page(browser, url: str, viewport: Mapping[str, int], *, wait_for: str = PLANNER_DRAWN,
              timeout_ms: float = 120_000, failed_requests: bool = False):
    """A new browser context and page at ``url`` after ``wait_for`` appears; console messages and page errors (and
    with ``failed_requests`` failed loads) are recorded in ``page.zp_console`` as ``"<type>: <text>"``. Returns
    (context, page); the caller closes the context."""
    ctx = browser.new_context(viewport=dict(viewport))
    page = ctx.new_page()
    page.zp_console = []
    page.on("console", lambda m: page.zp_console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: page.zp_console.append(f"pageerror: {e}"))
    if failed_requests:
        page.on("requestfailed", lambda r: page.zp_console.append(f"error: Failed to load {r.url}"))
    page.goto(url, timeout=timeout_ms)
    page.wait_for_selector(wait_for, timeout=timeout_ms)
    return ctx, page


def png_stats(data: bytes) -> tuple[int, int, int]:
    """(width, height, distinct byte values of the decompressed image data) of a PNG; stdlib only (zlib)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


async def read_frames(ws, seconds: float, settle_seconds: float) -> list[str]:
    """Frames (decoded as text) a tornado websocket client ``ws`` receives within ``seconds``, stopping
    ``settle_seconds`` after a ``kernel_info_reply`` arrives (what follows a probe request has arrived by then) or
    when the socket closes."""
    received: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            raw = await asyncio.wait_for(ws.read_message(), timeout=max(0.1, end - time.monotonic()))
        except asyncio.TimeoutError:
            break
        if raw is None:
            break
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        received.append(text)
        if '"kernel_info_reply"' in text:
            end = min(end, time.monotonic() + settle_seconds)
    return received
