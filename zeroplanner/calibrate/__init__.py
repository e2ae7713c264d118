"""Ground truth: run the real engine on a scaled-down copy of the user's model and compare with the cost model.

Two measurements, both on real code:

1. :func:`run_calibration` launches DeepSpeed (``python -m deepspeed.launcher.runner --num_gpus N --no_local_rank``;
   gloo on CPU ranks, NCCL on CUDA) on a tiny HF model of the user's family (built from a config dict by
   ``transformers``, nothing downloaded) with the DeepSpeed config :func:`zeroplanner.deepspeed.to_deepspeed_config`
   writes for the scenario, and measures on every rank (``zeroplanner/calibrate/_worker.py``):
   live tensor storages by category, the comms logger's bytes per collective per step, forward/backward/step
   seconds and, on CUDA, ``torch.cuda.max_memory_allocated`` per phase. It then evaluates the cost model on the
   same tiny architecture and a cluster of ``ranks`` GPUs on one node and reports predicted vs measured per term.
2. :func:`measure_activation_bytes` counts the bytes a real HF model saves for backward in one forward pass
   (``torch.autograd.graph.saved_tensors_hooks``, deduplicated by storage, parameters and buffers excluded), plus
   the logits the model returns, and with full checkpointing the largest recomputed layer in backward.

Across nodes, :mod:`zeroplanner.calibrate.distributed` runs the same engine step as one rank of the user's own
torchrun / DeepSpeed / srun job (``zeroplanner calibrate --distributed``).

Torch, DeepSpeed and transformers are imported inside functions only (the core stays importable without them);
a missing one raises :class:`CalibrationError` with the install hint. Measured DeepSpeed version: 0.19.8.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Literal

from ..files import MAX_RESULT_FILE_BYTES, read_regular_file
from ..specs import Architecture, ClusterSpec, Output, Scenario, replace
from ._worker import end_rank

__all__ = [
    "ACTIVATION_CONFIGS",
    "ENGINE_FAMILIES",
    "VALIDATION_CONFIGS",
    "CalibrationError",
    "CalibrationReport",
    "ComparisonRow",
    "calibration_scenario",
    "compare",
    "end_rank",
    "engine_config",
    "wait_or_kill",
    "measure_activation_bytes",
    "predicted_activation_bytes",
    "run_calibration",
    "run_calibrations",
    "tiny_hf_config",
    "validation_scenario",
]

ENGINE_FAMILIES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")
"""HF families the harness can build tiny copies of (others are calibrated with a llama-shaped stand-in)."""

WORKER = Path(__file__).with_name("_worker.py")
INSTALL_HINT = "calibration needs torch, deepspeed and transformers: pip install 'zeroplanner[deepspeed,hf]'"


class CalibrationError(RuntimeError):
    """The calibration could not run or did not finish (missing package, launcher failure, timeout)."""


# ------------------------------------------------------------------------------------------------------------------
# The scaled-down model
# ------------------------------------------------------------------------------------------------------------------

def rank_results(out_dir: Path, stem: str, ranks: int, error_key: str) -> tuple[list[dict], list[tuple[int, Any]]]:
    """The per-rank JSON results ``<stem>.rank<r>.json`` the workers wrote in ``out_dir`` (rank order), and for each
    rank without one ``(rank, message)``: the ``error_key`` field of its ``<stem>.rank<r>.error.json``, or None when
    the rank wrote neither. Shared by the engine runs here and :mod:`zeroplanner.calibrate.ulysses`. Each file is
    read only when it is a regular file of at most :data:`zeroplanner.files.MAX_RESULT_FILE_BYTES` (16 MiB;
    :func:`zeroplanner.files.read_regular_file`), else :class:`~zeroplanner.files.InputFileError` (a ``ValueError``)."""
    results: list[dict] = []
    failed: list[tuple[int, Any]] = []
    for r in range(ranks):
        f = out_dir / f"{stem}.rank{r}.json"
        e = out_dir / f"{stem}.rank{r}.error.json"
        if f.exists():
            results.append(json.loads(read_regular_file(f, MAX_RESULT_FILE_BYTES, "calibration result")))
        else:
            failed.append((r, json.loads(read_regular_file(e, MAX_RESULT_FILE_BYTES, "calibration error report"))
                           [error_key] if e.exists() else None))
    return results, failed

def wait_or_kill(procs, timeout_seconds: float) -> bool:
    """Wait for the rank processes ``procs`` (``(subprocess.Popen, open log file)`` pairs, each started in its own
    session) until ``timeout_seconds`` from now, kill every one still running, close the logs. Returns True when the
    deadline passed first. Shared by the CPU-rank engine launches (:mod:`zeroplanner.calibrate.ulysses` and the
    engine tests)."""
    deadline = time.monotonic() + timeout_seconds
    timed_out = False
    try:
        for proc, _ in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return timed_out


def tiny_hf_config(
    arch: Architecture,
    *,
    hidden_size: int = 64,
    n_layers: int | None = None,
    vocab_size: int | None = None,
    max_heads: int = 4,
    max_positions: int = 1024,
    max_layers: int = 32,
) -> dict[str, Any]:
    """A HF ``config.json`` dict for a tiny model of ``arch``'s family and proportions.

    Kept from ``arch``: family, FFN kind and FFN/hidden ratio, the query/KV head ratio (GQA), tied embeddings,
    biases, learned positions, dropout, the number of layers (up to ``max_layers``) and the vocabulary/hidden
    ratio (so the embedding's share of Ψ is the user's: it matters for ZeRO-3, whose backward does not gather the
    input embedding again, and for how much of a partition boundary a single tensor straddles). Shrunk: hidden
    size, heads (at most ``max_heads``). Families outside :data:`ENGINE_FAMILIES` are represented by a llama config
    with the same ratios. Raises ``ValueError`` for hidden_size < 8, n_layers < 1 or vocab_size < 16.
    """
    if n_layers is None:
        n_layers = max(1, min(arch.n_layers, max_layers))
    if vocab_size is None:
        vocab_size = max(64, min(8192, round(arch.vocab_size / arch.hidden_size * hidden_size)))
    if hidden_size < 8 or n_layers < 1 or vocab_size < 16:
        raise ValueError(f"tiny model too small: hidden_size={hidden_size} (>= 8), n_layers={n_layers} (>= 1), "
                         f"vocab_size={vocab_size} (>= 16)")
    heads = max(1, min(max_heads, arch.n_heads))
    while hidden_size % heads:
        heads -= 1
    group = max(1, arch.n_heads // arch.kv_heads)
    kv = max(1, heads // group)
    while heads % kv:
        kv -= 1
    ffn = max(8, round(arch.ffn_size / arch.hidden_size * hidden_size))
    family = arch.family if arch.family in ENGINE_FAMILIES else "llama"
    drop = 0.1 if arch.dropout else 0.0
    if family == "gpt2":
        return {
            "model_type": "gpt2", "n_embd": hidden_size, "n_layer": n_layers, "n_head": heads, "n_inner": ffn,
            "vocab_size": vocab_size, "n_positions": max_positions, "tie_word_embeddings": arch.tied_embeddings,
            "resid_pdrop": drop, "embd_pdrop": drop, "attn_pdrop": drop,
        }
    if family == "gpt_neox":
        return {
            "model_type": "gpt_neox", "hidden_size": hidden_size, "num_hidden_layers": n_layers,
            "num_attention_heads": heads, "intermediate_size": ffn, "vocab_size": vocab_size,
            "max_position_embeddings": max_positions, "tie_word_embeddings": arch.tied_embeddings,
            "attention_bias": arch.qkv_bias, "use_parallel_residual": getattr(arch, "parallel_attention", True),
            "attention_dropout": drop, "hidden_dropout": drop,
        }
    cfg: dict[str, Any] = {
        "model_type": family, "hidden_size": hidden_size, "num_hidden_layers": n_layers,
        "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn,
        "vocab_size": vocab_size, "max_position_embeddings": max_positions,
        "tie_word_embeddings": arch.tied_embeddings, "attention_dropout": drop,
    }
    if family == "llama":
        cfg.update(attention_bias=bool(arch.qkv_bias), mlp_bias=bool(arch.mlp_bias))
    if family == "mistral":
        cfg["sliding_window"] = None
    return cfg


def _stage3_scaled(user: Scenario, tiny_arch: Architecture) -> dict[str, int]:
    """Stage-3 knobs for the tiny model that reproduce the user's behaviour.

    Element counts (max live parameters, reuse distance, prefetch bucket) scale with Ψ_tiny / Ψ_user; the
    persistence threshold keeps the same parameter kinds whole (DeepSpeed persists ``ds_numel <= threshold``,
    deepspeed/runtime/zero/parameter_offload.py ``mark_persistent_parameters``): vectors the user's threshold
    covers stay persistent, matrices never do.
    """
    z, m = user.zero, user.model
    ratio = tiny_arch.parameter_count / max(user.parameters, 1)
    vector_kinds = [(m.hidden_size, tiny_arch.hidden_size),
                    (m.q_size + 2 * m.kv_size, tiny_arch.q_size + 2 * tiny_arch.kv_size),
                    (m.ffn_size, tiny_arch.ffn_size)]
    persisted = [tiny for full, tiny in vector_kinds if full <= z.stage3_param_persistence_threshold]
    threshold = max(persisted) + 1 if persisted else 0
    return {
        "stage3_param_persistence_threshold": int(threshold),
        "stage3_max_live_parameters": math.ceil(z.stage3_max_live_parameters * ratio),
        "stage3_max_reuse_distance": math.ceil(z.stage3_max_reuse_distance * ratio),
        "stage3_prefetch_bucket_size": math.ceil(z.stage3_prefetch_bucket_size * ratio),
    }


def calibration_scenario(
    scenario: Scenario, ranks: int, hf_config: dict[str, Any] | None = None, *, seq_len: int | None = None,
    micro_batch: int | None = None, scale_stage3: bool = True, nodes: int = 1,
) -> tuple[Scenario, dict[str, Any]]:
    """The scenario the engine actually runs: the tiny model of ``scenario``'s architecture (or ``hf_config``),
    ``ranks`` GPUs in all on ``nodes`` nodes (default one), one micro-step per step (grad_accum = 1), the given
    sequence length and micro-batch (defaults 64 and 1), and stage-3 knobs scaled to the tiny model
    (:func:`_stage3_scaled`).

    Returns (scenario, hf_config). Raises ``ValueError`` for ranks < 1, ``nodes`` not dividing ``ranks`` or an
    unsupported HF config.
    """
    from ..catalog.hfconfig import architecture_from_hf_config

    if ranks < 1:
        raise ValueError(f"ranks={ranks} must be >= 1")
    if nodes < 1 or ranks % nodes:
        raise ValueError(f"nodes={nodes} must be >= 1 and divide ranks={ranks}")
    cfg = dict(hf_config) if hf_config is not None else tiny_hf_config(scenario.model)
    tiny = architecture_from_hf_config(cfg, name=f"tiny-{scenario.model.name}"[:200])
    cluster = ClusterSpec.model_validate({**scenario.cluster.model_dump(), "gpus_per_node": ranks // nodes,
                                          "nodes": nodes, "tensor_parallel_size": 1})
    training = replace(scenario.training, seq_len=seq_len or 64, micro_batch=micro_batch or 1, grad_accum=1)
    zero = scenario.zero
    if scale_stage3 and zero.stage == 3:
        zero = replace(zero, **_stage3_scaled(scenario, tiny))
    return Scenario(model=tiny, cluster=cluster, training=training, zero=zero,
                    assumptions=scenario.assumptions), cfg


VALIDATION_CONFIGS: dict[int, tuple[str, ...]] = {
    2: ("s0_bf16", "s0_fp32", "s1_bf16", "s1_fp32", "s2_bf16", "s2_fp32", "s3_bf16", "s3_fp32",
        "s1_bf16_off", "s2_bf16_off", "s3_fp32_off"),
    4: ("s0_fp32", "s1_bf16", "s2_fp32", "s3_bf16", "s2_bf16_off", "s3_bf16_off"),
}
"""The engine configurations of the ground-truth suite and docs/validation.md, per rank count: every stage in bf16
and fp32, with and without ``offload_optimizer: cpu``, at 2 ranks; every stage, both precisions and both offload
settings again at 4 ranks (a covering set: 4 ranks on 2 cores is slow). Names: ``s<stage>_<precision>[_off]``."""


def validation_scenario(name: str, ranks: int, *, release_all: bool = True) -> Scenario:
    """The Llama-2-7B scenario behind a :data:`VALIDATION_CONFIGS` name on ``ranks`` GPUs of one node, one
    micro-step per step, no activation checkpointing.

    ``release_all`` (stage 3): ``stage3_max_reuse_distance = stage3_max_live_parameters = 0``, so every parameter is
    released after use and gathered again in backward (measured: then the all-gather volume is the cost model's
    2x). With DeepSpeed's defaults (scaled to the tiny model) up to ``stage3_max_live_parameters`` elements stay
    gathered from forward into backward; docs/validation.md shows that case separately.
    Raises ``ValueError`` for a malformed name."""
    from ..scenarios import build_scenario

    parts = name.split("_")
    if len(parts) not in (2, 3) or not parts[0].startswith("s") or parts[1] not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"validation name {name!r}: expected s<stage>_<precision>[_off]")
    stage = int(parts[0][1:])
    offload = "cpu" if parts[-1] == "off" else "none"
    overrides = ({"stage3_max_reuse_distance": 0, "stage3_max_live_parameters": 0}
                 if stage == 3 and release_all else {})
    return build_scenario(model="llama-2-7b", stage=stage, precision=parts[1], offload_optimizer=offload,
                          gpus_per_node=ranks, grad_accum=1, checkpointing="none", zero_overrides=overrides)


def engine_config(scenario: Scenario, device: Literal["cpu", "cuda"] = "cpu") -> dict[str, Any]:
    """The DeepSpeed config the harness runs: :func:`zeroplanner.deepspeed.to_deepspeed_config` plus the comms logger
    (``{"enabled": true, "verbose": false, "prof_all": true}``).

    On CPU ranks without optimizer offload the optimizer block gains ``"torch_adam": true`` (DeepSpeed otherwise
    JIT-compiles its FusedAdam CPU op; torch's AdamW keeps the same fp32 ``exp_avg``/``exp_avg_sq`` states).
    With ``offload_optimizer`` DeepSpeed's own ``DeepSpeedCPUAdam`` runs, as in production.
    """
    from ..deepspeed import to_deepspeed_config

    cfg = to_deepspeed_config(scenario)
    cfg["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True, "debug": False}
    cfg["steps_per_print"] = 10**9
    opt = cfg.get("optimizer")
    if device == "cpu" and opt and opt["type"] in ("Adam", "AdamW") and scenario.zero.offload_optimizer.device == "none":
        opt["params"]["torch_adam"] = True
    return cfg


# ------------------------------------------------------------------------------------------------------------------
# Launching the engine
# ------------------------------------------------------------------------------------------------------------------
def _require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise CalibrationError(f"missing {', '.join(missing)}; {INSTALL_HINT}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def result_dir(out_dir: str | os.PathLike[str] | None, prefix: str) -> Iterator[Path]:
    """``out_dir`` as a Path, or a temporary directory named ``prefix...`` that is removed on exit (raw per-rank
    results are kept only where the caller asked for them)."""
    if out_dir is not None:
        yield Path(out_dir)
        return
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        yield Path(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def launch_worker(plan: dict[str, Any], ranks: int, out_dir: Path, timeout_seconds: float, *,
                  worker: Path = WORKER) -> dict[str, Any]:
    """Run ``worker`` (default ``calibrate/_worker.py``; the step-peak census passes ``_peak_worker.py``) on ``ranks`` local ranks through DeepSpeed's launcher; returns per-run, per-rank
    results ``{name: [rank0, rank1, ...]}``. Raises :class:`CalibrationError` on a timeout (the launcher's process
    group is interrupted in the last quarter of ``timeout_seconds``, at most 5 s, then killed), a failed launch, or
    a rank that wrote no result."""
    _require("torch", "deepspeed", "transformers")
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = out_dir / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--num_gpus", str(ranks), "--no_local_rank",
           "--master_port", str(_free_port()), str(worker), "--plan", str(plan_path), "--out", str(out_dir)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    if plan["device"] == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    log_path = out_dir / "launcher.log"
    started = time.perf_counter()
    from ..probe.benchmarks import interrupt_seconds_for, stop_process_group

    # interrupted, not killed, at the end of its time: a rank in DeepSpeed's first JIT build of cpu_adam (an
    # offload run) removes the build's lock
    interrupt_seconds = interrupt_seconds_for(timeout_seconds)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_seconds - interrupt_seconds)
        except subprocess.TimeoutExpired:
            stop_process_group(proc, interrupt_seconds)
            raise CalibrationError(f"DeepSpeed launch did not finish within {timeout_seconds:.0f} s (log: {log_path})")
    results: dict[str, Any] = {"_wall_seconds": time.perf_counter() - started}
    errors = []
    for run in plan["runs"]:
        per_rank, failed = rank_results(out_dir, run["name"], ranks, "error")
        errors += [message for _rank, message in failed if message is not None]
        results[run["name"]] = per_rank
        if len(per_rank) != ranks:
            errors.append(f"run {run['name']}: {len(per_rank)} of {ranks} ranks reported")
    if rc != 0 or errors:
        tail = log_path.read_text()[-3000:]
        raise CalibrationError(f"DeepSpeed launch failed (exit {rc}): {'; '.join(errors[:3]) or 'no results'}\n"
                               f"--- launcher log tail ---\n{tail}")
    return results


# ------------------------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------------------------


class ComparisonRow(Output):
    """One predicted-vs-measured pair. relative_error = (predicted - measured) / measured (None if measured is 0)."""

    term: str
    unit: str
    predicted: float
    measured: float
    relative_error: float | None
    note: str = ""


class CalibrationReport(Output):
    """Predicted vs measured for one scenario run on the real engine (per rank: the largest value over ranks)."""

    name: str
    device: str
    ranks: int
    steps: int
    deepspeed_version: str
    scenario: dict[str, Any]
    hf_config: dict[str, Any]
    parameters: int
    memory: list[ComparisonRow]
    communication: list[ComparisonRow]
    timings: dict[str, float]
    census: dict[str, dict[str, int]]
    census_totals: dict[str, dict[str, int]]
    cuda: dict[str, int] | None = None
    wall_seconds: float = 0.0

    def row(self, term: str) -> ComparisonRow:
        for r in self.memory + self.communication:
            if r.term == term:
                return r
        raise KeyError(term)

    def table(self) -> str:
        """Plain-text table: term, predicted, measured, relative error."""
        lines = [(f"{self.name}: {self.ranks} {self.device} ranks, DeepSpeed {self.deepspeed_version}, "
                 f"Ψ={self.parameters:,}"),
                 f"{'term':<34}{'predicted':>16}{'measured':>16}{'error':>9}  unit"]
        for r in self.memory + self.communication:
            err = "-" if r.relative_error is None else f"{100 * r.relative_error:+.1f}%"
            lines.append(f"{r.term:<34}{r.predicted:>16,.0f}{r.measured:>16,.0f}{err:>9}  {r.unit}")
        t = self.timings
        lines.append(f"measured seconds per step (last step, max over ranks): forward {t['forward_seconds']:.4f}, "
                     f"backward {t['backward_seconds']:.4f}, optimizer step {t['step_seconds']:.4f}")
        return "\n".join(lines)


def _rel(predicted: float, measured: float) -> float | None:
    return None if measured == 0 else (predicted - measured) / measured


HOST_PATH_MARKS = ("for_cpu_offload", "param_groups", "fp32", "[state]", "grad_partitions_flat_buffer")
"""Census paths that live in host memory when the optimizer is offloaded (stage_1_and_2.py / stage3.py keep the
fp32 master partition, the optimizer states, the fp32 gradient partition and the ``*_for_cpu_offload`` staging
buffers on the CPU; stage3.py allocates ``grad_partitions_flat_buffer`` on ``self.device``, the CPU when offloading)."""


def _split_census(census: dict[str, Any], offload: bool) -> tuple[dict[str, int], dict[str, int]]:
    """(device bytes by category, host bytes by category) from a census's ``by_path`` entries."""
    device: dict[str, int] = {}
    host: dict[str, int] = {}
    for key, nbytes in census["by_path"].items():
        cat, path = key.split("|")[:2]
        on_host = offload and (cat in ("master_parameters", "optimizer_states") or
                               any(mark in path for mark in HOST_PATH_MARKS))
        bucket = host if on_host else device
        bucket[cat] = bucket.get(cat, 0) + int(nbytes)
    return device, host


def measured_terms(rank_result: dict[str, Any], offload: bool) -> dict[str, int]:
    """Per-rank measured terms in the cost model's categories.

    parameters: 16-bit (or fp32) working parameters in the census during the optimizer step (ZeRO-3: the
    partition plus persistent parameters); gradients: the largest of the censuses after backward, at the gradient
    peak and during the step; optimizer_states: fp32 master weights + optimizer states during the step; buffers: the largest
    reduction bucket / staging buffer seen, plus gathered ZeRO-3 parameters at the end of backward beyond the
    partition; host: everything the optimizer offload keeps on the host during the step. ZeRO-1/2 also take a
    census inside ``free_grad_in_param_list`` (``step_peak``), where the fp32 gradient partition and the 16-bit
    one are alive together.
    """
    c = rank_result["census"]
    step_dev, step_host = _split_census(c["during_step"], offload)
    back_dev, _back_host = _split_census(c.get("after_backward", c["during_step"]), offload)
    peak_dev, peak_host = _split_census(c.get("step_peak", c["during_step"]), offload)
    end_dev, _ = _split_census(c.get("end_of_backward", c["during_step"]), offload)
    buffers = max(d.get("buffers", 0) for d in (step_dev, back_dev, end_dev))
    gathered = max(0, end_dev.get("parameters", 0) - step_dev.get("parameters", 0))
    return {
        "parameters": step_dev.get("parameters", 0),
        "gradients": max(d.get("gradients", 0) for d in (step_dev, back_dev, peak_dev)),
        "optimizer_states": step_dev.get("master_parameters", 0) + step_dev.get("optimizer_states", 0),
        "buffers": buffers + gathered,
        "host": max(sum(step_host.values()), sum(peak_host.values())),
    }


def measured_comms(rank_result: dict[str, Any], world: int) -> dict[str, int]:
    """Message bytes per collective in the last step, in nccl-tests "size" terms (as the cost model counts them):
    all-reduce = the tensor, reduce-scatter = its input, all-gather = its output. DeepSpeed's comms logger records
    the ``tensor`` argument (deepspeed/comm/utils.py ``get_msg_size_from_args``): the input shard of
    ``all_gather_into_tensor``, so gathers are multiplied by the world size."""
    last = rank_result["comms"][-1]
    out = {"all_reduce": 0, "reduce_scatter": 0, "all_gather": 0, "broadcast": 0, "other": 0}
    for op, v in last.items():
        if op in ("all_reduce", "all_reduce_coalesced", "inference_all_reduce"):
            out["all_reduce"] += v["bytes"]
        elif op in ("reduce_scatter_tensor", "reduce_scatter"):
            out["reduce_scatter"] += v["bytes"]
        elif op in ("all_gather_into_tensor", "all_gather"):
            out["all_gather"] += v["bytes"] * world
        elif op == "broadcast":
            out["broadcast"] += v["bytes"]
        else:
            out["other"] += v["bytes"]
    return out


def compare(name: str, scenario: Scenario, hf_config: dict[str, Any], per_rank: list[dict[str, Any]],
            steps: int, device: str, wall_seconds: float = 0.0,
            activation_measurement: dict[str, int] | None = None) -> CalibrationReport:
    """Evaluate the cost model on ``scenario`` (the tiny one the engine ran) and set it beside the measurements.
    ``activation_measurement``: a :func:`measure_activation_bytes` result for the same tiny model, compared with
    the activation term."""
    from ..costmodel import Candidates, evaluate, make_context

    v = evaluate(make_context(scenario), Candidates.from_scenario(scenario)).at(0)
    m, c = v.per_gpu_bytes, v.communication
    pred = {"parameters": float(m.parameters), "gradients": float(m.gradients),
            "optimizer_states": float(m.optimizer_states), "buffers": float(m.buffers),
            "activations": float(m.activations), "host_per_node": float(v.per_node_cpu_bytes),
            "comm_all_reduce": float(c.all_reduce), "comm_reduce_scatter": float(c.reduce_scatter),
            "comm_all_gather": float(c.all_gather), "comm_wire_bytes": float(c.bytes_per_gpu_per_step)}
    offload = scenario.zero.offload_optimizer.device != "none"
    world = len(per_rank)
    terms = [measured_terms(r, offload) for r in per_rank]
    meas = {k: max(t[k] for t in terms) for k in terms[0]}
    memory = []
    for k in ("parameters", "gradients", "optimizer_states"):
        memory.append(ComparisonRow(term=k, unit="bytes/rank", predicted=pred[k], measured=meas[k],
                                    relative_error=_rel(pred[k], meas[k])))
    ms_pred = pred["parameters"] + pred["gradients"] + pred["optimizer_states"]
    ms_meas = meas["parameters"] + meas["gradients"] + meas["optimizer_states"]
    memory.append(ComparisonRow(term="model_states", unit="bytes/rank", predicted=ms_pred, measured=ms_meas,
                                relative_error=_rel(ms_pred, ms_meas),
                                note="parameters + gradients + optimizer states (incl. fp32 master)"))
    memory.append(ComparisonRow(term="buffers", unit="bytes/rank", predicted=pred["buffers"],
                                measured=meas["buffers"], relative_error=_rel(pred["buffers"], meas["buffers"]),
                                note="reduction buckets, offload staging, gathered stage-3 parameters"))
    if activation_measurement is not None:
        am = float(activation_measurement["total"])
        memory.append(ComparisonRow(term="activations", unit="bytes/micro-batch", predicted=pred["activations"],
                                    measured=am, relative_error=_rel(pred["activations"], am),
                                    note="saved-for-backward bytes of the same tiny model (measure_activation_bytes)"))
    host_pred = pred["host_per_node"] / scenario.cluster.gpus_per_node
    memory.append(ComparisonRow(term="host_offload", unit="bytes/rank", predicted=host_pred, measured=meas["host"],
                                relative_error=_rel(host_pred, meas["host"]),
                                note="optimizer offload: host RAM per rank (cost model: host_per_node / GPUs)"))
    comms = [measured_comms(r, world) for r in per_rank]
    cm = {k: max(c[k] for c in comms) for k in comms[0]}
    communication = []
    for k in ("all_reduce", "reduce_scatter", "all_gather"):
        communication.append(ComparisonRow(term=f"comm_{k}", unit="bytes/step", predicted=pred[f"comm_{k}"],
                                           measured=cm[k], relative_error=_rel(pred[f"comm_{k}"], cm[k]),
                                           note="message bytes (nccl-tests size) per rank per step"))
    frac = (world - 1) / world if world > 1 else 0.0
    wire_meas = (2 * cm["all_reduce"] + cm["reduce_scatter"] + cm["all_gather"]) * frac
    communication.append(ComparisonRow(term="comm_wire", unit="bytes/step", predicted=pred["comm_wire_bytes"],
                                       measured=wire_meas, relative_error=_rel(pred["comm_wire_bytes"], wire_meas),
                                       note="ring volume sent per rank: 2(n-1)/n all-reduce + (n-1)/n others"))
    if cm["broadcast"] or cm["other"]:
        communication.append(ComparisonRow(term="comm_broadcast_and_other", unit="bytes/step", predicted=0.0,
                                           measured=cm["broadcast"] + cm["other"], relative_error=None,
                                           note="not modelled (stage-3 trace bookkeeping)"))
    last = [r["timings"][-1] for r in per_rank]
    timings = {k: max(t[k] for t in last) for k in ("forward_seconds", "backward_seconds", "step_seconds")}
    census = {phase: per_rank[0]["census"][phase]["bytes"] for phase in per_rank[0]["census"]}
    census_totals = {
        phase: {k: max(int(r["census"][phase][k]) for r in per_rank if phase in r["census"])
                for k in ("attributed_bytes", "gc_total_bytes", "unattributed_bytes")}
        for phase in per_rank[0]["census"]
    }
    cuda = None
    if device == "cuda" and "cuda" in per_rank[0]:
        cuda = {"after_init_max_allocated_bytes": max(r["cuda"]["after_init_max_allocated_bytes"] for r in per_rank)}
        for key in ("forward_max_allocated_bytes", "backward_max_allocated_bytes", "step_max_allocated_bytes"):
            cuda[key] = max(r["cuda"]["phases"][-1][key] for r in per_rank)
    import deepspeed

    return CalibrationReport(
        name=name, device=device, ranks=world, steps=steps, deepspeed_version=deepspeed.__version__,
        scenario=json.loads(scenario.model_dump_json()), hf_config=hf_config, parameters=per_rank[0]["parameters"],
        memory=memory, communication=communication, timings=timings, census=census,
        census_totals=census_totals, cuda=cuda,
        wall_seconds=wall_seconds,
    )


def run_calibrations(
    scenarios: list[Scenario] | dict[str, Scenario],
    *,
    ranks: int = 2,
    steps: int = 3,
    device: Literal["cpu", "cuda"] = "cpu",
    timeout_seconds: float = 600.0,
    hf_config: dict[str, Any] | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    scale_stage3: bool = True,
    measure_activations: bool = True,
) -> list[CalibrationReport]:
    """Calibrate several scenarios in ONE launch (the interpreter and import start-up is paid once; each scenario
    gets a fresh model and engine). See :func:`run_calibration` for the arguments; ``measure_activations`` also
    counts the tiny model's saved-for-backward bytes in this process (:func:`measure_activation_bytes`, CPU; not
    for selective checkpointing or fp16) and adds an "activations" row.

    Raises ``ValueError`` for ranks < 1, steps < 2 (the last step must follow a completed one: ZeRO-3 traces its
    parameter order in the first), an unknown device or no CUDA for device="cuda"; :class:`CalibrationError` if
    the engine cannot run or times out.
    """
    if isinstance(scenarios, dict):
        named = list(scenarios.items())
    else:
        named = [(f"run{i}", s) for i, s in enumerate(scenarios)]
    if not named:
        raise ValueError("scenarios: give at least one scenario")
    if not (1 <= ranks <= 64):
        raise ValueError(f"ranks={ranks} must be between 1 and 64")
    if not (2 <= steps <= 100):
        raise ValueError(f"steps={steps} must be between 2 and 100")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: allowed 'cpu' or 'cuda'")
    _require("torch", "deepspeed", "transformers")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < ranks:
            raise CalibrationError(f"device='cuda' needs {ranks} CUDA devices; found "
                                   f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}")
    runs, small = [], []
    for name, sc in named:
        tiny, cfg = calibration_scenario(sc, ranks, hf_config, seq_len=seq_len, micro_batch=micro_batch,
                                         scale_stage3=scale_stage3)
        small.append((name, tiny, cfg))
        runs.append({"name": name, "hf_config": cfg, "ds_config": engine_config(tiny, device), "steps": steps,
                     "micro_batch": tiny.training.micro_batch, "seq_len": tiny.training.seq_len,
                     "checkpointing": "full" if tiny.training.checkpointing == "full" else "none"})
    plan = {"device": device, "runs": runs, "threads_per_rank": 1}
    with result_dir(out_dir, "zeroplanner-calibrate-") as out:
        results = launch_worker(plan, ranks, out, timeout_seconds)
    wall = results["_wall_seconds"]
    reports = []
    for name, tiny, cfg in small:
        t = tiny.training
        act = None
        if measure_activations and t.checkpointing in ("none", "full") and t.precision in ("bf16", "fp32"):
            act = measure_activation_bytes(cfg, seq_len=t.seq_len, micro_batch=t.micro_batch,
                                           checkpointing=t.checkpointing, precision=t.precision,
                                           attn_implementation="sdpa" if t.flash_attention else "eager")
        reports.append(compare(name, tiny, cfg, results[name], steps, device, wall, act))
    return reports


def run_calibration(scenario: Scenario, **options: Any) -> CalibrationReport:
    """Run DeepSpeed on ``ranks`` local ranks with a tiny model of ``scenario``'s architecture (or ``hf_config``) and
    the config zeroplanner generates for it, ``steps`` optimizer steps (the last is measured), and compare with
    the cost model evaluated on the same tiny architecture and a one-node cluster of ``ranks`` GPUs.

    device: "cpu" (gloo; a census of live tensor storages stands in for device memory) or "cuda" (NCCL; also
    ``torch.cuda.max_memory_allocated`` per phase). Bounded by ``timeout_seconds``. Raw per-rank JSON is kept in
    ``out_dir`` when given. Keyword arguments (``ranks``, ``steps``, ``device``, ``timeout_seconds``,
    ``hf_config``, ``seq_len``, ``micro_batch``, ``out_dir``, ...) and errors as :func:`run_calibrations`.
    """
    return run_calibrations({"calibration": scenario}, **options)[0]


# ------------------------------------------------------------------------------------------------------------------
# Activation ground truth
# ------------------------------------------------------------------------------------------------------------------
_ACT_BASE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512,
             "max_position_embeddings": 1024}
ACTIVATION_CONFIGS: dict[str, dict[str, Any]] = {
    # GQA 4 query / 2 KV heads, SwiGLU 176 wide, RMSNorm, rotary
    "llama": {"model_type": "llama", "num_key_value_heads": 2, "intermediate_size": 176, **_ACT_BASE},
    "qwen2": {"model_type": "qwen2", "num_key_value_heads": 2, "intermediate_size": 176, **_ACT_BASE},
    "mistral": {"model_type": "mistral", "num_key_value_heads": 2, "intermediate_size": 176, "sliding_window": None,
                **_ACT_BASE},
    # fused QKV, learned positions, LayerNorm, gelu_new; dropout off
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 1024,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    # fused QKV, partial rotary, parallel residual, exact GELU
    "gpt_neox": {"model_type": "gpt_neox", "intermediate_size": 256, **_ACT_BASE},
}
"""Tiny configs of five HF families for the activation ground truth (tests and docs/validation.md)."""


def measure_activation_bytes(
    hf_config: dict[str, Any],
    *,
    seq_len: int,
    micro_batch: int = 1,
    checkpointing: Literal["none", "full"] = "none",
    precision: Literal["bf16", "fp32"] = "bf16",
    attn_implementation: Literal["sdpa", "eager"] = "sdpa",
    seed: int = 0,
    gpu_kernel_stand_ins: bool = False,
) -> dict[str, int]:
    """Bytes a real HF causal LM keeps for backward after one training forward pass, measured on CPU.

    The model is built from ``hf_config`` (``transformers.AutoConfig.for_model``; no download), cast to bf16 as
    DeepSpeed's bf16 mode casts the module (no autocast), put in train mode, and run on random token ids with
    ``labels = input_ids`` and ``use_cache=False`` (training: no KV cache; HF turns it off itself under
    gradient checkpointing, and a cache makes concatenated K/V copies). Counted with ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd saves,
    deduplicated by ``untyped_storage().data_ptr()``, parameter and buffer storages excluded. Full checkpointing
    is HF's ``activation_checkpointing_enable`` with ``use_reentrant=True`` (the reentrant function saves the layer
    inputs through ``save_for_backward``, so the hooks see them; the recomputation in backward is measured the same
    way: everything saved during backward, divided by the number of (identical) layers).

    Returns bytes: ``saved`` (forward), ``logits`` (the logits tensor the model returns, alive until backward),
    ``recompute_peak`` (one layer's saved bytes during its recomputation in backward; 0 without checkpointing),
    ``total`` = saved + logits (not already saved) + recompute_peak, and ``parameters`` (count).

    ``gpu_kernel_stand_ins``: run the forward and backward inside
    :func:`zeroplanner.calibrate.kernel_stand_ins.gpu_kernel_stand_ins`, so that Qwen3-Next's Gated DeltaNet core
    and short convolution and Nemotron-H's fused Mamba-2 path save what their CUDA kernels (fla,
    causal_conv1d, mamba_ssm) save, not what transformers' reference PyTorch implementations save; everything
    outside those cores runs and is measured as without it.
    """
    _require("torch", "transformers")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config)
    model_type = cfg.pop("model_type")
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **cfg)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    model.train()
    if checkpointing == "full":
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    excluded = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}

    state = {"phase": "forward"}
    forward: dict[int, int] = {}
    recomputed: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # saved tensors stay referenced so no address is reused and counted once

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr and ptr not in excluded and t.device.type != "meta":
            if state["phase"] == "forward":
                if ptr not in forward:
                    forward[ptr] = s.nbytes()
                    keep.append(t)
            elif ptr not in forward and ptr not in recomputed:
                recomputed[ptr] = s.nbytes()
                keep.append(t)
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, config.vocab_size, (micro_batch, seq_len), generator=gen)
    if gpu_kernel_stand_ins:
        from .kernel_stand_ins import gpu_kernel_stand_ins as cores
    else:
        cores = contextlib.nullcontext
    with cores(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = model(input_ids=ids, labels=ids, use_cache=False)
        state["phase"] = "backward"
        logits_ptr = out.logits.untyped_storage().data_ptr()
        logits_bytes = 0 if logits_ptr in forward else out.logits.untyped_storage().nbytes()
        out.loss.backward()
    n_layers = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 1))
    saved = sum(forward.values())
    # Every tensor saved during backward belongs to a recomputed layer; the layers are identical, so one layer's
    # recomputation holds the total divided by the layer count (0 without checkpointing: nothing is recomputed).
    recompute = sum(recomputed.values()) // max(n_layers, 1) if checkpointing == "full" else 0
    return {
        "saved": int(saved),
        "logits": int(logits_bytes),
        "recompute_peak": int(recompute),
        "total": int(saved + logits_bytes + recompute),
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }


def predicted_activation_bytes(hf_config: dict[str, Any], *, seq_len: int, micro_batch: int = 1,
                               checkpointing: Literal["none", "full"] = "none",
                               precision: Literal["bf16", "fp32"] = "bf16", flash_attention: bool = True) -> float:
    """The cost model's activation term (bytes per GPU for one micro-batch) for the same tiny architecture."""
    from .. import catalog
    from ..costmodel import Candidates, make_context
    from ..costmodel.activations import activation_bytes
    from ..catalog.hfconfig import architecture_from_hf_config
    from ..specs import NetworkSpec, TrainingSpec

    arch = architecture_from_hf_config(hf_config, name="tiny")
    cluster = ClusterSpec(gpu=catalog.gpu("A100-80GB"), gpus_per_node=1, nodes=1,
                          network=NetworkSpec(name="none", link_gbps=100))
    training = TrainingSpec(precision=precision, micro_batch=micro_batch, grad_accum=1, seq_len=seq_len,
                            checkpointing=checkpointing, flash_attention=flash_attention)
    sc = Scenario(model=arch, cluster=cluster, training=training)
    return float(activation_bytes(make_context(sc), Candidates.from_scenario(sc)).reshape(-1)[0])
