"""Probe the machine this runs on: what its GPUs, host RAM and disk really are, and what they really do.

Three layers, each usable alone:

- :func:`inventory` -- CUDA availability, GPUs (name, total and free memory from ``torch.cuda.mem_get_info``,
  compute capability, catalog match), peer access and NVLink between local GPUs, host RAM (``/proc/meminfo``) and
  free disk for NVMe offload (``shutil.disk_usage``). Without CUDA it returns ``{"cuda_available": False,
  "message": "no CUDA device: ...", ...}``; it never raises because a GPU is missing.
- micro-benchmarks, each bounded in time: :func:`benchmark_matmul` (bf16 TFLOP/s), :func:`benchmark_host_transfer`
  (host<->device GB/s, pinned and pageable) and :func:`benchmark_collectives` (all-reduce / all-gather /
  reduce-scatter bus bandwidth over local ranks, NCCL on GPUs and gloo on CPU ranks, launched with torchrun), with a
  least-squares alpha-beta fit per collective (:func:`fit_alpha_beta`).
- :func:`cluster_from_probe` turns a probe result (or its JSON file, :func:`load_probe`) into the planner's
  :class:`~zeroplanner.specs.ClusterSpec`; :func:`fit_efficiency` fits MFU to a measured step time.

torch is imported inside functions only: ``import zeroplanner.probe`` works without torch. Calling
:func:`inventory` or a benchmark creates a CUDA context in the calling process; a long-lived process (the Voila
kernel) should call :func:`probe_in_subprocess`, which runs ``python -m zeroplanner.probe --json`` in a short-lived
child and returns its JSON.

Bandwidth units: GB/s = 1e9 bytes/s (nccl-tests and vendors use this); memory in bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from ._probe_worker import COLLECTIVES, busbw_factor

__all__ = [
    "COLLECTIVES",
    "busbw_factor",
    "host_inventory",
    "match_catalog",
    "parse_nvlink_status",
    "inventory",
    "benchmark_matmul",
    "benchmark_host_transfer",
    "benchmark_collectives",
    "fit_alpha_beta",
    "run_probe",
    "probe_in_subprocess",
    "load_probe",
    "cluster_changes",
    "cluster_from_probe",
    "fit_efficiency",
    "fit_from_calibration",
]

PROBE_FORMAT = "zeroplanner-probe/1"
"""Value of the ``format`` key of a probe result; :func:`load_probe` checks it."""

MAX_PROBE_FILE_BYTES = 10 * 2**20
"""A probe JSON file larger than this is refused (a real one is a few KiB)."""

GPU_MESSAGE_BYTES = (2**20, 2**22, 2**24, 2**26, 2**28)
"""Default collective sizes on GPUs: 1 MiB .. 256 MiB, the range of DeepSpeed's buckets (5e7 - 5e8 elements)."""
CPU_MESSAGE_BYTES = (2**16, 2**18, 2**20, 2**22, 2**24)
"""Default collective sizes on CPU ranks (gloo): 64 KiB .. 16 MiB, small enough to stay within seconds."""


# ----------------------------------------------------------------------------------------------------------------
# Inventory
# ----------------------------------------------------------------------------------------------------------------
def _meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes ({"MemTotal": ..., "MemAvailable": ...}); {} where the file does not exist."""
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
                    out[key.strip()] = int(parts[0]) * scale
    except OSError:
        return {}
    return out


def host_inventory(nvme_path: str | os.PathLike = ".") -> dict[str, Any]:
    """Host RAM, CPU count and free disk of this machine.

    Returns ``{"ram_total_bytes", "ram_available_bytes", "ram_source", "cpu_count", "disk_path",
    "disk_total_bytes", "disk_free_bytes"}``. RAM comes from ``/proc/meminfo`` (MemTotal, MemAvailable), or
    ``os.sysconf`` pages where that file does not exist. The disk is the file system holding ``nvme_path`` (where an
    NVMe offload would write). Raises ``FileNotFoundError`` naming ``nvme_path`` when it does not exist.
    """
    info = _meminfo()
    if "MemTotal" in info:
        total = info["MemTotal"]
        available = info.get("MemAvailable", info.get("MemFree", total))
        source = "/proc/meminfo"
    else:  # pragma: no cover - non-Linux
        page = os.sysconf("SC_PAGE_SIZE")
        total = page * os.sysconf("SC_PHYS_PAGES")
        available = page * os.sysconf("SC_AVPHYS_PAGES")
        source = "os.sysconf"
    path = os.path.abspath(os.fspath(nvme_path))
    if not os.path.exists(path):
        raise FileNotFoundError(f"nvme_path={path!r} does not exist")
    disk = shutil.disk_usage(path)
    return {
        "ram_total_bytes": int(total),
        "ram_available_bytes": int(available),
        "ram_source": source,
        "cpu_count": os.cpu_count() or 1,
        "disk_path": path,
        "disk_total_bytes": int(disk.total),
        "disk_free_bytes": int(disk.free),
    }


_TOKEN = re.compile(r"[a-z0-9]+")
_MEMORY_TOKEN = re.compile(r"^\d+gb$")


def match_catalog(name: str, memory_bytes: int, catalog: Sequence[tuple[str, int]] | None = None) -> dict | None:
    """The catalog GPU a device name (``torch.cuda.get_device_properties(i).name``) and its memory denote.

    ``catalog`` is a list of (catalog name, memory_bytes); by default :func:`zeroplanner.catalog.gpu_names` with
    each entry's ``memory_bytes``. A catalog entry is a candidate when every token of its name that holds a digit,
    other than a memory size like ``80GB`` (the model number: ``A100``, ``4090``, ``MI300X``, ``L40S``), is a whole
    token of the device name, so ``A10`` never matches an ``A100``. Among candidates the one whose memory is nearest
    the measured memory wins (ties: more name tokens in common). Returns ``{"name", "memory_matches"}`` --
    ``memory_matches`` is False when the nearest entry's memory differs by more than 15% (e.g. an A100-40GB where
    the catalog has only the 80 GB model: the compute figures still apply, the measured memory is used) -- or None
    when no entry's model number is in the name.
    """
    if catalog is None:
        from . import catalog as cat

        catalog = [(n, cat.gpu(n).memory_bytes) for n in cat.gpu_names()]
    device_tokens = set(_TOKEN.findall(name.lower()))
    best: tuple | None = None
    for entry_name, entry_bytes in catalog:
        tokens = _TOKEN.findall(entry_name.lower())
        required = [t for t in tokens if any(c.isdigit() for c in t) and not _MEMORY_TOKEN.match(t)]
        if not required or not all(t in device_tokens for t in required):
            continue
        distance = abs(math.log(max(memory_bytes, 1) / max(entry_bytes, 1)))
        shared = sum(t in device_tokens for t in tokens)
        key = (distance, -shared)
        if best is None or key < best[0]:
            best = (key, entry_name, distance)
    if best is None:
        return None
    return {"name": best[1], "memory_matches": best[2] <= math.log(1.15)}


_NVLINK_LINE = re.compile(r"^\s*Link\s+\d+:\s*([\d.]+)\s*GB/s", re.IGNORECASE)
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*?(?:\(UUID:\s*([^)\s]+)\s*\))?\s*$")


def _uuid_key(uuid: Any) -> str:
    """A GPU UUID as one comparable key: NVML writes "GPU-58c5...", torch's ``props.uuid`` prints "58c5..."."""
    text = str(uuid or "").strip().lower()
    return text[4:] if text.startswith("gpu-") else text


def parse_nvlink_status(text: str) -> dict[int, dict[str, Any]]:
    """Parse ``nvidia-smi nvlink --status``: {nvidia-smi GPU index: {"uuid" (key form, "" if not printed),
    "active_links", "gb_per_s"}} (GB/s summed over active links, as nvidia-smi prints per link; links printed
    ``<inactive>`` or ``0 GB/s`` are not counted). nvidia-smi indices are NVML's, which need not be CUDA's: map by
    UUID."""
    out: dict[int, dict[str, Any]] = {}
    current: int | None = None
    for line in text.splitlines():
        m = _GPU_LINE.match(line)
        if m:
            current = int(m.group(1))
            out[current] = {"uuid": _uuid_key(m.group(2)), "active_links": 0, "gb_per_s": 0.0}
            continue
        m = _NVLINK_LINE.match(line)
        if m and current is not None and float(m.group(1)) > 0:  # "0 GB/s" is a down link
            out[current]["active_links"] += 1
            out[current]["gb_per_s"] += float(m.group(1))
    return out


def _nvml_handles(pynvml, uuids: Sequence[str]) -> list:
    """NVML handles for CUDA devices given by UUID key (NVML and CUDA number GPUs differently); None where the
    UUID is unknown."""
    handles = []
    for uuid in uuids:
        try:
            handles.append(pynvml.nvmlDeviceGetHandleByUUID("GPU-" + uuid) if uuid else None)
        except Exception:  # noqa: BLE001 - NVMLError, or a MIG/odd UUID
            handles.append(None)
    return handles


def _nvlink(uuids: Sequence[str]) -> dict[str, Any]:
    """Active NVLink links per CUDA GPU (matched by UUID), from NVML (``pynvml``) if importable, else
    ``nvidia-smi nvlink --status`` (fixed arguments, 10 s timeout). Unknown where neither works."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            per_gpu: list[int | None] = []
            for handle in _nvml_handles(pynvml, uuids):
                if handle is None:
                    per_gpu.append(None)
                    continue
                active = 0
                for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                    try:
                        active += int(pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED)
                    except pynvml.NVMLError:
                        break
                per_gpu.append(active)
            known = [a for a in per_gpu if a is not None]
            return {"source": "nvml", "active_links_per_gpu": per_gpu,
                    "detected": any(known) if known else None}
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - pynvml absent or NVML unusable: try nvidia-smi
        pass
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            text = subprocess.run([exe, "nvlink", "--status"], capture_output=True, text=True, timeout=10,
                                  check=False).stdout
        except (OSError, subprocess.SubprocessError):
            text = ""
        by_uuid = {v["uuid"]: v for v in parse_nvlink_status(text).values() if v["uuid"]}
        rows = [by_uuid.get(u) for u in uuids]
        if any(r is not None for r in rows):
            return {"source": "nvidia-smi nvlink --status",
                    "active_links_per_gpu": [r["active_links"] if r else None for r in rows],
                    "gb_per_s_per_gpu": [r["gb_per_s"] if r else None for r in rows],
                    "detected": any(r["active_links"] for r in rows if r)}
    return {"source": None, "active_links_per_gpu": None, "detected": None}


def _other_processes_bytes(uuids: Sequence[str]) -> list[int | None]:
    """GPU memory held by processes other than this one, per CUDA GPU (matched by UUID), from NVML; None where
    NVML (``pynvml``) is unavailable or the GPU is not found."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            out: list[int | None] = []
            for handle in _nvml_handles(pynvml, uuids):
                if handle is None:
                    out.append(None)
                    continue
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                out.append(sum(int(p.usedGpuMemory or 0) for p in procs if p.pid != os.getpid()))
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        return [None] * len(uuids)


def _no_cuda(reason: str) -> dict[str, Any]:
    return {"cuda_available": False, "message": f"no CUDA device: {reason}", "gpu_count": 0, "gpus": []}


def _cuda_status() -> tuple[Any, str | None]:
    """(torch module or None, reason there is no usable CUDA device or None)."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed (pip install 'zeroplanner[torch]')"
    try:
        if not torch.cuda.is_available():
            build = torch.version.cuda
            why = "torch was built without CUDA" if build is None else "no GPU visible to CUDA"
            return torch, f"torch.cuda.is_available() is False ({why}; torch {torch.__version__})"
        if torch.cuda.device_count() < 1:
            return torch, "torch.cuda.device_count() is 0"
    except Exception as exc:  # noqa: BLE001 - a broken driver must give a result, not a traceback
        return torch, f"CUDA initialisation failed: {type(exc).__name__}: {exc}"
    return torch, None


def inventory(nvme_path: str | os.PathLike = ".") -> dict[str, Any]:
    """What this machine has. Creates a CUDA context on each GPU (use :func:`probe_in_subprocess` from long-lived
    processes).

    Returns a dict with ``format``, ``cuda_available`` (bool), ``message`` (one line for people), ``gpu_count``,
    ``gpus`` (per GPU: ``index`` (CUDA's), ``uuid``, ``name``, ``total_memory_bytes`` (``get_device_properties``),
    ``free_memory_bytes`` (``torch.cuda.mem_get_info``, after this process's own CUDA context),
    ``other_processes_bytes`` (NVML, or None), ``compute_capability`` "major.minor", ``multi_processor_count``,
    ``catalog`` (:func:`match_catalog` result or None)), ``peer_access`` (n x n booleans,
    ``torch.cuda.can_device_access_peer``; the diagonal is True), ``nvlink`` (see :func:`_nvlink`), ``host``
    (:func:`host_inventory`), ``torch_version``, ``cuda_version``. Without CUDA: ``cuda_available`` False, a message
    starting "no CUDA device:", ``gpus`` empty -- never an exception for a missing GPU or torch.
    """
    result: dict[str, Any] = {"format": PROBE_FORMAT, "host": host_inventory(nvme_path), "torch_version": None,
                              "cuda_version": None}
    torch, reason = _cuda_status()
    if torch is not None:
        result["torch_version"] = torch.__version__
        result["cuda_version"] = torch.version.cuda
    if reason is not None:
        result.update(_no_cuda(reason))
        result["peer_access"] = []
        result["nvlink"] = {"source": None, "active_links_per_gpu": None, "detected": None}
        return result
    count = torch.cuda.device_count()
    props_all = [torch.cuda.get_device_properties(i) for i in range(count)]
    uuids = [_uuid_key(getattr(p, "uuid", "")) for p in props_all]
    others = _other_processes_bytes(uuids)
    gpus = []
    for i, props in enumerate(props_all):
        free, _total = torch.cuda.mem_get_info(i)
        gpus.append(
            {
                "index": i,
                "uuid": uuids[i],
                "name": props.name,
                "total_memory_bytes": int(props.total_memory),
                "free_memory_bytes": int(free),
                "other_processes_bytes": others[i],
                "compute_capability": f"{props.major}.{props.minor}",
                "multi_processor_count": int(props.multi_processor_count),
                "catalog": match_catalog(props.name, int(props.total_memory)),
            }
        )
    peer = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count)] for i in range(count)]
    names = sorted({g["name"] for g in gpus})
    result.update(
        {
            "cuda_available": True,
            "message": f"{count} x {', '.join(names)}; "
            f"{min(g['free_memory_bytes'] for g in gpus) / 2**30:.1f} GiB free on the fullest GPU",
            "gpu_count": count,
            "gpus": gpus,
            "peer_access": peer,
            "nvlink": _nvlink(uuids),
        }
    )
    return result


# ----------------------------------------------------------------------------------------------------------------
# Micro-benchmarks (CUDA)
# ----------------------------------------------------------------------------------------------------------------
def benchmark_matmul(device: int = 0, size: int = 8192, budget_seconds: float = 2.0) -> dict[str, Any]:
    """Dense matmul throughput on one GPU: ``size`` x ``size`` by ``size`` x ``size`` in bf16 (fp16 where the GPU
    has no bf16, compute capability < 8.0), repeated until ``budget_seconds`` is spent (at least 3 timed runs).

    TFLOP/s = 2 * size^3 / seconds / 1e12 (one multiply-add = 2 FLOPs, the convention of vendor peak figures).
    Returns ``{"ok", "message", "device", "dtype", "size", "iterations", "seconds_per_matmul", "tflops"}``;
    without CUDA ``ok`` is False and ``message`` starts "no CUDA device:".
    """
    torch, reason = _cuda_status()
    if reason is not None:
        return {"ok": False, "message": f"no CUDA device: {reason}"}
    with torch.cuda.device(device):  # events and streams on this GPU, not the current one
        return _matmul(torch, device, size, budget_seconds)


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
    torch, reason = _cuda_status()
    if reason is not None:
        return {"ok": False, "message": f"no CUDA device: {reason}"}
    with torch.cuda.device(device):  # events and streams on this GPU, not the current one
        return _host_transfer(torch, device, size_bytes, iterations)


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


# ----------------------------------------------------------------------------------------------------------------
# Collectives
# ----------------------------------------------------------------------------------------------------------------
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

    Launches ``python -m torch.distributed.run --standalone --nproc-per-node ranks -m zeroplanner._probe_worker``
    in its own process group, killed after ``timeout_seconds``; the worker itself stops sweeping sizes once
    ``budget_seconds`` is spent. ``ranks`` defaults to the GPU count with CUDA and 2 without. ``ranks_per_node``
    (testing only) splits the local ranks into pretend nodes to exercise the inter-node path.

    Returns the worker's JSON (``backend``, ``world_size``, ``nodes``, ``world``: records, ``intra_node`` where
    nodes > 1; see :mod:`zeroplanner._probe_worker`) plus ``ok``, ``message`` and ``fits``
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
            "-m", "zeroplanner._probe_worker", "--out", out_path, "--backend", backend,
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
        with open(out_path, encoding="utf-8") as fh:
            result = json.load(fh)
    result["ok"] = True
    result["fits"] = {"world": fit_alpha_beta(result["world"])}
    if "intra_node" in result:
        result["fits"]["intra_node"] = fit_alpha_beta(result["intra_node"])
    ar = result["fits"]["world"].get("all_reduce", {})
    bw = f"{ar['busbw_gb_per_s']:.2f} GB/s" if ar.get("ok") else "not identifiable"
    result["message"] = f"{backend} over {result['world_size']} ranks: all-reduce busbw {bw}"
    return result


def _run_bounded(cmd: list[str], timeout_seconds: float, env: dict | None = None) -> tuple[int, str, str, bool]:
    """Run ``cmd`` (a fixed argument list, no shell) in a new session; on timeout kill that session's process
    group (the command and the ranks it started, nothing else). Returns (exit code, stdout, stderr, timed_out)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_seconds)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return proc.returncode if proc.returncode is not None else -9, out, err, True


# ----------------------------------------------------------------------------------------------------------------
# The whole probe
# ----------------------------------------------------------------------------------------------------------------
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
    ``host_transfer`` (GPU 0) and ``collectives`` (:func:`benchmark_collectives`). Without CUDA the GPU
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
    launch_timeout = max(60.0, 4 * budget_seconds)
    if timeout_seconds is not None:
        launch_timeout = min(launch_timeout, timeout_seconds - (time.monotonic() - start) - 5.0)
    if launch_timeout < 10.0:
        bench["collectives"] = {"ok": False, "message": "collective benchmark skipped: under 10 s of the "
                                f"{timeout_seconds:g} s timeout left"}
    else:
        bench["collectives"] = benchmark_collectives(
            ranks=ranks, message_bytes=message_bytes, iterations=iterations,
            budget_seconds=min(budget_seconds, launch_timeout / 2), timeout_seconds=launch_timeout)
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


# ----------------------------------------------------------------------------------------------------------------
# Probe -> ClusterSpec
# ----------------------------------------------------------------------------------------------------------------
def load_probe(path: str | os.PathLike) -> dict[str, Any]:
    """Read a probe JSON file written by ``zeroplanner probe --json`` (or a collectives file written by
    ``torchrun -m zeroplanner._probe_worker``). Raises ``ValueError`` naming the file for a missing, oversized
    (> 10 MiB) or malformed file, or JSON that is not a probe result."""
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
    except OSError as exc:
        raise ValueError(f"--cluster-from {p!r}: cannot read ({exc.strerror})") from None
    if size > MAX_PROBE_FILE_BYTES:
        raise ValueError(f"--cluster-from {p!r}: {size} bytes is larger than a probe result (max 10 MiB)")
    try:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--cluster-from {p!r}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not ("cuda_available" in data or "world" in data):
        raise ValueError(f"--cluster-from {p!r}: not a probe result (expected the output of 'zeroplanner probe "
                         "--json': an object with 'cuda_available')")
    return data


def _number(value: Any, where: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= minimum:
        raise ValueError(f"probe field {where}={value!r}: expected a finite number > {minimum:g}")
    return float(value)


def _collectives(probe: dict) -> dict | None:
    """The collectives part of a probe (a full probe result or a bare worker file), or None."""
    if "world" in probe:
        return probe
    coll = (probe.get("benchmarks") or {}).get("collectives")
    if isinstance(coll, dict) and coll.get("ok", True) and "world" in coll:
        return coll
    return None


def cluster_changes(probe: dict, base: Any) -> tuple[dict[str, Any], list[str]]:
    """What a probe changes in ``base`` (a :class:`~zeroplanner.specs.ClusterSpec`), and why.

    Returns (changes for ``specs.replace(base, **changes)``, notes: one line per change for people). Rules:

    - host: ``cpu_memory_bytes`` = RAM available now (MemAvailable: pinned offload buffers cannot swap and other
      jobs' memory is not ours); ``nvme_bytes`` = free bytes on the probed disk.
    - GPUs (when ``cuda_available``): ``gpus_per_node`` = GPUs seen; ``gpu`` = the catalog entry matched by name
      (:func:`match_catalog`), or for an unknown GPU ``base.gpu`` renamed with the measured memory (and the
      measured matmul TFLOP/s as its peak when benchmarked, so MFU is relative to what the GPU reaches);
      ``gpu_memory_bytes`` = the smallest GPU's total memory less what other processes hold (NVML), or, without
      NVML, its free memory plus the planner's CUDA-context allowance (the probe's own context is in "used" and the
      planner charges a context separately: ``Assumptions.cuda_context_bytes``); ``pcie_gb_per_s`` = measured
      pinned host-to-device GB/s. ``nodes`` stays as in ``base`` (the probe describes one node).
    - collectives: the intra-node all-reduce fit gives ``gpu.intra_node_busbw_gb_per_s`` (asymptotic busbw) and
      ``gpu.intra_node_latency_seconds`` = alpha / (2(n-1)), the latency per ring step (a ring all-reduce over n
      ranks takes 2(n-1) steps; nccl-tests PERFORMANCE.md). A world fit across nodes (torchrun over several nodes)
      sets ``network.efficiency`` = busbw / (link rate x NICs), or the link rate itself when busbw exceeds the
      nominal rate, and ``network.latency_seconds`` = alpha / (2(n-1)). A gloo fit on CPU ranks is applied too and
      says so: it measures this host's loopback, not NVLink.

    Raises ``ValueError`` naming the probe field for a value that is missing, non-numeric or out of range.
    """
    from .specs import Assumptions, replace

    if not isinstance(probe, dict) or not ("cuda_available" in probe or "world" in probe):
        raise ValueError("not a probe result (expected the JSON object 'zeroplanner probe --json' writes, "
                         "with 'cuda_available')")
    changes: dict[str, Any] = {}
    notes: list[str] = []
    gib = 2**30

    host = probe.get("host")
    if isinstance(host, dict):
        ram = _number(host.get("ram_available_bytes"), "host.ram_available_bytes")
        if ram < gib:
            raise ValueError(f"probe field host.ram_available_bytes={int(ram)}: below the planner's 1 GiB minimum")
        changes["cpu_memory_bytes"] = int(ram)
        total = host.get("ram_total_bytes")
        notes.append(f"host RAM per node: {ram / gib:.1f} GiB available now"
                     + (f" of {total / gib:.1f} GiB" if isinstance(total, (int, float)) else "") + " (probe)")
        disk = host.get("disk_free_bytes")
        if disk is not None:
            changes["nvme_bytes"] = int(_number(disk, "host.disk_free_bytes", minimum=-1))
            notes.append(f"NVMe/disk free: {disk / gib:.0f} GiB at {host.get('disk_path', '?')} (probe)")

    gpu = base.gpu
    gpus = probe.get("gpus") or []
    bench = probe.get("benchmarks") or {}
    if probe.get("cuda_available") and gpus:
        if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
            raise ValueError("probe field gpus: expected a list of objects")
        totals = [_number(g.get("total_memory_bytes"), f"gpus[{i}].total_memory_bytes") for i, g in enumerate(gpus)]
        usable = []
        for i, g in enumerate(gpus):
            other = g.get("other_processes_bytes")
            if other is not None:
                usable.append(totals[i] - _number(other, f"gpus[{i}].other_processes_bytes", minimum=-1))
            else:
                free = _number(g.get("free_memory_bytes"), f"gpus[{i}].free_memory_bytes", minimum=-1)
                usable.append(min(totals[i], free + Assumptions().cuda_context_bytes))
        first = gpus[0]
        name = str(first.get("name", "unknown GPU"))[:100] or "unknown GPU"
        # matched again against this version's catalog (the file may come from another version)
        match = match_catalog(name, int(totals[0]))
        kinds = sorted({str(g.get("name")) for g in gpus})
        if len(kinds) > 1:
            notes.append(f"mixed GPUs ({', '.join(kinds)}): planning with {name} and the smallest memory")
        matmul = [m for m in bench.get("matmul", []) if isinstance(m, dict) and m.get("ok")]
        if match:
            from . import catalog

            gpu = catalog.gpu(match["name"])
            notes.append(f"GPU: {name} -> catalog {gpu.name}"
                         + ("" if match.get("memory_matches", True) else " (memory differs; measured memory used)"))
        else:
            peak = {}
            if matmul:
                tflops = min(_number(m.get("tflops"), "benchmarks.matmul[].tflops") for m in matmul)
                peak = {"peak_bf16_tflops": tflops, "peak_fp16_tflops": tflops}
            gpu = replace(gpu, name=name, memory_bytes=int(min(totals)),
                          source=f"measured by zeroplanner probe ({name}); "
                          + ("peak = measured matmul TFLOP/s; " if peak else "")
                          + f"other figures from {base.gpu.name}", **peak)
            notes.append(f"GPU: {name} is not in the catalog; measured memory"
                         + (", measured matmul TFLOP/s as peak" if peak else "")
                         + f", other figures from {base.gpu.name}")
        changes["gpus_per_node"] = len(gpus)
        changes["gpu_memory_bytes"] = int(min(usable))
        notes.append(f"GPUs per node: {len(gpus)}; usable memory per GPU {min(usable) / gib:.1f} GiB (probe)")
        if base.gpus_per_node != len(gpus) and len(gpus) % base.tensor_parallel_size:
            changes["tensor_parallel_size"] = 1
            notes.append(f"tensor_parallel_size {base.tensor_parallel_size} does not divide {len(gpus)} GPUs: set to 1")
        transfer = bench.get("host_transfer")
        if isinstance(transfer, dict) and transfer.get("ok"):
            pcie = _number(transfer.get("h2d_pinned_gb_per_s"), "benchmarks.host_transfer.h2d_pinned_gb_per_s")
            gpu = replace(gpu, pcie_gb_per_s=pcie)
            notes.append(f"host->device: {pcie:.1f} GB/s pinned (measured)")

    coll = _collectives(probe)
    nvlink = probe.get("nvlink") or {}
    if coll is None and probe.get("cuda_available") and len(gpus) > 1 and nvlink.get("detected") is False:
        notes.append(f"no active NVLink found ({nvlink.get('source')}): the catalog's intra-node busbw "
                     f"{gpu.intra_node_busbw_gb_per_s:g} GB/s may be too high; run 'zeroplanner probe --benchmarks'")
    if coll is not None:
        fits = coll.get("fits") or {}
        nodes = int(coll.get("nodes", 1))
        backend = coll.get("backend", "?")
        where = "intra_node" if nodes > 1 else "world"
        records = coll.get(where) or []
        fit = (fits.get(where) or fit_alpha_beta(records)).get("all_reduce")
        label = "gloo on CPU ranks (this host's loopback, not GPU links)" if backend == "gloo" else backend
        if fit and fit.get("ok"):
            n = int(fit["ranks"])
            busbw = _number(fit["busbw_gb_per_s"], f"{where} all_reduce busbw_gb_per_s")
            update: dict[str, Any] = {"intra_node_busbw_gb_per_s": busbw}
            alpha = float(fit["alpha_seconds"] or 0.0)
            if alpha > 0:
                update["intra_node_latency_seconds"] = min(1.0, alpha / (2 * (n - 1)))
            gpu = replace(gpu, **update)
            notes.append(f"intra-node all-reduce busbw {busbw:.3g} GB/s, latency {alpha * 1e6:.0f} us per "
                         f"all-reduce over {n} ranks (measured, {label})")
        elif fit:
            notes.append(f"intra-node all-reduce: {fit.get('message')} (kept {gpu.intra_node_busbw_gb_per_s} GB/s)")
        if nodes > 1:
            wfit = (fits.get("world") or fit_alpha_beta(coll.get("world") or [])).get("all_reduce")
            if wfit and wfit.get("ok"):
                n = int(wfit["ranks"])
                node_bytes = _number(wfit["busbw_gb_per_s"], "world all_reduce busbw_gb_per_s") * 1e9
                net = base.network
                nominal = net.link_gbps * 1e9 / 8 * net.nics_per_node
                update = {"efficiency": min(1.0, node_bytes / nominal)}
                if node_bytes > nominal:
                    update["link_gbps"] = node_bytes * 8 / 1e9 / net.nics_per_node
                alpha = float(wfit["alpha_seconds"] or 0.0)
                if alpha > 0:
                    update["latency_seconds"] = min(1.0, alpha / (2 * (n - 1)))
                changes["network"] = replace(net, **update)
                notes.append(f"inter-node all-reduce busbw {node_bytes / 1e9:.3g} GB/s over {nodes} nodes = "
                             f"{update['efficiency']:.0%} of {net.name} (measured, {label})")
    if gpu is not base.gpu:
        changes["gpu"] = gpu
    return changes, notes


def cluster_from_probe(probe: dict, base: Any) -> Any:
    """``base`` (a :class:`~zeroplanner.specs.ClusterSpec`) with what ``probe`` measured (rules in
    :func:`cluster_changes`). Pure: no torch, no I/O. Raises ``ValueError`` with a one-line message naming the
    probe or cluster field when the probe is not a probe result or holds a value the cluster cannot take."""
    from pydantic import ValidationError

    from .specs import replace

    changes, _notes = cluster_changes(probe, base)
    try:
        return replace(base, **changes)
    except ValidationError as exc:  # one line naming the cluster field, for the CLI's one-line errors
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"the probe gives cluster field {field}={err.get('input')!r}: "
                         f"{err['msg'].removeprefix('Value error, ')}") from None


# ----------------------------------------------------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------------------------------------------------
def fit_efficiency(
    runs: Sequence[tuple[Any, float]],
    probe: dict | None = None,
    mfu_bounds: tuple[float, float] = (0.01, 1.0),
) -> dict[str, Any]:
    """Fit the cost model's MFU to measured step times, after the communication terms are set from measured
    bandwidths.

    ``runs``: (Scenario, measured step seconds) pairs from real runs on the probed machine (e.g. the ground-truth
    harness, :mod:`zeroplanner.calibrate`). ``probe``: a probe result; its measured bandwidths replace each
    scenario's catalog figures first (:func:`cluster_from_probe`), and the ratio measured / catalog is reported as
    the communication efficiency. Then one MFU for all runs minimises the squared log error of predicted step time
    (a bounded 1-D search: a 400-point log grid on ``mfu_bounds`` refined by golden section).

    Returns ``{"mfu", "mfu_default", "communication_efficiency": {"intra_node", "inter_node"} (None where not
    measured), "runs": [{"measured_step_seconds", "predicted_step_seconds_before" (catalog cluster, default MFU),
    "predicted_step_seconds_after", "relative_error_before", "relative_error_after"}], "at_bound" (the fit hit a
    bound: the model cannot match with any MFU in range), "note"}``. With one run the fitted prediction matches by
    construction unless at a bound; only further runs test it. Raises ``ValueError`` for no runs or a
    non-positive time.
    """
    from .costmodel import estimate
    from .specs import replace

    if not runs:
        raise ValueError("runs: need at least one (scenario, measured_step_seconds) pair")
    lo, hi = mfu_bounds
    if not (0 < lo < hi <= 1):
        raise ValueError(f"mfu_bounds={mfu_bounds}: need 0 < low < high <= 1")
    prepared = []
    efficiency: dict[str, float | None] = {"intra_node": None, "inter_node": None}
    for i, (scenario, measured) in enumerate(runs):
        measured = _number(measured, f"runs[{i}].measured_step_seconds")
        cluster = scenario.cluster
        if probe is not None:
            cluster = cluster_from_probe(probe, cluster)
            if cluster.gpu.intra_node_busbw_gb_per_s != scenario.cluster.gpu.intra_node_busbw_gb_per_s:
                efficiency["intra_node"] = (cluster.gpu.intra_node_busbw_gb_per_s
                                            / scenario.cluster.gpu.intra_node_busbw_gb_per_s)
            if cluster.network != scenario.cluster.network:
                efficiency["inter_node"] = (cluster.network.node_busbw_bytes_per_second
                                            / scenario.cluster.network.node_busbw_bytes_per_second)
        prepared.append((scenario, replace(scenario, cluster=cluster), measured))

    def loss(mfu: float) -> float:
        total = 0.0
        for _s, calibrated, measured in prepared:
            step = estimate(replace(calibrated, assumptions=replace(calibrated.assumptions, mfu=mfu, mfu_fixed=True))).step_seconds
            total += math.log(step / measured) ** 2
        return total

    grid = [lo * (hi / lo) ** (k / 399) for k in range(400)]
    values = [loss(m) for m in grid]
    k = min(range(len(grid)), key=values.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):  # golden section on [a, b]
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    mfu = (a + b) / 2
    rows = []
    for scenario, calibrated, measured in prepared:
        before = estimate(scenario).step_seconds
        after = estimate(replace(calibrated, assumptions=replace(calibrated.assumptions, mfu=mfu, mfu_fixed=True))).step_seconds
        rows.append({"measured_step_seconds": measured, "predicted_step_seconds_before": before,
                     "predicted_step_seconds_after": after, "relative_error_before": before / measured - 1,
                     "relative_error_after": after / measured - 1})
    at_bound = mfu <= lo * 1.001 or mfu >= hi * 0.999
    note = ("one run: the fitted MFU reproduces it by construction; more runs test the fit"
            if len(prepared) == 1 else f"one MFU fitted to {len(prepared)} runs")
    if at_bound:
        note += f"; the fit hit the bound {mfu_bounds}: no MFU in range explains the measurement"
    return {"mfu": mfu, "mfu_default": runs[0][0].assumptions.mfu, "communication_efficiency": efficiency,
            "runs": rows, "at_bound": at_bound, "note": note}


def fit_from_calibration(reports: Sequence[Any], probe: dict | None = None,
                         mfu_bounds: tuple[float, float] = (1e-9, 1.0)) -> dict[str, Any]:
    """:func:`fit_efficiency` on runs of the real engine: ``reports`` are
    :class:`zeroplanner.calibrate.CalibrationReport` objects (or their ``model_dump()`` dicts) from
    ``calibrate.run_calibration`` on this machine. Each report's scenario (the scaled-down model it ran) is priced by
    the cost model and its measured step time is forward + backward + optimizer step of the last step (slowest
    rank). On CUDA the report's peak ``torch.cuda.max_memory_allocated`` is set beside the predicted per-GPU bytes
    without the overhead term (CUDA context and allocator slack are not "allocated" bytes).

    Returns :func:`fit_efficiency`'s dict plus ``"memory"``: one entry per report with ``measured_peak_allocated_bytes``
    (None on CPU ranks), ``predicted_bytes_without_overhead``, ``relative_error`` and ``note``. The lower MFU bound
    is 1e-9 because calibration models are tiny and may run on CPU ranks against a GPU's peak (launch- and
    latency-bound, far below a full model's MFU): the fitted MFU describes the run that was measured; calibrate a
    larger ``hf_config`` on the GPUs to fit a production MFU.
    """
    from .costmodel import estimate
    from .specs import Scenario

    if not reports:
        raise ValueError("reports: need at least one calibration report")
    runs, memory = [], []
    for i, report in enumerate(reports):
        data = report.model_dump() if hasattr(report, "model_dump") else report
        if not isinstance(data, dict) or "scenario" not in data or "timings" not in data:
            raise ValueError(f"reports[{i}]: not a calibration report (needs 'scenario' and 'timings')")
        scenario = Scenario.model_validate(data["scenario"])
        t = data["timings"]
        measured = sum(_number(t.get(k), f"reports[{i}].timings.{k}", minimum=-1)
                       for k in ("forward_seconds", "backward_seconds", "step_seconds"))
        runs.append((scenario, measured))
        predicted = estimate(scenario).per_gpu_bytes
        without_overhead = predicted.total - predicted.overhead
        cuda = data.get("cuda") or {}
        peaks = [v for k, v in cuda.items() if k.endswith("max_allocated_bytes") and isinstance(v, (int, float))]
        peak = max(peaks) if peaks else None
        memory.append({
            "name": data.get("name", f"run{i}"),
            "measured_peak_allocated_bytes": peak,
            "predicted_bytes_without_overhead": without_overhead,
            "relative_error": None if not peak else without_overhead / peak - 1,
            "note": "torch.cuda.max_memory_allocated over init, forward, backward, step" if peak
            else "CPU ranks: no device memory to measure (see the report's storage census)",
        })
    result = fit_efficiency(runs, probe=probe, mfu_bounds=mfu_bounds)
    result["memory"] = memory
    return result


# ----------------------------------------------------------------------------------------------------------------
# Command line (shared with the ``zeroplanner probe`` plugin)
# ----------------------------------------------------------------------------------------------------------------
def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``zeroplanner probe`` / ``python -m zeroplanner.probe``."""
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--benchmarks", action="store_true",
                        help="also run the micro-benchmarks: matmul TFLOP/s, host<->device GB/s, collective busbw")
    parser.add_argument("--nvme-path", default=".", help="directory an NVMe offload would use (free disk is read "
                        "there; default: the current directory)")
    parser.add_argument("--ranks", type=int, default=None,
                        help="ranks for the collective benchmark, 2-64 (default: the GPU count; 2 CPU ranks without CUDA)")
    parser.add_argument("--budget-seconds", type=float, default=30.0,
                        help="time budget of the collective sweep, seconds (1-600; default 30)")
    parser.add_argument("--timeout-seconds", type=float, default=None,
                        help="bound on the whole probe with --benchmarks, seconds (1-3600; default: none)")


def probe_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Validate the parsed options and run :func:`run_probe`. Raises ``ValueError`` naming the option."""
    if args.ranks is not None and not (2 <= args.ranks <= 64):
        raise ValueError(f"--ranks: {args.ranks} is out of range (2-64)")
    if not (1 <= args.budget_seconds <= 600):
        raise ValueError(f"--budget-seconds: {args.budget_seconds:g} is out of range (1-600)")
    if args.timeout_seconds is not None and not (1 <= args.timeout_seconds <= 3600):
        raise ValueError(f"--timeout-seconds: {args.timeout_seconds:g} is out of range (1-3600)")
    if not os.path.isdir(args.nvme_path):
        raise ValueError(f"--nvme-path: {args.nvme_path!r} is not a directory")
    return run_probe(benchmarks=args.benchmarks, nvme_path=args.nvme_path, ranks=args.ranks,
                     budget_seconds=args.budget_seconds, timeout_seconds=args.timeout_seconds)


def format_text(result: dict[str, Any]) -> str:
    """The probe result as a few lines for people (GiB, GB/s, TFLOP/s)."""
    gib = 2**30
    lines = [result.get("message", "")]
    host = result.get("host") or {}
    if host:
        lines.append(f"host RAM {host['ram_available_bytes'] / gib:.1f} GiB available of "
                     f"{host['ram_total_bytes'] / gib:.1f} GiB; {host['cpu_count']} CPUs; "
                     f"disk {host['disk_free_bytes'] / gib:.0f} GiB free at {host['disk_path']}")
    for g in result.get("gpus", []):
        cat = g.get("catalog")
        lines.append(f"GPU {g['index']}: {g['name']} (sm {g['compute_capability']}), "
                     f"{g['total_memory_bytes'] / gib:.1f} GiB total, {g['free_memory_bytes'] / gib:.1f} GiB free; "
                     f"catalog: {cat['name'] if cat else 'not found'}")
    if result.get("gpu_count", 0) > 1:
        nv = result.get("nvlink") or {}
        lines.append(f"NVLink: {nv.get('detected')} ({nv.get('source')}); peer access all pairs: "
                     f"{all(all(row) for row in result.get('peer_access', []))}")
    bench = result.get("benchmarks") or {}
    for m in bench.get("matmul", []):
        lines.append(f"matmul: {m.get('message')}")
    if bench.get("host_transfer"):
        lines.append(f"transfer: {bench['host_transfer'].get('message')}")
    coll = bench.get("collectives")
    if coll:
        lines.append(f"collectives: {coll.get('message')}")
        for key, fits in (coll.get("fits") or {}).items():
            for name, fit in fits.items():
                if fit.get("ok"):
                    lines.append(f"  {key} {name}: busbw {fit['busbw_gb_per_s']:.3g} GB/s, "
                                 f"alpha {fit['alpha_seconds'] * 1e6:.0f} us over {fit['ranks']} ranks")
    return "\n".join(line for line in lines if line)


def main(argv: list[str] | None = None) -> int:
    """``python -m zeroplanner.probe [--json] [--benchmarks]``: exit 0 with a result (also without CUDA), 2 for a
    bad option."""
    parser = argparse.ArgumentParser(prog="python -m zeroplanner.probe", description="Probe this machine's GPUs, "
                                     "host RAM, disk and (with --benchmarks) their measured throughput.")
    add_probe_arguments(parser)
    args = parser.parse_args(argv)
    try:
        result = probe_from_args(args)
    except ValueError as exc:
        print(f"zeroplanner probe: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
