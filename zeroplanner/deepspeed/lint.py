"""Lint a DeepSpeed config against the pitfalls users hit (docs/references.md section 7; DeepSpeed's config docs).

:func:`lint` returns :class:`~zeroplanner.deepspeed.Finding` objects: severity, the dotted key concerned, why it is
a problem, and the fix. Rules that depend only on the config run without a scenario; rules about the run (world
size, nodes, network, QLoRA, host RAM, communication share) need ``scenario`` and come from
:func:`zeroplanner.pitfalls.scenario_pitfalls`, the same statements ``zeroplanner estimate`` prints as warnings.
``mode`` names the client that runs the config: ``"deepspeed"`` (``deepspeed.initialize`` in the user's script) or
``"hf_trainer"`` (the HF Trainer / accelerate); rules whose outcome depends on the client say what that client does.
:data:`zeroplanner.pitfalls.RULES` lists every rule with what shows it in the real stack (DeepSpeed's config
classes, the Trainer's fill, ``deepspeed.initialize``, or the run itself).

Every rule tolerates malformed input (wrong types anywhere): it reports what it can and never raises. The
config-text rules, by ``Finding.rule``:

============================  =========  ========================================================================
rule                          severity   source
============================  =========  ========================================================================
integer_type                  error/warn bucket sizes etc. must be integers, not 15099494.4 or "5e8"
                                         (LlamaFactory #5252; DeepSpeedZeroConfig's pydantic int fields);
                                         true/false (read as 1/0) and a fractional accumulation: warning
nonpositive_value             error/warn zero/negative buckets and batch sizes (gt=0 / ge=0, the batch
                                         assertion, WarmupLR); values DeepSpeed accepts (allgather_bucket_size 0,
                                         DeepSpeed #8260; steps_per_print, fp16.hysteresis, ...): warning
batch_mismatch                error      train_batch_size != micro * grad_accum * data-parallel degree (#6914)
fp16_and_bf16                 error      both enabled (DeepSpeedConfig asserts)
offload_param_below_stage3    warning    offload_param is read only by ZeRO-3 (accepted and ignored below)
offload_optimizer_stage0      warning    offload_optimizer needs stage 1-3 (accepted and ignored at stage 0)
nvme_optimizer_below_stage3   warning    stage 1/2 treat any offload_optimizer device as CPU (stage_1_and_2.py)
auto_outside_hf               error/warn "auto" with DeepSpeed alone (docs/references.md s.7): batch keys,
                                         optimizer, scheduler, clipping fail; zero/bf16/fp16 blocks drop it
                                         and use the default: warning; info in HF mode
auto_not_filled               error      "auto" in a key neither the HF Trainer nor accelerate fills (accelerate
                                         raises "not found in kwargs")
no_zero_block_hf              error      no zero_optimization block under the HF Trainer (accelerate's
                                         DeepSpeedPlugin raises)
removed_key                   error      keys DeepSpeed 0.19.8 removed and rejects
max_grad_norm_param           error      optimizer.params.max_grad_norm (DeepSpeed raises; use gradient_clipping)
untested_optimizer            error      non-DeepSpeed optimizer type with ZeRO needs zero_allow_untested_optimizer
offload_client_optimizer      error/info ZeRO-Offload without an optimizer block: deepspeed.initialize raises on the
                                         client's torch optimizer unless zero_force_ds_cpu_optimizer=false
                                         (engine.py); under the HF Trainer accelerate swaps in DeepSpeedCPUAdam
                                         (map_pytorch_optim_to_deepspeed): info
small_buckets_multinode       warning    buckets < 1e8 elements on a multi-node run (rule of thumb; DeepSpeed's
                                         default is 5e8 elements)
hpz_not_dividing              error/warn zero_hpz_partition_size must divide the data-parallel degree
                                         (groups.py asserts); not dividing GPUs per node: warning
sequence_parallel_size        error/warn the Ulysses degree (sequence_parallel_size, LLaMA-Factory's
                                         sequence_parallel block): not a whole number >= 1 (DeepSpeedConfig
                                         raises), not dividing the world (parallel_state_sp.py) or the heads
                                         (UlyssesSPAttentionHF); under the HF Trainer the key at ZeRO-3 breaks
                                         zero.Init's batch assertion, and alone it turns no Ulysses on: warning
nvme_without_path             error      ZeRO-3 NVMe offload without nvme_path (deepspeed.initialize fails)
hf_model_config               error      the file is a Hugging Face model config.json (model_type, shape keys, no
                                         DeepSpeed key): the only finding; pass it as --hf-config (DeepSpeedConfig
                                         asserts a batch size, accelerate's DeepSpeedPlugin wants zero_optimization)
============================  =========  ========================================================================

The run-level rules (zeroplanner.pitfalls): zero3_slow_network (ZeRO-3 across nodes on <= 25 Gb/s, or below
200 Gb/s at data-parallel degree 64+; DeepSpeed #2928, #5770), offload_without_pin, pinned_exceeds_host /
host_ram_short (offload above host RAM incl. the buffer factor; DeepSpeed #3448, #3481; warnings: an OOM at run
time, not a config error), zero_at_dp1 (#4953),
qlora_stage3 (#5819, peft #2016), communication_share (> 30% of the step), zero2_offload_full_weights (#1883,
#3770), nvme_offload_slow (#1130, #3000).

A rule reports "error" only where the real library fails on the config (DeepSpeed's config classes, the HF
Trainer's fill, ``deepspeed.initialize`` or the first steps on CPU ranks); tests/evidence/test_error_rules.py
finds every "error" rule in this module, zeroplanner.pitfalls and zeroplanner.deepspeed.read and shows each one
failing there. What DeepSpeed accepts and runs is a warning that says what really happens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..pitfalls import scenario_pitfalls
from ..specs import Scenario, hpz_divides
from .emit import hf_auto_values
from .keys import (
    AUTO,
    HF_TRAINER_AUTO_KEYS,
    INTEGER_KEYS,
    REMOVED_TOP_LEVEL_KEYS,
    REMOVED_ZERO_KEYS,
    TOP_LEVEL_KEYS,
    Finding,
    Mode,
    _short,
    clip_key,
)
from .read import batch_world_size, deepspeed_sequence_parallel_size, lf_sequence_parallel, ulysses_problem

if TYPE_CHECKING:
    from ..costmodel.evaluation import Evaluation

SMALL_BUCKET_ELEMENTS = 100_000_000
"""Buckets below this on a multi-node run are flagged: a rule of thumb, not a measured threshold. DeepSpeed's config
docs (deepspeed.ai/docs/config-json: reduce_bucket_size, allgather_bucket_size) give the bucket as the number of
elements reduced or all-gathered at a time, default 5e8, and a smaller one as a way to limit the memory the
collectives need; a bucket far below the default splits a step into many small collectives that each pay the
inter-node latency (docs/references.md section 6)."""

DEEPSPEED_OPTIMIZER_TYPES = frozenset({
    "adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon", "onebitadam", "zerooneadam",
    "onebitlamb",
})
"""Optimizer types DeepSpeed builds itself (deepspeed/runtime/config.py DEEPSPEED_OPTIMIZERS, plus the 1-bit
family); any other ``type`` is looked up in ``torch.optim`` and is "untested" for ZeRO."""

_MISSING = object()

_AUTO_DROPPED_BLOCKS = frozenset({"zero_optimization", "bf16", "fp16", "bfloat16"})
"""Blocks DeepSpeed reads through pydantic models (DeepSpeedConfigModel), which drop "auto" values."""


def _get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _number(value: Any) -> float | None:
    """A finite number DeepSpeed would accept after pydantic's lax int coercion; None otherwise. ``true``/``false``
    are 1/0: pydantic's lax int fields and DeepSpeed's batch arithmetic (Python's bool is an int) read them so."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    if isinstance(value, str):
        try:
            return float(int(value.strip()))
        except ValueError:
            return None
    return None


def _stage(config: dict[str, Any]) -> int:
    zero = config.get("zero_optimization")
    if isinstance(zero, bool):
        return 1 if zero else 0
    value = _get(config, "zero_optimization.stage")
    number = _number(value) if value is not _MISSING else 0
    if number is None or number not in (0, 1, 2, 3):
        return -1
    return int(number)


def _device(config: dict[str, Any], block: str) -> str:
    value = _get(config, f"zero_optimization.{block}.device")
    return value if value in ("cpu", "nvme") else "none"


def _enabled(config: dict[str, Any], name: str) -> bool:
    return _get(config, f"{name}.enabled") is True


def _walk(node: Any, prefix: str = ""):
    """Yield (dotted_key, value) for every leaf; iterative, depth-bounded by the reader's limits."""
    stack = [(prefix, node)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                stack.append((f"{path}.{k}" if path else str(k), v))
        else:
            yield path, item


def _add(out: list[Finding], severity: str, key: str, rule: str, message: str, fix: str = "") -> None:
    out.append(Finding(severity=severity, key=clip_key(key), rule=rule, message=message, fix=fix))


# ----------------------------------------------------------------------------------------------------------------
# Config-only rules
# ----------------------------------------------------------------------------------------------------------------
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_POSITIVE_KEYS = frozenset(_BATCH_KEYS) | {"zero_optimization.reduce_bucket_size",
                                            "zero_optimization.allgather_bucket_size", "fp16.loss_scale_window",
                                            "fp16.min_loss_scale", "scheduler.params.warmup_num_steps"}
"""Keys where 0 is refused too: DeepSpeed's config classes (gt=0 fields, the batch assertion) reject it, or, for
warmup_num_steps, the engine's WarmupLR (lr_schedules.py: 'must be a positive integer'); allgather_bucket_size 0
is accepted (see _NONPOSITIVE_ACCEPTED)."""
_NONPOSITIVE_ACCEPTED = {
    "steps_per_print": "DeepSpeed accepts it (a logging interval)",
    "fp16.hysteresis": "DeepSpeedConfig accepts it (fp16 loss-scaling hysteresis)",
    "fp16.initial_scale_power": "DeepSpeedConfig accepts it (the initial loss scale becomes 2**value)",
    "zero_optimization.stage3_module_granularity_threshold": "DeepSpeedConfig accepts it (no ge=0 bound)",
    "scheduler.params.total_num_steps": "DeepSpeedConfig accepts it; the schedule then decays from the first step",
    "zero_optimization.allgather_bucket_size": "DeepSpeed accepts 0 and, on a backend with all_gather_into_tensor "
    "(NCCL; gloo in current torch), never reads it, so the run works; on a backend without it, ZeRO-1/2's first "
    "step divides by it in all_gather_dp_groups (runtime/utils.py: ZeroDivisionError; DeepSpeed #8260)",
}
"""key -> what DeepSpeed does with a negative (for allgather_bucket_size: a zero) value it accepts: a warning."""


def _rule_integers(config: dict[str, Any], out: list[Finding]) -> None:
    for key in sorted(INTEGER_KEYS):
        value = _get(config, key)
        if value is _MISSING or value is None or (isinstance(value, str) and value == AUTO):
            continue
        if isinstance(value, bool):
            _add(out, "warning", key, "integer_type", f"{key} is {str(value).lower()}; DeepSpeed reads it as "
                 f"{int(value)} (pydantic's lax int fields and its batch arithmetic take true as 1, false as 0) and "
                 "runs with that value, which is rarely what was meant.",
                 f"Write an integer, e.g. \"{key.rsplit('.', 1)[-1]}\": {int(value)}.")
        elif isinstance(value, str):
            try:
                int(value.strip())
                _add(out, "warning", key, "integer_type", f"{key} is the string {value!r}; DeepSpeed's config model "
                     "happens to parse integer strings, the batch logic and the HF Trainer do not.",
                     f"Write the bare integer {int(value.strip())}.")
            except ValueError:
                number = _number_loose(value)
                fix = f"Write the integer {int(round(number))}." if number is not None else "Write an integer."
                _add(out, "error", key, "integer_type", f"{key} is the string {value!r}; DeepSpeed needs an integer "
                     "and rejects it ('unable to parse string as an integer'; LlamaFactory #5252).", fix)
        elif isinstance(value, float):
            if not math.isfinite(value):
                _add(out, "error", key, "integer_type", f"{key} is {value}, not a finite integer.", "Write an integer.")
            elif value != int(value) and key == "gradient_accumulation_steps":
                _add(out, "warning", key, "integer_type", f"{key} is {value!r}; DeepSpeed accepts it (its batch "
                     "arithmetic multiplies floats) and then steps the optimizer only when (micro_steps + 1) % "
                     f"{value!r} == 0 (engine.py is_gradient_accumulation_boundary), so accumulation is not what "
                     "the number says.", f"Write the integer {int(round(value))}.")
            elif value != int(value):
                why = {
                    "train_batch_size": "no micro-batch x accumulation x world product equals it, so "
                    "DeepSpeedConfig's batch assertion fails",
                    "train_micro_batch_size_per_gpu": "DeepSpeedConfig accepts it, then the engine's DataLoader "
                    "(deepspeed_io) raises on a batch size that is not an int",
                }.get(key, "DeepSpeed rejects it ('got a number with a fractional part'; LlamaFactory #5252)")
                _add(out, "error", key, "integer_type", f"{key} is {value!r}, a number with a fractional part; "
                     f"{why}.", f"Write the integer {int(round(value))}.")
            elif key in _BATCH_KEYS:
                _add(out, "warning", key, "integer_type", f"{key} is the float {value!r}; DeepSpeed passes it to the "
                     "DataLoader as a batch size, which needs an int.", f"Write {int(value)}.")
            else:
                _add(out, "info", key, "integer_type", f"{key} is written as the float {value!r}; DeepSpeed accepts "
                     "it only because the value has no fractional part.", f"Write {int(value)}.")
        elif not isinstance(value, int):
            _add(out, "error", key, "integer_type", f"{key} must be an integer, got {type(value).__name__}.",
                 "Write an integer.")


def _number_loose(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _rule_nonpositive(config: dict[str, Any], out: list[Finding]) -> None:
    for key in sorted(INTEGER_KEYS | _POSITIVE_KEYS):
        value = _get(config, key)
        if value is _MISSING:
            continue
        number = _number(value)
        if number is None:
            continue
        if not (number < 0 or (key in _POSITIVE_KEYS and number == 0)):
            continue
        accepted = _NONPOSITIVE_ACCEPTED.get(key)
        if accepted is not None and (number == 0 or key != "zero_optimization.allgather_bucket_size"):
            _add(out, "warning", key, "nonpositive_value", f"{key} = {value}: {accepted}.",
                 "Use a positive integer" + ("; DeepSpeed's default bucket is 500000000 elements."
                                             if "bucket" in key else "."))
            continue
        why = {
            "scheduler.params.warmup_num_steps": "DeepSpeedConfig accepts it, then the engine's WarmupLR raises "
            "'warmup_num_steps must be a positive integer' (lr_schedules.py)",
        }.get(key, "DeepSpeed's config classes reject it (ge=0 / gt=0 fields, the batch assertion)")
        _add(out, "error", key, "nonpositive_value", f"{key} = {value}: {why}.",
             "Use a positive integer" + ("; DeepSpeed's default bucket is 500000000 elements." if "bucket" in key
                                         else "."))


def _rule_batch(config: dict[str, Any], scenario: Scenario | None, mode: Mode, out: list[Finding]) -> None:
    values = {k: _number(config.get(k)) for k in _BATCH_KEYS}
    tb, mb, ga = (values[k] for k in _BATCH_KEYS)
    if all(v is None for v in values.values()):
        if not any(config.get(k) == AUTO for k in _BATCH_KEYS):
            _add(out, "error", "train_batch_size", "batch_mismatch", "neither train_batch_size nor "
                 "train_micro_batch_size_per_gpu is set; DeepSpeed asserts one of them is.",
                 "Set train_micro_batch_size_per_gpu and gradient_accumulation_steps.")
        return
    if any(v is not None and v <= 0 for v in values.values()):
        return  # nonpositive_value reports it
    world = batch_world_size(config, scenario, mode) if scenario is not None else None
    if tb is not None and mb is not None and ga is not None:
        if world is not None and tb != mb * ga * world:
            _add(out, "error", "train_batch_size", "batch_mismatch",
                 f"train_batch_size {int(tb)} != micro-batch {int(mb)} x gradient accumulation {int(ga)} x "
                 f"data-parallel degree {world} = {int(mb * ga * world)}; DeepSpeed asserts they are equal "
                 "(DeepSpeed #6914).", f"Set train_batch_size to {int(mb * ga * world)} or leave it out.")
        elif world is None and tb % (mb * ga):
            _add(out, "error", "train_batch_size", "batch_mismatch",
                 f"train_batch_size {int(tb)} is not a multiple of micro-batch x gradient accumulation "
                 f"{int(mb * ga)}, so no world size satisfies DeepSpeed's assertion (DeepSpeed #6914).",
                 "Leave train_batch_size out; DeepSpeed computes it.")
    elif tb is not None and world is not None:
        per = (mb if mb is not None else 1) * (ga if ga is not None else 1) * world
        if mb is not None or ga is not None:
            if tb % per:
                _add(out, "error", "train_batch_size", "batch_mismatch",
                     f"train_batch_size {int(tb)} is not divisible by {int(per)} (the given per-GPU factor x "
                     f"data-parallel degree {world}); DeepSpeed rounds down and then fails its assertion "
                     "(DeepSpeed #6914).", "Give train_micro_batch_size_per_gpu and gradient_accumulation_steps "
                     "and leave train_batch_size out.")
        elif tb % world:
            _add(out, "error", "train_batch_size", "batch_mismatch",
                 f"train_batch_size {int(tb)} is not divisible by the data-parallel degree {world} "
                 "(DeepSpeed #6914).", f"Use a multiple of {world}.")


def _rule_sequence_parallel(config: dict[str, Any], scenario: Scenario | None, mode: Mode,
                            out: list[Finding]) -> None:
    """The Ulysses degree a config gives (DeepSpeed's ``sequence_parallel_size``, LLaMA-Factory's
    ``sequence_parallel`` block): can DeepSpeed run it on this cluster and model?"""
    key = "sequence_parallel_size"
    degrees: list[tuple[str, int]] = []
    if key in config:
        raw = config[key]
        value = deepspeed_sequence_parallel_size(raw)
        if value is None:
            number = _number(raw)
            if number is not None and number >= 1:
                why = (f"DeepSpeedConfig computes a fractional world size (world / {raw}) and DeepSpeed's Ulysses "
                       "groups refuse a fractional degree (parallel_state_sp.py initialize_sequence_parallel: "
                       "RuntimeError, not divisible)")
            elif number is not None:
                why = ("DeepSpeedConfig divides the world size by it (runtime/config.py, no mpu): 0 raises "
                       "ZeroDivisionError, a negative degree fails the batch assertion")
            else:
                why = ("DeepSpeedConfig divides the world size by it (runtime/config.py, no mpu) and raises "
                       "TypeError on a string, null or a container")
            _add(out, "error", key, "sequence_parallel_size", f"sequence_parallel_size {_short(raw)} is not a whole "
                 f"number >= 1: {why}.", "Write the Ulysses degree as an integer (1: no sequence parallelism).")
        else:
            degrees.append((key, value))
            if mode == "hf_trainer" and value > 1:
                if _stage(config) == 3:
                    _add(out, "error", key, "sequence_parallel_size", f"sequence_parallel_size {value} in a ZeRO-3 "
                         "config under the HF Trainer: from_pretrained builds the model in deepspeed.zero.Init with "
                         "this config and no mpu (transformers modeling_utils.py; partition_parameters.py "
                         "DeepSpeedConfig(config, mpu)), whose batch assertion divides the world by "
                         f"{value} while the Trainer filled train_batch_size over all processes "
                         "(trainer_config_process).", "Leave sequence_parallel_size out of the JSON and set "
                         f"ParallelismConfig(sp_backend=\"deepspeed\", sp_size={value}) (zeroplanner config "
                         "--hf-trainer --accelerate writes it).")
                _add(out, "warning", key, "sequence_parallel_size", "under the HF Trainer / accelerate this key "
                     "turns no Ulysses on: accelerate sets Ulysses up from ParallelismConfig(sp_backend="
                     f"\"deepspeed\", sp_size={value}) (accelerator.py _prepare_deepspeed) and hands DeepSpeed "
                     "its mpu, which DeepSpeedConfig prefers to this key.", "Set sp_size in TrainingArguments("
                     "parallelism_config=...) or the accelerate YAML's parallelism_config block, and leave the "
                     "key out.")
    block = config.get("sequence_parallel")
    lf = lf_sequence_parallel(block)
    if lf is not None:
        degrees.append(("sequence_parallel", lf[0]))
    if scenario is None:
        return
    for where, degree in degrees[:1]:  # the priced one: DeepSpeed's key when valid, else the block's
        problem = ulysses_problem(scenario, degree)
        if problem is not None:
            _add(out, "error", where, "sequence_parallel_size", f"{problem}: DeepSpeed's Ulysses setup raises "
                 "(world: parallel_state_sp.py initialize_sequence_parallel, LLaMA-Factory's "
                 "create_ulysses_sp_group; heads: ulysses_sp.py UlyssesSPAttentionHF.__init__).",
                 "Use a degree that divides the GPU count and the attention heads (and divides or is a multiple of "
                 "the key/value heads).")


def _rule_precision(config: dict[str, Any], out: list[Finding]) -> None:
    bf16 = _enabled(config, "bf16") or _enabled(config, "bfloat16")
    if bf16 and _enabled(config, "fp16"):
        _add(out, "error", "fp16.enabled", "fp16_and_bf16", "fp16 and bf16 are both enabled; DeepSpeed asserts "
             "'bfloat16 and fp16 modes cannot be simultaneously enabled'.",
             "Keep one: bf16 on Ampere or newer, fp16 (with loss scaling) on V100/T4.")


def _rule_offload_stage(config: dict[str, Any], out: list[Finding]) -> None:
    stage = _stage(config)
    if stage < 0:
        return
    if _device(config, "offload_param") != "none" and stage != 3:
        _add(out, "warning", "zero_optimization.offload_param", "offload_param_below_stage3",
             f"offload_param is read only by ZeRO-3; at stage {stage} DeepSpeed accepts the block, ignores it and "
             "the parameters stay on the GPU (docs/references.md section 7): size GPU memory without it.",
             "Use stage 3, or remove offload_param.")
    if _device(config, "offload_optimizer") != "none" and stage == 0:
        _add(out, "warning", "zero_optimization.offload_optimizer", "offload_optimizer_stage0",
             "offload_optimizer works through the ZeRO optimizer (stages 1-3); at stage 0 DeepSpeed accepts the "
             "block and ignores it: the optimizer states stay on the GPU.",
             "Use stage 1, 2 or 3, or remove offload_optimizer.")
    if _device(config, "offload_optimizer") == "nvme" and stage in (1, 2):
        _add(out, "warning", "zero_optimization.offload_optimizer.device", "nvme_optimizer_below_stage3",
             f"At stage {stage} DeepSpeed treats any offload_optimizer device as CPU offload "
             "(stage_1_and_2.py: cpu_offload = device != none): optimizer states go to host RAM, not NVMe.",
             "Use stage 3 for NVMe (ZeRO-Infinity), or write device 'cpu' and size host RAM for it.")
    for block in ("offload_optimizer", "offload_param"):
        if _device(config, block) == "nvme" and stage == 3:  # below stage 3 no NVMe swapper is built
            path = _get(config, f"zero_optimization.{block}.nvme_path")
            if path is _MISSING or path is None:
                what = ("deepspeed.initialize asserts '\"nvme_path\" ... cannot be None' when ZeRO-3 partitions "
                        "the parameters (partition_parameters.py, _validate_remote_device)" if block == "offload_param"
                        else "deepspeed.initialize fails building the swap folder (stage3.py "
                        "_configure_tensor_swapping: os.path.join(None, ...) raises TypeError)")
                _add(out, "error", f"zero_optimization.{block}.nvme_path", "nvme_without_path",
                     f"{block} offloads to NVMe but names no nvme_path; {what}.",
                     "Set nvme_path to a directory on a local NVMe drive.")
            elif not isinstance(path, str):
                _add(out, "error", f"zero_optimization.{block}.nvme_path", "nvme_without_path",
                     f"nvme_path {path!r} is not a path; DeepSpeed's offload config class rejects it "
                     "(offload_config.py: nvme_path is a Path).", "Set nvme_path to a directory on a local NVMe "
                     "drive.")


ACCELERATE_PLUGIN_AUTO_KEYS = (
    "gradient_accumulation_steps", "gradient_clipping", "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
)
"""Keys accelerate's ``DeepSpeedPlugin`` fills from its own options when they are "auto" (accelerate
utils/dataclasses.py ``__post_init__``: ``plugin_to_config_mapping``)."""


def _rule_auto(config: dict[str, Any], mode: Mode, scenario: Scenario | None, out: list[Finding]) -> None:
    filled = hf_auto_values(scenario) if scenario is not None else {}
    stage = _stage(config)
    resolved: list[str] = []
    for key, value in sorted(_walk(config)):
        if not (isinstance(value, str) and value == AUTO):
            continue
        if mode == "hf_trainer":
            stage3_key = key in ("zero_optimization.stage3_prefetch_bucket_size",
                                 "zero_optimization.stage3_param_persistence_threshold")
            if key in HF_TRAINER_AUTO_KEYS and not (stage3_key and stage != 3):
                resolved.append(f"{key}={filled[key]}" if key in filled else key)
            elif stage3_key:
                # below stage 3 the Trainer leaves them; accelerate's _prepare_deepspeed fills every hidden-size
                # key still "auto" (judged on the engine: accepted), and DeepSpeed ignores them below stage 3
                resolved.append(f"{key} (accelerate's hidden-size fill; unused below stage 3)")
            elif key in ACCELERATE_PLUGIN_AUTO_KEYS:
                resolved.append(f"{key} (accelerate's DeepSpeedPlugin, from its own options)")
            else:
                fix = ("Write true or false instead of \"auto\"" if key.endswith(".enabled")
                       else "Write the value instead of \"auto\"")
                _add(out, "error", key, "auto_not_filled", f"the HF Trainer and accelerate fill \"auto\" only in "
                     f"the keys they know, and {key} is not one: accelerate stops training with ValueError: "
                     f"`{key}` not found in kwargs (utils/dataclasses.py DeepSpeedPlugin.fill_match, run by "
                     "Accelerator._prepare_deepspeed).", fix + ".")
            continue
        top = key.split(".", 1)[0]
        severity = "error"
        if key in _BATCH_KEYS:
            effect = "DeepSpeedConfig's batch-size arithmetic fails on the string (TypeError)"
        elif top in _AUTO_DROPPED_BLOCKS:
            severity = "warning"
            effect = ("DeepSpeed's config model drops it (DeepSpeedConfigModel skips \"auto\" values, "
                      "runtime/config_utils.py) and runs with its default instead of the value you expect")
        elif top == "gradient_clipping":
            effect = "the string reaches the engine, whose first step compares it with 0.0 (engine.py " \
                "_take_model_step: TypeError)"
        elif top == "scheduler":
            effect = "the string reaches the scheduler's constructor in deepspeed.initialize, which raises " \
                "(lr_schedules.py)"
        else:
            effect = "the string is passed on (to the optimizer, e.g. as its learning rate) and fails"
        _add(out, severity, key, "auto_outside_hf", f"{key} is \"auto\", which only the HF Trainer/accelerate "
             f"resolve; with raw DeepSpeed, {effect} (docs/references.md section 7).",
             "Write the value (zeroplanner config writes them all), or, if you launch through the HF Trainer or "
             "accelerate, check with --hf-trainer.")
    if resolved:
        _add(out, "info", "", "auto_outside_hf", f"The HF Trainer fills {len(resolved)} 'auto' fields "
             f"(transformers integrations/deepspeed.py): {', '.join(resolved)}; the training-step counts come from "
             "the dataset at train time.")


def _rule_removed(config: dict[str, Any], out: list[Finding]) -> None:
    for key in config:
        if key in REMOVED_TOP_LEVEL_KEYS:
            _add(out, "error", key, "removed_key", f"DeepSpeed 0.19.8 removed {key!r} and raises "
                 "DeepSpeedConfigError (deepspeed/runtime/config.py, _REMOVED_TOP_LEVEL_CONFIG_KEYS).",
                 "Remove the block.")
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        for key in zero:
            if key in REMOVED_ZERO_KEYS:
                _add(out, "error", f"zero_optimization.{key}", "removed_key", f"DeepSpeed 0.19.8 removed {key!r} "
                     "and raises on it.", "Remove it.")


def _rule_optimizer(config: dict[str, Any], mode: Mode, out: list[Finding]) -> None:
    params = _get(config, "optimizer.params")
    if isinstance(params, dict) and "max_grad_norm" in params:
        _add(out, "error", "optimizer.params.max_grad_norm", "max_grad_norm_param", "DeepSpeed raises ValueError on "
             "max_grad_norm as an optimizer parameter (engine.py, _configure_basic_optimizer).",
             "Move it to the top-level \"gradient_clipping\".")
    kind = _get(config, "optimizer.type")
    name = kind.lower() if isinstance(kind, str) else None
    stage = _stage(config)
    if name is not None and name not in DEEPSPEED_OPTIMIZER_TYPES and stage >= 1 \
            and config.get("zero_allow_untested_optimizer") is not True:
        _add(out, "error", "zero_allow_untested_optimizer", "untested_optimizer", f"optimizer {kind!r} is not a "
             "DeepSpeed optimizer (torch.optim is used); with ZeRO DeepSpeed asserts unless "
             "zero_allow_untested_optimizer is true (engine.py, _do_optimizer_sanity_check).",
             "Add \"zero_allow_untested_optimizer\": true.")
    legacy = _get(config, "zero_optimization.cpu_offload") is True  # the pre-0.3.x spelling of offload to cpu
    if (_device(config, "offload_optimizer") == "none" and not legacy) or "optimizer" in config:
        # An optimizer block: DeepSpeed builds it itself (DeepSpeedCPUAdam for Adam/AdamW/Adagrad/Lion under
        # offload, torch.optim otherwise) and the client-optimizer check below never runs (engine.py,
        # _configure_optimizer: the check sits in the client-optimizer branch only).
        return
    force = config.get("zero_force_ds_cpu_optimizer") is not False
    if mode == "hf_trainer":
        what = ("accelerate replaces the Trainer's torch optimizer by DeepSpeedCPUAdam (DeepSpeedCPUAdagrad for "
                "Adagrad; Accelerator._prepare_deepspeed, map_pytorch_optim_to_deepspeed), so the run starts"
                if force else "zero_force_ds_cpu_optimizer is false, so accelerate hands the Trainer's torch "
                "optimizer to DeepSpeed as is and its step runs on the CPU in torch (slow)")
        _add(out, "info", "optimizer", "offload_client_optimizer", "ZeRO-Offload without an optimizer block under "
             f"the HF Trainer: {what}.")
        return
    if force:
        _add(out, "error", "zero_force_ds_cpu_optimizer", "offload_client_optimizer", "ZeRO-Offload with a "
             "client-built optimizer (no optimizer block) under deepspeed.initialize, at any stage: if the script "
             "passes a torch optimizer, DeepSpeed raises "
             "ZeRORuntimeException unless that optimizer is DeepSpeedCPUAdam/DeepSpeedCPULion or "
             "zero_force_ds_cpu_optimizer is false (engine.py, _configure_optimizer). Under the HF Trainer or "
             "accelerate the same file runs (accelerate swaps in DeepSpeedCPUAdam): check with --hf-trainer.",
             "Add \"optimizer\": {\"type\": \"AdamW\"} (DeepSpeed builds DeepSpeedCPUAdam), pass "
             "deepspeed.ops.adam.DeepSpeedCPUAdam as the optimizer, or set \"zero_force_ds_cpu_optimizer\": false.")


# ----------------------------------------------------------------------------------------------------------------
# Rules that need the scenario (cluster) and possibly the cost model
# ----------------------------------------------------------------------------------------------------------------
def _rule_cluster(config: dict[str, Any], scenario: Scenario, out: list[Finding]) -> None:
    cluster = scenario.cluster
    stage = _stage(config)
    if cluster.nodes > 1 and stage >= 1:
        keys = ["reduce_bucket_size"] + (["allgather_bucket_size"] if stage in (1, 2) else [])
        for name in keys:
            number = _number(_get(config, f"zero_optimization.{name}"))
            if number is not None and 0 < number < SMALL_BUCKET_ELEMENTS:
                _add(out, "warning", f"zero_optimization.{name}", "small_buckets_multinode",
                     f"{name} = {int(number)} elements on a {cluster.nodes}-node run: many small collectives, each "
                     "paying the inter-node latency (a rule of thumb: DeepSpeed's default is 5e8 elements; a larger "
                     "bucket uses more GPU memory and sends fewer, larger collectives).",
                     f"Use at least 200000000 for {name}.")
    hpz = _number(_get(config, "zero_optimization.zero_hpz_partition_size"))
    if hpz is not None and hpz > 1 and stage == 3:
        world = cluster.data_parallel_degree
        size = min(int(hpz), world)
        if not hpz_divides(int(hpz), world):
            _add(out, "error", "zero_optimization.zero_hpz_partition_size", "hpz_not_dividing",
                 f"zero_hpz_partition_size {int(hpz)} does not divide the data-parallel degree {world}; DeepSpeed "
                 "asserts it does when it builds the secondary-partition groups (utils/groups.py, "
                 "_create_zero_param_parallel_group: _ensure_divisibility).",
                 f"Use {cluster.gpus_per_node} (GPUs per node) or one of its divisors.")
        elif cluster.gpus_per_node % size:
            _add(out, "warning", "zero_optimization.zero_hpz_partition_size", "hpz_not_dividing",
                 f"zero_hpz_partition_size {int(hpz)} does not divide the {cluster.gpus_per_node} GPUs per node: "
                 "DeepSpeed accepts it, but some secondary-partition groups (consecutive ranks) span two nodes, "
                 "so ZeRO++'s parameter all-gathers cross the network it is meant to avoid.",
                 f"Use {cluster.gpus_per_node} (GPUs per node) or one of its divisors.")


def _scenario_values(scenario: Scenario) -> Evaluation | None:
    """The cost model's numbers for the scenario's one candidate (what ``estimate`` computes its warnings from);
    None if the cost model cannot price it."""
    from ..costmodel.context import Candidates, make_context
    from ..costmodel.evaluate import evaluate

    try:
        values = evaluate(make_context(scenario), Candidates.from_scenario(scenario))
    except (ValueError, ArithmeticError):
        return None
    return values.at(0)


def _rule_pitfalls(scenario: Scenario, mode: Mode, out: list[Finding]) -> None:
    """The run-level rules shared with ``zeroplanner estimate`` (:func:`zeroplanner.pitfalls.scenario_pitfalls`)."""
    values = _scenario_values(scenario)
    if values is None:
        _add(out, "info", "", "costmodel_unavailable", "cost-model rules (communication share, host RAM) skipped: "
             "the cost model cannot price this scenario.")
    for p in scenario_pitfalls(scenario, values, client=mode):
        message = p.message[:1].upper() + p.message[1:] + "."
        _add(out, p.severity, p.key, p.rule, message, p.fix)


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def order_findings(findings: Iterable[Finding]) -> list[Finding]:
    """``findings`` as they are shown and returned everywhere (``check``'s text and JSON, ``config``, the app's
    list, :func:`lint`): each statement once, errors first, then warnings, then infos, otherwise in the order
    given. A statement is (key, message); said at two severities it is kept once, at the more severe one (with
    that one's fix and rule), in the place where it was first said.

    >>> a = Finding(severity="info", key="", message="m")
    >>> b = Finding(severity="error", key="k", message="e")
    >>> [f.severity for f in order_findings([a, b, a])]
    ['error', 'info']
    """
    kept: dict[tuple[str, str], Finding] = {}
    for f in findings:
        said = (f.key, f.message)
        if said not in kept or _SEVERITY_ORDER[f.severity] < _SEVERITY_ORDER[kept[said].severity]:
            kept[said] = f
    return sorted(kept.values(), key=lambda f: _SEVERITY_ORDER[f.severity])  # stable: first-said order kept


_HF_MODEL_MARKERS = ("model_type", "architectures", "transformers_version")
"""Top-level keys every Hugging Face ``config.json`` carries (``PretrainedConfig.to_dict``) and no DeepSpeed config
does."""
_HF_SHAPE_KEYS = frozenset({"num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size",
                            "intermediate_size", "n_layer", "n_embd", "n_head", "max_position_embeddings"})


def hf_model_config_finding(config: Any, path: str = "config.json") -> Finding | None:
    """One error finding when ``config`` is a Hugging Face *model* ``config.json`` (it has ``model_type``,
    ``architectures`` or ``transformers_version`` and model shape keys such as ``num_hidden_layers``, and none of
    DeepSpeed's top-level keys, :data:`~zeroplanner.deepspeed.keys.TOP_LEVEL_KEYS`) rather than a DeepSpeed config;
    None otherwise. DeepSpeed refuses such a file (no batch size: ``DeepSpeedConfig`` asserts that
    train_batch_size or train_micro_batch_size_per_gpu is given), and each of its keys would otherwise be one more
    "unknown key" warning. ``path``: the file's path, for the command lines of the fix."""
    if not isinstance(config, dict) or any(k in TOP_LEVEL_KEYS for k in config):
        return None
    markers = [k for k in _HF_MODEL_MARKERS if k in config]
    shape = sorted(k for k in config if k in _HF_SHAPE_KEYS)
    if not markers or not shape:
        return None
    said = ", ".join(markers + shape[:2])
    import shlex

    quoted = shlex.quote(path)
    return Finding(severity="error", key="", rule="hf_model_config",
                   message=f"this is a Hugging Face model config.json (it has {said}), not a DeepSpeed config: it "
                   "describes the model, not how DeepSpeed trains it, and DeepSpeed refuses it (no batch size).",
                   fix=f"Pass it as --hf-config: `zeroplanner check ds_config.json --hf-config {quoted}` checks a "
                   f"DeepSpeed config for this model, `zeroplanner config --hf-config {quoted} -o ds_config.json` "
                   "writes one.")


def lint(config: Any, scenario: Scenario | None = None, mode: Mode = "deepspeed",
         merge: Iterable[Finding] = ()) -> list[Finding]:
    """Findings for a DeepSpeed config ``dict`` (as read by :func:`zeroplanner.deepspeed.load_config_text`).

    ``scenario``: the run the config is for (cluster, model); needed by the cluster and cost-model rules, usually
    the scenario :func:`zeroplanner.deepspeed.from_deepspeed_config` built from this config. ``mode``:
    ``"hf_trainer"`` when the config goes through the HF Trainer/accelerate (then ``"auto"`` is fine where the
    Trainer fills it). ``merge``: findings said about the same config elsewhere (the reader's and
    ``from_deepspeed_config``'s), listed with these. Never raises on malformed content; a non-dict ``config`` gives
    one error finding, a Hugging Face model config.json one error finding (:func:`hf_model_config_finding`) and
    nothing else. Findings come through :func:`order_findings`: each once, errors first, then warnings, then info.
    """
    out: list[Finding] = []
    if not isinstance(config, dict):
        return order_findings([Finding(severity="error", key="", rule="wrong_type",
                                       message=f"a DeepSpeed config is a JSON object, got {type(config).__name__}",
                                       fix="Pass the parsed JSON object."), *merge])
    not_deepspeed = hf_model_config_finding(config)
    if not_deepspeed is not None:
        return [not_deepspeed]
    _rule_removed(config, out)
    _rule_integers(config, out)
    _rule_nonpositive(config, out)
    _rule_batch(config, scenario, mode, out)
    _rule_sequence_parallel(config, scenario, mode, out)
    _rule_precision(config, out)
    _rule_offload_stage(config, out)
    _rule_auto(config, mode, scenario, out)
    if mode == "hf_trainer" and "zero_optimization" not in config:
        _add(out, "error", "zero_optimization", "no_zero_block_hf", "no zero_optimization block: under the HF "
             "Trainer accelerate's DeepSpeedPlugin raises ValueError: Please specify the ZeRO optimization config in "
             "the DeepSpeed config. (accelerate utils/dataclasses.py DeepSpeedPlugin.__post_init__).",
             "Add \"zero_optimization\": {\"stage\": 0} (or the stage you want).")
    _rule_optimizer(config, mode, out)
    if scenario is not None:
        _rule_cluster(config, scenario, out)
        _rule_pitfalls(scenario, mode, out)
    return order_findings([*out, *merge])
