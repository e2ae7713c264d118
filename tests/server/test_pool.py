"""The pre-executed kernel pool of the planner's Voilà server (``zeroplanner app --pool N``): the option and its
bounds, and a pooled kernel handed to a visitor gets the culler's full idle timeout for its page to connect
(zeroplanner.server.voila_app.mark_handed_out), not the time it already sat in the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest

pytest.importorskip("voila")

from zeroplanner.cli import app as cli_app  # noqa: E402
from zeroplanner.server import DEFAULT_POOL_SIZE, MAX_POOL_SIZE, voila_argv, voila_env  # noqa: E402
from zeroplanner.server.voila_app import STATE_REPLY, STATE_REQUEST, mark_handed_out, pool_head  # noqa: E402

from ..browserkit import serve_app  # noqa: E402


def _app_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroplanner")
    cli_app.register(parser.add_subparsers(dest="command"), None)
    return parser


def test_pool_option_sets_voilas_pool_size_within_the_cap(capsys):
    assert f"--VoilaConfiguration.default_pool_size={DEFAULT_POOL_SIZE}" in voila_argv("nb.ipynb")
    argv = voila_argv("nb.ipynb", max_kernels=30, pool_size=20, log_timings=True)
    assert "--VoilaConfiguration.default_pool_size=20" in argv
    assert "--ClosingPageWebsocketConnection.log_timings=True" in argv
    assert "--VoilaConfiguration.default_pool_size=0" in voila_argv("nb.ipynb", pool_size=0)
    with pytest.raises(ValueError, match=r"pool_size=31 must be between 0 and 30.*max_kernels=30"):
        voila_argv("nb.ipynb", max_kernels=30, pool_size=31)
    with pytest.raises(ValueError, match="pool_size=-1"):
        voila_argv("nb.ipynb", pool_size=-1)
    assert _app_parser().parse_args(["app"]).pool == DEFAULT_POOL_SIZE
    assert _app_parser().parse_args(["app", "--pool", "20"]).pool == 20
    for bad in ("-1", str(MAX_POOL_SIZE + 1), "some"):
        with pytest.raises(SystemExit) as exc:
            _app_parser().parse_args(["app", "--pool", bad])
        assert exc.value.code == 2
        assert "--pool" in capsys.readouterr().err
    args = _app_parser().parse_args(["app", "--pool", "9", "--max-kernels", "8"])
    assert cli_app.run_app(args) == 2  # refused before anything starts
    err = capsys.readouterr().err
    assert "--pool 9: must be at most --max-kernels (8)" in err


def test_timing_patterns_match_widget_state_frames():
    """The frames the timings key on, as the page (JSON.stringify: no spaces) and the kernel (jupyter_client's
    json.dumps: ', ' and ': ') write them."""
    assert STATE_REQUEST.search(b'{"content":{"comm_id":"x","target_name":"jupyter.widget.control","data":{}}}')
    assert STATE_REQUEST.search(b'"msg_type":"comm_info_request"')
    assert not STATE_REQUEST.search(b'"target_name":"jupyter.widget"')
    assert STATE_REPLY.search(b'{"data": {"method": "update_states", "states": {}}}')
    assert STATE_REPLY.search(b'{"data": {"method": "update", "state": {}}}')
    assert not STATE_REPLY.search(b'{"data": {"method": "echo_update"}}')


def test_mark_handed_out_sets_last_activity_of_a_finished_pool_task():
    from jupyter_server._tz import utcnow

    class Kernel:
        last_activity = utcnow() - timedelta(hours=1)

    async def scenario():
        loop = asyncio.get_running_loop()
        km = type("KM", (), {})()
        km._kernels = {"k1": Kernel()}
        done = loop.create_future()
        done.set_result({"kernel_id": "k1"})
        km._pools = {"nb.ipynb": [done]}
        assert pool_head(km, "nb.ipynb") is done and pool_head(km, "other.ipynb") is None
        before = utcnow()
        assert mark_handed_out(km, done) == "k1"
        assert km._kernels["k1"].last_activity >= before
        pending = loop.create_future()
        assert mark_handed_out(km, pending) is None  # not started yet: nothing to mark
        failed = loop.create_future()
        failed.set_exception(RuntimeError("kernel died"))
        assert mark_handed_out(km, failed) is None
        gone = loop.create_future()
        gone.set_result({"kernel_id": "k2"})
        assert mark_handed_out(km, gone) is None

    asyncio.run(scenario())


@pytest.mark.timeout(240)
def test_a_pooled_kernel_handed_out_after_sitting_idle_is_not_culled_at_once(tmp_path):
    """A page whose kernel sat in the pool longer than the idle timeout: once handed out it must get the whole idle
    timeout for its websocket to connect. The notebook is silent (``x = 1``: no output when the request comes, unlike
    the planner, whose reaction to the request info also counts as activity), so only the server's own marking
    counts. Without it the culler logged this kernel as idle for longer than it had been out of the pool."""
    notebook = tmp_path / "quiet.ipynb"
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nbformat.write(nb, str(notebook))
    idle_seconds, pool_wait_seconds = 4, 9
    log = tmp_path / "server.log"
    launch = "import sys; from zeroplanner.server.voila_app import ZeroplannerVoila; " \
             "ZeroplannerVoila.launch_instance(argv=sys.argv[1:])"
    with serve_app(command=lambda port: [sys.executable, "-c", launch,
                                         *voila_argv(notebook, port=port, max_kernels=3, pool_size=1,
                                                     cull_idle_seconds=idle_seconds)],
                   env=voila_env(), log_path=log, timeout=90.0) as server:
        deadline = time.monotonic() + 90
        while "Kernel pool of" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.5)
        time.sleep(pool_wait_seconds)  # the pooled kernel sits idle for longer than the idle timeout
        with urllib.request.urlopen(server.url, timeout=60) as response:
            assert response.status == 200
            response.read()
        text = log.read_text(errors="replace")
        handed = re.search(r"Using pre-heated kernel: ([0-9a-f-]{36})", text)
        assert handed, text[-2000:]
        culled = None
        while culled is None and time.monotonic() < deadline + 60:
            culled = re.search(rf"Culling 'idle' kernel 'python3' \({handed.group(1)}\) with 0 connections due to "
                               r"(\d+) seconds", log.read_text(errors="replace"))
            time.sleep(0.5)
        assert culled, log.read_text(errors="replace")[-2000:]
        # idle since it was handed out (the timeout plus at most one cull interval of 1 s and the log's rounding),
        # not since the pool finished executing it (over pool_wait_seconds)
        assert int(culled.group(1)) < pool_wait_seconds - 2, culled.group(0)
        assert int(culled.group(1)) >= idle_seconds
        # a page reconnecting after its kernel was culled (a laptop waking up) gets a 404, and the server logs no
        # traceback (jupyter_server's HTML error page needs a static_path Voila does not set:
        # PlainErrorKernelWebsocketHandler); serve_app asserts the log has no "Traceback"
        deadline = time.monotonic() + 30
        while f"Kernel shutdown: {handed.group(1)}" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as gone:
            urllib.request.urlopen(f"{server.url}api/kernels/{handed.group(1)}/channels?session_id=s1", timeout=30)
        assert gone.value.code == 404
        assert gone.value.read().decode().startswith("404: ")


def test_shutdown_forgets_voilas_request_info_for_the_kernel(tmp_path, monkeypatch):
    """Voila keeps a pre-heated kernel's request info in a class-level dict it never clears
    (voila/request_info_handler.py); the planner's kernel manager drops the entry when the kernel is shut down,
    and only that entry."""
    from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
    from voila.request_info_handler import RequestInfoSocketHandler

    from zeroplanner.server.voila_app import ZeroplannerKernelManager

    async def no_kernel_to_stop(self, kernel_id, *args, **kwargs):
        return None

    monkeypatch.setattr(AsyncMappingKernelManager, "shutdown_kernel", no_kernel_to_stop)
    monkeypatch.setattr(RequestInfoSocketHandler, "_cache", {"k1": '{"QUERY_STRING": "nodes=2"}', "k2": "{}"})
    monkeypatch.setattr(RequestInfoSocketHandler, "_waiters", {"k1": object()})
    km = ZeroplannerKernelManager(root_dir=str(tmp_path))
    asyncio.run(km.shutdown_kernel("k1"))
    assert RequestInfoSocketHandler._cache == {"k2": "{}"} and RequestInfoSocketHandler._waiters == {}
