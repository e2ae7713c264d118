#!/usr/bin/env bash
# One command on a CUDA machine: run zeroplanner's ground-truth calibration with NCCL and
# torch.cuda.max_memory_allocated, write the reports, and run the gpu-marked tests.
#
#   scripts/gpu_calibrate.sh [OUT_DIR]        (default: artifacts/gpu_calibrate)
#
# Without CUDA (or without torch/deepspeed) it says so and exits 0: nothing to calibrate here.
# Every launch is bounded (timeout); the ranks are min(2, visible GPUs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-artifacts/gpu_calibrate}"
PY="${PYTHON:-python}"

gpus=$("$PY" - <<'PY' 2>/dev/null | tail -n 1
import importlib.util
try:
    missing = [m for m in ("torch", "deepspeed", "transformers") if importlib.util.find_spec(m) is None]
    import torch
    print(0 if missing or not torch.cuda.is_available() else torch.cuda.device_count())
except Exception:
    print(0)
PY
)
case "$gpus" in ''|*[!0-9]*) gpus=0 ;; esac
if [ "${gpus:-0}" -lt 1 ]; then
  echo "gpu_calibrate: no CUDA device (or torch/deepspeed/transformers missing): skipped"
  exit 0
fi
ranks=$(( gpus < 2 ? gpus : 2 ))
mkdir -p "$OUT"
echo "gpu_calibrate: $gpus CUDA device(s); calibrating on $ranks rank(s) with NCCL into $OUT"
status=0
for stage in 0 1 2 3; do
  for extra in "" "--offload-optimizer cpu"; do
    if [ "$stage" = 0 ] && [ -n "$extra" ]; then continue; fi
    tag="stage${stage}${extra:+_offload}"
    # shellcheck disable=SC2086
    if timeout 900 "$PY" -m zeroplanner.cli calibrate --model llama-2-7b --stage "$stage" $extra \
        --grad-accum 1 --checkpointing none --ranks "$ranks" --steps 3 --device cuda --timeout 800 \
        --out "$OUT/raw_$tag" --json > "$OUT/$tag.json"; then
      "$PY" - "$OUT/$tag.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = {x["term"]: x for x in r["memory"] + r["communication"]}
ms = rows["model_states"]
print(f"{r['name']:>12} {sys.argv[1]}: model states predicted {ms['predicted']:.0f} measured {ms['measured']:.0f} "
      f"bytes/rank; cuda peaks {r.get('cuda')}")
PY
    else
      echo "gpu_calibrate: $tag failed (see $OUT/$tag.json and $OUT/raw_$tag/launcher.log)"; status=1
    fi
  done
done
timeout 1800 "$PY" -m pytest tests/test_gpu_calibrate.py -q -m gpu -p no:cacheprovider | tee "$OUT/pytest.txt" || status=1
exit $status
