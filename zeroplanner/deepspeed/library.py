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
import sys
import types
from typing import Any, Iterator

from ..specs import Scenario
from . import hf_fill
from .hf_fill import _get, _number
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
    """Versions of the libraries :func:`library_findings` uses, or None when DeepSpeed is not installed. DeepSpeed's
    is its ``__version__`` (imported: the validation needs it anyway); transformers' is the installed distribution's
    (``importlib.metadata``, which is what ``transformers.__version__`` reports), so asking does not import
    transformers in a process whose fill ran in :class:`~zeroplanner.deepspeed.hf_fill.FillChild`."""
    import importlib.metadata

    with _quiet():
        try:
            import deepspeed
        except ImportError:
            return None
        out = {"deepspeed": deepspeed.__version__}
        try:
            out["transformers"] = importlib.metadata.version("transformers")
        except importlib.metadata.PackageNotFoundError:
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


def fill_shape(config: dict[str, Any], scenario: Scenario) -> hf_fill.Shape:
    """What the HF Trainer's ``TrainingArguments`` and model would say for ``scenario`` (:data:`hf_fill.Shape`)."""
    t = scenario.training
    return {"world_size": batch_world_size(config, scenario, "hf_trainer"), "micro_batch": t.micro_batch,
            "grad_accum": t.grad_accum, "precision": t.precision, "hidden_size": scenario.model.hidden_size}


def _as_finding(d: dict[str, str]) -> Finding:
    return Finding(**{**d, "key": clip_key(d["key"])})


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


def library_findings(config: dict[str, Any], scenario: Scenario, mode: Mode = "deepspeed",
                     child: hf_fill.FillChild | None = None) -> list[Finding] | None:
    """Findings from the installed libraries' own validation of ``config`` (see the module docstring), or ``None``
    when DeepSpeed (or, with ``mode="hf_trainer"``, transformers) is not installed. ``scenario`` supplies the world
    size (:func:`zeroplanner.deepspeed.batch_world_size`), hidden size and training values, usually the one
    :func:`zeroplanner.deepspeed.from_deepspeed_config` read from this config. With ``mode="hf_trainer"`` and a
    started :class:`~zeroplanner.deepspeed.hf_fill.FillChild`, the Trainer's and accelerate's fill run in that
    child (the same code, :func:`~zeroplanner.deepspeed.hf_fill.fill`), in this process when it cannot answer.
    Nothing is written to stdout."""
    with _quiet():
        return _library_findings(config, scenario, mode, child)


def _library_findings(config: dict[str, Any], scenario: Scenario, mode: Mode,
                      child: hf_fill.FillChild | None) -> list[Finding] | None:
    if mode == "hf_trainer" and not hf_fill.available():
        if child is not None:
            child.close()
        return None
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        if child is not None:
            child.close()
        return None
    out: list[Finding] = []
    filled: dict[str, Any] | None = copy.deepcopy(config)
    sp = scenario.cluster.sequence_parallel_size
    ranks = batch_world_size(config, scenario, "hf_trainer")  # what dist.get_world_size() answers
    world = ranks if "sequence_parallel_size" in config or sp <= 1 else ranks // sp
    if mode == "hf_trainer":
        shape = fill_shape(config, scenario)
        answer = child.fill(config, shape) if child is not None else None
        filled, found = answer if answer is not None else hf_fill.fill(config, shape)
        out += [_as_finding(d) for d in found]
        if filled is None:
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
