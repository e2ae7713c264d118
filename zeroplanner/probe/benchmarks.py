"""Micro-benchmarks, each bounded in time: bf16 matmul TFLOP/s, host<->device GB/s, collective bus bandwidth over
local ranks (NCCL on GPUs, gloo on CPU ranks, launched with torchrun) with an alpha-beta fit per collective,
DeepSpeed's CPU-Adam updates/s on this host; and the whole probe (:func:`run_probe`), in this process or in a short-lived child (:func:`probe_in_subprocess`).

Bandwidth units: GB/s = 1e9 bytes/s (nccl-tests and vendors use this). torch is imported inside functions only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from ..files import MAX_RESULT_FILE_BYTES, read_regular_file
from ._worker import busbw_factor

from .hardware import _cuda_status, inventory

GPU_MESSAGE_BYTES = (2**20, 2**22, 2**24, 2**26, 2**28)
"""Default collective sizes on GPUs: 1 MiB .. 256 MiB, the range of DeepSpeed's buckets (5e7 - 5e8 elements)."""
CPU_MESSAGE_BYTES = (2**16, 2**18, 2**20, 2**22, 2**24)
"""Default collective sizes on CPU ranks (gloo): 64 KiB .. 16 MiB, small enough to stay within seconds."""


def _on_cuda_device(device: int, run, *args) -> dict[str, Any]:
    """``run(torch, device, *args)`` with ``device`` current (events and streams on this GPU, not the current one),
    or the "no CUDA device: ..." result without CUDA."""
    torch, reason = _cuda_status()
    if reason is not None:
        return {"ok": False, "message": f"no CUDA device: {reason}"}
    with torch.cuda.device(device):
        return run(torch, device, *args)


def benchmark_matmul(device: int = 0, size: int = 8192, budget_seconds: float = 2.0) -> dict[str, Any]:
    """Dense matmul throughput on one GPU: ``size`` x ``size`` by ``size`` x ``size`` in bf16 (fp16 where the GPU
    has no bf16, compute capability < 8.0), repeated until ``budget_seconds`` is spent (at least 3 timed runs).

    TFLOP/s = 2 * size^3 / seconds / 1e12 (one multiply-add = 2 FLOPs, the convention of vendor peak figures).
    Returns ``{"ok", "message", "device", "dtype", "size", "iterations", "seconds_per_matmul", "tflops"}``;
    without CUDA ``ok`` is False and ``message`` starts "no CUDA device:".
    """
    return _on_cuda_device(device, _matmul, size, budget_seconds)


def _matmul(torch, device: int, size: int, budget_seconds: float) -> dict[str, Any]:
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    dev = torch.device("cuda", device)
    a = torch.randn(size, size, device=dev, dtype=dtype)
    b = torch.randn(size, size, device=dev, dtype=dtype)
    for _ in range(2):  # warm-up: cuBLAS heuristics, clocks
        torch.matmul(a, b)
    torch.cuda.synchronize(dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iterations, elapsed = 0, 0.0
    wall = time.perf_counter()
    while iterations < 3 or time.perf_counter() - wall < budget_seconds:
        batch = max(1, iterations or 1)
        start.record()
        for _ in range(batch):
            torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        elapsed += start.elapsed_time(stop) / 1e3
        iterations += batch
        if time.perf_counter() - wall > 4 * budget_seconds:
            break
    del a, b
    torch.cuda.empty_cache()
    per = elapsed / iterations
    return {
        "ok": True,
        "message": f"{2 * size**3 / per / 1e12:.0f} TFLOP/s ({str(dtype).replace('torch.', '')} matmul)",
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "size": size,
        "iterations": iterations,
        "seconds_per_matmul": per,
        "tflops": 2 * size**3 / per / 1e12,
    }


def benchmark_host_transfer(device: int = 0, size_bytes: int = 256 * 2**20, iterations: int = 5) -> dict[str, Any]:
    """Host<->device copy bandwidth on one GPU, GB/s (1e9 bytes/s): host-to-device from pinned and from pageable
    memory, device-to-host into pinned memory; ``iterations`` copies of ``size_bytes`` each, timed with CUDA events
    after one warm-up copy. Returns ``{"ok", "message", "device", "size_bytes", "h2d_pinned_gb_per_s",
    "h2d_pageable_gb_per_s", "d2h_pinned_gb_per_s"}``; without CUDA ``ok`` is False ("no CUDA device: ...")."""
    return _on_cuda_device(device, _host_transfer, size_bytes, iterations)


def _host_transfer(torch, device: int, size_bytes: int, iterations: int) -> dict[str, Any]:
    dev = torch.device("cuda", device)
    gpu_buf = torch.empty(size_bytes, dtype=torch.uint8, device=dev)
    pinned = torch.empty(size_bytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(size_bytes, dtype=torch.uint8)
    pageable.fill_(1)  # touch the pages so the first copy does not time page faults
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def rate(copy) -> float:
        copy()
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(iterations):
            copy()
        stop.record()
        stop.synchronize()
        return size_bytes * iterations / (start.elapsed_time(stop) / 1e3) / 1e9

    out = {
        "ok": True,
        "device": device,
        "size_bytes": size_bytes,
        "h2d_pinned_gb_per_s": rate(lambda: gpu_buf.copy_(pinned, non_blocking=True)),
        "h2d_pageable_gb_per_s": rate(lambda: gpu_buf.copy_(pageable)),
        "d2h_pinned_gb_per_s": rate(lambda: pinned.copy_(gpu_buf, non_blocking=True)),
    }
    out["message"] = (f"host->device {out['h2d_pinned_gb_per_s']:.1f} GB/s pinned, "
                      f"{out['h2d_pageable_gb_per_s']:.1f} GB/s pageable")
    del gpu_buf, pinned, pageable
    torch.cuda.empty_cache()
    return out


def fit_alpha_beta(records: Sequence[dict]) -> dict[str, dict[str, Any]]:
    """Fit ``t(m) = alpha + m / beta`` per collective to timed records (``collective``, ``ranks``, ``bytes`` m,
    ``seconds`` t), the latency-bandwidth ("alpha-beta", Hockney) model the planner's communication terms use.

    Least squares on relative error, i.e. minimising sum(((alpha + m/beta) - t) / t)^2, so the small-message
    (latency) and large-message (bandwidth) ends weigh alike; alpha is constrained to >= 0 (a negative intercept is
    refitted with alpha = 0). Needs at least two distinct sizes.

    Returns {collective: {"ranks", "points", "alpha_seconds", "beta_bytes_per_second" (asymptotic algbw, bytes/s),
    "algbw_gb_per_s", "busbw_gb_per_s" (asymptotic, nccl-tests factor applied), "max_relative_error",
    "ok", "message"}}. ``ok`` is False (and the bandwidths None) when the times do not grow with the size -- noise
    larger than the transfer time -- so the bandwidth cannot be identified.
    """
    import numpy as np

    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["collective"], []).append(r)
    fits: dict[str, dict[str, Any]] = {}
    for collective, rows in groups.items():
        ranks = int(rows[0]["ranks"])
        m = np.array([float(r["bytes"]) for r in rows])
        t = np.array([float(r["seconds"]) for r in rows])
        fit: dict[str, Any] = {"ranks": ranks, "points": len(rows), "alpha_seconds": None,
                               "beta_bytes_per_second": None, "algbw_gb_per_s": None, "busbw_gb_per_s": None,
                               "max_relative_error": None}
        if len(set(m.tolist())) < 2 or np.any(t <= 0):
            fit.update(ok=False, message="need at least two message sizes with positive times")
            fits[collective] = fit
            continue
        design = np.column_stack([1.0 / t, m / t])
        (alpha, slope), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
        if alpha < 0:
            alpha = 0.0
            slope = float(np.sum(m / t) / np.sum((m / t) ** 2))
        if not slope > 0:
            fit.update(ok=False, message="times do not grow with message size; bandwidth not identifiable")
            fits[collective] = fit
            continue
        beta = 1.0 / slope
        predicted = alpha + m * slope
        fit.update(
            ok=True,
            message="",
            alpha_seconds=float(alpha),
            beta_bytes_per_second=float(beta),
            algbw_gb_per_s=float(beta / 1e9),
            busbw_gb_per_s=float(beta / 1e9 * busbw_factor(collective, ranks)),
            max_relative_error=float(np.max(np.abs(predicted - t) / t)),
        )
        fits[collective] = fit
    return fits


def fit_rows(collectives: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(level, collective, fit)`` for every fit of a :func:`benchmark_collectives` result (or a distributed
    report's ``benchmarks.collectives``), in their order: the rows the probe reports print."""
    return [(level, name, fit) for level, fits in (collectives.get("fits") or {}).items() for name, fit in fits.items()]


def benchmark_collectives(
    ranks: int | None = None,
    backend: str = "auto",
    message_bytes: Sequence[int] | None = None,
    iterations: int | None = None,
    warmup: int = 1,
    budget_seconds: float = 30.0,
    timeout_seconds: float = 120.0,
    ranks_per_node: int = 0,
) -> dict[str, Any]:
    """Bus bandwidth of all-reduce, all-gather and reduce-scatter across ``ranks`` local processes, one per GPU
    with NCCL, or CPU processes with gloo (``backend="auto"``: NCCL when CUDA is available).

    Launches ``python -m torch.distributed.run --standalone --nproc-per-node ranks -m zeroplanner.probe._worker``
    in its own process group, killed after ``timeout_seconds``; the worker itself stops sweeping sizes once
    ``budget_seconds`` is spent. ``ranks`` defaults to the GPU count with CUDA and 2 without. ``ranks_per_node``
    (testing only) splits the local ranks into pretend nodes to exercise the inter-node path.

    Returns the worker's JSON (``backend``, ``world_size``, ``nodes``, ``world``: records, ``intra_node`` where
    nodes > 1; see :mod:`zeroplanner.probe._worker`) plus ``ok``, ``message`` and ``fits``
    ({"world": :func:`fit_alpha_beta`, "intra_node": ...}). A failure (timeout, crash, fewer than 2 ranks) gives
    ``ok`` False and the reason in ``message``, not an exception. Raises ``ValueError`` for arguments out of range.
    """
    torch, reason = _cuda_status()
    if backend not in ("auto", "nccl", "gloo"):
        raise ValueError(f"backend={backend!r}; allowed: auto, nccl, gloo")
    if torch is None:
        return {"ok": False, "message": reason}
    cuda = reason is None
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        return {"ok": False, "message": f"no CUDA device: {reason}"}
    if ranks is None:
        ranks = torch.cuda.device_count() if backend == "nccl" else 2
    if not (1 <= ranks <= 64):
        raise ValueError(f"ranks={ranks} must be between 1 and 64 (local ranks: one node)")
    if ranks < 2:
        return {"ok": False, "message": f"{ranks} rank: collectives need at least 2 ranks (one GPU on this machine)"}
    if backend == "nccl" and ranks > torch.cuda.device_count():
        raise ValueError(f"--ranks: {ranks} exceeds the {torch.cuda.device_count()} visible GPUs")
    sizes = sorted(set(message_bytes or (GPU_MESSAGE_BYTES if backend == "nccl" else CPU_MESSAGE_BYTES)))
    iterations = iterations or (20 if backend == "nccl" else 5)
    with tempfile.TemporaryDirectory(prefix="zeroplanner-probe-") as tmp:
        out_path = os.path.join(tmp, "collectives.json")
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
            "-m", "zeroplanner.probe._worker", "--out", out_path, "--backend", backend,
            "--message-bytes", ",".join(str(int(s)) for s in sizes), "--iterations", str(int(iterations)),
            "--warmup", str(int(warmup)), "--budget-seconds", str(float(budget_seconds)),
            "--ranks-per-node", str(int(ranks_per_node)),
        ]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        code, _stdout, stderr, timed_out = _run_bounded(cmd, timeout_seconds, env)
        if timed_out:
            return {"ok": False, "message": f"collective benchmark timed out after {timeout_seconds:g} s"}
        if code != 0 or not os.path.exists(out_path):
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            return {"ok": False, "message": f"collective benchmark failed (exit {code}): {tail[-500:]}"}
        # the worker's own file, still read only as a regular file of at most MAX_RESULT_FILE_BYTES (16 MiB)
        result = json.loads(read_regular_file(out_path, MAX_RESULT_FILE_BYTES, "collective benchmark result"))
    result["ok"] = True
    result["fits"] = {"world": fit_alpha_beta(result["world"])}
    if "intra_node" in result:
        result["fits"]["intra_node"] = fit_alpha_beta(result["intra_node"])
    ar = result["fits"]["world"].get("all_reduce", {})
    bw = f"{ar['busbw_gb_per_s']:.2f} GB/s" if ar.get("ok") else "not identifiable"
    result["message"] = f"{backend} over {result['world_size']} ranks: all-reduce busbw {bw}"
    return result


def _run_bounded(cmd: list[str], timeout_seconds: float, env: dict | None = None,
                 interrupt_seconds: float = 0.0) -> tuple[int, str, str, bool]:
    """Run ``cmd`` (a fixed argument list, no shell) in a new session; on timeout stop that session's process
    group (the command and the ranks it started, nothing else: :func:`stop_process_group`, interrupted for the
    last ``interrupt_seconds`` of ``timeout_seconds``, then killed). Returns (exit code, stdout, stderr,
    timed_out)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    interrupt_seconds = min(max(0.0, interrupt_seconds), timeout_seconds)
    try:
        out, err = proc.communicate(timeout=timeout_seconds - interrupt_seconds)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        pass
    out, err = stop_process_group(proc, interrupt_seconds)
    return proc.returncode if proc.returncode is not None else -9, out, err, True


def interrupt_seconds_for(timeout_seconds: float) -> float:
    """How much of ``timeout_seconds`` a child that may be in a JIT build of DeepSpeed's op gets to stop in after
    SIGINT (:func:`stop_process_group`): the last quarter, at most 5 s (an interrupted build removed its lock in
    1 s on the 2-core build machine)."""
    return min(5.0, timeout_seconds / 4)


def stop_process_group(proc: subprocess.Popen, interrupt_seconds: float = 0.0) -> tuple[Any, Any]:
    """Stop ``proc``'s process group (``proc`` started with ``start_new_session=True``) and return what
    ``proc.communicate()`` then gives (None, None for output not piped). ``interrupt_seconds`` > 0: SIGINT first
    (Python raises KeyboardInterrupt, so ``finally`` blocks run) and SIGKILL only if the group's leader still runs
    after that many seconds; else SIGKILL at once. torch's JIT build of an extension (DeepSpeed's cpu_adam, built on
    first use) holds a lock file that only such a ``finally`` removes (``FileBaton`` in
    torch/utils/cpp_extension.py ``_jit_compile``): a build killed outright leaves it, and every later load of that
    op, a training run's included, waits on it for ever."""
    if interrupt_seconds > 0:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            return proc.communicate(timeout=interrupt_seconds)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.communicate()


def _extension_locks(name: str, env: dict) -> list[str]:
    """Lock files torch's JIT build of extension ``name`` has left: ``lock`` in its build directory under
    ``TORCH_EXTENSIONS_DIR`` (``<dir>/<name>``) or under the default root ``~/.cache/torch_extensions``
    (``<root>/py<version>_<cpu or cuXYZ>/<name>``; torch/utils/cpp_extension.py ``_get_build_directory``). Found
    without importing torch."""
    root = env.get("TORCH_EXTENSIONS_DIR")
    if root:
        candidates = [os.path.join(root, name, "lock")]
    else:
        base = os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "torch_extensions")
        try:
            candidates = [os.path.join(base, sub, name, "lock") for sub in sorted(os.listdir(base))]
        except OSError:
            candidates = []
    return [path for path in candidates if os.path.isfile(path)]


CPU_ADAM_CHILD = r"""
import json, os, sys, time
params, repeats, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
import torch
torch.set_num_threads(threads)
import deepspeed
from deepspeed.ops.adam import DeepSpeedCPUAdam
p = torch.nn.Parameter(torch.randn(params))
p.grad = torch.randn(params)
opt = DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True)
opt.step()
times = []
for _ in range(repeats):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
print(json.dumps({"times": times, "deepspeed": deepspeed.__version__, "torch_threads": torch.get_num_threads()}))
"""


def benchmark_cpu_adam(params: int = 20_000_000, repeats: int = 5, threads: int | None = None,
                       timeout_seconds: float = 120.0) -> dict[str, Any]:
    """DeepSpeed's CPU-Adam (``deepspeed.ops.adam.DeepSpeedCPUAdam``, the op ZeRO-Offload's optimizer step runs on
    the host) on this machine: one fp32 tensor of ``params`` elements with a gradient, AdamW mode, ``threads``
    OpenMP/torch threads (default: every core, ``os.cpu_count()``), the fastest of ``repeats`` steps after a first
    one (op load, state init; the fastest, as ``timeit`` advises, because other processes on the cores only ever
    slow a step down: on this 2-core build machine under load the median of 5 varied 2x between runs), in a child
    process bounded by ``timeout_seconds`` (DeepSpeed JIT-builds the op
    on first use, which can take minutes on a fresh machine).

    Returns ``ok``, ``message`` and, when it ran, ``params_per_second`` = params / fastest step (parameter updates
    per second), ``params``, ``threads``, ``cpu_count``, ``best_seconds``, ``median_seconds``,
    ``load_average_1min`` and ``deepspeed``.
    With every core the figure is the node's rate: DeepSpeed runs one CPU-Adam per rank on its partition with the
    rank's share of the cores, so the ranks together are bounded by the same cores and memory bandwidth (an
    assumption: the per-rank split is not measured). A missing deepspeed, a failed build or the timeout gives
    ``ok`` False and the reason, never an exception. Raises ``ValueError`` for arguments out of range.
    """
    if not (1 <= params <= 10**10) or not (1 <= repeats <= 1000):
        raise ValueError(f"params={params} (1..1e10) and repeats={repeats} (1..1000)")
    threads = threads or os.cpu_count() or 1
    if threads < 1:
        raise ValueError(f"threads={threads} must be >= 1")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-c", CPU_ADAM_CHILD, str(int(params)), str(int(repeats)), str(int(threads))]
    # interrupted, not killed, at the end of its time: a JIT build of the op removes its lock file
    code, out, err, timed_out = _run_bounded(cmd, timeout_seconds, env,
                                             interrupt_seconds=interrupt_seconds_for(timeout_seconds))
    if timed_out:
        locks = _extension_locks("cpu_adam", env)
        left = (f"; {locks[0]} is left from a build that did not finish, and torch waits on it for ever: if no "
                "other process is building DeepSpeed's ops, delete it" if locks else "")
        return {"ok": False, "message": f"CPU-Adam benchmark timed out after {timeout_seconds:g} s (DeepSpeed "
                f"builds its cpu_adam op on first use, minutes on a small machine: run it once more{left})"}
    try:
        child = json.loads(out.strip().splitlines()[-1])
        times = sorted(float(t) for t in child["times"])
    except (ValueError, IndexError, KeyError, TypeError):
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"ok": False, "message": f"CPU-Adam benchmark failed (exit {code}): {tail[-500:] or 'no output'}"}
    rate = params / times[0]
    return {"ok": True, "params": int(params), "threads": int(child["torch_threads"]), "cpu_count": os.cpu_count(),
            "best_seconds": times[0], "median_seconds": times[len(times) // 2], "params_per_second": rate, "load_average_1min": os.getloadavg()[0],
            "deepspeed": child["deepspeed"],
            "message": f"DeepSpeedCPUAdam: {rate:.3g} parameter updates/s with {child['torch_threads']} thread"
                       + ("" if int(child["torch_threads"]) == 1 else "s")}


def run_probe(
    benchmarks: bool = False,
    nvme_path: str | os.PathLike = ".",
    ranks: int | None = None,
    message_bytes: Sequence[int] | None = None,
    iterations: int | None = None,
    budget_seconds: float = 30.0,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """:func:`inventory`, plus with ``benchmarks`` a ``benchmarks`` dict: ``matmul`` (one entry per GPU),
    ``host_transfer`` (GPU 0), ``collectives`` (:func:`benchmark_collectives`) and ``cpu_adam``
    (:func:`benchmark_cpu_adam`, with what is left of ``timeout_seconds``; skipped under 5 s). Without CUDA the GPU
    benchmarks report "no CUDA device: ..." and the collectives run on CPU ranks with gloo. Runs in this process
    (creates CUDA contexts); see :func:`probe_in_subprocess`.

    ``timeout_seconds`` bounds the whole call: the collective launch gets what is left (less 5 s for the
    torchrun teardown) and is skipped, saying so, when under 10 s are left. Without it the launch is bounded by
    max(60, 4 x ``budget_seconds``) seconds."""
    start = time.monotonic()
    result = inventory(nvme_path)
    if not benchmarks:
        return result
    bench: dict[str, Any] = {}
    if result["cuda_available"]:
        per_gpu = max(0.5, min(2.0, budget_seconds / 10))
        bench["matmul"] = [benchmark_matmul(g["index"], budget_seconds=per_gpu) for g in result["gpus"]]
        bench["host_transfer"] = benchmark_host_transfer(0)
    else:
        bench["matmul"] = [benchmark_matmul()]
        bench["host_transfer"] = benchmark_host_transfer()

    def left(reserve_seconds: float) -> float:  # max(60, 4 x budget) s, or what is left of the bound less a reserve
        cap = max(60.0, 4 * budget_seconds)
        return cap if timeout_seconds is None else min(cap, timeout_seconds - (time.monotonic() - start)
                                                       - reserve_seconds)

    def skipped(what: str, minimum: float) -> dict[str, Any]:
        return {"ok": False, "message": f"{what} skipped: under {minimum:g} s of the {timeout_seconds:g} s timeout left"}

    launch_timeout = left(5.0)  # the torchrun teardown
    bench["collectives"] = skipped("collective benchmark", 10.0) if launch_timeout < 10.0 else benchmark_collectives(
        ranks=ranks, message_bytes=message_bytes, iterations=iterations,
        budget_seconds=min(budget_seconds, launch_timeout / 2), timeout_seconds=launch_timeout)
    adam_timeout = left(1.0)
    bench["cpu_adam"] = skipped("CPU-Adam benchmark", 5.0) if adam_timeout < 5.0 else benchmark_cpu_adam(
        timeout_seconds=adam_timeout)
    result["benchmarks"] = bench
    return result


def probe_in_subprocess(timeout_seconds: float = 60, benchmarks: bool = False,
                        nvme_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """:func:`run_probe` in a short-lived child process (``python -m zeroplanner.probe --json``), so no CUDA
    context stays in the calling process (the Voila kernel). Returns the child's JSON dict; ``cuda_available`` and
    ``message`` are always present. A timeout, crash or unreadable output gives ``{"cuda_available": False,
    "message": "probe failed: ..."}`` (or "probe timed out ..."), never an exception."""
    cmd = [sys.executable, "-m", "zeroplanner.probe", "--json"]
    if benchmarks:
        # the child bounds its own torchrun launch (which runs in its own session) inside our timeout
        cmd += ["--benchmarks", "--budget-seconds", str(min(600.0, max(1.0, 0.4 * float(timeout_seconds)))),
                "--timeout-seconds", str(max(1.0, float(timeout_seconds) - 3.0))]
    if nvme_path is not None:
        cmd += ["--nvme-path", os.fspath(nvme_path)]
    try:
        code, out, err, timed_out = _run_bounded(cmd, float(timeout_seconds))
    except OSError as exc:
        return {"cuda_available": False, "message": f"probe failed: could not start {sys.executable}: {exc}"}
    if timed_out:
        return {"cuda_available": False, "message": f"probe timed out after {float(timeout_seconds):g} s"}
    try:
        result = json.loads(out)
        if not isinstance(result, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        tail = " | ".join(err.strip().splitlines()[-3:])
        return {"cuda_available": False, "message": f"probe failed (exit {code}): {tail[-500:] or 'no output'}"}
    result.setdefault("cuda_available", False)
    result.setdefault("message", "probe returned no message")
    return result


