"""The planner's longest trainable sequence against ALST's published figures (docs/validation.md section 8).

Published: Bekman et al., "Arctic Long Sequence Training" (arXiv 2506.13996), abstract: Llama-3.1-8B with 500K tokens
on a single H100, 3.7M on a single 8xH100 node, over 15M on a 4-node cluster; the HF baseline 32K. The setups are
ArcticTraining's recipes (projects/sequence-parallelism/run-h100-sp{1,8,32}-llama-8b.yml and the sp1 baseline),
encoded once in benchmarks/make_validation.py ALST_SETUPS. Acceptance (issue 13): within 1.5x, or the difference
explained by a stated mechanism, checked here with the recipe's own memory reading.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import make_validation as mv  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return {r["label"]: r for r in mv.long_sequence_rows()}


def test_alst_figures_within_one_and_a_half_times(rows):
    alst = [r for r in rows.values() if r["alst"]]
    assert [r["published"] for r in alst] == [500_000, 3_700_000, 15_000_000]
    for r in alst:
        assert 1 / 1.5 <= r["ratio"] <= 1.5, r
        # GPU memory binds, or (8 x H100) the host RAM the offloaded checkpoints fill first: 1762 of 1770 GiB
        assert r["binding"] in ("GPU memory", "host RAM") and r["gpu_total"] <= r["usable"]


def test_baseline_peaks_in_the_loss_backward_at_the_recipes_lengths(rows):
    """The paper's HF baseline ran 32K (36K "close to oom", the recipe's "NV 71.91 GB" at 32,000, an nvidia-smi
    reading). Without a tiled loss the step peaks in the loss backward (12 bytes per logit, measured on the engine:
    docs/validation.md section 9); the planner's longest sequence is within 1.5x (it said 56K, 1.76x, when it priced
    saved tensors only), and at 32,000 tokens the predicted peak is within 10% of the reading, below it (nvidia-smi
    also holds the CUDA context and the allocator's cache)."""
    from zeroplanner.costmodel import estimate

    base = rows["1 x H100, HF baseline (no ALST)"]
    assert 1.0 <= base["ratio"] <= 1.5 and base["peak_phase"] == "loss backward"
    at_32k = mv._baseline_total(32_000) / 1e9
    assert 0.9 * 71.91 <= at_32k <= 71.91
    assert mv._baseline_total(36_000) <= base["usable"]
