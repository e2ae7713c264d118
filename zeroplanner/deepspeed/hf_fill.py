"""The HF Trainer's and accelerate's fill of a DeepSpeed config, on plain values: usable in this process or in a child.

This module is the ``--hf-trainer`` half of :mod:`zeroplanner.deepspeed.library`: transformers'
``HfTrainerDeepSpeedConfig`` (``integrations/deepspeed.py``: ``trainer_config_process`` then
``trainer_config_finalize``) with a TrainingArguments stand-in, then accelerate's ``DeepSpeedPlugin``
(``utils/dataclasses.py``) with ``deepspeed_config_process(must_match=False)``. It imports nothing from zeroplanner
and only the standard library at module level, so ``zeroplanner check --hf-trainer`` can run it as a child process
(:class:`FillChild`, ``python hf_fill.py``) that loads transformers and accelerate while the command itself loads
DeepSpeed and prices the scenario: on a 2-core machine the two imports (about 2 s each, both dominated by torch)
then overlap instead of adding up. In this process or in the child it is the same code on the same inputs, so
the findings are the same (tests/core/test_dslibrary.py compares both on the shipped configs).

The inputs are a :data:`Shape`: the values the Trainer would have from its ``TrainingArguments`` and the model
(``world_size``: all processes, :func:`zeroplanner.deepspeed.batch_world_size` with ``"hf_trainer"``;
``micro_batch``, ``grad_accum``, ``precision`` "bf16" / "fp16" / "fp32"; ``hidden_size`` of the model's config).
Findings are plain dicts with ``severity``, ``key``, ``rule``, ``message``, ``fix`` (the caller makes them
:class:`~zeroplanner.deepspeed.Finding` objects and clips keys).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

Shape = dict[str, Any]
"""``{"world_size": int, "micro_batch": int, "grad_accum": int, "precision": str, "hidden_size": int}``."""

CHILD_TIMEOUT_SECONDS = 120.0
"""How long ``check`` waits for the child before filling in its own process instead (importing transformers and
accelerate takes about 2 s on the 2-core machine this was measured on; a cold disk can take much longer)."""


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


def _finding(key: str, rule: str, message: str, fix: str = "") -> dict[str, str]:
    return {"severity": "error", "key": key, "rule": rule, "message": message, "fix": fix}


def training_arguments(config: dict[str, Any], shape: Shape) -> tuple[Any, dict[str, Any]]:
    """A TrainingArguments stand-in (the attributes HfTrainerDeepSpeedConfig reads) and what it assumed. Where the
    config has a concrete value the stand-in uses it (the user's TrainingArguments are assumed to agree); the rest
    are ``shape``'s values and TrainingArguments' own field defaults."""
    import dataclasses

    from transformers import TrainingArguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    assumed: dict[str, Any] = {}

    def pick(name: str, dotted: str, default: Any) -> Any:
        value = _get(config, dotted)
        if _number(value) is not None:
            assumed[name] = value
            return value
        return default

    args = types.SimpleNamespace(
        world_size=int(shape["world_size"]),
        per_device_train_batch_size=int(shape["micro_batch"]),
        gradient_accumulation_steps=int(shape["grad_accum"]),
        max_grad_norm=pick("max_grad_norm", "gradient_clipping", defaults["max_grad_norm"]),
        learning_rate=pick("learning_rate", "optimizer.params.lr", defaults["learning_rate"]),
        adam_epsilon=pick("adam_epsilon", "optimizer.params.eps", defaults["adam_epsilon"]),
        weight_decay=pick("weight_decay", "optimizer.params.weight_decay", defaults["weight_decay"]),
        adam_beta1=defaults["adam_beta1"], adam_beta2=defaults["adam_beta2"],
        save_on_each_node=False, fp16_full_eval=False, bf16_full_eval=False,
        bf16=shape["precision"] == "bf16", fp16=shape["precision"] == "fp16",
    )
    betas = _get(config, "optimizer.params.betas")
    if isinstance(betas, list) and len(betas) == 2 and all(_number(b) is not None for b in betas):
        args.adam_beta1, args.adam_beta2 = betas
        assumed["adam_beta1, adam_beta2"] = betas
    warmup = _get(config, "scheduler.params.warmup_num_steps")
    steps = int(warmup) if _number(warmup) is not None else 0
    args.get_warmup_steps = lambda n: steps
    return args, assumed


def _fill_failed(exc: Exception) -> dict[str, str]:
    return _finding("", "hf_fill_mismatch", f"the HF Trainer's fill (HfTrainerDeepSpeedConfig) fails: "
                    f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")


def trainer_fill(config: dict[str, Any], shape: Shape, out: list[dict]) -> dict[str, Any] | None:
    """The config after the HF Trainer's fill, or None (with the refusal appended to ``out``) when it raises."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args, _ = training_arguments(config, shape)
    total = _get(config, "scheduler.params.total_num_steps")
    num_training_steps = int(total) if _number(total) is not None and total >= 1 else 1000
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=int(shape["hidden_size"])))
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
            out.append(_finding(
                line.split("=", 1)[0].replace("- ds ", "").strip(), "hf_fill_mismatch",
                f"the HF Trainer's fill (transformers HfTrainerDeepSpeedConfig.trainer_config_finalize) raises: the "
                f"config's value does not match what the Trainer computes ({line.strip('- ')}).",
                "Write \"auto\" there, or the value the Trainer computes."))
        return None
    except (TypeError, KeyError, AttributeError) as exc:
        out.append(_fill_failed(exc))
        return None
    finally:
        unset_hf_deepspeed_config()
    return hf.config


def accelerate_fill(filled: dict[str, Any], out: list[dict]) -> bool:
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
        out.append(_finding(key, "hf_fill_mismatch", f"after the HF Trainer's fill, accelerate's DeepSpeedPlugin "
                            f"raises {type(exc).__name__}: {first[:300]}", fix))
        return False
    finally:
        unset_hf_deepspeed_config()
    return True


def fill(config: dict[str, Any], shape: Shape) -> tuple[dict[str, Any] | None, list[dict]]:
    """The Trainer's fill, then accelerate's: ``(filled config, [])``, or ``(None, findings)`` at the first refusal."""
    out: list[dict] = []
    filled = trainer_fill(config, shape, out)
    if filled is None or not accelerate_fill(filled, out):
        return None, out
    return filled, out


def available() -> bool:
    """Whether transformers is installed (found without importing it)."""
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


# ---------------------------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------------------------
class FillChild:
    """A child process (``python hf_fill.py``) that imports transformers and accelerate as soon as it starts, then
    answers one :func:`fill` request; :meth:`fill` returns None when the child cannot answer (it failed to start,
    exited, timed out, or wrote no result), and the caller fills in its own process instead. Start it as early as
    possible; :meth:`close` (or the context manager) stops a child that was never asked."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        try:
            self._proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError:
            self._proc = None

    def fill(self, config: dict[str, Any], shape: Shape,
             timeout_seconds: float = CHILD_TIMEOUT_SECONDS) -> tuple[dict[str, Any] | None, list[dict]] | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            stdout, _ = proc.communicate(json.dumps({"config": config, "shape": shape}).encode(), timeout_seconds)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            proc.kill()
            proc.wait()
            return None
        try:
            answer = json.loads(stdout)
            return answer["filled"], answer["findings"]
        except (ValueError, KeyError, TypeError):
            return None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def __enter__(self) -> FillChild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child_main() -> int:
    """Import the libraries (their output goes to stderr: stdout carries only the answer), read one request
    ``{"config": ..., "shape": ...}`` from stdin, write ``{"filled": ..., "findings": [...]}`` to stdout."""
    real_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            import accelerate.utils.dataclasses  # noqa: F401
        except ImportError:
            pass
        import transformers.integrations.deepspeed  # noqa: F401

        request = json.loads(sys.stdin.buffer.read())
        filled, findings = fill(request["config"], request["shape"])
    real_stdout.write(json.dumps({"filled": filled, "findings": findings}))
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    # run as a file: its own folder (zeroplanner/deepspeed, whose modules are not top-level names) leaves sys.path
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    status = _child_main()
    sys.stderr.flush()
    # the answer is written and flushed and the child holds no other file: skip the interpreter's teardown of
    # torch (about 0.4 s measured here, which the waiting command would otherwise add to its own time)
    os._exit(status)
