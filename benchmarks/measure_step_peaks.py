"""Measure the step-peak census on CPU ranks and store it in zeroplanner/_measurements/step_peaks.json.

    python benchmarks/measure_step_peaks.py            # every run of zeroplanner.calibrate.peak.PEAK_RUNS
    python benchmarks/measure_step_peaks.py --print    # the stored rows against today's prediction

About 9 minutes on 2 cores (45 runs x 2 ranks, 3 DeepSpeed launches). Then re-render docs/validation.md with
``python benchmarks/make_validation.py --from-stored``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zeroplanner.calibrate.peak import (PEAK_LAUNCHES, PEAK_RANKS, PEAK_STEPS, compact_results,  # noqa: E402
                                        measure_step_peaks, peak_error_fraction, step_peak_rows)

STORE = ROOT / "zeroplanner" / "_measurements" / "step_peaks.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="only print the stored rows against the prediction")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the launch")
    args = parser.parse_args(argv)
    if not args.print:
        import deepspeed
        import torch
        import transformers

        runs: dict = {}
        for launch in range(PEAK_LAUNCHES):
            for name, ranks in compact_results(measure_step_peaks(timeout_seconds=args.timeout), launch).items():
                runs.setdefault(name, []).extend(ranks)
        meta = {"measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                "machine": f"{platform.machine()} Linux, {PEAK_RANKS} CPU ranks (gloo), {PEAK_STEPS} steps, "
                           f"{PEAK_LAUNCHES} launches",
                "deepspeed": deepspeed.__version__, "torch": torch.__version__,
                "transformers": transformers.__version__,
                "method": "torch.profiler allocation events (zeroplanner/calibrate/_peak_worker.py)"}
        STORE.write_text(json.dumps({"meta": meta, "runs": runs}, indent=0))
        print(f"wrote {STORE.relative_to(ROOT)}")
    rows = step_peak_rows(json.loads(STORE.read_text()))
    for r in rows:
        ok = "" if abs(r["error"]) <= 0.05 and r["measured_phase"] == r["predicted_phase"] else "  <- outside 5%"
        print(f"{r['name']:24s} measured {r['measured_bytes'] / 2**20:7.2f} MiB in {r['measured_phase']:15s} "
              f"predicted {r['predicted_bytes'] / 2**20:7.2f} MiB in {r['predicted_phase']:15s} "
              f"{r['error']:+.1%}{ok}")
    print(f"headroom covering 90% of the rows: {peak_error_fraction(rows):.3f} of the predicted peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
