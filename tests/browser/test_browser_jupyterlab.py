"""The planner inline in JupyterLab, as README's "In JupyterLab" line sets it up (the ``notebook`` extra): open
notebooks/planner.ipynb, run its cells, and the app draws in the notebook in Debian Chromium at 1440 x 900 and
800 x 900.

Measured from the DOM: the first chart's bars appear, no widget failed to load ("Error displaying widget", the
console's "not registered" / "failed to load"), no ipywidgets version warning ("Unsatisfied version"), no control
label is cut off (scrollWidth > clientWidth), and the app is no wider than the notebook's cell.
"""

from __future__ import annotations

import shutil
import sys

import pytest

pytestmark = pytest.mark.browser

playwright_sync = pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab")

from ..browserkit import BAD_CONSOLE, PLANNER_DRAWN, ROOT, open_page, serve_app  # noqa: E402

LABEL_CUT = """() => [...document.querySelectorAll(
    '.zp-app .widget-label, .zp-app .widget-label-basic, .zp-app .lm-TabBar-tabLabel, .zp-app .widget-inline-hbox label')]
  .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.textContent)"""


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "notebooks" / "planner.ipynb", root / "planner.ipynb")

    def command(port: int) -> list[str]:
        return [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
                f"--ServerApp.root_dir={root}", "--IdentityProvider.token=", "--ServerApp.password=",
                "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=True",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.news_url=None", "--LabApp.extension_manager=readonly", "--allow-root"]

    with serve_app(command=command, log_path=root / "lab.log", timeout=90.0, check_log=False) as server:
        yield server.url


@pytest.mark.parametrize("width", [1440, 800])
def test_planner_runs_inline_in_jupyterlab(browser, lab_url, width):
    ctx, page = open_page(browser, f"{lab_url}lab/tree/planner.ipynb", {"width": width, "height": 900},
                          wait_for=".jp-Notebook .jp-Cell", timeout_ms=120_000)
    try:
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                               " && window.jupyterapp.shell.currentWidget.sessionContext", timeout=60_000)
        # run-all before the notebook's kernel is up is a no-op: wait for its session, then run
        page.evaluate("""async () => {
            const nb = window.jupyterapp.shell.currentWidget;
            await nb.context.ready;
            await nb.sessionContext.ready;
            await window.jupyterapp.commands.execute('notebook:run-all-cells');
        }""")
        page.wait_for_selector(PLANNER_DRAWN, timeout=120_000)
        page.wait_for_timeout(1500)
        assert page.locator("text=Error displaying widget").count() == 0
        bad = [m for m in page.zp_console if BAD_CONSOLE.search(m) or "Unsatisfied version" in m]
        assert not bad, bad
        assert page.evaluate(LABEL_CUT) == []
        app_right, cell_right = page.evaluate("""() => [
            document.querySelector('.zp-app').getBoundingClientRect().right,
            document.querySelector('.jp-Cell-outputArea').getBoundingClientRect().right]""")
        assert app_right <= cell_right + 1, (app_right, cell_right)
    finally:
        ctx.close()
