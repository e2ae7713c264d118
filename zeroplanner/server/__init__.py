"""Server settings for serving the planner page with Voilà (``zeroplanner app``, binder).

Kept as Python data (no package-data files needed) so a wheel install carries them. Nothing here imports voila,
ipywidgets or bqplot; :mod:`zeroplanner.cli.app` imports voila only when the ``app`` command runs.

Kernel culling: Voilà runs one kernel per open page. A page that is closed normally shuts its kernel down (Voilà's
``shutdown_kernel_handler``); a tab that is killed or a laptop that sleeps leaves the kernel running. jupyter_server's
``MappingKernelManager`` culler removes such kernels: every ``cull_interval`` seconds it shuts down kernels that have
been idle for ``cull_idle_timeout`` seconds and have no open connection (``cull_connected=False`` keeps a page that
is still open alive). The same values are used by ``binder/jupyter_config.json`` (a test checks they agree); the
pattern follows Voilà's deployment guide (voila-dashboards/voila, docs/deploy.md, "Setting the kernel cull
parameters").

Kernel cap: at most :data:`DEFAULT_MAX_KERNELS` kernels; a visitor over it gets a "planner is full" page (HTTP 503)
instead of a kernel (:mod:`zeroplanner.server.voila_app`, which imports voila and is loaded only by the server).
The figures behind these settings (memory per kernel, 30 simultaneous visitors, culling) are in
``docs/reliability.md``, produced by ``benchmarks/load_voila.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

CULL_SETTINGS: dict[str, dict[str, object]] = {
    "MappingKernelManager": {
        "cull_idle_timeout": 600,
        "cull_interval": 60,
        "cull_connected": False,
        "cull_busy": True,
    }
}
"""jupyter_server kernel-culling settings, seconds (idle 10 min, checked every minute). ``cull_busy=True``: the
server's idea of "busy" comes from the kernel's IOPub status messages, and a 30-page run of
``benchmarks/load_voila.py`` left two kernels that the server still marked "busy" (last activity minutes earlier,
0% CPU, no page connected) and that ``cull_busy=False`` would never cull. A kernel that is really busy with no page
connected for 10 minutes has nobody waiting for it, so it is culled too."""

DEFAULT_MAX_KERNELS = 50
"""Most kernels at once (visitors' plus the pre-heated one) for ``zeroplanner app``: a workshop of
30-50 people; each kernel holds about 0.1-0.2 GB (``docs/reliability.md``). Over it a visitor gets the "planner is
full" page (:mod:`zeroplanner.server.voila_app`). ``zeroplanner app --max-kernels N`` changes it."""

DEFAULT_CONNECT_TIMEOUT_SECONDS = 300
"""Seconds after a visitor's page has been sent within which the page must connect its kernel websocket; a kernel
that no page has connected to by then is shut down (:class:`~zeroplanner.server.voila_app.ZeroplannerKernelManager`,
``zeroplanner app --connect-timeout-seconds``). Without it every plain ``GET /`` (a script, a link preview bot)
held a kernel until the 600 s cull, so a bounded loop of requests filled ``--max-kernels`` for everyone.
The clock starts when the page's last byte is written, so the server's own rendering time does not count; what
remains is the browser loading Voilà's scripts on a loaded machine. Measured with ``benchmarks/load_voila.py
--sessions 40`` on 2 shared cores (docs/reliability.md, "page sent to websocket"): 39 pages connected 81-102 s
after their last byte; the pre-executed page, whose HTML was sent at once while the others' took 30-44 s, would
have connected about 145 s after (its neighbours' 44 s + 102 s), and a first try with 120 s shut it down while
the browser was still loading it. 300 s is about twice that slowest page."""

MAX_PENDING_PER_CLIENT_DEFAULT = 0
"""``--max-pending-per-client`` default. 0 means the larger of :data:`MIN_PENDING_PER_CLIENT` and half of the kernel
cap: requests from one address whose pages never connect (a script's loop) can then hold at most half of a large
server's kernels, each for :data:`DEFAULT_CONNECT_TIMEOUT_SECONDS`. Visitors behind one NAT or proxy share an
address: a room opening the page together needs it raised to the room's size (``benchmarks/load_voila.py``, whose
visitors all come from 127.0.0.1, passes its visitor count)."""

MIN_PENDING_PER_CLIENT = 10
"""Floor of the default per-address cap: a few people behind one address opening tabs at once, or one person
opening several, are never refused on a small server (``--max-kernels 2`` gives 10, i.e. only the kernel cap)."""

DEFAULT_POOL_SIZE = 1
"""Pre-executed kernels kept ready for the page (Voilà's ``VoilaConfiguration.default_pool_size``): each has
already imported the package and drawn the first plan, so a visitor who gets one waits only for the page to load
its widgets. Each costs one kernel's memory at rest (about 130 MiB RSS, ``docs/reliability.md``). For a room, set
``zeroplanner app --pool N`` to the number of people who open the page in the same minute (the whole room when a
workshop starts together); a visitor who finds the pool empty gets a kernel started for them (the page then waits
for its start, imports and first plan: tens of seconds under load, ``docs/reliability.md``)."""

MAX_POOL_SIZE = 1000
"""Largest ``--pool`` accepted (it must also be at most the kernel cap)."""

BINDER_MAX_KERNELS = 8
"""Kernel cap on mybinder.org, whose containers have 1-2 GB of memory and serve one person."""

KERNEL_MANAGER_CLASS = "zeroplanner.server.voila_app.ZeroplannerKernelManager"
"""Kernel manager with the cap (``jupyter_server``'s ``AsyncMappingKernelManager`` subclass)."""

WEBSOCKET_CONNECTION_CLASS = "zeroplanner.server.voila_app.ClosingPageWebsocketConnection"
"""The kernel websocket connection binder's ``ServerApp`` uses (``zeroplanner app`` sets it on its Voilà class)."""

IOPUB_TIMEOUT_SECONDS = 300
"""How long Voilà waits, after the page's cell has finished, for the kernel's remaining output messages (nbclient's
``iopub_timeout``, default 4 s). When it runs out, nbclient logs "Timeout waiting for IOPub output" and DROPS the
cell's outputs: the page then shows the title but no app. Measured with ``benchmarks/load_voila.py``: 10 pages
opened at once on 2 busy cores lost the app on 8 of 10 pages with 4 s; 30 pages lost it on 1 of 30 with 60 s (the
server's one event loop reads every page's execution output, ~400 messages per page, while it serves the 30 pages'
websockets). The wait ends as soon as the kernel reports idle, so a longer limit costs nothing when the server keeps
up; 300 s is the load test's own per-page limit."""

IOPUB_HWM_MESSAGES = 10_000
"""ZeroMQ high-water mark, in messages, of the kernel's IOPub send queue (:mod:`zeroplanner.server.kernel`) and
of the server's receive queues from kernels (:class:`~zeroplanner.server.voila_app.ZeroplannerKernelManager`),
instead of ZeroMQ's default 1000. A PUB socket drops messages to a subscriber whose queue is full. The page's
largest burst, measured with ``benchmarks/load_voila.py``: 1,098 IOPub messages when ipywidgets falls back to asking
for each of the page's widgets (busy, update, idle per widget; 362 widgets then, 337 since the compare charts are
built at the first pin). At the default 1000, 30-visitor runs with every page on that path lost the burst's tail on
1-3 pages in 3 of 4 runs (the server received 999-1042 of 1098 messages), and those pages never drew. 10,000 is 9x the burst; unlike 0 (no limit) it still bounds what a kernel that floods
output can queue."""

KERNEL_MODULE = "zeroplanner.server.kernel"
"""Module the server runs instead of ``ipykernel_launcher`` for Python kernels (same command-line arguments)."""

TEMPLATE = "zeroplanner"
"""Voilà template shipped in ``share/voila/templates/zeroplanner`` (the "lab" template without CDN stylesheets)."""

VOILA_SETTINGS: dict[str, dict[str, object]] = {
    "Voila": {"ip": "127.0.0.1", "port_retries": 0},
    "VoilaConfiguration": {
        "show_tracebacks": False,
        "strip_sources": True,
        "theme": "light",
        "template": TEMPLATE,
        "allow_template_override": "NO",
        "allow_theme_override": "NO",
        "preheat_kernel": True,
        "default_pool_size": DEFAULT_POOL_SIZE,
        "multi_kernel_manager_class": KERNEL_MANAGER_CLASS,
    },
    "ZeroplannerKernelManager": {"max_kernels": DEFAULT_MAX_KERNELS},
    "KernelManager": {"transport": "ipc"},
    "VoilaExecutor": {"iopub_timeout": IOPUB_TIMEOUT_SECONDS},
}
"""Voilà settings: bind to loopback only, fail instead of silently picking another port, never show tracebacks,
use the offline-clean template and ignore a ``?template=`` argument (a visitor cannot switch the page to another
installed template) and a ``?theme=`` argument (Voilà hands any theme name other than light/dark to JupyterLab's
theme manager and writes it into the page: ``?theme="><img src=x onerror=...>`` ran script in the visitor's page),
and keep :data:`DEFAULT_POOL_SIZE` pre-heated kernels (the notebook already executed) ready so
a page opens without waiting for a kernel to start and import numpy/pydantic/bqplot (Voilà's ``preheat_kernel``;
``zeroplanner app --pool N`` sets ``default_pool_size``; Voilà does not cull its pooled kernels,
``voila_kernel_manager.py``, and a kernel it hands out is marked active then,
:func:`zeroplanner.server.voila_app.mark_handed_out`; each replacement starts after Voilà's default
``fill_delay`` of 1 s: with 0, visitors arriving together at a cap equal to their number lost a slot to the
refill and one got the "full" page, tests/browser/test_browser_reliability.py), and cap the kernel count
(:data:`DEFAULT_MAX_KERNELS`, :mod:`zeroplanner.server.voila_app`). Kernels talk to the server over Unix
sockets in Voilà's private connection folder (``KernelManager.transport = "ipc"``), not TCP ports on 127.0.0.1:
no other local user can connect to a kernel, and 30 kernels starting at once cannot race for the same free port
(with TCP, a 30-page run of ``benchmarks/load_voila.py`` logged ``ZMQError: Address already in use`` in a kernel's
heartbeat thread). :data:`IOPUB_TIMEOUT_SECONDS` keeps a loaded server from dropping the app from a page."""

SHARE_DIR = Path(__file__).resolve().parent / "share"
"""A Jupyter data directory holding ``voila/templates/zeroplanner``; put it on ``JUPYTER_PATH``."""


def voila_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with :data:`SHARE_DIR` first on ``JUPYTER_PATH`` so Voilà finds the
    template."""
    env = dict(os.environ if base is None else base)
    parts = [str(SHARE_DIR)] + [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    env["JUPYTER_PATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env

DEFAULT_PORT = 8866
"""Voilà's own default port."""

PLANNER_NOTEBOOK_CELLS: tuple[tuple[str, str], ...] = (
    (
        "markdown",
        "# ZeRO planner\n\nPick a model, GPUs and a network: see per-GPU memory, step time and the DeepSpeed "
        "config for every ZeRO stage, recomputed as you move the controls.",
    ),
    ("code", "from zeroplanner.ui import PlannerApp\n\nPlannerApp()"),
)
"""Cells of ``notebooks/planner.ipynb`` (a test checks the file matches), used to write the page when the package
is installed without the repository's ``notebooks/`` folder."""


def repo_notebook() -> Path:
    """``notebooks/planner.ipynb`` beside the package in a source checkout (may not exist in a wheel install)."""
    return Path(__file__).resolve().parents[2] / "notebooks" / "planner.ipynb"


def voila_argv(notebook: str | Path, port: int = DEFAULT_PORT, open_browser: bool = False,
               max_kernels: int | None = None, cull_idle_seconds: int | None = None,
               pool_size: int | None = None, log_timings: bool = False,
               connect_timeout_seconds: int | None = None, max_pending_per_client: int | None = None) -> list[str]:
    """Command-line arguments for ``voila`` (or ``Voila.launch_instance(argv=...)``) serving ``notebook``.

    ``max_kernels`` overrides :data:`DEFAULT_MAX_KERNELS`; ``cull_idle_seconds`` overrides the idle timeout of
    :data:`CULL_SETTINGS` (the culler then checks every ``min(60, max(1, cull_idle_seconds // 4))`` seconds);
    ``pool_size`` overrides :data:`DEFAULT_POOL_SIZE` (0: no pre-executed kernel, every visitor's kernel starts on
    request); ``log_timings`` makes each kernel websocket log the server's time from the page's widget-state
    request to the first widget state sent (:class:`~zeroplanner.server.voila_app.ClosingPageWebsocketConnection`)
    and the time from each page sent to its websocket's connection; ``connect_timeout_seconds`` overrides
    :data:`DEFAULT_CONNECT_TIMEOUT_SECONDS`, ``max_pending_per_client`` :data:`MAX_PENDING_PER_CLIENT_DEFAULT`.
    Raises ``ValueError`` if ``port`` is outside 1..65535, ``max_kernels`` outside 1..10000,
    ``connect_timeout_seconds`` outside 1..86400, ``max_pending_per_client`` outside 0..10000,
    ``cull_idle_seconds`` outside 1..86400, or ``pool_size`` outside 0..:data:`MAX_POOL_SIZE` or above the kernel
    cap (pooled kernels count against it).
    """
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port={port} must be between 1 and 65535")
    voila = {cls: dict(values) for cls, values in VOILA_SETTINGS.items()}
    cull = {cls: dict(values) for cls, values in CULL_SETTINGS.items()}
    if max_kernels is not None:
        if not 1 <= int(max_kernels) <= 10000:
            raise ValueError(f"max_kernels={max_kernels} must be between 1 and 10000")
        voila["ZeroplannerKernelManager"]["max_kernels"] = int(max_kernels)
    if pool_size is not None:
        cap = int(voila["ZeroplannerKernelManager"]["max_kernels"])
        if not 0 <= int(pool_size) <= min(MAX_POOL_SIZE, cap):
            raise ValueError(f"pool_size={pool_size} must be between 0 and {min(MAX_POOL_SIZE, cap)} (at most "
                             f"max_kernels={cap}: pooled kernels count against the cap)")
        voila["VoilaConfiguration"]["default_pool_size"] = int(pool_size)
    if log_timings:
        voila["ClosingPageWebsocketConnection"] = {"log_timings": True}
        voila["ZeroplannerKernelManager"]["log_timings"] = True
    if connect_timeout_seconds is not None:
        if not 1 <= int(connect_timeout_seconds) <= 86400:
            raise ValueError(f"connect_timeout_seconds={connect_timeout_seconds} must be between 1 and 86400")
        voila["ZeroplannerKernelManager"]["connect_timeout_seconds"] = int(connect_timeout_seconds)
    if max_pending_per_client is not None:
        if not 0 <= int(max_pending_per_client) <= 10000:
            raise ValueError(f"max_pending_per_client={max_pending_per_client} must be between 0 and 10000")
        voila["ZeroplannerKernelManager"]["max_pending_per_client"] = int(max_pending_per_client)
    if cull_idle_seconds is not None:
        if not 1 <= int(cull_idle_seconds) <= 86400:
            raise ValueError(f"cull_idle_seconds={cull_idle_seconds} must be between 1 and 86400")
        cull["MappingKernelManager"]["cull_idle_timeout"] = int(cull_idle_seconds)
        cull["MappingKernelManager"]["cull_interval"] = min(60, max(1, int(cull_idle_seconds) // 4))
    argv = [str(notebook), f"--port={int(port)}"]
    for section in (voila, cull):
        for cls, values in section.items():
            for key, value in values.items():
                argv.append(f"--{cls}.{key}={value}")
    if not open_browser:
        argv.append("--no-browser")
    return argv
