"""The seed article's recommendation table (../shared/seed/, the table near its end) must come out of the model.

| scenario                              | seed recommends              |
| small model (<3B), single GPU          | no ZeRO or stage 1           |
| medium model (7B-13B), several GPUs    | ZeRO-2                       |
| large model (>30B), limited resources  | ZeRO-3 + CPU offload         |
| high-performance cluster (IB/RDMA)     | ZeRO-3, all on GPU, no offload|
| QLoRA fine-tuning                      | ZeRO-1 or 2                  |

Each scenario is a concrete, typical setup; the planner evaluates every candidate (no lookup).
"""

from __future__ import annotations

import pytest

from zeroplanner import build_scenario, estimate, plan


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2-xl"])
def test_small_model_single_gpu(model):
    p = plan(build_scenario(model=model, gpus_per_node=1, seq_len=2048))
    assert p.fits
    assert p.choice.stage in (0, 1)
    assert (p.choice.offload_optimizer, p.choice.offload_param) == ("none", "none")
    assert any("Data-parallel degree 1" in r for r in p.reasons)


@pytest.mark.parametrize("model,gpus,seq", [
    ("qwen2.5-7b", 4, 2048), ("llama-2-7b", 4, 4096), ("mistral-7b", 8, 4096), ("llama-2-13b", 8, 2048),
    ("qwen2.5-7b", 4, 4096), ("llama-2-13b", 8, 4096),
])
def test_medium_model_multi_gpu(model, gpus, seq):
    """The seed says ZeRO-2. The step-time model, checked against measured runs (docs/validation.md section 5),
    says two things more, and this test states them:
    - ZeRO-1 may beat ZeRO-2: DeepSpeed 0.19.8's ZeRO-2 all-reduces its gradient buckets every micro-step (8 here)
      and runs a hook per parameter tensor; measured ZeRO-1 1.25-1.5x faster than ZeRO-2 on the same machine
      (shared/references/THROUGHPUT.md section 1). Both shard the optimizer states, both are 'not ZeRO-3'.
    - ZeRO-3 wins only by freeing enough memory to drop activation checkpointing (a third less compute) or to
      raise the micro-batch, at settings where ZeRO-1/2 do not fit; at equal settings ZeRO-3 is never more than the tolerance ahead of
      ZeRO-1/2 (measured ZeRO-3 2% slower than ZeRO-2 on Qwen2.5-14B, THROUGHPUT.md section 2)."""
    sc = build_scenario(model=model, gpus_per_node=gpus, seq_len=seq)
    p = plan(sc)
    assert p.fits
    assert p.choice.offload_optimizer == "none" and p.choice.offload_param == "none"
    if p.choice.stage == 3:
        c = p.choice
        assert c.checkpointing != "full"
        for st in (1, 2):
            # the pick's settings include overlap_comm (DeepSpeed's default is off below stage 3; on, ZeRO-1/2
            # hide their reductions behind the backward but hold the extra buckets: llama-2-13b at 2048 on 8 x
            # A100-80GB, ZeRO-2 with overlap needs 76.0 GiB against 75.2 usable, without it 75.0 but 16% slower)
            e = estimate(build_scenario(model=model, gpus_per_node=gpus, seq_len=seq, stage=st,
                                        checkpointing=c.checkpointing, micro_batch=c.micro_batch,
                                        grad_accum=c.grad_accum, overlap_comm=c.overlap_comm))
            # a fit below the model's error of the peak is not proven (llama-2-13b at 2048: ZeRO-2 leaves 7%)
            assert not e.fits_gpu or e.step_peak.risky, f"ZeRO-{st} fits the pick's settings, yet ZeRO-3 was picked"
    else:
        assert p.choice.stage in (1, 2)
    for ck in ("full", "none"):
        z3 = estimate(build_scenario(model=model, gpus_per_node=gpus, seq_len=seq, stage=3, checkpointing=ck))
        best12 = min(estimate(build_scenario(model=model, gpus_per_node=gpus, seq_len=seq, stage=st,
                                             checkpointing=ck)).step_seconds for st in (1, 2))
        assert z3.step_seconds > best12 * 0.9


def test_large_model_limited_resources():
    # Llama-2-70B full fine-tune on ONE node of 8 x A100-80GB (the seed: "8 x A100 ... 70B") with 2 TiB host RAM
    p = plan(build_scenario(model="llama-2-70b", gpus_per_node=8, cpu_memory_gib=2048, seq_len=4096))
    assert p.fits
    assert p.choice.stage == 3
    assert p.choice.offload_optimizer == "cpu"
    assert p.estimate.fits_cpu


def test_large_model_host_ram_short_goes_to_nvme_or_nothing():
    # same, with 512 GiB host RAM: CPU offload does not fit; the plan says so rather than pretending
    p = plan(build_scenario(model="llama-2-70b", gpus_per_node=8, cpu_memory_gib=512, seq_len=4096))
    if p.fits:
        assert "nvme" in (p.choice.offload_optimizer, p.choice.offload_param)
    else:
        assert "host RAM" in " ".join(p.warnings) or "Nothing fits" in p.warnings[0]


@pytest.mark.parametrize("model,network", [("llama-2-70b", "ib-ndr-8x"), ("llama-2-70b", "ib-hdr-8x"),
                                           ("qwen2.5-72b", "ib-ndr-8x")])
def test_infiniband_cluster(model, network):
    p = plan(build_scenario(model=model, gpu="H100-80GB", nodes=4, network=network, seq_len=4096))
    assert p.fits
    assert p.choice.stage == 3
    assert (p.choice.offload_optimizer, p.choice.offload_param) == ("none", "none")


@pytest.mark.parametrize("model,gpus", [("qwen2.5-7b", 2), ("llama-2-13b", 4), ("llama-2-70b", 4)])
def test_qlora(model, gpus):
    p = plan(build_scenario(model=model, gpus_per_node=gpus, lora_rank=64, qlora=True, seq_len=2048))
    assert p.fits
    assert p.choice.stage in (1, 2)
    assert (p.choice.offload_optimizer, p.choice.offload_param) == ("none", "none")
