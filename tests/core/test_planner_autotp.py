"""The planner's AutoTP dimension (planner.autotp_degrees): tried on one node, in a full fine-tune, only when no
tensor-parallel-1 candidate fits without offload; picked when it then fits without offload within the tolerance.

The scenario where it wins: llama-2-7b at 32k tokens on 8 x A100-40GB, micro-batch 1. At degree 1 every
configuration without offload needs at least 42.0 GiB per GPU (ZeRO-3: 20.6 GiB of activations with full
checkpointing), above the 37.5 GiB usable; AutoTP 2 divides the layers' activations too and fits without offload.
"""

from __future__ import annotations

import json

import pytest

from zeroplanner.cli import main
from zeroplanner.deepspeed import to_deepspeed_config
from zeroplanner.planner import AUTOTP_DEGREES, candidate_grid, plan
from zeroplanner.scenarios import build_scenario


def _long(**kw):
    values = dict(model="llama-2-7b", gpu="A100-40GB", gpus_per_node=8, seq_len=32768, micro_batch=1, grad_accum=1)
    values.update(kw)
    return build_scenario(**values)


def test_autotp_wins_when_nothing_fits_without_offload_at_degree_1():
    p = plan(_long())
    assert p.fits and p.choice.autotp_size == 2
    assert p.choice.offload_optimizer == "none" and p.choice.offload_param == "none"
    assert p.scenario.cluster.tensor_parallel_size == 2 and p.scenario.cluster.data_parallel_degree == 4
    assert p.estimate.data_parallel_degree == 4
    assert "AutoTP degree" in p.varied
    # every candidate of the 4 grids (degree 1, 2, 4, 8) was evaluated
    assert p.candidates_evaluated == 4 * candidate_grid(_long()).stage.size
    text = " ".join(p.reasons)
    assert "AutoTP degrees 2, 4, 8 were tried because nothing fits without offload" in text
    assert "never spreads it over nodes" in text
    assert "AutoTP 2 (tensor_parallel.autotp_size 2)" in text and "fits without offload" in text
    # the pick's DeepSpeed config carries it, with DeepSpeed's batch arithmetic over every rank
    config = to_deepspeed_config(p)
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert config["train_batch_size"] == 1 * 1 * 8


def test_the_degree_1_figures_in_the_reason_are_the_evaluated_ones():
    p = plan(_long())
    # the same configuration (ZeRO-3, full checkpointing, no offload) priced at degree 1
    at1 = plan(_long(stage=3, offload_optimizer="none", offload_param="none", checkpointing="full"),
               held={"stage", "offload_optimizer", "offload_param", "checkpointing", "autotp_size"})
    assert not at1.fits
    need = at1.estimate.per_gpu_bytes.total / 2**30
    assert f"the same configuration at degree 1: {need:.1f} GiB per GPU" in " ".join(p.reasons)


def test_autotp_is_not_tried_when_degree_1_fits_so_plan_time_stays():
    s = build_scenario()  # llama-2-7b, 8 x A100-80GB: fits without offload at degree 1
    p = plan(s)
    assert p.fits and p.choice.autotp_size == 1
    assert p.candidates_evaluated == candidate_grid(s).stage.size
    assert "AutoTP degree" not in p.varied and not any("AutoTP" in r for r in p.reasons)


def test_autotp_is_never_tried_across_nodes_or_when_held():
    two = plan(_long(nodes=2))
    assert all((o.choice.autotp_size or 1) == 1 for o in two.alternatives) and two.choice.autotp_size == 1
    assert not any("AutoTP degrees" in r for r in two.reasons)
    held = plan(_long(), held={"autotp_size"})
    assert held.choice.autotp_size == 1 and held.choice.offload_optimizer != "none"
    # the user's own degree is kept, not searched
    own = plan(_long(autotp_size=4))
    assert own.choice.autotp_size == 4 and own.candidates_evaluated == candidate_grid(_long(autotp_size=4)).stage.size


def test_degrees_divide_the_node_and_the_heads():
    assert AUTOTP_DEGREES == (2, 4, 8)
    p = plan(_long(gpus_per_node=4))
    assert "AutoTP degrees 2, 4 were tried" in " ".join(p.reasons)


def test_cli_holds_a_given_autotp_size(capsys):
    argv = ["recommend", "--model", "llama-2-7b", "--gpu", "A100-40GB", "--gpus-per-node", "8", "--seq-len",
            "32768", "--micro-batch", "1", "--grad-accum", "1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"]["autotp_size"] == 2
    assert main([*argv, "--autotp-size", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"]["autotp_size"] == 1 and out["held"]["autotp_size"] == 1
