"""What this machine has: CUDA, GPUs (memory, compute capability, catalog match), peer access and NVLink, host RAM
and free disk for NVMe offload. Without CUDA :func:`inventory` returns ``{"cuda_available": False, "message": "no
CUDA device: ...", ...}``; it never raises because a GPU is missing. torch is imported inside functions only."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any


PROBE_FORMAT = "zeroplanner-probe/1"
"""Value of the ``format`` key of a probe result; :func:`load_probe` checks it."""


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
        from .. import catalog as cat

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


