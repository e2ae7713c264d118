"""Benchmark the planner page in a real browser (Voilà + Playwright + Debian Chromium), against a bare Voilà page
with one slider served the same way in the same run.

Measures
- slider -> updated chart: the node-count slider's readout is set (Enter pressed) and the time until the last DOM
  mutation inside the page's drawn bqplot figures and the verdict (at 1440 x 900 only the main chart is drawn; the
  other charts are tabs) (the update is complete when no mutation follows for 0.4 s). The bare
  page's equivalent is an IntSlider whose change makes the kernel update a Label. Median and p95 over N changes.
- cold load: navigation to the first drawn bar (planner) or the rendered slider (bare page), each load with a fresh
  kernel, median over M loads.
- widget models per planner page (counted in this process).
Prints absolute times and the planner/bare ratios. Targets: slider-to-chart p95 < 150 ms (issue 4); p95 <= 1.5x
and cold load <= 1.2x the bare page (issue 17).

Run: ``python benchmarks/bench_app.py [--changes 30] [--loads 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browserkit import CHROMIUM, CHROMIUM_ARGS, serve_app  # noqa: E402  (Chromium flags, server start/stop)

QUIET_SECONDS = 0.4
VIEWPORT = {"width": 1440, "height": 900}
"""The size the planner's one-view layout is built for (issue 17)."""


def widget_models() -> int:
    """Widget models one planner page creates (each is a comm the page must load)."""
    import warnings

    import ipywidgets as w

    from zeroplanner.ui import PlannerApp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        before = len(w.Widget.widgets)
        PlannerApp()
        return len(w.Widget.widgets) - before

BARE_NOTEBOOK_CODE = """import ipywidgets as w
slider = w.IntSlider(value=1, min=1, max=128, description="Nodes", continuous_update=False)
out = w.Label(value="1")
slider.observe(lambda ch: setattr(out, "value", str(ch["new"] * 2)), names="value")
w.VBox([slider, out])"""

# Records the time of Enter (start) and of the last mutation inside the watched elements (end).
WATCH_JS = """(selector) => {
  window.__zp = {t0: null, last: null, count: 0};
  document.addEventListener('keydown', e => { if (e.key === 'Enter') { window.__zp.t0 = performance.now();
                                              window.__zp.last = null; window.__zp.count = 0; } }, true);
  const obs = new MutationObserver(() => { if (window.__zp.t0 !== null) { window.__zp.last = performance.now();
                                                                         window.__zp.count += 1; } });
  document.querySelectorAll(selector).forEach(el => obs.observe(el, {subtree: true, childList: true,
                                                                     attributes: true, characterData: true}));
}"""


def cold_load(browser, url: str, ready_selector: str) -> float:
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    t0 = time.perf_counter()
    page.goto(url, timeout=120_000)
    page.wait_for_selector(ready_selector, timeout=120_000)
    elapsed = time.perf_counter() - t0
    ctx.close()
    return elapsed


def slider_latencies(browser, url: str, ready_selector: str, watch_selector: str, values: list[int]) -> list[float]:
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    page.goto(url, timeout=120_000)
    page.wait_for_selector(ready_selector, timeout=120_000)
    time.sleep(1.0)
    page.evaluate(WATCH_JS, watch_selector)
    slider = page.locator(".widget-slider", has=page.locator("label.widget-label", has_text="Nodes")).first
    readout = slider.locator(".widget-readout")
    out = []
    for value in values:
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type(str(value))
        page.keyboard.press("Enter")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(0.05)
            st = page.evaluate("() => [window.__zp.t0, window.__zp.last, window.__zp.count, performance.now()]")
            if st[1] is not None and st[3] - st[1] > QUIET_SECONDS * 1e3:
                out.append((st[1] - st[0]) / 1e3)
                break
        else:
            raise TimeoutError(f"no update after setting {value}")
    ctx.close()
    return out


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--loads", type=int, default=3)
    args = parser.parse_args(argv)

    import nbformat
    from playwright.sync_api import sync_playwright

    from zeroplanner.server import voila_argv, voila_env

    tmp = Path(tempfile.mkdtemp(prefix="zp-bench-"))
    bare_nb = tmp / "bare.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(BARE_NOTEBOOK_CODE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(bare_nb))

    values = [2 + (i * 5) % 60 for i in range(args.changes)]
    values = [v if i == 0 or v != values[i - 1] else v + 1 for i, v in enumerate(values)]
    # both servers' output is discarded (no log), as before; both are stopped when the block ends
    with (serve_app(timeout=60.0) as app,
          serve_app(command=lambda port: [sys.executable, "-m", "voila", *voila_argv(bare_nb, port)],
                    env=voila_env(), timeout=60.0) as bare):
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            app_url, bare_url = app.url, bare.url
            app_ready, bare_ready = ".zp-app .bqplot svg .bargroup rect", ".widget-slider .widget-readout"
            # warm both servers once (first kernel start imports everything from a cold disk cache)
            cold_load(browser, app_url, app_ready)
            cold_load(browser, bare_url, bare_ready)
            app_loads, bare_loads = [], []
            for _ in range(args.loads):
                app_loads.append(cold_load(browser, app_url, app_ready))
                bare_loads.append(cold_load(browser, bare_url, bare_ready))
            app_lat = slider_latencies(browser, app_url, app_ready, ".zp-app .bqplot, .zp-app .zp-verdict",
                                       values)
            bare_lat = slider_latencies(browser, bare_url, bare_ready, ".jp-OutputArea-output", values)
            browser.close()

    def row(name, a, b):
        print(f"{name:<34} planner {a * 1e3:8.1f} ms   bare {b * 1e3:8.1f} ms   ratio {a / b:6.2f}")

    print(f"planner page vs bare Voila page with one slider ({len(values)} slider changes, {args.loads} cold loads)")
    row("slider -> chart, median", statistics.median(app_lat), statistics.median(bare_lat))
    row("slider -> chart, p95", p95(app_lat), p95(bare_lat))
    row("cold load, median", statistics.median(app_loads), statistics.median(bare_loads))
    verdict = "meets" if p95(app_lat) < 0.150 else "MISSES"
    print(f"target slider -> chart p95 < 150 ms: {verdict} ({p95(app_lat) * 1e3:.1f} ms)")
    ratio, cold = p95(app_lat) / p95(bare_lat), statistics.median(app_loads) / statistics.median(bare_loads)
    print(f"target p95 <= 1.5x bare: {'meets' if ratio <= 1.5 else 'MISSES'} ({ratio:.2f}x); "
          f"cold load <= 1.2x bare: {'meets' if cold <= 1.2 else 'MISSES'} ({cold:.2f}x)")
    print(f"widget models per planner page: {widget_models()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
