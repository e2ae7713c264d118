"""AutoTP degrees that do not divide the KV heads: priced for the largest rank (costmodel.context.attention_tp_share,
from DeepSpeed's module_inject/tp_shard.py get_shard_size; the engine run is in tests/evidence/test_error_rules.py
autotp_not_dividing_the_heads_runs)."""

from __future__ import annotations

import pytest

from zeroplanner import catalog
from zeroplanner.costmodel import estimate
from zeroplanner.costmodel.context import attention_tp_share, autotp_replicated_params, make_context

from ..helpers import make_scenario


def _autotp(tp: int):
    s = make_scenario(dp=6, gpus_per_node=6, arch=catalog.model("llama-2-7b"), stage=1)
    return s.model_copy(update={"cluster": s.cluster.model_copy(update={"tensor_parallel_size": tp})})


def test_even_split_is_one_over_tp():
    for kv, tp in [(32, 2), (32, 8), (8, 8), (8, 4)]:
        assert attention_tp_share(kv, tp) == pytest.approx(1 / tp)
    assert attention_tp_share(8, 1) == 1.0


def test_uneven_heads_price_the_largest_rank():
    """llama-2-7b (32 KV heads) on 6 GPUs with AutoTP 3: get_shard_size gives ranks 11, 11, 10 heads, so the
    largest rank holds 11/32 of each attention layer's weights, not 1/3; the MLP and lm_head split evenly, the
    norms and the untied input embedding stay whole on every rank (autotp_replicated_params, measured in
    tests/evidence/test_autotp_engine.py)."""
    s = _autotp(3)
    m = s.model
    ctx = make_context(s)
    assert ctx.tp_attention_share == pytest.approx(11 / 32)
    even = s.parameters / 3
    whole = autotp_replicated_params(m) * (1 - 1 / 3)
    assert autotp_replicated_params(m) == 32000 * 4096 + (32 * 2 + 1) * 4096  # llama-2-7b: embed_tokens, norms
    assert ctx.params - even - whole == pytest.approx(m.n_attention_layers * m.attention_params * (11 / 32 - 1 / 3))
    assert ctx.trainable == pytest.approx(ctx.params)  # full fine-tune: the extra heads are trained too
    # the weights term of the estimate follows: bf16 weights of the largest rank
    weights = estimate(s).per_gpu_bytes.parameters
    assert weights == pytest.approx(2 * ctx.params, rel=1e-9)
    assert make_context(_autotp(2)).tp_attention_share == pytest.approx(1 / 2)
