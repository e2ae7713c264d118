"""Fit the cost model's MFU to measured step times (real runs on a probed machine, or calibration reports)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


from ..probe.cluster import _number, cluster_from_probe

def fit_efficiency(
    runs: Sequence[tuple[Any, float]],
    probe: dict | None = None,
    mfu_bounds: tuple[float, float] = (0.01, 1.0),
) -> dict[str, Any]:
    """Fit the cost model's MFU to measured step times, after the communication terms are set from measured
    bandwidths.

    ``runs``: (Scenario, measured step seconds) pairs from real runs on the probed machine (e.g. the ground-truth
    harness, :mod:`zeroplanner.calibrate`). ``probe``: a probe result; its measured bandwidths replace each
    scenario's catalog figures first (:func:`cluster_from_probe`), and the ratio measured / catalog is reported as
    the communication efficiency. Then one MFU for all runs minimises the squared log error of predicted step time
    (a bounded 1-D search: a 400-point log grid on ``mfu_bounds`` refined by golden section).

    Returns ``{"mfu", "mfu_default" (the fraction of peak the cost model uses for the first run without a fixed
    MFU: compute.achieved_fraction, or the scenario's own fixed value), "communication_efficiency": {"intra_node", "inter_node"} (None where not
    measured), "runs": [{"measured_step_seconds", "predicted_step_seconds_before" (catalog cluster, default MFU),
    "predicted_step_seconds_after", "relative_error_before", "relative_error_after"}], "at_bound" (the fit hit a
    bound: the model cannot match with any MFU in range), "note"}``. With one run the fitted prediction matches by
    construction unless at a bound; only further runs test it. Raises ``ValueError`` for no runs or a
    non-positive time.
    """
    from ..costmodel import estimate
    from ..specs import replace

    if not runs:
        raise ValueError("runs: need at least one (scenario, measured_step_seconds) pair")
    lo, hi = mfu_bounds
    if not (0 < lo < hi <= 1):
        raise ValueError(f"mfu_bounds={mfu_bounds}: need 0 < low < high <= 1")
    prepared = []
    efficiency: dict[str, float | None] = {"intra_node": None, "inter_node": None}
    for i, (scenario, measured) in enumerate(runs):
        measured = _number(measured, f"runs[{i}].measured_step_seconds")
        cluster = scenario.cluster
        if probe is not None:
            cluster = cluster_from_probe(probe, cluster)
            if cluster.gpu.intra_node_busbw_gb_per_s != scenario.cluster.gpu.intra_node_busbw_gb_per_s:
                efficiency["intra_node"] = (cluster.gpu.intra_node_busbw_gb_per_s
                                            / scenario.cluster.gpu.intra_node_busbw_gb_per_s)
            if cluster.network != scenario.cluster.network:
                efficiency["inter_node"] = (cluster.network.node_busbw_bytes_per_second
                                            / scenario.cluster.network.node_busbw_bytes_per_second)
        prepared.append((scenario, replace(scenario, cluster=cluster), measured))

    def loss(mfu: float) -> float:
        total = 0.0
        for _s, calibrated, measured in prepared:
            step = estimate(replace(calibrated, assumptions=replace(calibrated.assumptions, mfu=mfu))).step_seconds
            total += math.log(step / measured) ** 2
        return total

    grid = [lo * (hi / lo) ** (k / 399) for k in range(400)]
    values = [loss(m) for m in grid]
    k = min(range(len(grid)), key=values.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):  # golden section on [a, b]
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if loss(c) < loss(d):
            b = d
        else:
            a = c
    mfu = (a + b) / 2
    rows = []
    for scenario, calibrated, measured in prepared:
        before = estimate(scenario).step_seconds
        after = estimate(replace(calibrated, assumptions=replace(calibrated.assumptions, mfu=mfu))).step_seconds
        rows.append({"measured_step_seconds": measured, "predicted_step_seconds_before": before,
                     "predicted_step_seconds_after": after, "relative_error_before": before / measured - 1,
                     "relative_error_after": after / measured - 1})
    at_bound = mfu <= lo * 1.001 or mfu >= hi * 0.999
    note = ("one run: the fitted MFU reproduces it by construction; more runs test the fit"
            if len(prepared) == 1 else f"one MFU fitted to {len(prepared)} runs")
    if at_bound:
        note += f"; the fit hit the bound {mfu_bounds}: no MFU in range explains the measurement"
    return {"mfu": mfu, "mfu_default": estimate(runs[0][0]).achieved_fraction, "communication_efficiency": efficiency,
            "runs": rows, "at_bound": at_bound, "note": note}


def fit_from_calibration(reports: Sequence[Any], probe: dict | None = None,
                         mfu_bounds: tuple[float, float] = (1e-9, 1.0)) -> dict[str, Any]:
    """:func:`fit_efficiency` on runs of the real engine: ``reports`` are
    :class:`zeroplanner.calibrate.CalibrationReport` objects (or their ``model_dump()`` dicts) from
    ``calibrate.run_calibration`` on this machine. Each report's scenario (the scaled-down model it ran) is priced by
    the cost model and its measured step time is forward + backward + optimizer step of the last step (slowest
    rank). On CUDA the report's peak ``torch.cuda.max_memory_allocated`` is set beside the predicted per-GPU bytes
    without the overhead term (CUDA context and allocator slack are not "allocated" bytes).

    Returns :func:`fit_efficiency`'s dict plus ``"memory"``: one entry per report with ``measured_peak_allocated_bytes``
    (None on CPU ranks), ``predicted_bytes_without_overhead``, ``relative_error`` and ``note``. The lower MFU bound
    is 1e-9 because calibration models are tiny and may run on CPU ranks against a GPU's peak (launch- and
    latency-bound, far below a full model's MFU): the fitted MFU describes the run that was measured; calibrate a
    larger ``hf_config`` on the GPUs to fit a production MFU.
    """
    from ..costmodel import estimate
    from ..specs import Scenario

    if not reports:
        raise ValueError("reports: need at least one calibration report")
    runs, memory = [], []
    for i, report in enumerate(reports):
        data = report.model_dump() if hasattr(report, "model_dump") else report
        if not isinstance(data, dict) or "scenario" not in data or "timings" not in data:
            raise ValueError(f"reports[{i}]: not a calibration report (needs 'scenario' and 'timings')")
        scenario = Scenario.model_validate(data["scenario"])
        t = data["timings"]
        measured = sum(_number(t.get(k), f"reports[{i}].timings.{k}", minimum=-1)
                       for k in ("forward_seconds", "backward_seconds", "step_seconds"))
        runs.append((scenario, measured))
        predicted = estimate(scenario).per_gpu_bytes
        without_overhead = predicted.total - predicted.overhead
        cuda = data.get("cuda") or {}
        peaks = [v for k, v in cuda.items() if k.endswith("max_allocated_bytes") and isinstance(v, (int, float))]
        peak = max(peaks) if peaks else None
        memory.append({
            "name": data.get("name", f"run{i}"),
            "measured_peak_allocated_bytes": peak,
            "predicted_bytes_without_overhead": without_overhead,
            "relative_error": None if not peak else without_overhead / peak - 1,
            "note": "torch.cuda.max_memory_allocated over init, forward, backward, step" if peak
            else "CPU ranks: no device memory to measure (see the report's storage census)",
        })
    result = fit_efficiency(runs, probe=probe, mfu_bounds=mfu_bounds)
    result["memory"] = memory
    return result


