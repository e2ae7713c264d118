#!/usr/bin/env bash
# Probe checks for a CUDA machine: the inventory and micro-benchmarks for real, the gpu-marked tests,
# and the planner fed with the measured cluster. Without CUDA it says so and exits 0 (the gpu tests skip).
#
#   scripts/gpu_probe.sh   # writes artifacts/gpu_probe/{probe.json,probe.txt,pytest.txt,estimate*.json,calibration.json}
#   OUT=/tmp/x scripts/gpu_probe.sh
#
# Every step is bounded with timeout(1); total under 10 minutes on one 8-GPU node (probe about 1-2 min,
# gpu tests 2-4 min, calibration 1-3 min).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-artifacts/gpu_probe}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PY" -m zeroplanner.probe | tee "$OUT/probe.txt"
    echo "no CUDA device: nothing to measure here; the gpu-marked tests skip"
    exit 0
fi

status=0
command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
command -v nvidia-smi >/dev/null && timeout 30 nvidia-smi topo -m > "$OUT/nvidia-smi-topo.txt" 2>&1

echo "== probe with benchmarks (matmul, host<->device, collectives)"
timeout 300 "$PY" -m zeroplanner.probe --benchmarks --json --budget-seconds 60 > "$OUT/probe.json" || status=1
"$PY" - "$OUT/probe.json" <<'PYEOF' | tee "$OUT/probe.txt"
import json, sys
from zeroplanner.cli.probe import format_text
print(format_text(json.load(open(sys.argv[1]))))
PYEOF

echo "== gpu-marked tests"
timeout 600 "$PY" -m pytest tests/evidence/test_probe.py tests/evidence/test_cluster_launch.py -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== planner on the catalog cluster vs the measured one (7B, this node)"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
timeout 60 "$PY" -m zeroplanner.cli estimate --gpus-per-node "$GPUS" --json > "$OUT/estimate_catalog.json" || status=1
timeout 60 "$PY" -m zeroplanner.cli estimate --gpus-per-node "$GPUS" --cluster-from "$OUT/probe.json" --json \
    > "$OUT/estimate_measured.json" || status=1
"$PY" - "$OUT" <<'PYEOF'
import json, sys
for name in ("catalog", "measured"):
    e = json.load(open(f"{sys.argv[1]}/estimate_{name}.json"))
    print(f"{name:9s} step {e['step_seconds']:.3f} s, communication {e['communication']['seconds_per_step']:.3f} s, "
          f"per-GPU total {e['per_gpu_bytes']['total'] / 2**30:.1f} GiB of {e['gpu_memory_bytes'] / 2**30:.1f} GiB")
PYEOF
echo "== calibration run on the GPUs (tiny model of the default architecture, DeepSpeed + NCCL) vs the cost model"
timeout 400 "$PY" - "$OUT" "$GPUS" <<'PYEOF' || status=1
import json, sys
from zeroplanner import calibrate
from zeroplanner.calibrate.fits import fit_from_calibration
from zeroplanner.probe import load_probe
from zeroplanner.scenarios import default_scenario
out, gpus = sys.argv[1], int(sys.argv[2])
report = calibrate.run_calibration(default_scenario(), ranks=min(2, gpus), steps=3, device="cuda",
                                   timeout_seconds=360)
print(report.table())
fit = fit_from_calibration([report], probe=load_probe(f"{out}/probe.json"))
json.dump({"report": report.model_dump(), "fit": fit}, open(f"{out}/calibration.json", "w"), indent=1)
mem, run = fit["memory"][0], fit["runs"][0]
print(f"peak allocated: measured {mem['measured_peak_allocated_bytes']:,} B, predicted "
      f"{mem['predicted_bytes_without_overhead']:,} B ({100 * mem['relative_error']:+.1f}%)")
print(f"step: measured {run['measured_step_seconds']:.4f} s, predicted {run['predicted_step_seconds_before']:.4f} s "
      f"at MFU {fit['mfu_default']}, fitted MFU {fit['mfu']:.3g} (tiny model); {fit['note']}")
PYEOF
echo "artifacts in $OUT; exit $status"
exit $status
