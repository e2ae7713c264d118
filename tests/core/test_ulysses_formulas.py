"""Ulysses formulas (zeroplanner/costmodel/ulysses.py), pure and fast.

Reference numbers are measured on the real engine (tests/evidence/test_ulysses_engine.py: DeepSpeed 0.19.8,
transformers 5.24, torch 2.13 CPU, gloo; the tiny Llama TINY_ULYSSES_LLAMA, bf16, (b, s) = (1, 256) and (2, 1024);
run 2026-12-01),
or follow from Jacobs et al. arXiv 2309.14509 Sec. 3.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from zeroplanner.costmodel import ulysses as U

# TINY_ULYSSES_LLAMA (zeroplanner/calibrate/ulysses.py), repeated here so this test needs no calibrate import
ARCH = {"n_layers": 2, "hidden_size": 128, "n_heads": 4, "kv_heads": 2, "head_dim": 32, "ffn_size": 256,
        "vocab_size": 512}
SHAPE = {"n_heads": 4, "kv_heads": 2, "head_dim": 32}


def test_message_sizes_equal_the_measured_comms_logger_sizes():
    # measured per rank and layer (comms logger, forward; backward identical):
    # sp 2: q and out 32768 B, k and v 16384 B; sp 4: all four 16384 B (K/V replicated 2x to 4 heads)
    sp2 = U.all_to_all_message_bytes_per_layer(micro_batch=1, seq_len=256, sp_size=2, **SHAPE)
    assert {k: int(v) for k, v in sp2.items()} == {"q": 32768, "k": 16384, "v": 16384, "out": 32768, "total": 98304}
    sp4 = U.all_to_all_message_bytes_per_layer(micro_batch=1, seq_len=256, sp_size=4, **SHAPE)
    assert {k: int(v) for k, v in sp4.items()} == {"q": 16384, "k": 16384, "v": 16384, "out": 16384, "total": 65536}


def test_mha_matches_the_paper_b_s_h_over_p_per_all_to_all():
    # Jacobs et al. Sec. 3: each of the four all-to-alls moves a rank's b*(s/P)*h elements (MHA, h = heads*d)
    b, s, h, heads, P = 2, 8192, 4096, 32, 8
    m = U.all_to_all_message_bytes_per_layer(micro_batch=b, seq_len=s, n_heads=heads, kv_heads=heads,
                                             head_dim=h // heads, sp_size=P, element_bytes=2)
    for kind in ("q", "k", "v", "out"):
        assert float(m[kind]) == 2 * b * (s / P) * h
    step = U.all_to_all_bytes_per_step(n_layers=1, micro_batch=b, seq_len=s, n_heads=heads, kv_heads=heads,
                                       head_dim=h // heads, sp_size=P)
    assert float(step["message_total"]) == 2 * 4 * 2 * b * (s / P) * h  # forward + backward
    assert float(step["wire_total"]) == pytest.approx(float(step["message_total"]) * (P - 1) / P)


def test_gqa_kv_replication_when_kv_heads_below_sp():
    assert U.kv_heads_exchanged(8, 4) == 8
    assert U.kv_heads_exchanged(8, 16) == 16
    assert U.kv_heads_exchanged(1, 8) == 8  # MQA: one KV head repeated to every rank


def test_per_step_counts_and_recompute():
    plain = U.all_to_all_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=2, **SHAPE)
    # measured sp 2: forward 196608 B in 8 calls, backward 196608 B in 8 calls; with full checkpointing the
    # backward carried 393216 B in 16 calls
    assert float(plain["message_forward"]) == 196608 and float(plain["message_backward"]) == 196608
    assert int(plain["count"]) == 16
    ckpt = U.all_to_all_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=2, recompute_forward=True,
                                       **SHAPE)
    assert float(ckpt["message_backward"]) == 393216 and int(ckpt["count"]) == 24
    none = U.all_to_all_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=1, **SHAPE)
    assert float(none["message_total"]) == 0 and int(none["count"]) == 0


def test_position_ids_allgather():
    # measured sp 2: 2 all-gathers of 1024 B (int64 position_ids of 128 local tokens), sp 4: 2 of 512 B
    assert float(U.position_ids_allgather_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=2)) == 2048
    assert float(U.position_ids_allgather_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=4)) == 1024
    assert float(U.position_ids_allgather_bytes_per_step(n_layers=2, micro_batch=1, seq_len=256, sp_size=1)) == 0


@pytest.mark.parametrize("sp, s, b, measured", [(2, 256, 1, 1729052 + 131072), (4, 256, 1, 897324 + 65536),
                                                (2, 1024, 2, 13832220 + 1048576), (4, 1024, 2, 7178284 + 524288)])
def test_activations_match_the_measured_census(sp, s, b, measured):
    # measured per rank: saved-tensor census + the returned bf16 logits; the formula omits only the loss
    # aggregation's scalars (8*(P+1) + 4 bytes, measured)
    pred = U.activation_bytes_per_rank(seq_len=s, micro_batch=b, sp_size=sp, **ARCH)
    assert float(pred["total"]) == measured - (8 * (sp + 1) + 4)
    assert float(pred["total"]) == pytest.approx(measured, rel=0.05)


def test_sp1_is_the_cost_models_llama_activation_term():
    from zeroplanner.calibrate import predicted_activation_bytes

    hf = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
          "tie_word_embeddings": False}
    for s, b in ((256, 1), (1024, 2)):
        u = U.activation_bytes_per_rank(seq_len=s, micro_batch=b, sp_size=1, **ARCH)["total"]
        assert float(u) == pytest.approx(predicted_activation_bytes(hf, seq_len=s, micro_batch=b), rel=1e-12)


def test_activations_shrink_with_sp_but_not_below_the_replicated_kv():
    kw = dict(ARCH, seq_len=np.array([4096, 32768]), micro_batch=1)
    a1 = U.activation_bytes_per_rank(sp_size=1, **kw)["total"]
    a2 = U.activation_bytes_per_rank(sp_size=2, **kw)["total"]
    a4 = U.activation_bytes_per_rank(sp_size=4, **kw)["total"]
    assert a1.shape == (2,)
    assert np.all(a4 < a2) and np.all(a2 < a1)
    # the o_proj input copy makes sp = P cost more than 1/P of sp = 1; at sp 4 the KV heads replicated 2x as well
    assert np.all(a2 > a1 / 2) and np.all(a4 > a1 / 4)
    assert_allclose(a2 / a1, a2[0] / a1[0], rtol=0.01)  # linear in s: no s^2 term with sdpa/flash


def test_bad_combinations_name_the_field():
    with pytest.raises(ValueError, match="sp_size=3 must divide the attention heads"):
        U.check_ulysses(n_heads=4, kv_heads=2, sp_size=3)
    with pytest.raises(ValueError, match="kv_heads=4: one must divide the other"):
        U.check_ulysses(n_heads=24, kv_heads=4, sp_size=6)
    with pytest.raises(ValueError, match="seq_len=.*multiple of sp_size=4"):
        U.activation_bytes_per_rank(seq_len=1001, micro_batch=1, sp_size=4, **ARCH)
    with pytest.raises(ValueError, match="sp_size=0"):
        U.all_to_all_message_bytes_per_layer(micro_batch=1, seq_len=256, sp_size=0, **SHAPE)
    with pytest.raises(ValueError, match="must divide world_size=6"):
        U.zero_shard_degree(world_size=6, sp_size=4)


def test_zero_shards_over_the_whole_sequence_data_parallel_world():
    # DeepSpeed groups._get_sequence_data_parallel_group; measured: ZeRO-1's all-gather input 213312 B at sp 4
    # = 2 bytes * 426624 parameters / 4
    assert U.zero_shard_degree(world_size=16, sp_size=4) == 16
    assert 2 * 426624 / U.zero_shard_degree(world_size=4, sp_size=4) == 213312


@pytest.mark.parametrize("sp, s, b, forward, recomputed", [
    (2, 256, 1, 461340 + 131072, 1333248), (4, 256, 1, 230700 + 65536, 699392),
    (2, 1024, 2, 3690524 + 1048576, 10665984), (4, 1024, 2, 1845292 + 524288, 5595136)])
def test_checkpointed_activations_match_the_measured_census(sp, s, b, forward, recomputed):
    # measured per rank with full checkpointing (reentrant): forward census + logits, and everything the backward's
    # recomputation saved (L layers + the rotary tables, which the forward census cannot see)
    pred = U.activation_bytes_per_rank(seq_len=s, micro_batch=b, sp_size=sp, checkpointing="full", **ARCH)
    rotary = 2 * 2 * (s // sp) * b * 32
    assert float(pred["total"] - pred["layer"]) - rotary == forward - (8 * (sp + 1) + 4)
    assert float(2 * pred["layer"]) + rotary == recomputed


def test_sp1_full_checkpointing_is_the_cost_models_term():
    from zeroplanner.calibrate import predicted_activation_bytes

    hf = {"model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
          "tie_word_embeddings": False}
    u = U.activation_bytes_per_rank(seq_len=1024, micro_batch=2, sp_size=1, checkpointing="full", **ARCH)["total"]
    assert float(u) == pytest.approx(predicted_activation_bytes(hf, seq_len=1024, micro_batch=2,
                                                                checkpointing="full"), rel=1e-12)
    with pytest.raises(ValueError, match="checkpointing='selective'"):
        U.activation_bytes_per_rank(seq_len=1024, micro_batch=2, sp_size=1, checkpointing="selective", **ARCH)
