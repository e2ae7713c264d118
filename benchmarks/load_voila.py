"""Load test of the planner's Voilà server: N simultaneous visitors on 127.0.0.1, then culling.

What it does (bounded in time by ``--deadline-seconds`` and in count by ``--sessions``; loopback only):

1. Starts ``zeroplanner app`` (the same server users get: :class:`zeroplanner.server.voila_app.ZeroplannerVoila`,
   pre-heated kernel, kernel cap) on a free 127.0.0.1 port with ``--max-kernels N`` and a short idle-cull timeout
   (``--cull-idle-seconds``, default 120 s instead of the shipped 600 s, so the test waits for culling in minutes,
   not tens of minutes; it must exceed the slowest page's time to connect its websocket, since the culler shuts
   down an idle kernel with no connection: a 20 s timeout under 30 loading pages culled kernels whose pages were
   still loading).
2. Measures the server's memory at rest: RSS of the server process and of its kernel children (psutil; the
   pre-heated kernel has already executed the page).
3. Opens N pages at once in ONE Debian Chromium (Playwright, one browser context per visitor, so each page has its
   own cookies and its own kernel over its own websocket). Per page: time to interactive = from navigation to the
   DeepSpeed JSON preview showing exactly the default scenario's config; then it types a node count into the
   "Nodes" slider's readout (a different count per visitor) and waits until the preview shows exactly
   ``json.dumps(zeroplanner.deepspeed.to_deepspeed_config(zeroplanner.planner.plan(scenario)), indent=2)`` for the
   changed scenario, computed in this script. Console "pageerror" / "not registered" / "Failed to load" messages
   count as errors.
4. With all N pages open: peak RSS (server, each kernel), and one more request, which must get the HTTP 503
   "planner is full" page (the cap is N).
5. Closes every page without running unload handlers (like a killed tab: the kernels are NOT shut down by the page)
   and waits for jupyter_server's culler to shut them down; then the pre-heated kernel refills. Memory after =
   the same measurement as 2 once only the refilled pre-heated kernel is left and its memory is steady.

Soak (``--waves W``): steps 3-5 repeated W times (a workshop day: waves of visitors), recording the
server's and the kernels' RSS with each wave open and after each wave's culling (the pool refilled and settled).
``--pool P`` sets ``zeroplanner app --pool`` (pre-executed kernels; the cap is then N + P - 1, so with the shipped
pool of 1 it is N and the check of step 4 applies; with a bigger pool that check is skipped: the pool serves the
extra visitor). ``--close unload`` closes pages like closed tabs (their shutdown beacon) instead of killed ones.

Each page's wait is split: the server's part is the page's HTML, request to last byte (Navigation Timing in the
browser), plus the widget-state reply, the page's request to the first state sent (``zeroplanner app
--log-timings`` logs it per kernel); the rest is the browser loading and drawing the page. ``--tracemalloc`` runs
the server with tracemalloc and reports the allocation sites that grew from after wave 1 to after the last wave.

Acceptance: every session gets the correct config, no errors, memory after within 10% of before; with 3
or more waves also the server's RSS after the last wave within 5% of after wave 2.
Writes ``--output`` (default ``docs/reliability.md``) with the machine's cores and load and the figures
(``--render-only A.json B.json`` joins several runs' ``--json`` files into one report).
Exit status 0 when the acceptance holds, 1 otherwise, 2 for bad options.

    python benchmarks/load_voila.py                      # 30 sessions, writes docs/reliability.md
    python benchmarks/load_voila.py --sessions 3 --output /tmp/r.md
    python benchmarks/load_voila.py --waves 6 --sessions 20 --pool 20 --json soak.json   # the soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/browserkit.py: Chromium settings and the server helper the tests use
from tests.browserkit import BAD_CONSOLE, CHROMIUM, serve_app  # noqa: E402
from tests.browserkit import CHROMIUM_ARGS as _BROWSER_ARGS  # noqa: E402

CHROMIUM_ARGS = [*_BROWSER_ARGS, "--disable-dev-shm-usage"]  # 30 renderers: /dev/shm may be small in containers
MIB = 2 ** 20
GIB = 2 ** 30
MEMORY_TOLERANCE = 0.10
"""Acceptance: total server memory after the sessions close within 10% of before."""
SERVER_SOAK_TOLERANCE = 0.05
"""Soak acceptance: the server's RSS after the last wave within 5% of its RSS after wave 2."""


# ---------------------------------------------------------------------------------------------------------------
# Expected configs (computed here, independently of the page)
# ---------------------------------------------------------------------------------------------------------------
def expected_config(nodes: int) -> str:
    """The DeepSpeed JSON the page must show for the default scenario on ``nodes`` nodes."""
    from zeroplanner.deepspeed import to_deepspeed_config
    from zeroplanner.planner import plan
    from zeroplanner.scenarios import default_scenario
    from zeroplanner.specs import replace

    scenario = default_scenario()
    scenario = replace(scenario, cluster=replace(scenario.cluster, nodes=nodes))
    return json.dumps(to_deepspeed_config(plan(scenario), mode="deepspeed"), indent=2)


def node_count(i: int) -> int:
    """Visitor ``i``'s node count: 2..17, different neighbours, never the default 1."""
    return 2 + (i * 7) % 16


# ---------------------------------------------------------------------------------------------------------------
# Server and memory
# ---------------------------------------------------------------------------------------------------------------






def memory(server_pid: int) -> dict:
    """RSS in bytes of the server process and of each kernel (its children, recursively), and the CPU seconds all
    of them have used so far."""
    server = psutil.Process(server_pid)
    kernels = {}
    cpu = sum(server.cpu_times()[:2])
    for child in server.children(recursive=True):
        try:
            kernels[child.pid] = child.memory_info().rss
            cpu += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    server_rss = server.memory_info().rss
    return {"server": server_rss, "kernels": kernels, "total": server_rss + sum(kernels.values()), "cpu": cpu}


def cpu_split() -> tuple[float, float]:
    """(CPU seconds used by the whole machine since boot, CPU seconds used so far by this script and everything it
    started: the server, its kernels, Playwright's driver and Chromium). The difference of two samples says how much
    CPU other jobs took during a run (approximate: processes that exited in between are not counted in the second
    number)."""
    machine = psutil.cpu_times()
    own = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            own += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return machine.user + machine.system + getattr(machine, "nice", 0.0), own


def wait_steady(server_pid: int, kernels: int, deadline: float, log: Path, pool_fills: int) -> dict:
    """Wait until the server has exactly ``kernels`` kernel processes, the log shows ``pool_fills`` pre-heated
    fills, and over 3 s the total RSS changed by under 1% and the processes used under 0.15 CPU seconds (the
    pre-heated kernel has finished executing the page); return that memory."""
    last = None
    while time.monotonic() < deadline:
        now = memory(server_pid)
        fills = log.read_text(errors="replace").count("Kernel pool of")
        if len(now["kernels"]) == kernels and fills >= pool_fills:
            if (last is not None and abs(now["total"] - last["total"]) < 0.01 * last["total"]
                    and now["cpu"] - last["cpu"] < 0.15):
                return now
            last = now
        else:
            last = None
        time.sleep(3)
    raise TimeoutError(f"server never settled at {kernels} kernel(s) (pool fills needed: {pool_fills})")




def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


# ---------------------------------------------------------------------------------------------------------------
# Browser sessions
# ---------------------------------------------------------------------------------------------------------------
WAIT_TEXT = ("expected => { const t = document.querySelector('.zp-config textarea');"
             " return t !== null && t.value === expected; }")


NAVIGATION_TIMING = ("() => { const e = performance.getEntriesByType('navigation')[0];"
                     " return e ? {requestStart: e.requestStart, responseEnd: e.responseEnd} : null; }")
"""The page document's request start and response end (W3C Navigation Timing Level 2), milliseconds."""

CONTROL_COMM_PROBE = """
(() => {
  // load_voila.py diagnostics (not part of the page): log when the widget manager's 4 s control-comm timer
  // (jupyterlab_widgets, base-manager _loadFromKernel) is set and when it fires; the delay is not changed
  // unless --force-widget-fallback set window.__zpForceFallback (then it is 0 ms).
  const nativeSetTimeout = window.setTimeout;
  window.setTimeout = function (handler, delay, ...rest) {
    if (typeof handler === 'function' && String(handler).indexOf('Control comm did not respond in time') !== -1) {
      if (window.__zpForceFallback) { delay = 0; }
      const t0 = performance.now();
      console.log('zp-diag: control comm timer (' + delay + ' ms) set at ' + Math.round(t0) + ' ms');
      const inner = handler;
      handler = function () {
        console.log('zp-diag: control comm timer fired at ' + Math.round(performance.now()) + ' ms');
        return inner.apply(this, arguments);
      };
    }
    return nativeSetTimeout.call(this, handler, delay, ...rest);
  };
})();
"""
"""Playwright init script: page-clock times of the control-comm timer, to tell a 4 s timeout from other causes of
ipywidgets' per-widget fallback (jupyter-widgets/ipywidgets#3633) in a failed session."""

FORCE_FALLBACK = "window.__zpForceFallback = true;"
"""Init script added by ``--force-widget-fallback``: the control-comm timer fires at once, so every page asks for
its widgets one by one (the page's largest IOPub burst, ~1,100 messages); a stress case, not what visitors see."""


def kernel_frame_summary(payload) -> str:
    """One kernel-websocket frame as ``channel/msg_type[/comm method]``: JSON text frames, or jupyter_server's binary
    ``v1.kernel.websocket.jupyter.org`` frames (8-byte little-endian offset count, the offsets, then channel, header,
    ... parts; jupyter_server/services/kernels/connection/base.py). For failed-session diagnostics only."""
    try:
        if isinstance(payload, (bytes, bytearray)):
            n = int.from_bytes(payload[:8], "little")
            offsets = [int.from_bytes(payload[8 * (k + 1):8 * (k + 2)], "little") for k in range(n)]
            channel = payload[offsets[0]:offsets[1]].decode()
            header = json.loads(payload[offsets[1]:offsets[2]])
            content = json.loads(payload[offsets[4]:offsets[5]]) if n > 5 else {}
        else:
            msg = json.loads(payload)
            channel, header, content = msg.get("channel", "?"), msg.get("header", {}), msg.get("content", {})
        kind = f"{channel}/{header.get('msg_type', '?')}"
        data = content.get("data") if isinstance(content, dict) else None
        if isinstance(data, dict) and "method" in data:
            kind += f"/{data['method']}"
        if isinstance(content, dict) and "execution_state" in content:
            kind += f"/{content['execution_state']}"
        return kind
    except Exception as exc:  # diagnostics must never fail a session
        return f"unparsed ({type(exc).__name__})"


async def session(browser, url: str, i: int, default_text: str, changed_text: str, timeout_ms: int,
                  force_fallback: bool = False) -> dict:
    """One visitor. Returns {ok, tti_seconds, change_seconds, error, console_errors}."""
    out = {"i": i, "nodes": node_count(i), "ok": False, "tti_seconds": None, "change_seconds": None, "error": "",
           "bad_console": [], "console_errors": 0}
    ctx = await browser.new_context(viewport={"width": 1400, "height": 1000})
    if force_fallback:
        await ctx.add_init_script(FORCE_FALLBACK)
    await ctx.add_init_script(CONTROL_COMM_PROBE)
    out["_ctx"] = ctx
    page = await ctx.new_page()
    out["_page"] = page

    console_tail: list = []  # every console message (any type), trimmed to the last 40 for a failed session

    diag: list = []

    def on_console(m):
        console_tail.append(f"{m.type}: {m.text[:200]}")
        del console_tail[:-40]
        if m.text.startswith("zp-diag:"):
            diag.append(f"{time.monotonic() - t_start:.1f}s {m.text}")
        if m.type == "error":
            out["console_errors"] += 1
            out.setdefault("console_samples", set()).add(m.text[:160])
        if BAD_CONSOLE.search(m.text):
            out["bad_console"].append(m.text[:200])

    page.on("console", on_console)
    frames: list = []  # (seconds since start, direction, summary) of the kernel websocket, for failed sessions
    out["_frames"] = frames
    t_start = time.monotonic()

    def on_websocket(ws):
        if "/channels" not in ws.url:
            return
        kernel = re.search(r"/api/kernels/([0-9a-f-]{36})/channels", ws.url)
        if kernel and "kernel_id" not in out:
            out["kernel_id"] = kernel.group(1)
        frames.append((time.monotonic() - t_start, "open", ws.url.split("?")[0][-60:]))
        ws.on("framesent", lambda p: frames.append((time.monotonic() - t_start, "sent", kernel_frame_summary(p))))
        ws.on("framereceived",
              lambda p: frames.append((time.monotonic() - t_start, "recv", kernel_frame_summary(p))))
        ws.on("close", lambda _ws: frames.append((time.monotonic() - t_start, "close", "")))

    page.on("websocket", on_websocket)
    page.on("pageerror", lambda e: out["bad_console"].append(f"pageerror: {str(e)[:200]}"))
    page.on("requestfailed", lambda r: out["bad_console"].append(f"Failed to load {r.url}"))
    pending: dict = {}  # HTTP requests the page started and that neither finished nor failed (diagnostics)
    page.on("request", lambda r: pending.__setitem__(id(r), (time.monotonic(), r.url)))
    page.on("requestfinished", lambda r: pending.pop(id(r), None))
    page.on("requestfailed", lambda r: pending.pop(id(r), None))
    try:
        t0 = time.monotonic()
        await page.goto(url, timeout=timeout_ms, wait_until="commit")
        await page.wait_for_function(WAIT_TEXT, arg=default_text, timeout=timeout_ms, polling=200)
        await page.wait_for_selector(".zp-app .bqplot svg .bargroup rect", timeout=timeout_ms)
        out["tti_seconds"] = time.monotonic() - t0
        try:  # the page's HTML: request sent -> last byte (Navigation Timing, milliseconds since navigation start)
            nav = await page.evaluate(NAVIGATION_TIMING)
            out["html_seconds"] = (nav["responseEnd"] - nav["requestStart"]) / 1000 if nav else None
        except Exception:
            out["html_seconds"] = None
        name = page.locator("label.widget-label", has_text=re.compile("^Nodes$"))
        readout = page.locator(".zp-app .widget-slider", has=name).locator(".widget-readout")
        t1 = time.monotonic()
        await readout.click(timeout=timeout_ms)
        await page.keyboard.press("Control+A")
        await page.keyboard.type(str(node_count(i)))
        await page.keyboard.press("Enter")
        await page.wait_for_function(WAIT_TEXT, arg=changed_text, timeout=timeout_ms, polling=200)
        out["change_seconds"] = time.monotonic() - t1
        text = await page.locator(".zp-config textarea").input_value()
        out["ok"] = text == changed_text and not out["bad_console"]
        if text != changed_text:
            out["error"] = "config text differs from the expected one"
        elif out["bad_console"]:
            out["error"] = "; ".join(out["bad_console"][:3])
    except Exception as exc:  # a timeout or a browser error is a failed session, reported, not a crash
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        try:  # what the page showed at that moment
            out["state"] = await page.evaluate(
                "() => { const t = document.querySelector('.zp-config textarea');"
                " return {app: !!document.querySelector('.zp-app'), widgets: document.querySelectorAll("
                "'.jupyter-widgets').length, config_chars: t ? t.value.length : -1, config_head: t ? "
                "t.value.slice(0, 120) : '', body: document.body ? document.body.innerText.slice(0, 300) : ''}; }")
        except Exception as exc2:
            out["state"] = f"unreadable: {type(exc2).__name__}"
        out["console_tail"] = list(console_tail)
        out["pending_requests"] = [f"{t - t_start:.1f}s {u[-120:]}" for t, u in list(pending.values())[:20]]
        out["ws_frames_first"] = [f"{t:.1f}s {d} {k}" for t, d, k in frames[:25]]
        out["ws_frames_last"] = [f"{t:.1f}s {d} {k}" for t, d, k in frames[-25:]]
    # every session: the kernel websocket's frame counts by kind (a "comm_info_request" means the widget manager
    # fell back to loading widgets one by one) and the control-comm timer's times
    counts: dict = {}
    for _t, direction, kind in frames:
        counts[f"{direction} {kind}"] = counts.get(f"{direction} {kind}", 0) + 1
    out["ws_frame_counts"] = counts
    out["fallback"] = counts.get("sent shell/comm_info_request", 0) > 0
    out["diag"] = list(diag)
    return out


async def run_sessions(url: str, n: int, timeout_ms: int, expected: dict[int, str],
                       force_fallback: bool = False) -> tuple[list, object, object]:
    from playwright.async_api import async_playwright

    pw = await async_playwright().start()
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    results = await asyncio.gather(*(session(browser, url, i, expected[1], expected[node_count(i)], timeout_ms,
                                             force_fallback) for i in range(n)))
    return results, browser, pw


async def close_sessions(results: list, browser, pw, unload: bool = False) -> None:
    """Close every page: like a killed tab (``unload`` False: no unload handler runs and the culler must take the
    kernel) or like a closed tab (``unload`` True: the page's ``beforeunload`` handler sends Voila's shutdown
    beacon and the server shuts the kernel down at once)."""
    for r in results:
        page, ctx = r.pop("_page", None), r.pop("_ctx", None)
        r.pop("_frames", None)
        try:
            if page is not None:
                await page.close(run_before_unload=unload)
                if unload:
                    await asyncio.sleep(0.5)  # let the beacon leave before the context goes
            if ctx is not None:
                await ctx.close()
        except Exception:
            pass
    await browser.close()
    await pw.stop()


def dump_kernel_stacks(server_pid: int, path: Path) -> int:
    """Diagnostics for failed sessions: the Python stack of every kernel process (``py-spy dump``, when py-spy is
    installed; it only reads the processes' memory) and its CPU seconds, written to ``path``. Returns how many
    kernels were dumped (0 without py-spy)."""
    import shutil

    spy = shutil.which("py-spy")
    if spy is None:
        path.write_text("py-spy is not installed: pip install py-spy to get the kernels' stacks\n")
        return 0
    parts = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            cpu = sum(child.cpu_times()[:2])
            status = child.status()
        except psutil.NoSuchProcess:
            continue
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(child.pid)], capture_output=True, text=True,
                                  timeout=30).stdout
        except (subprocess.TimeoutExpired, OSError) as exc:
            dump = f"py-spy failed: {exc}"
        parts.append(f"=== kernel pid {child.pid} status {status} cpu {cpu:.1f} s\n{dump}")
    path.write_text("\n".join(parts))
    return len(parts)


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def chromium_version() -> str:
    try:
        return subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return "unknown"


def versions() -> str:
    from importlib import metadata

    parts = []
    for name in ("voila", "jupyter_server", "ipykernel", "ipywidgets", "bqplot", "playwright"):
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def fmt_mib(nbytes: float) -> str:
    return f"{nbytes / MIB:.0f} MiB"


def median_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def spread(values: list, digits: int) -> str:
    """'median / p95 / max' of the non-None values, in seconds ('not measured' when none)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return "not measured"
    return " / ".join(f"{v:.{digits}f} s" for v in (statistics.median(vals), pct(vals, 95), max(vals)))


def server_side_seconds(s: dict) -> float | None:
    """A visitor's wait that the server spends: the page's HTML (request -> last byte: for a pooled kernel the
    pre-rendered page, otherwise kernel start, execution of the page and rendering) plus the widget-state reply
    (request -> first state sent, logged by the server). None when either is missing."""
    if s.get("html_seconds") is None or s.get("state_seconds") is None:
        return None
    return s["html_seconds"] + s["state_seconds"]


def run_title(r: dict) -> str:
    waves = r.get("waves") or []
    w = len(waves) or 1
    return (f"{w} wave{'s' if w > 1 else ''} of {r['n']} simultaneous visitors, pool of {r.get('pool', 1)} "
            f"pre-executed kernel{'s' if r.get('pool', 1) != 1 else ''}")


def run_section(r: dict, k: int) -> list[str]:
    """The report's lines for one run (``r``: what :func:`main` records)."""
    sessions = r["sessions"]
    waves = r.get("waves") or []
    n_total = r["n"] * max(1, len(waves))
    ok = [s for s in sessions if s["ok"]]
    before, peak, after = r["before"], r["peak"], r["after"]
    kern = sorted(peak["kernels"].values()) if peak else []
    tti = [s["tti_seconds"] for s in sessions]
    server = [server_side_seconds(s) for s in sessions]
    render = [s["tti_seconds"] - server_side_seconds(s) for s in sessions
              if s["tti_seconds"] is not None and server_side_seconds(s) is not None]
    lines = [
        f"## Run {k}: {run_title(r)}",
        "",
        f"Started {r['date']}; load average (1/5/15 min) {r['load_before']} before, {r['load_after']} after.",
        f"Server: `zeroplanner app --max-kernels {r['max_kernels']} --cull-idle-seconds {r['cull_idle']} --pool "
        f"{r.get('pool', 1)} --max-pending-per-client {r['max_kernels']} --log-timings` (culler checks every "
        f"{r['cull_interval']} s)"
        + ("; the server ran under tracemalloc (`--tracemalloc`), which slows it and adds to its RSS"
           if r.get("tracemalloc") else "") + ".",
    ]
    if r.get("force_widget_fallback"):
        lines.append("Stress case (`--force-widget-fallback`): the widget manager's control-comm timer was set to "
                     "0 ms, so every page loaded its widgets one by one (ipywidgets' fallback path, the page's "
                     "largest IOPub burst). Visitors do not see this setting.")
    lines += [
        "",
        "| measure | value |",
        "|---|---|",
        f"| sessions with the exact expected config and no page errors | **{len(ok)} / {n_total}** |",
        f"| time to interactive, median / p95 / max | {spread(tti, 1)} |",
        f"| of which server-side: page HTML, request to last byte (browser's Navigation Timing), median / p95 / "
        f"max | {spread([s.get('html_seconds') for s in sessions], 2)} |",
        f"| of which server-side: widget state, page's request to first state sent (server log), median / p95 / "
        f"max | {spread([s.get('state_seconds') for s in sessions], 2)} |",
        f"| server-side total (the two above), median / p95 / max | {spread(server, 2)} |",
        f"| page sent to websocket: page's last byte to its kernel websocket connecting (server log; what "
        f"`--connect-timeout-seconds` must exceed), median / p95 / max | "
        f"{spread([s.get('connect_seconds') for s in sessions], 2)} |",
        f"| the rest: the browser loading and rendering the page (time to interactive less server-side), median "
        f"/ p95 / max | {spread(render, 1)} |",
        f"| control change to updated config, median / p95 / max | "
        f"{spread([s['change_seconds'] for s in sessions], 2)} |",
        f"| wall time for the first wave's {r['n']} sessions | {r['sessions_wall_seconds']:.1f} s |",
        f"| CPU used during the run by this run (server, kernels, browser) / by other jobs on the machine | "
        f"{r.get('own_cpu_seconds', float('nan')):.0f} s / {r.get('other_cpu_seconds', float('nan')):.0f} s "
        f"(of {r.get('run_wall_seconds', r['sessions_wall_seconds']) * r['cpu_count']:.0f} core-seconds) |",
        f"| pages whose widget manager fell back to loading widgets one by one (`comm_info_request`, "
        f"ipywidgets#3633) | {sum(bool(s.get('fallback')) for s in sessions)} / {n_total} |",
        f"| console errors (any `console.error`, informational) | {sum(s['console_errors'] for s in sessions)} |",
        (f"| one more visitor while the first wave is open | HTTP {r['extra_status']}"
         f"{' (the planner is full page)' if r['extra_full_page'] else ''} |") if r.get("pool", 1) <= 1 else
        "| one more visitor while the first wave is open | not checked (the pool serves them) |",
        f"| server log tracebacks | {r['tracebacks']} |",
        "",
        "Memory (RSS, psutil; server = the Voilà process, kernels = its child processes; RSS counts shared library "
        "pages in every process, so the sum overstates the physical memory somewhat):",
        "",
        "| when | server | kernels | total |",
        "|---|---|---|---|",
    ]
    rows = [(f"before (pool of {r.get('pool', 1)} ready)", before)]
    if waves:
        for wv in waves:
            rows.append((f"wave {wv['wave']}: all {r['n']} sessions open", wv.get("peak")))
            rows.append((f"wave {wv['wave']}: after close + culling ({wv.get('cull_seconds', float('nan')):.0f} s)"
                         f"{', pool refilled' if r.get('pool', 1) else ''}", wv.get("after")))
    else:
        rows += [(f"all {r['n']} sessions open", peak), ("after close + culling", after)]
    for label, m in rows:
        if m:
            kernels = m["kernels"].values()
            lines.append(f"| {label} | {fmt_mib(m['server'])} | {len(kernels)}: {fmt_mib(sum(kernels))} | "
                         f"{fmt_mib(m['total'])} |")
    lines.append("")
    if kern:
        lines.append(f"Per kernel with a session open (first wave): median {fmt_mib(statistics.median(kern))}, min "
                     f"{fmt_mib(kern[0])}, max {fmt_mib(kern[-1])}.")
        lines.append("")
    if len(waves) > 1:
        lines += ["Per wave:", "", "| wave | correct | time to interactive, median | server-side, median | "
                  "server RSS after | total after |", "|---|---|---|---|---|---|"]
        for wv in waves:
            ss = wv["sessions"]
            t = median_or_none([s["tti_seconds"] for s in ss])
            sv = median_or_none([server_side_seconds(s) for s in ss])
            a = wv.get("after")
            lines.append(f"| {wv['wave']} | {wv['ok']} / {r['n']} | {'-' if t is None else f'{t:.1f} s'} | "
                         f"{'-' if sv is None else f'{sv:.2f} s'} | {fmt_mib(a['server']) if a else '-'} | "
                         f"{fmt_mib(a['total']) if a else '-'} |")
        lines.append("")
    if after:
        ratio = after["total"] / before["total"]
        how = ("Pages were closed with their unload handler (like closed tabs): the page's beacon shut its kernel "
               "down" if r.get("close") == "unload" else
               f"Pages were closed without unload handlers (like killed tabs), so the culler shut the visitors' "
               f"kernels down (idle timeout {r['cull_idle']} s)")
        lines.append(f"{how}. Total memory after the last cull / before = "
                     f"**{ratio:.3f}** (acceptance: within {MEMORY_TOLERANCE:.0%})"
                     + (f"; server RSS after the last wave / after wave 2 = **{r['server_ratio']:.3f}** "
                        f"(acceptance: within {SERVER_SOAK_TOLERANCE:.0%})" if r.get("server_ratio") else "") + ".")
    else:
        lines.append(f"Memory did not settle back after the close: {r.get('after_error', '')}")
    if r.get("tracemalloc_diff"):
        lines += ["", "What the server's Python heap gained from after wave 1 to after the last wave (tracemalloc, "
                  "top allocation sites by growth):", "", "```"] + r["tracemalloc_diff"][:12] + ["```"]
    lines += ["", ("PASS" if r["passed"] else "FAIL") + ": " + "; ".join(r["verdict"]) + "."]
    failed = [s for s in sessions if not s["ok"]]
    if failed:
        lines += ["", "Failed sessions:", ""]
        for f in failed[:20]:
            counts = f.get("ws_frame_counts") or {}
            state_in = counts.get("recv iopub/comm_msg/update_states", 0)
            opened = next((e.split()[0] for e in f.get("ws_frames_first") or [] if " open " in e), None)
            lines.append(f"- wave {f.get('wave', 1)} visitor {f['i']} (nodes {f['nodes']}): "
                         f"{f['error'] or 'page errors'}; kernel websocket "
                         f"{'opened at ' + opened if opened else 'never opened'}; widget state received: "
                         f"{'yes' if state_in else 'no'}"
                         + (f"; fell back to per-widget requests: {counts.get('recv iopub/comm_msg/update', 0)} "
                            f"replies to {counts.get('sent shell/comm_msg/request_state', 0)} requests"
                            if f.get("fallback") else "; no per-widget fallback"))
    lines.append("")
    return lines


def workshop_section(runs: list[dict]) -> list[str]:
    """Sizing advice from the measured runs: memory per visitor, the pool's cost at rest, what a room waits."""
    lines = ["## For a workshop: what these runs mean", ""]
    per_kernel = [statistics.median(r["peak"]["kernels"].values()) for r in runs if r.get("peak")
                  and r["peak"]["kernels"]]
    server_rest = [r["before"]["server"] for r in runs if r.get("before") and not r.get("tracemalloc")]
    if per_kernel and server_rest:
        k_gib = statistics.median(per_kernel) / GIB
        lines.append(f"- Memory: each kernel (a visitor's, or a pre-executed one waiting in the pool) holds about "
                     f"{k_gib:.2f} GiB RSS; the server itself {min(server_rest) / MIB:.0f}-"
                     f"{max(server_rest) / MIB:.0f} MiB at rest (runs without tracemalloc). At rest the server costs its own memory plus "
                     f"`--pool` x {k_gib:.2f} GiB; with a room in, plan (`--pool` + visitors) x {k_gib:.2f} GiB "
                     "while the pool refills behind the visitors who took its kernels.")
    rows = []
    for r in runs:
        sv = median_or_none([server_side_seconds(s) for s in r["sessions"]])
        t = median_or_none([s["tti_seconds"] for s in r["sessions"]])
        rest = r.get("before")
        rows.append(f"| {r['n']} | {r.get('pool', 1)} | {len(r.get('waves') or [1])} | "
                    f"{fmt_mib(rest['total']) + ' (server ' + fmt_mib(rest['server']) + ')' if rest else '-'} | "
                    f"{'-' if sv is None else f'{sv:.2f} s'} | {'-' if t is None else f'{t:.1f} s'} |")
    lines += ["", "| visitors at once | pool | waves | memory at rest (server + pool) | server-side wait, median | "
              "time to interactive in this run's browser, median |", "|---|---|---|---|---|---|", *rows, ""]
    lines += [
        "- The server-side wait is what a room with its own laptops waits for the server: with the pool sized for "
        "the room, the page has already run its first plan and only the widget state is sent; without it, every "
        "page waits for its kernel to start, import the package and run the first plan, on the server's cores. "
        "Time to interactive here also includes one headless Chromium rendering every visitor's page on the same "
        "2 cores as the server, which laptops do not share.",
        "- Settings: `zeroplanner app --pool P --max-kernels N`. P = the number of people who open the page in "
        "the same minute (the whole room when a session starts together); N >= head count + P (each visitor who "
        "takes a pooled kernel leaves a slot for its refill) plus a few for late or reloading visitors. Over N, a "
        "visitor gets the \"planner is full\" page and retries by itself. A closed or reloaded page shuts its "
        "kernel down at once; a killed tab or a sleeping laptop holds its kernel until the culler takes it after "
        "the 600 s idle timeout.",
        "- The pool refills one second after each kernel is handed out (Voilà's `fill_delay`), so a room that "
        "arrives together also starts P new kernels while its pages load.",
        "",
    ]
    return lines


SERVER_KEEPS = [
    "- The starting point, before the leak hunt: one wave of 40 visitors left the server's RSS at 163 MiB after "
    "culling, from 117 MiB before, about 1 MiB per visitor served, while the kernels went back to the one pre-heated kernel.",
    "- Per-session structures read in jupyter_server 2.21.1 and Voila 0.5.13, and whether a kernel's shutdown or "
    "cull releases them: `MappingKernelManager._kernels`, `_kernel_connections`, `_kernel_ports` (removed), "
    "`_kernel_buffers` (the messages buffered for a page that went away without closing, e.g. a killed tab: "
    "dropped with their ZeroMQ streams by `stop_buffering` at shutdown), the activity-watching IOPub stream "
    "(closed), `ZMQChannelsWebsocketConnection._open_sessions` / `_open_sockets` (removed at disconnect), Voila's "
    "pool and `notebook_data[...][\"kernel_ids\"]` (removed), and Voila's `RequestInfoSocketHandler._cache`: a "
    "class-level dict of request info per pre-heated kernel that nothing clears. The kernel manager now drops "
    "that entry at shutdown (`forget_request_info`, `zeroplanner/server/voila_app.py`, added after the soak "
    "below had started, so the soak ran without it; Voila's pre-heated mode has a reported leak of its own, "
    "voila-dashboards/voila#1189). Growth of the Jupyter server with use is a "
    "known upstream report (jupyter-server/jupyter_server#1235; about 1 MB per browser tab in "
    "jupyterlab/jupyterlab#14634).",
    "- tracemalloc of the server (`--tracemalloc`, 25 frames, snapshots after a full garbage collection after "
    "each wave; 2 waves of 1 visitor, 2026-12-01 16:29 UTC): the traced Python heap went from 77.4 to 77.5 MiB "
    "between the waves while the traced server's RSS went from 409 to 417 MiB; no allocation site grew by more "
    "than 5 KiB. What stays is not live Python objects. Traced runs with 4-5 visitors per wave could not finish "
    "here: the traced server was too slow under the shared machine's load (1-minute load average 10-100) for "
    "the pages to connect before the culler's timeout.",
    "- Small waves (3 waves of 3 visitors, pool of 3, 2026-12-01 16:47 UTC): the server's RSS after each wave's "
    "cull was 133, 133 and 134 MiB (136 MiB before): nothing measurable is kept per session. The same run with "
    "`PYTHONMALLOC=malloc` (the C allocator instead of pymalloc, so that `malloc_trim` can return more): 140, 140 "
    "and 134 MiB (142 before), no better, so it is not used.",
    "- So the server's growth is the high-water mark of a wave's concurrency (freed memory the allocator keeps, "
    "reduced by the `gc.collect()` + `malloc_trim(0)` after each shutdown), reached in the first wave of a given "
    "size and reused by later ones: the soak's per-wave table above gives the curve for 20 visitors a wave.",
    "- Without a pool (`--pool 0`, 2026-12-01 17:32 UTC) the server rests at 104 MiB before any page was "
    "rendered and at 142 MiB after one wave of 20 (after/before 1.364, over the 10% the single-wave check "
    "allows). Not separated further; most likely the first render's templates and exporter, which every later "
    "render reuses, plus the wave's high-water mark. With the shipped pool the pooled kernel's render happens "
    "before the `before` figure (137 MiB with a pool of 3, 178 MiB with a pool of 20, the pooled pages "
    "included), and the soak then stays flat.",
    "- One wave of 40 simultaneous visitors (pool of 1) was first tried twice (2026-12-01 17:37 and 17:40 UTC) "
    "and stopped both times while its 40 kernels ran: the machine's available memory fell to 620 and 477 MiB, "
    "because 14 GB of its 24 GB were held in /dev/shm by DeepSpeed's CPU all-reduce segments that the engine "
    "tests' ranks left behind (DeepSpeed never unlinks them; the ranks now do, "
    "`zeroplanner.calibrate._worker._unlink_shm_buffer`). With that memory back, run 3 above (2026-12-01 18:24 "
    "UTC, the machine otherwise idle): 40/40 correct, memory after/before 1.089 (the starting run before "
    "the leak hunt: 1.169).",
    "- Also fixed on the way: a pre-heated kernel handed out after sitting in the pool longer than the idle "
    "timeout was culled as soon as the next cull tick came if its page had not connected yet (Voila skips only "
    "kernels still in the pool, and the kernel's last activity was its pre-execution); it is now marked active "
    "when handed out (`mark_handed_out`, `tests/server/test_pool.py`). A page reconnecting to a culled kernel "
    "made the server log two tracebacks (jupyter_server's HTML error page needs a `static_path` Voila does not "
    "set; 10 of the 12 tracebacks of one 15-visitor run on the overloaded machine, whose other 2 were kernels "
    "that did not start within jupyter_client's 60 s); the kernel websocket handler now answers a plain-text "
    "error (`PlainErrorKernelWebsocketHandler`).",
]
"""Findings of the leak hunt, filled in from the soak's tracemalloc runs."""


def write_report(path: Path, runs: list[dict]) -> None:
    """Write ``docs/reliability.md`` from one or more runs (:func:`main`'s records; ``--render-only`` joins the
    JSON of several runs)."""
    r0 = runs[0]
    lines = [
        "# Reliability: the planner's Voilà server under a workshop-sized load",
        "",
        f"Generated by `benchmarks/load_voila.py` (runs started {', '.join(r['date'] for r in runs)}; do not edit "
        "by hand; rerun the script).",
        "",
        "## Machine and method",
        "",
        f"- CPU: {r0['cpu_count']} logical cores ({r0['cpu_model']}), memory {r0['mem_total_gib']:.1f} GiB. The "
        "machine was SHARED: other jobs (other developers' test runs) ran on the same cores during these runs; "
        "each run's table gives the CPU seconds other jobs took meanwhile, and the times are longer than on an "
        "idle machine.",
        f"- Python {platform.python_version()}; {r0['versions']}; {r0['chromium']}.",
        "- Server: `zeroplanner app` on 127.0.0.1 with the shipped settings except those each run names (kernels "
        "on Unix sockets, no source, no tracebacks; the shipped cull timeout is 600 s, shortened so a run waits "
        "minutes, not ten, for culling).",
        "- Load: N visitors opened at the same moment in one headless Chromium (one browser context, one kernel "
        "and one kernel websocket each). Each waits until the DeepSpeed JSON preview shows the default scenario's "
        "config (time to interactive), types a node count (2-17, different per visitor) into the Nodes slider, "
        "and waits until the preview equals `json.dumps(to_deepspeed_config(plan(scenario)), indent=2)` computed "
        "by the script for that node count. Then every page is closed without its unload handler (a killed tab) "
        "and the script waits until the server has logged the shutdown of every visitor's kernel and the pool "
        "has refilled and settled (3 s with under 1% RSS change and under 0.15 CPU seconds). A soak repeats this "
        "for each wave.",
        "- Server-side wait, split from the browser's: the page's HTML from request to last byte (the browser's "
        "Navigation Timing; for a pooled kernel the page is already rendered, otherwise this includes the "
        "kernel's start, imports and first plan), plus the time from the page's widget-state request reaching "
        "the server to the first widget state the server sends back (`zeroplanner app --log-timings`, "
        "`ClosingPageWebsocketConnection`). The rest of time to interactive is the browser loading the widget "
        "code and drawing the page.",
        "",
    ]
    for k, r in enumerate(runs, 1):
        lines += run_section(r, k)
    lines += workshop_section(runs)
    lines += ["## What the server keeps per session, and what releases it", "", *SERVER_KEEPS, ""]
    lines += ["## What earlier runs of this script found (and the settings it changed)", "", *EARLIER_FINDINGS]
    lines += ["", "Rerun: `python benchmarks/load_voila.py` (one wave of 30, about 3-6 minutes on 2 cores); the soak: "
              "`--waves 6 --sessions 20 --pool 20`; `--render-only A.json B.json ...` joins runs into one report.",
              ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


EARLIER_FINDINGS = [
              "- nbclient's default `iopub_timeout` of 4 s: with 10 pages opened at once, Voila logged \"Timeout "
              "waiting for IOPub output\" and dropped the cell's output, so 8 of 10 pages showed the title but no "
              "app. 60 s still lost the app on 1 of 30 pages (run started 2026-11-29 14:58 UTC, every page "
              "in the per-widget path). Now `VoilaExecutor.iopub_timeout = 300` "
              "(`zeroplanner/server/__init__.py`); the wait ends when the kernel goes idle, so it costs "
              "nothing when the server keeps up.",
              "- Kernels on TCP: 30 kernels starting at once raced for free ports (`ZMQError: Address already in "
              "use` in a kernel's heartbeat thread). Now kernels use Unix sockets (`KernelManager.transport = "
              "ipc`).",
              "- A 20 s cull timeout culled kernels whose pages were still loading (idle, no connection yet), and "
              "those pages never came up. The shipped 600 s is far above the slowest page measured here.",
              "- The server process kept its high-water mark after the kernels were culled (+35 MiB after 10 "
              "sessions, 12% of the at-rest total). The kernel manager now runs `gc.collect()` and glibc "
              "`malloc_trim(0)` after each kernel shutdown (`release_freed_memory`, "
              "`zeroplanner/server/voila_app.py`).",
              "- The jupyter_server culler logged a traceback (`TraitError` on `last_activity`) when a cull tick "
              "met a kernel that was still starting (a 3-visitor run, 2 s cull interval). The kernel manager now "
              "skips kernels still starting (`ZeroplannerKernelManager.cull_kernel_if_idle`).",
              "- Pages stuck at \"Loading widget...\" (1 to 5 of 30 in some runs). The widget manager "
              "(jupyterlab_widgets 3.0.x) waits only 4 s for the kernel's answer on the widget control comm, then "
              "asks for each of the page's 362 widget states separately (jupyter-widgets/ipywidgets#3633); under "
              "this load the 4 s timer fired on 17-24 of 30 pages (5-28 of 30 after the changes below). The "
              "kernel answers those requests with about 1,100 "
              "IOPub messages in a second or two. A ZeroMQ PUB socket queues at most 1000 messages per subscriber "
              "(ZMQ_SNDHWM) and silently drops the rest; on a loaded server the kernel's queue filled, the tail of "
              "the burst was dropped, and the page waited for it forever. Measured: a stuck page's kernel logged "
              "(debug log) every one of the 363 requests, and in another run a counting websocket connection class "
              "saw 999, 1014 and 1042 of the kernel's 1098 IOPub messages reach the server for the three stuck "
              "pages (1098-1119 for the others); "
              "runs with every page forced onto the per-widget path (`--force-widget-fallback`) lost pages this "
              "way in 3 of 4 runs (1, 1 and 3 of 30). A server-side receive queue of 0 (unbounded) alone did not "
              "help. The server now starts Python kernels with `zeroplanner.server.kernel` (ipykernel with an "
              "IOPub queue of 10,000 messages, set before the socket binds) and gives its own kernel sockets the "
              "same receive queue (`zeroplanner/server/voila_app.py`); `tests/server/test_kernel_queue.py` shows a "
              "stock kernel delivering 1994 of 5000 messages to a reader that falls behind and the planner's kernel "
              "all 5000. With that change a forced run delivered every message to every page (run started "
              "2026-11-29 15:06 UTC: "
              "30/30 correct, 1115-1119 IOPub messages per page at the server). ipykernel 7.4.0 lost "
              "replies more often than 6.29.5 (4 of 22 fallback pages vs 1 of 87), so the app extra and binder "
              "still pin ipykernel 6.29.5 (`pyproject.toml`).",
              "- One page in 120 received the whole widget state on the control comm, closed it, and then never "
              "drew its output (13:25 UTC, before the queue change); its later messages may have been lost the same "
              "way, not verified. Lengthening the widget manager's 4 s timer from the template, so that every page "
              "takes that path, made this common (only 5 and 3 of 30 pages correct; ipykernel 7.4.0, stock kernel "
              "queue), so "
              "the template leaves the timer alone.",
              "- Runs with other CPU-heavy jobs on the same 2 cores take longer (sessions 311-364 s instead of "
              "133-170 s); the CPU row in the results table says how much other jobs took during a run.",
]
"""What earlier runs of this script found, kept in the report."""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_avg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------------------------------------------
# Server-side timings and tracemalloc snapshots of the server
# ---------------------------------------------------------------------------------------------------------------
TIMING_LINE = re.compile(r"zeroplanner timing: kernel ([0-9a-f-]{36}): first widget state sent ([\d.]+) s")
"""What ``zeroplanner app --log-timings`` logs per page (``ClosingPageWebsocketConnection``)."""

CONNECT_LINE = re.compile(r"zeroplanner timing: kernel ([0-9a-f-]{36}): page connected ([\d.]+) s after its page")
"""What ``zeroplanner app --log-timings`` logs per page when its websocket connects (``ZeroplannerKernelManager``):
the delay the connect timeout (``--connect-timeout-seconds``) must exceed."""


def connect_timings(server_log: str) -> dict[str, float]:
    """Kernel id -> seconds from the page's last byte sent to its kernel websocket connecting, from the log."""
    return {m.group(1): float(m.group(2)) for m in CONNECT_LINE.finditer(server_log)}


def state_timings(server_log: str) -> dict[str, float]:
    """Kernel id -> seconds from the page's widget-state request to the first widget state sent, from the log."""
    return {m.group(1): float(m.group(2)) for m in TIMING_LINE.finditer(server_log)}


def serve_traced(argv: list[str]) -> int:
    """``load_voila.py serve-traced SNAPSHOT_DIR APP_ARGS...``: run ``zeroplanner app APP_ARGS`` with tracemalloc
    on (25 frames); each SIGUSR1 writes a snapshot of the server's Python allocations (after a full garbage
    collection) to ``SNAPSHOT_DIR/snapshot_<k>.tracemalloc``. Diagnostics for the soak (``--tracemalloc``)."""
    import gc
    import signal
    import tracemalloc

    folder = Path(argv[0])
    folder.mkdir(parents=True, exist_ok=True)
    import zeroplanner.server.voila_app  # noqa: F401  (imports untraced: tracing them costs minutes of CPU)

    tracemalloc.start(25)
    count = [0]

    def snapshot(_signum, _frame):
        gc.collect()
        count[0] += 1
        tracemalloc.take_snapshot().dump(str(folder / f"snapshot_{count[0]}.tracemalloc"))

    signal.signal(signal.SIGUSR1, snapshot)
    from zeroplanner.cli import main as cli_main

    return cli_main(["app", *argv[1:]])


def take_snapshot(pid: int, folder: Path, k: int, timeout: float = 120.0) -> Path | None:
    """Ask the traced server for snapshot ``k`` (SIGUSR1) and wait for its file; None when it did not come."""
    import signal

    path = folder / f"snapshot_{k}.tracemalloc"
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    size = -1
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_size == size and size > 0:
            return path
        size = path.stat().st_size if path.exists() else -1
        time.sleep(1)
    return None


def snapshot_diff(first: Path, last: Path, top: int = 25) -> list[str]:
    """The ``top`` allocation sites (by traceback) whose size grew most from ``first`` to ``last``, as text lines:
    growth, count growth, then the innermost frames outside the standard library's asyncio/tracemalloc."""
    import tracemalloc

    a = tracemalloc.Snapshot.load(str(first)).filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    b = tracemalloc.Snapshot.load(str(last)).filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = [f"total traced: {sum(t.size for t in a.traces) / MIB:.1f} MiB -> {sum(t.size for t in b.traces) / MIB:.1f} MiB"]
    for stat in b.compare_to(a, "traceback")[:top]:
        frames = [f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno}" for f in stat.traceback][-6:]
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  " + " <- ".join(reversed(frames)))
    return lines


# ---------------------------------------------------------------------------------------------------------------
def run_wave(url: str, n: int, timeout_ms: int, expected: dict, force_fallback: bool, wave: int,
             unload: bool = False) -> tuple:
    """One wave: ``n`` visitors open the page at once and use it (:func:`session`); returns (results, close) where
    ``close()`` closes every page (:func:`close_sessions`)."""
    loop = asyncio.new_event_loop()
    results, browser, pw = loop.run_until_complete(run_sessions(url, n, timeout_ms, expected, force_fallback))
    for r in results:
        r["wave"] = wave

    def close() -> None:
        loop.run_until_complete(close_sessions(results, browser, pw, unload))
        loop.close()
    return results, close


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve-traced"]:
        return serve_traced(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=30, help="simultaneous visitors per wave, 1..60 (default 30)")
    parser.add_argument("--waves", type=int, default=1,
                        help="soak: waves of --sessions visitors, each opened, used and closed, with culling "
                             "between waves, 1..20 (default 1)")
    parser.add_argument("--pool", type=int, default=None,
                        help="pre-executed kernels (zeroplanner app --pool), 0..60 (default: the shipped "
                             "zeroplanner.server.DEFAULT_POOL_SIZE)")
    parser.add_argument("--close", choices=("kill", "unload"), default="kill",
                        help="how pages are closed: kill (default; like a killed tab, the culler takes the kernel) "
                             "or unload (like a closed tab: the page's shutdown beacon, no wait for the culler)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="diagnostics: trace the server's Python allocations and report what grew from wave "
                             "1 to the last (slows the server)")
    parser.add_argument("--cull-idle-seconds", type=int, default=120,
                        help="idle-cull timeout for this run, 5..600 (default 120; it must exceed the slowest page's "
                             "time to connect, or the culler takes kernels whose page is still loading)")
    parser.add_argument("--session-timeout-seconds", type=int, default=300,
                        help="longest wait for one page to load or update, 10..1800 (default 300)")
    parser.add_argument("--deadline-seconds", type=int, default=1200, help="whole run bound (60..7200)")
    parser.add_argument("--force-widget-fallback", action="store_true",
                        help="stress case: every page loads its widgets one by one (ipywidgets' fallback path)")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "reliability.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures as JSON here")
    parser.add_argument("--render-only", type=Path, nargs="+", default=None, metavar="JSON",
                        help="rewrite --output from --json files of earlier runs, one section each (no server, "
                             "no browser)")
    args = parser.parse_args(argv)
    if args.render_only is not None:
        runs = [json.loads(path.read_text()) for path in args.render_only]
        write_report(args.output, runs)
        return 0 if all(r["passed"] for r in runs) else 1
    from zeroplanner.server import DEFAULT_POOL_SIZE, voila_argv

    pool = DEFAULT_POOL_SIZE if args.pool is None else args.pool
    if not 1 <= args.sessions <= 60:
        parser.error(f"--sessions must be between 1 and 60, got {args.sessions}")
    if not 1 <= args.waves <= 20:
        parser.error(f"--waves must be between 1 and 20, got {args.waves}")
    if not 0 <= pool <= 60:
        parser.error(f"--pool must be between 0 and 60, got {pool}")
    if not 5 <= args.cull_idle_seconds <= 600:
        parser.error(f"--cull-idle-seconds must be between 5 and 600, got {args.cull_idle_seconds}")
    if not 10 <= args.session_timeout_seconds <= 1800:
        parser.error(f"--session-timeout-seconds must be between 10 and 1800, got {args.session_timeout_seconds}")
    if not 60 <= args.deadline_seconds <= 7200:
        parser.error(f"--deadline-seconds must be between 60 and 7200, got {args.deadline_seconds}")
    if not Path(CHROMIUM).exists():
        print(f"load_voila: error: no Chromium at {CHROMIUM}", file=sys.stderr)
        return 2

    n, waves = args.sessions, args.waves
    # the cap: every visitor of a wave plus the refilled pool less the one kernel a visitor takes first, so that
    # with the shipped pool of 1 the cap is n and one more visitor gets the "planner is full" page
    max_kernels = n + max(pool - 1, 0)
    deadline = time.monotonic() + args.deadline_seconds
    cull_interval = next(int(a.split("=")[1]) for a in voila_argv("x", cull_idle_seconds=args.cull_idle_seconds)
                         if a.startswith("--MappingKernelManager.cull_interval="))
    expected = {1: expected_config(1)}
    for i in range(n):
        expected.setdefault(node_count(i), expected_config(node_count(i)))

    report: dict = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "n": n, "max_kernels": max_kernels,
        "waves_planned": waves, "pool": pool, "tracemalloc": bool(args.tracemalloc),
        "cull_idle": args.cull_idle_seconds, "cull_interval": cull_interval, "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(), "load_before": load_avg(), "mem_total_gib": psutil.virtual_memory().total / GIB,
        "versions": versions(), "chromium": chromium_version(), "peak": None, "after": None,
        "extra_status": None, "extra_full_page": False, "cull_seconds": float("nan"), "sessions": [],
        "sessions_wall_seconds": float("nan"), "force_widget_fallback": bool(args.force_widget_fallback),
        "waves": [], "close": args.close,
    }
    log_dir = ROOT / "artifacts"
    log_dir.mkdir(exist_ok=True)
    log = log_dir / f"load_voila_server_{os.getpid()}.log"  # one per run: runs at the same time must not share it
    # every visitor comes from 127.0.0.1, like a room behind one NAT address: the per-address cap is the room
    server_args = ["--max-kernels", str(max_kernels), "--cull-idle-seconds", str(args.cull_idle_seconds),
                   "--pool", str(pool), "--max-pending-per-client", str(max_kernels), "--log-timings"]
    snap_dir = log_dir / f"load_voila_tracemalloc_{os.getpid()}"
    command = None
    if args.tracemalloc:
        def command(port: int) -> list[str]:
            return [sys.executable, str(Path(__file__).resolve()), "serve-traced", str(snap_dir), "--port",
                    str(port), "--no-browser", *server_args]
    snapshots: list[Path] = []
    cpu0 = cpu_split()
    with serve_app(server_args, log_path=log, timeout=max(1.0, deadline - time.monotonic()), command=command,
                   check_log=False) as server:  # the script counts the log's tracebacks itself
        proc, port, url = server.proc, server.port, server.url
        report["before"] = wait_steady(proc.pid, pool, deadline, log, pool_fills=1 if pool else 0)
        print(f"before: {report['before']['total'] / MIB:.0f} MiB (pool {pool})", file=sys.stderr, flush=True)
        for w in range(1, waves + 1):
            if time.monotonic() > deadline - 60:
                report["deadline_hit"] = f"deadline reached before wave {w}"
                break
            timeout_ms = int(min(args.session_timeout_seconds, max(10.0, deadline - time.monotonic() - 120)) * 1000)
            t0 = time.monotonic()
            results, close = run_wave(url, n, timeout_ms, expected, args.force_widget_fallback, w,
                                      unload=args.close == "unload")
            wave: dict = {"wave": w, "wall_seconds": time.monotonic() - t0, "peak": memory(proc.pid),
                          "ok": sum(s["ok"] for s in results)}
            print(f"wave {w}: {wave['ok']}/{n} ok in {wave['wall_seconds']:.0f} s", file=sys.stderr, flush=True)
            if not all(s["ok"] for s in results):
                stacks = log_dir / f"load_voila_kernel_stacks_{port}_{w}.txt"
                dumped = dump_kernel_stacks(proc.pid, stacks)
                print(f"failed sessions: {dumped} kernel stacks in {stacks}", file=sys.stderr, flush=True)
            if w == 1:
                report["sessions_wall_seconds"] = wave["wall_seconds"]
                report["peak"] = wave["peak"]
                if pool <= 1:  # the cap is n: one more visitor must get the full page
                    status, body = http_get(url)
                    report["extra_status"] = status
                    report["extra_full_page"] = status == 503 and "The planner is full" in body
            t_close = time.monotonic()
            close()
            # culled: the server logged the shutdown of every visitor's kernel (the pool, refilling, is left)
            ids = {s["kernel_id"] for s in results if s.get("kernel_id")}
            while time.monotonic() < deadline:
                text = log.read_text(errors="replace")
                if all(f"Kernel shutdown: {kid}" in text for kid in ids) and len(memory(proc.pid)["kernels"]) <= pool:
                    break
                time.sleep(1)
            wave["cull_seconds"] = time.monotonic() - t_close
            try:
                wave["after"] = wait_steady(proc.pid, pool, deadline, log, pool_fills=0)
            except TimeoutError as exc:
                wave["after"] = None
                wave["after_error"] = str(exc)
            server_log = log.read_text(errors="replace")
            timings = state_timings(server_log)
            connects = connect_timings(server_log)
            for sess in results:
                sess["state_seconds"] = timings.get(sess.get("kernel_id", ""))
                sess["connect_seconds"] = connects.get(sess.get("kernel_id", ""))
            wave["sessions"] = results
            report["waves"].append(wave)
            report["sessions"].extend(results)
            if args.tracemalloc:
                snap = take_snapshot(proc.pid, snap_dir, w)
                if snap is not None:
                    snapshots.append(snap)
            after = wave["after"]
            print(f"wave {w}: after {after['total'] / MIB:.0f} MiB (server {after['server'] / MIB:.0f} MiB)"
                  if after else f"wave {w}: {wave.get('after_error')}", file=sys.stderr, flush=True)
            if after is None:
                break
        server_log = log.read_text(errors="replace")
    cpu1 = cpu_split()
    report["other_cpu_seconds"] = max(0.0, (cpu1[0] - cpu0[0]) - (cpu1[1] - cpu0[1]))
    report["own_cpu_seconds"] = cpu1[1] - cpu0[1]
    report["run_wall_seconds"] = args.deadline_seconds - (deadline - time.monotonic())
    report["load_after"] = load_avg()
    report["tracebacks"] = server_log.count("Traceback")
    last = report["waves"][-1] if report["waves"] else {}
    report["after"] = last.get("after")
    report["cull_seconds"] = last.get("cull_seconds", float("nan"))
    if len(snapshots) >= 2:
        diff = snapshot_diff(snapshots[0], snapshots[-1])
        report["tracemalloc_diff"] = diff
        (log_dir / "load_voila_tracemalloc.txt").write_text("\n".join(diff) + "\n")

    verdict = []
    total = n * waves
    ok = sum(s["ok"] for s in report["sessions"])
    verdict.append(f"{ok}/{total} sessions correct" + (f" over {waves} waves" if waves > 1 else ""))
    passed = ok == total
    if report.get("deadline_hit"):
        verdict.append(report["deadline_hit"])
        passed = False
    if report["tracebacks"]:
        verdict.append(f"{report['tracebacks']} traceback(s) in the server log")
        passed = False
    if pool <= 1 and not report["extra_full_page"]:
        verdict.append(f"the visitor over the cap got HTTP {report['extra_status']}, not the full page")
        passed = False
    if report["after"] is None:
        verdict.append("memory did not settle after the close")
        passed = False
    else:
        ratio = report["after"]["total"] / report["before"]["total"]
        verdict.append(f"memory after/before {ratio:.3f}")
        passed = passed and abs(ratio - 1) <= MEMORY_TOLERANCE
        afters = [wv["after"] for wv in report["waves"] if wv.get("after")]
        if len(afters) >= 3:
            server_ratio = afters[-1]["server"] / afters[1]["server"]
            report["server_ratio"] = server_ratio
            verdict.append(f"server RSS after wave {len(afters)} / after wave 2 {server_ratio:.3f}")
            passed = passed and abs(server_ratio - 1) <= SERVER_SOAK_TOLERANCE
    report["passed"] = passed
    report["verdict"] = verdict
    if args.json:  # first: the raw figures survive a failure in the report writer
        for sess in report["sessions"]:
            sess["console_samples"] = sorted(sess.get("console_samples", ()))
        args.json.write_text(json.dumps(report, indent=2, default=str))
    write_report(args.output, [report])
    print(("PASS: " if passed else "FAIL: ") + "; ".join(verdict), file=sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
