"""A maximum kernel count for the planner's Voilà server, with a friendly "the planner is full" page.

Every Voilà visitor gets a kernel process (about 0.1-0.2 GB each, measured in ``docs/reliability.md``), so a
workshop of unbounded size can run the server out of memory. This module caps the number of kernels:

* :class:`ZeroplannerKernelManager` -- jupyter_server's ``AsyncMappingKernelManager`` with a ``max_kernels`` trait
  (:data:`DEFAULT_MAX_KERNELS`). ``start_kernel`` counts running and starting kernels (pre-heated ones included:
  the cap bounds processes, i.e. memory). A visitor's kernel over the cap raises :class:`KernelLimitReached`
  (HTTP 503, before any byte of the page is written, so the visitor gets an error page, not half a page). Voilà's
  pre-heated-kernel refill (environment ``VOILA_PREHEAT=True``, ``voila/voila_kernel_manager.py``) does not fail
  when the server is full: it waits until a kernel is shut down or culled, then starts, so the pool fills again.
  Used by ``zeroplanner app`` (``VoilaConfiguration.multi_kernel_manager_class``) and by binder
  (``ServerApp.kernel_manager_class`` in ``binder/jupyter_config.json``, where jupyter_server's own error page
  shows the message).
* :class:`CappedVoilaHandler` -- Voilà's page handler that answers :func:`full_page_html` (HTTP 503,
  ``Retry-After``) when no pre-heated kernel is ready and the cap is reached. Needed because Voilà hands a visitor
  the pre-heated kernel without calling ``start_kernel``: without this check the visitor who arrives while the
  refill waits would wait with it.
* :class:`ZeroplannerVoila` -- ``voila.app.Voila`` serving the page with :class:`CappedVoilaHandler`; what
  ``zeroplanner app`` launches.
* Pre-executed kernels (Voilà's pool, ``zeroplanner app --pool N``): :func:`mark_handed_out` gives a pooled kernel
  handed to a visitor the culler's whole idle timeout for its page to connect; with ``--log-timings``
  :class:`ClosingPageWebsocketConnection` logs the server's time from the page's widget-state request to the first
  widget state sent (``benchmarks/load_voila.py`` splits a visitor's wait with it, ``docs/reliability.md``).

Imports voila and jupyter_server: only :mod:`zeroplanner.cli.app` (when the ``app`` command runs) and the server
(by class name) import it.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import ctypes.util
import gc
import os
import re
import struct
import sys
import time
from typing import Any

import zmq
from jupyter_server.services.kernels.connection.base import BaseKernelWebsocketConnection
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager, ServerKernelManager
from tornado import web
from tornado.websocket import WebSocketClosedError
from jupyter_server._tz import utcnow
from traitlets import Bool, Float, Int, Type, default
from voila.static_file_handler import TemplateStaticFileHandler
from voila.app import Voila
from voila.shutdown_kernel_handler import VoilaShutdownKernelHandler
from voila.tornado.handler import TornadoVoilaHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

from ..pagejs import content_security_policy
from . import (DEFAULT_CONNECT_TIMEOUT_SECONDS, DEFAULT_MAX_KERNELS, IOPUB_HWM_MESSAGES, KERNEL_MODULE,
               MIN_PENDING_PER_CLIENT, TEMPLATE)

SERVER_KERNEL_MANAGER_CLASS = "zeroplanner.server.voila_app.ZeroplannerServerKernelManager"

RETRY_AFTER_SECONDS = 30
"""``Retry-After`` of the full page, and its automatic reload interval, seconds."""


class KernelLimitReached(web.HTTPError):
    """HTTP 503: the server already runs ``max_kernels`` kernels. ``log_message`` is the visitor-facing text
    (jupyter_server's error page shows it)."""

    def __init__(self, max_kernels: int) -> None:
        self.max_kernels = int(max_kernels)
        super().__init__(
            503,
            "The planner is full: %d people are using it on this server. Please try again in a few minutes.",
            self.max_kernels,
            reason="Planner full: please try again in a few minutes",
        )


class PendingPagesLimitReached(web.HTTPError):
    """HTTP 503: pages requested from this client address already hold ``max_pending`` kernels that no page has
    connected to yet (:attr:`ZeroplannerKernelManager.max_pending_per_client`)."""

    def __init__(self, max_pending: int, client: str) -> None:
        self.max_pending = int(max_pending)
        super().__init__(
            503,
            "%d planner pages requested from %s are still opening; the server starts no more for this address "
            "until they connect or time out.", self.max_pending, client,
            reason="Too many planner pages opening from one address",
        )


def pending_page_html(max_pending: int, retry_after_seconds: int = RETRY_AFTER_SECONDS) -> str:
    """The page a client over :attr:`ZeroplannerKernelManager.max_pending_per_client` gets (HTTP 503, retries)."""
    s = int(retry_after_seconds)
    return _retrying_page(
        "busy", "zp-full zp-pending", "Too many planner pages are opening from your address",
        f"<p>{int(max_pending)} pages requested from your network address have not finished opening. The server "
        "starts no more sessions for that address until they connect or time out.</p>"
        f"<p>This page tries again by itself every {s} seconds.</p>"
        "<p>If you are running a workshop whose visitors share one address (a NAT or a proxy): start the server "
        "with a higher <code>--max-pending-per-client</code>.</p>", s)


def _retrying_page(title: str, body_class: str, heading: str, paragraphs_html: str, retry_seconds: int) -> str:
    """A static HTML page that reloads itself every ``retry_seconds`` (meta refresh); the arguments are the
    server's own text, never a visitor's."""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='refresh' content='{int(retry_seconds)}'><title>ZeRO planner: {title}</title>"
        "<style>body{font-family:system-ui,sans-serif;max-width:40em;margin:4em auto;line-height:1.5;color:#222}"
        f"h1{{font-size:1.4em}}</style></head><body class='{body_class}'><h1>{heading}</h1>{paragraphs_html}"
        "</body></html>"
    )


_PAGE_KERNELS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("zp_page_kernels", default=None)
"""Ids of the kernels :meth:`ZeroplannerKernelManager.start_kernel` started for the page request being served
(:meth:`CappedVoilaHandler.get` sets a fresh list; Voilà awaits ``start_kernel`` inside the request's own task, so
the request's context is the one the call sees). Pre-heated refills are not recorded: they carry
``VOILA_PREHEAT=True`` and belong to no visitor."""


def full_page_html(max_kernels: int, retry_after_seconds: int = RETRY_AFTER_SECONDS) -> str:
    """The page a visitor over the cap sees: what happened, what to do, and an automatic retry (meta refresh)."""
    s = int(retry_after_seconds)
    return _retrying_page(
        "full", "zp-full", "The planner is full right now",
        f"<p>This server runs at most {int(max_kernels)} planner sessions at once, and all of them are in use.</p>"
        f"<p>This page tries again by itself every {s} seconds. Sessions that are left idle are closed "
        "automatically, so a place should free up soon.</p>"
        "<p>If you are running a workshop: start the server with a higher <code>--max-kernels</code> "
        "(each session needs about 0.2 GB of memory).</p>", s)


class ZeroplannerServerKernelManager(ServerKernelManager):
    """jupyter_server's per-kernel manager, starting Python kernels with :mod:`zeroplanner.server.kernel`
    (ipykernel with a deeper IOPub queue) instead of ``ipykernel_launcher``.

    Only a kernel command of the form ``PYTHON -m ipykernel_launcher ARGS...`` (ipykernel's own kernelspec) with the
    server's own Python is changed, to ``PYTHON -m zeroplanner.server.kernel ARGS...``; any other kernelspec
    starts as written.
    """

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return with_planner_kernel(super().format_kernel_cmd(extra_arguments))


def with_planner_kernel(cmd: list[str]) -> list[str]:
    """``cmd`` with ``-m ipykernel_launcher`` replaced by ``-m`` :data:`KERNEL_MODULE` (a new list). ``cmd`` is
    returned unchanged when it does not run ``ipykernel_launcher`` as its module, or runs it with another Python
    than the server's own (``sys.executable``; another environment may not have zeroplanner installed)."""
    out = list(cmd)
    if not out or os.path.realpath(out[0]) != os.path.realpath(sys.executable):
        return out
    for i in range(1, len(out) - 1):
        if out[i] == "-m" and out[i + 1] == "ipykernel_launcher":
            out[i + 1] = KERNEL_MODULE
            break
    return out


class ZeroplannerKernelManager(AsyncMappingKernelManager):
    """``AsyncMappingKernelManager`` with at most ``max_kernels`` kernels (running + starting).

    Raises :class:`KernelLimitReached` from ``start_kernel`` for a visitor's kernel over the cap; a pre-heated
    refill waits instead (polling every ``preheat_wait_seconds``). Culling settings (``MappingKernelManager.*``)
    apply unchanged: this is a subclass. Kernels are started by :class:`ZeroplannerServerKernelManager`, and the
    server's sockets to them queue up to :data:`IOPUB_HWM_MESSAGES` received messages (ZMQ_RCVHWM) instead of 1000.
    """

    max_kernels = Int(
        DEFAULT_MAX_KERNELS, config=True,
        help="Most kernels (visitors' and pre-heated) at once; a visitor over it gets the 'planner is full' page.",
    )
    preheat_wait_seconds = Float(
        1.0, config=True, help="Poll interval, seconds, of a pre-heated kernel refill waiting for a free slot.",
    )
    connect_timeout_seconds = Float(
        DEFAULT_CONNECT_TIMEOUT_SECONDS, config=True,
        help="Seconds after a visitor's page was sent within which the page must connect to its kernel; a kernel "
             "no page has connected to by then is shut down (a request without a browser).",
    )
    max_pending_per_client = Int(
        0, config=True,
        help="Most kernels that page requests from one client address may hold before any page connects to them "
             "(requests being served included); 0: half of max_kernels, at least MIN_PENDING_PER_CLIENT.",
    )
    log_timings = Bool(False, config=True, help="Log the seconds from a page being sent to its kernel websocket.")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._zp_reserved: set[str] = set()
        self._zp_closing = False
        self._zp_awaiting: dict[str, tuple[str, float]] = {}  # kernel id -> (client address, page sent at)
        self._zp_inflight: dict[str, int] = {}  # client address -> page requests being served
        # receive queues from kernels (IOPub above all) as deep as the kernel's send queue (IOPUB_HWM_MESSAGES)
        self.context.setsockopt(zmq.RCVHWM, IOPUB_HWM_MESSAGES)

    @default("kernel_manager_class")
    def _default_kernel_manager_class(self) -> str:
        return SERVER_KERNEL_MANAGER_CLASS

    def kernels_in_use(self) -> int:
        """Kernels running or starting (ids are reserved before the start, so concurrent starts count)."""
        return len(set(self._kernels) | set(self._pending_kernels) | self._zp_reserved)

    def is_full(self) -> bool:
        return self.kernels_in_use() >= self.max_kernels

    async def start_kernel(self, *, kernel_id: str | None = None, **kwargs: Any) -> str:
        if kernel_id is not None and kernel_id in self:  # jupyter_server returns the existing kernel
            return await super().start_kernel(kernel_id=kernel_id, **kwargs)
        env = kwargs.get("env") or {}
        preheat = str(env.get("VOILA_PREHEAT", "")) == "True"
        while self.is_full():
            if not preheat:
                self.log.warning("kernel limit reached (%d kernels); refusing a new visitor", self.max_kernels)
                raise KernelLimitReached(self.max_kernels)
            if self._zp_closing:
                raise RuntimeError("the server is shutting down; not refilling the pre-heated kernel pool")
            await asyncio.sleep(self.preheat_wait_seconds)
        kid = kernel_id or self.new_kernel_id()
        self._zp_reserved.add(kid)  # counted from now on, before the first await below
        try:
            started = await super().start_kernel(kernel_id=kid, **kwargs)
        finally:
            self._zp_reserved.discard(kid)
        page_kernels = _PAGE_KERNELS.get()
        if page_kernels is not None and not preheat:
            page_kernels.append(started)
        return started

    # -- kernels for pages, not for requests ---------------------------------------------------------------------
    def pending_cap(self) -> int:
        """:attr:`max_pending_per_client`, or when it is 0 the larger of :data:`MIN_PENDING_PER_CLIENT` and half of
        :attr:`max_kernels`."""
        return int(self.max_pending_per_client) or max(MIN_PENDING_PER_CLIENT, int(self.max_kernels) // 2)

    def pending_for(self, client: str) -> int:
        """Kernels held for ``client``'s pages that no page has connected to, plus its requests being served."""
        return self._zp_inflight.get(client, 0) + sum(1 for c, _ in self._zp_awaiting.values() if c == client)

    def page_request_started(self, client: str) -> None:
        self._zp_inflight[client] = self._zp_inflight.get(client, 0) + 1

    def page_request_ended(self, client: str, kernel_ids: list[str]) -> None:
        """The page for ``kernel_ids`` was sent to ``client`` (or the request ended): each kernel that no page has
        connected to yet must be connected to within :attr:`connect_timeout_seconds`, or it is shut down."""
        left = self._zp_inflight.get(client, 0) - 1
        if left > 0:
            self._zp_inflight[client] = left
        else:
            self._zp_inflight.pop(client, None)
        loop = asyncio.get_running_loop()
        for kid in dict.fromkeys(kernel_ids):
            if kid not in self._kernels or self._kernel_connections.get(kid, 0) > 0:
                continue
            self._zp_awaiting[kid] = (client, time.monotonic())
            loop.call_later(float(self.connect_timeout_seconds),
                            lambda kid=kid: asyncio.ensure_future(self._zp_shutdown_if_unconnected(kid)))

    async def _zp_shutdown_if_unconnected(self, kernel_id: str) -> None:
        entry = self._zp_awaiting.pop(kernel_id, None)
        if entry is None or kernel_id not in self._kernels:
            return
        self.log.warning("kernel %s: no page connected within %g s of its page being sent to %s; shutting it down",
                         kernel_id, float(self.connect_timeout_seconds), entry[0])
        try:
            await self.shutdown_kernel(kernel_id)
        except Exception as exc:  # already gone (culled, page closed): one line, nothing left to do
            self.log.warning("kernel %s: shutdown after the connect timeout: %s", kernel_id, type(exc).__name__)

    def notify_connect(self, kernel_id: str) -> None:
        """jupyter_server's count of connections (the kernel websocket's ``connect``), and the kernel is no longer
        waiting for its page."""
        super().notify_connect(kernel_id)
        entry = self._zp_awaiting.pop(kernel_id, None)
        if entry is not None and self.log_timings:
            self.log.info("zeroplanner timing: kernel %s: page connected %.3f s after its page was sent",
                          kernel_id, time.monotonic() - entry[1])

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        """Skip a kernel that is still starting, else jupyter_server's check.

        jupyter_server 2.x registers a kernel in ``_kernels`` before it sets ``kernel.last_activity``
        (``MappingKernelManager._async_start_kernel``); a cull tick in between reads the unset trait, traitlets raises
        ``TraitError: ... 'last_activity' ... expected a datetime, not the NoneType`` (``hasattr`` does not catch it),
        and the server logs that traceback. Seen in a 3-visitor ``benchmarks/load_voila.py`` run with a 2 s cull
        interval. A starting kernel is not idle; the next tick checks it.
        """
        kernel = self._kernels.get(kernel_id)
        if kernel is not None and not kernel.trait_has_value("last_activity"):
            return
        await super().cull_kernel_if_idle(kernel_id)

    async def shutdown_kernel(self, kernel_id: str, *args: Any, **kwargs: Any) -> None:
        """jupyter_server's shutdown, then release what the server keeps for the kernel's session: Voilà's
        request info for it (:func:`forget_request_info`) and freed heap pages (:func:`release_freed_memory`)."""
        try:
            await super().shutdown_kernel(kernel_id, *args, **kwargs)
        finally:
            self._zp_awaiting.pop(kernel_id, None)
            forget_request_info(kernel_id)
            release_freed_memory()

    async def shutdown_all(self, *args: Any, **kwargs: Any) -> None:
        self._zp_closing = True
        await super().shutdown_all(*args, **kwargs)


def forget_request_info(kernel_id: str) -> bool:
    """Drop Voilà's request info for ``kernel_id`` (returns whether there was any).

    Voilà 0.5.13 hands a pre-heated kernel its visitor's request (query string, server name and port) through
    ``RequestInfoSocketHandler`` (``voila/request_info_handler.py``): when the kernel has not yet connected to
    ``voila/query/<kernel id>`` the payload is kept in the class-level ``_cache`` dict, which nothing ever clears,
    not even after the kernel is shut down, so a long-running server keeps one entry per such visitor (Voilà's
    pre-heated mode has a reported leak of its own, voila-dashboards/voila#1189). ``_waiters`` entries are removed
    by Voilà when the kernel's websocket closes; a kernel killed mid-connection is dropped here as well."""
    from voila.request_info_handler import RequestInfoSocketHandler

    had = RequestInfoSocketHandler._cache.pop(kernel_id, None) is not None
    RequestInfoSocketHandler._waiters.pop(kernel_id, None)
    return had


def release_freed_memory() -> bool:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim(0)``), so the server's memory
    falls back after a workshop's kernels are shut down instead of staying at its high-water mark. Returns whether
    ``malloc_trim`` was available (glibc only; elsewhere this only collects garbage)."""
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def ready_preheated_kernel(kernel_manager: Any, notebook: str | None) -> bool:
    """True when Voilà's pool for ``notebook`` has a started kernel at its head (what the next visitor gets)."""
    pools = getattr(kernel_manager, "_pools", None) or {}
    pool = pools.get(notebook) or []
    if not pool:
        return False
    head = pool[0]
    return head.done() and not head.cancelled() and head.exception() is None


def pool_head(kernel_manager: Any, notebook: str | None) -> asyncio.Future | None:
    """The task at the head of Voilà's pre-heated pool for ``notebook`` (the kernel the next visitor is handed:
    ``VoilaKernelManager.get_rendered_notebook`` pops index 0), or None when the pool is empty or absent."""
    pool = (getattr(kernel_manager, "_pools", None) or {}).get(notebook) or []
    return pool[0] if pool else None


def mark_handed_out(kernel_manager: Any, item: asyncio.Future) -> str | None:
    """Set ``last_activity`` to now on the kernel of a finished pool task ``item`` (what Voilà handed a visitor)
    and return its id; None when the task is not finished, failed, or its kernel is gone.

    Why: Voilà's culler skips kernels in the pool (``VoilaKernelManager.cull_kernel_if_idle``), and a pooled kernel
    keeps the ``last_activity`` of the moment it finished executing the page, possibly long ago. Once handed out
    it leaves the pool and, until the page's websocket connects, has no connection: the next cull tick found it
    idle for longer than ``cull_idle_timeout`` and shut it down while the visitor's page was still loading (the
    page never drew). Marking it active when it is handed out gives the page the full idle timeout to connect,
    as a freshly started kernel has.
    """
    if not item.done() or item.cancelled() or item.exception() is not None:
        return None
    kernel_id = (item.result() or {}).get("kernel_id")
    kernel = getattr(kernel_manager, "_kernels", {}).get(kernel_id)
    if kernel is None:
        return None
    kernel.last_activity = utcnow()
    return kernel_id


def plain_write_error(handler: web.RequestHandler, status_code: int) -> None:
    """Answer an error with ``<status>: <reason>`` as plain text: no template, no traceback, no server path.

    jupyter_server's ``JupyterHandler.write_error`` renders its ``404.html`` / ``error.html`` templates, which call
    tornado's ``static_url``; Voilà's application has no ``static_path`` setting, so every error page it rendered
    raised "You must define the 'static_path' setting" and the server logged "Uncaught exception in write_error"
    with two tracebacks (``/voila/api/themes/x``, ``/voila/labextensions/x``, ``/logout``: reproduced by
    ``tests/server/test_server_surface.py``)."""
    handler.set_header("Content-Type", "text/plain; charset=utf-8")
    handler.finish(f"{status_code}: {handler._reason}\n")


class PlainErrors:
    """Mixin for every handler :class:`ZeroplannerVoila` mounts: errors as :func:`plain_write_error`."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        plain_write_error(self, status_code)  # type: ignore[arg-type]


class TemplateStaticHandler(PlainErrors, TemplateStaticFileHandler):
    """Voilà's template static files (``/voila/templates/<template>/static/<path>``) for the served template only.

    Voilà's ``TemplateStaticFileHandler.parse_url_path`` splits the path with a tuple unpacking and an ``assert``:
    ``/voila/templates/foo`` raised ValueError and ``/voila/templates/%2e%2e/%2e%2e/etc/passwd`` AssertionError,
    each an "Uncaught exception" with a traceback and HTTP 500. Here any path that is not
    ``<TEMPLATE>/static/<relative path>`` in normal form (no ``..``, ``.`` or empty segment: Voilà's
    ``get_absolute_path`` normalises and splits again, and ``zeroplanner/static/%2e%2e/%2e%2e/conf.json`` raised
    there) is a 404 before Voilà's code runs; files are still looked up and
    confined to the template's static folders by Voilà (``validate_absolute_path``)."""

    def parse_url_path(self, path: str) -> str:
        parts = path.split("/", 2)
        if (len(parts) != 3 or parts[0] != TEMPLATE or parts[1] != "static" or not parts[2]
                or os.path.normpath(path) != path or "\\" in path):  # "..", "." or "//": Voila's split fails
            raise web.HTTPError(404)
        return super().parse_url_path(path)


class CappedVoilaHandler(PlainErrors, TornadoVoilaHandler):
    """Voilà's page handler, answering the "planner is full" page instead of queueing a visitor the server cannot
    give a kernel, and marking a pre-heated kernel active when it is handed to a visitor (:func:`mark_handed_out`)."""

    @web.authenticated
    async def get(self, path: str | None = None) -> None:
        km = self.kernel_manager
        notebook = self.notebook_path or path
        is_full = getattr(km, "is_full", None)
        if is_full is not None and is_full() and not ready_preheated_kernel(km, notebook):
            raise KernelLimitReached(km.max_kernels)
        client = self.request.remote_ip or "unknown"
        tracks_pages = hasattr(km, "page_request_started")
        if tracks_pages and km.pending_for(client) >= km.pending_cap():
            km.log.warning("%d pages from %s still opening; refusing another", km.pending_cap(), client)
            raise PendingPagesLimitReached(km.pending_cap(), client)
        # the head of the pool is the kernel this request is handed: Voila pops it before its first await
        handed = pool_head(km, notebook)
        if handed is not None:
            if handed.done():
                mark_handed_out(km, handed)
            else:
                handed.add_done_callback(lambda item: mark_handed_out(km, item))
        started: list[str] = []
        token = _PAGE_KERNELS.set(started)
        if tracks_pages:
            km.page_request_started(client)
        try:
            await super().get(path)
        finally:
            _PAGE_KERNELS.reset(token)
            handed_id = None
            if handed is not None:  # and again once the page is written: the websocket connects after that
                handed_id = mark_handed_out(km, handed)
                if handed in ((getattr(km, "_pools", None) or {}).get(notebook) or []):
                    handed_id = None  # still pooled: this request did not take it (Voila rendered afresh)
            if tracks_pages:
                km.page_request_ended(client, ([handed_id] if handed_id else []) + started)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        if isinstance(exc, (KernelLimitReached, PendingPagesLimitReached)):
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Retry-After", str(RETRY_AFTER_SECONDS))
            self.set_header("Cache-Control", "no-store")
            self.finish(full_page_html(exc.max_kernels) if isinstance(exc, KernelLimitReached)
                        else pending_page_html(exc.max_pending))
            return
        plain_write_error(self, status_code)


class BeaconShutdownKernelHandler(PlainErrors, VoilaShutdownKernelHandler):
    """Voilà's "shut my kernel down" endpoint (``POST /voila/api/shutdown/<kernel_id>``), accepting the page's
    request without an XSRF token; the request's ``Origin`` must still be this server.

    The page sends that request with ``navigator.sendBeacon`` when it is closed or reloaded (voila-dashboards/voila
    #972), which cannot add jupyter_server's ``X-XSRFToken`` header, so jupyter_server answered ``403 '_xsrf'
    argument missing from POST`` (voila-dashboards/voila#1458, open) and every closed or reloaded page left its
    kernel running until the culler took it (600 s), counted against ``max_kernels`` meanwhile. Cross-site requests
    stay refused by jupyter_server's origin check (HTTP 404), and a kernel id is a random UUID the page was given.
    """

    def check_xsrf_cookie(self) -> None:
        if not self.check_origin():
            raise web.HTTPError(404)

    async def post(self, kernel_id: str) -> None:
        """Voilà's shutdown; a kernel the server cannot shut down now is one log line and HTTP 409, not a traceback.

        A shutdown while jupyter_server is auto-restarting the kernel (a page closed within a second of its kernel
        dying) fails inside jupyter_client (``asyncio.InvalidStateError: Exception is not set``,
        ``multikernelmanager.py``: seen by tests/browser/test_browser_session.py while it was written); the
        culler shuts such a kernel down later."""
        try:
            await super().post(kernel_id)
        except web.HTTPError:
            raise
        except Exception as exc:
            self.log.warning("kernel %s: shutdown request not carried out (%s); the culler will shut it down",
                             kernel_id, type(exc).__name__)
            self.set_status(409)
            self.finish()


def _retrieve_closed_write(future: asyncio.Future) -> None:
    """Done-callback of one websocket write: a write to a page that closed mid-write ends in
    ``WebSocketClosedError``; retrieving it here is the whole handling (the page is gone, nothing is left to send
    to). Any other exception is left for asyncio to report."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None and not isinstance(exc, WebSocketClosedError):
        raise exc


STATE_REQUEST = re.compile(rb'"comm_info_request"|"target_name":\s*"jupyter\.widget\.control"')
"""A page's first request for its widgets' state, in a websocket frame from the page: the widget manager opens a
comm to ``jupyter.widget.control`` and asks for every state, or, in ipywidgets' per-widget fallback
(jupyter-widgets/ipywidgets#3633), starts with ``comm_info_request``."""

STATE_REPLY = re.compile(rb'"method":\s*"update(_states)?"')
"""A widget state in a kernel message to the page: ``update_states`` (every state on the control comm) or
``update`` (one widget's state, the per-widget fallback's reply)."""


class ClosingPageWebsocketConnection(ZMQChannelsWebsocketConnection):
    """jupyter_server's kernel websocket connection, except that kernel messages go out at once (Nagle's algorithm
    off: :meth:`connect`), a kernel message written to a page whose websocket is closing is dropped instead of
    leaving a failed task behind, and (``log_timings``) it logs the server's part of the page's wait: seconds from
    the page's widget-state request (:data:`STATE_REQUEST`) reaching the server to the first widget state
    (:data:`STATE_REPLY`) written to the page.

    ``ZMQChannelsWebsocketConnection.write_message`` hands out tornado's ``WebSocketHandler.write_message``, whose
    returned future fails with ``WebSocketClosedError`` when the page closes while the message is in flight
    (``tornado/websocket.py`` ``WebSocketProtocol13.write_message``); jupyter_server never awaits that future, so
    asyncio logs "Task exception was never retrieved" with a traceback in the server log -- seen once in 30 visitors
    by ``benchmarks/load_voila.py`` (docs/reliability.md). Used by ``zeroplanner app``
    (``Voila.kernel_websocket_connection_class``) and binder (``ServerApp.kernel_websocket_connection_class``).
    """

    log_timings = Bool(False, config=True,
                       help="Log the seconds from the page's widget-state request to the first widget state sent.")

    _zp_requested_at: float | None = None
    _zp_timed = False

    def connect(self) -> Any:
        """Connect as jupyter_server does (returns its future, or None when the kernel is gone), with Nagle's
        algorithm off on the page's socket first (TCP_NODELAY, tornado's ``WebSocketHandler.set_nodelay``).

        Why: tornado leaves Nagle on for a websocket (``http1connection._finish_request`` turns it back on after
        the upgrade), and a slider change makes the kernel write a burst of small messages (busy, verdict, bars,
        idle; a stock widget's echo too). A message written while the previous one is unacknowledged then waits
        for the page's delayed ACK, about 40 ms on Linux (``TCP_DELACK_MIN``, include/net/tcp.h). Timing every
        websocket message in the page (benchmarks/bench_app.py) showed that: in 3-4 of 40 changes the echo arrived
        35-40 ms after the kernel's busy, on the planner page and on a bare stock-Voilà page alike. A/B, four runs
        (60, 60, 60, 40 changes), both planner servers and a bare page open at once: slider -> chart painted p95
        44.3, 53.4, 44.0, 45.0 ms with it against 56.0, 56.1, 56.0, 61.4 ms without; medians 28.0, 32.7, 34.6,
        35.0 against 33.2, 33.7, 34.8, 34.5 ms."""
        try:
            self.websocket_handler.set_nodelay(True)
        except (AssertionError, AttributeError, OSError):  # page gone, or the socket refused: only a tuning step
            pass
        return super().connect()

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        """jupyter_server's handling of a frame from the page; a frame it cannot parse is dropped with one log line.

        jupyter_server parses the frame (``json.loads``, or the v1 binary protocol) without a guard: a frame that
        is not a Jupyter message ("not json", ``{}``, random bytes) raised from the websocket's ``on_message``,
        tornado logged "Uncaught exception" with a traceback and closed the page's websocket
        (``tests/server/test_server_surface.py``). The errors caught are the parsers' (ValueError covers
        JSONDecodeError and UnicodeDecodeError; ``struct.error`` is the binary protocol's offsets); anything else
        still propagates."""
        if self.log_timings and self._zp_requested_at is None and not self._zp_timed:
            raw = incoming_msg.encode() if isinstance(incoming_msg, str) else bytes(incoming_msg)
            if STATE_REQUEST.search(raw):
                self._zp_requested_at = time.perf_counter()
        try:
            super().handle_incoming_message(incoming_msg)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error) as exc:
            self.log.warning("kernel %s: dropped a malformed websocket message (%d bytes, %s)", self.kernel_id,
                             len(incoming_msg), type(exc).__name__)

    def _zp_time_reply(self, message: Any) -> None:
        raw = message.encode() if isinstance(message, str) else bytes(message)
        if STATE_REPLY.search(raw):
            self._zp_timed = True
            self.log.info("zeroplanner timing: kernel %s: first widget state sent %.3f s after the page's request",
                          self.kernel_id, time.perf_counter() - self._zp_requested_at)

    @property
    def write_message(self):  # type: ignore[override]
        """``websocket_handler.write_message`` whose closed-page failure is retrieved (see the class doc)."""
        write = self.websocket_handler.write_message

        def send(message: Any, binary: bool = False) -> Any:
            if self._zp_requested_at is not None and not self._zp_timed:
                self._zp_time_reply(message)
            try:
                future = write(message, binary=binary)
            except WebSocketClosedError:  # closed before the write began: tornado raises at once
                self.log.debug("page websocket already closed: kernel message dropped")
                return None
            future.add_done_callback(_retrieve_closed_write)
            return future

        return send


class PlainErrorKernelWebsocketHandler(PlainErrors, VoilaKernelWebsocketHandler):
    """Voilà's kernel websocket handler, answering an error (e.g. HTTP 404 for a kernel that was culled) with a
    plain-text body.

    jupyter_server's ``JupyterHandler.write_error`` renders its ``404.html`` template, which calls tornado's
    ``static_url``; Voilà's application has no ``static_path`` setting, so the rendering raised "You must define the
    'static_path' setting in your application to use static_url" and the server logged "Uncaught exception in
    write_error" with two tracebacks. Seen in a 15-visitor ``benchmarks/load_voila.py`` run: a page reconnected
    after the culler had shut its kernel down (as a laptop waking from sleep does). The client is a websocket (the
    widget manager), which reads only the status; the status and reason are unchanged (:class:`PlainErrors`).
    """


class ZeroplannerVoila(Voila):
    """Voilà serving the page with :class:`CappedVoilaHandler`, the kernel-shutdown endpoint with
    :class:`BeaconShutdownKernelHandler`, kernel websockets with :class:`PlainErrorKernelWebsocketHandler` and
    :class:`ClosingPageWebsocketConnection`, template statics with :class:`TemplateStaticHandler`; every other
    handler with plain-text errors (:class:`PlainErrors`); no ``/login`` or ``/logout`` (the page has no login:
    ``/logout`` answered HTTP 500 with a traceback); and the page's Content-Security-Policy
    (:func:`zeroplanner.pagejs.content_security_policy`) on every response."""

    kernel_websocket_connection_class = Type(
        default_value=ClosingPageWebsocketConnection, klass=BaseKernelWebsocketConnection, config=True,
        help="The kernel websocket connection class (zeroplanner's drops writes to closing pages quietly).")

    def init_settings(self) -> dict:
        settings = super().init_settings()
        headers = dict(settings.get("headers") or {})
        headers["Content-Security-Policy"] = content_security_policy()
        settings["headers"] = headers
        return settings

    def init_handlers(self) -> list:
        replace = {TornadoVoilaHandler: CappedVoilaHandler, VoilaShutdownKernelHandler: BeaconShutdownKernelHandler,
                   VoilaKernelWebsocketHandler: PlainErrorKernelWebsocketHandler,
                   TemplateStaticFileHandler: TemplateStaticHandler}
        provider = getattr(self, "identity_provider", None)
        login_routes = {getattr(provider, "login_handler_class", None), getattr(provider, "logout_handler_class", None)}
        login_routes.discard(None)
        handlers = []
        for spec in super().init_handlers():
            if isinstance(spec, tuple) and len(spec) >= 2:
                cls = spec[1]
                if cls in login_routes:
                    continue
                cls = replace.get(cls, cls)
                if isinstance(cls, type) and issubclass(cls, web.RequestHandler) and not issubclass(cls, PlainErrors):
                    cls = _with_plain_errors(cls)
                spec = (spec[0], cls, *spec[2:])
            handlers.append(spec)
        return handlers


_PLAIN: dict[type, type] = {}


def _with_plain_errors(cls: type) -> type:
    """``cls`` with :class:`PlainErrors` first in its bases (one subclass per class, same name and module path in
    the log)."""
    if cls not in _PLAIN:
        _PLAIN[cls] = type(cls.__name__, (PlainErrors, cls), {"__module__": cls.__module__})
    return _PLAIN[cls]


__all__ = [
    "BeaconShutdownKernelHandler", "CappedVoilaHandler", "PlainErrorKernelWebsocketHandler",
    "ClosingPageWebsocketConnection", "KernelLimitReached", "RETRY_AFTER_SECONDS", "SERVER_KERNEL_MANAGER_CLASS",
    "ZeroplannerKernelManager", "ZeroplannerServerKernelManager", "ZeroplannerVoila", "forget_request_info",
    "full_page_html", "mark_handed_out", "pool_head", "ready_preheated_kernel", "release_freed_memory",
    "with_planner_kernel",
]
