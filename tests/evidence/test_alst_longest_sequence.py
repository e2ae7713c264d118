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
        assert r["binding"] == "GPU memory" and r["gpu_total"] <= r["usable"]


def test_baseline_gap_is_the_loss_backward_transient(rows):
    """Without a tiled loss the planner says 56K where the paper's HF baseline ran 32K (36K "close to oom"); the
    stated mechanism is the loss backward's fp32 + 16-bit logits gradients (6 bytes x tokens x vocabulary), which the
    saved-tensor accounting leaves out. With it added, the recipe's lengths land on the GPU: 36,000 tokens at the
    usable limit, 32,000 tokens at the recipe's "NV 71.91 GB" reading."""
    base = rows["1 x H100, HF baseline (no ALST)"]
    assert base["ratio"] > 1.5
    transient = lambda s: 6.0 * s * 128256  # noqa: E731
    assert mv._baseline_total(36_000) + transient(36_000) == pytest.approx(base["usable"], rel=0.02)
    assert (mv._baseline_total(32_000) + transient(32_000)) / 1e9 == pytest.approx(71.91, rel=0.02)
