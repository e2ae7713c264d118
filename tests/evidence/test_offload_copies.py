"""Optimizer offload's host<->device gradient copies per step, counted in DeepSpeed's own code on 2 CPU ranks, against
the step-time model's ``t_gh`` (costmodel/evaluate.py step_terms).

What DeepSpeed 0.19.8 copies (read in runtime/zero/stage_1_and_2.py and stage3.py):

- ZeRO-1/2 (``copy_grads_in_partition``): with more than one backward per step, every micro-step's gradient of each
  parameter in the rank's partition goes to a host buffer of the parameter's 16-bit dtype
  (``async_accumulate_grad_in_cpu_via_gpu``: from the second micro-step on the host buffer first comes back to the
  GPU, is added there, and goes out again); at the accumulation boundary the partition's slice goes once more, as
  fp32, into the optimizer's host gradient (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``). With one
  backward per step only that fp32 copy is made.
- ZeRO-3 (``partition_grads``): the gradient partition's accumulation buffer (gradient_accumulation_dtype) lives
  on the host; micro-step 0 copies the reduced partition there and moves the buffer back to the GPU ("ensure grad
  buffer is a CUDA buffer"), later micro-steps bring it to the GPU, add and copy it back ("adding directly to cpu
  is very slow"), and at the boundary ``_offload_grad_partition_at_boundary`` copies it, as fp32, into the
  optimizer's host gradient. On a CPU rank the buffer is already "on the accelerator" and DeepSpeed adds in
  place, so this test counts the elements, micro-steps and boundaries that reach ``partition_grads``; the bytes
  per element and direction are the GPU branch's.

The counts are taken by wrapping those DeepSpeed methods (the engine's own calls, not a replay); each rank's
partition holds whole parameters that straddle its boundary, so the per-rank element count exceeds Ψ/N_d by at
most the largest parameter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from zeroplanner import catalog
from zeroplanner.catalog.hfconfig import architecture_from_hf_config
from zeroplanner.costmodel import Candidates, make_context
from zeroplanner.costmodel.evaluate import step_terms
from zeroplanner.specs import ClusterSpec, Scenario, TrainingSpec, ZeroSpec

TINY_LLAMA = {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "tie_word_embeddings": False}
"""tests/evidence/test_zero3_collective_count.py's tiny Llama (copied: that module skips without DeepSpeed)."""
SEQ_LEN = 16

RUNS = {f"z{stage}-ga{ga}": (stage, ga) for stage in (1, 2, 3) for ga in (1, 3)}

WORKER = r'''
import json, os, sys
import torch, deepspeed
import deepspeed.comm as dist
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from transformers import AutoConfig, AutoModelForCausalLM

plan = json.load(open(sys.argv[1]))
deepspeed.init_distributed(dist_backend="gloo")
rank = int(os.environ["RANK"])
log = []

def esize(t):
    return torch.empty((), dtype=t).element_size()

acc_orig = DeepSpeedZeroOptimizer.async_accumulate_grad_in_cpu_via_gpu
def acc(self, param):
    n, e = param.numel(), esize(param.dtype)
    if self.micro_step_id > 0:
        log.append(("h2d", n * e))
    log.append(("d2h", n * e))
    return acc_orig(self, param)
DeepSpeedZeroOptimizer.async_accumulate_grad_in_cpu_via_gpu = acc

fp32_orig = DeepSpeedZeroOptimizer.async_inplace_copy_grad_to_fp32_buffer_from_gpu
def fp32(self, param):
    i, _, _, num = self.grad_position[self.get_param_id(param)]
    log.append(("d2h", num * esize(self.single_partition_of_fp32_groups[i].dtype)))
    return fp32_orig(self, param)
DeepSpeedZeroOptimizer.async_inplace_copy_grad_to_fp32_buffer_from_gpu = fp32

pg_orig = DeepSpeedZeroOptimizer_Stage3.partition_grads
def pg(self, params, parts):
    bufs = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
    for p, g in zip(params, parts):
        if p.partition_numel() * self._get_param_partition_rank(p) >= p.ds_numel:
            continue
        b = g.numel() * esize(bufs[p.ds_id].dtype)
        # the GPU branch: micro-step 0 copies the partition out and moves the host buffer back to the GPU
        # ("ensure grad buffer is a CUDA buffer"); later ones bring it in, add, and copy it out again
        log.append(("h2d", b))
        log.append(("d2h", b))
        if self.is_gradient_accumulation_boundary():  # _offload_grad_partition_at_boundary: fp32 to the host
            log.append(("d2h", g.numel() * esize(self.fp32_partitioned_groups_flat[0].dtype)))
    return pg_orig(self, params, parts)
DeepSpeedZeroOptimizer_Stage3.partition_grads = pg

out = {}
for run in plan["runs"]:
    hf = dict(plan["hf_config"]); mt = hf.pop("model_type")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(mt, **hf))
    ga = run["ga"]
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": ga, "steps_per_print": 10**9,
           "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": run["stage"], "offload_optimizer": {"device": "cpu"},
                                 "stage3_param_persistence_threshold": 0}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    gen = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(plan["steps"]):
        log.clear()
        for _ in range(ga):
            ids = torch.randint(0, hf["vocab_size"], (1, plan["seq_len"]), generator=gen)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        steps.append({"d2h": sum(b for k, b in log if k == "d2h"), "h2d": sum(b for k, b in log if k == "h2d")})
    out[run["key"]] = steps
    engine.destroy()
    dist.barrier()
with open(plan["out"] + ".rank" + str(rank), "w") as fh:
    json.dump(out, fh)
from zeroplanner.calibrate import end_rank
end_rank(0)
'''

MEASURED = {"z1-ga1": (361_728, 0), "z1-ga3": (361_728, 0), "z2-ga1": (361_728, 0), "z2-ga3": (928_896, 378_112),
            "z3-ga1": (542_592, 180_864), "z3-ga3": (904_320, 542_592)}
"""Bytes per step summed over both ranks, {run: (to the host, from the host)}, counted by WORKER on 2 CPU ranks
(DeepSpeed 0.19.8, torch 2.13.0 CPU, gloo, bf16; steps 2 and 3 of 3 alike; 2026-12-04). The tiny Llama has
Ψ = 90,432 parameters: ZeRO-1 (any accumulation) and single-backward ZeRO-2 copy 4Ψ (the fp32 partition);
ZeRO-2 at GA 3 copies 3 x 2 x 94,528 + 4Ψ out and 2 x 2 x 94,528 in (94,528: the whole parameters in the
partitions, one 4,096-element projection straddling the edge); ZeRO-3 copies 2Ψ (its 16-bit accumulation buffer)
out and in per micro-step and 4Ψ out at the boundary."""


def scenario(stage: int, ga: int) -> Scenario:
    return Scenario(
        model=architecture_from_hf_config(TINY_LLAMA, name="tiny-llama"),
        cluster=ClusterSpec(gpu=catalog.gpu("A100-80GB"), network=catalog.network("ib-hdr"), gpus_per_node=2),
        training=TrainingSpec(precision="bf16", micro_batch=1, grad_accum=ga, seq_len=SEQ_LEN,
                              checkpointing="none"),
        zero=ZeroSpec(stage=stage, offload_optimizer={"device": "cpu"}, stage3_param_persistence_threshold=0),
    )


def predicted_bytes(stage: int, ga: int) -> float:
    """The model's gradient copy bytes per step summed over the 2 ranks: (t_gh per micro-step x GA + the
    boundary's t_b32) x PCIe x N_d."""
    sc = scenario(stage, ga)
    v = step_terms(make_context(sc), Candidates.from_scenario(sc)).values
    return float(((v["t_gh"] * v["GA"] + v["t_b32"]) * v["BW_pcie"] * v["N_d"]).item())


STRADDLE = {"z2-ga3": (2 * 3 - 1) * 2 * 4_096}
"""Bytes the engine copies beyond Ψ/N_d per rank: ZeRO-2's 16-bit copies take whole parameters, and one 64 x 64
projection (4,096 elements) straddles the two partitions, so it is copied by both ranks in each of the 2GA - 1
16-bit copies; every other run's copies are exactly partition-sized."""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    pytest.importorskip("deepspeed")
    from tests.evidence.test_zero3_collective_count import _free_port

    tmp = tmp_path_factory.mktemp("offload_copies")
    runs = [{"key": k, "stage": s, "ga": ga} for k, (s, ga) in RUNS.items()]
    plan_path = tmp / "plan.json"
    plan_path.write_text(json.dumps({"runs": runs, "steps": 3, "seq_len": SEQ_LEN, "hf_config": TINY_LLAMA,
                                     "out": str(tmp / "out")}))
    (tmp / "worker.py").write_text(WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--no_local_rank",
           "--master_port", str(_free_port()), str(tmp / "worker.py"), str(plan_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    outs = [json.loads((tmp / f"out.rank{r}").read_text()) for r in range(2)]
    return {k: [(sum(o[k][s]["d2h"] for o in outs), sum(o[k][s]["h2d"] for o in outs)) for s in (1, 2)]
            for k in RUNS}


@pytest.mark.engine
@pytest.mark.timeout(660)
def test_offload_gradient_copies_match_deepspeed(measured):
    """Every stage x accumulation: the bytes DeepSpeed copies per step equal the stored MEASURED counts (steps 2 and
    3 alike), and the model's t_gh and t_b32 price them up to the one straddling parameter (STRADDLE)."""
    for key, steps in measured.items():
        assert steps[0] == steps[1], (key, steps)
        assert tuple(steps[0]) == MEASURED[key], (key, steps[0])


@pytest.mark.parametrize("key", sorted(RUNS))
def test_model_prices_the_counted_copies(key):
    """(t_gh x GA + t_b32) x BW_pcie x N_d (the model) against the bytes counted in DeepSpeed (MEASURED, both
    directions)."""
    stage, ga = RUNS[key]
    d2h, h2d = MEASURED[key]
    assert d2h + h2d == predicted_bytes(stage, ga) + STRADDLE.get(key, 0)
