"""DeepSpeed configs: generate a complete one from a scenario, read a user's own back into a scenario.

Three entry points (the linter lives in :mod:`zeroplanner.lint`):

* :func:`to_deepspeed_config` -- scenario (or plan) -> a DeepSpeed JSON config (a ``dict``), either for raw
  ``deepspeed.initialize`` (``mode="deepspeed"``, every value concrete) or for the Hugging Face Trainer
  (``mode="hf_trainer"``, ``"auto"`` wherever the Trainer fills the value; :func:`hf_auto_values` says what it will
  fill them with). :func:`to_accelerate_config` writes the matching ``accelerate launch --config_file`` YAML.
* :func:`from_deepspeed_config` -- a user's config (dict, JSON text or bytes) -> ``(Scenario, findings)`` so the
  cost model can price it. Unknown keys, ``"auto"`` values and values that had to be reinterpreted are reported as
  :class:`Finding` objects, never dropped silently.
* :func:`load_config_text` -- the safe reader both use: size limit (:data:`MAX_CONFIG_BYTES`), nesting limit
  (:data:`MAX_DEPTH`), ``json.loads`` and, for what strict JSON refuses, ``hjson`` as DeepSpeed itself reads files
  (no eval, no YAML tags); duplicate keys and non-strict syntax reported for the client that reads the file.

Key names, types and defaults follow DeepSpeed 0.19.8 (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``, ``deepspeed/runtime/zero/offload_config.py``,
``deepspeed/runtime/precision_config.py``); the ``"auto"`` rules follow transformers 5.24.0
(``transformers/integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
``trainer_config_finalize``). This module imports only the zeroplanner core (no torch, no deepspeed); the tests
check every generated config with DeepSpeed's own config classes.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .inputs import stage3_only, zero_aliases
from .specs import OffloadSpec, Scenario, TrainingSpec, ZeroSpec

Mode = Literal["deepspeed", "hf_trainer"]
Severity = Literal["error", "warning", "info"]

MAX_CONFIG_BYTES = 1_000_000
"""Largest config text accepted (bytes, UTF-8). Real DeepSpeed configs are a few KB; 1 MB leaves a wide margin
while keeping a pasted 50 MB blob from being parsed at all."""

MAX_DEPTH = 32
"""Deepest nesting of JSON objects/arrays accepted. DeepSpeed's deepest block is 4 levels
(``data_efficiency.data_sampling.curriculum_learning.*``); 32 is far above any real config and far below
Python's recursion limit."""

AUTO = "auto"

NVME_PATH_PLACEHOLDER = "/local_nvme"
"""Written as ``nvme_path`` when the scenario offloads to NVMe without naming a path (a note says to replace it)."""

# Hyper-parameters the scenario does not describe. They are written so the config runs as is; the numbers are the
# HF TrainingArguments defaults (transformers 5.24.0, training_args.py: learning_rate=5e-5, adam_beta1=0.9,
# adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0), so a raw config and an HF "auto"
# config resolve to the same values.
DEFAULT_LR = 5e-5
DEFAULT_BETAS = (0.9, 0.999)
DEFAULT_EPS = 1e-8
DEFAULT_WEIGHT_DECAY = 0.0
DEFAULT_GRADIENT_CLIPPING = 1.0
DEFAULT_WARMUP_STEPS = 100
SGD_MOMENTUM = 0.9

# fp16 dynamic loss scaling: DeepSpeed's documented defaults (deepspeed/runtime/precision_config.py, FP16_FORMAT).
FP16_BLOCK = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}

# ----------------------------------------------------------------------------------------------------------------
# Key tables (DeepSpeed 0.19.8). tests/test_dsconfig.py checks ZERO_KEYS against DeepSpeedZeroConfig.model_fields
# and the offload tables against DeepSpeedZeroOffload*Config.model_fields.
# ----------------------------------------------------------------------------------------------------------------
ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
    "stage3_param_persistence_threshold", "param_persistence_threshold", "stage3_model_persistence_threshold",
    "model_persistence_threshold", "stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance",
    "max_reuse_distance", "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold", "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module",
})
"""Every key DeepSpeedZeroConfig accepts (field names and their ``stage3_*`` aliases). It is ``extra="forbid"``:
any other key makes DeepSpeed raise."""

OFFLOAD_PARAM_KEYS = frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"})
OFFLOAD_OPTIMIZER_KEYS = frozenset({
    "device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write", "fast_init", "ratio",
    "super_offload", "cpuadam_cores_perc",
})
BF16_KEYS = frozenset({
    "enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads", "bf16_optimizer_states",
})
FP16_KEYS = frozenset({
    "enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
    "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
})

TOP_LEVEL_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "managed_gradient_accumulation", "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
    "disable_python_gc", "disable_allgather", "communication_data_type", "seq_parallel_communication_data_type",
    "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op", "zero_optimization",
    "activation_checkpointing", "comms_logger", "tensorboard", "wandb", "csv_monitor", "comet", "gradient_clipping",
    "fp16", "bf16", "bfloat16", "torch_autocast", "optimizer", "scheduler", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "flops_profiler", "autotuning", "use_data_before_expert_parallelism",
    "hybrid_engine", "pipeline", "data_efficiency", "checkpoint", "data_types", "aio", "dataloader_drop_last",
    "log_level", "datastates_ckpt", "weight_quantization", "compile", "timers", "tensor_parallel", "expert_parallel",
    "vocabulary_size", "sequence_parallel_size", "zenflow",
})
"""Top-level keys DeepSpeed 0.19.8 reads (deepspeed/runtime/config.py ``_initialize_params`` and the sub-configs it
builds). DeepSpeedConfig reads the top level with ``dict.get``: any other key is ignored without a word."""

FRAMEWORK_TOP_LEVEL_KEYS = frozenset({"sequence_parallel"})
"""Top-level keys DeepSpeed does not read but the framework that launches it does: LLaMA-Factory's
``sequence_parallel`` block (Ulysses; ../shared/ds-configs/README.md, lf_z3_alst.json)."""

REMOVED_TOP_LEVEL_KEYS = frozenset({
    "nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
    "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop",
})
"""Keys DeepSpeed 0.19.8 rejects with DeepSpeedConfigError (``_REMOVED_TOP_LEVEL_CONFIG_KEYS``)."""
REMOVED_ZERO_KEYS = frozenset({"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"})

INTEGER_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print",
    "zero_optimization.stage", "zero_optimization.reduce_bucket_size", "zero_optimization.allgather_bucket_size",
    "zero_optimization.sub_group_size", "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.param_persistence_threshold", "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.model_persistence_threshold", "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.max_live_parameters", "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.max_reuse_distance", "zero_optimization.stage3_module_granularity_threshold",
    "zero_optimization.zero_hpz_partition_size", "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_optimizer.buffer_count", "fp16.initial_scale_power", "fp16.loss_scale_window",
    "fp16.hysteresis", "fp16.min_loss_scale", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps",
})
"""Dotted keys whose DeepSpeed type is ``int`` (pydantic ``int`` fields, or values DeepSpeed uses as counts)."""

BUCKET_KEYS = ("reduce_bucket_size", "allgather_bucket_size")

# Which zero_optimization key feeds which ZeroSpec field (alias -> canonical): from the input table's DeepSpeed
# keys (zeroplanner/inputs.py), where each input names DeepSpeed's key and its aliases once.
_ZERO_INT_FIELDS = zero_aliases("int")
_STAGE3_ONLY = stage3_only()
_ZERO_BOOL_FIELDS = tuple(zero_aliases("bool"))

HF_TRAINER_AUTO_KEYS = (
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled", "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold",
)
"""Every key the HF Trainer replaces when its value is ``"auto"`` (transformers 5.24.0,
integrations/deepspeed.py: ``trainer_config_process`` and ``trainer_config_finalize``). The two stage-3 keys are
filled only when the config is ZeRO-3 (``if self.is_zero3()``)."""


_AUTO_RULES = {
    "train_batch_size": "world_size * per_device_train_batch_size * gradient_accumulation_steps",
    "train_micro_batch_size_per_gpu": "TrainingArguments.per_device_train_batch_size, the scenario's micro-batch",
    "gradient_accumulation_steps": "TrainingArguments.gradient_accumulation_steps, the scenario's value",
    "zero_optimization.reduce_bucket_size": "hidden_size ** 2 with hidden_size = {h}",
    "zero_optimization.stage3_prefetch_bucket_size": "int(0.9 * hidden_size ** 2) with hidden_size = {h}",
    "zero_optimization.stage3_param_persistence_threshold": "10 * hidden_size with hidden_size = {h}",
}


class ConfigError(ValueError):
    """A config that cannot be read at all (too large, too deep, not JSON, not an object). One line, no traceback."""


class Finding(BaseModel):
    """One observation about a DeepSpeed config.

    ``severity``: ``"error"`` (DeepSpeed rejects it, crashes later, or silently does something else than asked),
    ``"warning"`` (runs, but slowly, wastefully or riskily), ``"info"`` (worth knowing; how a value was read).
    ``key`` is the dotted path (``zero_optimization.offload_param.pin_memory``; ``""`` for the whole config),
    ``message`` says why, ``fix`` what to write instead, ``rule`` is a short stable identifier (tests, filtering).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    severity: Severity
    key: str = Field(max_length=300)
    message: str
    fix: str = ""
    rule: str = ""


# ----------------------------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------------------------
def _scenario_of(obj: Any) -> Scenario:
    """Accept a Scenario or anything carrying one as ``.scenario`` (a Plan)."""
    if isinstance(obj, Scenario):
        return obj
    scenario = getattr(obj, "scenario", None)
    if isinstance(scenario, Scenario):
        return scenario
    raise TypeError(f"expected a Scenario or a Plan, got {type(obj).__name__}")


def hf_auto_values(scenario: Any) -> dict[str, Any]:
    """What the HF Trainer writes into each ``"auto"`` field of :func:`to_deepspeed_config`'s ``hf_trainer`` output.

    Returns ``{dotted_key: value}``. Rules (transformers 5.24.0, integrations/deepspeed.py):

    * ``train_micro_batch_size_per_gpu`` = ``per_device_train_batch_size``; ``gradient_accumulation_steps`` =
      ``gradient_accumulation_steps``; ``train_batch_size`` = world_size * micro * grad_accum
      (``trainer_config_process``). With :func:`hf_training_arguments` those are the scenario's values.
    * ``reduce_bucket_size`` = hidden_size ** 2; at ZeRO-3 also ``stage3_prefetch_bucket_size`` =
      ``int(0.9 * hidden_size ** 2)`` and ``stage3_param_persistence_threshold`` = 10 * hidden_size
      (``trainer_config_finalize``).
    * optimizer/scheduler/clipping values from TrainingArguments (their defaults here: :data:`DEFAULT_LR` ...);
      ``warmup_min_lr`` = 0; ``total_num_steps`` and ``warmup_num_steps`` are only known at train time
      (``num_training_steps``), so they are left out of this table.
    * ``fp16.enabled`` / ``bf16.enabled`` from ``args.fp16`` / ``args.bf16``.
    """
    s = _scenario_of(scenario)
    h = s.model.hidden_size
    t = s.training
    values: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        # args.world_size counts every process, tensor-parallel ranks included (trainer_config_process)
        "train_batch_size": t.micro_batch * t.grad_accum * s.cluster.world_size,
        "gradient_clipping": DEFAULT_GRADIENT_CLIPPING,
        "optimizer.params.lr": DEFAULT_LR,
        "optimizer.params.betas": list(DEFAULT_BETAS),
        "optimizer.params.eps": DEFAULT_EPS,
        "optimizer.params.weight_decay": DEFAULT_WEIGHT_DECAY,
        "scheduler.params.warmup_min_lr": 0,
        "scheduler.params.warmup_max_lr": DEFAULT_LR,
        "fp16.enabled": t.precision == "fp16",
        "bf16.enabled": t.precision == "bf16",
        "zero_optimization.reduce_bucket_size": h * h,
    }
    if t.optimizer == "adam8bit":  # no optimizer block (see to_deepspeed_config)
        for key in ("lr", "betas", "eps", "weight_decay"):
            del values[f"optimizer.params.{key}"]
    elif t.optimizer == "sgd":  # SGD's block has lr (and momentum, which the Trainer does not fill)
        for key in ("betas", "eps", "weight_decay"):
            del values[f"optimizer.params.{key}"]
    if s.zero.stage == 3:
        values["zero_optimization.stage3_prefetch_bucket_size"] = int(0.9 * h * h)
        values["zero_optimization.stage3_param_persistence_threshold"] = 10 * h
    return values


def hf_training_arguments(scenario: Any, deepspeed_config_path: str = "ds_config.json") -> dict[str, Any]:
    """Keyword arguments for ``transformers.TrainingArguments`` that make the ``"auto"`` fields resolve to the
    scenario's values (names from transformers 5.24.0 training_args.py)."""
    s = _scenario_of(scenario)
    t = s.training
    args: dict[str, Any] = {
        "deepspeed": deepspeed_config_path,
        "per_device_train_batch_size": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "bf16": t.precision == "bf16",
        "fp16": t.precision == "fp16",
        "gradient_checkpointing": t.checkpointing != "none",
        "max_grad_norm": DEFAULT_GRADIENT_CLIPPING,
    }
    if t.optimizer == "adam8bit":
        args["optim"] = "adamw_bnb_8bit"
    elif t.optimizer == "sgd":
        args["optim"] = "sgd"
    return args


def _offload_block(spec: OffloadSpec) -> dict[str, Any] | None:
    if spec.device == "none":
        return None
    block: dict[str, Any] = {"device": spec.device, "pin_memory": bool(spec.pin_memory)}
    if spec.device == "nvme":
        block["nvme_path"] = spec.nvme_path or NVME_PATH_PLACEHOLDER
    return block


def _optimizer_block(t: TrainingSpec, mode: Mode, torch_adam: bool = False) -> dict[str, Any] | None:
    auto = mode == "hf_trainer"
    if t.optimizer in ("adamw", "adam"):
        params: dict[str, Any] = {
            "lr": AUTO if auto else DEFAULT_LR,
            "betas": AUTO if auto else list(DEFAULT_BETAS),
            "eps": AUTO if auto else DEFAULT_EPS,
            "weight_decay": AUTO if auto else DEFAULT_WEIGHT_DECAY,
        }
        if torch_adam:
            # torch.optim.Adam/AdamW instead of FusedAdam (engine.py get_optimizer_configuration: TORCH_ADAM_PARAM)
            params["torch_adam"] = True
        if t.optimizer == "adam":
            # DeepSpeed's "Adam" runs AdamW (decoupled weight decay) unless adam_w_mode is false
            # (deepspeed/runtime/engine.py, _configure_basic_optimizer: ADAM_W_MODE_DEFAULT = True).
            params["adam_w_mode"] = False
            return {"type": "Adam", "params": params}
        return {"type": "AdamW", "params": params}
    if t.optimizer == "sgd":
        # Not a DeepSpeed optimizer: the engine builds getattr(torch.optim, "SGD") (engine.py) and ZeRO needs
        # zero_allow_untested_optimizer. The HF Trainer would replace an "auto" lr here, but not momentum.
        return {"type": "SGD", "params": {"lr": AUTO if auto else DEFAULT_LR, "momentum": SGD_MOMENTUM}}
    return None  # adam8bit: the client builds it (bitsandbytes); DeepSpeed has no such optimizer type


def _scheduler_block(mode: Mode, total_num_steps: int | None) -> dict[str, Any]:
    if mode == "hf_trainer":
        return {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": AUTO,
                "warmup_max_lr": AUTO,
                "warmup_num_steps": AUTO,
                "total_num_steps": AUTO,
            },
        }
    params: dict[str, Any] = {"warmup_min_lr": 0, "warmup_max_lr": DEFAULT_LR, "warmup_num_steps": DEFAULT_WARMUP_STEPS}
    if total_num_steps is not None:
        params["total_num_steps"] = int(total_num_steps)
        params["warmup_num_steps"] = max(1, min(DEFAULT_WARMUP_STEPS, int(total_num_steps) // 10))
        return {"type": "WarmupDecayLR", "params": params}
    return {"type": "WarmupLR", "params": params}


def to_deepspeed_config(
    scenario: Any, mode: Mode = "deepspeed", total_num_steps: int | None = None, torch_adam: bool = False
) -> dict[str, Any]:
    """A complete DeepSpeed config for ``scenario`` (a Scenario or a Plan; a Plan's chosen scenario is used).

    ``mode="deepspeed"``: every value concrete, for ``deepspeed.initialize(config=...)`` or ``deepspeed --config``.
    ``mode="hf_trainer"``: ``"auto"`` where the HF Trainer fills the value (:data:`HF_TRAINER_AUTO_KEYS`;
    :func:`hf_auto_values` gives the values, :func:`hf_training_arguments` the TrainingArguments that produce them).

    Content: ``train_batch_size`` = micro * grad_accum * data-parallel degree (DeepSpeed's assertion in
    ``DeepSpeedConfig._batch_assertion``), the precision block (at most one of bf16/fp16 enabled; fp16 with dynamic
    loss scaling keys), optimizer (AdamW, Adam, SGD; none for 8-bit Adam, see :func:`generation_notes`), scheduler
    (WarmupLR, or WarmupDecayLR when ``total_num_steps`` is given or in HF mode), ``gradient_clipping``,
    ``zero_optimization`` with the scenario's ZeRO keys (offload blocks only when offloading; ``stage3_*`` and
    ZeRO++ keys only at stage 3, the only stage that reads them), and ``activation_checkpointing`` when the scenario
    checkpoints (the block configures ``deepspeed.checkpointing``; HF models checkpoint through
    ``gradient_checkpointing`` instead, so HF mode leaves it out). Every count is a Python ``int``.

    ``torch_adam=True`` adds ``"torch_adam": true`` to an Adam/AdamW block: DeepSpeed then uses torch.optim's
    implementation instead of FusedAdam, whose op is JIT-compiled on first use (minutes on a CPU-only machine).
    Ignored with offload_optimizer: DeepSpeed checks torch_adam before choosing DeepSpeedCPUAdam
    (engine.py, get_optimizer_configuration), and torch's AdamW on CPU is much slower.

    Raises ``TypeError`` for something that is neither a Scenario nor a Plan, ``ValueError`` for an unknown mode
    or a ``total_num_steps`` < 1.
    """
    if mode not in ("deepspeed", "hf_trainer"):
        raise ValueError(f"mode={mode!r}: allowed 'deepspeed' or 'hf_trainer'")
    if total_num_steps is not None and (isinstance(total_num_steps, bool) or int(total_num_steps) < 1):
        raise ValueError(f"total_num_steps={total_num_steps!r} must be an integer >= 1")
    s = _scenario_of(scenario)
    t, z = s.training, s.zero
    hf = mode == "hf_trainer"

    config: dict[str, Any] = {
        "train_batch_size": AUTO if hf else int(s.global_batch_size),
        "train_micro_batch_size_per_gpu": AUTO if hf else int(t.micro_batch),
        "gradient_accumulation_steps": AUTO if hf else int(t.grad_accum),
        "gradient_clipping": AUTO if hf else DEFAULT_GRADIENT_CLIPPING,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if hf:
        # The Trainer fills both from args.bf16/args.fp16 and checks they do not conflict.
        config["bf16"] = {"enabled": AUTO}
        config["fp16"] = {"enabled": AUTO}
    elif t.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        config["fp16"] = dict(FP16_BLOCK)

    optimizer = _optimizer_block(t, mode, torch_adam and z.offload_optimizer.device == "none")
    if optimizer is not None:
        config["optimizer"] = optimizer
    if t.optimizer in ("sgd", "adam8bit"):
        # ZeRO refuses optimizers it has not tested unless told (engine.py, _do_optimizer_sanity_check).
        config["zero_allow_untested_optimizer"] = True
        if z.offload_optimizer.device != "none":
            # ZeRO-Offload insists on DeepSpeedCPUAdam unless this is false (engine.py, _configure_optimizer).
            config["zero_force_ds_cpu_optimizer"] = False
    config["scheduler"] = _scheduler_block(mode, total_num_steps)

    zero: dict[str, Any] = {"stage": int(z.stage)}
    block = _offload_block(z.offload_optimizer)
    if block is not None:
        zero["offload_optimizer"] = block
    block = _offload_block(z.offload_param)
    if block is not None:
        zero["offload_param"] = block
    zero["reduce_bucket_size"] = AUTO if hf else int(z.reduce_bucket_size)
    zero["allgather_bucket_size"] = int(z.allgather_bucket_size)
    if z.overlap_comm is not None:
        zero["overlap_comm"] = bool(z.overlap_comm)
    zero["contiguous_gradients"] = bool(z.contiguous_gradients)
    if z.stage == 3:
        zero["stage3_prefetch_bucket_size"] = AUTO if hf else int(z.stage3_prefetch_bucket_size)
        zero["stage3_param_persistence_threshold"] = AUTO if hf else int(z.stage3_param_persistence_threshold)
        zero["stage3_max_live_parameters"] = int(z.stage3_max_live_parameters)
        zero["stage3_max_reuse_distance"] = int(z.stage3_max_reuse_distance)
        # Needed to save a usable 16-bit model from sharded weights (HF save_model / engine.save_16bit_model).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        zero["zero_hpz_partition_size"] = int(z.zero_hpz_partition_size)
        zero["zero_quantized_weights"] = bool(z.zero_quantized_weights)
        zero["zero_quantized_gradients"] = bool(z.zero_quantized_gradients)
    config["zero_optimization"] = zero

    if t.checkpointing != "none" and not hf:
        config["activation_checkpointing"] = {
            "partition_activations": False,
            "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return config


def generation_notes(scenario: Any, mode: Mode = "deepspeed") -> list[Finding]:
    """What the user must know to run the config of :func:`to_deepspeed_config` (info findings)."""
    s = _scenario_of(scenario)
    t, z = s.training, s.zero
    notes: list[Finding] = []
    if t.optimizer == "adam8bit":
        notes.append(Finding(
            severity="info", key="optimizer", rule="client_optimizer",
            message="DeepSpeed has no 8-bit Adam optimizer type, so the config has no 'optimizer' block and sets "
            "zero_allow_untested_optimizer; the client must build the optimizer.",
            fix="HF Trainer: TrainingArguments(optim='adamw_bnb_8bit'). Raw DeepSpeed: pass "
            "optimizer=bitsandbytes.optim.AdamW8bit(model.parameters(), lr=...) to deepspeed.initialize.",
        ))
        if z.offload_optimizer.device != "none":
            notes.append(Finding(
                severity="warning", key="zero_optimization.offload_optimizer", rule="client_optimizer_offload",
                message="With offload_optimizer the optimizer step runs on the CPU; bitsandbytes' 8-bit Adam runs "
                "on the GPU only, so the 8-bit saving does not combine with ZeRO-Offload.",
                fix="Use AdamW (DeepSpeedCPUAdam) with offload, or 8-bit Adam without offload.",
            ))
    if t.optimizer == "sgd":
        notes.append(Finding(
            severity="info", key="optimizer.type", rule="torch_optimizer",
            message="SGD is not a DeepSpeed optimizer: the engine builds torch.optim.SGD, and ZeRO needs "
            "zero_allow_untested_optimizer=true (set).",
            fix="",
        ))
    for name, spec in (("offload_optimizer", z.offload_optimizer), ("offload_param", z.offload_param)):
        if spec.device == "nvme" and not spec.nvme_path:
            notes.append(Finding(
                severity="warning", key=f"zero_optimization.{name}.nvme_path", rule="nvme_placeholder",
                message=f"The scenario names no NVMe path; the config uses the placeholder {NVME_PATH_PLACEHOLDER!r}.",
                fix="Replace it with a directory on a local NVMe drive (one per node).",
            ))
    if mode == "hf_trainer":
        auto = hf_auto_values(s)
        filled = ", ".join(f"{k}={v}" for k, v in auto.items() if k.startswith("zero_optimization"))
        notes.append(Finding(
            severity="info", key="", rule="hf_auto",
            message=f"'auto' fields are filled by the HF Trainer from TrainingArguments and the model ({filled}).",
            fix="Run it through transformers' Trainer (TrainingArguments(deepspeed=...)) or accelerate; raw "
            "deepspeed.initialize does not resolve 'auto'.",
        ))
    elif t.checkpointing != "none":
        notes.append(Finding(
            severity="info", key="activation_checkpointing", rule="checkpointing_block",
            message="The activation_checkpointing block configures deepspeed.checkpointing.checkpoint; it takes "
            "effect only where the model calls it (Megatron-style). HF models checkpoint via "
            "model.gradient_checkpointing_enable().",
            fix="",
        ))
    return notes


def to_accelerate_config(scenario: Any, deepspeed_config_file: str = "ds_config.json") -> str:
    """YAML text for ``accelerate launch --config_file`` (accelerate 1.15.0, ``ClusterConfig`` in
    accelerate/commands/config/config_args.py) that runs the scenario's world size with DeepSpeed, reading the
    DeepSpeed JSON from ``deepspeed_config_file`` (write it with :func:`to_deepspeed_config`).

    ``mixed_precision`` is left out on purpose: with ``deepspeed_config_file`` accelerate refuses a precision from
    its own config (``DeepSpeedPlugin._deepspeed_config_checks``); the JSON's bf16/fp16 block decides.
    ``zero3_init_flag`` is true at stage 3 (builds the model sharded, ``deepspeed.zero.Init``).
    """
    s = _scenario_of(scenario)
    if not isinstance(deepspeed_config_file, str) or not deepspeed_config_file or "\n" in deepspeed_config_file:
        raise ValueError("deepspeed_config_file must be a non-empty one-line path")
    lines = [
        "compute_environment: LOCAL_MACHINE",
        "debug: false",
        "deepspeed_config:",
        f"  deepspeed_config_file: {json.dumps(deepspeed_config_file)}",
    ]
    if s.cluster.nodes > 1:
        lines.append("  deepspeed_multinode_launcher: standard")
    lines += [
        f"  zero3_init_flag: {'true' if s.zero.stage == 3 else 'false'}",
        "distributed_type: DEEPSPEED",
        "downcast_bf16: 'no'",
        "machine_rank: 0",
        "main_training_function: main",
        f"num_machines: {int(s.cluster.nodes)}",
        f"num_processes: {int(s.cluster.world_size)}",
        "rdzv_backend: static",
        f"same_network: {'true' if s.cluster.nodes > 1 else 'false'}",
        "use_cpu: false",
    ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------
def _depth(value: Any) -> int:
    """Nesting depth of dicts/lists, iteratively (no recursion on hostile input)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            level += 1
            deepest = max(deepest, level)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((v, level) for v in item.values())
        elif isinstance(item, (list, tuple)):
            level += 1
            deepest = max(deepest, level)
            if deepest > MAX_DEPTH:
                return deepest
            stack.extend((v, level) for v in item)
    return deepest


def _reject_constant(name: str) -> Any:
    raise ConfigError(f"config is not valid JSON: {name} is not a JSON number")


def load_config_text(text: str | bytes, mode: Mode = "deepspeed") -> tuple[dict[str, Any], list[Finding]]:
    """Parse DeepSpeed config text safely, the way the client that runs it reads the file. Returns
    ``(config, findings)``.

    * ``mode="deepspeed"``: DeepSpeed reads a config file with ``hjson.load(..., object_pairs_hook=
      dict_raise_error_on_duplicate_keys)`` (deepspeed/runtime/config.py, ``DeepSpeedConfig.__init__``), so comments
      and trailing commas are accepted (an info finding says the file is not strict JSON) and a duplicate key is an
      error (DeepSpeed raises ``ValueError: Duplicate keys in DeepSpeed config``).
    * ``mode="hf_trainer"``: the Trainer and accelerate read it with plain ``json.load`` (accelerate
      utils/deepspeed.py, ``HfDeepSpeedConfig.__init__``) and hand DeepSpeed the dict: comments or trailing commas
      are an error finding (``json.load`` raises), a duplicate key a warning (the last value silently wins).

    The text is parsed with ``json.loads`` first and only if that fails with ``hjson`` (when installed; DeepSpeed
    depends on it); nothing in the text is executed. Raises :class:`ConfigError` (one line) for text over
    :data:`MAX_CONFIG_BYTES`, bytes that are not UTF-8, text neither reader accepts (position given), NaN/Infinity,
    nesting deeper than :data:`MAX_DEPTH`, or a top level that is not an object.
    """
    if isinstance(text, (bytes, bytearray)):
        size = len(text)
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(f"config is {size} bytes; the limit is {MAX_CONFIG_BYTES} bytes (1 MB)")
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config is not UTF-8 text (byte {exc.start})") from None
    elif isinstance(text, str):
        if len(text) > MAX_CONFIG_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config is over the limit of {MAX_CONFIG_BYTES} bytes (1 MB)")
    else:
        raise ConfigError(f"config must be JSON text or a dict, got {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise ConfigError("config is empty (DeepSpeed would read it as {} and then fail: no batch size)")
    # Cheap pre-check: nesting depth from brackets outside strings, so a hostile "[[[[..." never reaches the parser.
    level = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            if level > deepest:
                deepest = level
                if deepest > MAX_DEPTH:
                    raise ConfigError(f"config nests deeper than {MAX_DEPTH} levels")
        elif ch in "]}":
            level -= 1
    duplicates: list[str] = []

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                duplicates.append(key)
            out[key] = value
        return out

    findings: list[Finding] = []
    try:
        config = json.loads(text, object_pairs_hook=pairs_hook, parse_constant=_reject_constant)
    except ConfigError:
        raise
    except json.JSONDecodeError as exc:
        json_error = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        duplicates.clear()
        config = _load_hjson(text, pairs_hook, json_error)
        if mode == "hf_trainer":
            findings.append(Finding(
                severity="error", key="", rule="invalid_syntax",
                message=f"the file is not strict JSON ({json_error}; comments or trailing commas): the HF Trainer "
                "and accelerate read it with json.load (accelerate utils/deepspeed.py, HfDeepSpeedConfig) and "
                "fail. DeepSpeed alone would accept it (hjson). Priced as hjson reads it.",
                fix="Remove comments and trailing commas."))
        else:
            findings.append(Finding(
                severity="info", key="", rule="invalid_syntax",
                message=f"the file is not strict JSON ({json_error}); DeepSpeed reads config files with hjson "
                "(deepspeed/runtime/config.py), which accepts it. The HF Trainer/accelerate would not (json.load).",
                fix=""))
    except (RecursionError, ValueError) as exc:
        raise ConfigError(f"config is not valid JSON: {str(exc).splitlines()[0][:200]}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"config must be a JSON object ({{...}}), got a JSON {type(config).__name__}")
    if _has_non_finite(config):
        raise ConfigError("config is not valid JSON: a number is NaN or infinite")
    for key in dict.fromkeys(duplicates):
        if mode == "hf_trainer":
            findings.append(Finding(
                severity="warning", key=clip_key(key), rule="duplicate_key",
                message=f"key {clip_key(key, 80)!r} appears more than once; the HF Trainer/accelerate read the file "
                "with json.load, which keeps the last value without a word (priced with it). DeepSpeed alone "
                "would reject the file.", fix="Keep one occurrence."))
        else:
            findings.append(Finding(
                severity="error", key=clip_key(key), rule="duplicate_key",
                message=f"key {clip_key(key, 80)!r} appears more than once; DeepSpeed's file loader raises "
                "'Duplicate keys in DeepSpeed config' (deepspeed/runtime/config_utils.py, "
                "dict_raise_error_on_duplicate_keys). Priced with the last value.", fix="Keep one occurrence."))
    return config, findings


def _load_hjson(text: str, pairs_hook: Any, json_error: str) -> Any:
    """Parse text that strict JSON refused the way DeepSpeed does (hjson); ConfigError if hjson refuses it too or
    is not installed."""
    try:
        import hjson
    except ImportError:
        raise ConfigError(f"config is not valid JSON: {json_error} (DeepSpeed also accepts hjson: comments, "
                          "trailing commas; install deepspeed to read such files)") from None
    try:
        return hjson.loads(text, object_pairs_hook=pairs_hook)
    except ConfigError:
        raise
    except (RecursionError, ValueError, OverflowError, TypeError, IndexError) as exc:
        raise ConfigError(f"config is not valid JSON ({json_error}) nor hjson as DeepSpeed reads it: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}") from None


def _has_non_finite(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False





def clip_key(key: str, limit: int = 300) -> str:
    """A user's key as it may appear in a Finding (keys of any length are legal JSON)."""
    key = str(key)
    return key if len(key) <= limit else key[: limit - 3] + "..."


def _path(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _as_count(value: Any) -> int | None:
    """How a human meant a count: 500000000, 5e8, 15099494.4 (rounded) and "5e8" all read as an integer; None for
    anything that is not a finite number >= 0 (bools, lists, NaN, negative)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value < 1e18:
        return int(round(value))
    return None


class _Reader:
    """Walks one config, collecting a scenario's fields and findings."""

    def __init__(self, base: Scenario, hf: bool, stage: int | None = None):
        self.base = base
        self.hf = hf
        self.stage = stage
        self.batch_world = base.cluster.data_parallel_degree
        self.findings: list[Finding] = []
        self._fill_auto()

    def _fill_auto(self) -> None:
        # The Trainer fills the stage-3 keys when the *config* is ZeRO-3 (trainer_config_finalize: is_zero3()),
        # whatever stage the command line's scenario had.
        base = self.base
        if self.stage is not None and self.stage != base.zero.stage:
            base = base.model_copy(update={"zero": base.zero.model_copy(update={"stage": self.stage})})
        self.auto = hf_auto_values(base)
        t = base.training
        self.auto["train_batch_size"] = t.micro_batch * t.grad_accum * self.batch_world

    def set_tensor_parallel(self, tp: int, batch_world: int) -> None:
        """Price with tensor-parallel degree ``tp`` from here on; DeepSpeed's batch arithmetic (and the Trainer's
        train_batch_size fill) runs over ``batch_world`` ranks (see :func:`batch_world_size`)."""
        cluster = self.base.cluster.model_copy(update={"tensor_parallel_size": tp})
        self.base = self.base.model_copy(update={"cluster": cluster})
        self.batch_world = batch_world
        self._fill_auto()

    def note(self, severity: Severity, key: str, message: str, fix: str = "", rule: str = "") -> None:
        self.findings.append(Finding(severity=severity, key=clip_key(key), message=message, fix=fix, rule=rule))

    def unknown(self, key: str, where: str, rejected: bool) -> None:
        if rejected:
            self.note("error", key, f"{where} has no key {clip_key(key.rsplit('.', 1)[-1], 80)!r}; DeepSpeed "
                      "rejects the config "
                      "(its config model forbids extra keys). Not priced.", "Remove it or fix the spelling.",
                      "unknown_key")
        else:
            self.note("warning", key, "DeepSpeed does not read this key and ignores it without a word; it is not "
                      "priced.", "Remove it or fix the spelling.", "unknown_key")

    def auto_value(self, key: str, fallback: Any, why: str) -> Any:
        value = self.auto.get(key, fallback)
        self.note("info", key, f"'auto' read the HF Trainer's way: {_short(value)} ({why}).", "", "auto_resolved")
        return value

    def count(self, key: str, value: Any, fallback: int, low: int, high: int) -> int:
        """An integer field: returns what to price with; findings when it had to be reinterpreted."""
        if isinstance(value, str) and value == AUTO:
            resolved = self.auto.get(key)
            if resolved is None:
                self.note("info", key, f"'auto' is not filled by the HF Trainer here; DeepSpeed drops it and uses its "
                          f"default, priced as {fallback}.", "", "auto_resolved")
                return fallback
            return self.auto_value(key, fallback, _AUTO_RULES.get(key, "HF Trainer rule").format(
                h=self.base.model.hidden_size))
        number = _as_count(value)
        if number is None:
            self.note("info", key, f"{_short(value)} is not a usable count; priced with {fallback}.", "", "unpriced")
            return fallback
        if not low <= number <= high:
            self.note("info", key, f"{number} is outside {low}..{high}; priced with {fallback}.", "", "unpriced")
            return fallback
        if not isinstance(value, int) or isinstance(value, bool):
            self.note("info", key, f"{_short(value)} priced as the integer {number}.", "", "coerced")
        return number

    def flag(self, key: str, value: Any, fallback: bool | None) -> bool | None:
        if isinstance(value, bool):
            return value
        if value is None and fallback is None:
            return None
        if isinstance(value, str) and value == AUTO:
            self.note("info", key, f"'auto' is not filled by the HF Trainer for this key; DeepSpeed drops it and "
                      f"uses its default, priced as {fallback}.", "", "auto_resolved")
            return fallback
        self.note("info", key, f"{_short(value)} is not true/false; priced as {fallback}.", "", "unpriced")
        return fallback

    def obj(self, key: str, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            self.note("error", key, f"must be a JSON object, got {_short(value)}; DeepSpeed fails on it. Not priced.",
                      "Write it as {...}.", "wrong_type")
            return None
        return value


def _read_offload(r: _Reader, block: dict[str, Any] | None, name: str, base_spec: OffloadSpec) -> OffloadSpec:
    key = f"zero_optimization.{name}"
    if block is None:
        return base_spec if base_spec.device == "none" else OffloadSpec()
    allowed = OFFLOAD_PARAM_KEYS if name == "offload_param" else OFFLOAD_OPTIMIZER_KEYS
    for k in block:
        if k not in allowed:
            r.unknown(_path(key, k), f"zero_optimization.{name}", rejected=True)
    device = block.get("device", "none")
    if device not in ("none", "cpu", "nvme"):
        r.note("error", _path(key, "device"), f"device {_short(device)} is not one of 'none', 'cpu', 'nvme'; "
               "DeepSpeed rejects it. Priced without offload.", "Use 'cpu' or 'nvme'.", "wrong_type")
        device = "none"
    pin = r.flag(_path(key, "pin_memory"), block.get("pin_memory", True), True)
    path = block.get("nvme_path")
    if path is not None and not (isinstance(path, str) and 0 < len(path) <= 4096):
        r.note("info", _path(key, "nvme_path"), f"nvme_path {_short(path)} is not a path string; ignored.", "",
               "unpriced")
        path = None
    return OffloadSpec(device=device, pin_memory=bool(pin), nvme_path=path)


def _read_precision(r: _Reader, config: dict[str, Any]) -> str:
    enabled = {}
    for name, aliases, allowed in (("bf16", ("bf16", "bfloat16"), BF16_KEYS), ("fp16", ("fp16",), FP16_KEYS)):
        for alias in aliases:
            block = r.obj(alias, config.get(alias))
            if block is None:
                continue
            for k in block:
                if k not in allowed:
                    r.unknown(_path(alias, k), alias, rejected=True)
            value = block.get("enabled", False)
            if isinstance(value, str) and value == AUTO:
                value = r.auto_value(f"{name}.enabled", False, "from TrainingArguments bf16/fp16")
            elif not isinstance(value, bool):
                r.note("info", _path(alias, "enabled"), f"{_short(value)} is not true/false; read as false.", "",
                       "unpriced")
                value = False
            enabled[name] = enabled.get(name, False) or value
    if enabled.get("bf16") and enabled.get("fp16"):
        r.note("info", "", "both bf16 and fp16 are enabled (DeepSpeed refuses this); priced as bf16.", "", "unpriced")
        return "bf16"
    if enabled.get("bf16"):
        return "bf16"
    if enabled.get("fp16"):
        return "fp16"
    if "torch_autocast" in config:
        r.note("info", "torch_autocast", "torch_autocast is priced as fp32 weights (its compute dtype is not "
               "modelled).", "", "unpriced")
    return "fp32"


def _read_optimizer(r: _Reader, config: dict[str, Any]) -> str:
    base_opt = r.base.training.optimizer
    block = r.obj("optimizer", config.get("optimizer"))
    if block is None:
        if "optimizer" not in config or config.get("optimizer") is None:
            r.note("info", "optimizer", f"no optimizer block: the client (HF Trainer or your script) builds the "
                   f"optimizer; priced as {base_opt!r} from the scenario.", "", "client_optimizer")
        return base_opt
    kind = block.get("type")
    if not isinstance(kind, str):
        r.note("error", "optimizer.type", f"optimizer.type {_short(kind)} is not a name; DeepSpeed needs one "
               f"(e.g. 'AdamW'). Priced as {base_opt!r}.", "Set \"type\": \"AdamW\".", "wrong_type")
        return base_opt
    name = kind.lower()
    params = block.get("params") if isinstance(block.get("params"), dict) else {}
    if name == "adamw":
        return "adamw"
    if name == "adam":
        mode = params.get("adam_w_mode", True)
        if mode is False:
            return "adam"
        r.note("info", "optimizer.type", "DeepSpeed's 'Adam' runs AdamW (decoupled weight decay) unless "
               "params.adam_w_mode is false (engine.py, ADAM_W_MODE_DEFAULT); priced as AdamW (same memory).", "",
               "optimizer_mapped")
        return "adamw"
    if name == "sgd":
        return "sgd"
    if name in ("adam8bit", "adamw8bit", "adamw_bnb_8bit", "paged_adamw_8bit"):
        return "adam8bit"
    r.note("info", "optimizer.type", f"optimizer {kind!r} is not modelled; priced as AdamW (two fp32 states per "
           "parameter; Lamb/OneBitAdam have the same, Adagrad/Lion one).", "", "optimizer_mapped")
    return "adamw"


def _read_batch(r: _Reader, config: dict[str, Any]) -> tuple[int, int]:
    """micro-batch and grad_accum the way DeepSpeedConfig._set_batch_related_parameters derives them."""
    dp = r.batch_world
    t = r.base.training
    values: dict[str, int | None] = {}
    for key, fallback in (("train_batch_size", r.base.global_batch_size),
                          ("train_micro_batch_size_per_gpu", t.micro_batch),
                          ("gradient_accumulation_steps", t.grad_accum)):
        if key not in config or config[key] is None:
            values[key] = None
            continue
        values[key] = r.count(key, config[key], fallback, 1, 10**9)
    tb, mb, ga = values["train_batch_size"], values["train_micro_batch_size_per_gpu"], values[
        "gradient_accumulation_steps"]
    if mb is not None and ga is not None:
        return mb, ga
    if tb is not None and mb is not None:
        return mb, max(1, tb // mb // dp)
    if tb is not None and ga is not None:
        return max(1, tb // dp // ga), ga
    if tb is not None:
        return max(1, tb // dp), 1
    if mb is not None:
        return mb, 1
    r.note("info", "train_batch_size", f"no batch keys: priced with the scenario's micro-batch {t.micro_batch} and "
           f"gradient accumulation {t.grad_accum}.", "", "unpriced")
    return t.micro_batch, t.grad_accum


def from_deepspeed_config(
    config: dict[str, Any] | str | bytes, base: Scenario | None = None, mode: Mode | None = None
) -> tuple[Scenario, list[Finding]]:
    """Read a user's DeepSpeed config (or HF Trainer config with ``"auto"``) into a scenario the cost model can price.

    ``base`` supplies what a DeepSpeed config does not describe (model, cluster, sequence length, LoRA, the
    assumptions) and the values an absent or ``"auto"`` key falls back to; ``None`` uses
    ``zeroplanner.scenarios.default_scenario()``. ``mode`` is informational (``"auto"`` is resolved the HF way in
    both cases, with an info finding each; :func:`zeroplanner.lint.lint` says whether ``"auto"`` is allowed).

    Read: batch keys (DeepSpeed's rules for whichever two or three are given, world size = the base's data-parallel
    degree), precision (bf16/bfloat16/fp16 blocks), optimizer type, activation checkpointing (present -> the base's
    mode, or "full" if the base has none; absent -> the base's, since HF models checkpoint outside the config), and
    every modelled ``zero_optimization`` key incl. the ``stage3_*`` aliases, offload blocks and ZeRO++ keys, and
    ``tensor_parallel.autotp_size`` (the cluster's tensor-parallel degree: ZeRO and the batch arithmetic run over
    world / autotp_size). LLaMA-Factory's ``sequence_parallel`` block and ``sequence_parallel_size`` are read and
    stated in an info finding but not priced (no sequence-parallel dimension in the cost model yet).

    Returns ``(scenario, findings)``. Findings: unknown keys (error inside DeepSpeed's strict blocks, warning at the
    top level, which DeepSpeed ignores), ``"auto"`` resolutions, and values that had to be reinterpreted for pricing
    (e.g. ``"5e8"`` priced as 500000000; offload_param below stage 3 priced without it, as DeepSpeed ignores it).
    Whether the config is *good* is :func:`zeroplanner.lint.lint`'s job.

    Raises :class:`ConfigError` for text that cannot be read (see :func:`load_config_text`) or a non-object.
    Round trip: ``from_deepspeed_config(to_deepspeed_config(s), base=s)[0] == s``.
    """
    findings: list[Finding] = []
    if isinstance(config, (str, bytes, bytearray)):
        config, findings = load_config_text(config, mode or "deepspeed")
    elif isinstance(config, dict):
        if _depth(config) > MAX_DEPTH:
            raise ConfigError(f"config nests deeper than {MAX_DEPTH} levels")
    else:
        raise ConfigError(f"config must be JSON text or a dict, got {type(config).__name__}")
    if base is None:
        from .scenarios import default_scenario

        base = default_scenario()
    r = _Reader(base, hf=(mode == "hf_trainer"), stage=_peek_stage(config))
    r.findings.extend(findings)
    tp = _read_tensor_parallel(r, config)
    if tp != base.cluster.tensor_parallel_size:
        r.set_tensor_parallel(tp, base.cluster.world_size if config_autotp_size(config) > 1
                              else base.cluster.world_size // tp)

    for key in config:
        if not isinstance(key, str):
            r.note("error", str(key), "config keys must be strings", "", "wrong_type")
        elif key in FRAMEWORK_TOP_LEVEL_KEYS:
            pass  # read by the framework around DeepSpeed; _read_sequence_parallel says what is priced
        elif key.startswith("_") and key.strip("_").lower().startswith("comment"):
            r.note("info", key, "a comment key (like LLaMA-Factory's \"_comment\"): DeepSpeed "
                   "reads the top level with dict.get and ignores it.", "", "comment_key")
        elif key not in TOP_LEVEL_KEYS and key not in REMOVED_TOP_LEVEL_KEYS:  # removed keys: lint reports them
            r.unknown(key, "the top level", rejected=False)

    micro, accum = _read_batch(r, config)
    precision = _read_precision(r, config)
    optimizer = _read_optimizer(r, config)

    bt = base.training
    checkpointing = bt.checkpointing
    ac = config.get("activation_checkpointing")
    if isinstance(ac, dict) and bt.checkpointing == "none":
        checkpointing = "full"
        r.note("info", "activation_checkpointing", "activation_checkpointing block present: priced with full "
               "recomputation.", "", "checkpointing")
    elif ac is not None and not isinstance(ac, dict):
        r.obj("activation_checkpointing", ac)

    zero_fields = _read_zero(r, config)
    if r.hf and config.get("optimizer") is None and zero_fields["stage"] >= 1 \
            and zero_fields["offload_optimizer"]["device"] != "none" \
            and config.get("zero_force_ds_cpu_optimizer") is not False and optimizer in ("sgd", "adam8bit"):
        # accelerate's Accelerator._prepare_deepspeed hands the Trainer's optimizer to map_pytorch_optim_to_deepspeed,
        # which builds DeepSpeedCPUAdam for anything but (32-bit) Adagrad/Lion, with adamw_mode only for AdamW.
        r.note("info", "optimizer", f"under the HF Trainer with offload_optimizer, accelerate replaces the {optimizer!r} "
               "optimizer by DeepSpeedCPUAdam (map_pytorch_optim_to_deepspeed; adamw_mode off): priced as Adam.",
               "Set \"zero_force_ds_cpu_optimizer\": false to keep your optimizer (its step then runs on the CPU in "
               "torch).", "optimizer_mapped")
        optimizer = "adam"

    try:
        training = TrainingSpec.model_validate({
            **bt.model_dump(), "precision": precision, "optimizer": optimizer, "micro_batch": micro,
            "grad_accum": accum, "checkpointing": checkpointing,
        })
    except ValueError as exc:  # e.g. QLoRA in the base and fp32 in the config
        r.note("info", "", f"training settings from the config do not fit the scenario "
               f"({str(exc).splitlines()[-1][:200]}); priced with the scenario's.", "", "unpriced")
        training = bt
    zero = ZeroSpec.model_validate(zero_fields)
    _read_sequence_parallel(r, config)
    cluster = {**base.cluster.model_dump(), "tensor_parallel_size": tp}
    scenario = Scenario.model_validate({**base.model_dump(), "cluster": cluster, "training": training.model_dump(),
                                        "zero": zero.model_dump()})
    return scenario, r.findings


def config_autotp_size(config: Any) -> int:
    """``tensor_parallel.autotp_size`` as DeepSpeed's engine reads it (1 when absent, 0, or unreadable)."""
    block = config.get("tensor_parallel") if isinstance(config, dict) else None
    raw = block.get("autotp_size") if isinstance(block, dict) else None
    value = None if isinstance(raw, bool) else _as_count(raw)
    return value if value is not None and value > 1 else 1


def batch_world_size(config: Any, scenario: Scenario) -> int:
    """The world size DeepSpeedConfig's batch arithmetic uses for this config (``_batch_assertion``,
    ``_set_batch_related_parameters``): ``dist.get_world_size()`` -- all ranks -- when the tensor parallelism comes
    from the config's ``tensor_parallel.autotp_size`` (``deepspeed.initialize`` builds DeepSpeedConfig with no mpu,
    deepspeed/__init__.py), else the data-parallel degree (an mpu reports it). The HF Trainer's
    ``train_batch_size`` fill uses ``args.world_size``, all processes, too."""
    if config_autotp_size(config) > 1:
        return scenario.cluster.world_size
    return scenario.cluster.data_parallel_degree


def _peek_stage(config: dict[str, Any]) -> int | None:
    """The ZeRO stage the config asks for (None if it cannot be read; _read_zero reports why)."""
    raw = config.get("zero_optimization")
    if isinstance(raw, bool):
        return 1 if raw else 0
    if not isinstance(raw, dict):
        return 0 if raw is None else None
    value = raw.get("stage", 0)
    number = None if isinstance(value, bool) else _as_count(value)
    return number if number is not None and number <= 3 else None


TENSOR_PARALLEL_KEYS = frozenset({
    "dtype", "autotp_size", "tp_overlap_comm", "vocab_parallel_lm_head", "vocab_parallel_ce_backend",
    "tensor_parallel", "tp", "injection_policy_tuple", "partition_config", "preset_model", "keep_module_on_host",
    "replace_with_kernel_inject", "kernel_inject",
})
"""Keys of DeepSpeed's ``tensor_parallel`` block (deepspeed/runtime/tensor_parallel/config.py ``TPTrainingConfig``,
fields and aliases; ``extra="forbid"``)."""


def _read_tensor_parallel(r: _Reader, config: dict[str, Any]) -> int:
    """The AutoTP degree (``tensor_parallel.autotp_size``; DeepSpeed's engine shards the model over it when > 1,
    engine.py ``autotp_size()`` / ``_configure_tensor_parallel``, and ZeRO runs over world / autotp_size)."""
    block = r.obj("tensor_parallel", config.get("tensor_parallel"))
    base_tp = r.base.cluster.tensor_parallel_size
    if block is None:
        return base_tp
    for k in block:
        if k not in TENSOR_PARALLEL_KEYS:
            r.unknown(f"tensor_parallel.{k}", "tensor_parallel", rejected=True)
    if "autotp_size" not in block:
        return base_tp
    raw = block["autotp_size"]
    tp = None if isinstance(raw, bool) else _as_count(raw)
    if tp is None:
        r.note("error", "tensor_parallel.autotp_size", f"autotp_size {_short(raw)} is not an integer; DeepSpeed "
               f"rejects it (TPTrainingConfig: int). Priced with tensor-parallel degree {base_tp}.",
               "Write an integer (0 or 1: AutoTP off).", "wrong_type")
        return base_tp
    tp = max(tp, 1)  # 0 (DeepSpeed's default) and 1 both mean no AutoTP
    c, m = r.base.cluster, r.base.model
    problem = None
    if c.gpus_per_node % tp:
        problem = f"it does not divide the {c.gpus_per_node} GPUs per node (AutoTP groups sit inside a node)"
    elif m.n_heads % tp:
        problem = f"it does not divide the model's {m.n_heads} attention heads"
    if problem:
        r.note("error", "tensor_parallel.autotp_size", f"autotp_size {tp}: {problem}. Priced with "
               f"tensor-parallel degree {base_tp}.", "Use a divisor of the GPUs per node and of the heads.",
               "tensor_parallel_size")
        return base_tp
    if tp > 1:
        r.note("info", "tensor_parallel.autotp_size", f"AutoTP degree {tp} read (DeepSpeed engine.py autotp_size): "
               f"priced with tensor-parallel degree {tp}, so ZeRO shards over the data-parallel degree "
               f"{c.world_size} / {tp} = {c.world_size // tp}.", "", "tensor_parallel")
    return tp


def _read_sequence_parallel(r: _Reader, config: dict[str, Any]) -> None:
    """LLaMA-Factory's ``sequence_parallel`` block and DeepSpeed's ``sequence_parallel_size``: read and stated;
    the cost model has no sequence-parallel dimension yet, so neither is priced."""
    block = config.get("sequence_parallel")
    if isinstance(block, dict):
        size = block.get("size")
        ulysses = block.get("ulysses") if isinstance(block.get("ulysses"), dict) else {}
        degree = ulysses.get("degree", size)
        tiling = block.get("tiling") if isinstance(block.get("tiling"), dict) else {}
        parts = [f"enabled={_short(block.get('enabled'))}", f"mode={_short(block.get('mode'))}",
                 f"Ulysses degree {_short(degree)}"]
        if tiling:
            parts.append(f"tiling enabled={_short(tiling.get('enabled'))} "
                         f"chunk_size={_short(tiling.get('chunk_size'))}")
        r.note("info", "sequence_parallel", "the sequence_parallel block is LLaMA-Factory's, not DeepSpeed's "
               "(DeepSpeedConfig does not read it; LLaMA-Factory sets up Ulysses from it, ../shared/ds-configs/"
               f"README.md): {', '.join(parts)}. Not priced: zeroplanner has no sequence-parallel dimension yet, so "
               "activations are priced for the full sequence on every GPU and ZeRO over the whole data-parallel "
               "degree (with Ulysses, LLaMA-Factory's data-parallel degree is world / degree).",
               "", "sequence_parallel_unpriced")
    elif "sequence_parallel" in config:
        r.obj("sequence_parallel", block)
    if "sequence_parallel_size" in config:
        r.note("info", "sequence_parallel_size", f"sequence_parallel_size {_short(config['sequence_parallel_size'])} "
               "read (DeepSpeedConfig divides the world size by it for the batch arithmetic); not priced: "
               "zeroplanner has no sequence-parallel dimension yet.", "", "sequence_parallel_unpriced")


def _read_zero(r: _Reader, config: dict[str, Any]) -> dict[str, Any]:
    """ZeroSpec fields from ``zero_optimization``; consistent with ZeroSpec's stage rules (what DeepSpeed ignores
    is dropped with a finding)."""
    bz = r.base.zero
    raw = config.get("zero_optimization")
    if isinstance(raw, bool):  # deprecated form: "zero_optimization": true means stage 1 (read_zero_config_deprecated)
        r.note("info", "zero_optimization", "boolean zero_optimization is DeepSpeed's deprecated form; true is stage 1.",
               "Write {\"stage\": 1}.", "deprecated")
        raw = {"stage": 1 if raw else 0}
    block = r.obj("zero_optimization", raw) or {}
    if "zero_optimization" not in config:
        r.note("info", "zero_optimization", "no zero_optimization block: DeepSpeed runs without ZeRO (stage 0).", "",
               "stage0")
    # Absent keys take DeepSpeed's defaults (ZeroSpec's defaults are DeepSpeed's); keys that only stage 3 reads keep
    # the base's values below stage 3, where they change nothing.
    fields: dict[str, Any] = ZeroSpec().model_dump()
    for k in block:
        if k not in ZERO_KEYS and k not in REMOVED_ZERO_KEYS:  # removed keys: lint reports them
            r.unknown(f"zero_optimization.{k}", "zero_optimization", rejected=True)

    stage_raw = block.get("stage", 0)
    stage = _as_count(stage_raw)
    if stage is None or stage > 3 or isinstance(stage_raw, bool):
        r.note("error", "zero_optimization.stage", f"stage {_short(stage_raw)} is not 0, 1, 2 or 3; DeepSpeed "
               f"rejects it. Priced as stage {bz.stage}.", "Use 0, 1, 2 or 3.", "wrong_type")
        stage = bz.stage
    fields["stage"] = stage
    if stage != 3:
        for target in _STAGE3_ONLY:
            fields[target] = getattr(bz, target)

    for key, target in _ZERO_INT_FIELDS.items():
        if key in block:
            spec_field = ZeroSpec.model_fields[target]
            low = 1 if target in ("reduce_bucket_size", "allgather_bucket_size", "zero_hpz_partition_size") else 0
            high = next((m.le for m in spec_field.metadata if hasattr(m, "le")), 10**13)
            value = block[key]
            if target in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold") and value == AUTO \
                    and stage != 3:
                r.note("info", f"zero_optimization.{key}", "'auto' at stage < 3 is left as is by the HF Trainer and "
                       "dropped by DeepSpeed; the key has no effect below stage 3.", "", "auto_resolved")
                continue
            fields[target] = r.count(f"zero_optimization.{key}", value, getattr(bz, target), low, int(high))
    for key in _ZERO_BOOL_FIELDS:
        if key in block:
            fields[key] = r.flag(f"zero_optimization.{key}", block[key], getattr(bz, key))

    opt_block = r.obj("zero_optimization.offload_optimizer", block.get("offload_optimizer"))
    par_block = r.obj("zero_optimization.offload_param", block.get("offload_param"))
    if block.get("cpu_offload") is True and opt_block is None:
        r.note("info", "zero_optimization.cpu_offload", "deprecated cpu_offload=true read as offload_optimizer cpu.",
               "Use \"offload_optimizer\": {\"device\": \"cpu\"}.", "deprecated")
        opt_block = {"device": "cpu"}
    if block.get("cpu_offload_param") is True and par_block is None:
        r.note("info", "zero_optimization.cpu_offload_param", "deprecated cpu_offload_param=true read as "
               "offload_param cpu.", "Use \"offload_param\": {\"device\": \"cpu\"}.", "deprecated")
        par_block = {"device": "cpu"}
    opt = _read_offload(r, opt_block, "offload_optimizer", bz.offload_optimizer)
    par = _read_offload(r, par_block, "offload_param", bz.offload_param)

    # What DeepSpeed ignores at this stage is priced without it (ZeroSpec would refuse the combination).
    if par.device != "none" and stage != 3:
        r.note("info", "zero_optimization.offload_param", f"offload_param is read only by ZeRO-3; at stage {stage} "
               "DeepSpeed ignores it, so it is priced without it.", "", "ignored_by_deepspeed")
        par = OffloadSpec()
    if opt.device != "none" and stage == 0:
        r.note("info", "zero_optimization.offload_optimizer", "offload_optimizer needs a ZeRO optimizer (stage 1-3); "
               "at stage 0 it is ignored and priced without it.", "", "ignored_by_deepspeed")
        opt = OffloadSpec()
    fields["offload_optimizer"] = opt.model_dump()
    fields["offload_param"] = par.model_dump()
    zpp = ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients")
    if stage != 3:
        active = [k for k in zpp if k in block and fields[k] not in (1, False)]
        if active:
            r.note("info", "zero_optimization." + active[0], f"ZeRO++ keys ({', '.join(active)}) act only at stage 3; "
                   "priced without them.", "", "ignored_by_deepspeed")
        fields["zero_hpz_partition_size"] = 1
        fields["zero_quantized_weights"] = False
        fields["zero_quantized_gradients"] = False
    return fields
