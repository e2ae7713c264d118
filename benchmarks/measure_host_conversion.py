"""Measure the host's fp32 -> bf16 copy rate per torch thread: the pass DeepSpeed's optimizer offload makes on the CPU
after each CPU-Adam step (stage_1_and_2.py ``bit16_partition_buffer.data.copy_(fp32_partition.data)``; stage3.py
``fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)``, a blocking cross-device copy
that ATen converts on the CPU). Writes zeroplanner/_measurements/host_conversion.json.

    python benchmarks/measure_host_conversion.py [--elements 100000000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=100_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    src = torch.randn(args.elements, dtype=torch.float32)
    dst = torch.empty(args.elements, dtype=torch.bfloat16)
    rows = []
    for threads in range(1, (os.cpu_count() or 1) + 1):
        torch.set_num_threads(threads)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        times.sort()
        rows.append({"threads": threads, "elements": args.elements, "median_seconds": times[len(times) // 2],
                     "elements_per_second": args.elements / times[len(times) // 2],
                     "load_average_1min": os.getloadavg()[0]})
        print(f"{threads} thread(s): {rows[-1]['elements_per_second']:.3g} elements/s "
              f"(load average {rows[-1]['load_average_1min']:.1f})")
    out = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu_count": os.cpu_count(),
           "torch": torch.__version__, "rows": rows}
    path = Path(__file__).resolve().parents[1] / "zeroplanner" / "_measurements" / "host_conversion.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
