"""The engine as judge of a DeepSpeed config: :func:`judge_config` runs it on one CPU rank (``_config_judge.py``: the HF
Trainer's whole path, or ``deepspeed.initialize`` and one step) and says whether the engine accepted it.

Used to establish the truth of the public configs in ``tests/data/public_ds_configs`` (``benchmarks/
judge_public_configs.py`` stores it in ``judged.json``), against which ``zeroplanner check`` is tested: it must report
an error exactly when the engine refuses.

Two things differ from the user's cluster and are made equal on both sides (the judge and ``check`` see the same
dict, on one GPU):

- the world size: :func:`for_one_rank` rewrites a concrete ``train_batch_size`` that is micro x accumulation x k
  for a whole k (the config's own GPU count) to micro x accumulation, so the batch arithmetic holds on one rank as
  it held on k; a ``train_batch_size`` no world can satisfy is kept (the engine refuses it anywhere);
- the machine: a refusal whose cause is this machine and not the config (:data:`ENVIRONMENT_CAUSES`: no CUDA, no
  libaio for NVMe offload, a GPU-only optimizer) is reported as ``environment``, not as a verdict on the config.

Torch, DeepSpeed and transformers are imported by the worker only.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

JUDGE_WORKER = Path(__file__).with_name("_config_judge.py")

ENVIRONMENT_CAUSES = (
    r"async_io", r"\blibaio\b", r"AsyncIOBuilder", r"Torch not compiled with CUDA", r"CUDA is not available",
    r"no CUDA GPUs are available", r"NCCL (?:error|backend)", r"\bcupy\b", r"No module named 'apex'",
    r"requires a GPU", r"GPU is not available", r"mpi4py",
)
"""Patterns of a refusal caused by this CPU-only machine (DeepSpeed's op builders and GPU-only optimizers such as
1-bit LAMB's compressed backend, NVMe offload without libaio, Apex), not by the config."""


def for_one_rank(config: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """(config judged on one rank, the GPU count its concrete batch keys imply or None): see the module
    docstring."""
    out = copy.deepcopy(config)
    num = (lambda v: v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None)
    total, micro = num(out.get("train_batch_size")), num(out.get("train_micro_batch_size_per_gpu"))
    accum = num(out.get("gradient_accumulation_steps"))
    if total and micro and accum and total % (micro * accum) == 0:
        out["train_batch_size"] = micro * accum
        return out, total // (micro * accum)
    if total and micro and not accum and "gradient_accumulation_steps" not in out and total % micro == 0:
        return out, None  # DeepSpeed derives the accumulation for whatever world it runs on
    return out, None


def classify(error: str) -> str:
    """"environment" when ``error`` names a cause of this machine (:data:`ENVIRONMENT_CAUSES`), else "refused"."""
    return "environment" if any(re.search(p, error) for p in ENVIRONMENT_CAUSES) else "refused"


def judge_config(config: dict[str, Any], mode: str, *, timeout_seconds: float = 240.0) -> dict[str, Any]:
    """Run ``config`` (already :func:`for_one_rank`) on one CPU rank in ``mode`` ("hf_trainer" or "deepspeed").

    Returns ``{"verdict": "accepted" | "refused" | "environment", "error": str, "phase": str}``. Raises
    ``subprocess.TimeoutExpired`` when the launch runs past ``timeout_seconds`` and ``RuntimeError`` when the worker
    wrote no result."""
    from . import _free_port

    with tempfile.TemporaryDirectory(prefix="zeroplanner-judge-") as tmp:
        path, out = Path(tmp) / "config.json", Path(tmp) / "result.json"
        path.write_text(json.dumps(config))
        cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--no_local_rank",
               "--master_port", str(_free_port()), str(JUDGE_WORKER), "--config", str(path), "--mode", mode,
               "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_seconds, env=env, cwd=tmp)
        if not out.exists():
            raise RuntimeError(f"the judge wrote no result (exit {proc.returncode}): {proc.stdout[-1500:]}")
        result = json.loads(out.read_text())
    if result["accepted"]:
        return {"verdict": "accepted", "error": "", "phase": ""}
    return {"verdict": classify(result["error"]), "error": result["error"], "phase": result["phase"]}
