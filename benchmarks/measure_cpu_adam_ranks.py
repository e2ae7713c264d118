"""DeepSpeedCPUAdam's rate on this machine as a function of threads per rank and ranks per node.

ZeRO-Offload runs one DeepSpeedCPUAdam step per rank on that rank's partition, all ranks of a node at once
(stage_1_and_2.py / stage3.py ``optimizer.step`` after the gradients reach the host), so a node's rate is what
``ranks`` concurrent optimizers with ``threads`` OpenMP threads each achieve together on the node's cores and memory
bandwidth. This script measures it the way ``zeroplanner probe --benchmarks`` measures one optimizer
(:func:`zeroplanner.probe.benchmark_cpu_adam`: one fp32 tensor, AdamW mode, the fastest and the median of
``--repeats`` steps after a first one), with ``ranks`` of them started together; the node's rate is the sum over
ranks of ``params / median step``.

    python3 benchmarks/measure_cpu_adam_ranks.py [--params 100000000] [--repeats 15] [--out FILE.json]

The configurations are (threads per rank, ranks) = (1, 1), (2, 1), (1, 2) by default (every one this 2-core machine
can run without oversubscribing); ``--configs 1x1,4x2`` chooses others. The load average is printed with the
figures: other processes on the cores only slow a step down, so a figure measured under load is a floor.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zeroplanner.probe import benchmark_cpu_adam  # noqa: E402


def measure(threads: int, ranks: int, params: int, repeats: int) -> dict:
    with concurrent.futures.ThreadPoolExecutor(max_workers=ranks) as pool:
        runs = list(pool.map(lambda _: benchmark_cpu_adam(params, repeats, threads=threads, timeout_seconds=900),
                             range(ranks)))
    bad = [r["message"] for r in runs if not r["ok"]]
    if bad:
        raise RuntimeError("; ".join(bad))
    node = sum(params / r["median_seconds"] for r in runs)
    return {"threads_per_rank": threads, "ranks": ranks, "params_per_rank": params,
            "median_seconds_per_rank": [r["median_seconds"] for r in runs],
            "best_seconds_per_rank": [r["best_seconds"] for r in runs],
            "node_params_per_second": node, "per_rank_params_per_second": node / ranks,
            "load_average_1min": os.getloadavg()[0], "deepspeed": runs[0]["deepspeed"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=100_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--configs", default="1x1,2x1,1x2", help="THREADSxRANKS, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    rows = []
    print(f"DeepSpeedCPUAdam, {args.params:,} parameters per rank, {os.cpu_count()} cores")
    for threads, ranks in configs:
        r = measure(threads, ranks, args.params, args.repeats)
        rows.append(r)
        print(f"{threads} thread(s) x {ranks} rank(s): {r['node_params_per_second']:.3g} params/s per node "
              f"({r['per_rank_params_per_second']:.3g} per rank), load average {r['load_average_1min']:.1f}")
    doc = {"measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "cpu_count": os.cpu_count(), "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
