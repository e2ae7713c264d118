"""Read a Hugging Face ``config.json`` into an :class:`~zeroplanner.specs.Architecture`.

Only data is read: the file is parsed with :func:`json.loads` (size-limited), nothing in it is executed or imported,
and ``auto_map`` / custom-code entries are ignored; a ``model_type`` outside :data:`SUPPORTED_MODEL_TYPES` is
rejected. The mapping from each family's config keys to shapes follows the ``transformers`` 5.24 model classes
(``transformers/models/<model_type>/modeling_<model_type>.py``), and a key missing from the file takes the default
of that family's ``transformers`` config class, except the keys that fix the shapes (hidden size, layers, heads,
FFN size, vocabulary, and learned positions where they have parameters), which are required.
``tests/core/test_hfconfig.py`` checks every family against ``transformers`` instantiated on the meta device.

Example::

    >>> arch = architecture_from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
    ...                                     "vocab_size": 50257, "n_positions": 1024})
    >>> arch.parameter_count
    124439808
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..files import nesting_over, read_regular_file
from ..specs import Architecture, LinearMixer, VisionTower, _field_bound

__all__ = [
    "MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH", "MAX_CONFIG_INTEGER", "SUPPORTED_MODEL_TYPES",
    "architecture_from_hf_config", "check_config_structure", "load_hf_config", "read_hf_config_bytes",
    "too_large_message",
]

MAX_CONFIG_BYTES = 1_000_000
"""Largest config file read (bytes). Released config.json files are a few kB."""

MAX_CONFIG_INTEGER = 100_000_000
"""Largest integer a shape key may hold. The largest released shapes are vocabularies of 262,208 (Gemma 3) and
intermediate sizes of 53,248 (Llama-3.1-405B); 1e8 refuses absurd values with the key's name before any count."""

MAX_CONFIG_DEPTH = 20
"""Deepest nesting of objects/lists accepted in a config.json (released files nest 4 levels: rope_parameters)."""


_KEY_FIELDS = {
    "num_hidden_layers": "n_layers", "n_layer": "n_layers", "hidden_size": "hidden_size", "n_embd": "hidden_size",
    "n_embed": "hidden_size", "num_attention_heads": "n_heads", "n_head": "n_heads",
    "num_key_value_heads": "n_kv_heads", "num_kv_heads": "n_kv_heads", "head_dim": "head_dim",
    "intermediate_size": "ffn_size", "ffn_dim": "ffn_size", "moe_intermediate_size": "ffn_size",
    "vocab_size": "vocab_size", "num_experts": "n_experts", "num_local_experts": "n_experts",
    "n_routed_experts": "n_experts", "num_experts_per_tok": "experts_per_token",
}
"""config.json shape key -> the :class:`~zeroplanner.specs.Architecture` field it fills. :meth:`_Keys.integer`
caps the key at that field's declared ``le`` bound (``n_layers`` <= 1000, ``hidden_size`` <= 1e6, ...), so a value
the model refuses is refused here with the key's name and the real range."""


def _field_max(key: str) -> int:
    """The largest value of the shape key ``key``: :data:`MAX_CONFIG_INTEGER`, or less where the Architecture field
    it fills declares less (:data:`_KEY_FIELDS`)."""
    field = _KEY_FIELDS.get(key)
    return min(MAX_CONFIG_INTEGER, _field_bound(Architecture, field, "le")) if field else MAX_CONFIG_INTEGER


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

_MISSING = object()


def _json_type(value: Any) -> str:
    """The JSON type of a parsed value, in JSON's words (true/false is "boolean", a dict "object")."""
    for kind, name in ((bool, "boolean"), (str, "string"), (dict, "object"), (list, "array"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


class _Keys:
    """Typed access to a config dict; every error is a ``ValueError`` naming the key and the allowed values."""

    def __init__(self, config: Mapping[str, Any], model_type: str, prefix: str = ""):
        self.config = config
        self.model_type = model_type
        self.prefix = prefix  # "vision_config." for a nested reader: messages name the whole key path

    def _lookup(self, names: tuple[str, ...]) -> tuple[str, Any]:
        for name in names:
            if name in self.config and self.config[name] is not None:
                return name, self.config[name]
        return names[0], _MISSING

    def integer(
        self, *names: str, default: Any = _MISSING, minimum: int = 1, maximum: int | None = None
    ) -> Any:
        """An integer in [minimum, maximum] from the first present key of ``names``; ``default`` when absent (or
        required). ``maximum`` defaults to the key's :func:`_field_max` (the Architecture field's bound, else
        :data:`MAX_CONFIG_INTEGER`) and is never above it. The message names the key and the whole range, for a
        value of the wrong type (``1e12``, ``32.0``: JSON floats) as for one out of range."""
        key, value = self._lookup(names)
        if value is _MISSING:
            if default is _MISSING:
                alias = f" (or {', '.join(repr(n) for n in names[1:])})" if len(names) > 1 else ""
                raise ValueError(f"config.json for model_type {self.model_type!r} lacks required key {key!r}{alias}")
            return default
        limit = _field_max(key) if maximum is None else min(maximum, _field_max(key))
        allowed = f"config.json key {self.prefix + key!r} must be an integer between {minimum} and {limit:,}"
        if isinstance(value, bool) or not isinstance(value, int):
            what = ("a number with a fraction or exponent" if isinstance(value, float) and not isinstance(value, bool)
                    else f"a JSON {_json_type(value)}")
            raise ValueError(f"{allowed} (got {_short(value)}, {what})")
        if not minimum <= value <= limit:
            raise ValueError(f"{allowed} (got {_short(value)})")
        return value

    def optional_integer(self, name: str, default: int | None, minimum: int = 1) -> int | None:
        """Like :meth:`integer` for one key whose explicit ``null`` means "none" (not "default")."""
        if name in self.config and self.config[name] is None:
            return None
        return self.integer(name, default=default, minimum=minimum)

    def string(self, *names: str, default: Any = _MISSING) -> Any:
        key, value = self._lookup(names)
        if value is _MISSING:
            if default is _MISSING:
                raise ValueError(f"config.json for model_type {self.model_type!r} lacks required key {key!r}")
            return default
        if not isinstance(value, str) or len(value) > 10_000:
            raise ValueError(f"config.json key {key!r} must be a string of at most 10000 characters "
                             f"(got {_short(value)})")
        return value

    def string_list(self, name: str, allowed: tuple[str, ...], length: int | None = None) -> list[str] | None:
        """A list of strings from ``allowed`` (``layer_types``); None when absent."""
        value = self.config.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v in allowed for v in value):
            raise ValueError(f"config.json key {name!r} must be a list of {', '.join(allowed)} (got {_short(value)})")
        if length is not None and len(value) != length:
            raise ValueError(f"config.json key {name!r} has {len(value)} entries; num_hidden_layers is {length}")
        return list(value)

    def index_list(self, name: str, n_layers: int, default: list[int] | None = None) -> list[int] | None:
        """A list of layer indices in [0, n_layers) (``mlp_only_layers``, ``moe_layers``)."""
        value = self.config.get(name)
        if value is None:
            return default
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n_layers for v in value
        ):
            raise ValueError(f"config.json key {name!r} must be a list of layer indices 0..{n_layers - 1} "
                             f"(got {_short(value)})")
        return list(value)

    def sub(self, name: str) -> _Keys:
        """The nested config ``name`` (``text_config`` / ``vision_config``) as its own key reader."""
        value = self.config.get(name)
        if not isinstance(value, Mapping):
            raise ValueError(f"config.json for model_type {self.model_type!r} needs an object {name!r} "
                             f"(got {_short(value)})")
        return _Keys(value, f"{self.model_type}.{name}", f"{self.prefix}{name}.")

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
            router_norm_topk=True,  # MixtralTopKRouter.forward always renormalises the top-k weights
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


# ------------------------------------------------------------------------------------------------------------------
# 2024-26 families. Each reader returns every Architecture field (the layer kinds differ too much for the table
# above); each docstring names the transformers 5.24 classes whose parameters it counts, and the defaults are those
# of the family's transformers 5.24 config class. tests/core/test_hfconfig.py compares each with transformers on the
# meta device. Quantised checkpoints (DeepSeek-V3's fp8 block-quantised weights, gpt-oss's mxfp4 experts) are
# read as their logical parameters and assumed trained in the precision of the TrainingSpec (bf16): DeepSpeed ZeRO
# fine-tuning upcasts them (the fp8/mxfp4 kernels are inference or pre-training paths outside this model).
# ------------------------------------------------------------------------------------------------------------------
_SLIDING = ("sliding_attention", "full_attention")


def _common(k: _Keys, *, tied: bool, positions: int, kv_default: int | None, head_dim_default: int | None,
            vocab_default: Any = _MISSING) -> dict[str, Any]:
    """Shape keys every llama-like family names the same way (RMSNorm, gated MLP, rotary)."""
    heads = k.integer("num_attention_heads")
    return dict(
        n_layers=k.integer("num_hidden_layers", maximum=1000),
        hidden_size=k.integer("hidden_size"),
        n_heads=heads,
        n_kv_heads=k.integer("num_key_value_heads", default=heads if kv_default is None else kv_default),
        head_dim=k.integer("head_dim", default=head_dim_default),
        ffn_size=k.integer("intermediate_size"),
        ffn_kind="swiglu",
        vocab_size=k.integer("vocab_size", default=vocab_default),
        tied_embeddings=k.flag("tie_word_embeddings", default=tied),
        norm_kind="rmsnorm",
        norms_per_layer=2,
        final_norm=True,
        max_position_embeddings=k.integer("max_position_embeddings", default=positions),
        dropout=k.any_dropout("attention_dropout"),
    )


def _sliding(k: _Keys, n_layers: int, default_pattern: Callable[[int], bool] | None,
             window_default: int | None) -> dict[str, Any]:
    """sliding_window and the number of sliding-window layers (``layer_types``, else the family's pattern)."""
    types = k.string_list("layer_types", _SLIDING, n_layers)
    window = k.optional_integer("sliding_window", window_default)
    if types is not None:
        count = types.count("sliding_attention")
    elif default_pattern is not None and window is not None:
        count = sum(default_pattern(i) for i in range(n_layers))
    else:
        count = 0
    return dict(sliding_window=window if count else None, sliding_window_layers=count if window else 0)


def _qwen_moe_layers(k: _Keys, n_layers: int, n_experts: int) -> int:
    """Qwen2/3-MoE, Qwen3-Next: layer i is sparse unless listed in mlp_only_layers, when (i+1) % step == 0."""
    step = k.integer("decoder_sparse_step", default=1)
    only = set(k.index_list("mlp_only_layers", n_layers, default=[]) or [])
    return sum(1 for i in range(n_layers) if i not in only and n_experts > 0 and (i + 1) % step == 0)


def _qwen3(k: _Keys) -> dict[str, Any]:
    """Qwen3ForCausalLM: Qwen3Attention with q_norm/k_norm (RMSNorm over head_dim) and ``attention_bias`` on
    q, k, v and o; dense SwiGLU MLP; head_dim 128 by default (so n_heads * head_dim may differ from hidden)."""
    f = _common(k, tied=False, positions=32768, kv_default=None, head_dim_default=128)
    bias = k.flag("attention_bias", default=False)
    f.update(qk_norm="head", qkv_bias=bias, out_bias=bias)
    if k.flag("use_sliding_window", default=False):
        window = k.optional_integer("sliding_window", 4096)
        upto = k.integer("max_window_layers", default=28, minimum=0)
        f.update(sliding_window=window, sliding_window_layers=max(0, f["n_layers"] - upto) if window else 0)
    return f


def _qwen3_moe(k: _Keys) -> dict[str, Any]:
    """Qwen3MoeForCausalLM: Qwen3 attention (q/k norms); Qwen3MoeSparseMoeBlock = router Linear(h, E) without bias
    and Qwen3MoeExperts (fused gate_up_proj (E, 2f, h), down_proj (E, h, f)) with f = moe_intermediate_size;
    layers outside the sparse pattern keep a dense MLP of intermediate_size."""
    f = _common(k, tied=False, positions=32768, kv_default=4, head_dim_default=None)
    bias = k.flag("attention_bias", default=False)
    experts = k.integer("num_experts", default=128)
    moe = _qwen_moe_layers(k, f["n_layers"], experts)
    f.update(
        qk_norm="head", qkv_bias=bias, out_bias=bias, dense_ffn_size=f["ffn_size"],
        ffn_size=k.integer("moe_intermediate_size", default=768),
    )
    if experts > 1 and moe:
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=8),
                 fused_experts=True, moe_layers=moe, router_norm_topk=k.flag("norm_topk_prob", default=False))
    return f


def _qwen3_next(k: _Keys) -> dict[str, Any]:
    """Qwen3NextForCausalLM. Full-attention layers (every full_attention_interval-th, or ``layer_types``):
    Qwen3NextAttention with a gated q_proj (2 * n_heads * head_dim: queries and output gate), q/k norms over
    head_dim. The others: Qwen3NextGatedDeltaNet = in_proj_qkvz h x (2*nk*dk + 2*nv*dv), in_proj_ba h x 2*nv,
    depthwise conv1d (2*nk*dk + nv*dv) x kernel (no bias), dt_bias and A_log (nv each), a gated RMSNorm over dv,
    out_proj nv*dv x h. MoE as Qwen3-MoE plus a shared expert (shared_expert_intermediate_size) with a
    sigmoid gate Linear(h, 1)."""
    f = _common(k, tied=False, positions=32768, kv_default=2, head_dim_default=256)
    n, h = f["n_layers"], f["hidden_size"]
    types = k.string_list("layer_types", ("linear_attention", "full_attention"), n)
    if types is None:
        interval = k.integer("full_attention_interval", default=4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    full = types.count("full_attention")
    nk, dk = k.integer("linear_num_key_heads", default=16), k.integer("linear_key_head_dim", default=128)
    nv, dv = k.integer("linear_num_value_heads", default=32), k.integer("linear_value_head_dim", default=128)
    kernel = k.integer("linear_conv_kernel_dim", default=4)
    qkvz, out = h * (2 * nk * dk + 2 * nv * dv), nv * dv * h
    linear = qkvz + h * 2 * nv + (2 * nk * dk + nv * dv) * kernel + 2 * nv + dv + out
    bias = k.flag("attention_bias", default=False)
    experts = k.integer("num_experts", default=512)
    moe = _qwen_moe_layers(k, n, experts)
    f.update(
        qk_norm="head", qkv_bias=bias, out_bias=bias, gated_attention=True, attention_layers=full,
        rotary_fraction=_rotary_fraction(k, 0.25),  # Qwen3NextConfig: partial_rotary_factor defaults to 0.25
        other_mixer_params=(n - full) * linear, other_mixer_largest_module=max(qkvz, out) if n > full else 0,
        linear_mixer=LinearMixer(kind="gated_deltanet", layers=n - full, key_heads=nk, key_head_dim=dk,
                                 value_heads=nv, value_head_dim=dv, conv_kernel=kernel) if n > full else None,
        dense_ffn_size=f["ffn_size"], ffn_size=k.integer("moe_intermediate_size", default=512),
    )
    if experts > 1 and moe:
        shared = k.integer("shared_expert_intermediate_size", default=512, minimum=0)
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=10),
                 fused_experts=True, moe_layers=moe, shared_expert_ffn_size=shared, shared_expert_gate=shared > 0,
                 router_norm_topk=k.flag("norm_topk_prob", default=True))
    return f


def _gemma2(k: _Keys) -> dict[str, Any]:
    """Gemma2ForCausalLM: four RMSNorms per layer (input, post_attention, pre_ and post_feedforward), GeGLU MLP
    (three matrices), head_dim 256, tied lm_head, 256k vocabulary. attn_logit_softcapping (default 50.0) needs
    eager attention in transformers (flash/sdpa do not cap), so it is priced with O(s^2) scores; sliding window
    on every other layer (layer i when (i + 1) % 2)."""
    f = _common(k, tied=True, positions=8192, kv_default=4, head_dim_default=256, vocab_default=256000)
    bias = k.flag("attention_bias", default=False)
    cap = k.config.get("attn_logit_softcapping", 50.0) if "attn_logit_softcapping" in k.config else 50.0
    f.update(norms_per_layer=4, qkv_bias=bias, out_bias=bias, attn_logit_softcapping=cap is not None,
             final_logit_softcapping=_final_cap(k, 30.0),
             **_sliding(k, f["n_layers"], lambda i: bool((i + 1) % 2), 4096))
    return f


def _final_cap(k: _Keys, default: float | None) -> bool:
    """final_logit_softcapping set (Gemma2Config default 30.0; Gemma3TextConfig / Gemma4TextConfig None): the
    CausalLM forward saves tanh's output over the logits (modeling_gemma2/3/4 ...ForCausalLM.forward)."""
    value = k.config.get("final_logit_softcapping", default) if "final_logit_softcapping" in k.config else default
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ValueError(f"config.json key 'final_logit_softcapping' must be a positive number or null "
                         f"(got {_short(value)})")
    return value is not None


def _gemma3_text(k: _Keys) -> dict[str, Any]:
    """Gemma3ForCausalLM (gemma3_text): Gemma 2's layer with q/k norms over head_dim and no soft-capping
    (attn_logit_softcapping null by default); 5 sliding-window layers to 1 global (sliding_window_pattern 6)."""
    f = _common(k, tied=True, positions=131072, kv_default=4, head_dim_default=256, vocab_default=262208)
    bias = k.flag("attention_bias", default=False)
    cap = k.config.get("attn_logit_softcapping")
    pattern = k.integer("sliding_window_pattern", default=6)
    f.update(norms_per_layer=4, qk_norm="head", qkv_bias=bias, out_bias=bias, attn_logit_softcapping=cap is not None,
             final_logit_softcapping=_final_cap(k, None),
             **_sliding(k, f["n_layers"], lambda i: bool((i + 1) % pattern), 4096))
    return f


def _siglip_vision(v: _Keys) -> int:
    """SiglipVisionModel (Gemma 3's vision tower; the pooling head only with vision_use_head): biased patch conv (hv x 3 x p x p),
    learned positions ((image_size/p)^2 rows), layers of two biased LayerNorms, biased q/k/v/out and fc1/fc2,
    a post LayerNorm."""
    hv, fv, layers = v.integer("hidden_size", default=768), v.integer("intermediate_size", default=3072), \
        v.integer("num_hidden_layers", default=12, maximum=1000)
    patch, image, ch = v.integer("patch_size", default=16), v.integer("image_size", default=224), \
        v.integer("num_channels", default=3)
    layer = 4 * hv * hv + 4 * hv + 2 * hv * fv + fv + hv + 4 * hv
    total = hv * ch * patch * patch + hv + (image // patch) ** 2 * hv + layers * layer + 2 * hv
    if v.flag("vision_use_head", default=True):  # SiglipMultiheadAttentionPoolingHead (Gemma 3 files: false)
        total += hv + 4 * hv * hv + 4 * hv + 2 * hv + 2 * hv * fv + fv + hv
    return total


def _gemma3(k: _Keys) -> dict[str, Any]:
    """Gemma3ForConditionalGeneration: gemma3_text language model, SigLIP vision tower and
    Gemma3MultiModalProjector (mm_soft_emb_norm RMSNorm over the vision width, mm_input_projection_weight
    vision x text); mm_tokens_per_image (256) tokens per image."""
    text, vision = k.sub("text_config"), k.sub("vision_config")
    f = _gemma3_text(text)
    f["tied_embeddings"] = k.flag("tie_word_embeddings", default=f["tied_embeddings"])
    hv = vision.integer("hidden_size", default=768)
    tokens = k.integer("mm_tokens_per_image", default=256)
    f.update(vision_params=_siglip_vision(vision) + hv + hv * f["hidden_size"], vision_tokens_per_image=tokens,
             vision=_siglip_tower(vision, tokens))
    return f


def _siglip_tower(v: _Keys, tokens: int) -> VisionTower:
    """The activation shape of Gemma 3's SigLIP tower: (image_size / patch_size)^2 patches, average-pooled by
    Gemma3MultiModalProjector (kernel = patches per side / tokens per side) into ``tokens`` tokens; every block
    attends over the whole image. transformers refuses a pooled count that is not mm_tokens_per_image, so an
    mm_tokens_per_image that is not a square dividing the patch grid is refused here."""
    hv, heads = v.integer("hidden_size", default=768), v.integer("num_attention_heads", default=12)
    side = v.integer("image_size", default=224) // v.integer("patch_size", default=16)
    per_side = math.isqrt(tokens)
    if side < 1 or per_side * per_side != tokens or side % per_side:
        raise ValueError(f"config.json key 'mm_tokens_per_image' ({tokens}) must be a square whose side divides the "
                         f"patch grid side image_size / patch_size = {side}")
    if hv % heads:
        raise ValueError(f"config.json key 'vision_config.num_attention_heads' ({heads}) must divide the tower "
                         f"width {hv}")
    patch_input = v.integer("num_channels", default=3) * v.integer("patch_size", default=16) ** 2
    if hv > 1_000_000 or patch_input > 10_000_000:
        raise ValueError("config.json 'vision_config' gives a tower width above 1000000 or num_channels x "
                         "patch_size^2 above 10000000")
    return VisionTower(family="gemma3", layers=v.integer("num_hidden_layers", default=12, maximum=1000),
                       hidden_size=hv, heads=heads, ffn_size=v.integer("intermediate_size", default=3072,
                                                                      maximum=10_000_000),
                       patch_input_size=patch_input, patches_per_image=side * side, merge_size=side // per_side,
                       full_attention_layers=v.integer("num_hidden_layers", default=12, maximum=1000),
                       window_patches=side * side)


def _gemma4_text(k: _Keys) -> dict[str, Any]:
    """Gemma4ForCausalLM (gemma4_text), the layouts without per-layer input embeddings or KV sharing
    (hidden_size_per_layer_input 0, num_kv_shared_layers 0; the 26B-A4B and 31B checkpoints). Sliding layers:
    q/k/v/o with head_dim and num_key_value_heads, q/k norms over head_dim. Full-attention layers: global_head_dim
    and num_global_key_value_heads, and with attention_k_eq_v no v_proj (values are the keys). Every layer: the
    four Gemma norms and a GeGLU MLP of intermediate_size; with enable_moe_block also Gemma4TextRouter (proj
    Linear(h, E), scale (h), per_expert_scale (E)), Gemma4TextExperts (fused gate_up_proj (E, 2f, h), down_proj)
    of moe_intermediate_size, and three more norms."""
    if k.integer("hidden_size_per_layer_input", default=256, minimum=0) or \
            k.integer("num_kv_shared_layers", default=0, minimum=0):
        raise _Unsupported("gemma4 with per-layer input embeddings or KV-shared layers (E2B/E4B layouts)")
    f = _common(k, tied=True, positions=131072, kv_default=4, head_dim_default=256, vocab_default=262144)
    n, h = f["n_layers"], f["hidden_size"]
    types = k.string_list("layer_types", _SLIDING, n)
    if types is None:
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    full = types.count("full_attention")
    gd = k.integer("global_head_dim", default=512)
    gkv = k.integer("num_global_key_value_heads", default=f["n_kv_heads"])
    k_eq_v = k.flag("attention_k_eq_v", default=False)
    bias = k.flag("attention_bias", default=False)
    heads = f["n_heads"]
    q, kk = h * heads * gd + heads * gd * bias, h * gkv * gd + gkv * gd * bias
    o = heads * gd * h + h * bias
    global_layer = q + kk * (1 if k_eq_v else 2) + o + 2 * gd
    window = k.optional_integer("sliding_window", 512)
    f.update(
        norms_per_layer=4, qk_norm="head", qkv_bias=bias, out_bias=bias, attention_layers=n - full,
        other_mixer_params=full * global_layer, other_mixer_largest_module=max(h * heads * gd, o) if full else 0,
        sliding_window=window, sliding_window_layers=(n - full) if window else 0, global_head_dim=gd,
        global_kv_heads=gkv, final_logit_softcapping=_final_cap(k, None),
    )
    if k.flag("enable_moe_block", default=False):
        experts = k.integer("num_experts")
        f.update(
            n_experts=experts, experts_per_token=k.integer("top_k_experts"), fused_experts=True, moe_layers=n,
            dense_mlp_layers=n, dense_ffn_size=f["ffn_size"], ffn_size=k.integer("moe_intermediate_size"),
            norms_per_layer=7, layer_extra_params=h + experts,
        )
    return f


def _gemma4_vision(v: _Keys) -> int:
    """Gemma4VisionModel: patch_embedder (position_embedding_table (2, position_embedding_size, hv) and a
    bias-free input_proj hv x 3*p*p), layers of q/k/v/o (head_dim, num_key_value_heads), q/k norms over head_dim,
    a GeGLU MLP and four RMSNorms. use_clipped_linears (extra clamp scalars) is not supported."""
    if v.flag("use_clipped_linears", default=False):
        raise _Unsupported("gemma4 vision tower with use_clipped_linears")
    hv, fv = v.integer("hidden_size", default=768), v.integer("intermediate_size", default=3072)
    layers, heads = v.integer("num_hidden_layers", default=16, maximum=1000), v.integer("num_attention_heads", default=12)
    kv, hd = v.integer("num_key_value_heads", default=heads), v.integer("head_dim", default=64)
    patch, table = v.integer("patch_size", default=16), v.integer("position_embedding_size", default=10240)
    bias = v.flag("attention_bias", default=False)
    attn = 2 * hv * heads * hd + 2 * hv * kv * hd + (heads * hd + 2 * kv * hd + hv) * bias + 2 * hd
    layer = attn + 3 * hv * fv + 4 * hv
    return 2 * table * hv + hv * 3 * patch * patch + layers * layer


def _gemma4(k: _Keys) -> dict[str, Any]:
    """Gemma4ForConditionalGeneration: gemma4_text language model, Gemma4VisionModel, and embed_vision (a
    bias-free vision-to-text projection); vision_soft_tokens_per_image (280) tokens per image. Audio towers are
    not supported."""
    if k.config.get("audio_config") is not None:
        raise _Unsupported("gemma4 with an audio tower")
    f = _gemma4_text(k.sub("text_config"))
    f["tied_embeddings"] = k.flag("tie_word_embeddings", default=f["tied_embeddings"])
    if k.config.get("vision_config") is not None:
        vision = k.sub("vision_config")
        hv = vision.integer("hidden_size", default=768)
        tokens = k.integer("vision_soft_tokens_per_image", default=280, maximum=1_000_000)
        f.update(vision_params=_gemma4_vision(vision) + hv * f["hidden_size"], vision_tokens_per_image=tokens,
                 vision=_gemma4_tower(vision, tokens))
    return f


def _gemma4_tower(v: _Keys, tokens: int) -> VisionTower:
    """The activation shape of Gemma4VisionModel (transformers 5.24): the image processor
    (image_processing_gemma4.py) resizes an image to at most ``tokens`` x pooling_kernel_size^2 patches and pads it
    to that count, so every image is that many patches of 3 x patch_size^2 pixels; Gemma4VisionPooler averages
    kernel^2 patches into one token (merge_size = the kernel). Every block attends over the whole image, with
    head_dim-wide heads and num_key_value_heads key/value heads (Gemma4VisionConfig defaults: 768 wide, 12 heads
    of 64, 16 layers, MLP 3072, patch 16, kernel 3)."""
    hv = v.integer("hidden_size", default=768, maximum=1_000_000)
    heads = v.integer("num_attention_heads", default=12, maximum=10_000)
    kv = v.integer("num_key_value_heads", default=heads, maximum=10_000)
    if heads % kv:
        raise ValueError(f"config.json key 'vision_config.num_key_value_heads' ({kv}) must divide "
                         f"num_attention_heads ({heads})")
    kernel = v.integer("pooling_kernel_size", default=3, maximum=64)
    patch = v.integer("patch_size", default=16, maximum=1000)
    layers = v.integer("num_hidden_layers", default=16, maximum=1000)
    patches = tokens * kernel * kernel
    if patches > 100_000_000:
        raise ValueError(f"config.json keys 'vision_soft_tokens_per_image' x 'vision_config.pooling_kernel_size'^2 "
                         f"give {patches} patches per image; at most 100000000 is accepted")
    return VisionTower(family="gemma4", layers=layers, hidden_size=hv, heads=heads,
                       ffn_size=v.integer("intermediate_size", default=3072, maximum=10_000_000),
                       patch_input_size=3 * patch * patch, patches_per_image=patches, merge_size=kernel,
                       full_attention_layers=layers, window_patches=patches,
                       head_dim=v.integer("head_dim", default=64, maximum=100_000), kv_heads=kv)


def _phi3(k: _Keys) -> dict[str, Any]:
    """Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4): fused qkv_proj and gate_up_proj, no biases, untied."""
    f = _common(k, tied=False, positions=4096, kv_default=None, head_dim_default=None, vocab_default=32064)
    f.update(fused_qkv=True, fused_gate_up=True,
             dropout=k.any_dropout("attention_dropout", "resid_pdrop", "embd_pdrop"))
    return f


def _deepseek(k: _Keys) -> dict[str, Any]:
    """DeepseekV2ForCausalLM / DeepseekV3ForCausalLM. MLA attention (DeepseekV3Attention): q_a_proj h x q_lora_rank
    + q_a_layernorm + q_b_proj (q_lora_rank x n_heads*(qk_nope+qk_rope)), or a full q_proj when q_lora_rank is
    null (DeepSeek-V2-Lite); kv_a_proj_with_mqa h x (kv_lora_rank + qk_rope) + kv_a_layernorm; kv_b_proj
    kv_lora_rank x n_heads*(qk_nope + v_head_dim); o_proj n_heads*v_head_dim x h. Layers from
    first_k_dense_replace on are MoE: router Linear(h, E) (V3's e_score_correction_bias is a buffer), fused experts
    of moe_intermediate_size, shared experts as one MLP n_shared_experts * moe_intermediate_size wide; the first
    layers a dense MLP of intermediate_size. The multi-token-prediction layer (num_nextn_predict_layers) is not
    built by transformers and not counted."""
    v3 = k.model_type == "deepseek_v3"
    f = _common(k, tied=False, positions=4096 if v3 else 2048, kv_default=None, head_dim_default=None,
                vocab_default=129280 if v3 else 102400)
    nope, rope = k.integer("qk_nope_head_dim", default=128), k.integer("qk_rope_head_dim", default=64)
    bias = k.flag("attention_bias", default=False)
    n = f["n_layers"]
    experts = k.integer("n_routed_experts", default=256 if v3 else 64)
    first = k.integer("first_k_dense_replace", default=3 if v3 else 0, minimum=0, maximum=n)
    moe = n - first if experts > 1 else 0
    f.update(
        n_kv_heads=None, head_dim=nope + rope, qk_rope_head_dim=rope,
        q_lora_rank=k.optional_integer("q_lora_rank", 1536), kv_lora_rank=k.integer("kv_lora_rank", default=512),
        v_head_dim=k.integer("v_head_dim", default=128), qkv_bias=bias, out_bias=bias,
        dense_ffn_size=f["ffn_size"], ffn_size=k.integer("moe_intermediate_size", default=2048 if v3 else 1407),
    )
    if moe:
        shared = k.integer("n_shared_experts", default=1 if v3 else 2, minimum=0)
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=8 if v3 else _MISSING),
                 fused_experts=True, moe_layers=moe, shared_expert_ffn_size=shared * f["ffn_size"],
                 # DeepseekV2TopkRouter never renormalises; DeepseekV3TopkRouter does with norm_topk_prob
                 router_norm_topk=v3 and k.flag("norm_topk_prob", default=True))
        if v3:  # DeepseekV3TopkRouter: group-limited top-k (transformers 5.24 config defaults n_group 8, topk_group 4)
            groups = k.integer("n_group", default=8)
            f.update(router_groups=groups, router_top_groups=k.integer("topk_group", default=min(4, groups),
                                                                       maximum=groups))
    return f


def _llama4_text(k: _Keys) -> dict[str, Any]:
    """Llama4ForCausalLM (llama4_text): Llama attention (use_qk_norm is a parameter-free L2 norm); MoE layers
    (moe_layers, else every interleave_moe_layer_step-th) hold Llama4TextMoe: router Linear(h, E), fused experts
    and a shared expert, both intermediate_size wide; the other layers a dense MLP of intermediate_size_mlp."""
    f = _common(k, tied=False, positions=131072, kv_default=8, head_dim_default=128, vocab_default=202048)
    n = f["n_layers"]
    bias = k.flag("attention_bias", default=False)
    step = k.integer("interleave_moe_layer_step", default=1)
    layers = k.index_list("moe_layers", n, default=list(range(step - 1, n, step)))
    experts = k.integer("num_local_experts", default=16)
    # no_rope_layers: 1 = the layer uses rope (and the L2 q/k norm), 0 = NoPE; default every
    # no_rope_layer_interval-th layer is NoPE (Llama4TextConfig.__post_init__, transformers 5.24)
    rope = k.config.get("no_rope_layers")
    if not rope:  # null or [] take the default, as Llama4TextConfig does
        interval = k.integer("no_rope_layer_interval", default=4)
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    elif not isinstance(rope, list) or len(rope) != n or not all(
            isinstance(v, int) and not isinstance(v, bool) and v in (0, 1) for v in rope):
        raise ValueError(f"config.json key 'no_rope_layers' must be a list of {n} entries, each 0 or 1 "
                         f"(got {_short(rope)})")
    f.update(qkv_bias=bias, out_bias=bias, dense_ffn_size=k.integer("intermediate_size_mlp", default=16384),
             qk_norm="l2" if k.flag("use_qk_norm", default=True) else "none", nope_layers=rope.count(0))
    if experts > 1 and layers:
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=1),
                 fused_experts=True, moe_layers=len(set(layers)), shared_expert_ffn_size=f["ffn_size"])
    return f


def _llama4(k: _Keys) -> dict[str, Any]:
    """Llama4ForConditionalGeneration: llama4_text language model; Llama4VisionModel = class embedding, learned
    positions ((image_size/p)^2 + 1 rows), a bias-free patch Linear (hv x 3*p*p), pre/post LayerNorms, layers of
    biased q/k/v/o, biased fc1/fc2 and two biased LayerNorms, the pixel-shuffle adapter (bias-free
    intermediate_size x projector_input_dim and projector_output_dim^2); Llama4MultiModalProjector
    vision_output_dim x text hidden (bias with multi_modal_projector_bias). Image tokens: one 448-pixel tile is
    (image_size/p)^2 * pixel_shuffle_ratio^2 = 256 tokens; one tile per image assumed."""
    f = _llama4_text(k.sub("text_config"))
    f["tied_embeddings"] = k.flag("tie_word_embeddings", default=f["tied_embeddings"])
    v = k.sub("vision_config")
    hv, fv = v.integer("hidden_size", default=768), v.integer("intermediate_size", default=5632)
    layers, ch = v.integer("num_hidden_layers", default=34, maximum=1000), v.integer("num_channels", default=3)
    image, patch = v.integer("image_size", default=448), v.integer("patch_size", default=14)
    pin, pout = v.integer("projector_input_dim", default=4096), v.integer("projector_output_dim", default=4096)
    out = v.integer("vision_output_dim", default=7680)
    ratio = v.config.get("pixel_shuffle_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise ValueError(f"config.json key 'vision_config.pixel_shuffle_ratio' must be in (0, 1] (got {_short(ratio)})")
    grid = (image // patch) ** 2
    layer = 4 * hv * hv + 4 * hv + 2 * hv * fv + fv + hv + 4 * hv
    tower = hv + (grid + 1) * hv + hv * ch * patch * patch + 4 * hv + layers * layer + fv * pin + pout * pout
    projector = out * f["hidden_size"] + f["hidden_size"] * v.flag("multi_modal_projector_bias", default=False)
    f.update(vision_params=tower + projector, vision_tokens_per_image=int(grid * ratio * ratio))
    f["vision"] = _llama4_tower(v, hv, fv, layers, ch, image // patch, patch, ratio, pin, pout, out)
    return f


def _llama4_tower(v: _Keys, hv: int, fv: int, layers: int, ch: int, side: int, patch: int, ratio: float,
                  pin: int, pout: int, out: int) -> VisionTower:
    """The activation shape of Llama4VisionModel (transformers 5.24 modeling_llama4.py): one image_size tile of
    side^2 patches plus the class token through every block; pixel_shuffle folds (1/ratio)^2 patches into one
    token (merge_size = 1/ratio) whose 4·hidden_size channels Llama4VisionMLP2's fc1 reads; fc2 is
    projector_output_dim square and Llama4MultiModalProjector reads vision_output_dim. transformers fails at the
    first forward when those widths do not chain, so such a vision_config is refused here, naming the keys."""
    heads = v.integer("num_attention_heads", default=16, maximum=10_000)
    if hv % heads:
        raise ValueError(f"config.json key 'vision_config.num_attention_heads' ({heads}) must divide the tower "
                         f"width {hv}")
    merge = round(1 / ratio)
    if abs(merge * ratio - 1) > 1e-9 or side % merge:
        raise ValueError(f"config.json key 'vision_config.pixel_shuffle_ratio' ({ratio}) must be 1/m for a whole m "
                         f"dividing the patch grid side image_size / patch_size = {side}")
    if fv != hv * merge * merge:
        raise ValueError(f"config.json key 'vision_config.intermediate_size' ({fv}) must be hidden_size / "
                         f"pixel_shuffle_ratio^2 = {hv * merge * merge} (the adapter's fc1 reads the shuffled "
                         f"channels)")
    if not pin == pout == out:
        raise ValueError(f"config.json keys 'vision_config.projector_input_dim', 'projector_output_dim' and "
                         f"'vision_output_dim' must be equal (got {pin}, {pout}, {out}): fc2 is square and the "
                         f"projector reads its output")
    if ch * patch * patch > 10_000_000 or side * side > 100_000_000:
        raise ValueError("config.json 'vision_config' gives num_channels x patch_size^2 above 10000000 or more than "
                         "100000000 patches")
    return VisionTower(family="llama4", layers=layers, hidden_size=hv, heads=heads, ffn_size=fv,
                       patch_input_size=ch * patch * patch, patches_per_image=side * side, merge_size=merge,
                       full_attention_layers=layers, window_patches=side * side, class_tokens=1, adapter_size=pin)


def _gpt_oss(k: _Keys) -> dict[str, Any]:
    """GptOssForCausalLM: attention with biases on q, k, v and o and a learned sink logit per head
    (self_attn.sinks); every layer MoE: GptOssTopKRouter Linear(h, E) with bias, GptOssExperts with biases
    (gate_up_proj (E, h, 2f) + bias, down_proj (E, f, h) + bias). Sliding-window layers alternate
    (``layer_types``). The mxfp4 experts of the checkpoint are logical parameters, trained in bf16."""
    f = _common(k, tied=False, positions=131072, kv_default=8, head_dim_default=64, vocab_default=201088)
    bias = k.flag("attention_bias", default=True)
    f.update(
        qkv_bias=bias, out_bias=bias, mlp_bias=True, router_bias=True, layer_extra_params=f["n_heads"],
        n_experts=k.integer("num_local_experts", default=128), experts_per_token=k.integer("num_experts_per_tok",
                                                                                            default=4),
        fused_experts=True, **_sliding(k, f["n_layers"], lambda i: i % 2 == 0, 128),
    )
    return f


def _glm4(k: _Keys) -> dict[str, Any]:
    """Glm4ForCausalLM: q, k, v biased by attention_bias (o never), fused gate_up_proj, four norms per layer
    (input, post_self_attn, post_attention, post_mlp), head_dim 128 by default."""
    f = _common(k, tied=False, positions=131072, kv_default=2, head_dim_default=128, vocab_default=151552)
    f.update(norms_per_layer=4, fused_gate_up=True, qkv_bias=k.flag("attention_bias", default=True),
             rotary_fraction=_rotary_fraction(k, 0.5))
    return f


def _rotary_fraction(k: _Keys, default: float) -> float:
    """partial_rotary_factor (top level, as GLM-4 configs spell it; Glm4Config / Glm4MoeConfig default 0.5)."""
    value = k.probability("partial_rotary_factor", default=default)
    if value <= 0.0:
        raise ValueError(f"config.json key 'partial_rotary_factor' must be in (0, 1] (got {value!r})")
    return value


def _glm4_moe(k: _Keys) -> dict[str, Any]:
    """Glm4MoeForCausalLM: q, k, v biased by attention_bias (o never), optional q/k norms (use_qk_norm); layers
    from first_k_dense_replace on are MoE as DeepSeek-V3 (router Linear(h, E), fused experts, shared experts
    n_shared_experts * moe_intermediate_size), the first a dense MLP of intermediate_size."""
    f = _common(k, tied=False, positions=131072, kv_default=8, head_dim_default=None, vocab_default=151552)
    n = f["n_layers"]
    experts = k.integer("n_routed_experts", default=128)
    first = k.integer("first_k_dense_replace", default=1, minimum=0, maximum=n)
    f.update(qkv_bias=k.flag("attention_bias", default=False), rotary_fraction=_rotary_fraction(k, 0.5),
             qk_norm="head" if k.flag("use_qk_norm", default=False) else "none",
             dense_ffn_size=f["ffn_size"], ffn_size=k.integer("moe_intermediate_size", default=1408))
    if experts > 1 and n > first:
        shared = k.integer("n_shared_experts", default=1, minimum=0)
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=8), fused_experts=True,
                 moe_layers=n - first, shared_expert_ffn_size=shared * f["ffn_size"],
                 router_norm_topk=k.flag("norm_topk_prob", default=True))
        groups = k.integer("n_group", default=1)
        f.update(router_groups=groups, router_top_groups=k.integer("topk_group", default=1, maximum=groups))
    return f


def _olmo2(k: _Keys) -> dict[str, Any]:
    """Olmo2ForCausalLM: q_norm over n_heads*head_dim and k_norm over n_kv_heads*head_dim, norms after attention
    and MLP (post_attention_layernorm, post_feedforward_layernorm), attention_bias on q, k, v and o."""
    f = _common(k, tied=False, positions=2048, kv_default=None, head_dim_default=None, vocab_default=50304)
    bias = k.flag("attention_bias", default=False)
    f.update(qk_norm="full", qkv_bias=bias, out_bias=bias)
    return f


def _qwen2_vl_text(k: _Keys) -> dict[str, Any]:
    """The Qwen2 language model of Qwen2-VL / Qwen2.5-VL: its keys in ``text_config`` (transformers 5 layout) or
    at the top level (the released files); q, k, v biased, o not."""
    text = k.sub("text_config") if isinstance(k.config.get("text_config"), Mapping) else k
    f = _common(text, tied=False, positions=32768, kv_default=8, head_dim_default=None, vocab_default=152064)
    f["tied_embeddings"] = k.flag("tie_word_embeddings", default=text.flag("tie_word_embeddings", default=False))
    f.update(qkv_bias=True)
    return f


_QWEN_VL_IMAGE_PIXELS = 448
"""Side of the square image the Qwen-VL readers assume (pixels): Qwen2-VL's processor resizes to multiples of
patch_size x spatial_merge_size (28), so a 448x448 image is (448/28)^2 = 256 tokens (Qwen2-VL paper, arXiv
2409.12191 Sec. 2.1: a 224x224 image is 66 tokens including the two vision markers) of (448/14)^2 = 1024 patches."""


def _qwen_vl_tower(k: _Keys, width_key: str, width_default: int, out_key: str):
    """What Qwen2-VL's and Qwen2.5-VL's vision towers share: the language model's fields, the vision_config keys,
    the tower width e and depth, the bias-free Conv3d patch embedding's parameters (e x channels x temporal_patch x
    p x p), the spatial merge size m and the merger's output width, and the tower's activation shape fields
    (:class:`zeroplanner.specs.VisionTower` without the attention layout) for a :data:`_QWEN_VL_IMAGE_PIXELS`
    square image."""
    f = _qwen2_vl_text(k)
    v = k.sub("vision_config")
    e, depth = v.integer(width_key, default=width_default), v.integer("depth", default=32, maximum=1000)
    ch = v.integer("in_channels", "in_chans", default=3)
    p, t, m = v.integer("patch_size", default=14), v.integer("temporal_patch_size", default=2), \
        v.integer("spatial_merge_size", default=2)
    out = v.integer(out_key, default=f["hidden_size"])
    heads = v.integer("num_heads", default=16)
    if e % heads:
        raise ValueError(f"config.json key 'vision_config.num_heads' ({heads}) must divide the tower width {e}")
    side = _QWEN_VL_IMAGE_PIXELS // (p * m)  # merged tokens per image side
    if side < 1:
        raise ValueError(f"config.json keys 'vision_config.patch_size' x 'spatial_merge_size' ({p} x {m}) exceed "
                         f"the {_QWEN_VL_IMAGE_PIXELS}-pixel image assumed")
    for what, value, limit in (("the tower width", e, 1_000_000), ("in_channels x temporal_patch_size x "
                                                                   "patch_size^2", ch * t * p * p, 10_000_000)):
        if value > limit:
            raise ValueError(f"config.json 'vision_config' gives {what} = {value}; at most {limit} is accepted")
    shape = dict(layers=depth, hidden_size=e, heads=heads, patch_input_size=ch * t * p * p,
                 patches_per_image=(side * m) ** 2, merge_size=m)
    f["vision_tokens_per_image"] = side * side
    return f, v, e, depth, e * ch * t * p * p, m, out, shape


def _qwen2_vl(k: _Keys) -> dict[str, Any]:
    """Qwen2VLForConditionalGeneration: Qwen2VisionTransformerPretrainedModel = bias-free Conv3d patch embedding
    (embed_dim x 3 x temporal_patch x p x p), depth blocks of two biased LayerNorms, biased qkv and proj,
    biased fc1/fc2 (mlp_ratio * embed_dim), and PatchMerger (LayerNorm, Linear(m^2 e, m^2 e), Linear(m^2 e, h)
    with biases, m = spatial_merge_size). Every block attends over the whole image. Image tokens: (H/28)*(W/28);
    256 (a 448x448 image) assumed."""
    f, v, e, depth, patch, m, out, shape = _qwen_vl_tower(k, "embed_dim", 1280, "hidden_size")
    fm = v.integer("mlp_ratio", default=4, maximum=1000) * e
    block = 4 * e + 3 * e * e + 3 * e + e * e + e + 2 * e * fm + fm + e
    merger = 2 * e + (m * m * e) ** 2 + m * m * e + m * m * e * out + out
    vision = VisionTower(family="qwen2_vl", ffn_size=fm, full_attention_layers=depth,
                         window_patches=shape["patches_per_image"], **shape)
    f.update(vision_params=patch + depth * block + merger, vision=vision)
    return f


def _qwen2_5_vl(k: _Keys) -> dict[str, Any]:
    """Qwen2_5_VLForConditionalGeneration: Qwen2.5-VL vision tower = Qwen2-VL's with RMSNorms (weight only),
    a biased SwiGLU MLP of intermediate_size, width hidden_size, and a merger (RMSNorm ln_q, two biased Linears)
    into out_hidden_size. Blocks in fullatt_block_indexes (default [7, 15, 23, 31]) attend over the whole image,
    the others within windows of window_size pixels (default 112: (112/14)^2 = 64 patches; transformers 5.24
    vision_utils.get_vision_window_index). Image tokens as Qwen2-VL (256 assumed)."""
    f, v, e, depth, patch, m, out, shape = _qwen_vl_tower(k, "hidden_size", 3584, "out_hidden_size")
    fv = v.integer("intermediate_size", default=3420, maximum=10_000_000)
    block = 2 * e + 3 * e * e + 3 * e + e * e + e + 3 * e * fv + 2 * fv + e
    merger = e + (m * m * e) ** 2 + m * m * e + m * m * e * out + out
    p = v.integer("patch_size", default=14)
    window_side = v.integer("window_size", default=112) // m // p * m  # patches per window side
    if window_side < 1:
        raise ValueError(f"config.json key 'vision_config.window_size' must be at least patch_size x "
                         f"spatial_merge_size = {p * m} pixels")
    full = v.index_list("fullatt_block_indexes", depth, default=[i for i in (7, 15, 23, 31) if i < depth])
    vision = VisionTower(family="qwen2_5_vl", ffn_size=fv, full_attention_layers=len(set(full)),
                         window_patches=min(window_side ** 2, shape["patches_per_image"]), **shape)
    f.update(vision_params=patch + depth * block + merger, vision=vision)
    return f


_NEMOTRON_BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_NEMOTRON_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                   "moe": "E"}


def _nemotron_h(k: _Keys) -> dict[str, Any]:
    """NemotronHForCausalLM: one RMSNorm and one mixer per block, the blocks given by hybrid_override_pattern
    (M Mamba-2, * attention, - MLP, E MoE) or layers_block_type. Mamba-2 (NemotronHMamba2Mixer, d_inner =
    mamba_num_heads * mamba_head_dim, conv width d_inner + 2*n_groups*ssm_state_size): in_proj
    h x (d_inner + conv + heads) (+bias with use_bias), conv1d conv x kernel (+bias with use_conv_bias),
    dt_bias, A_log, D (heads each), a gated RMSNorm over d_inner, out_proj d_inner x h (+bias). MLP and experts
    are two-matrix (relu^2) of intermediate_size / moe_intermediate_size; MoE has a router Linear(h, E) (its
    e_score_correction_bias is a buffer) and a shared expert of moe_shared_expert_intermediate_size. Latent MoE
    (moe_latent_size) is not supported."""
    if k.config.get("moe_latent_size") is not None:
        raise _Unsupported("nemotron_h with moe_latent_size")
    pattern = k.config.get("hybrid_override_pattern")
    if pattern is not None:
        pattern = k.string("hybrid_override_pattern")
        if not pattern or any(c not in _NEMOTRON_BLOCKS for c in pattern) or len(pattern) > 1000:
            raise ValueError(f"config.json key 'hybrid_override_pattern' must be 1-1000 of M * - E (got "
                             f"{_short(pattern)})")
    else:
        types = k.string_list("layers_block_type", tuple(_NEMOTRON_TYPES)) or \
            k.string_list("layer_types", tuple(_NEMOTRON_TYPES))
        if not types:
            raise ValueError("config.json for model_type 'nemotron_h' lacks required key 'hybrid_override_pattern'")
        pattern = "".join(_NEMOTRON_TYPES[t] for t in types)
    n = len(pattern)
    h, heads = k.integer("hidden_size"), k.integer("num_attention_heads")
    mh, md = k.integer("mamba_num_heads", default=128), k.integer("mamba_head_dim", default=64)
    groups, state = k.integer("n_groups", default=8), k.integer("ssm_state_size", default=128)
    kernel = k.integer("conv_kernel", default=4)
    proj_bias, conv_bias = k.flag("use_bias", default=False), k.flag("use_conv_bias", default=True)
    inner = mh * md
    conv = inner + 2 * groups * state
    in_proj = h * (inner + conv + mh) + (inner + conv + mh) * proj_bias
    out_proj = inner * h + h * proj_bias
    mamba = in_proj + conv * kernel + conv * conv_bias + 3 * mh + inner + out_proj
    experts = k.integer("n_routed_experts", default=8)
    moe = pattern.count("E")
    f = dict(
        n_layers=n, hidden_size=h, n_heads=heads, n_kv_heads=k.integer("num_key_value_heads", default=8),
        head_dim=k.integer("head_dim", default=128), ffn_size=k.integer("moe_intermediate_size", default=7688),
        dense_ffn_size=k.integer("intermediate_size", default=21504), ffn_kind="gelu",
        vocab_size=k.integer("vocab_size", default=131072),
        tied_embeddings=k.flag("tie_word_embeddings", default=False), norm_kind="rmsnorm", norms_per_layer=1,
        final_norm=True, max_position_embeddings=k.integer("max_position_embeddings", default=4096),
        qkv_bias=k.flag("attention_bias", default=False), out_bias=k.flag("attention_bias", default=False),
        mlp_bias=k.flag("mlp_bias", default=False), attention_layers=pattern.count("*"),
        other_mixer_params=pattern.count("M") * mamba,
        other_mixer_largest_module=max(in_proj, out_proj) if "M" in pattern else 0,
        linear_mixer=LinearMixer(kind="mamba2", layers=pattern.count("M"), key_heads=groups, key_head_dim=state,
                                 value_heads=mh, value_head_dim=md, conv_kernel=kernel) if "M" in pattern else None,
        dense_mlp_layers=pattern.count("-"), moe_layers=moe if experts > 1 else 0,
        dropout=k.any_dropout("attention_dropout", "hidden_dropout"),
    )
    if moe and experts > 1:
        f.update(n_experts=experts, experts_per_token=k.integer("num_experts_per_tok", default=2), fused_experts=True,
                 router_groups=k.integer("n_group", default=1), router_top_groups=k.integer("topk_group", default=1),
                 router_norm_topk=k.flag("norm_topk_prob", default=True),
                 shared_expert_ffn_size=k.integer("moe_shared_expert_intermediate_size", default=7688, minimum=0)
                 if k.integer("n_shared_experts", default=1, minimum=0) else 0)
    return f


class _Unsupported(ValueError):
    """A known family in a variant the built-in reader does not count (transformers may, when installed)."""


_MODERN: dict[str, Callable[[_Keys], dict[str, Any]]] = {
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "qwen3_next": _qwen3_next,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3,
    "gemma4_text": _gemma4_text,
    "gemma4": _gemma4,
    "phi3": _phi3,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "llama4_text": _llama4_text,
    "llama4": _llama4,
    "gpt_oss": _gpt_oss,
    "glm4": _glm4,
    "glm4_moe": _glm4_moe,
    "olmo2": _olmo2,
    "qwen2_vl": _qwen2_vl,
    "qwen2_5_vl": _qwen2_5_vl,
    "nemotron_h": _nemotron_h,
}


SUPPORTED_MODEL_TYPES: tuple[str, ...] = (*_FAMILIES, *_MODERN)
"""HF ``model_type`` values this reader understands."""


def too_large_message(name: str, size: int) -> str:
    """The size-limit refusal of a config.json of ``size`` bytes called ``name``, in the words of the CLI's
    ``--hf-config`` (``zeroplanner: error: --hf-config: 'big.json' is 12000000 bytes; the limit is 1000000 bytes``,
    :func:`zeroplanner.files.read_regular_file`'s size message after the path). The planner page says the same,
    both in the kernel (:func:`read_hf_config_bytes`) and in the browser before a file is sent (the page template's
    upload-limit script, which quotes the name the way ``repr`` does for a plain file name)."""
    return f"{name!r} is {int(size)} bytes; the limit is {MAX_CONFIG_BYTES} bytes"


_PARSE_DEPTH_GUARD = 200
"""Nesting refused before parsing (``json.loads`` recurses once per level; Python's limit is 1000 frames). Text
nested between :data:`MAX_CONFIG_DEPTH` and this is parsed, and :func:`check_config_structure` names the key path
that goes too deep; either way the message names :data:`MAX_CONFIG_DEPTH`."""


def read_hf_config_bytes(raw: bytes | str, name: str) -> dict[str, Any]:
    """The dict in a config.json's bytes (or text), read with this module's limits; ``name`` (a path or a file
    name) is quoted in the messages. The one reader of config.json content: :func:`load_hf_config` (the CLI's and
    the API's files) and the planner page's upload and paste box use it.

    Raises ``ValueError``: more than :data:`MAX_CONFIG_BYTES` bytes (:func:`too_large_message`), empty, not UTF-8,
    nested deeper than :data:`MAX_CONFIG_DEPTH` levels (text nested hundreds deep is refused before parsing), not JSON (NaN/Infinity
    included), not a JSON object, or a structure :func:`check_config_structure` refuses.
    """
    data_bytes = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if len(data_bytes) > MAX_CONFIG_BYTES:
        raise ValueError(too_large_message(name, len(data_bytes)))
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"HF config {name!r} is not UTF-8 text: {exc}") from None
    if not text.strip():
        raise ValueError(f"HF config {name!r} is empty")
    if nesting_over(text, _PARSE_DEPTH_GUARD):
        raise ValueError(f"HF config {name!r} is nested deeper than {MAX_CONFIG_DEPTH} levels")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:  # pragma: no cover - the nesting check above refuses such text first
        raise ValueError(f"HF config {name!r} is nested deeper than {MAX_CONFIG_DEPTH} levels") from None
    except ValueError as exc:  # json.JSONDecodeError, or a NaN/Infinity constant
        raise ValueError(f"HF config {name!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"HF config {name!r} must hold a JSON object, not {type(data).__name__}")
    check_config_structure(data)
    return data


def load_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a ``config.json`` file (or the ``config.json`` inside a directory) into a dict.

    Read with :func:`zeroplanner.files.read_regular_file`: only a regular file (symlinks followed), at most
    :data:`MAX_CONFIG_BYTES` (1 MB) read, then parsed by :func:`read_hf_config_bytes`. Raises ``ValueError`` if the
    file is missing or unreadable, is not a regular file (a FIFO, device, socket; a directory without a
    ``config.json``: :class:`~zeroplanner.files.InputFileError`, a ``ValueError``), is larger than
    :data:`MAX_CONFIG_BYTES`, is not UTF-8 JSON, nests deeper than :data:`MAX_CONFIG_DEPTH`, or is not a JSON object.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "config.json"
    raw = read_regular_file(p, MAX_CONFIG_BYTES, "HF config")
    return read_hf_config_bytes(raw, str(p))


def check_config_structure(data: Mapping[str, Any]) -> None:
    """Refuse a config nested deeper than :data:`MAX_CONFIG_DEPTH`, with more than 100,000 values, non-string
    keys or non-JSON values; the message names the key path. Iterative (no recursion on hostile input)."""
    stack: list[tuple[str, Any, int]] = [("", data, 0)]
    seen = 0
    while stack:
        path, value, depth = stack.pop()
        seen += 1
        if seen > 100_000:
            raise ValueError("HF config holds more than 100000 values")
        if isinstance(value, Mapping):
            if depth >= MAX_CONFIG_DEPTH:
                raise ValueError(f"HF config key {path!r} is nested deeper than {MAX_CONFIG_DEPTH} levels")
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"HF config key {_short(key)} under {path or 'the top level'!r} is not a string")
                stack.append((f"{path}.{key}" if path else key, item, depth + 1))
        elif isinstance(value, (list, tuple)):
            if depth >= MAX_CONFIG_DEPTH:
                raise ValueError(f"HF config key {path!r} is nested deeper than {MAX_CONFIG_DEPTH} levels")
            stack.extend((f"{path}[{i}]", item, depth + 1) for i, item in enumerate(value))
        elif not (value is None or isinstance(value, (str, int, float, bool))):
            raise ValueError(f"HF config key {path!r} holds a {type(value).__name__}, not a JSON value")


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name} is not allowed")


def name_from_path(path: str | os.PathLike[str]) -> str:
    """The model name a config file's path gives: the folder of a ``config.json`` (a hub snapshot or a
    ``save_pretrained`` folder names the model), otherwise the file's stem (``deepseek-v3.json`` ->
    ``deepseek-v3``); at most 200 characters, "" when the path names nothing."""
    p = pathlib.Path(path)
    if p.is_dir() or p.name == "config.json":
        folder = p if p.is_dir() else p.parent
        return folder.resolve().name[:200]
    return p.stem[:200]


def _default_name(config: Mapping[str, Any], path: pathlib.Path | None, model_type: str) -> str:
    candidate = config.get("_name_or_path")
    if isinstance(candidate, str) and candidate.strip():
        return candidate.strip()[:200]
    if path is not None:
        return name_from_path(path) or model_type
    return f"{model_type}-custom"


def architecture_from_hf_config(
    config: Mapping[str, Any] | str | os.PathLike[str], name: str | None = None, *, use_transformers: bool = True
) -> Architecture:
    """Build an :class:`Architecture` from a HF ``config.json`` (a dict, or a path to the file or its directory).

    Supported ``model_type`` values: :data:`SUPPORTED_MODEL_TYPES` (llama, mistral, qwen2, mixtral, gpt2,
    gpt_neox, bloom, opt, falcon, and the 2024-26 families qwen3, qwen3_moe, qwen3_next, gemma2, gemma3(_text),
    gemma4(_text), phi3, deepseek_v2, deepseek_v3, llama4_text, gpt_oss, glm4, glm4_moe, olmo2, qwen2_vl,
    qwen2_5_vl, nemotron_h). Any other ``model_type`` (or a variant the reader does not count) is built by
    ``transformers`` on the meta device when it is installed and ``use_transformers`` is true (the 'hf' extra;
    :mod:`zeroplanner.catalog._hf_meta`, no remote code). ``name`` defaults to ``_name_or_path``, else the file's
    directory name.

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

    if path is None:
        check_config_structure(data)
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type or len(model_type) > 100:
        raise ValueError(
            f"HF config lacks a string 'model_type'; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family = _FAMILIES.get(model_type)
    try:
        if family is not None:
            fields = _read(_Keys(data, model_type), family)
        elif model_type in _MODERN:
            fields = _MODERN[model_type](_Keys(data, model_type))
        else:
            raise _Unsupported(f"model_type {model_type!r}")
    except _Unsupported as exc:
        if not use_transformers or importlib.util.find_spec("transformers") is None:
            raise ValueError(
                f"HF config {exc} is not supported by the built-in reader; supported: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}. Any architecture transformers knows is read when the 'hf' "
                f"extra is installed (pip install 'zeroplanner[hf]')"
            ) from None
        from ._hf_meta import architecture_from_transformers

        label = name if name is not None else _default_name(data, path, model_type)
        arch = architecture_from_transformers(data, label, str(path) if path is not None else "dict")
        return arch.model_copy(update={"source": _source_with_auto_map_note(arch.source, data)})
    fields = {key: value for key, value in fields.items() if value is not None}
    hidden, heads = fields["hidden_size"], fields["n_heads"]
    if "head_dim" not in fields and hidden % heads:
        raise ValueError(f"config.json: hidden size {hidden} is not divisible by num_attention_heads {heads}")
    label = name if name is not None else _default_name(data, path, model_type)
    source = f"HF config.json ({path})" if path is not None else "HF config.json (dict)"
    quant = data.get("quantization_config")
    if isinstance(quant, Mapping):
        method = quant.get("quant_method")
        method = method[:20] if isinstance(method, str) else "quantised"
        # fp8 (DeepSeek-V3) and mxfp4 (gpt-oss) checkpoints: ZeRO fine-tuning loads them dequantised
        source += f"; {method} checkpoint: logical parameters, trained in the TrainingSpec precision (bf16 assumed)"
    return Architecture(name=label, family=model_type, source=_source_with_auto_map_note(source, data), **fields)


AUTO_MAP_NOTE = "auto_map (custom code) ignored, never run"
"""Said in an Architecture's ``source`` when its config.json names custom code in ``auto_map``."""


def _source_with_auto_map_note(source: str, data: Mapping[str, Any]) -> str:
    """``source`` cut to Architecture's 500 characters, ending with :data:`AUTO_MAP_NOTE` for a config.json with an
    ``auto_map`` (the note is kept whole: the answers look for it): the custom classes it names are never imported;
    the model is priced as the built-in (or transformers') ``model_type``, which the custom code may differ from."""
    note = f"; {AUTO_MAP_NOTE}: priced as {str(data.get('model_type'))[:50]}" if data.get("auto_map") else ""
    return source[:500 - len(note)] + note
