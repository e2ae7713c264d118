"""Ulysses sequence parallelism and ALST's memory savings inside evaluate and the planner (issue 13).

References: the engine-checked formulas of zeroplanner/costmodel/ulysses.py (measured on DeepSpeed 0.19.8 CPU
ranks, tests/evidence/test_ulysses_engine.py; the measured figures are repeated in tests/core/test_ulysses_formulas.py),
DeepSpeed 0.19.8 ``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` (TiledMLP, TiledFusedLogitsLoss), the
transformers Trainer / ArcticTraining tiled-loss shard rule (1 GiB of fp32 logits per shard) and ArcticTraining's own
checkpoint-offload figure ("llama 8b at 800k (100k effective per gpu) will save 24GB per gpu:
((100_000*4096)*2*32/2**30)", arctic_training/trainer/trainer.py).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from zeroplanner.costmodel import Candidates, estimate, evaluate, make_context
from zeroplanner.costmodel import ulysses as U
from zeroplanner.costmodel.activations import activation_term, loss_chunk_tokens
from zeroplanner.costmodel.communication import ulysses_terms
from zeroplanner.costmodel.memory import host_parts
from zeroplanner.scenarios import build_scenario

# TINY_ULYSSES_LLAMA (zeroplanner/calibrate/ulysses.py) as an HF config, the model the engine test runs
HF_TINY = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 1024, "tie_word_embeddings": False}
ARCH = {"n_layers": 2, "hidden_size": 128, "n_heads": 4, "kv_heads": 2, "head_dim": 32, "ffn_size": 256,
        "vocab_size": 512}


def tiny(sp: int, s: int, b: int, checkpointing: str = "none", **kw):
    return build_scenario(hf_config=HF_TINY, gpus_per_node=4, sequence_parallel_size=sp, seq_len=s, micro_batch=b,
                          grad_accum=1, checkpointing=checkpointing, **kw)


@pytest.mark.parametrize("sp, s, b, measured", [(2, 256, 1, 1729052 + 131072), (4, 256, 1, 897324 + 65536),
                                                (2, 1024, 2, 13832220 + 1048576), (4, 1024, 2, 7178284 + 524288)])
def test_activations_per_gpu_are_the_engine_measured_ulysses_bytes(sp, s, b, measured):
    """The generalised activation term at sp > 1 is the engine-checked llama layout: the census measured on DeepSpeed
    CPU ranks (test_ulysses_formulas.py figures, less the loss aggregation's 8(P+1)+4 bytes of scalars)."""
    sc = tiny(sp, s, b)
    got = float(activation_term(make_context(sc), Candidates.from_scenario(sc)).value.item())
    assert got == pytest.approx(float(U.activation_bytes_per_rank(seq_len=s, micro_batch=b, sp_size=sp,
                                                                  **ARCH)["total"]), rel=1e-12)
    assert got == pytest.approx(measured - (8 * (sp + 1) + 4), rel=1e-12)


@pytest.mark.parametrize("sp", [2, 4])
@pytest.mark.parametrize("s, b", [(256, 1), (1024, 2)])
def test_checkpointed_activations_are_the_ulysses_formula(sp, s, b):
    sc = tiny(sp, s, b, "full")
    got = float(activation_term(make_context(sc), Candidates.from_scenario(sc)).value.item())
    want = U.activation_bytes_per_rank(seq_len=s, micro_batch=b, sp_size=sp, checkpointing="full", **ARCH)["total"]
    assert got == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize("sp, ckpt", [(2, "none"), (4, "none"), (2, "full"), (4, "full")])
def test_all_to_all_volume_is_the_measured_count(sp, ckpt):
    sc = tiny(sp, 256, 1, ckpt)
    cand = Candidates.from_scenario(sc)
    got = ulysses_terms(make_context(sc), cand)
    want = U.all_to_all_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=sp, n_heads=4, kv_heads=2,
                                       head_dim=32, recompute_forward=ckpt == "full")
    assert float(got["a2a_message_bytes_micro"].item()) == float(want["message_total"])
    assert float(got["a2a_calls_micro"].item()) == float(want["count"])
    if (sp, ckpt) == (2, "none"):  # measured: 196608 B forward + 196608 B backward in 16 calls
        assert float(got["a2a_message_bytes_micro"].item()) == 393216
    est = estimate(sc)
    assert est.communication.by_collective["all_to_all"] == int(want["message_total"])
    assert est.sp_all_to_all_seconds_per_step > 0


def test_all_to_all_runs_over_nvlink_inside_a_node_and_the_nics_across_nodes():
    """Bandwidth term: (P-1)/P of the message over the GPU's busbw inside a node, over min(busbw, the node's NICs)
    across nodes (nccl-tests PERFORMANCE.md: alltoall's busbw factor (n-1)/n)."""
    kw = dict(model="llama-3.1-8b", seq_len=1_048_576, checkpointing="full", micro_batch=1, grad_accum=1)
    inside = build_scenario(gpus_per_node=8, nodes=2, network="eth-25g", sequence_parallel_size=8, **kw)
    across = build_scenario(gpus_per_node=8, nodes=2, network="eth-25g", sequence_parallel_size=16, **kw)
    for sc, p, cross in ((inside, 8, False), (across, 16, True)):
        ctx = make_context(sc)
        t = ulysses_terms(ctx, Candidates.from_scenario(sc))
        bw = min(ctx.intra_busbw, ctx.node_nic_busbw) if cross else ctx.intra_busbw
        bandwidth_part = float(t["a2a_message_bytes_micro"].item()) * (p - 1) / p / bw
        assert float(t["seconds_micro"].item()) == pytest.approx(bandwidth_part, rel=0.02)
    assert estimate(across).sp_all_to_all_seconds_per_step > 10 * estimate(inside).sp_all_to_all_seconds_per_step


def test_zero_shards_over_the_world_and_the_batch_over_world_over_sp():
    """ZeRO's group is the sequence-data-parallel world (ulysses.zero_shard_degree, measured); train_batch_size =
    micro x accumulation x world / sp; FLOPs per GPU = FLOPs per token x the GPU's s/P tokens."""
    kw = dict(model="llama-3.1-8b", seq_len=65536, gpus_per_node=8, stage=3, micro_batch=1, grad_accum=2)
    one, eight = build_scenario(**kw), build_scenario(sequence_parallel_size=8, **kw)
    e1, e8 = estimate(one), estimate(eight)
    for k in ("parameters", "gradients", "optimizer_states"):
        assert getattr(e8.per_gpu_bytes, k) == getattr(e1.per_gpu_bytes, k)
    assert e8.data_parallel_degree == U.zero_shard_degree(world_size=8, sp_size=8) == 8
    assert eight.global_batch_size == 1 * 2 * 8 // 8 and one.global_batch_size == 16
    assert e8.tokens_per_second * e8.step_seconds == pytest.approx(2 * 65536)
    flops1 = e1.tflops_per_gpu * e1.step_seconds
    assert e8.tflops_per_gpu * e8.step_seconds == pytest.approx(flops1 / 8, rel=1e-12)


def test_checkpoint_offload_moves_the_layer_inputs_to_host_ram():
    # ArcticTraining's figure: Llama 8B at 800k tokens over 8 GPUs (100k per GPU) offloads 24.4 GiB per GPU
    kw = dict(model="llama-3.1-8b", seq_len=800_000, gpus_per_node=8, sequence_parallel_size=8, micro_batch=1,
              grad_accum=1, stage=3)
    off, on = build_scenario(checkpoint_offload=True, **kw), build_scenario(**kw)
    ctx = make_context(off)
    host = host_parts(ctx, Candidates.from_scenario(off)).sum_of(["offloaded activation checkpoints"])
    assert float(host.item()) / 8 == 100_000 * 4096 * 2 * 32
    assert round(float(host.item()) / 8 / 2**30, 1) == 24.4
    e_off, e_on = estimate(off), estimate(on)
    assert e_on.per_gpu_bytes.activations - e_off.per_gpu_bytes.activations == 31 * 100_000 * 4096 * 2
    # both directions over PCIe, blocking (ArcticTraining: "isn't yet efficient (blocking)")
    assert e_off.checkpoint_offload_seconds_per_step == pytest.approx(2 * 32 * 100_000 * 4096 * 2
                                                                      / ctx.pcie_bytes_per_second)
    assert e_off.step_seconds > e_on.step_seconds


def test_tiled_loss_keeps_one_chunk_of_about_one_gib_of_fp32_logits():
    # 131072 tokens x 128256 vocab x 4 B = 62.6 GiB -> 63 shards of ceil(131072 / 63) = 2081 tokens
    kw = dict(model="llama-3.1-8b", seq_len=131072, gpus_per_node=8, micro_batch=1, grad_accum=1)
    tiled, plain = build_scenario(tiled_loss=True, **kw), build_scenario(**kw)
    ctx = make_context(tiled)
    cand = Candidates.from_scenario(tiled)
    assert math.ceil(131072 * 128256 * 4 / 2**30) == 63
    assert float(loss_chunk_tokens(ctx, cand).item()) == 2081
    parts = activation_term(ctx, cand)
    got = float(parts.sum_of(["one loss chunk's logits + fp32 log-softmax, lm_head input gradient (tiled loss)"]).item())
    assert got == (2 + 4) * 2081 * 128256 + 2 * 131072 * 4096
    plain_logits = float(activation_term(make_context(plain), Candidates.from_scenario(plain))
                         .sum_of(["logits + fp32 log-softmax"]).item())
    assert plain_logits == (2 + 4) * 131072 * 128256


def test_tiled_mlp_keeps_one_tile_of_mlp_intermediates():
    # DeepSpeed TiledMLP: num_shards = ceil(seqlen / hidden) on the local 16384 tokens -> 4 tiles of 4096 tokens;
    # SwiGLU saves 4 tensors of ffn_size (14336) per token; full checkpointing: one layer's MLP is recomputed
    kw = dict(model="llama-3.1-8b", seq_len=131072, gpus_per_node=8, sequence_parallel_size=8, micro_batch=1,
              grad_accum=1)
    tiled, plain = estimate(build_scenario(tiled_mlp=True, **kw)), estimate(build_scenario(**kw))
    t_local, f = 16384, 14336
    assert plain.per_gpu_bytes.activations - tiled.per_gpu_bytes.activations == 4 * 2 * (t_local - 4096) * f
    assert tiled.compute_seconds_per_step > plain.compute_seconds_per_step  # the MLP forward runs again


@pytest.mark.parametrize("kw, match", [
    (dict(model="llama-3.1-8b", gpus_per_node=3, sequence_parallel_size=3),
     "sequence_parallel_size=3 must divide the attention heads"),
    (dict(hf_config={**HF_TINY, "num_attention_heads": 24, "num_key_value_heads": 4, "hidden_size": 768},
          gpus_per_node=6, sequence_parallel_size=6), "sequence_parallel_size=6 and kv_heads=4"),
    (dict(model="llama-3.1-8b", sequence_parallel_size=2, seq_len=1001), "pad to 1002"),
    (dict(model="llama-3.1-8b", sequence_parallel_size=2, flash_attention=False), "needs flash_attention"),
    (dict(model="llama-3.1-8b", checkpoint_offload=True, checkpointing="selective"),
     "checkpoint_offload needs checkpointing='full'"),
    (dict(model="llama-3.1-8b", gpus_per_node=8, sequence_parallel_size=16), "sequence_parallel_size=16"),
])
def test_bad_long_context_combinations_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        build_scenario(**kw)


def _cli(*args):
    r = subprocess.run([sys.executable, "-m", "zeroplanner.cli", *args], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def test_recommend_finds_ulysses_for_128k_and_says_why():
    rc, out, err = _cli("recommend", "--model", "llama-3.1-8b", "--seq-len", "131072", "--gpus-per-node", "8",
                        "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["fits"] and d["choice"]["sequence_parallel_size"] > 1
    assert "sequence parallelism" in d["varied"]
    text = " ".join(d["reasons"])
    assert "with sequence_parallel_size=1 nothing fits" in text and "activations" in text
    # the smallest degree that fits without offload is picked (ranking: smaller degree among equals, offload last);
    # 2 does not fit, 4 only with offload: the loss backward holds 12 bytes per logit (the fp32 log-softmax, its
    # gradient in and out: 32,768 local tokens x 128,256 x 12 B = 47 GiB; costmodel/timeline.py, measured in
    # docs/validation.md section 9)
    assert "with sequence_parallel_size=2 nothing fits" in text and d["choice"]["sequence_parallel_size"] == 8
    assert "With sequence_parallel_size=4 only candidates with offload fit" in text
    assert "Ulysses sequence parallelism over" in text
    assert d["longest_sequence"]["ZeRO-3"]["seq_len"] >= 131072


def test_recommend_with_sp_held_at_1_explains_the_activations():
    rc, out, err = _cli("recommend", "--model", "llama-3.1-8b", "--seq-len", "131072", "--gpus-per-node", "8",
                        "--sequence-parallel-size", "1", "--json")
    assert rc == 1, err
    d = json.loads(out)
    assert not d["fits"] and d["held"] == {"sequence_parallel_size": 1}
    first = d["warnings"][0]
    assert "activations" in first and "logits" in first and "--sequence-parallel-size" in first
    assert d["without_held"]["fits"] and d["without_held"]["choice"]["sequence_parallel_size"] > 1


def test_short_sequences_do_not_search_sp():
    from zeroplanner.planner import plan

    p = plan(build_scenario())
    assert p.choice.sequence_parallel_size == 1 and "sequence parallelism" not in p.varied


def test_longest_sequence_is_the_fit_boundary():
    from zeroplanner.planner import longest_sequence

    sc = build_scenario(model="llama-3.1-8b", gpus_per_node=8, tiled_loss=True)
    res = longest_sequence(sc)
    r = res["ZeRO-3 + CPU optimizer"]
    assert r["seq_len"] > 0 and r["seq_len"] % 1024 == 0
    at = build_scenario(model="llama-3.1-8b", gpus_per_node=8, tiled_loss=True, seq_len=r["seq_len"], stage=3,
                        offload_optimizer="cpu", sequence_parallel_size=r["sequence_parallel_size"])
    assert estimate(at).fits
    beyond = build_scenario(model="llama-3.1-8b", gpus_per_node=8, tiled_loss=True, stage=3,
                            offload_optimizer="cpu", sequence_parallel_size=8,
                            seq_len=int(r["seq_len"] * (1 + 2 / 64)) // 1024 * 1024 + 1024)
    assert not estimate(beyond).fits
    assert res["ZeRO-0"]["seq_len"] < r["seq_len"]
    with pytest.raises(ValueError, match="sp_values"):
        longest_sequence(sc, sp_values=[3])


def test_sweep_and_candidates_default_to_no_sequence_parallelism():
    sc = build_scenario()
    cand = Candidates.build(stage=2, offload_optimizer=0, offload_param=0, checkpointing=2, micro_batch=1,
                            grad_accum=8, nodes=1, hpz=1, qwz=0, qgz=0, overlap=-1, reduce_bucket=500_000_000)
    assert int(cand.sp.item()) == 1
    v = evaluate(make_context(sc), cand)
    assert float(v.step_seconds.item()) == estimate(sc).step_seconds
    assert int(v.sequence_parallel_size.item()) == 1 and float(v.sp_all_to_all_seconds_per_step.item()) == 0.0
    assert float(v.communication.all_to_all.item()) == 0.0  # no split: the long-context figures are 1 and 0
    assert np.isfinite(float(v.tokens_per_second.item()))


def test_ulysses_is_refused_for_recurrent_mixers_and_never_searched():
    """DeepSpeed's UlyssesSPAttentionHF replaces the attention function only; Nemotron-H's Mamba-2 layers (and
    Qwen3-Next's Gated DeltaNet) would scan 1/sp of the sequence each (new-user review: the planner picked
    "Ulysses SP 8" for nemotron-3-nano at 131,072 tokens)."""
    from zeroplanner.catalog.hfconfig import architecture_from_hf_config
    from zeroplanner.planner import plan, sequence_parallel_options

    from tests.helpers import HF_CONFIGS

    arch = architecture_from_hf_config(HF_CONFIGS / "nemotron-3-nano-30b-a3b.json")
    assert arch.linear_mixer is not None and arch.linear_mixer.kind == "mamba2"
    with pytest.raises(ValueError, match=r"sequence_parallel_size=2 does not fit .*mamba2 layers would each see "
                                         r"1/2 of the sequence"):
        build_scenario(architecture=arch, gpu="h100-80gb", seq_len=8192, sequence_parallel_size=2)
    sc = build_scenario(architecture=arch, gpu="h100-80gb", nodes=2, network="ib-ndr-8x", seq_len=131072)
    assert sequence_parallel_options(sc) == [1]
    assert sequence_parallel_options(sc, within_node=False) == [1]
    assert plan(sc).choice is None or plan(sc).choice.sequence_parallel_size == 1
    with pytest.raises(ValueError, match="mamba2 layers"):
        U.check_ulysses(n_heads=32, kv_heads=2, sp_size=2, linear_mixer=arch.linear_mixer)
    U.check_ulysses(n_heads=32, kv_heads=2, sp_size=1, linear_mixer=arch.linear_mixer)  # sp 1: nothing split
