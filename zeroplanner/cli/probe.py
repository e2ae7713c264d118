"""``zeroplanner probe [--benchmarks] [--json]``: what this machine has and does, for ``--cluster-from``.

Subcommand module of :mod:`zeroplanner.cli`. The probe runs in this process (a short-lived command, so
its CUDA context goes with it); torch is imported only when the command runs. Without CUDA it prints the clear
"no CUDA device: ..." result and exits 0 (a result, not an error); ``--benchmarks`` then measures the collectives on
CPU ranks with gloo. A bad option exits 2 with one line naming it.

Typical use::

    zeroplanner probe --benchmarks --json > probe.json
    zeroplanner recommend --model llama-2-13b --cluster-from probe.json --json

Across nodes, ``--distributed`` runs the probe as one rank of a job the user's launcher starts (torchrun, the
DeepSpeed launcher, ``srun``; ``zeroplanner launch-script`` prints the command): rank 0 writes one report with
intra-node, inter-node and world collective fits (:mod:`zeroplanner.probe.distributed`)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        -m zeroplanner.cli probe --distributed -o cluster.json
    zeroplanner recommend --model llama-2-70b --cluster-from cluster.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..probe import run_probe


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``zeroplanner probe`` / ``python -m zeroplanner.probe``."""
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--benchmarks", action="store_true",
                        help="also run the micro-benchmarks: matmul TFLOP/s, host<->device GB/s, collective busbw, "
                             "DeepSpeed CPU-Adam updates/s")
    parser.add_argument("--nvme-path", default=".", help="directory an NVMe offload would use (free disk is read "
                        "there; default: the current directory)")
    parser.add_argument("--ranks", type=int, default=None,
                        help="ranks for the collective benchmark, 2-64 (default: the GPU count; 2 CPU ranks without CUDA)")
    parser.add_argument("--budget-seconds", type=float, default=30.0,
                        help="time budget of the collective sweep, seconds (1-600; default 30)")
    parser.add_argument("--timeout-seconds", type=float, default=None,
                        help="bound on the whole probe with --benchmarks, seconds (1-3600; default: none)")
    d = parser.add_argument_group("across nodes (run as one rank of a torchrun / deepspeed / srun job)")
    d.add_argument("--distributed", action="store_true",
                   help="join the launcher's job (RANK, WORLD_SIZE, MASTER_ADDR... or SLURM_*) and measure "
                   "intra-node, inter-node and world collectives; rank 0 writes the report (-o)")
    d.add_argument("--node-id", default=None,
                   help="this rank's node name (default: $ZEROPLANNER_NODE_ID, else the host name); only to "
                   "simulate several nodes on one machine")
    d.add_argument("--rendezvous-timeout", type=float, default=120.0,
                   help="seconds to wait for every rank, and bound on each collective (5-3600; default 120)")


def probe_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """Validate the parsed options and run :func:`run_probe` (with ``--distributed``:
    :func:`zeroplanner.probe.distributed.run_distributed_probe`, None on ranks other than 0). Raises ``ValueError``
    naming the option, :class:`zeroplanner.probe.distributed.DistributedError` when the job fails."""
    if args.ranks is not None and not (2 <= args.ranks <= 64):
        raise ValueError(f"--ranks: {args.ranks} is out of range (2-64)")
    if not (1 <= args.budget_seconds <= 600):
        raise ValueError(f"--budget-seconds: {args.budget_seconds:g} is out of range (1-600)")
    if args.timeout_seconds is not None and not (1 <= args.timeout_seconds <= 3600):
        raise ValueError(f"--timeout-seconds: {args.timeout_seconds:g} is out of range (1-3600)")
    if not os.path.isdir(args.nvme_path):
        raise ValueError(f"--nvme-path: {args.nvme_path!r} is not a directory")
    if getattr(args, "distributed", False):
        if args.ranks is not None:
            raise ValueError("--ranks: not with --distributed (the launcher decides the ranks)")
        if not (5 <= args.rendezvous_timeout <= 3600):
            raise ValueError(f"--rendezvous-timeout: {args.rendezvous_timeout:g} is out of range (5-3600)")
        from ..probe.distributed import run_distributed_probe

        return run_distributed_probe(output=getattr(args, "output", None), node_id=args.node_id,
                                     budget_seconds=args.budget_seconds,
                                     rendezvous_timeout_seconds=args.rendezvous_timeout, nvme_path=args.nvme_path)
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
    if bench.get("cpu_adam"):
        lines.append(f"CPU-Adam: {bench['cpu_adam'].get('message')}")
    coll = bench.get("collectives")
    if coll:
        lines.append(f"collectives: {coll.get('message')}")
        from ..probe.benchmarks import fit_rows

        lines += [f"  {key} {name}: busbw {fit['busbw_gb_per_s']:.3g} GB/s, alpha {fit['alpha_seconds'] * 1e6:.0f} us "
                  f"over {fit['ranks']} ranks" for key, name, fit in fit_rows(coll) if fit.get("ok")]
    return "\n".join(line for line in lines if line)


def register(subparsers, add_scenario_options=None) -> None:
    """Add ``probe`` to the ``zeroplanner`` command (:mod:`zeroplanner.cli` registers each module)."""
    parser = subparsers.add_parser(
        "probe",
        help="inventory this machine's GPUs, host RAM and disk; --benchmarks measures matmul, PCIe, collectives and CPU-Adam",
        description="Probe this machine: GPUs (memory free and total, compute capability, catalog match, peer "
        "access / NVLink), host RAM, free disk; with --benchmarks bf16 matmul TFLOP/s, host<->device GB/s and "
        "all-reduce / all-gather / reduce-scatter busbw with an alpha-beta fit. Save the --json output and pass it "
        "to any scenario command with --cluster-from.",
    )
    add_probe_arguments(parser)
    parser.add_argument("-o", "--output", default=None, help="also write the JSON result to this file (with "
                        "--distributed: rank 0 writes it, and the text report beside it as .txt)")
    parser.set_defaults(func=run)


def run(args) -> int:
    """Handler: exit 0 with a result (with or without CUDA), 2 for a bad option, 1 when a distributed job failed
    (one line: which rank, the rendezvous address or the failed collective)."""
    from ..probe.distributed import DistributedError, fail_message, format_report_text

    try:
        result = probe_from_args(args)
    except ValueError as exc:
        print(f"zeroplanner probe: error: {exc}", file=sys.stderr)
        return 2
    except DistributedError as exc:
        print(f"zeroplanner probe: error: {fail_message(exc)}", file=sys.stderr)
        return 1
    if args.distributed:
        if result is not None:  # rank 0 (the report files are written already)
            print(json.dumps(result, indent=1) if args.json else format_report_text(result))
        return 0
    text = json.dumps(result, indent=1)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
        except OSError as exc:
            print(f"zeroplanner probe: error: --output {args.output!r}: {exc.strerror}", file=sys.stderr)
            return 2
    print(text if args.json else format_text(result))
    return 0
