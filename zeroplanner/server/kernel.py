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

Started by :class:`zeroplanner.server.voila_app.ZeroplannerServerKernelManager` in place of
``ipykernel_launcher``; imports ipykernel and pyzmq, never the planner's core.
"""

from __future__ import annotations

import sys

import zmq
from ipykernel.kernelapp import IPKernelApp

from . import IOPUB_HWM_MESSAGES


class ZeroplannerKernelApp(IPKernelApp):
    """``IPKernelApp`` whose IOPub socket queues :data:`IOPUB_HWM_MESSAGES` messages per subscriber."""

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
