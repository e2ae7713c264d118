"""A probe result (or its JSON file) -> the planner's :class:`~zeroplanner.specs.ClusterSpec`. Pure: no torch."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..files import read_regular_file
from .benchmarks import fit_alpha_beta
from .hardware import match_catalog

MAX_PROBE_FILE_BYTES = 10 * 2**20
"""A probe JSON file larger than this is refused (a real one is a few KiB)."""


def load_probe(path: str | os.PathLike) -> dict[str, Any]:
    """Read a probe JSON file written by ``zeroplanner probe --json`` (or a collectives file written by
    ``torchrun -m zeroplanner.probe._worker``). Read with :func:`zeroplanner.files.read_regular_file`: only a
    regular file, at most :data:`MAX_PROBE_FILE_BYTES` (10 MiB). Raises ``ValueError`` naming the file for a
    missing or unreadable path, one that is not a regular file (directory, FIFO, device, socket), an oversized
    (> 10 MiB) or malformed file, or JSON that is not a probe result."""
    p = os.fspath(path)
    raw = read_regular_file(p, MAX_PROBE_FILE_BYTES, "--cluster-from",
                            limit_note="larger than a probe result: max 10 MiB")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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
      pinned host-to-device GB/s. ``nodes`` stays as in ``base`` (a one-machine probe describes one node).
    - ``cpu_adam_params_per_second`` = the measured DeepSpeedCPUAdam rate on every core of the probed host
      (``benchmarks.cpu_adam``, :func:`~zeroplanner.probe.benchmark_cpu_adam`), with or without GPUs.
    - a report of ``zeroplanner probe --distributed`` (a ``cluster`` object): ``nodes`` and ``gpus_per_node`` =
      the measured job's nodes and ranks per node (one rank per GPU, as DeepSpeed runs), and its ``world`` fit
      across the nodes sets the network as below.
    - collectives: the intra-node all-reduce fit gives ``gpu.intra_node_busbw_gb_per_s`` (asymptotic busbw) and
      ``gpu.intra_node_latency_seconds`` = alpha / (2(n-1)), the latency per ring step (a ring all-reduce over n
      ranks takes 2(n-1) steps; nccl-tests PERFORMANCE.md). A world fit across nodes (torchrun over several nodes)
      sets ``network.efficiency`` = busbw / (link rate x NICs), or the link rate itself when busbw exceeds the
      nominal rate, and ``network.latency_seconds`` = alpha / (2(n-1)). A gloo fit on CPU ranks is applied too and
      says so: it measures this host's loopback, not NVLink.

    Raises ``ValueError`` naming the probe field for a value that is missing, non-numeric or out of range.
    """
    from ..specs import Assumptions, replace

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
    if not (probe.get("cuda_available") and gpus):
        notes.append(f"the probe found no GPU ({probe.get('message') or 'cuda_available false'}): GPUs kept as "
                     f"given, {base.gpus_per_node} x {base.gpu.name} per node")
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
            from .. import catalog

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

    adam = bench.get("cpu_adam")
    if isinstance(adam, dict) and adam.get("ok"):
        rate = _number(adam.get("params_per_second"), "benchmarks.cpu_adam.params_per_second", minimum=1e6)
        changes["cpu_adam_params_per_second"] = rate
        notes.append(f"CPU-Adam: {rate:.3g} parameter updates/s per node (DeepSpeedCPUAdam measured with "
                     f"{adam.get('threads', '?')} threads on this host)")

    layout = probe.get("cluster")
    if isinstance(layout, dict) and "nodes" in layout:  # a report of 'zeroplanner probe --distributed'
        nodes_measured = int(_number(layout.get("nodes"), "cluster.nodes"))
        per_node = int(_number(layout.get("gpus_per_node"), "cluster.gpus_per_node"))
        changes["nodes"] = nodes_measured
        changes["gpus_per_node"] = per_node
        cpu = "" if probe.get("cuda_available") else " (CPU ranks: one rank stands for one GPU)"
        notes.append(f"nodes: {nodes_measured}, GPUs per node: {per_node}, as in the measured job{cpu}")
        if per_node % base.tensor_parallel_size:
            changes["tensor_parallel_size"] = 1
            notes.append(f"tensor_parallel_size {base.tensor_parallel_size} does not divide {per_node} GPUs: set to 1")
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

    from ..specs import replace

    changes, _notes = cluster_changes(probe, base)
    try:
        return replace(base, **changes)
    except ValidationError as exc:  # one line naming the cluster field, for the CLI's one-line errors
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"the probe gives cluster field {field}={err.get('input')!r}: "
                         f"{err['msg'].removeprefix('Value error, ')}") from None


