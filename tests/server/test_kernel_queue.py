"""The planner server's kernel (zeroplanner.server.kernel) does not drop IOPub messages in a burst that a
stock ipykernel drops.

Why it matters: on a loaded 30-visitor server (benchmarks/load_voila.py) pages that asked for each of their 362
widgets one by one got 999-1042 of the kernel's 1098 IOPub messages at the server's websocket handler and never drew.
A ZeroMQ PUB socket drops messages to a subscriber whose queue is full (ZMQ_SNDHWM, default 1000, zmq_setsockopt(3)).
This test makes the subscriber fall behind on purpose (a client that does not read IOPub while the kernel sends a
burst) and counts what arrives, for ``ipykernel_launcher`` and for the planner's kernel, over Unix sockets as the
server uses them (``KernelManager.transport = "ipc"``; loopback TCP's larger, auto-tuned buffers absorb this burst).
"""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("voila")

from jupyter_client import KernelManager  # noqa: E402

from zeroplanner.server import IOPUB_HWM_MESSAGES, KERNEL_MODULE  # noqa: E402
from zeroplanner.server.voila_app import with_planner_kernel  # noqa: E402

BURST = 5000
"""Comm messages the kernel sends while the client does not read: more than a stock kernel can queue (about 1000
in the kernel's PUB queue + 1000 in the client's SUB queue + what the Unix socket buffers hold), fewer than
IOPUB_HWM_MESSAGES."""

BURST_CODE = f"""
from comm import create_comm
_c = create_comm(target_name="zp-queue-test")
for _i in range({BURST}):
    _c.send({{"i": _i}})
"""


class _PlannerKernelManager(KernelManager):
    """jupyter_client's manager with the server's command rewrite (the function ZeroplannerServerKernelManager
    uses)."""

    def format_kernel_cmd(self, extra_arguments=None):
        return with_planner_kernel(super().format_kernel_cmd(extra_arguments))


def _delivered(km: KernelManager) -> tuple[int, list[str]]:
    """Start ``km``'s kernel, run the burst without reading IOPub, then read everything; returns (comm messages
    received, kernel command line)."""
    km.start_kernel()
    cmd = list(km.format_kernel_cmd())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        while kc.iopub_channel.msg_ready():
            kc.get_iopub_msg(timeout=1)
        msg_id = kc.execute(BURST_CODE)
        while True:  # the shell reply: the kernel has sent the whole burst
            reply = kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["status"] == "ok", reply["content"]
        received = 0
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=3)
            except Exception:  # queue.Empty: nothing more within 3 s
                break
            if msg["msg_type"] == "comm_msg":
                received += 1
        return received, cmd
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_planner_kernel_command_line():
    cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "/tmp/k.json"]
    assert with_planner_kernel(cmd) == [sys.executable, "-m", KERNEL_MODULE, "-f", "/tmp/k.json"]
    assert cmd[2] == "ipykernel_launcher"  # input unchanged
    elsewhere = ["/opt/other-env/bin/python", "-m", "ipykernel_launcher", "-f", "/tmp/k.json"]
    assert with_planner_kernel(elsewhere) == elsewhere  # another environment may not have zeroplanner
    other = ["/opt/julia", "-i", "--", "ipykernel_launcher", "{connection_file}"]
    assert with_planner_kernel(other) == other  # only "-m ipykernel_launcher" is rewritten
    assert BURST < IOPUB_HWM_MESSAGES


@pytest.mark.timeout(300)
def test_planner_kernel_keeps_a_burst_a_stock_kernel_drops():
    stock, stock_cmd = _delivered(KernelManager(kernel_name="python3", transport="ipc"))
    planner, planner_cmd = _delivered(_PlannerKernelManager(kernel_name="python3", transport="ipc"))
    assert "ipykernel_launcher" in stock_cmd and KERNEL_MODULE in planner_cmd
    # measured on this 2-core machine (ipykernel 6.29.5, pyzmq 27.3, libzmq 4.3.5): stock 1994 and 1995 of 5000
    # (two 1000-message queues), the planner's kernel 5000 and 5000
    assert stock < BURST, f"stock kernel delivered {stock}/{BURST}: the default queue no longer drops"
    assert planner == BURST, f"planner kernel delivered {planner}/{BURST}"


def test_server_starts_planner_kernels_with_deep_receive_queues():
    import zmq

    from zeroplanner.server.voila_app import (
        SERVER_KERNEL_MANAGER_CLASS,
        ZeroplannerKernelManager,
        ZeroplannerServerKernelManager,
    )

    km = ZeroplannerKernelManager()
    try:
        assert km.kernel_manager_class == SERVER_KERNEL_MANAGER_CLASS
        assert km.kernel_manager_factory().__class__ is ZeroplannerServerKernelManager
        sock = km.context.socket(zmq.SUB)  # what the websocket handler's IOPub socket gets
        assert sock.rcvhwm == IOPUB_HWM_MESSAGES
        sock.close()
    finally:
        km.context.destroy(linger=0)
