"""Bucket sizes: each bucket is one collective and pays NCCL's per-collective latency again.

The seed article reports a 2.1x ZeRO-2 speed-up from raising buckets 5e7 -> 2e8 on a multi-node run. With
DeepSpeed 0.19.8's mechanics (gradient buckets all-reduced; allgather_bucket_size ignored) and measured TCP
latencies (docs/network_sources.md: ~1 ms per all-reduce for 16-32 ranks), the model predicts a gain of a few
percent, growing with the node count; these tests pin that mechanism exactly.
"""

from __future__ import annotations

import math

import pytest

from zeroplanner import build_scenario, catalog, estimate
from zeroplanner.costmodel.communication import NCCL_BASE_LATENCY_SECONDS, NCCL_MULTINODE_ALLREDUCE_PLATEAU


def zero2(nodes, bucket, network="eth-25g", overlap=False, grad_accum=1):
    return build_scenario(model="llama-2-7b", nodes=nodes, network=network, stage=2, micro_batch=1,
                          grad_accum=grad_accum, zero_overrides=dict(reduce_bucket_size=bucket,
                                                                     allgather_bucket_size=bucket,
                                                                     overlap_comm=overlap))


@pytest.mark.parametrize("nodes", [2, 4, 16])
@pytest.mark.parametrize("grad_accum", [1, 8])
def test_bigger_buckets_save_exactly_the_latency_of_the_collectives_avoided(nodes, grad_accum):
    small, large = estimate(zero2(nodes, 50_000_000, grad_accum=grad_accum)), \
        estimate(zero2(nodes, 200_000_000, grad_accum=grad_accum))
    psi = small.parameters
    fewer = math.ceil(psi / 5e7) - math.ceil(psi / 2e8)  # all-reduce collectives avoided per micro-step
    n = 8 * nodes
    steps, inter = 2 * (n - 1), 2 * nodes  # ring all-reduce steps, network hops (NCCL tuning.cc)
    gpu, net = catalog.gpu("A100-80GB"), catalog.network("eth-25g")
    latency = NCCL_MULTINODE_ALLREDUCE_PLATEAU * (
        NCCL_BASE_LATENCY_SECONDS + (steps - inter) * gpu.intra_node_latency_seconds + inter * net.latency_seconds)
    saved = small.step_seconds - large.step_seconds
    assert saved == pytest.approx(grad_accum * fewer * latency, rel=1e-9)
    assert large.step_seconds < small.step_seconds


def test_gain_grows_with_nodes_and_costs_less_time_on_low_latency_networks():
    def saved(nodes, network):
        return estimate(zero2(nodes, 50_000_000, network)).step_seconds - \
            estimate(zero2(nodes, 200_000_000, network)).step_seconds
    assert 0 < saved(2, "eth-25g") < saved(4, "eth-25g") < saved(16, "eth-25g")
    # InfiniBand's 14 us network step (NCCL tuning.cc) vs TCP's ~150 us: fewer seconds to save
    assert 0 < saved(4, "ib-hdr-8x") < saved(4, "eth-25g")
