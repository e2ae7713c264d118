"""Fixtures every browser test module shares: the planner's server and one Chromium per module."""

from __future__ import annotations

from pathlib import Path

import pytest

playwright_sync = pytest.importorskip("playwright.sync_api")

from ..browserkit import CHROMIUM, CHROMIUM_ARGS, serve_app  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """``zeroplanner app --port P --no-browser`` in a subprocess; at teardown its log must hold no traceback (read
    while serving, before shutdown kills the pre-heated kernel waiting for a page), then it is stopped."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with serve_app(log_path=tmp_path_factory.mktemp("voila") / "server.log", timeout=60.0) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()
