"""The same ground-truth calibration on CUDA (NCCL, torch.cuda.max_memory_allocated). Skipped without CUDA.

Run on a CUDA machine with ``scripts/gpu_calibrate.sh`` (or ``pytest -m gpu tests/evidence/test_gpu_calibrate.py``).
Ranks: min(2, visible GPUs). Expected values are the run's own measurements: the census of live storages must
match the cost model's model states as on CPU, and the CUDA allocator's peak in the optimizer step can never be
below the model states that are alive in it.
"""

from __future__ import annotations

import functools
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

NAMES = ["s0_bf16", "s1_bf16", "s2_bf16", "s3_bf16", "s2_bf16_off", "s3_fp32"]


@functools.lru_cache(maxsize=None)
def reports() -> dict:
    from zeroplanner.calibrate import run_calibrations, validation_scenario

    ranks = min(2, torch.cuda.device_count())
    out = run_calibrations({n: validation_scenario(n, ranks) for n in NAMES}, ranks=ranks, steps=3, device="cuda",
                           timeout_seconds=1500)
    return {r.name: r for r in out}


@pytest.mark.parametrize("name", NAMES)
def test_cuda_model_states_within_2_percent(name):
    rep = reports()[name]
    row = rep.row("model_states")
    assert abs(row.predicted - row.measured) <= 0.02 * row.measured + 64, rep.table()


@pytest.mark.parametrize("name", NAMES)
def test_cuda_peak_covers_live_model_states(name):
    """torch.cuda.max_memory_allocated in the optimizer step >= the device model states alive in it."""
    rep = reports()[name]
    assert rep.cuda is not None
    assert rep.cuda["step_max_allocated_bytes"] >= rep.row("model_states").measured
    assert rep.cuda["forward_max_allocated_bytes"] > 0 and rep.cuda["backward_max_allocated_bytes"] > 0


def test_gpu_script_skips_cleanly_or_runs():
    """scripts/gpu_calibrate.sh is the one command; here only its CUDA detection is exercised (it is the caller)."""
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_calibrate.sh"
    assert script.exists()
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
