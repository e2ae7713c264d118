"""Any architecture ``transformers`` knows: build it from its config on the meta device and measure it.

Used by :func:`zeroplanner.catalog.hfconfig.architecture_from_hf_config` for a ``model_type`` the built-in readers do not
count, when the ``hf`` extra (transformers, accelerate) is installed. This is what ``accelerate estimate-memory``
does (``accelerate/commands/estimate.py``: ``init_empty_weights`` + ``AutoModel.from_config``): no weights are
allocated and nothing is downloaded. Only classes that ship inside transformers are used: ``auto_map`` is dropped
and ``trust_remote_code`` is False, so a config.json can never make this run code of its own.

Exact: the parameter count (tied weights once), the largest module (DeepSpeed's ``model_to_params`` definition:
the most parameters one module owns directly), tied embeddings, the vision tower's parameters.
Approximate: activations and FLOPs, which use the text config's hidden size, layers, heads, KV heads, head_dim,
intermediate size and vocabulary as if the layers were Llama's (the answer's ``source`` says so).
torch and transformers are imported inside the function only (the core never imports them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..specs import Architecture

_DROPPED_KEYS = ("model_type", "auto_map", "quantization_config", "_name_or_path", "transformers_version")
"""Keys not passed to the config class: auto_map names remote code; quantization_config would ask for a quantised
build (the count is of logical parameters, trained in the TrainingSpec precision)."""

_VISION_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder", "multi_modal_projector",
                 "embed_vision", "image_newline", "mm_projector")
"""Sub-module names of the vision tower and its projector in transformers' vision-language classes."""


_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "depth", "n_layers")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""Config attribute names of the layer count and of the routed experts per layer across transformers' classes."""

_SIZE_KEYS: dict[str, int] = {
    **dict.fromkeys(_LAYER_KEYS, 1000),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "n_embed"), 1_000_000),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "moe_intermediate_size"), 10_000_000),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "num_kv_heads"), 10_000),
    **dict.fromkeys(_EXPERT_KEYS, 10_000),
    "vocab_size": 10_000_000, "head_dim": 100_000,
}
"""Config attributes that set how many modules and parameters the meta-device build creates, with the largest
value accepted: the ranges :class:`~zeroplanner.specs.Architecture` accepts for the same quantities (n_layers
<= 1000, hidden_size <= 1e6, ffn_size <= 1e7, heads and experts <= 10,000, vocab_size <= 1e7, head_dim <= 1e5).
Checked before the build: transformers builds whatever it is given, and a config.json with 5,000,000 layers held
7.5 GB and was still building after 180 s."""

MAX_LAYER_EXPERT_MODULES = 200_000
"""Largest layers x experts the meta build may create (each routed expert of a non-fused MoE is its own modules):
DeepSeek-V3's 61 x 256 = 15,616 and Qwen3-235B-A22B's 94 x 128 = 12,032 are well inside."""


def check_build_size(cfg: Any) -> None:
    """Refuse a transformers config whose size attributes (:data:`_SIZE_KEYS`, in the text config and any
    ``vision_config`` / ``audio_config``) are not integers in range, or whose layers x experts exceed
    :data:`MAX_LAYER_EXPERT_MODULES`, before anything is built. Raises ``ValueError`` naming the key and the range."""
    subs = [("", cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg)]
    for sub in ("vision_config", "audio_config"):
        value = getattr(cfg, sub, None)
        if value is not None and not isinstance(value, (dict, list, str, int, float)):
            subs.append((f"{sub}.", value))
    for prefix, c in subs:
        for key, limit in _SIZE_KEYS.items():
            try:
                value = getattr(c, key)
            except Exception:  # per-layer attributes of heterogeneous configs raise on global access
                continue
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
                raise ValueError(f"config.json key {prefix + key!r} must be an integer 1-{limit:,} (got {shown})")
        layers, experts = _text_value(c, *_LAYER_KEYS, default=1), _text_value(c, *_EXPERT_KEYS, default=1)
        if layers * experts > MAX_LAYER_EXPERT_MODULES:
            raise ValueError(f"config.json: {prefix}layers x experts = {layers:,} x {experts:,} exceeds "
                             f"{MAX_LAYER_EXPERT_MODULES:,} (the largest released MoE has about 16,000)")


def _text_value(cfg: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        try:
            value = getattr(cfg, name)
        except Exception:  # per-layer attributes of heterogeneous configs raise on global access
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def architecture_from_transformers(data: Mapping[str, Any], name: str, where: str) -> Architecture:
    """The :class:`Architecture` of ``data`` (a config.json dict) measured on a transformers meta-device build.

    Raises ``ValueError`` when transformers does not know the ``model_type``, rejects the config, or has no
    causal-LM / image-text-to-text class for it.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from .hfconfig import SUPPORTED_MODEL_TYPES

    model_type = str(data["model_type"])
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"HF config model_type {model_type!r} is not supported: neither the built-in reader ({supported}) nor "
            f"transformers {transformers.__version__} knows it (custom code in auto_map is never run)"
        )
    kwargs = {k: v for k, v in data.items() if k not in _DROPPED_KEYS}
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:  # transformers' own validation of the values
        detail = " ".join(str(exc).split())[:300]
        raise ValueError(f"HF config rejected by transformers' {model_type} config class: {detail}") from None
    check_build_size(cfg)
    model = None
    errors = []
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        if type(cfg) not in auto._model_mapping:
            continue
        try:
            with torch.device("meta"):
                model = auto.from_config(cfg, trust_remote_code=False)
            break
        except Exception as exc:
            errors.append(f"{auto.__name__}: {exc}")
    if model is None:
        detail = f" ({' '.join('; '.join(errors).split())[:300]})" if errors else ""
        raise ValueError(
            f"HF config model_type {model_type!r} is not supported: transformers has no causal-LM or "
            f"image-text-to-text class for it{detail}; supported: {supported} (built-in)"
        )

    by_id: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        by_id[id(p)] = p.numel()
    total = sum(by_id.values())
    listed = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=1)
    vision = 0
    for n, p in model.named_parameters():
        if any(f".{v}." in f".{n}" for v in _VISION_NAMES):
            vision += p.numel()

    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    hidden = _text_value(text, "hidden_size", "d_model", "n_embd", default=1)
    heads = _text_value(text, "num_attention_heads", "n_head", "num_heads", default=1)
    kv = _text_value(text, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _text_value(text, "head_dim", default=None)
    if head_dim is None and hidden % heads:
        head_dim = max(1, hidden // heads)
    if kv > heads or heads % kv:
        kv = heads
    layers = _text_value(text, "num_hidden_layers", "n_layer", "num_layers", default=1)
    ffn = _text_value(text, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden)
    vocab = _text_value(text, "vocab_size", default=_text_value(cfg, "vocab_size", default=1))
    source = (
        f"transformers {transformers.__version__} meta-device build of {type(model).__name__} from HF config.json "
        f"({where}): exact parameter count, largest module, tied weights, vision parameters; approximate "
        f"(Llama-like layers of the text config): activations, FLOPs, LoRA sizes"
    )
    return Architecture(
        name=name, family=model_type[:50], n_layers=min(layers, 1000), hidden_size=hidden, n_heads=heads,
        n_kv_heads=kv, head_dim=head_dim, ffn_size=ffn, ffn_kind="swiglu", vocab_size=vocab,
        tied_embeddings=listed > total, vision_params=vision, parameter_count_override=total,
        largest_module_override=largest,
        max_position_embeddings=_text_value(text, "max_position_embeddings", "n_positions", default=None),
        source=source[:500],
    )
