"""A user's DeepSpeed config -> ``(Scenario, findings)`` so the cost model can price it
(:func:`from_deepspeed_config`), and the safe reader it uses (:func:`load_config_text`: size limit
:data:`~.keys.MAX_CONFIG_BYTES`, nesting limit :data:`~.keys.MAX_DEPTH`, read the way the client reads it --
DeepSpeed's hjson or accelerate's ``json.load`` -- never eval, never YAML tags). Unknown keys, ``"auto"`` values and
values that had to be reinterpreted are reported as :class:`~.keys.Finding` objects, never dropped silently."""

from __future__ import annotations

import json
import math
from typing import Any

from ..costmodel.context import attention_tp_share
from ..files import nesting_over
from ..costmodel.ulysses import check_ulysses
from ..specs import OffloadSpec, Scenario, TrainingSpec, ZeroSpec, hpz_divides
from .emit import hf_auto_values
from .keys import (
    _AUTO_RULES,
    _STAGE3_ONLY,
    _ZERO_BOOL_FIELDS,
    _ZERO_INT_FIELDS,
    AUTO,
    BF16_KEYS,
    FP16_KEYS,
    FRAMEWORK_TOP_LEVEL_KEYS,
    MAX_CONFIG_BYTES,
    MAX_DEPTH,
    OFFLOAD_OPTIMIZER_KEYS,
    OFFLOAD_PARAM_KEYS,
    REMOVED_TOP_LEVEL_KEYS,
    REMOVED_ZERO_KEYS,
    TOP_LEVEL_KEYS,
    ZERO_KEYS,
    ConfigError,
    Finding,
    Mode,
    Severity,
    _path,
    _short,
    clip_key,
)


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
    if nesting_over(text, MAX_DEPTH):
        raise ConfigError(f"config nests deeper than {MAX_DEPTH} levels")
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
        self.batch_world = batch_world_size({}, base, "hf_trainer" if hf else "deepspeed")
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

    def set_parallel(self, config: dict[str, Any], tp: int, sp: int) -> None:
        """Price with tensor-parallel degree ``tp`` and Ulysses degree ``sp`` from here on; DeepSpeed's batch
        arithmetic (and the Trainer's train_batch_size fill) runs over :func:`batch_world_size` ranks."""
        cluster = self.base.cluster.model_copy(update={"tensor_parallel_size": tp, "sequence_parallel_size": sp})
        self.base = self.base.model_copy(update={"cluster": cluster})
        self.batch_world = batch_world_size(config, self.base, "hf_trainer" if self.hf else "deepspeed")
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
    both cases, with an info finding each; :func:`zeroplanner.deepspeed.lint.lint` says whether ``"auto"`` is allowed).

    Read: batch keys (DeepSpeed's rules for whichever two or three are given, world size = the base's data-parallel
    degree), precision (bf16/bfloat16/fp16 blocks), optimizer type, activation checkpointing (present -> the base's
    mode, or "full" if the base has none; absent -> the base's, since HF models checkpoint outside the config), and
    every modelled ``zero_optimization`` key incl. the ``stage3_*`` aliases, offload blocks and ZeRO++ keys, and
    ``tensor_parallel.autotp_size`` (the cluster's tensor-parallel degree: ZeRO and the batch arithmetic run over
    world / autotp_size), and the Ulysses degree from DeepSpeed's ``sequence_parallel_size`` or LLaMA-Factory's
    ``sequence_parallel`` block (the cluster's ``sequence_parallel_size``; the block's sequence tiling sets
    ``tiled_mlp`` and ``tiled_loss``; the batch arithmetic runs over :func:`batch_world_size`). A degree the world
    size or the model's heads cannot take is priced as the base's (lint reports the error).

    Returns ``(scenario, findings)``. Findings: unknown keys (error inside DeepSpeed's strict blocks, warning at the
    top level, which DeepSpeed ignores), ``"auto"`` resolutions, and values that had to be reinterpreted for pricing
    (e.g. ``"5e8"`` priced as 500000000; offload_param below stage 3 priced without it, as DeepSpeed ignores it).
    Whether the config is *good* is :func:`zeroplanner.deepspeed.lint.lint`'s job.

    Raises :class:`ConfigError` for text that cannot be read (see :func:`load_config_text`) or a non-object.
    Round trip: ``from_deepspeed_config(to_deepspeed_config(s), base=s)[0] == s`` (with the precision the GPU runs,
    :func:`zeroplanner.specs.hardware_precision`: bf16 on a V100 reads back as the fp16 the config carries).
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
        from ..scenarios import default_scenario

        base = default_scenario()
    r = _Reader(base, hf=(mode == "hf_trainer"), stage=_peek_stage(config))
    r.findings.extend(findings)
    tp = _read_tensor_parallel(r, config)
    if tp != base.cluster.tensor_parallel_size:
        r.set_parallel(config, tp, base.cluster.sequence_parallel_size)
    sp, tiling = _read_sequence_parallel(r, config)
    r.set_parallel(config, tp, sp)

    for key in config:
        if not isinstance(key, str):
            r.note("warning", str(key), "a top-level key that is not a string: DeepSpeed reads the top level "
                   "with dict.get by name, so it is ignored (a JSON file cannot produce one).", "", "unknown_key")
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

    tiled = {"tiled_mlp": True, "tiled_loss": True} if tiling else {}
    try:
        training = TrainingSpec.model_validate({
            **bt.model_dump(), "precision": precision, "optimizer": optimizer, "micro_batch": micro,
            "grad_accum": accum, "checkpointing": checkpointing, **tiled,
        })
    except ValueError as exc:  # e.g. QLoRA in the base and fp32 in the config
        r.note("info", "", f"training settings from the config do not fit the scenario "
               f"({str(exc).splitlines()[-1][:200]}); priced with the scenario's.", "", "unpriced")
        training = bt
    zero = ZeroSpec.model_validate(zero_fields)
    cluster = {**base.cluster.model_dump(), "tensor_parallel_size": tp, "sequence_parallel_size": sp}
    dp = base.cluster.world_size // tp
    hpz = zero.zero_hpz_partition_size
    if zero.stage == 3 and not hpz_divides(hpz, dp):
        # DeepSpeed refuses it (lint's hpz_not_dividing error says so); the rest of the config is priced without hpZ
        r.note("info", "zero_optimization.zero_hpz_partition_size", f"zero_hpz_partition_size {hpz} does not divide "
               f"the data-parallel degree {dp}, which DeepSpeed refuses: priced without hpZ.", "", "unpriced")
        zero = zero.model_copy(update={"zero_hpz_partition_size": 1})
    scenario = Scenario.model_validate({**base.model_dump(), "cluster": cluster, "training": training.model_dump(),
                                        "zero": zero.model_dump()})
    return scenario, r.findings


def config_autotp_size(config: Any) -> int:
    """``tensor_parallel.autotp_size`` as DeepSpeed's engine reads it (1 when absent, 0, or unreadable)."""
    block = config.get("tensor_parallel") if isinstance(config, dict) else None
    raw = block.get("autotp_size") if isinstance(block, dict) else None
    value = None if isinstance(raw, bool) else _as_count(raw)
    return value if value is not None and value > 1 else 1


def batch_world_size(config: Any, scenario: Scenario, mode: Mode = "deepspeed") -> int:
    """The world size of the batch rule ``train_batch_size == micro * accumulation * world`` for this config and
    client.

    Ranks first: ``dist.get_world_size()`` -- all ranks -- when the tensor parallelism comes from the config's
    ``tensor_parallel.autotp_size`` (``deepspeed.initialize`` builds DeepSpeedConfig with no mpu,
    deepspeed/__init__.py), else the ranks over tensor parallelism (a Megatron mpu reports its data-parallel size).
    Then Ulysses (``scenario.cluster.sequence_parallel_size`` = sp > 1):

    * ``mode="deepspeed"``: ranks / sp. DeepSpeedConfig (runtime/config.py ``__init__``) divides the world size by the
      config's ``sequence_parallel_size`` when there is no mpu, and by the Ulysses mpu's
      ``get_sequence_parallel_world_size()`` when there is one (``UlyssesSPAttentionHF.register_with_transformers``
      returns it; it has no ``get_data_parallel_world_size``).
    * ``mode="hf_trainer"``: ranks. The Trainer checks a concrete ``train_batch_size`` against
      ``args.world_size`` (all processes) x micro x accumulation (transformers integrations/deepspeed.py
      ``trainer_config_process``); accelerate then replaces it by micro x accumulation x
      ``ParallelismConfig.data_parallel_size`` before ``deepspeed.initialize`` (accelerator.py
      ``_prepare_deepspeed``), which :func:`zeroplanner.deepspeed.to_accelerate_config` sets to ranks / sp.

    The HF Trainer's ``train_batch_size`` fill uses ``args.world_size``, all processes, too."""
    c = scenario.cluster
    ranks = c.world_size if config_autotp_size(config) > 1 else c.world_size // c.tensor_parallel_size
    if mode == "deepspeed" and c.sequence_parallel_size > 1:
        return ranks // c.sequence_parallel_size
    return ranks


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
    if c.gpus_per_node % tp:
        r.note("error", "tensor_parallel.autotp_size", f"autotp_size {tp}: it does not divide the "
               f"{c.gpus_per_node} GPUs per node (AutoTP groups sit inside a node). Priced with tensor-parallel "
               f"degree {base_tp}.", "Use a divisor of the GPUs per node.", "tensor_parallel_size")
        return base_tp
    if m.kv_heads % tp:
        share = attention_tp_share(m.kv_heads, tp)
        r.note("warning", "tensor_parallel.autotp_size", f"autotp_size {tp} does not divide the model's "
               f"{m.kv_heads} key/value heads: AutoTP shards them unevenly (module_inject/tp_shard.py "
               f"get_shard_size), so the largest rank holds {share:.0%} of each attention layer instead of "
               f"{1 / tp:.0%}; priced for that rank.", "A divisor of the KV heads balances the ranks.",
               "autotp_uneven_heads")
    if tp > 1:
        r.note("info", "tensor_parallel.autotp_size", f"AutoTP degree {tp} read (DeepSpeed engine.py autotp_size): "
               f"priced with tensor-parallel degree {tp}, so ZeRO shards over the data-parallel degree "
               f"{c.world_size} / {tp} = {c.world_size // tp}.", "", "tensor_parallel")
    return tp


LF_SEQUENCE_PARALLEL_KEYS = frozenset({"enabled", "size", "mode", "ulysses", "tiling", "memory_optimizations"})
"""Keys of LLaMA-Factory's ``sequence_parallel`` block, as its ``ALSTConfig.to_deepspeed_config`` writes them
(hiyouga/LLaMA-Factory ``src/llamafactory/model/model_utils/alst_config.py``): ``enabled``, ``size`` (its
``sequence_parallel_size``), ``mode`` (always ``"ulysses"``), ``ulysses`` (``degree``, default ``size`` and capped
at it; ``seq_length_is_variable``), ``tiling`` (``enabled``, ``chunk_size``: its ``alst_sequence_tiling``, "sequence
tiling optimization for memory efficiency in long sequences") and ``memory_optimizations``."""


def deepspeed_sequence_parallel_size(raw: Any) -> int | None:
    """DeepSpeed's top-level ``sequence_parallel_size`` as a Ulysses degree: an integer-valued number >= 1 (``true``
    is 1) -> ``int``; ``None`` for anything else. DeepSpeedConfig (runtime/config.py, no mpu) computes its world size
    as ``dist.get_world_size() / sequence_parallel_size``; measured on DeepSpeed 0.19.8 with 8 ranks: ``"4"``,
    ``null`` or a list raise TypeError, ``0`` ZeroDivisionError, ``-2`` the batch assertion, and ``2.5`` gives a
    fractional world that DeepSpeed's Ulysses groups refuse (parallel_state_sp.py initialize_sequence_parallel:
    RuntimeError, 'not divisible')."""
    if isinstance(raw, bool):
        return int(raw)
    if isinstance(raw, (int, float)) and math.isfinite(raw) and raw >= 1 and raw == int(raw) and raw < 10**9:
        return int(raw)
    return None


def lf_sequence_parallel(block: Any) -> tuple[int, bool] | None:
    """LLaMA-Factory's ``sequence_parallel`` block -> ``(Ulysses degree, sequence tiling on)`` when it turns Ulysses
    on, else ``None``. It does when ``enabled`` is true, ``mode`` is ``"ulysses"`` (or absent) and the degree
    (``ulysses.degree``, else ``size``; capped at ``size`` as ``ALSTConfig._validate_config`` does) is an integer
    > 1; tiling is ``tiling.enabled is true`` (alst_config.py; :data:`LF_SEQUENCE_PARALLEL_KEYS`)."""
    if not isinstance(block, dict) or block.get("enabled") is not True or block.get("mode", "ulysses") != "ulysses":
        return None
    size = deepspeed_sequence_parallel_size(block.get("size"))
    ulysses = block.get("ulysses") if isinstance(block.get("ulysses"), dict) else {}
    degree = deepspeed_sequence_parallel_size(ulysses.get("degree")) if "degree" in ulysses else size
    if degree is None:
        return None
    if size is not None and degree > size:
        degree = size
    if degree <= 1:
        return None
    tiling = block.get("tiling") if isinstance(block.get("tiling"), dict) else {}
    return degree, tiling.get("enabled") is True


def ulysses_problem(scenario: Scenario, sp_size: int) -> str | None:
    """Why DeepSpeed's Ulysses cannot run ``sp_size`` on this cluster and model, or ``None``: the world size must be
    a multiple of it (parallel_state_sp.py ``initialize_sequence_parallel`` raises RuntimeError; with a
    tensor-parallel degree the cluster needs a multiple of tp x sp, :class:`zeroplanner.specs.ClusterSpec`), and
    the heads must divide (``UlyssesSPAttentionHF.__init__`` raises ValueError;
    :func:`zeroplanner.costmodel.ulysses.check_ulysses`)."""
    c, m = scenario.cluster, scenario.model
    if sp_size <= 1:
        return None
    tp = c.tensor_parallel_size
    if c.world_size % (tp * sp_size):
        return (f"Ulysses degree {sp_size} does not divide the world size {c.world_size} ({c.nodes} x "
                f"{c.gpus_per_node} GPUs" + (f", with tensor-parallel degree {tp}: {c.world_size} / {tp} = "
                                             f"{c.world_size // tp} ranks" if tp > 1 else "") + ")")
    try:
        check_ulysses(n_heads=m.n_heads, kv_heads=m.kv_heads, sp_size=sp_size, linear_mixer=m.linear_mixer)
    except ValueError as exc:
        return f"Ulysses degree {sp_size} does not fit {m.name}'s heads ({exc})"
    return None


def _read_sequence_parallel(r: _Reader, config: dict[str, Any]) -> tuple[int, bool | None]:
    """The Ulysses degree to price and whether ALST's sequence tiling is on (``None``: the config does not say).

    Two sources: DeepSpeed's ``sequence_parallel_size`` (:func:`deepspeed_sequence_parallel_size`; DeepSpeed reads it
    only for its batch arithmetic, the sequence is split where the script registers Ulysses,
    ``UlyssesSPAttentionHF.register_with_transformers``, or under HF/accelerate ``ParallelismConfig(sp_size=...)``)
    and LLaMA-Factory's ``sequence_parallel`` block (:func:`lf_sequence_parallel`; sequence tiling there is priced as
    tiled MLP and tiled loss, ALST's sequence tiling, arXiv 2506.13996 Sec. 3.2). When both give a degree the
    DeepSpeed key is priced (a warning says they disagree). A degree the cluster or model cannot run
    (:func:`ulysses_problem`; lint reports the error) is priced as the base's degree."""
    base_sp = r.base.cluster.sequence_parallel_size
    sp: int | None = None
    source = ""
    tiling: bool | None = None
    if "sequence_parallel" in config:
        block = config["sequence_parallel"]
        if not isinstance(block, dict):
            r.note("info", "sequence_parallel", f"{_short(block)} is not an object (LLaMA-Factory writes "
                   "{\"enabled\": true, \"size\": N, ...}); DeepSpeed does not read the key. Not priced.", "",
                   "sequence_parallel")
        else:
            for k in block:
                if k not in LF_SEQUENCE_PARALLEL_KEYS:
                    r.note("info", f"sequence_parallel.{k}", "LLaMA-Factory's sequence_parallel block has no such "
                           "key (alst_config.py ALSTConfig.to_deepspeed_config); not priced.", "", "sequence_parallel")
            lf = lf_sequence_parallel(block)
            if lf is None:
                r.note("info", "sequence_parallel", "LLaMA-Factory's sequence_parallel block (DeepSpeed does not "
                       "read it) turns no Ulysses on here: it needs \"enabled\": true, mode \"ulysses\" and a degree "
                       f"> 1 (alst_config.py). Priced with sequence-parallel degree {base_sp}.", "",
                       "sequence_parallel")
            else:
                sp, tiling = lf
                source = "sequence_parallel"
                extra = ""
                mem = block.get("memory_optimizations")
                if isinstance(mem, dict) and mem.get("enabled") is True:
                    extra = (" memory_optimizations (LLaMA-Factory's PyTorch memory profiling switch) is not "
                             "priced.")
                r.note("info", "sequence_parallel", f"LLaMA-Factory's sequence_parallel block (DeepSpeed does not "
                       f"read it; LLaMA-Factory sets up Ulysses from it, alst_config.py): Ulysses degree {sp}"
                       + (", sequence tiling on: priced with tiled MLP and tiled loss (ALST sequence tiling, arXiv "
                          "2506.13996 Sec. 3.2)" if tiling else "") + "." + extra, "", "sequence_parallel")
    if "sequence_parallel_size" in config:
        raw = config["sequence_parallel_size"]
        value = deepspeed_sequence_parallel_size(raw)
        if value is None:
            r.note("info", "sequence_parallel_size", f"sequence_parallel_size {_short(raw)} is not a whole degree "
                   f">= 1; priced with sequence-parallel degree {sp or base_sp}.", "", "sequence_parallel")
        else:
            if sp is not None and value != sp:
                r.note("warning", "sequence_parallel_size", f"sequence_parallel_size {value} and the "
                       f"sequence_parallel block's Ulysses degree {sp} disagree: DeepSpeed's batch arithmetic divides "
                       f"the world by {value} (runtime/config.py), LLaMA-Factory builds its Ulysses groups from the "
                       f"block. Priced with {value}.", "Make them equal.", "sequence_parallel_mismatch")
            if not isinstance(raw, int) or isinstance(raw, bool):
                r.note("info", "sequence_parallel_size", f"{_short(raw)} priced as the integer {value}.", "",
                       "coerced")
            sp, source = value, "sequence_parallel_size"
    if sp is None:
        return base_sp, tiling
    if sp == 1:
        return 1, tiling
    problem = ulysses_problem(r.base, sp)
    if problem is not None:
        r.note("info", source, f"{problem}; priced with sequence-parallel degree {base_sp}.", "",
               "sequence_parallel")
        return base_sp, None
    c = r.base.cluster
    ranks = c.world_size if config_autotp_size(config) > 1 else c.world_size // c.tensor_parallel_size
    r.note("info", source, f"Ulysses sequence-parallel degree {sp} read: priced with each sequence split over {sp} "
           f"GPUs; DeepSpeed's batch arithmetic runs over {ranks} / {sp} = {ranks // sp} ranks (runtime/config.py: "
           "world size / sequence_parallel_size, or the Ulysses mpu's).", "", "sequence_parallel")
    return sp, tiling


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
    if isinstance(stage_raw, bool):
        # pydantic's lax enum validation reads true/false as ZeroStageEnum 1/0 (deepspeed/runtime/zero/config.py
        # stage: ZeroStageEnum) and DeepSpeed runs it
        r.note("warning", "zero_optimization.stage", f"stage is {str(stage_raw).lower()}; DeepSpeed reads it as "
               f"stage {int(stage_raw)}. Priced as stage {int(stage_raw)}.", f"Write {int(stage_raw)}.", "integer_type")
        stage_raw = int(stage_raw)
    stage = _as_count(stage_raw)
    if stage is None or stage > 3:
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
