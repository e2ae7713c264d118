"""Host RAM and NVMe of DeepSpeed's ZeRO-3 offload, measured on CPU ranks, against memory.host_parts / nvme_parts.

Reference: the census of benchmarks/measure_nvme_host.py (DeepSpeed 0.19.8, 2 CPU ranks, real NVMe swapping through
the async_io op), stored in zeroplanner/_measurements/nvme_host.json and rendered in docs/validation.md section 7.
The engine test measures again where libaio is installed (``AsyncIOBuilder().is_compatible()``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from zeroplanner import build_scenario
from zeroplanner.costmodel import Candidates, make_context
from zeroplanner.costmodel.memory import (
    MEASURED_HOST_TENSORS,
    MEASURED_NVME_FILES,
    OffloadBuffers,
    host_parts,
    nvme_parts,
)

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "zeroplanner" / "_measurements" / "nvme_host.json"

CENSUS_TO_PART, FILES_TO_PART = MEASURED_HOST_TENSORS, MEASURED_NVME_FILES
TOLERANCE = 2e-4  # measured parameter swap buffers are buffer_size aligned to 1024 bytes (3,000,320 for 3e6)


def predicted(run: dict) -> tuple[dict[str, float], dict[str, float]]:
    """(host bytes per rank by part, NVMe bytes per node by part) of the cost model for a measured run, with the
    run's DeepSpeed offload settings."""
    z = run["ds_config"]["zero_optimization"]
    oo, op = z["offload_optimizer"], z["offload_param"]
    buffers = OffloadBuffers(optimizer_buffer_count=oo.get("buffer_count", 4),
                             sub_group_size=z.get("sub_group_size", 1_000_000_000),
                             param_buffer_count=op.get("buffer_count", 5),
                             param_buffer_size=op.get("buffer_size", 100_000_000),
                             max_in_cpu=op.get("max_in_cpu", 1_000_000_000))
    scenario = build_scenario(params=run["parameters"], gpus_per_node=run["ranks"], stage=3,
                              offload_optimizer=oo["device"], offload_param=op["device"])
    ctx, cand = make_context(scenario), Candidates.from_scenario(scenario)
    host = {p.label: float(p.value.reshape(-1)[0]) / run["ranks"] for p in host_parts(ctx, cand, buffers).parts
            if bool(p.applies.reshape(-1)[0])}
    nvme = {p.label: float(p.value.reshape(-1)[0]) for p in nvme_parts(ctx, cand).parts
            if bool(p.applies.reshape(-1)[0])}
    return host, nvme


def measured(run: dict) -> dict[str, float]:
    """Host bytes per rank by cost-model part (largest over ranks)."""
    cpu_params = run["ds_config"]["zero_optimization"]["offload_param"]["device"] == "cpu"
    out: dict[str, float] = {}
    for rank in run["per_rank"]:
        mapped: dict[str, float] = {}
        for label, nbytes in rank.items():
            part = CENSUS_TO_PART.get(label) or ("parameter partition" if cpu_params
                                                 else "parameters kept in host RAM (max_in_cpu)")
            mapped[part] = mapped.get(part, 0) + nbytes
        for part, nbytes in mapped.items():
            out[part] = max(out.get(part, 0), nbytes)
    return out


def check(run: dict) -> None:
    host, nvme = predicted(run)
    meas = measured(run)
    assert set(host) == set(meas), run["run"]
    for part, value in meas.items():
        assert host[part] == pytest.approx(value, rel=TOLERANCE), (run["run"], part)
    if "nvme" in run["run"]:
        assert run["nvme_file_bytes_all_ranks"], run["run"]
    for kind, nbytes in run["nvme_file_bytes_all_ranks"].items():
        assert nvme[FILES_TO_PART[kind]] == pytest.approx(nbytes, rel=TOLERANCE), (run["run"], kind)
    assert sum(nvme.values()) == pytest.approx(sum(run["nvme_file_bytes_all_ranks"].values()), rel=TOLERANCE)


def test_stored_census_matches_the_host_and_nvme_parts():
    data = json.loads(STORED.read_text())
    assert data["deepspeed_version"] == "0.19.8"
    runs = {r["run"]: r for r in data["runs"]}
    assert set(runs) == {"cpu_cpu", "nvme_nvme_default_limits", "nvme_nvme_small"}
    for run in runs.values():
        check(run)
    # the regime of Llama-2-7B on 8 GPUs (partition below sub_group_size and max_in_cpu): NVMe offload keeps more
    # host RAM than CPU offload (its fp32 swap buffers equal CPU offload's states + fp32 gradients, plus the
    # parameter swap buffers); past sub_group_size and max_in_cpu it keeps less
    total = {name: sum(measured(r).values()) for name, r in runs.items()}
    assert total["nvme_nvme_default_limits"] > total["cpu_cpu"] > total["nvme_nvme_small"]


def _aio_available() -> bool:
    if importlib.util.find_spec("deepspeed") is None:
        return False
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return bool(AsyncIOBuilder().is_compatible(verbose=False))


@pytest.mark.engine
def test_engine_census_matches_the_parts_where_async_io_builds(tmp_path):
    if not _aio_available():
        pytest.skip("DeepSpeed's async_io op needs libaio (apt-get install libaio-dev)")
    out = tmp_path / "nvme_host.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "measure_nvme_host.py"), "--out", str(out), "--runs",
                    "nvme_nvme_small"], check=True, timeout=900, capture_output=True)
    (run,) = json.loads(out.read_text())["runs"]
    check(run)
