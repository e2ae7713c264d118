"""DeepSpeed AutoTP training as a scenario input: the autotp_size input, the generated config, AutoTP's collectives in
the step time. The counts are the ones measured on the real engine (tests/evidence/test_autotp_engine.py: DeepSpeed
0.19.8's comms logger on 2 gloo ranks), here applied to released models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from zeroplanner import catalog
from zeroplanner.costmodel import estimate
from zeroplanner.costmodel.communication import (
    autotp_collectives_per_micro_step,
    autotp_terms,
    ring_seconds,
)
from zeroplanner.costmodel.context import Candidates, make_context
from zeroplanner.deepspeed import from_deepspeed_config, to_deepspeed_config
from zeroplanner.scenarios import build_scenario


def _s(tp: int = 2, **kw):
    values = {"model": "llama-2-7b", "gpus_per_node": 8, "stage": 2, "micro_batch": 2, "grad_accum": 4,
              "seq_len": 4096, "checkpointing": "none"}
    values.update(kw)
    return build_scenario(autotp_size=tp, **values)


@pytest.mark.parametrize("mode", ["deepspeed", "hf_trainer"])
def test_generated_config_carries_autotp_and_passes_deepspeeds_config_classes(mode):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    from zeroplanner.deepspeed.library import _deepspeed_world

    s = _s(2)
    config = to_deepspeed_config(s, mode=mode)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    with _deepspeed_world(s.cluster.world_size):  # deepspeed.initialize: no mpu, so every rank counts
        parsed = DeepSpeedConfig(json.loads(json.dumps(config)))
    assert parsed.tensor_parallel_config.autotp_size == 2
    # 2 x 4 x 8 ranks: DeepSpeedConfig's batch assertion (_batch_assertion) over dist.get_world_size()
    assert parsed.train_batch_size == 2 * 4 * 8
    assert from_deepspeed_config(config, base=_s(1))[0] == s


def test_no_tensor_parallel_block_without_autotp():
    config = to_deepspeed_config(_s(1))
    assert "tensor_parallel" not in config
    assert config["train_batch_size"] == 2 * 4 * 8  # data-parallel degree 8


def test_autotp_not_dividing_the_node_is_one_line_naming_the_flag(capsys):
    from zeroplanner.cli import main

    assert main(["estimate", "--gpus-per-node", "8", "--autotp-size", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--autotp-size" in err[0] and "gpus_per_node=8" in err[0]


def test_llama_counts_per_micro_step():
    """llama-2-7b (32 layers, separate q/k/v and gate/up, untied): forward 2 all-reduces per layer (o_proj,
    down_proj); backward 3 + 2 per layer (q, k, v, gate, up) + 1 (lm_head input); the logits all-gathered once;
    full checkpointing repeats o_proj's all-reduce per layer."""
    n = autotp_collectives_per_micro_step(catalog.model("llama-2-7b"), "full")
    assert n == {"forward": 64, "backward": 161, "recompute": 32, "logits_all_gather": 1, "loss_all_reduce": 0}
    # a fused QKV and a GeLU MLP (GPT-NeoX style): one column-parallel linear each
    neox = catalog.model("llama-2-7b").model_copy(update={"fused_qkv": True, "ffn_kind": "gelu"})
    assert autotp_collectives_per_micro_step(neox)["backward"] == 32 * 2 + 1


def test_autotp_bytes_and_time_over_the_node_link():
    s = _s(2)
    ctx = make_context(s)
    cand = Candidates.from_scenario(s)
    t = autotp_terms(ctx, cand)
    act = 2 * 4096 * 4096 * 2  # micro-batch x sequence x hidden, bf16
    assert float(t["all_reduce_micro"][0]) == (64 + 161) * act
    assert float(t["all_gather_micro"][0]) == 2 * 4096 * 32000 * 2  # the gathered logits
    expected = (ring_seconds(ctx, "all_reduce", np.array([225.0 * act]), np.array([2]), np.array([225.0]),
                             np.array([False]))
                + ring_seconds(ctx, "all_gather", np.array([2 * 4096 * 32000 * 2.0]), np.array([2]),
                               np.array([1.0]), np.array([False])))
    assert float(t["seconds_micro"][0]) == pytest.approx(float(expected[0]), rel=1e-12)
    # none without AutoTP
    t1 = autotp_terms(make_context(_s(1)), Candidates.from_scenario(_s(1)))
    assert float(t1["seconds_micro"][0]) == 0.0 and float(t1["all_reduce_micro"][0]) == 0.0


def test_autotp_time_is_an_exposed_additive_term_of_the_step():
    """The step's exposed collectives grow by exactly grad_accum x AutoTP's seconds per micro-step, and the
    all-reduce bytes by grad_accum x its bytes (the ZeRO terms over world / tp are unchanged by the new term)."""
    from zeroplanner.costmodel.communication import communication_terms
    from zeroplanner.costmodel.evaluate import evaluate

    s = _s(2)
    ctx, cand = make_context(s), Candidates.from_scenario(s)
    values = evaluate(ctx, cand)
    comm = communication_terms(ctx, cand)
    tp = autotp_terms(ctx, cand)
    ga = s.training.grad_accum
    est = estimate(s)
    assert est.communication.by_collective["all_reduce"] == pytest.approx(
        float(comm["all_reduce"][0]), rel=1e-9)
    # what is left is ZeRO-2's 16-bit gradient all-reduce of the rank's Ψ/tp every micro-step, over world / tp
    assert float(comm["all_reduce"][0]) - ga * float(tp["all_reduce_micro"][0]) == pytest.approx(
        ga * ctx.trainable * ctx.grad_bytes, rel=1e-12)
    exposed = float(values.communication.collectives_exposed_seconds_per_step[0])
    assert exposed >= ga * float(tp["seconds_micro"][0]) > 0.0
    # step seconds = compute + exposed collectives + host + offload + optimizer (evaluate.step_terms' t_step)
    parts = (values.compute_seconds_per_step + values.communication.collectives_exposed_seconds_per_step
             + values.fetch_overhead_seconds_per_step + values.hook_seconds_per_step
             + values.offload_seconds_per_step + values.optimizer_seconds_per_step)
    assert float(values.step_seconds[0]) == pytest.approx(float(parts[0]), rel=1e-12)


def test_tensor_parallel_shards_the_states_over_tp_and_zero_over_the_rest():
    """Per-GPU optimizer states at ZeRO-2: K x (Ψ/tp + what stays whole) / (world / tp)."""
    from zeroplanner.costmodel.context import autotp_replicated_params

    m = catalog.model("llama-2-7b")
    for tp in (1, 2, 4, 8):
        s = _s(tp)
        per_rank = s.parameters / tp + (autotp_replicated_params(m) * (1 - 1 / tp) if tp > 1 else 0)
        assert make_context(s).params == pytest.approx(per_rank)
        assert estimate(s).per_gpu_bytes.optimizer_states == pytest.approx(12 * per_rank / (8 // tp), rel=1e-6)
