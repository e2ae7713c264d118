"""Public measured GPU-memory peaks (zeroplanner/_measurements/public_peaks.json, zeroplanner.costmodel.measured_peaks).

Every row names its source and quotes the printed number; the stored bytes are that number times the row's unit.
The rows set the planner's stated error of the step peak on a GPU (costmodel/timeline.py GPU_MEMORY_ERROR_FRACTION);
docs/validation.md section 10 renders them."""

from __future__ import annotations

import re

import pytest

from zeroplanner.costmodel.measured_peaks import (
    gpu_peak_error_fraction, load_public_peaks, predicted_peak_bytes, public_peak_rows, render_public_peaks_markdown, scenario_of,
)
from zeroplanner.costmodel.timeline import GPU_MEMORY_ERROR_FRACTION
from zeroplanner.specs import Scenario
from zeroplanner.units import GB, GIB

ROWS = load_public_peaks()


def test_at_least_ten_rows_with_unique_ids():
    assert len(ROWS) >= 10
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row_is_sourced_and_quoted(row):
    assert row["source_url"].startswith("https://")
    assert row["quote"].strip() and row["unit_note"].strip() and row["measured_kind"].strip()
    assert row["left_open"], "say what the source leaves open"
    # the quote contains the number exactly as printed, not as part of a longer number
    assert re.search(rf"(?<![\d.]){re.escape(row['printed'])}(?![\d])", row["quote"]), (row["printed"], row["quote"])


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_measured_bytes_is_printed_number_times_unit(row):
    assert row["unit_bytes"] in (GIB, GB, 2**20, 10**6)
    assert row["measured_bytes"] == round(float(row["printed"]) * row["unit_bytes"])


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_row_builds_a_scenario(row):
    scenario = scenario_of(row)
    assert isinstance(scenario, Scenario)
    assert scenario.cluster.gpus_per_node == row["scenario"]["gpus_per_node"]
    assert scenario.training.seq_len == row["scenario"]["seq_len"]
    for key, value in (row.get("training_update") or {}).items():
        got = getattr(scenario.training, key)
        assert list(got) == list(value) if isinstance(value, list) else got == value


def test_rows_carry_measured_and_predicted_bytes():
    rows = public_peak_rows()
    assert [r.id for r in rows] == [r["id"] for r in ROWS]
    for r, stored in zip(rows, ROWS):
        assert r.measured_bytes == stored["measured_bytes"]
        assert r.predicted_bytes == predicted_peak_bytes(r.scenario, r.measured_kind) > 0


def test_renderer_gives_one_line_per_row():
    rows = public_peak_rows()
    text = render_public_peaks_markdown(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)  # header + separator + one per row
    for r, line in zip(rows, lines[2:]):
        assert line.startswith(f"| {r.id} |") and line.endswith("|")
        assert f"{r.measured_bytes / GIB:.1f}" in line


def test_prediction_counts_what_the_measurement_counts():
    """max_memory_allocated sees the live tensors and the cuBLAS workspace; max_memory_reserved adds the allocator's
    slack (allocator_fragmentation_fraction of the live bytes); nvidia-smi also the CUDA context and NCCL buffers."""
    from zeroplanner.costmodel import make_context
    from zeroplanner.costmodel.memory import runtime_parts

    sc = public_peak_rows()[0].scenario
    allocated = predicted_peak_bytes(sc, "max_memory_allocated")
    reserved = predicted_peak_bytes(sc, "max_memory_reserved")
    whole = predicted_peak_bytes(sc, "nvidia-smi")
    context, cublas, nccl = (b for _, b, _ in runtime_parts(make_context(sc)))
    live = allocated - cublas
    assert reserved == pytest.approx(live * (1 + sc.assumptions.allocator_fragmentation_fraction) + cublas, abs=2)
    assert whole == pytest.approx(reserved + context + nccl, abs=2)


def test_gpu_margin_is_derived_from_the_public_rows():
    """timeline.GPU_MEMORY_ERROR_FRACTION is the 0.75 quantile of the public rows' under-prediction, rounded up to
    0.1%; a headroom of it covers the measured peak on at least 3 of 4 rows."""
    import math

    rows = public_peak_rows()
    assert GPU_MEMORY_ERROR_FRACTION == math.ceil(1000 * gpu_peak_error_fraction(rows)) / 1000
    covered = [r for r in rows if r.measured_bytes <= (1 + GPU_MEMORY_ERROR_FRACTION) * r.predicted_bytes]
    assert len(covered) >= 0.75 * len(rows)
