"""The step's peak memory against the engine: the step-peak census (live tensor bytes over whole DeepSpeed steps on
2 CPU ranks, zeroplanner/calibrate/_peak_worker.py) against zeroplanner/costmodel/timeline.py.

Reference: zeroplanner/_measurements/step_peaks.json, measured by benchmarks/measure_step_peaks.py (DeepSpeed
0.19.8, torch 2.13.0+cpu, transformers 5.24.0) and rendered in docs/validation.md section 9. The engine test
measures two runs again and checks they reproduce the store.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from zeroplanner.calibrate.peak import (PEAK_FAMILIES, PEAK_LAUNCHES, PEAK_RUNS, measure_step_peaks, peak_error_fraction,
                                        peak_scenario, step_peak_rows, stored_step_peaks)
from zeroplanner.costmodel.timeline import ENGINE_MEMORY_ERROR_FRACTION, PHASES

ROOT = Path(__file__).resolve().parents[2]
ROWS = step_peak_rows()
BY_NAME = {r["name"]: r for r in ROWS}

WORST_ERROR = 0.036
"""The largest |error| of the census of 2026-12-03 (docs/validation.md section 9): 3.5% (gpt2-s2-offload); every
row is within the issue's 5%."""


def test_census_covers_the_configurations():
    """At least 24 rows: three families (one with a vocabulary 128x its width), stages 0-3, CPU optimizer offload,
    ZeRO-3 parameter offload, full checkpointing, gradient accumulation 2, two ZeRO-3 live-parameter settings."""
    stored = stored_step_peaks()
    assert set(stored["runs"]) == set(PEAK_RUNS) and len(ROWS) >= 24
    assert {name.split("-")[0] for name in PEAK_RUNS} == set(PEAK_FAMILIES)
    assert PEAK_FAMILIES["qwen2"]["vocab_size"] / PEAK_FAMILIES["qwen2"]["hidden_size"] >= 100
    for variant in ("s0", "s1", "s2", "s3", "s2-offload", "s3-offload-param", "s2-full", "s1-ga2", "s3-release"):
        assert all(f"{fam}-{variant}" in BY_NAME for fam in PEAK_FAMILIES)
    sc, _ = peak_scenario("llama-s3-release")
    assert sc.zero.stage3_max_live_parameters == 0 and peak_scenario("llama-s3")[0].zero.stage3_max_live_parameters > 0
    for ranks in stored["runs"].values():  # 2 ranks x PEAK_LAUNCHES launches
        assert len(ranks) == 2 * PEAK_LAUNCHES and all(r["peak_phase"] in PHASES for r in ranks)
        assert {r["launch"] for r in ranks} == set(range(PEAK_LAUNCHES))


def test_peak_phase_named_right_on_every_row():
    wrong = [(r["name"], r["measured_phase"], r["predicted_phase"]) for r in ROWS
             if r["measured_phase"] != r["predicted_phase"]]
    assert not wrong


def test_peak_within_five_percent_on_every_row():
    outside = [(r["name"], round(r["error"], 3)) for r in ROWS if abs(r["error"]) > 0.05]
    assert not outside
    assert max(abs(r["error"]) for r in ROWS) <= WORST_ERROR
    # the rows this census checks closest (the loss backward of ZeRO-0/1/2 without offload, and every 16-token row
    # peaking in the optimizer step of stage 0 and 3: torch's single-tensor AdamW temporaries, DeepSpeed's buffers)
    for name in ("qwen2-s0", "qwen2-s2", "llama-s1", "llama-s0-short", "qwen2-s0-short", "gpt2-s0-short",
                 "llama-s3-short", "qwen2-s3-short", "gpt2-s3-short"):
        assert abs(BY_NAME[name]["error"]) < 0.003, name


def test_launches_agree_to_the_byte():
    """With every thread's frees counted (calibrate/_peak_worker.py ``_count_every_thread``) the three launches of
    each run give the same peak within 0.01% (they differed by up to 14% before: frees on gloo's threads were
    missed)."""
    spread = {r["name"]: (r["highest_bytes"] - r["lowest_bytes"]) / r["measured_bytes"] for r in ROWS}
    assert max(spread.values()) < 1e-4, max(spread.items(), key=lambda kv: kv[1])


def test_margin_is_derived_from_the_census():
    """timeline.ENGINE_MEMORY_ERROR_FRACTION is the census's 90% under-prediction quantile, rounded up to 0.1%."""
    assert ENGINE_MEMORY_ERROR_FRACTION == math.ceil(1000 * peak_error_fraction(ROWS)) / 1000


def test_answers_priced_for_cpu_ranks_state_the_engine_error():
    from zeroplanner.costmodel import estimate

    peak = estimate(peak_scenario("llama-s2")[0]).step_peak
    assert peak.error_fraction == ENGINE_MEMORY_ERROR_FRACTION


def test_validation_doc_renders_the_stored_census():
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from make_validation import render_step_peaks

    section = "\n".join(render_step_peaks(stored_step_peaks()))
    doc = (ROOT / "docs" / "validation.md").read_text()
    assert section.strip() in doc
    assert all(f"| {name} |" in section for name in PEAK_RUNS)


ENGINE = all(importlib.util.find_spec(m) for m in ("torch", "deepspeed", "transformers"))


@pytest.mark.engine
@pytest.mark.skipif(not ENGINE, reason="needs torch, deepspeed and transformers")
def test_engine_reproduces_the_stored_census():
    """Two runs measured again: llama-s2 (ZeRO-2, peaking in the loss backward) and qwen2-s3-short (ZeRO-3 in the
    optimizer step, whose at-rest bytes drifted between launches before every thread's frees were counted): the
    highest rank's peak equals the stored one within 0.1%, in the stored phase."""
    names = ["llama-s2", "qwen2-s3-short"]
    fresh = measure_step_peaks(names, timeout_seconds=600)
    for name in names:
        stored = stored_step_peaks()["runs"][name]
        now = max(fresh[name], key=lambda r: r["peak_bytes"])
        then = max(stored, key=lambda r: r["peak_bytes"])
        assert now["peak_phase"] == then["peak_phase"]
        assert now["peak_bytes"] == pytest.approx(then["peak_bytes"], rel=1e-3), name
