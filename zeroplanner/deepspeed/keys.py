"""The DeepSpeed config vocabulary shared by generation (:mod:`.emit`), reading (:mod:`.read`), the linter
(:mod:`.lint`) and the library check (:mod:`.library`): key tables, limits, defaults and :class:`Finding`.

Key names, types and defaults follow DeepSpeed 0.19.8 (``deepspeed/runtime/config.py``,
``deepspeed/runtime/zero/config.py``, ``deepspeed/runtime/zero/offload_config.py``,
``deepspeed/runtime/precision_config.py``); the ``"auto"`` rules follow transformers 5.24.0
(``transformers/integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_process`` and
``trainer_config_finalize``). Imports only the zeroplanner core (no torch, no deepspeed)."""


from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..inputs import stage3_only, zero_aliases

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

DEEPSPEED_DEFAULTS: dict[str, Any] = {
    # deepspeed/runtime/constants.py (*_DEFAULT)
    "gradient_clipping": 1.0,
    "steps_per_print": None,
    "wall_clock_breakdown": False,
    "zero_allow_untested_optimizer": False,
    "zero_force_ds_cpu_optimizer": True,
    "sequence_parallel_size": 1,
    # deepspeed/runtime/precision_config.py
    "bf16.enabled": False,
    "fp16.enabled": False,
    "fp16.loss_scale": 0,
    "fp16.initial_scale_power": 16,
    "fp16.loss_scale_window": 1000,
    "fp16.hysteresis": 2,
    "fp16.min_loss_scale": 1,
    # deepspeed/runtime/zero/config.py DeepSpeedZeroConfig (overlap_comm: see DEEPSPEED_OVERLAP_COMM_DEFAULT)
    "zero_optimization.stage": 0,
    "zero_optimization.reduce_bucket_size": 500_000_000,
    "zero_optimization.allgather_bucket_size": 500_000_000,
    "zero_optimization.contiguous_gradients": True,
    "zero_optimization.stage3_prefetch_bucket_size": 50_000_000,
    "zero_optimization.stage3_param_persistence_threshold": 100_000,
    "zero_optimization.stage3_max_live_parameters": 1_000_000_000,
    "zero_optimization.stage3_max_reuse_distance": 1_000_000_000,
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    "zero_optimization.zero_hpz_partition_size": 1,
    "zero_optimization.zero_quantized_weights": False,
    "zero_optimization.zero_quantized_gradients": False,
    # deepspeed/runtime/zero/offload_config.py
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_optimizer.pin_memory": True,
    "zero_optimization.offload_optimizer.nvme_path": None,
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.offload_param.pin_memory": True,
    "zero_optimization.offload_param.nvme_path": None,
    # deepspeed/runtime/activation_checkpointing/config.py ACT_CHKPT_DEFAULT
    "activation_checkpointing.partition_activations": False,
    "activation_checkpointing.cpu_checkpointing": False,
    "activation_checkpointing.contiguous_memory_optimization": False,
    "activation_checkpointing.number_checkpoints": None,
    "activation_checkpointing.synchronize_checkpoint_boundary": False,
    "activation_checkpointing.profile": False,
}
"""DeepSpeed 0.19.8's defaults of the keys :func:`~zeroplanner.deepspeed.to_deepspeed_config` writes, dotted
(checked against DeepSpeed's own config models by tests/core/test_config_explain.py). Keys without an entry have
no default value to compare with (the batch keys are derived from each other; the optimizer and scheduler blocks
are absent by default)."""


def deepspeed_overlap_comm_default(stage: int) -> bool:
    """DeepSpeed's ``overlap_comm`` when the key is absent: True at stage 3, False below
    (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig ``overlap_comm_valid``)."""
    return int(stage) == 3


ACCELERATE_MAIN_PROCESS_PORT = 29500
"""accelerate's main_process_port when none is given (accelerate 1.15.0, utils/launch.py: ``main_process_port`` None
-> 29500), also torchrun's default ``--master-port``."""
MAIN_PROCESS_IP_PLACEHOLDER = "NODE0_ADDRESS"
"""Written as ``main_process_ip`` in a multi-node accelerate YAML when no address is given: it fails to resolve at
launch instead of pointing every node at a wrong machine (zeroplanner.deepspeed.emit.generation_notes warns)."""

# ----------------------------------------------------------------------------------------------------------------
# Key tables (DeepSpeed 0.19.8). tests/core/test_dsconfig.py checks ZERO_KEYS against DeepSpeedZeroConfig.model_fields
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
``sequence_parallel`` block (Ulysses; tests/data/ds-configs/README.md, lf_z3_alst.json)."""

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




def clip_key(key: str, limit: int = 300) -> str:
    """A user's key as it may appear in a Finding (keys of any length are legal JSON)."""
    key = str(key)
    return key if len(key) <= limit else key[: limit - 3] + "..."



def _path(*parts: str) -> str:
    return ".".join(p for p in parts if p)



def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
