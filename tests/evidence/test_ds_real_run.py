"""A real run: the config zeroplanner generates for a tiny Llama starts and completes 2 optimizer steps under DeepSpeed
on 2 CPU ranks (gloo), once per ZeRO stage 0-3 (one launch per stage).

Each launch spawns the two ranks directly (RANK/WORLD_SIZE/MASTER_* environment, as torchrun would set them) to
skip the launcher's own torch import; on the shared 2-core machine one launch took 20-35 s, nearly all of it
importing torch/deepspeed/transformers (measured: import 17 s, initialize + 2 steps < 2 s at load average 8.7).

The only change to DeepSpeed's defaults is ``to_deepspeed_config(..., torch_adam=True)``: FusedAdam's op is
JIT-compiled on first use, which took 3.5 minutes on this machine (measured once); torch's AdamW avoids it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from zeroplanner import catalog
from zeroplanner.calibrate import wait_or_kill
from zeroplanner.deepspeed import to_deepspeed_config
from zeroplanner.catalog.hfconfig import architecture_from_hf_config
from zeroplanner.specs import ClusterSpec, Scenario, TrainingSpec, ZeroSpec

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

pytestmark = pytest.mark.engine

TINY_LLAMA = {
    "model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False,
}
SEQ_LEN = 16
LAUNCH_TIMEOUT_SECONDS = 120

WORKER = r'''
import json, os, sys, time
t0 = time.time()
import torch
import deepspeed
from transformers import LlamaConfig, LlamaForCausalLM

cfg_path, model_path, out_path, seq_len = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
config = json.load(open(cfg_path))
model_cfg = json.load(open(model_path))
model_cfg.pop("model_type")
deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ["RANK"])
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(**model_cfg))
n_params = sum(p.numel() for p in model.parameters())
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
micro = engine.train_micro_batch_size_per_gpu()
g = torch.Generator().manual_seed(rank)
losses = []
for _ in range(2 * engine.gradient_accumulation_steps()):
    ids = torch.randint(0, model_cfg["vocab_size"], (micro, seq_len), generator=g)
    loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
result = {"rank": rank, "stage": int(engine.zero_optimization_stage()), "global_steps": int(engine.global_steps),
          "world_size": int(engine.world_size), "train_batch_size": int(engine.train_batch_size()),
          "micro_batch": int(micro), "bf16": bool(engine.bfloat16_enabled()), "losses": losses,
          "parameters": int(n_params), "seconds": time.time() - t0}
with open(out_path + ".rank" + str(rank), "w") as fh:
    json.dump(result, fh)
from zeroplanner.calibrate import end_rank
end_rank(0)  # barrier, then os._exit: skips the teardown that once aborted a ZeRO-3 rank (see end_rank)
'''


def tiny_scenario(stage: int) -> Scenario:
    return Scenario(
        model=architecture_from_hf_config(TINY_LLAMA, name="tiny-llama"),
        cluster=ClusterSpec(gpu=catalog.gpu("A100-80GB"), network=catalog.network("ib-hdr"), gpus_per_node=2,
                            nodes=1),
        training=TrainingSpec(precision="bf16", micro_batch=2, grad_accum=1, seq_len=SEQ_LEN),
        zero=ZeroSpec(stage=stage),
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(tmp_path, stage: int) -> list[dict]:
    s = tiny_scenario(stage)
    cfg_path = tmp_path / f"ds_stage{stage}.json"
    cfg_path.write_text(json.dumps(to_deepspeed_config(s, torch_adam=True)))
    model_path = tmp_path / "model.json"
    model_path.write_text(json.dumps(TINY_LLAMA))
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    out = tmp_path / f"result{stage}"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false")
        log = open(tmp_path / f"stage{stage}.rank{rank}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, str(worker), str(cfg_path), str(model_path), str(out), str(SEQ_LEN)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    wait_or_kill(procs, LAUNCH_TIMEOUT_SECONDS)
    results = []
    for rank, (proc, _) in enumerate(procs):
        log_text = (tmp_path / f"stage{stage}.rank{rank}.log").read_text()[-3000:]
        assert proc.returncode == 0, f"stage {stage} rank {rank} exit {proc.returncode}:\n{log_text}"
        results.append(json.loads((tmp_path / f"result{stage}.rank{rank}").read_text()))
    return results


@pytest.mark.timeout(4 * LAUNCH_TIMEOUT_SECONDS + 30)
def test_generated_config_trains_two_steps_for_each_stage(tmp_path):
    started = time.monotonic()
    timings = {}
    for stage in range(4):
        t0 = time.monotonic()
        results = _launch(tmp_path, stage)
        timings[stage] = time.monotonic() - t0
        s = tiny_scenario(stage)
        for r in results:
            assert r["stage"] == stage
            assert r["global_steps"] == 2  # two optimizer steps completed
            assert r["world_size"] == 2 and r["train_batch_size"] == s.global_batch_size
            assert r["micro_batch"] == s.training.micro_batch and r["bf16"] is True
            assert len(r["losses"]) == 2 and all(0 < x < 100 for x in r["losses"])
            # the cost model's exact parameter count is the instantiated model's (before ZeRO-3 partitioning)
            assert r["parameters"] == s.parameters
    print("seconds per launch:", {k: round(v, 1) for k, v in timings.items()},
          "total", round(time.monotonic() - started, 1))
