"""Collective micro-benchmark, one process per rank, launched by ``torchrun`` (``torch.distributed.run``).

Run by :func:`zeroplanner.probe.benchmark_collectives` on the local ranks, or by hand across nodes::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m zeroplanner.probe._worker --out collectives.json

Each rank times all-reduce, all-gather and reduce-scatter over a range of message sizes; rank 0 writes one JSON
object. Sizes and bandwidths follow nccl-tests (``doc/PERFORMANCE.md``; docs/references.md section 6):

- ``bytes`` is nccl-tests' "size": the all-reduce buffer, the all-gather output (n chunks), the reduce-scatter input
  (n chunks), in bytes;
- ``seconds`` is the time of one collective, the slowest rank's mean over ``iterations`` back-to-back calls;
- ``algbw_gb_per_s = bytes / seconds / 1e9``;
- ``busbw_gb_per_s = algbw * 2(n-1)/n`` for all-reduce and ``algbw * (n-1)/n`` for all-gather / reduce-scatter.

torch is imported inside functions so that ``zeroplanner`` imports without it; this module is only run under
torchrun. Every run is bounded: after each message size rank 0 checks ``--budget-seconds`` and all ranks stop
together once it is spent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def busbw_factor(collective: str, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): all-reduce 2(n-1)/n, all-gather and reduce-scatter
    (n-1)/n. Raises ``ValueError`` for another collective or ``ranks < 1``."""
    if ranks < 1:
        raise ValueError(f"ranks={ranks} must be >= 1")
    if collective == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    raise ValueError(f"collective={collective!r}; allowed: {list(COLLECTIVES)}")


def _op(collective: str, group, ranks: int, nbytes: int, device, dtype):
    """A zero-argument callable running one collective of nccl-tests size ``nbytes`` (elements of ``dtype``)."""
    import torch
    import torch.distributed as dist

    element = torch.tensor([], dtype=dtype).element_size()
    chunk = max(1, nbytes // (element * ranks))  # elements per rank's chunk
    if collective == "all_reduce":
        buf = torch.ones(chunk * ranks, dtype=dtype, device=device)
        return (lambda: dist.all_reduce(buf, group=group)), buf.numel() * element
    big = torch.ones(chunk * ranks, dtype=dtype, device=device)
    small = torch.ones(chunk, dtype=dtype, device=device)
    if collective == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return (lambda: fn(big, small, group=group)), big.numel() * element
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return (lambda: fn(small, big, group=group)), big.numel() * element


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    group,
    ranks: int,
    message_bytes: list[int],
    iterations: int,
    warmup: int,
    budget_seconds: float,
    device,
    collectives: tuple[str, ...] = COLLECTIVES,
) -> tuple[list[dict], bool]:
    """Time each collective in ``collectives`` at each size on ``group`` (all of whose ranks call this).

    Returns (records, truncated): one record per (collective, size) with ``collective``, ``ranks``, ``bytes``,
    ``iterations``, ``seconds``, ``algbw_gb_per_s``, ``busbw_gb_per_s``; ``truncated`` is True when the time budget
    stopped the sweep early (all ranks agree, via an all-reduce of rank 0's decision).
    """
    import torch
    import torch.distributed as dist

    dtype = torch.float32
    records: list[dict] = []
    start = time.perf_counter()
    truncated = False
    for collective in collectives:
        for nbytes in message_bytes:
            run, actual_bytes = _op(collective, group, ranks, nbytes, device, dtype)
            for _ in range(warmup):
                run()
            _sync(device)
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(iterations):
                run()
            _sync(device)
            elapsed = (time.perf_counter() - t0) / iterations
            # slowest rank's time, and rank 0's "budget spent" flag, in one all-reduce(MAX)
            over = 1.0 if time.perf_counter() - start > budget_seconds else 0.0
            stats = torch.tensor([elapsed, over], dtype=torch.float64, device=device)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
            seconds = float(stats[0])
            algbw = actual_bytes / seconds / 1e9
            records.append(
                {
                    "collective": collective,
                    "ranks": ranks,
                    "bytes": int(actual_bytes),
                    "iterations": iterations,
                    "seconds": seconds,
                    "algbw_gb_per_s": algbw,
                    "busbw_gb_per_s": algbw * busbw_factor(collective, ranks),
                }
            )
            if float(stats[1]) > 0:
                truncated = True
                return records, truncated
    return records, truncated


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m zeroplanner.probe._worker", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--backend", choices=("nccl", "gloo", "auto"), default="auto")
    p.add_argument("--message-bytes", default="1048576,4194304,16777216,67108864,268435456",
                   help="comma-separated nccl-tests sizes in bytes")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget-seconds", type=float, default=30.0)
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help="ranks per node for the intra-node groups (0 = LOCAL_WORLD_SIZE from torchrun)")
    args = p.parse_args(argv)
    try:
        args.message_bytes = sorted({int(x) for x in args.message_bytes.split(",") if x.strip()})
    except ValueError:
        p.error(f"--message-bytes: expected comma-separated integers, got {args.message_bytes!r}")
    if not args.message_bytes or min(args.message_bytes) < 4 or max(args.message_bytes) > 2**34:
        p.error("--message-bytes: each size must be between 4 and 2**34 bytes")
    if not (1 <= args.iterations <= 10_000):
        p.error(f"--iterations={args.iterations} must be between 1 and 10000")
    if not (0 <= args.warmup <= 1000):
        p.error(f"--warmup={args.warmup} must be between 0 and 1000")
    return args


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.distributed as dist

    args = _parse(argv)
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world % per_node:
        per_node = world
    nodes = world // per_node
    t_start = time.perf_counter()
    result: dict = {
        "backend": backend,
        "device": "cuda" if device.type == "cuda" else "cpu",
        "world_size": world,
        "ranks_per_node": per_node,
        "nodes": nodes,
        "dtype": "float32",
        "budget_seconds": args.budget_seconds,
        "torch_version": torch.__version__,
    }
    if backend == "nccl":
        version = torch.cuda.nccl.version()  # a tuple in torch 2.x, an int in older releases
        result["nccl_version"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    # whole world: across nodes when nodes > 1 (the inter-node ring), else the local ranks
    budget = args.budget_seconds / (2 if nodes > 1 else 1)
    records, truncated = measure(dist.group.WORLD, world, args.message_bytes, args.iterations, args.warmup,
                                 budget, device)
    result["world"] = records
    if nodes > 1:
        # each node's ranks on their own, all nodes at once (new_subgroups must be called by every rank)
        local_group, _ = dist.new_subgroups(group_size=per_node)
        intra, truncated_intra = measure(local_group, per_node, args.message_bytes, args.iterations, args.warmup,
                                         budget, device)
        truncated = truncated or truncated_intra
        result["intra_node"] = intra
    result["truncated"] = truncated
    result["elapsed_seconds"] = time.perf_counter() - t_start
    if rank == 0:
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
        os.replace(tmp, args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
