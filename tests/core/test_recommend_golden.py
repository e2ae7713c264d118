"""`recommend --json` stays identical through refactors that must not change a number (issues 30 and 35: the
planner split into a package, step-time terms as expressions, typed evaluate results, compiled terms).

The expected documents in tests/data/recommend_golden/ were written by this module at commit 1198561 (the last
commit before those refactors), from the scenarios in ``SCENARIOS``; they are not measurements, they pin the
planner's output so a change that should be a pure refactor shows every field it moved. A change that is meant to
move numbers rewrites them on purpose::

    python3 -m tests.core.test_recommend_golden      # rewrites tests/data/recommend_golden/*.json

and the diff goes in the commit that explains why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from zeroplanner.cli import main

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "recommend_golden"

SCENARIOS: dict[str, list[str]] = {
    "default": [],
    "llama-2-13b-2-nodes": ["--model", "llama-2-13b", "--nodes", "2"],
    "llama-2-70b-4-nodes": ["--model", "llama-2-70b", "--nodes", "4"],
    "qwen2.5-0.5b-1-gpu": ["--model", "qwen2.5-0.5b", "--gpus-per-node", "1"],
    "llama-2-13b-cpu-offload-2-gpus": ["--model", "llama-2-13b", "--offload-optimizer", "cpu", "--gpus-per-node", "2"],
    "nothing-fits-llama-3-70b-cpu-offload": ["--model", "llama-3-70b", "--offload-optimizer", "cpu"],
    "llama-2-70b-stage3-nvme": ["--model", "llama-2-70b", "--stage", "3", "--offload-param", "nvme",
                                "--offload-optimizer", "nvme", "--gpus-per-node", "2"],
    "qlora-llama-2-70b-1-gpu": ["--model", "llama-2-70b", "--qlora", "--lora-rank", "16", "--gpus-per-node", "1"],
    "lora-llama-3-8b": ["--model", "llama-3-8b", "--lora-rank", "8", "--gpus-per-node", "2"],
    "ulysses-llama-3-8b-128k": ["--model", "llama-3-8b", "--seq-len", "131072", "--sequence-parallel-size", "8"],
    "zeropp-llama-2-70b-8-nodes": ["--model", "llama-2-70b", "--nodes", "8", "--network", "eth-100g",
                                   "--zero-hpz-partition-size", "8"],
    "autotp-llama-2-13b": ["--model", "llama-2-13b", "--autotp-size", "2"],
    "vision-qwen2.5-vl-7b": ["--model", "qwen2.5-vl-7b", "--images-per-sample", "2"],
    "moe-mixtral-8x7b-2-nodes": ["--model", "mixtral-8x7b", "--nodes", "2"],
    "params-1e12-16-nodes": ["--params", "1e12", "--nodes", "16", "--gpu", "H100-80GB"],
    "fp16-adam8bit-small-gpu": ["--model", "llama-2-7b", "--precision", "fp16", "--optimizer", "adam8bit",
                                "--gpu", "A100-40GB", "--micro-batch", "2", "--grad-accum", "4"],
}


def recommend_json(args: list[str], capsys) -> dict:
    rc = main(["recommend", "--json", *args])
    out = capsys.readouterr().out
    assert rc in (0, 1), out  # 1: nothing fits with the options held
    return json.loads(out)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_recommend_json_unchanged(name, capsys):
    expected = json.loads((GOLDEN / f"{name}.json").read_text())
    assert recommend_json(SCENARIOS[name], capsys) == expected


def test_every_golden_has_a_scenario():
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(SCENARIOS)


if __name__ == "__main__":
    import contextlib
    import io

    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, args in SCENARIOS.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["recommend", "--json", *args])
        if rc not in (0, 1):
            sys.exit(f"{name}: recommend exited {rc}")
        (GOLDEN / f"{name}.json").write_text(json.dumps(json.loads(buf.getvalue()), indent=1, sort_keys=True) + "\n")
        print(f"wrote {name}")
