"""Hypothesis properties of the cost model (STYLE.md "Tests"; issue 2 acceptance)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeroplanner.costmodel import estimate
from zeroplanner.costmodel.memory import TERMS

from ..helpers import make_scenario

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

params_st = st.floats(min_value=1e7, max_value=2e12)
dp_st = st.sampled_from([1, 2, 4, 8, 16, 64, 256])
common = dict(
    precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    optimizer=st.sampled_from(["adamw", "sgd", "adam8bit"]),
    micro_batch=st.integers(1, 8),
    seq_len=st.sampled_from([128, 1024, 4096]),
    checkpointing=st.sampled_from(["none", "selective", "full"]),
)


def model_states(e) -> int:
    b = e.per_gpu_bytes
    return b.parameters + b.gradients + b.optimizer_states


@SETTINGS
@given(params=params_st, dp=st.sampled_from([2, 4, 8, 16, 64, 256]), accounting=st.sampled_from(["paper", "deepspeed"]),
       **common)
def test_memory_never_rises_with_stage(params, dp, accounting, **kw):
    """Model states per GPU never rise from stage k to k+1 at a fixed data-parallel degree >= 2; in the paper's
    accounting the whole total does not either (buffers aside, which DeepSpeed sizes by bucket, not by stage)."""
    ests = [estimate(make_scenario(params, dp=dp, stage=s, accounting=accounting, **kw)) for s in range(4)]
    states = [model_states(e) for e in ests]
    assert all(a >= b for a, b in zip(states, states[1:])), states
    if accounting == "paper":
        no_buffers = [e.per_gpu_bytes.total - e.per_gpu_bytes.buffers - e.per_gpu_bytes.overhead for e in ests]
        assert all(a >= b for a, b in zip(no_buffers, no_buffers[1:]))


@SETTINGS
@given(params=params_st, dp=dp_st, stage=st.integers(0, 3), **common)
def test_terms_sum_to_total(params, dp, stage, **kw):
    e = estimate(make_scenario(params, dp=dp, stage=stage, **kw))
    b = e.per_gpu_bytes
    assert abs(sum(getattr(b, t) for t in TERMS) - b.total) <= len(TERMS)  # each term rounded to whole bytes
    assert sum(t.bytes for t in e.terms) == sum(getattr(b, t) for t in TERMS)
    assert all(getattr(b, t) >= 0 for t in TERMS)
    assert np.isfinite(e.step_seconds) and e.step_seconds > 0 and e.tokens_per_second > 0


@SETTINGS
@given(params=params_st, **common)
def test_no_zero_saving_at_dp1(params, **kw):
    """At data-parallel degree 1 there is nothing to partition: no stage saves memory over stage 0 (DeepSpeed
    #4953); in the paper's accounting all stages coincide."""
    paper = [model_states(estimate(make_scenario(params, dp=1, stage=s, accounting="paper", **kw))) for s in range(4)]
    assert len(set(paper)) == 1
    real = [model_states(estimate(make_scenario(params, dp=1, stage=s, **kw))) for s in range(4)]
    assert all(r >= real[0] for r in real)


@SETTINGS
@given(params=params_st, stage=st.integers(0, 3), offload=st.sampled_from(["none", "cpu"]), **common)
def test_more_gpus_never_raise_model_states(params, stage, offload, **kw):
    if stage == 0:
        offload = "none"
    states = [model_states(estimate(make_scenario(params, dp=dp, stage=stage, offload_optimizer=offload, **kw)))
              for dp in (1, 2, 4, 8, 16, 64, 256)]
    assert all(a >= b for a, b in zip(states, states[1:])), states


@SETTINGS
@given(params=params_st, dp=dp_st, stage=st.integers(1, 3), **common)
def test_offload_never_raises_gpu_model_states(params, dp, stage, **kw):
    on_gpu = model_states(estimate(make_scenario(params, dp=dp, stage=stage, **kw)))
    off = estimate(make_scenario(params, dp=dp, stage=stage, offload_optimizer="cpu", **kw))
    assert model_states(off) <= on_gpu
    assert off.per_node_cpu_bytes > 0
