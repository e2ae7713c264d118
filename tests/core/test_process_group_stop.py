"""How the probe and the calibration launcher stop a child that ran out of time (zeroplanner.probe.benchmarks
``stop_process_group``): interrupted first, so the child's ``finally`` blocks run (torch removes a JIT build's lock
file in one: torch/utils/cpp_extension.py ``_jit_compile``), killed when it does not stop or when no time is given
for it. A real interrupted build of DeepSpeed's cpu_adam is in tests/evidence/test_probe.py."""

from __future__ import annotations

import subprocess
import sys
import time

from zeroplanner.probe.benchmarks import _run_bounded, stop_process_group

CHILD = """
import pathlib, signal, sys, time
mark = pathlib.Path(sys.argv[1])
if sys.argv[2] == "ignore":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
print("started", flush=True)
try:
    time.sleep(60)
finally:
    mark.write_text("cleaned up")
"""


def _start(tmp_path, mode: str):
    mark = tmp_path / f"{mode}.txt"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(mark), mode], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "started"  # its finally is armed
    return proc, mark


def test_an_interrupted_child_runs_its_finally(tmp_path):
    proc, mark = _start(tmp_path, "plain")
    t = time.monotonic()
    stop_process_group(proc, interrupt_seconds=10)
    assert proc.returncode is not None and time.monotonic() - t < 5  # stopped at the interrupt, not after 10 s
    assert mark.read_text() == "cleaned up"


def test_a_child_killed_outright_does_not(tmp_path):
    # what the probe did before: SIGKILL at once, the finally never runs (torch's build lock stayed behind)
    proc, mark = _start(tmp_path, "plain")
    stop_process_group(proc, interrupt_seconds=0)
    assert proc.returncode == -9 and not mark.exists()


def test_a_child_that_ignores_the_interrupt_is_killed_after_its_time(tmp_path):
    proc, mark = _start(tmp_path, "ignore")
    t = time.monotonic()
    stop_process_group(proc, interrupt_seconds=1.5)
    assert proc.returncode == -9 and not mark.exists()
    assert 1.4 <= time.monotonic() - t < 10


def test_run_bounded_keeps_to_its_timeout_with_the_interrupt_inside_it(tmp_path):
    # the interrupt comes at timeout - interrupt_seconds, so the whole call stays within the timeout
    mark = tmp_path / "bounded.txt"
    t = time.monotonic()
    code, out, _err, timed_out = _run_bounded([sys.executable, "-c", CHILD, str(mark), "plain"], 3.0,
                                              interrupt_seconds=1.0)
    elapsed = time.monotonic() - t
    assert timed_out and out.startswith("started") and mark.read_text() == "cleaned up"
    assert 2.0 <= elapsed < 4.0, elapsed  # 3 s and the processes' own start and stop
    code, out, _err, timed_out = _run_bounded([sys.executable, "-c", "print('done')"], 30.0, interrupt_seconds=5.0)
    assert (code, out.strip(), timed_out) == (0, "done", False)
