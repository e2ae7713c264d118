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

from zeroplanner import build_scenario, plan


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-1.5b", "gpt2-xl"])
def test_small_model_single_gpu(model):
    p = plan(build_scenario(model=model, gpus_per_node=1, seq_len=2048))
    assert p.fits
    assert p.choice.stage in (0, 1)
    assert (p.choice.offload_optimizer, p.choice.offload_param) == ("none", "none")
    assert any("Data-parallel degree 1" in r for r in p.reasons)


@pytest.mark.parametrize("model,gpus,seq", [
    ("qwen2.5-7b", 4, 2048), ("llama-2-7b", 4, 4096), ("mistral-7b", 8, 4096), ("llama-2-13b", 8, 2048),
])
def test_medium_model_multi_gpu(model, gpus, seq):
    p = plan(build_scenario(model=model, gpus_per_node=gpus, seq_len=seq))
    assert p.fits
    assert p.choice.stage == 2
    assert p.choice.offload_optimizer == "none"


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
