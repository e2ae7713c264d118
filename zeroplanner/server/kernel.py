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

After each notebook cell the kernel freezes the garbage collector's view of every object then alive
(:func:`gc.freeze`, "move them to a permanent generation and ignore them in all the future collections"): a Voilà
page runs its cells once and then lives on widget messages, so what the cells built (the page's widgets, the
planner's tables, the imported libraries: about 123,000 tracked objects) is long-lived. Without it a full
(generation-2) collection traverses all of them, about 60 ms on the 2-core build machine (measured in a
process holding one ``PlannerApp``), and lands at random inside a slider change: in benchmarks/bench_app.py the
planner's slider -> chart p95 was set by 2-3 such changes of 50-105 ms among changes of about 20 ms.
A frozen object that later becomes unreachable is still freed by reference counting; one held only by a reference
cycle stays until the kernel exits (at most what the cells built, once: objects created by widget messages are
collected as before).

Started by :class:`zeroplanner.server.voila_app.ZeroplannerServerKernelManager` in place of
``ipykernel_launcher``; imports ipykernel and pyzmq, never the planner's core.
"""

from __future__ import annotations

import gc
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

    def init_shell(self) -> None:
        super().init_shell()
        # IPython's documented cell events (IPython.core.events): after a cell, everything alive is long-lived
        self.shell.events.register("post_run_cell", freeze_after_cell)


def freeze_after_cell(result=None) -> None:
    """``post_run_cell`` callback: :func:`gc.freeze` the objects alive once a cell has run (module docstring)."""
    gc.freeze()


def main() -> None:
    """Entry point: the same command line as ``python -m ipykernel_launcher``."""
    if sys.path and sys.path[0] == "":  # as ipykernel_launcher: no CWD on sys.path while the kernel loads
        del sys.path[0]
    ZeroplannerKernelApp.launch_instance()


if __name__ == "__main__":
    main()
