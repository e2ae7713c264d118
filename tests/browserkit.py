"""Shared helpers for the real-browser tests: Debian Chromium's launch settings, loopback ports, a stdlib PNG check.

Playwright's own browser download is not reachable here; the tests launch /usr/bin/chromium (override with
ZEROPLANNER_CHROMIUM) with the flags below.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import time
import zlib

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
