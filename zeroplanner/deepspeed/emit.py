"""Scenario (or plan) -> a complete DeepSpeed JSON config (:func:`to_deepspeed_config`), for raw
``deepspeed.initialize`` (``mode="deepspeed"``, every value concrete) or the Hugging Face Trainer
(``mode="hf_trainer"``: the plan's batch, precision and bucket values, ``"auto"`` for the optimizer, scheduler and
clipping; with ``hf_auto=True`` ``"auto"`` wherever the Trainer fills the value, :func:`hf_auto_values` says what it
will fill them with), the matching TrainingArguments and ``accelerate launch`` YAML (multi-node: main_process_ip,
main_process_port, machine_rank), and the notes a user needs to run it. Precision follows the GPU (fp16 with dynamic
loss scaling where there is no bf16). The tests check every generated config with DeepSpeed's own config classes."""

from __future__ import annotations

import json
import re
from typing import Any

from ..specs import OffloadSpec, Scenario, TrainingSpec, hardware_precision
from .keys import (
    ACCELERATE_MAIN_PROCESS_PORT,
    AUTO,
    DEEPSPEED_DEFAULTS,
    DEFAULT_BETAS,
    DEFAULT_EPS,
    DEFAULT_GRADIENT_CLIPPING,
    DEFAULT_LR,
    DEFAULT_WARMUP_STEPS,
    DEFAULT_WEIGHT_DECAY,
    FP16_BLOCK,
    MAIN_PROCESS_IP_PLACEHOLDER,
    NVME_PATH_PLACEHOLDER,
    SGD_MOMENTUM,
    Finding,
    deepspeed_overlap_comm_default,
    Mode,
)


_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
"""A host name or IPv4/IPv6 address, conservatively (the pattern of zeroplanner launch-script's --master-addr)."""


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
    * ``fp16.enabled`` / ``bf16.enabled`` from ``args.fp16`` / ``args.bf16`` (:func:`hf_training_arguments`: the
      precision the GPU runs, :func:`zeroplanner.specs.hardware_precision`).

    These are the values of the ``hf_auto=True`` variant. The default HF variant writes the plan's own batch sizes,
    precision and bucket sizes instead, so only the optimizer, scheduler and clipping keys are filled from here.
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
        "fp16.enabled": hardware_precision(s) == "fp16",
        "bf16.enabled": hardware_precision(s) == "bf16",
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
        "bf16": hardware_precision(s) == "bf16",
        "fp16": hardware_precision(s) == "fp16",
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


def deepspeed_batch_world_size(scenario: Any) -> int:
    """Ranks of DeepSpeed's batch arithmetic for a generated config: world / Ulysses degree. With Ulysses
    DeepSpeedConfig (runtime/config.py ``__init__``) divides the world size by ``sequence_parallel_size`` (or the
    Ulysses mpu's degree): each group of sp ranks consumes one sample stream, while ZeRO still shards over all
    world / tp ranks (the sequence-data-parallel group, :func:`zeroplanner.costmodel.ulysses.zero_shard_degree`).
    The tensor-parallel degree does not divide it: a generated config carries AutoTP itself
    (``tensor_parallel.autotp_size``), and ``deepspeed.initialize`` then builds DeepSpeedConfig with no mpu, so
    ``_batch_assertion`` counts every rank (measured with DeepSpeedConfig: ``32 != 1 * 8 * 8`` for
    micro 1 x accumulation 8 x data-parallel 4 on 8 ranks with autotp_size 2; read.py ``batch_world_size``)."""
    c = _scenario_of(scenario).cluster
    return c.world_size // c.sequence_parallel_size


def deepspeed_train_batch_size(scenario: Any) -> int:
    """``train_batch_size`` DeepSpeed asserts for the scenario: micro-batch x accumulation x
    :func:`deepspeed_batch_world_size` (``DeepSpeedConfig._batch_assertion``, DeepSpeed #6914)."""
    s = _scenario_of(scenario)
    return int(s.training.micro_batch * s.training.grad_accum * deepspeed_batch_world_size(s))


ULYSSES_ATTN_IMPLEMENTATION = "sdpa"
"""The core attention written into accelerate's Ulysses settings: transformers' default for the catalog's models
and what the cost model's Ulysses activation term assumes (costmodel/ulysses.py: sdpa/flash). It must equal the
model's ``attn_implementation`` (ulysses_sp.py ``register_with_transformers`` raises otherwise); ``eager`` is refused
there, ``flash_attention_2`` also works where installed (accelerate concept_guides/sequence_parallelism.md)."""


def parallelism_config_kwargs(scenario: Any) -> dict[str, Any]:
    """Keyword arguments of ``accelerate.ParallelismConfig`` (accelerate 1.15.0 parallelism_config.py) for the
    scenario's Ulysses degree: ``sp_backend="deepspeed"``, ``sp_size`` = the degree, ``dp_replicate_size`` 1 and
    ``dp_shard_size`` = world / sp (accelerate's rule ``dp_replicate_size x dp_shard_size x sp_size =
    num_processes``, concept_guides/sequence_parallelism.md; ``data_parallel_size`` = world / sp is the factor
    accelerate writes into ``train_batch_size``, equal to DeepSpeed's :func:`deepspeed_batch_world_size`), and the
    ``DeepSpeedSequenceParallelConfig`` fields as a dict under ``"sp_handler"``: ``sp_seq_length_is_variable``
    true, ``sp_attn_implementation`` :data:`ULYSSES_ATTN_IMPLEMENTATION`.

    Raises ``ValueError`` when the Ulysses degree is 1 (nothing to configure) or the scenario also has a
    tensor-parallel degree > 1 (accelerate's DeepSpeed Ulysses path hands DeepSpeed the Ulysses mpu, which has no
    tensor-parallel group: not a combination zeroplanner can write or has checked)."""
    s = _scenario_of(scenario)
    c = s.cluster
    if c.sequence_parallel_size <= 1:
        raise ValueError("sequence_parallel_size is 1: no ParallelismConfig is needed")
    if c.tensor_parallel_size > 1:
        raise ValueError(f"sequence_parallel_size {c.sequence_parallel_size} with tensor_parallel_size "
                         f"{c.tensor_parallel_size}: accelerate's DeepSpeed Ulysses path has no tensor-parallel "
                         "group; use one of the two")
    return {
        "sp_backend": "deepspeed",
        "sp_size": int(c.sequence_parallel_size),
        "dp_replicate_size": 1,
        "dp_shard_size": int(c.world_size // c.sequence_parallel_size),
        "sp_handler": {"sp_seq_length_is_variable": True, "sp_attn_implementation": ULYSSES_ATTN_IMPLEMENTATION},
    }


def parallelism_config_snippet(scenario: Any) -> str:
    """Python for the HF Trainer / accelerate with the scenario's Ulysses degree (:func:`parallelism_config_kwargs`):
    ``ParallelismConfig(...)`` with a ``DeepSpeedSequenceParallelConfig``, to pass as
    ``TrainingArguments(parallelism_config=...)`` or ``Accelerator(parallelism_config=...)``. Raises ``ValueError``
    as :func:`parallelism_config_kwargs` does."""
    kw = parallelism_config_kwargs(scenario)
    handler = ", ".join(f"{k}={v!r}" for k, v in kw["sp_handler"].items())
    sizes = ", ".join(f"{k}={kw[k]!r}" for k in ("sp_backend", "sp_size", "dp_replicate_size", "dp_shard_size"))
    return ("from accelerate import ParallelismConfig\n"
            "from accelerate.utils import DeepSpeedSequenceParallelConfig\n"
            f"parallelism_config = ParallelismConfig({sizes}, "
            f"sp_handler=DeepSpeedSequenceParallelConfig({handler}))\n")


def to_deepspeed_config(
    scenario: Any, mode: Mode = "deepspeed", total_num_steps: int | None = None, torch_adam: bool = False,
    hf_auto: bool = False,
) -> dict[str, Any]:
    """A complete DeepSpeed config for ``scenario`` (a Scenario or a Plan; a Plan's chosen scenario is used).

    ``mode="deepspeed"``: every value concrete, for ``deepspeed.initialize(config=...)`` or ``deepspeed --config``.
    ``mode="hf_trainer"``: for the HF Trainer / accelerate. By default the plan's own values stay concrete --
    ``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, the precision block,
    ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``, ``stage3_param_persistence_threshold`` -- so the config
    describes the run that was priced: the Trainer keeps concrete bucket sizes (``fill_only``) and raises when a
    concrete batch or precision value disagrees with TrainingArguments (``fill_match`` -> ``trainer_config_finalize``,
    transformers 5.24.0 integrations/deepspeed.py); ``"auto"`` stays only where the plan has no value (optimizer
    hyperparameters, scheduler, ``gradient_clipping``). ``hf_auto=True``: ``"auto"`` in every field the Trainer fills
    (:data:`HF_TRAINER_AUTO_KEYS`; :func:`hf_auto_values` gives the values, e.g. ``reduce_bucket_size`` =
    hidden_size ** 2 instead of the plan's). :func:`hf_training_arguments` gives the TrainingArguments for both.

    Precision follows the hardware (:func:`zeroplanner.specs.hardware_precision`): bf16 on a GPU without bf16
    (V100, T4) is written as fp16 with dynamic loss scaling (:data:`FP16_BLOCK`), never as a ``bf16`` block;
    :func:`generation_notes` says so.

    Content: ``train_batch_size`` = :func:`deepspeed_train_batch_size` (DeepSpeed's assertion in
    ``DeepSpeedConfig._batch_assertion``; with Ulysses under the HF Trainer ``"auto"``, see the code),
    ``sequence_parallel_size`` when the scenario's Ulysses degree is > 1 (raw DeepSpeed only; under HF/accelerate the
    degree goes in :func:`parallelism_config_kwargs` / :func:`to_accelerate_config`), the precision block (at most one of bf16/fp16 enabled; fp16 with dynamic
    loss scaling keys), optimizer (AdamW, Adam, SGD; none for 8-bit Adam, see :func:`generation_notes`), scheduler
    (WarmupLR, or WarmupDecayLR when ``total_num_steps`` is given or in HF mode), ``gradient_clipping``,
    ``zero_optimization`` with the scenario's ZeRO keys (offload blocks only when offloading; ``stage3_*`` and
    ZeRO++ keys only at stage 3, the only stage that reads them), ``tensor_parallel.autotp_size`` when the
    scenario's AutoTP degree (``cluster.tensor_parallel_size``) is above 1, and ``activation_checkpointing`` when
    the scenario checkpoints (the block configures ``deepspeed.checkpointing``; HF models checkpoint through
    ``gradient_checkpointing`` instead, so HF mode leaves it out). Every count is a Python ``int``.

    ``torch_adam=True`` adds ``"torch_adam": true`` to an Adam/AdamW block: DeepSpeed then uses torch.optim's
    implementation instead of FusedAdam, whose op is JIT-compiled on first use (minutes on a CPU-only machine).
    Ignored with offload_optimizer: DeepSpeed checks torch_adam before choosing DeepSpeedCPUAdam
    (engine.py, get_optimizer_configuration), and torch's AdamW on CPU is much slower.

    Raises ``TypeError`` for something that is neither a Scenario nor a Plan, ``ValueError`` for an unknown mode,
    a ``total_num_steps`` < 1, or ``hf_auto`` outside ``mode="hf_trainer"``.
    """
    if mode not in ("deepspeed", "hf_trainer"):
        raise ValueError(f"mode={mode!r}: allowed 'deepspeed' or 'hf_trainer'")
    if hf_auto and mode != "hf_trainer":
        raise ValueError("hf_auto=True: only with mode='hf_trainer' (raw DeepSpeed does not resolve 'auto')")
    if total_num_steps is not None and (isinstance(total_num_steps, bool) or int(total_num_steps) < 1):
        raise ValueError(f"total_num_steps={total_num_steps!r} must be an integer >= 1")
    s = _scenario_of(scenario)
    t, z = s.training, s.zero
    hf = mode == "hf_trainer"
    auto = hf and hf_auto  # "auto" also where the plan has a value (the Trainer then fills its own)
    precision = hardware_precision(s)
    sp = s.cluster.sequence_parallel_size
    # the Trainer's train_batch_size counts every process (hf_auto_values); equal to the plan's without TP. With
    # Ulysses under the HF Trainer it is "auto": the Trainer fills micro x accumulation x all processes and accelerate
    # replaces that by micro x accumulation x data_parallel_size (accelerator.py _prepare_deepspeed), so no concrete
    # value satisfies both (trainer_config_process raises on a mismatch).
    batch = hf_auto_values(s)["train_batch_size"] if hf else deepspeed_train_batch_size(s)

    config: dict[str, Any] = {
        "train_batch_size": AUTO if auto or (hf and sp > 1) else int(batch),
        "train_micro_batch_size_per_gpu": AUTO if auto else int(t.micro_batch),
        "gradient_accumulation_steps": AUTO if auto else int(t.grad_accum),
        "gradient_clipping": AUTO if hf else DEFAULT_GRADIENT_CLIPPING,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    if sp > 1 and not hf:
        # DeepSpeedConfig divides the world size by it when no mpu is passed (runtime/config.py __init__); with the
        # Ulysses mpu it uses the mpu's degree, the same number. Not under the HF Trainer: there ZeRO-3's zero.Init
        # (from_pretrained, no mpu) would divide the world by it against the Trainer's train_batch_size.
        config["sequence_parallel_size"] = int(sp)
    if auto:
        # The Trainer fills both from args.bf16/args.fp16 and checks they do not conflict; a GPU without bf16
        # gets no bf16 block at all.
        if s.cluster.gpu.supports_bf16:
            config["bf16"] = {"enabled": AUTO}
            config["fp16"] = {"enabled": AUTO}
        else:
            config["fp16"] = {**FP16_BLOCK, "enabled": AUTO}
    elif precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
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
    zero["reduce_bucket_size"] = AUTO if auto else int(z.reduce_bucket_size)
    zero["allgather_bucket_size"] = int(z.allgather_bucket_size)
    if z.overlap_comm is not None:
        zero["overlap_comm"] = bool(z.overlap_comm)
    zero["contiguous_gradients"] = bool(z.contiguous_gradients)
    if z.stage == 3:
        zero["stage3_prefetch_bucket_size"] = AUTO if auto else int(z.stage3_prefetch_bucket_size)
        zero["stage3_param_persistence_threshold"] = AUTO if auto else int(z.stage3_param_persistence_threshold)
        zero["stage3_max_live_parameters"] = int(z.stage3_max_live_parameters)
        zero["stage3_max_reuse_distance"] = int(z.stage3_max_reuse_distance)
        # Needed to save a usable 16-bit model from sharded weights (HF save_model / engine.save_16bit_model).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        zero["zero_hpz_partition_size"] = int(z.zero_hpz_partition_size)
        zero["zero_quantized_weights"] = bool(z.zero_quantized_weights)
        zero["zero_quantized_gradients"] = bool(z.zero_quantized_gradients)
    config["zero_optimization"] = zero
    tp = int(s.cluster.tensor_parallel_size)
    if tp > 1:
        # DeepSpeed AutoTP training: deepspeed.initialize shards the model's linears over autotp_size ranks and
        # builds ZeRO over world / autotp_size (runtime/engine.py autotp_size, _configure_tensor_parallel;
        # runtime/tensor_parallel/config.py TPTrainingConfig)
        config["tensor_parallel"] = {"autotp_size": tp}

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


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and not (prefix in ("optimizer", "scheduler")):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _setting_reason(key: str, value: Any, s: Scenario) -> str:
    """One line: why the config writes ``key`` = ``value`` for scenario ``s``."""
    t, z, c = s.training, s.zero, s.cluster
    leaf = key.rsplit(".", 1)[-1]
    block = key.split(".")[1] if key.startswith("zero_optimization.offload_") else ""
    if value == AUTO:
        return "filled by the HF Trainer from TrainingArguments (transformers integrations/deepspeed.py)"
    fixed = {
        "train_batch_size": f"micro-batch {t.micro_batch} x {t.grad_accum} accumulation steps x "
        f"{deepspeed_batch_world_size(s)} data-parallel ranks: DeepSpeed asserts the three multiply out "
        "(runtime/config.py _batch_assertion)",
        "train_micro_batch_size_per_gpu": "the plan's micro-batch (samples per GPU per forward), priced for memory "
        "and step time",
        "gradient_accumulation_steps": "the plan's accumulation steps: micro-batch x steps keeps the scenario's "
        "samples per GPU per optimizer step",
        "gradient_clipping": f"clip at norm {value}, the HF TrainingArguments max_grad_norm default, so a raw and "
        "an HF config train alike",
        "steps_per_print": f"log every {value} steps",
        "optimizer": "the scenario's optimizer with the HF TrainingArguments defaults (lr 5e-5, betas (0.9, 0.999), "
        "eps 1e-8, weight_decay 0): set your own hyperparameters",
        "scheduler": "linear warmup over the first steps to the optimizer's lr (DeepSpeed WarmupLR / WarmupDecayLR): "
        "set your own schedule",
        "zero_allow_untested_optimizer": "ZeRO refuses optimizers it has not tested unless told "
        "(engine.py _do_optimizer_sanity_check)",
        "zero_force_ds_cpu_optimizer": "with offload_optimizer ZeRO insists on DeepSpeedCPUAdam unless this is false "
        "(engine.py _configure_optimizer); the client's optimizer runs instead",
        "sequence_parallel_size": f"Ulysses degree {value}: DeepSpeed's batch arithmetic divides the world by it "
        "(runtime/config.py)",
        "tensor_parallel.autotp_size": f"AutoTP degree {value}: the plan's tensor-parallel split inside the node",
        "bf16.enabled": "the scenario's precision, bf16 (priced at the GPU's bf16 tensor-core peak)",
        "fp16.enabled": "fp16 with dynamic loss scaling (loss_scale 0): the scenario's precision, or bf16 on a GPU "
        "without bf16 tensor cores",
        "zero_optimization.stage": f"ZeRO-{value}: the stage the plan prices (`zeroplanner recommend` gives the "
        "reasons for the pick)",
        "zero_optimization.reduce_bucket_size": f"{value:,} elements per gradient reduction bucket, the value the "
        "plan priced (lowered when few parameters train: DeepSpeed allocates the whole bucket)"
        if isinstance(value, int) else "",
        "zero_optimization.allgather_bucket_size": f"{value:,} elements per parameter all-gather bucket (ZeRO-1/2)"
        if isinstance(value, int) else "",
        "zero_optimization.stage3_prefetch_bucket_size": "elements ZeRO-3 prefetches ahead of the module that needs "
        "them, the value priced (live-parameter memory and overlap of the gathers)",
        "zero_optimization.stage3_param_persistence_threshold": "parameters smaller than this stay whole on every "
        "GPU (no gather), the value priced",
        "zero_optimization.stage3_max_live_parameters": "most parameter elements ZeRO-3 keeps gathered at once, "
        "the value priced",
        "zero_optimization.stage3_max_reuse_distance": "a gathered parameter reused within this many elements "
        "stays gathered, the value priced",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": "gathers the sharded 16-bit weights on save "
        "so save_model / save_16bit_model writes a usable model",
        "zero_optimization.zero_hpz_partition_size": f"ZeRO++ hpZ: a secondary weight shard over {value} GPUs (one "
        "node) so the backward's all-gathers stay inside the node (ZeRO++ paper, arXiv 2306.10209)",
        "zero_optimization.zero_quantized_weights": "ZeRO++ qwZ: weights all-gathered in int8 (lossy; allowed by "
        "allow_lossy_communication or set by you)",
        "zero_optimization.zero_quantized_gradients": "ZeRO++ qgZ: gradients reduce-scattered in int4 (lossy; "
        "allowed by allow_lossy_communication or set by you)",
        "zero_optimization.contiguous_gradients": "copies gradients into one contiguous buffer as they are produced "
        "(less fragmentation)",
    }
    if key == "zero_optimization.overlap_comm":
        default = deepspeed_overlap_comm_default(z.stage)
        how = ("overlaps the gradient reduction with the backward (extra bucket buffers; DeepSpeed's docs quote up "
               "to 4.5x reduce_bucket_size)" if value else "reduces gradients without overlapping the backward")
        why = ("the plan's value: unless you set it, the planner prices true and false at ZeRO-1/2 and keeps false "
               "when true is not faster (false needs less memory)" if not value else
               "the plan's value: unless you set it, the planner prices true and false at ZeRO-1/2 and true was "
               "faster")
        return f"{how}; {why} (DeepSpeed's default at stage {z.stage}: {str(default).lower()})"
    if leaf == "device" and block:
        what = "optimizer states and the optimizer step" if block == "offload_optimizer" else "the 16-bit parameters"
        where = "host RAM" if value == "cpu" else "NVMe"
        return (f"{what} live in {where}: the plan fits only with it (or it is what you gave); priced with the "
                f"PCIe and {where} traffic per step")
    if leaf == "pin_memory" and block:
        return ("page-locked host buffers: faster PCIe copies at the cost of pinned host RAM" if value else
                "pageable host buffers: slower PCIe copies, no pinned host RAM")
    if leaf == "nvme_path" and block:
        return ("the NVMe directory you gave" if value != NVME_PATH_PLACEHOLDER else
                "a placeholder: replace it with a directory on a local NVMe drive (one per node)")
    if key.startswith("activation_checkpointing"):
        return "configures deepspeed.checkpointing for models that call it (Megatron-style)"
    if key.startswith("fp16.") and key not in fixed:
        return "DeepSpeed's dynamic loss scaling (runtime/precision_config.py)"
    return fixed.get(key, "")


def explain_config(config: dict[str, Any], scenario: Any) -> dict[str, str]:
    """Dotted key -> one-line reason for every setting of ``config`` (as :func:`to_deepspeed_config` wrote it for
    ``scenario``, a Scenario or a Plan) whose value differs from DeepSpeed's default (:data:`DEEPSPEED_DEFAULTS`),
    plus every key without a default (the batch keys, the optimizer and scheduler blocks, one reason each) and
    ``zero_optimization.overlap_comm`` whenever it is written (DeepSpeed's default depends on the stage,
    :func:`deepspeed_overlap_comm_default`). Keys are in the config's order. Raises ``KeyError`` naming a written
    key that has no reason (a key added to the generator without one)."""
    s = _scenario_of(scenario)
    out: dict[str, str] = {}
    for key, value in _flat(config).items():
        if key in DEEPSPEED_DEFAULTS and DEEPSPEED_DEFAULTS[key] == value and key != "zero_optimization.overlap_comm":
            continue
        reason = _setting_reason(key, value, s)
        if not reason:
            raise KeyError(f"{key}: written by the generator without a reason in explain_config")
        out[key] = reason
    return out


def generation_notes(scenario: Any, mode: Mode = "deepspeed", hf_auto: bool = False, accelerate: bool = False,
                     main_process_ip: str | None = None) -> list[Finding]:
    """What the user must know to run the config of :func:`to_deepspeed_config` with the same ``mode`` and
    ``hf_auto`` (and, with ``accelerate``, the YAML of :func:`to_accelerate_config` given the same
    ``main_process_ip``): findings, info or warning."""
    s = _scenario_of(scenario)
    t, z = s.training, s.zero
    notes: list[Finding] = []
    # bf16 on a GPU without it: the bf16_unsupported pitfall (zeroplanner.pitfalls), which lint and estimate report
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
                message="With offload_optimizer the optimizer step runs on the CPU, in the client's bitsandbytes "
                "8-bit Adam (zero_force_ds_cpu_optimizer is false). bitsandbytes runs its optimizers on CPU only in "
                "releases with its PR #1901 (merged 2026-03-18); older ones need CUDA and fail here. Priced: 2 bytes "
                "of optimizer state per parameter on the host, updated at the host's CPU-Adam rate (bitsandbytes' "
                "CPU speed is not measured).",
                fix="Use a bitsandbytes release with CPU optimizers, or AdamW (DeepSpeedCPUAdam) with offload.",
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
    if mode == "hf_trainer" and hf_auto:
        auto = hf_auto_values(s)
        filled = ", ".join(f"{k}={v}" for k, v in auto.items() if k.startswith("zero_optimization"))
        notes.append(Finding(
            severity="info", key="", rule="hf_auto",
            message=f"'auto' fields are filled by the HF Trainer from TrainingArguments and the model ({filled}); "
            "the bucket sizes are the Trainer's, not the ones the plan priced.",
            fix="Run it through transformers' Trainer (TrainingArguments(deepspeed=...)) or accelerate; raw "
            "deepspeed.initialize does not resolve 'auto'.",
        ))
    elif mode == "hf_trainer":
        notes.append(Finding(
            severity="info", key="", rule="hf_plan_values",
            message="batch sizes, precision and bucket sizes are the plan's values (the run that was priced); the "
            "HF Trainer keeps them and raises if TrainingArguments disagree. 'auto' is left only in the optimizer, "
            "scheduler and gradient_clipping, which the Trainer fills from TrainingArguments"
            + (" (and, with Ulysses, train_batch_size: see below)." if s.cluster.sequence_parallel_size > 1
               else "."),
            fix="Use the TrainingArguments printed with the config; --hf-auto lets the Trainer choose batch and "
            "bucket sizes instead (a different run from the one priced). Raw deepspeed.initialize does not resolve "
            "'auto'.",
        ))
    elif t.checkpointing != "none":
        notes.append(Finding(
            severity="info", key="activation_checkpointing", rule="checkpointing_block",
            message="The activation_checkpointing block configures deepspeed.checkpointing.checkpoint; it takes "
            "effect only where the model calls it (Megatron-style). HF models checkpoint via "
            "model.gradient_checkpointing_enable().",
            fix="",
        ))
    sp = s.cluster.sequence_parallel_size
    if sp > 1 and mode == "deepspeed":
        notes.append(Finding(
            severity="info", key="sequence_parallel_size", rule="ulysses_setup",
            message=f"sequence_parallel_size {sp} sets DeepSpeed's batch arithmetic (train_batch_size = micro x "
            f"accumulation x {s.cluster.world_size // s.cluster.tensor_parallel_size} / {sp} ranks, runtime/config.py); "
            "it does not split the sequence by itself.",
            fix=f"In the script: mpu = UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=model, "
            f"core_attn_implementation={ULYSSES_ATTN_IMPLEMENTATION!r}, sequence_parallel_size={sp}, "
            f"micro_batch_size={t.micro_batch}, seq_length_is_variable=True), deepspeed.initialize(..., mpu=mpu), and "
            "wrap the DataLoader in UlyssesSPDataLoaderAdapter (deepspeed/runtime/sequence_parallel/ulysses_sp.py).",
        ))
    elif sp > 1:
        notes.append(Finding(
            severity="info", key="train_batch_size", rule="ulysses_setup",
            message=f"Ulysses degree {sp} under the HF Trainer / accelerate: it is set by ParallelismConfig("
            f"sp_backend='deepspeed', sp_size={sp}, dp_shard_size={s.cluster.world_size // sp}), not by the JSON; "
            "train_batch_size is 'auto' because the Trainer fills micro x accumulation x all processes and accelerate "
            "then replaces it by micro x accumulation x data_parallel_size (accelerator.py _prepare_deepspeed).",
            fix="Pass TrainingArguments(parallelism_config=...) (zeroplanner config --hf-trainer prints it) or "
            "launch with the accelerate YAML's parallelism_config block (--accelerate).",
        ))
    tiled = [name for name, on in (("tiled MLP", t.tiled_mlp), ("tiled loss", t.tiled_loss),
                                   ("activation-checkpoint offload", t.checkpoint_offload)) if on]
    if tiled:
        notes.append(Finding(
            severity="info", key="", rule="alst_code",
            message=f"priced with {', '.join(tiled)} (ALST, arXiv 2506.13996 Sec. 3.2-3.3): none of them is a "
            "DeepSpeed config key, so the generated config does not switch them on.",
            fix="Apply them in the training code: DeepSpeed's TiledMLP and TiledFusedLogitsLoss "
            "(deepspeed/runtime/sequence_parallel/ulysses_sp.py) or Liger's fused cross-entropy "
            "(TrainingArguments(use_liger_kernel=True)); checkpoint offload as ALST does it.",
        ))
    if accelerate and s.cluster.nodes > 1 and main_process_ip is None:
        notes.append(Finding(
            severity="warning", key="main_process_ip", rule="main_process_ip_placeholder",
            message=f"{s.cluster.nodes} nodes: the accelerate YAML's main_process_ip is the placeholder "
            f"{MAIN_PROCESS_IP_PLACEHOLDER!r}, and machine_rank must differ per node.",
            fix="Write node 0's address into main_process_ip (zeroplanner config --main-process-ip ADDR), copy the "
            "YAML to every node and set machine_rank to 0 .. N-1 (or accelerate launch --machine_rank I).",
        ))
    return notes


def to_accelerate_config(scenario: Any, deepspeed_config_file: str = "ds_config.json",
                         main_process_ip: str | None = None,
                         main_process_port: int = ACCELERATE_MAIN_PROCESS_PORT) -> str:
    """YAML text for ``accelerate launch --config_file`` (accelerate 1.15.0, ``ClusterConfig`` in
    accelerate/commands/config/config_args.py) that runs the scenario's world size with DeepSpeed, reading the
    DeepSpeed JSON from ``deepspeed_config_file`` (write it with :func:`to_deepspeed_config`).

    ``mixed_precision`` is left out on purpose: with ``deepspeed_config_file`` accelerate refuses a precision from
    its own config (``DeepSpeedPlugin._deepspeed_config_checks``); the JSON's bf16/fp16 block decides.
    ``zero3_init_flag`` is true at stage 3 (builds the model sharded, ``deepspeed.zero.Init``).

    On more than one node the YAML also carries what the multi-node launch needs (accelerate/commands/launch.py,
    ``deepspeed_launcher`` / ``prepare_multi_gpu_env``: ``main_process_ip`` becomes the rendezvous address,
    ``machine_rank`` the node rank): ``main_process_ip`` (node 0's address; :data:`MAIN_PROCESS_IP_PLACEHOLDER`
    when not given, which :func:`generation_notes` warns about), ``main_process_port`` (default
    :data:`ACCELERATE_MAIN_PROCESS_PORT`) and a comment on ``machine_rank``: 0 on node 0, 1 .. N-1 on the others.

    With a Ulysses degree > 1 it adds the ``parallelism_config`` block (keys ``parallelism_config_*`` as
    accelerate's launcher copies them into its arguments, commands/launch.py ``_validate_launch_command``; values from
    :func:`parallelism_config_kwargs`): ``sp_backend`` deepspeed, ``sp_size``, ``dp_shard_size`` = world / sp.

    Raises ``ValueError`` naming ``deepspeed_config_file``, ``main_process_ip`` (not a host name or address:
    letters, digits, ``.``, ``-``, ``_``, ``:``) or ``main_process_port`` (outside 1-65535), or, with Ulysses,
    ``sequence_parallel_size`` (:func:`parallelism_config_kwargs`).
    """
    s = _scenario_of(scenario)
    if not isinstance(deepspeed_config_file, str) or not deepspeed_config_file or "\n" in deepspeed_config_file:
        raise ValueError("deepspeed_config_file must be a non-empty one-line path")
    if main_process_ip is not None and not (isinstance(main_process_ip, str) and _HOST.match(main_process_ip)):
        raise ValueError(f"main_process_ip {main_process_ip!r} is not a host name or address (letters, digits, "
                         "'.', '-', '_', ':')")
    if isinstance(main_process_port, bool) or not isinstance(main_process_port, int) \
            or not 1 <= main_process_port <= 65535:
        raise ValueError(f"main_process_port {main_process_port!r} is out of range (1-65535)")
    nodes = int(s.cluster.nodes)
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
    ]
    if nodes > 1:
        lines += [
            "# machine_rank: 0 on node 0 (main_process_ip), "
            + ("1 on the other node" if nodes == 2 else f"1 .. {nodes - 1} on the other nodes")
            + ": set it in each node's copy, or pass accelerate launch --machine_rank I",
            "machine_rank: 0",
            ("# main_process_ip: node 0's address, reachable from every node" if main_process_ip else
             f"# main_process_ip: REPLACE {MAIN_PROCESS_IP_PLACEHOLDER} with node 0's address, reachable from every "
             "node"),
            f"main_process_ip: {json.dumps(main_process_ip or MAIN_PROCESS_IP_PLACEHOLDER)}",
            f"main_process_port: {int(main_process_port)}",
        ]
    else:
        lines.append("machine_rank: 0")
    lines += [
        "main_training_function: main",
        f"num_machines: {nodes}",
        f"num_processes: {int(s.cluster.world_size)}",
    ]
    if s.cluster.sequence_parallel_size > 1:
        kw = parallelism_config_kwargs(s)
        lines += [
            "# Ulysses sequence parallelism: accelerate launch exports these (utils/launch.py "
            "prepare_extend_env_parallelism_config) and the Accelerator builds ParallelismConfig from them",
            "parallelism_config:",
            f"  parallelism_config_dp_replicate_size: {kw['dp_replicate_size']}",
            f"  parallelism_config_dp_shard_size: {kw['dp_shard_size']}",
            f"  parallelism_config_sp_size: {kw['sp_size']}",
            f"  parallelism_config_sp_backend: {kw['sp_backend']}",
            "  parallelism_config_sp_seq_length_is_variable: true",
            f"  parallelism_config_sp_attn_implementation: {kw['sp_handler']['sp_attn_implementation']}",
        ]
    lines += [
        "rdzv_backend: static",
        f"same_network: {'true' if nodes > 1 else 'false'}",
        "use_cpu: false",
    ]
    return "\n".join(lines) + "\n"


