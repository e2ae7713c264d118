"""Read a Hugging Face ``config.json`` into an :class:`~zeroplanner.specs.Architecture`.

Only data is read: the file is parsed with :func:`json.loads` (size-limited), nothing in it is executed or imported,
and ``auto_map`` / custom-code entries are ignored; a ``model_type`` outside :data:`SUPPORTED_MODEL_TYPES` is
rejected. The mapping from each family's config keys to shapes follows the ``transformers`` 5.24 model classes
(``transformers/models/<model_type>/modeling_<model_type>.py``), and a key missing from the file takes the default
of that family's ``transformers`` config class, except the keys that fix the shapes (hidden size, layers, heads,
FFN size, vocabulary, and learned positions where they have parameters), which are required.
``tests/test_hfconfig.py`` checks every family against ``transformers`` instantiated on the meta device.

Example::

    >>> arch = architecture_from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    ...                                     "vocab_size": 50257, "n_positions": 1024})
    >>> arch.parameter_count
    124439808
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .specs import Architecture

__all__ = ["MAX_CONFIG_BYTES", "SUPPORTED_MODEL_TYPES", "architecture_from_hf_config", "load_hf_config"]

MAX_CONFIG_BYTES = 1_000_000
"""Largest config file read (bytes). Released config.json files are a few kB."""

_MISSING = object()


class _Keys:
    """Typed access to a config dict; every error is a ``ValueError`` naming the key and the allowed values."""

    def __init__(self, config: Mapping[str, Any], model_type: str):
        self.config = config
        self.model_type = model_type

    def _lookup(self, names: tuple[str, ...]) -> tuple[str, Any]:
        for name in names:
            if name in self.config and self.config[name] is not None:
                return name, self.config[name]
        return names[0], _MISSING

    def integer(self, *names: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        """A positive integer from the first present key of ``names``; ``default`` when absent (or required)."""
        key, value = self._lookup(names)
        if value is _MISSING:
            if default is _MISSING:
                alias = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
                raise ValueError(f"config.json for model_type {self.model_type!r} lacks required key {key!r}{alias}")
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config.json key {key!r} must be an integer >= {minimum} (got {value!r})")
        if value < minimum:
            raise ValueError(f"config.json key {key!r} must be an integer >= {minimum} (got {value})")
        return value

    def flag(self, *names: str, default: bool) -> bool:
        key, value = self._lookup(names)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            raise ValueError(f"config.json key {key!r} must be true or false (got {value!r})")
        return value

    def probability(self, *names: str, default: float = 0.0) -> float:
        """A dropout probability in [0, 1]; null or absent gives ``default``."""
        key, value = self._lookup(names)
        if value is _MISSING:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 <= value <= 1.0):
            raise ValueError(f"config.json key {key!r} must be a probability between 0 and 1 (got {value!r})")
        return float(value)

    def any_dropout(self, *names: str, defaults: Mapping[str, float] | None = None) -> bool:
        defaults = defaults or {}
        return any(self.probability(n, default=defaults.get(n, 0.0)) > 0.0 for n in names)


# ------------------------------------------------------------------------------------------------------------------
# Families. Every supported family has the same core keys (hidden size, layers, heads, MLP width, vocabulary,
# tie_word_embeddings, maximum positions, dropouts) under its own names: the table _FAMILIES lists those names and
# defaults per model_type, and _read reads them all the same way. What only one family has (GQA heads, experts,
# Falcon's LayerNorm count, OPT's projections, ...) is read by that family's function, whose docstring cites the
# transformers 5.24 class it follows. Defaults are those of the transformers 5.24 config classes
# (transformers/models/<family>/configuration_<family>.py).
# ------------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Family:
    """How one ``model_type`` names and defaults the keys every family has, and its family-specific reader.

    Key tuples list the accepted names, preferred first (the first present, non-null one is read). ``ffn``: the
    MLP-width key, ``None`` when the width is always 4 x hidden; ``ffn_default_4h``: absent means 4 x hidden
    (else the key is required). ``positions``: the maximum-positions key, ``()`` when the family has none;
    ``positions_default``: its default (``_MISSING``: required). ``dropout``: the probability keys of which any
    > 0 sets ``dropout`` (absent keys take ``dropout_defaults``, else 0). ``specific(keys, shared)`` returns the
    family's other fields, given the shared ones (it may override ``norms_per_layer`` and ``final_norm``).
    """

    specific: Callable[[_Keys, Mapping[str, Any]], dict[str, Any]]
    tied_default: bool
    dropout: tuple[str, ...]
    dropout_defaults: Mapping[str, float] = field(default_factory=dict)
    hidden: tuple[str, ...] = ("hidden_size",)
    layers: tuple[str, ...] = ("num_hidden_layers",)
    heads: tuple[str, ...] = ("num_attention_heads",)
    ffn: tuple[str, ...] | None = ("intermediate_size",)
    ffn_default_4h: bool = False
    positions: tuple[str, ...] = ("max_position_embeddings",)
    positions_default: Any = _MISSING
    ffn_kind: str = "gelu"
    norm_kind: str = "layernorm"


def _read(k: _Keys, family: _Family) -> dict[str, Any]:
    """The Architecture fields (without name/source) of ``k.config`` read as ``family``."""
    hidden = k.integer(*family.hidden)
    if family.ffn is None:
        ffn_size = 4 * hidden
    else:
        ffn_size = k.integer(*family.ffn, default=4 * hidden if family.ffn_default_4h else _MISSING)
    fields: dict[str, Any] = dict(
        n_layers=k.integer(*family.layers),
        hidden_size=hidden,
        n_heads=k.integer(*family.heads),
        ffn_size=ffn_size,
        ffn_kind=family.ffn_kind,
        vocab_size=k.integer("vocab_size"),
        tied_embeddings=k.flag("tie_word_embeddings", default=family.tied_default),
        norm_kind=family.norm_kind,
        norms_per_layer=2,
        final_norm=True,
    )
    if family.positions:
        fields["max_position_embeddings"] = k.integer(*family.positions, default=family.positions_default)
    fields.update(family.specific(k, fields))
    fields["dropout"] = k.any_dropout(*family.dropout, defaults=family.dropout_defaults)
    return fields


def _biases(attention: bool, mlp: bool) -> dict[str, bool]:
    """Bias flags of the q/k/v and output projections (``attention``) and of the MLP (``mlp``)."""
    return dict(qkv_bias=attention, out_bias=attention, mlp_bias=mlp)


_LLAMA_LIKE_DEFAULTS = {
    # transformers 5.24 defaults: num_key_value_heads (None = num_attention_heads), max_position_embeddings
    "llama": (None, 2048),
    "mistral": (8, 4096 * 32),
    "qwen2": (32, 32768),
    "mixtral": (8, 4096 * 32),
}


def _llama_like(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM: RMSNorm, SwiGLU, rotary.

    Biases: llama ``attention_bias`` (q, k, v and o) and ``mlp_bias``; qwen2 q, k, v always biased, o not;
    mistral and mixtral none. Mixtral (transformers 5) keeps all experts of a layer in one ``MixtralExperts``
    module (3-D ``gate_up_proj`` and ``down_proj``), so ``fused_experts`` is True; its router is a bias-free
    (n_experts x hidden) weight.
    """
    mt = k.model_type
    kv_default = _LLAMA_LIKE_DEFAULTS[mt][0]
    fields: dict[str, Any] = dict(
        n_kv_heads=k.integer("num_key_value_heads", default=shared["n_heads"] if kv_default is None else kv_default),
        head_dim=k.integer("head_dim", default=None),
    )
    if mt == "llama":
        fields.update(_biases(k.flag("attention_bias", default=False), k.flag("mlp_bias", default=False)))
    elif mt == "qwen2":
        fields.update(qkv_bias=True)
    if mt == "mixtral":
        n_experts = k.integer("num_local_experts", "num_experts", default=8)
        fields.update(
            n_experts=n_experts,
            experts_per_token=k.integer("num_experts_per_tok", default=2),
            fused_experts=True,
        )
    return fields


def _gpt2(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """GPT2LMHeadModel: learned positions (n_positions rows), fused Conv1D c_attn, biases everywhere, LayerNorm,
    MLP width n_inner (null = 4 * n_embd), tied lm_head by default. Cross-attention blocks are not supported."""
    if k.flag("add_cross_attention", default=False):
        raise ValueError("config.json key 'add_cross_attention' must be false: cross-attention GPT-2 is unsupported")
    return dict(learned_position_embeddings=shared["max_position_embeddings"], fused_qkv=True, **_biases(True, True))


def _gpt_neox(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """GPTNeoXForCausalLM: rotary (no position parameters), fused query_key_value, ``attention_bias`` on the
    attention projections, biased MLP, LayerNorm, untied ``embed_out`` by default, parallel residual."""
    return dict(
        fused_qkv=True,
        parallel_attention=k.flag("use_parallel_residual", default=True),
        **_biases(k.flag("attention_bias", default=True), True),
    )


def _bloom(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """BloomForCausalLM: ALiBi (no position parameters), LayerNorm after the word embeddings, fused biased
    query_key_value, biased 4h MLP, tied lm_head by default."""
    return dict(embedding_norm=True, fused_qkv=True, **_biases(True, True))


def _opt(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """OPTForCausalLM: learned positions with OPT's offset of 2 rows (``OPTLearnedPositionalEmbedding``),
    separate q/k/v/out projections and fc1/fc2 biased by ``enable_bias``, LayerNorm, tied lm_head by default.
    When ``word_embed_proj_dim`` differs from hidden_size the token embedding and lm_head have that width and
    bias-free ``project_in`` / ``project_out`` matrices map between the widths (counted in extra_parameters).
    The final LayerNorm exists only with ``do_layer_norm_before`` (and not ``_remove_final_layer_norm``);
    ``layer_norm_elementwise_affine=false`` leaves the LayerNorms without parameters (counted as no norms)."""
    hidden = shared["hidden_size"]
    proj = k.integer("word_embed_proj_dim", default=hidden)
    bias = k.flag("enable_bias", default=True)
    affine = k.flag("layer_norm_elementwise_affine", default=True)
    final = k.flag("do_layer_norm_before", default=True) and not k.flag("_remove_final_layer_norm", default=False)
    return dict(
        learned_position_embeddings=shared["max_position_embeddings"] + 2,
        norms_per_layer=2 if affine else 0,
        final_norm=final and affine,
        embedding_dim=proj if proj != hidden else None,
        extra_parameters=2 * hidden * proj if proj != hidden else 0,
        **_biases(bias, bias),
    )


def _falcon(k: _Keys, shared: Mapping[str, Any]) -> dict[str, Any]:
    """FalconForCausalLM. query_key_value is one matrix of width (n_heads + 2 * kv_heads) * head_dim where
    kv_heads = num_kv_heads with ``new_decoder_architecture``, 1 with ``multi_query``, else n_heads. LayerNorms
    per block: 2 without ``parallel_attn``; with it, 2 when ``num_ln_in_parallel_attn`` is 2 (its default under
    the new architecture), else 1. ``bias`` applies to every linear layer; ALiBi and rotary add no parameters;
    lm_head tied by default. (FalconDecoderLayer / FalconAttention in transformers 5.24.)"""
    heads = shared["n_heads"]
    new_arch = k.flag("new_decoder_architecture", default=False)
    multi_query = k.flag("multi_query", default=True)
    parallel = k.flag("parallel_attn", default=True)
    if new_arch:
        kv = k.integer("num_kv_heads", default=heads)
    elif multi_query:
        kv = 1
    else:
        kv = heads
    n_ln = k.integer("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    bias = k.flag("bias", default=False)
    return dict(
        n_kv_heads=kv,
        norms_per_layer=2 if (not parallel or n_ln == 2) else 1,
        fused_qkv=True,
        parallel_attention=new_arch or parallel,
        **_biases(bias, bias),
    )


_FAMILIES: dict[str, _Family] = {
    **{
        model_type: _Family(
            _llama_like, tied_default=False, dropout=("attention_dropout",), positions_default=positions,
            ffn_kind="swiglu", norm_kind="rmsnorm",
        )
        for model_type, (_, positions) in _LLAMA_LIKE_DEFAULTS.items()
    },
    # GPT2Config: n_embd / n_layer / n_head / n_positions, with hidden_size / num_hidden_layers /
    # num_attention_heads / max_position_embeddings as its attribute_map aliases; n_inner null = 4 * n_embd;
    # resid/embd/attn_pdrop default 0.1
    "gpt2": _Family(
        _gpt2, tied_default=True, hidden=("n_embd", "hidden_size"), layers=("n_layer", "num_hidden_layers"),
        heads=("n_head", "num_attention_heads"), ffn=("n_inner",), ffn_default_4h=True,
        positions=("n_positions", "max_position_embeddings"),
        dropout=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
        dropout_defaults={"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
    ),
    # GPTNeoXConfig: max_position_embeddings 2048
    "gpt_neox": _Family(
        _gpt_neox, tied_default=False, positions_default=2048, dropout=("attention_dropout", "hidden_dropout"),
    ),
    # BloomConfig: n_layer / n_head (num_hidden_layers / num_attention_heads are attribute_map aliases), n_embed
    # the older name of hidden_size; MLP always 4 * hidden; no position limit read (ALiBi)
    "bloom": _Family(
        _bloom, tied_default=True, hidden=("hidden_size", "n_embed"), layers=("n_layer", "num_hidden_layers"),
        heads=("n_head", "num_attention_heads"), ffn=None, positions=(),
        dropout=("hidden_dropout", "attention_dropout"),
    ),
    # OPTConfig: MLP width ffn_dim; dropout defaults 0.1 (attention_dropout 0.0)
    "opt": _Family(
        _opt, tied_default=True, ffn=("ffn_dim",), dropout=("dropout", "attention_dropout"),
        dropout_defaults={"dropout": 0.1},
    ),
    # FalconConfig: n_embed the older name of hidden_size, ffn_hidden_size null = 4 * hidden,
    # max_position_embeddings 2048
    "falcon": _Family(
        _falcon, tied_default=True, hidden=("hidden_size", "n_embed"), ffn=("ffn_hidden_size",),
        ffn_default_4h=True, positions_default=2048, dropout=("hidden_dropout", "attention_dropout"),
    ),
}

SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_FAMILIES)
"""HF ``model_type`` values this reader understands."""


def load_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a ``config.json`` file (or the ``config.json`` inside a directory) into a dict.

    Raises ``ValueError`` if the file is missing, larger than :data:`MAX_CONFIG_BYTES`, not UTF-8 JSON, or not a
    JSON object.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"HF config {str(p)!r} is not a readable file")
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"HF config {str(p)!r} is {size} bytes; the limit is {MAX_CONFIG_BYTES} bytes")
    with p.open("rb") as fh:
        raw = fh.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"HF config {str(p)!r} exceeds {MAX_CONFIG_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"HF config {str(p)!r} is not UTF-8 text: {exc}") from None
    except ValueError as exc:  # json.JSONDecodeError, or a NaN/Infinity constant
        raise ValueError(f"HF config {str(p)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"HF config {str(p)!r} must hold a JSON object, not {type(data).__name__}")
    return data


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name} is not allowed")


def _default_name(config: Mapping[str, Any], path: pathlib.Path | None, model_type: str) -> str:
    candidate = config.get("_name_or_path")
    if isinstance(candidate, str) and candidate.strip():
        return candidate.strip()[:200]
    if path is not None:
        p = path if path.is_dir() else path.parent
        if p.name:
            return p.name[:200]
        return path.stem[:200] or model_type
    return f"{model_type}-custom"


def architecture_from_hf_config(
    config: Mapping[str, Any] | str | os.PathLike[str], name: str | None = None
) -> Architecture:
    """Build an :class:`Architecture` from a HF ``config.json`` (a dict, or a path to the file or its directory).

    Supported ``model_type`` values: :data:`SUPPORTED_MODEL_TYPES` (llama, mistral, qwen2, mixtral, gpt2,
    gpt_neox, bloom, opt, falcon). ``name`` defaults to ``_name_or_path``, else the file's directory name.

    Raises ``ValueError`` naming the offending key: unsupported or missing ``model_type``, a missing shape key,
    a value of the wrong type or range, inconsistent heads (pydantic's ``ValidationError`` is a ``ValueError``);
    for files also a size over :data:`MAX_CONFIG_BYTES` or invalid JSON.
    """
    path: pathlib.Path | None = None
    if isinstance(config, (str, os.PathLike)):
        path = pathlib.Path(config)
        data: Mapping[str, Any] = load_hf_config(path)
    elif isinstance(config, Mapping):
        data = config
    else:
        raise ValueError(f"HF config must be a dict or a path, not {type(config).__name__}")

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(
            f"HF config lacks a string 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family = _FAMILIES.get(model_type)
    if family is None:
        raise ValueError(
            f"HF config model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    fields = _read(_Keys(data, model_type), family)
    fields = {key: value for key, value in fields.items() if value is not None}
    hidden, heads = fields["hidden_size"], fields["n_heads"]
    if "head_dim" not in fields and hidden % heads:
        raise ValueError(f"config.json: hidden size {hidden} is not divisible by num_attention_heads {heads}")
    label = name if name is not None else _default_name(data, path, model_type)
    source = f"HF config.json ({path})" if path is not None else "HF config.json (dict)"
    return Architecture(name=label, family=model_type, source=source[:500], **fields)
