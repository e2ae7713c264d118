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
# The multi-node path on this machine's GPUs with NCCL: 2 pretend nodes (ZEROPLANNER_NODE_ID) of
# gpus/2 ranks each (CUDA_VISIBLE_DEVICES split between them), torchrun's c10d rendezvous on 127.0.0.1, each rank
# running 'zeroplanner calibrate --distributed' (collectives per level + DeepSpeed steps across all ranks); rank 0
# writes cluster_2nodes.json/.txt. On one machine NCCL's "inter-node" level goes over NVLink/PCIe, not a NIC.
if [ "$gpus" -ge 2 ]; then
  per=$(( gpus / 2 ))
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pids=()
  for node in 0 1; do
    first=$(( node * per ))
    devs=$(seq -s, "$first" $(( first + per - 1 )))
    CUDA_VISIBLE_DEVICES="$devs" ZEROPLANNER_NODE_ID="node$node" timeout 600 "$PY" -m torch.distributed.run \
      --nnodes 2 --nproc-per-node "$per" --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
      --rdzv-id zeroplanner-gpu --local-addr 127.0.0.1 -m zeroplanner.cli calibrate --distributed --device cuda \
      --model gpt2 --steps 3 --budget-seconds 30 --rendezvous-timeout 120 -o "$OUT/cluster_2nodes.json" \
      > "$OUT/cluster_node$node.log" 2>&1 &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  if [ -f "$OUT/cluster_2nodes.txt" ]; then cat "$OUT/cluster_2nodes.txt"; else
    echo "gpu_calibrate: the 2-node NCCL run wrote no report (see $OUT/cluster_node*.log)"; status=1; fi
else
  echo "gpu_calibrate: 1 GPU: the 2-node NCCL run needs 2 (skipped)"
fi
timeout 1800 "$PY" -m pytest tests/evidence/test_gpu_calibrate.py tests/evidence/test_cluster_launch.py -q -m gpu \
  -p no:cacheprovider | tee "$OUT/pytest.txt" || status=1
exit $status
