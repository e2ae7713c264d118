"""DeepSpeed 0.19.8's estimators reproduced to the byte (docs/references.md section 2: P = 2851e6, Lg = 32e6, 8 GPUs,
1 node)."""

from __future__ import annotations

import json

import pytest

from zeroplanner.cli import main
from zeroplanner.costmodel import deepspeed_estimate_table

EXPECTED = [  # stage, offload_param, offload_optimizer, zero_init, per CPU, per GPU (docs/references.md s.2)
    (3, "cpu", "cpu", 1, 76977000000, 128000000),
    (3, "cpu", "cpu", 0, 136848000000, 128000000),
    (3, "none", "cpu", 1, 68424000000, 840750000),
    (3, "none", "cpu", 0, 136848000000, 840750000),
    (3, "none", "none", 1, 1536000000, 6542750000),
    (3, "none", "none", 0, 136848000000, 6542750000),
    (2, "none", "cpu", None, 136848000000, 5702000000),
    (2, "none", "none", None, 136848000000, 12116750000),
]


def test_rows_to_the_byte():
    rows = deepspeed_estimate_table(2851_000_000, 32_000_000, num_gpus_per_node=8, num_nodes=1)
    got = [(r.stage, r.offload_param, r.offload_optimizer, r.zero_init, r.per_cpu_bytes, r.per_gpu_bytes)
           for r in rows]
    assert got == EXPECTED


def test_cli_json(capsys):
    rc = main(["deepspeed-estimate", "--params", "2851000000", "--largest-layer-params", "32000000",
               "--gpus-per-node", "8", "--nodes", "1", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["per_cpu_bytes"], r["per_gpu_bytes"]) for r in rows] == [(e[4], e[5]) for e in EXPECTED]


def test_matches_installed_deepspeed():
    """The same numbers from DeepSpeed's own functions, when DeepSpeed is installed."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    for p, lg, g, n in [(2851_000_000, 32_000_000, 8, 1), (70_000_000_000, 1_050_000_000, 8, 4), (124_439_808, 38_597_376, 2, 1)]:
        rows = deepspeed_estimate_table(p, lg, g, n)
        for r in rows:
            if r.stage == 3:
                cpu, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(
                    p, lg, g, n, cpu_offload=r.offload_optimizer == "cpu", cpu_offload_params=r.offload_param == "cpu",
                    zero_init=bool(r.zero_init))
            else:
                cpu, gpu = stage12.estimate_zero2_model_states_mem_needs(p, g, n, cpu_offload=r.offload_optimizer == "cpu")
            assert (r.per_cpu_bytes, r.per_gpu_bytes) == (cpu, gpu)


def test_bad_counts_rejected():
    with pytest.raises(ValueError, match="total_params"):
        deepspeed_estimate_table(0, 1)


def test_estimator_shown_beside_ours(capsys):
    """`zeroplanner estimate` shows DeepSpeed's number for the same stage/offload; ours is larger because it also
    counts activations, buffers and the CUDA context (docs/references.md s.7, DeepSpeed #4093)."""
    rc = main(["estimate", "--stage", "3", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    ds = d["deepspeed_estimator"]
    from zeroplanner import build_scenario
    from zeroplanner.costmodel.deepspeed_estimator import zero3_model_states_mem_needs
    s = build_scenario(stage=3)
    cpu, gpu, _ = zero3_model_states_mem_needs(s.parameters, s.model.largest_module_params, 8, 1,
                                               cpu_offload=False, cpu_offload_params=False, zero_init=True)
    assert (ds["per_gpu_bytes"], ds["per_cpu_bytes"]) == (gpu, cpu)
    assert d["per_gpu_bytes"]["total"] > ds["per_gpu_bytes"]
    main(["estimate", "--stage", "0", "--json"])
    assert json.loads(capsys.readouterr().out)["deepspeed_estimator"] is None
