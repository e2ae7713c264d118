"""Public measured GPU-memory peaks of DeepSpeed training runs, set beside the planner's prediction.

The rows live in ``zeroplanner/_measurements/public_peaks.json`` (read as package data, as
:func:`zeroplanner.calibrate.peak` reads ``step_peaks.json``). Each row is one published run: ``source_url`` and
``quote`` (the exact text that prints the number), ``printed`` (the number as printed) x ``unit_bytes`` =
``measured_bytes``, ``measured_kind`` (``max_memory_allocated``, ``max_memory_reserved``, nvidia-smi, or
"unstated"), ``unit_note`` (whether the source's "GB" is 1e9, 2^30 or unknown), ``scenario`` (keyword arguments of
:func:`zeroplanner.scenarios.build_scenario`), an optional ``training_update`` (TrainingSpec fields that are not
build_scenario keywords, e.g. ``lora_targets``) and ``left_open`` (what the source does not say, and what was
assumed).

Sources (20 rows): stas00/ml-engineering ``insights/when-to-upgrade-gpus`` (Llama-3.1-8B, 8 x H200, ZeRO-3 + CPU
optimizer offload, 8K-256K tokens, ``max_memory_reserved`` in GiB); gist chenyaofo/d4cd6a20ab4b95cb3a49491747e2139a
(LLaMA-7B, 8 x A800, ZeRO-2/3, offload, checkpointing, ``max_memory_allocated``); ms-swift Megatron-SWIFT
quick-start benchmark (Qwen2.5-14B, 8 x A800, ZeRO-3); PEFT's DeepSpeed guide (Llama-2-70B LoRA on 8 x H100 and
QLoRA on 2 x 40 GB).

Units: bytes. Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from ..specs import Scenario
from ..units import GIB

__all__ = ["PublicPeakRow", "gpu_peak_error_fraction", "load_public_peaks", "predicted_peak_bytes",
           "public_peak_rows", "render_public_peaks_markdown", "scenario_of", "under_prediction_quantile"]

_PATH = "_measurements/public_peaks.json"


def load_public_peaks() -> list[dict[str, Any]]:
    """The stored rows of ``zeroplanner/_measurements/public_peaks.json``, as dicts (see the module docstring)."""
    return json.loads(files("zeroplanner").joinpath(_PATH).read_text(encoding="utf-8"))


def scenario_of(row: dict[str, Any]) -> Scenario:
    """The validated Scenario of one stored row: ``build_scenario(**row["scenario"])``, then the row's
    ``training_update`` (TrainingSpec fields build_scenario has no keyword for), validated again.

    Raises pydantic.ValidationError, KeyError or TypeError as build_scenario does.
    """
    from ..scenarios import build_scenario  # the builder sits above the cost model; imported here, not at load

    scenario = build_scenario(**row["scenario"])
    update = row.get("training_update")
    if update:
        data = scenario.model_dump()
        data["training"] = {**data["training"], **update}
        scenario = Scenario.model_validate(data)
    return scenario


def predicted_peak_bytes(scenario: Scenario, measured_kind: str = "unstated") -> int:
    """The planner's per-GPU step peak for ``scenario`` (costmodel/timeline.py), bytes, as the measurement of
    ``measured_kind`` sees it: ``max_memory_allocated`` the live tensors and the cuBLAS workspace (inside PyTorch's
    allocator); ``max_memory_reserved`` also the allocator's slack; anything else (nvidia-smi, unstated) the whole
    process, with the CUDA context and the NCCL buffers (gpu_runtime.py: both outside the allocator)."""
    from .evaluate import estimate  # evaluate imports this package's other modules

    peak = estimate(scenario).step_peak
    point = max(peak.timeline, key=lambda p: p.total)
    if measured_kind not in ("max_memory_allocated", "max_memory_reserved"):
        return int(point.total)
    cublas = peak.runtime_parts[1].bytes  # (context, cuBLAS workspace, NCCL buffers, slack): memory.runtime_parts
    live = point.total - point.bytes["runtime"]
    slack = scenario.assumptions.allocator_fragmentation_fraction if measured_kind == "max_memory_reserved" else 0.0
    return int(round(live * (1.0 + slack) + cublas))


@dataclass(frozen=True)
class PublicPeakRow:
    """One public run: what it measured and what the planner predicts for it (bytes per GPU)."""

    id: str
    source_url: str
    measured_kind: str
    measured_bytes: int
    predicted_bytes: int
    scenario: Scenario
    left_open: tuple[str, ...]

    @property
    def error_fraction(self) -> float:
        """(predicted - measured) / measured: positive when the planner over-predicts."""
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def public_peak_rows() -> list[PublicPeakRow]:
    """Every stored public run with its measured bytes and :func:`predicted_peak_bytes`."""
    out = []
    for row in load_public_peaks():
        scenario = scenario_of(row)
        out.append(PublicPeakRow(
            id=row["id"], source_url=row["source_url"], measured_kind=row["measured_kind"],
            measured_bytes=int(row["measured_bytes"]),
            predicted_bytes=predicted_peak_bytes(scenario, row["measured_kind"]),
            scenario=scenario, left_open=tuple(row["left_open"]),
        ))
    return out


def under_prediction_quantile(pairs: list[tuple[float, float]], quantile: float) -> float:
    """The headroom, as a fraction of the predicted peak, that covers the measured peak on ``quantile`` of the
    (measured, predicted) ``pairs``: the quantile of (measured - predicted) / predicted, at least 0 (numpy's linear
    interpolation). Both stated errors of the step peak are this (costmodel/timeline.py)."""
    import numpy as np

    under = [(measured - predicted) / predicted for measured, predicted in pairs]
    return max(0.0, float(np.quantile(under, quantile)))


def gpu_peak_error_fraction(rows: list[PublicPeakRow], quantile: float = 0.75) -> float:
    """:func:`under_prediction_quantile` of the public rows: the planner's stated error on a GPU
    (costmodel/timeline.py GPU_MEMORY_ERROR_FRACTION) is this over the stored rows."""
    return under_prediction_quantile([(r.measured_bytes, r.predicted_bytes) for r in rows], quantile)


def _setup(s: Scenario) -> tuple[str, str, str]:
    c, z, t = s.cluster, s.zero, s.training
    gpus = f"{c.nodes} x {c.gpus_per_node} {c.gpu.name}"
    offload = [f"{name} {dev}" for name, dev in (("opt", z.offload_optimizer.device), ("param", z.offload_param.device))
               if dev != "none"]
    lora = f", {'QLoRA' if t.qlora else 'LoRA'} r{t.lora_rank}" if t.lora_rank else ""
    stage = f"ZeRO-{z.stage}" + (f" + offload {', '.join(offload)}" if offload else "") + lora
    batch = f"{t.micro_batch} x {t.seq_len} (ga {t.grad_accum}, ckpt {t.checkpointing})"
    return gpus, stage, batch


def render_public_peaks_markdown(rows: list[PublicPeakRow]) -> str:
    """A markdown table, one line per row after the header: id, model, GPUs, stage/offload, batch x sequence,
    measured and predicted GiB (2^30 bytes), error %, and what the source leaves open (count and first item)."""
    lines = ["| id | model | GPUs | stage / offload | batch x seq | measured GiB | predicted GiB | error % | "
             "left open |",
             "|---|---|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        gpus, stage, batch = _setup(r.scenario)
        first = r.left_open[0].replace("|", "/") if r.left_open else ""
        more = f" (+{len(r.left_open) - 1} more)" if len(r.left_open) > 1 else ""
        kind = r.measured_kind.split(" ")[0]
        lines.append(f"| {r.id} | {r.scenario.model.name} | {gpus} | {stage} | {batch} | "
                     f"{r.measured_bytes / GIB:.1f} ({kind}) | {r.predicted_bytes / GIB:.1f} | "
                     f"{100 * r.error_fraction:+.0f} | {first}{more} |")
    return "\n".join(lines)
