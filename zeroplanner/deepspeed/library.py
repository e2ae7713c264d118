"""Hand a user's DeepSpeed config to the installed libraries' own validation, the way the client that runs it does.

:func:`library_findings` is what ``zeroplanner check`` adds when DeepSpeed (and, for ``--hf-trainer``, transformers)
is installed; without them it returns ``None`` and the hand-written key tables of :mod:`zeroplanner.deepspeed` and
the rules of :mod:`zeroplanner.deepspeed.lint` are all there is (the tests keep both in agreement on the shipped configs).

* ``mode="hf_trainer"``: the Trainer's fill first -- transformers' ``HfTrainerDeepSpeedConfig``
  (``integrations/deepspeed.py``) with ``trainer_config_process`` and ``trainer_config_finalize``, given a
  TrainingArguments stand-in built from the scenario and a model stand-in carrying only ``config.hidden_size`` (no
  model is built). Where the config has a concrete value the stand-in uses it (the user's TrainingArguments are
  assumed to agree), so only the config's own inconsistencies become mismatches, e.g. a concrete
  ``train_batch_size`` that is not micro x accumulation x world.
* then DeepSpeed's ``DeepSpeedConfig`` (``deepspeed/runtime/config.py``: every pydantic sub-config with
  ``extra="forbid"``, removed keys, the batch assertion, precision checks) on the (filled) dict, with the world
  size ``deepspeed.initialize`` gives it (the ranks of :func:`zeroplanner.deepspeed.batch_world_size`: over the
  tensor-parallel degree, or all ranks when AutoTP comes from the config; with Ulysses and no
  ``sequence_parallel_size`` key, divided by the degree as the Ulysses mpu does). Under the HF Trainer with Ulysses,
  accelerate's batch rewrite (micro x accumulation x world / sp) and mpu are applied first, and at ZeRO-3 with a
  ``sequence_parallel_size`` key zero.Init's own DeepSpeedConfig (no mpu) is built too. ``DeepSpeedConfig`` takes its world size from
  ``deepspeed.comm`` (its ``mpu`` argument is only consulted after ``dist.get_rank()`` succeeds, i.e. after a
  distributed init), so while it runs the ``dist`` name inside ``deepspeed.runtime.config`` is replaced by a stand-in
  answering rank 0 and that world size; nothing else is patched and the name is restored afterwards.

Errors are reported in zeroplanner's words as :class:`~zeroplanner.deepspeed.Finding` objects (rule
``deepspeed_rejects`` or ``hf_fill_mismatch``), each naming the library class that raised. DeepSpeed stops at the
first failing block, so at most one ``deepspeed_rejects`` finding comes back. Engine-level checks (optimizer
construction) are not run: they need a model and a process group; an engine refusal that needs neither (an
unsupported optimizer type) is checked with the engine's rule (:func:`_engine_checks`; ZeRO-Offload with a client
optimizer is lint.py's rule). With ``mode="hf_trainer"`` accelerate's ``DeepSpeedPlugin`` then sees the filled config
(:func:`_accelerate_fill`), as the Trainer's path does.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import types
from typing import Any, Iterator

from ..specs import Scenario
from .keys import AUTO, Finding, Mode, clip_key
from .read import batch_world_size

_MODEL_BLOCKS = {
    "DeepSpeedZeroConfig": "zero_optimization",
    "DeepSpeedBF16Config": "bf16",
    "DeepSpeedFP16Config": "fp16",
    "TPTrainingConfig": "tensor_parallel",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
    "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
}
"""pydantic model title (as in DeepSpeed's ValidationError) -> the config block it validates."""


def _not_accelerator_detection(record: logging.LogRecord) -> bool:
    """Drops DeepSpeed's "Setting accelerator to CPU ..." warning (deepspeed/accelerator/real_accelerator.py
    get_accelerator, logged when no GPU is found at import): config validation uses no accelerator, so on a laptop
    the line would only alarm the user."""
    return not str(record.msg).startswith("Setting accelerator to CPU")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed's logger writes to stdout (its StreamHandler takes sys.stdout when deepspeed is imported); the
    command line's stdout is JSON, so imports and validation run with stdout pointed at stderr, which is also where
    that handler then stays. The accelerator-detection warning is filtered out meanwhile (the ``DeepSpeed`` logger,
    deepspeed/utils/logging.py, is the one get_accelerator logs to; filters survive its creation at import)."""
    ds_logger = logging.getLogger("DeepSpeed")
    ds_logger.addFilter(_not_accelerator_detection)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        ds_logger.removeFilter(_not_accelerator_detection)


def library_versions() -> dict[str, str] | None:
    """Versions of the libraries :func:`library_findings` uses, or None when DeepSpeed is not installed."""
    with _quiet():
        try:
            import deepspeed
        except ImportError:
            return None
        out = {"deepspeed": deepspeed.__version__}
        try:
            import transformers

            out["transformers"] = transformers.__version__
        except ImportError:
            pass
    return out


@contextlib.contextmanager
def _deepspeed_world(world_size: int) -> Iterator[None]:
    """DeepSpeedConfig sees rank 0 of ``world_size`` ranks (see the module docstring)."""
    from deepspeed.runtime import config as ds_config

    real = ds_config.dist
    ds_config.dist = types.SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, **k: world_size)
    try:
        yield
    finally:
        ds_config.dist = real


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _get(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _training_arguments(config: dict[str, Any], scenario: Scenario) -> tuple[Any, dict[str, Any]]:
    """A TrainingArguments stand-in (the attributes HfTrainerDeepSpeedConfig reads) and what it assumed."""
    import dataclasses

    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    t = scenario.training
    assumed: dict[str, Any] = {}

    def pick(name: str, dotted: str, default: Any) -> Any:
        value = _get(config, dotted)
        if _number(value) is not None:
            assumed[name] = value
            return value
        return default

    args = types.SimpleNamespace(
        world_size=batch_world_size(config, scenario, "hf_trainer"),
        per_device_train_batch_size=t.micro_batch,
        gradient_accumulation_steps=t.grad_accum,
        max_grad_norm=pick("max_grad_norm", "gradient_clipping", defaults["max_grad_norm"]),
        learning_rate=pick("learning_rate", "optimizer.params.lr", defaults["learning_rate"]),
        adam_epsilon=pick("adam_epsilon", "optimizer.params.eps", defaults["adam_epsilon"]),
        weight_decay=pick("weight_decay", "optimizer.params.weight_decay", defaults["weight_decay"]),
        adam_beta1=defaults["adam_beta1"], adam_beta2=defaults["adam_beta2"],
        save_on_each_node=False, fp16_full_eval=False, bf16_full_eval=False,
        bf16=t.precision == "bf16", fp16=t.precision == "fp16",
    )
    betas = _get(config, "optimizer.params.betas")
    if isinstance(betas, list) and len(betas) == 2 and all(_number(b) is not None for b in betas):
        args.adam_beta1, args.adam_beta2 = betas
        assumed["adam_beta1, adam_beta2"] = betas
    warmup = _get(config, "scheduler.params.warmup_num_steps")
    steps = int(warmup) if _number(warmup) is not None else 0
    args.get_warmup_steps = lambda n: steps
    return args, assumed


def _fill_failed(exc: Exception) -> Finding:
    return Finding(severity="error", key="", rule="hf_fill_mismatch",
                   message=f"the HF Trainer's fill (HfTrainerDeepSpeedConfig) fails: "
                   f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}", fix="")


def _hf_fill(config: dict[str, Any], scenario: Scenario, out: list[Finding]) -> dict[str, Any] | None:
    from transformers.integrations.deepspeed import (
        HfTrainerDeepSpeedConfig,
        unset_hf_deepspeed_config,
    )

    args, _ = _training_arguments(config, scenario)
    total = _get(config, "scheduler.params.total_num_steps")
    num_training_steps = int(total) if _number(total) is not None and total >= 1 else 1000
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=scenario.model.hidden_size))
    hf = None
    try:  # the constructor already reads the config (HfDeepSpeedConfig: zero_optimization.get(...))
        hf = HfTrainerDeepSpeedConfig(copy.deepcopy(config))
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, num_training_steps=num_training_steps)
    except ValueError as exc:
        mismatches = getattr(hf, "mismatches", []) or []
        if not mismatches:  # raised before the consistency check (e.g. by the constructor)
            out.append(_fill_failed(exc))
        for line in mismatches:
            out.append(Finding(
                severity="error", key=clip_key(line.split("=", 1)[0].replace("- ds ", "").strip()),
                rule="hf_fill_mismatch",
                message=f"the HF Trainer's fill (transformers HfTrainerDeepSpeedConfig.trainer_config_finalize) "
                f"raises: the config's value does not match what the Trainer computes ({line.strip('- ')}).",
                fix="Write \"auto\" there, or the value the Trainer computes."))
        return None
    except (TypeError, KeyError, AttributeError) as exc:
        out.append(_fill_failed(exc))
        return None
    finally:
        unset_hf_deepspeed_config()
    return hf.config


def _validation_findings(exc: Any) -> list[Finding]:
    title = getattr(exc, "title", "")
    block = _MODEL_BLOCKS.get(title, "")
    out = []
    for err in exc.errors()[:20]:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        key = ".".join(p for p in (block, loc) if p)
        kind = err.get("type", "")
        what = "has no such key (extra keys are forbidden)" if kind == "extra_forbidden" else err.get("msg", "")
        out.append(Finding(severity="error", key=clip_key(key), rule="deepspeed_rejects",
                           message=f"DeepSpeed's own config class {title or 'DeepSpeedConfig'} rejects {key or 'it'}: "
                           f"{what} (got {str(err.get('input'))[:60]!r}).",
                           fix="Remove the key or fix its value."))
    return out


def library_findings(config: dict[str, Any], scenario: Scenario, mode: Mode = "deepspeed") -> list[Finding] | None:
    """Findings from the installed libraries' own validation of ``config`` (see the module docstring), or ``None``
    when DeepSpeed (or, with ``mode="hf_trainer"``, transformers) is not installed. ``scenario`` supplies the world
    size (:func:`zeroplanner.deepspeed.batch_world_size`), hidden size and training values, usually the one
    :func:`zeroplanner.deepspeed.from_deepspeed_config` read from this config. Nothing is written to stdout."""
    with _quiet():
        return _library_findings(config, scenario, mode)


def _library_findings(config: dict[str, Any], scenario: Scenario, mode: Mode) -> list[Finding] | None:
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        return None
    if mode == "hf_trainer":
        try:
            import transformers.integrations.deepspeed  # noqa: F401
        except ImportError:
            return None
    out: list[Finding] = []
    filled: dict[str, Any] | None = copy.deepcopy(config)
    sp = scenario.cluster.sequence_parallel_size
    ranks = batch_world_size(config, scenario, "hf_trainer")  # what dist.get_world_size() answers
    world = ranks if "sequence_parallel_size" in config or sp <= 1 else ranks // sp
    if mode == "hf_trainer":
        filled = _hf_fill(config, scenario, out)
        if filled is None:
            return out
        if not _accelerate_fill(filled, out):
            return out
        if "sequence_parallel_size" in filled and _get(filled, "zero_optimization.stage") == 3:
            _zero_init_check(filled, ranks, out)
        world = ranks
        if sp > 1:
            filled = _accelerate_ulysses(filled, ranks // sp)
            world = ranks // sp
    with _deepspeed_world(world):
        ds = None
        try:
            ds = DeepSpeedConfig(filled)
        except Exception as exc:  # DeepSpeed raises pydantic, assertion, value, type and its own errors
            if hasattr(exc, "errors") and hasattr(exc, "title"):
                out += _validation_findings(exc)
            else:
                first = str(exc).splitlines()[0][:300] if str(exc) else ""
                where = "after the HF Trainer's fill, " if mode == "hf_trainer" else ""
                hint = ""
                if any(v == AUTO for v in _leaves(filled)):
                    hint = " The config still has \"auto\" values, which only the HF Trainer/accelerate fill."
                out.append(Finding(severity="error", key="", rule="deepspeed_rejects",
                                   message=f"{where}DeepSpeed's own DeepSpeedConfig raises {type(exc).__name__}: "
                                   f"{first}.{hint}", fix=""))
    if ds is not None:
        _engine_checks(ds, out)
    return out


def _engine_checks(ds: Any, out: list[Finding]) -> None:
    """A refusal of ``deepspeed.initialize`` that ``DeepSpeedConfig`` does not raise, with the engine's own rule and
    message (runtime/engine.py ``_do_sanity_check``, DeepSpeed 0.19.8), checked on the constructed config ``ds``: an
    optimizer ``type`` that is neither in ``DEEPSPEED_OPTIMIZERS`` (after DeepSpeedConfig's lowercasing) nor a
    ``torch.optim`` class name ("<type> is not a supported DeepSpeed Optimizer"; 1-bit Adam/LAMB were removed
    from DeepSpeed). ZeRO-Offload with a client optimizer, the other such refusal, is the key tables' rule
    (lint.py ``offload_client_optimizer``)."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS

    name = ds.optimizer_name
    if name is not None and name not in DEEPSPEED_OPTIMIZERS and getattr(torch.optim, name, None) is None:
        cased = next((n for n in dir(torch.optim) if n.lower() == str(name).lower()), None)
        out.append(Finding(severity="error", key="optimizer.type", rule="deepspeed_rejects",
                           message=f"deepspeed.initialize asserts: {name} is not a supported DeepSpeed Optimizer "
                           f"(runtime/engine.py _do_sanity_check; DeepSpeed's optimizers: "
                           f"{', '.join(DEEPSPEED_OPTIMIZERS)}, or a torch.optim class name, case-sensitive).",
                           fix=f"Write \"{cased}\" (torch.optim's spelling)." if cased
                           else "Use a supported optimizer type, e.g. AdamW."))


def _accelerate_fill(filled: dict[str, Any], out: list[Finding]) -> bool:
    """What accelerate does next with the Trainer's filled config: its ``DeepSpeedPlugin`` (utils/dataclasses.py)
    refuses a config without a ``zero_optimization`` block and fills the keys it maps from its own options
    (``gradient_accumulation_steps``, ``gradient_clipping``, the offload devices,
    ``stage3_gather_16bit_weights_on_model_save``, ...), then ``Accelerator._prepare_deepspeed`` runs
    ``deepspeed_config_process(must_match=False, ...)``, where every value still "auto" stops training with
    ``ValueError: `<key>` not found in kwargs`` (``fill_match``), e.g. a legacy ``bfloat16.enabled`` or
    ``zero_optimization.sub_group_size`` set to "auto". accelerate's own class is run on a copy; the kwargs of
    ``_prepare_deepspeed`` (batch, precision, hidden-size buckets, optimizer and scheduler values) are those the
    Trainer's fill has already written, so none are passed. Returns False (and appends the finding) when it raises;
    True without accelerate."""
    try:
        from accelerate.utils.dataclasses import DeepSpeedPlugin
    except ImportError:
        return True
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    try:
        plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(filled))
        plugin.deepspeed_config_process(must_match=False)
    except (ValueError, NotImplementedError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        key = first.split("`")[1] if first.count("`") >= 2 else ("zero_optimization" if "ZeRO" in first else "")
        if "not found in kwargs" in first:
            fix = "Write the value instead of \"auto\": the Trainer and accelerate fill only the keys they know."
        elif key == "zero_optimization":
            fix = "Add \"zero_optimization\": {\"stage\": 0} (or the stage you want)."
        else:
            fix = ""
        out.append(Finding(severity="error", key=clip_key(key), rule="hf_fill_mismatch",
                           message=f"after the HF Trainer's fill, accelerate's DeepSpeedPlugin raises "
                           f"{type(exc).__name__}: {first[:300]}", fix=fix))
        return False
    finally:
        unset_hf_deepspeed_config()
    return True


def _zero_init_check(filled: dict[str, Any], ranks: int, out: list[Finding]) -> None:
    """At ZeRO-3 the HF Trainer's ``from_pretrained`` builds the model inside ``deepspeed.zero.Init`` with the filled
    config and no mpu (transformers modeling_utils.py ``deepspeed.zero.Init(config_dict_or_path=deepspeed_config())``;
    partition_parameters.py ``DeepSpeedConfig(config_dict_or_path, mpu)``): DeepSpeedConfig on all ``ranks``."""
    from deepspeed.runtime.config import DeepSpeedConfig

    with _deepspeed_world(ranks):
        try:
            DeepSpeedConfig(copy.deepcopy(filled))
        except Exception as exc:  # the batch assertion (AssertionError) and whatever else DeepSpeed raises
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            out.append(Finding(severity="error", key="sequence_parallel_size", rule="deepspeed_rejects",
                               message="after the HF Trainer's fill, the DeepSpeedConfig that ZeRO-3's zero.Init "
                               f"builds in from_pretrained (no mpu) raises {type(exc).__name__}: {first}.", fix=""))


def _accelerate_ulysses(filled: dict[str, Any], data_parallel_size: int) -> dict[str, Any]:
    """What accelerate does to the filled config before ``deepspeed.initialize`` when ``ParallelismConfig`` has
    ``sp_backend="deepspeed"`` and ``sp_size > 1`` (accelerator.py ``_prepare_deepspeed``): ``train_batch_size`` =
    micro x accumulation x ``data_parallel_size``; it then passes the Ulysses mpu, so DeepSpeedConfig ignores a
    ``sequence_parallel_size`` key (runtime/config.py: the mpu branch comes first)."""
    out = copy.deepcopy(filled)
    micro, accum = _number(out.get("train_micro_batch_size_per_gpu")), _number(out.get("gradient_accumulation_steps"))
    if micro is not None and accum is not None:
        out["train_batch_size"] = int(micro) * int(accum) * int(data_parallel_size)
    out.pop("sequence_parallel_size", None)
    return out


def _leaves(node: Any) -> Iterator[Any]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        else:
            yield item
