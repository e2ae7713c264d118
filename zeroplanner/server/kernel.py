"""The planner server's Python kernel: ipykernel with a deeper IOPub send queue.

``python -m zeroplanner.server.kernel -f CONNECTION_FILE`` is ``python -m ipykernel_launcher -f ...`` except
that the kernel's IOPub PUB socket queues up to :data:`~zeroplanner.server.IOPUB_HWM_MESSAGES` messages per
subscriber instead of ZeroMQ's default 1000 (``ZMQ_SNDHWM``). A PUB socket whose queue to a subscriber is full
DROPS further messages to it without an error (ZeroMQ guide, "Pub-Sub Message Envelopes"/high-water marks;
``zmq_setsockopt(3)``, ZMQ_SNDHWM). The planner's page can ask for every widget's state at once (ipywidgets'
per-widget fallback, jupyter-widgets/ipywidgets#3633) with a burst of about 1,100 IOPub messages;
with ZeroMQ's default queue a loaded server lost the burst's tail and the page never drew. What was measured, and
what did not help, is in ``docs/reliability.md`` ("What earlier runs of this script found").

The high-water mark must be set before the socket binds: ZeroMQ copies a bound socket's options into each
accepted connection when the listener is created (``zmq_setsockopt(3)``: "Changes ... only take effect for
subsequent socket bind/connects"), so the kernel sets it as a context default just before ipykernel creates the
IOPub socket (:meth:`ZeroplannerKernelApp.init_iopub`). Everything else is ipykernel's ``IPKernelApp``.

Tracebacks stay in the kernel: ipykernel sends the kernel's own log output (its stderr, captured) to the page as
``stream`` messages, so a scripted ``comm_open`` with a bogus widget state got back "Exception opening comm with
target: jupyter.widget" with a traceback naming the server's file paths. :class:`WithheldTraceback`
turns every logged exception into one line with the exception's type only (:meth:`ZeroplannerKernelApp.init_kernel`).

Started by :class:`zeroplanner.server.voila_app.ZeroplannerServerKernelManager` in place of
``ipykernel_launcher``; imports ipykernel and pyzmq, never the planner's core.
"""

from __future__ import annotations

import logging
import sys

import zmq
from ipykernel.kernelapp import IPKernelApp

from . import IOPUB_HWM_MESSAGES


class WithheldTraceback(logging.Filter):
    """A log record with an exception becomes one line: its message plus the exception's type, no traceback and no
    exception text (which may hold server paths). Installed on every handler of the kernel's loggers."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}; traceback withheld)"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
        if record.stack_info:
            record.stack_info = None
        return True


WITHHELD = WithheldTraceback()


def withhold_tracebacks(loggers: list[logging.Logger]) -> None:
    """Put :data:`WITHHELD` on each handler of ``loggers`` and on Python's last-resort handler (records of loggers
    with no handler anywhere, such as ipykernel's ``ipykernel.comm`` and comm's ``Comm``, end there)."""
    handlers = [logging.lastResort] if logging.lastResort is not None else []
    for logger in loggers:
        handlers.extend(logger.handlers)
    for handler in handlers:
        if WITHHELD not in handler.filters:
            handler.addFilter(WITHHELD)


class ZeroplannerKernelApp(IPKernelApp):
    """``IPKernelApp`` whose IOPub socket queues :data:`IOPUB_HWM_MESSAGES` messages per subscriber and whose logged
    exceptions are one line each (:class:`WithheldTraceback`)."""

    def init_kernel(self) -> None:
        super().init_kernel()
        withhold_tracebacks([logging.getLogger(), self.log, logging.getLogger("ipykernel.comm"),
                             logging.getLogger("Comm")])

    def init_iopub(self, context: zmq.Context) -> None:
        # a context default applies to sockets created afterwards: the IOPub PUB socket ipykernel creates next
        # (and its in-process event pipes, where a send high-water mark changes nothing)
        context.setsockopt(zmq.SNDHWM, IOPUB_HWM_MESSAGES)
        super().init_iopub(context)


def main() -> None:
    """Entry point: the same command line as ``python -m ipykernel_launcher``."""
    if sys.path and sys.path[0] == "":  # as ipykernel_launcher: no CWD on sys.path while the kernel loads
        del sys.path[0]
    ZeroplannerKernelApp.launch_instance()


if __name__ == "__main__":
    main()
