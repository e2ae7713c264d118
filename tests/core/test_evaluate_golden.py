"""Every value `evaluate` returns stays what it was through refactors that must not change a number (issue 35's
speed work: the stacked timeline, parts skipped where they apply nowhere, cached term values, the lazy ZeRO-3 fetch
schedule). tests/data/evaluate_golden/values.json holds, for each scenario below, every leaf of the Evaluation
(the timeline point by point) as Python's repr of each float, so a changed bit, dtype or sign of a zero shows.

The stored file was written by the code of commit 072f26d, before that work (``PYTHONPATH=<checkout of 072f26d>
python3 -m tests.core.test_evaluate_golden``); run without PYTHONPATH it rewrites the file from the current code,
which is only right when a number is meant to change.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from zeroplanner.costmodel import Candidates, evaluate, make_context
from zeroplanner.planner.sweeps import variant_candidates
from zeroplanner.scenarios import build_scenario

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "evaluate_golden" / "values.json"

SCENARIOS = {
    "default": {},
    "stage3-2-nodes": dict(stage=3, nodes=2),
    "stage3-nvme-13b": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", model="llama-2-13b"),
    "stage2-cpu-lora": dict(stage=2, offload_optimizer="cpu", lora_rank=16),
    "qlora-70b-1-gpu": dict(model="llama-2-70b", qlora=True, lora_rank=16, gpus_per_node=1),
    "ulysses-8b-64k": dict(model="llama-3.1-8b", seq_len=65536, sequence_parallel_size=8, stage=3),
    "checkpoint-offload": dict(model="llama-3.1-8b", seq_len=32768, checkpoint_offload=True, stage=3),
    "autotp-13b": dict(model="llama-2-13b", autotp_size=2, stage=1),
    "moe-mixtral": dict(model="mixtral-8x7b", nodes=2, stage=3),
    "vision-qwen2.5-vl": dict(model="qwen2.5-vl-7b", stage=2),
    "fp32-stage0-small": dict(model="qwen2.5-0.5b", precision="fp32", stage=0, gpus_per_node=1),
    "zeropp-70b": dict(model="llama-2-70b", nodes=8, stage=3, zero_hpz_partition_size=8,
                       zero_quantized_weights=True, zero_quantized_gradients=True),
}
"""Name -> build_scenario inputs. Each is evaluated as given (one candidate) and as the chart's variants (8)."""


def leaves(values) -> dict[str, list[str]]:
    """Every leaf of an Evaluation as a flat list of repr strings, by dotted path (the timeline by point and
    term)."""
    out: dict[str, list[str]] = {}

    def walk(obj, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name == "timeline":
                for k, a in v.by_point().items():
                    out[f"{prefix}timeline.{k}"] = [repr(x) for x in np.asarray(a).reshape(-1).tolist()]
            elif dataclasses.is_dataclass(v):
                walk(v, f"{prefix}{f.name}.")
            else:
                a = np.asarray(v)
                out[prefix + f.name] = [a.dtype.kind] + [repr(x) for x in a.reshape(-1).tolist()]

    walk(values, "")
    return out


def compute(name: str) -> dict[str, dict[str, list[str]]]:
    s = build_scenario(**SCENARIOS[name])
    ctx = make_context(s)
    _, variants = variant_candidates(s, np.array([s.cluster.nodes]))
    return {"as given": leaves(evaluate(ctx, Candidates.from_scenario(s))),
            "variants": leaves(evaluate(ctx, variants))}


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_evaluate_value_is_the_stored_one(name, golden):
    got, want = compute(name), golden[name]
    for which in ("as given", "variants"):
        assert set(got[which]) == set(want[which]), which
        for path, values in want[which].items():
            assert got[which][path] == values, (which, path)


def test_the_golden_covers_every_scenario(golden):
    assert sorted(golden) == sorted(SCENARIOS)


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({name: compute(name) for name in SCENARIOS}, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
