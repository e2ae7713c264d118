"""The step-peak census: the peak of live tensor bytes per rank over whole DeepSpeed training steps, measured on CPU
ranks (gloo) for tiny real HF models, and the scenarios the cost model prices for the same runs.

:data:`PEAK_RUNS` names the runs (family x configuration); :func:`peak_scenario` gives the zeroplanner Scenario
and the HF config of one; :func:`measure_step_peaks` runs them in one DeepSpeed launch through
``calibrate/_peak_worker.py`` (how the bytes are counted, and why with torch's profiler: that module's
docstring). ``benchmarks/measure_step_peaks.py`` stores the result in ``zeroplanner/_measurements/step_peaks.json``;
tests/evidence/test_step_peaks.py and docs/validation.md compare it with :func:`zeroplanner.costmodel.timeline`.

Torch, DeepSpeed and transformers are imported by the worker only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..specs import Scenario

PEAK_WORKER = Path(__file__).with_name("_peak_worker.py")

_BASE = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "max_position_embeddings": 1024}
PEAK_FAMILIES: dict[str, dict[str, Any]] = {
    # GQA 4/2 heads, SwiGLU 176 wide, RMSNorm, rotary, untied head; vocabulary 32x the width (Llama-2: 8x)
    "llama": {"model_type": "llama", "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 2048,
              "tie_word_embeddings": False, **_BASE},
    # the large vocabulary: 128x the width (Qwen2.5-7B: 152064 / 3584 = 42x; Gemma-2-2B: 256000 / 2304 = 111x)
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2, "intermediate_size": 176, "vocab_size": 8192,
              "tie_word_embeddings": False, **_BASE},
    # fused QKV, learned positions, LayerNorm, GELU, tied head; dropout off
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 4, "n_head": 4, "vocab_size": 1024, "n_positions": 1024,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True},
}
"""Tiny configs of three HF families for the step-peak census."""

PEAK_RANKS = 2
PEAK_STEPS = 3
"""Two CPU ranks; three optimizer steps (ZeRO-3 traces its parameter order in the first; the last is reported)."""

_TINY_ZERO = {"reduce_bucket_size": 50_000, "allgather_bucket_size": 50_000, "stage3_prefetch_bucket_size": 20_000,
              "stage3_param_persistence_threshold": 65}
"""Bucket sizes for the tiny models (elements): DeepSpeed allocates a whole reduce bucket however small the model
(memory.buffer_parts), so the 5e8 default would be 1 GB against a 1-3 MB model. The persistence threshold keeps
the 64-wide vectors whole and partitions every matrix, as the 1e5 default does on a billion-parameter model."""

_VARIANTS: dict[str, dict[str, Any]] = {
    "s0": {"stage": 0},
    "s1": {"stage": 1},
    "s2": {"stage": 2},
    "s3": {"stage": 3},
    "s1-ga2": {"stage": 1, "grad_accum": 2},
    "s2-ga2": {"stage": 2, "grad_accum": 2},
    "s2-full": {"stage": 2, "checkpointing": "full"},
    "s3-full": {"stage": 3, "checkpointing": "full"},
    "s2-offload": {"stage": 2, "offload_optimizer": "cpu"},
    "s3-offload": {"stage": 3, "offload_optimizer": "cpu"},
    "s3-offload-param": {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"},
    "s3-release": {"stage": 3, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0},
    "s0-short": {"stage": 0, "seq_len": 16, "micro_batch": 1},
    "s2-short": {"stage": 2, "seq_len": 16, "micro_batch": 1},
    "s3-short": {"stage": 3, "seq_len": 16, "micro_batch": 1},
}
"""Configurations: stages 0-3 (bf16), gradient accumulation 2, full checkpointing, CPU optimizer offload, ZeRO-3
parameter offload, and ZeRO-3 with stage3_max_live_parameters = reuse distance = 0 (every parameter released after
use) beside the default (1e9: everything gathered stays); "-short": 16 tokens x 1 sample, where the model states
outweigh the activations."""

PEAK_RUNS: tuple[str, ...] = tuple(f"{fam}-{var}" for fam in PEAK_FAMILIES for var in _VARIANTS)
PEAK_SEQ_LEN = 128
PEAK_MICRO_BATCH = 2


def peak_scenario(name: str) -> tuple[Scenario, dict[str, Any]]:
    """(Scenario, HF config) of the :data:`PEAK_RUNS` run ``name``: the tiny model on one node of
    :data:`PEAK_RANKS` GPUs, bf16, AdamW, sequence :data:`PEAK_SEQ_LEN` x micro-batch :data:`PEAK_MICRO_BATCH`,
    the tiny bucket sizes, priced for the engine's CPU ranks (``Assumptions.device = "cpu"``).
    Raises ``KeyError`` for an unknown name."""
    from ..scenarios import build_scenario
    from ..specs import replace

    family, _, variant = name.partition("-")
    if family not in PEAK_FAMILIES or variant not in _VARIANTS:
        raise KeyError(f"unknown step-peak run {name!r}; known: {', '.join(PEAK_RUNS)}")
    cfg = dict(PEAK_FAMILIES[family])
    values = {"gpus_per_node": PEAK_RANKS, "nodes": 1, "precision": "bf16", "optimizer": "adamw",
              "seq_len": PEAK_SEQ_LEN, "micro_batch": PEAK_MICRO_BATCH, "grad_accum": 1, "checkpointing": "none",
              "flash_attention": True, **_TINY_ZERO, **_VARIANTS[variant]}
    sc = build_scenario(hf_config=cfg, **values)
    return replace(sc, assumptions=replace(sc.assumptions, device="cpu")), cfg


def peak_plan(names: list[str] | tuple[str, ...] = PEAK_RUNS, *, steps: int = PEAK_STEPS) -> dict[str, Any]:
    """The worker plan for ``names``: each run's HF config, its DeepSpeed config (:func:`engine_config`, CPU) and
    the shapes."""
    from . import engine_config

    runs = []
    for name in names:
        sc, cfg = peak_scenario(name)
        t = sc.training
        runs.append({"name": name, "hf_config": {**cfg, "attn_implementation": "eager" if not t.flash_attention
                                                 else "sdpa"},
                     "ds_config": engine_config(sc, "cpu"), "steps": steps, "micro_batch": t.micro_batch,
                     "seq_len": t.seq_len, "grad_accum": t.grad_accum, "checkpointing": t.checkpointing})
    return {"device": "cpu", "runs": runs, "threads_per_rank": 1}


def measure_step_peaks(names: list[str] | tuple[str, ...] = PEAK_RUNS, *, timeout_seconds: float = 1200.0,
                       out_dir: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run ``names`` on :data:`PEAK_RANKS` CPU ranks in one DeepSpeed launch; returns ``{name: [rank0, rank1]}``
    as the worker wrote them. Raises :class:`~zeroplanner.calibrate.CalibrationError` on a failed launch or a
    timeout, ``KeyError`` for an unknown name."""
    from . import launch_worker, result_dir

    plan = peak_plan(names)
    with result_dir(out_dir, "zeroplanner-peak-") as out:
        results = launch_worker(plan, PEAK_RANKS, out, timeout_seconds, worker=PEAK_WORKER)
    results.pop("_wall_seconds", None)
    return results


def stored_step_peaks() -> dict[str, Any]:
    """The stored census (``zeroplanner/_measurements/step_peaks.json``): ``{"meta": {...}, "runs": {name:
    [rank results]}}``."""
    from importlib.resources import files

    return json.loads(files("zeroplanner").joinpath("_measurements/step_peaks.json").read_text())


PEAK_LAUNCHES = 3
"""Launches per stored census. The store keeps every launch and a row is measured as the median launch's peak (its
highest rank), with the range beside it: a check that the census reproduces. Since the worker counts every thread's
frees (``_peak_worker._count_every_thread``) the launches of a run agree to a few bytes; before, they differed by up
to 14% (frees on gloo's threads were missed)."""


def compact_results(results: dict[str, list[dict[str, Any]]], launch: int = 0) -> dict[str, list[dict[str, Any]]]:
    """What the store keeps of each rank: peak bytes and phase, live bytes after initialisation, and for the last
    step the max / start / end bytes of every (micro-step, phase); ``launch`` numbers the launch."""
    out = {}
    for name, ranks in results.items():
        rows = []
        for r in ranks:
            last = max(p["step"] for p in r["phases"])
            rows.append({"launch": launch, "rank": r["rank"], "peak_bytes": r["peak_bytes"], "peak_phase": r["peak_phase"],
                         "peak_micro": r["peak_micro"], "after_init_bytes": r["after_init_bytes"],
                         "optimizer_class": r["optimizer_class"], "parameters": r["parameters"],
                         "last_step": [{k: p[k] for k in ("micro", "phase", "start_bytes", "max_bytes", "end_bytes")}
                                       for p in r["phases"] if p["step"] == last]})
        out[name] = rows
    return out


def step_peak_rows(stored: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Predicted against measured for every stored run. Per launch the measured peak is that of the rank peaking
    highest (the GPU that would run out first); the row's ``measured_bytes`` and ``measured_phase`` are the median
    launch's (of :data:`PEAK_LAUNCHES`), ``lowest_bytes`` / ``highest_bytes`` the launches' range; then the
    predicted peak and phase (:mod:`zeroplanner.costmodel.timeline`) and the relative error
    (predicted - measured) / measured, and ``error_highest`` against the highest launch."""
    from ..costmodel.context import Candidates, make_context
    from ..costmodel.timeline import PHASES, peak, timeline

    stored = stored if stored is not None else stored_step_peaks()
    rows = []
    for name, ranks in stored["runs"].items():
        sc, _ = peak_scenario(name)
        pk, ph = peak(timeline(make_context(sc), Candidates.from_scenario(sc)))
        launches = sorted({r.get("launch", 0) for r in ranks})
        tops = sorted((max((r for r in ranks if r.get("launch", 0) == k), key=lambda r: r["peak_bytes"])
                       for k in launches), key=lambda r: r["peak_bytes"])
        mid = tops[(len(tops) - 1) // 2]
        predicted = float(pk.item())
        rows.append({"name": name, "stage": sc.zero.stage, "measured_bytes": mid["peak_bytes"],
                     "measured_phase": mid["peak_phase"], "lowest_bytes": tops[0]["peak_bytes"],
                     "highest_bytes": tops[-1]["peak_bytes"], "launches": len(tops),
                     "predicted_bytes": predicted, "predicted_phase": PHASES[int(ph.item())],
                     "error": (predicted - mid["peak_bytes"]) / mid["peak_bytes"],
                     "error_highest": (predicted - tops[-1]["peak_bytes"]) / tops[-1]["peak_bytes"]})
    return rows


def peak_error_fraction(rows: list[dict[str, Any]], quantile: float = 0.9) -> float:
    """:func:`~zeroplanner.costmodel.measured_peaks.under_prediction_quantile` of the census rows (the measured peak
    of the median launch against the timeline's): the engine's stated error, timeline.ENGINE_MEMORY_ERROR_FRACTION."""
    from ..costmodel.measured_peaks import under_prediction_quantile

    return under_prediction_quantile([(r["measured_bytes"], r["predicted_bytes"]) for r in rows], quantile)
