"""Frozen, validated inputs: model architecture, cluster, training setup, ZeRO options, and the scenario joining them.

All models are pydantic v2, frozen (a change is ``scenario.model_copy(update=...)`` or :func:`replace`) and
``extra="forbid"``. Invalid values raise ``pydantic.ValidationError`` whose message names the field and the allowed
range; cross-field rules raise ``ValueError`` inside a model validator, which pydantic reports the same way.

ZeRO option names are DeepSpeed's own JSON keys (``deepspeed/runtime/zero/config.py``, DeepSpeed 0.18): the
DeepSpeed config emitted by :mod:`zeroplanner.deepspeed` uses them verbatim.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .units import DTYPE_BYTES, GIB

Precision = Literal["bf16", "fp16", "fp32"]
OptimizerName = Literal["adamw", "adam", "sgd", "adam8bit"]
Checkpointing = Literal["none", "selective", "full"]
OffloadDevice = Literal["none", "cpu", "nvme"]
Accounting = Literal["deepspeed", "paper"]
QuantStorage = Literal["uint8", "bfloat16", "float16"]
QUANT_STORAGE_PRECISION: dict[str, str] = {"bfloat16": "bf16", "float16": "fp16"}
"""bnb_4bit_quant_storage values (transformers BitsAndBytesConfig spelling; float32 is left out: QLoRA here trains
in bf16 or fp16 and DeepSpeed would cast fp32 storage) -> the training precision they must equal."""

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""Canonical names of the linear layers LoRA can target (HF names: q_proj, k_proj, ..., down_proj)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _size_label(parameters: float) -> str:
    """A parameter count as a model name says it: billions to 3 significant digits ("6.74B", "0.5B"), trillions
    from 999.5 billion on ("1T", "1.5T", "1000T" at the top of the range), never in exponent notation ("1e+03B")."""
    billions = parameters / 1e9
    if billions < 999.5:
        return f"{billions:.3g}B"
    trillions = billions / 1e3
    return f"{trillions:.3g}T" if trillions < 999.5 else f"{trillions:.0f}T"


def _field_bound(model: type[BaseModel], field: str, bound: str) -> Any:
    """The ``ge`` / ``le`` / ``gt`` / ``lt`` bound declared on ``model``'s ``field`` (``Field(le=1000)``), so code
    that must stay inside a field's range reads it from the one declaration."""
    for meta in model.model_fields[field].metadata:
        value = getattr(meta, bound, None)
        if value is not None:
            return value
    raise KeyError(f"{model.__name__}.{field} declares no {bound} bound")


class _Frozen(BaseModel):
    model_config = _FROZEN


class Output(BaseModel):
    """Base of every result object (estimates, plans, calibration reports): frozen, no unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ----------------------------------------------------------------------------------------------------------------
# Model architecture
# ----------------------------------------------------------------------------------------------------------------
class VisionTower(_Frozen):
    """The vision encoder's shape, for its own activations (:mod:`zeroplanner.costmodel.vision`): a ViT over the
    patches of each image, then a merger that turns ``merge_size``^2 neighbouring patches into one language-model
    token. Read from ``vision_config`` by :mod:`zeroplanner.catalog.hfconfig` (Qwen2-VL / Qwen2.5-VL:
    transformers 5.24 Qwen2VisionTransformerPretrainedModel / Qwen2_5_VisionTransformerPretrainedModel; Gemma 3:
    SiglipVisionModel and Gemma3MultiModalProjector's average pool, merge_size = its kernel, one crop per image:
    pan-and-scan crops are not priced; Gemma 4: Gemma4VisionModel, whose Gemma4VisionPooler averages
    pooling_kernel_size^2 patches into one token, merge_size = that kernel, patches_per_image the image
    processor's budget vision_soft_tokens_per_image x kernel^2, explicit head_dim and num_key_value_heads;
    Llama 4: Llama4VisionModel over one image_size tile plus its class token, pixel shuffle by
    pixel_shuffle_ratio, merge_size = 1 / ratio)."""

    family: Literal["qwen2_vl", "qwen2_5_vl", "gemma3", "gemma4", "llama4"] = Field(
        description="the tower's layout (HF model_type of the model; gemma3: SigLIP + Gemma3MultiModalProjector; "
        "gemma4: Gemma4VisionModel + Gemma4MultimodalEmbedder; llama4: Llama4VisionModel + "
        "Llama4MultiModalProjector)"
    )
    layers: int = Field(ge=1, le=1000, description="vision blocks (vision_config.depth)")
    hidden_size: int = Field(ge=1, le=1_000_000, description="tower width (Qwen2.5-VL hidden_size, Qwen2-VL embed_dim)")
    heads: int = Field(ge=1, le=10_000, description="attention heads of every block (vision_config.num_heads)")
    ffn_size: int = Field(
        ge=1, le=10_000_000, description="MLP width (Qwen2.5-VL intermediate_size; Qwen2-VL mlp_ratio x embed_dim)"
    )
    patch_input_size: int = Field(
        ge=1, le=10_000_000,
        description="elements the patch embedding reads per patch: in_channels x temporal_patch_size x patch_size^2 "
        "(3 x 2 x 14 x 14 = 1176)",
    )
    patches_per_image: int = Field(
        ge=1, le=100_000_000,
        description="patches of one image: (H/patch_size) x (W/patch_size); 1024 for the 448x448 image "
        "Architecture.vision_tokens_per_image assumes",
    )
    merge_size: int = Field(
        ge=1, le=64, description="spatial_merge_size m: m x m patches become one language-model token"
    )
    full_attention_layers: int = Field(
        ge=0, le=1000,
        description="blocks with attention over the whole image (Qwen2.5-VL fullatt_block_indexes; Qwen2-VL: all); "
        "the others attend within windows of window_patches patches",
    )
    window_patches: int = Field(
        ge=1, le=100_000_000,
        description="patches in one attention window (Qwen2.5-VL (window_size / patch_size)^2 = 64; Qwen2-VL: "
        "the whole image)",
    )
    head_dim: int | None = Field(
        default=None, ge=1, le=100_000,
        description="width of one attention head (Gemma 4 vision_config.head_dim); None = hidden_size // heads",
    )
    kv_heads: int | None = Field(
        default=None, ge=1, le=10_000,
        description="key/value heads (Gemma 4 vision_config.num_key_value_heads); None = heads",
    )
    class_tokens: int = Field(
        default=0, ge=0, le=16,
        description="tokens the blocks carry besides the patches (Llama 4: the class embedding, 1)",
    )
    adapter_size: int | None = Field(
        default=None, ge=1, le=10_000_000,
        description="width of the pixel-shuffle adapter MLP (Llama 4 vision_config.projector_input_dim = "
        "projector_output_dim); None = no such adapter",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> VisionTower:
        if self.head_dim is None and self.hidden_size % self.heads:
            raise ValueError(f"vision hidden_size={self.hidden_size} is not divisible by heads={self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"vision kv_heads={self.kv_heads} does not divide heads={self.heads}")
        if self.patches_per_image % (self.merge_size ** 2):
            raise ValueError(f"vision patches_per_image={self.patches_per_image} is not a multiple of "
                             f"merge_size^2={self.merge_size ** 2}")
        if self.full_attention_layers > self.layers:
            raise ValueError(f"vision full_attention_layers={self.full_attention_layers} exceeds layers={self.layers}")
        return self

    @property
    def head_width(self) -> int:
        """Width of one attention head: head_dim, else hidden_size // heads."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.heads

    @property
    def key_value_heads(self) -> int:
        """Key/value heads: kv_heads, else heads."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def tokens_per_image(self) -> int:
        """Language-model tokens one image becomes: patches_per_image / merge_size^2."""
        return self.patches_per_image // self.merge_size ** 2


class LinearMixer(_Frozen):
    """The token mixer of a hybrid model's non-attention layers, by its widths (for their activations; their
    parameters are counted in ``Architecture.other_mixer_params``).

    - ``gated_deltanet``: Qwen3-Next's Qwen3NextGatedDeltaNet (transformers 5.24 modeling_qwen3_next.py): key_heads
      x key_head_dim queries and keys (linear_num_key_heads, linear_key_head_dim), value_heads x value_head_dim
      values and output gate (linear_num_value_heads, linear_value_head_dim);
    - ``mamba2``: Nemotron-H's NemotronHMamba2Mixer (modeling_nemotron_h.py): value_heads x value_head_dim the
      scanned x (mamba_num_heads, mamba_head_dim; d_inner their product), key_heads x key_head_dim each of B and C
      (n_groups, ssm_state_size), as the queries/keys of the state-space duality (Dao & Gu, arXiv 2405.21060,
      Sec. 5: C, B, x play Q, K, V).
    """

    kind: Literal["gated_deltanet", "mamba2"]
    layers: int = Field(ge=1, le=1000, description="layers whose token mixer this is")
    key_heads: int = Field(ge=1, le=100_000)
    key_head_dim: int = Field(ge=1, le=100_000)
    value_heads: int = Field(ge=1, le=100_000)
    value_head_dim: int = Field(ge=1, le=100_000)
    conv_kernel: int = Field(ge=1, le=1000, description="depthwise causal convolution width")

    @property
    def key_width(self) -> int:
        """key_heads * key_head_dim (GDN: one of q, k; Mamba-2: one of B, C)."""
        return self.key_heads * self.key_head_dim

    @property
    def value_width(self) -> int:
        """value_heads * value_head_dim (GDN: v and the gate z; Mamba-2: d_inner, x and the gate z)."""
        return self.value_heads * self.value_head_dim


class Architecture(_Frozen):
    """A decoder-only transformer, described the way HF ``config.json`` files describe it.

    The exact parameter count is derived from the shapes (tied embeddings counted once, every MoE expert counted,
    biases and norms included); :mod:`zeroplanner.catalog.hfconfig` builds this from any supported ``config.json`` and the
    tests compare the count with ``transformers`` instantiated on the meta device.

    Layers may differ (2024-26 families): ``attention_layers`` of them hold the softmax attention the head fields
    describe (MLA when ``kv_lora_rank`` is set) and the rest a mixer counted in ``other_mixer_params`` (its shape,
    for activations, in ``linear_mixer`` where it is a linear-attention or state-space mixer);
    ``moe_layers`` hold ``n_experts`` routed experts of ``ffn_size`` (+ a shared expert), ``dense_mlp_layers`` a
    dense MLP of ``dense_ffn_size``. Every new field defaults to the uniform layout, so older entries are unchanged.
    """

    name: str = Field(min_length=1, max_length=200)
    family: str = Field(default="generic", max_length=50, description="HF model_type, or 'generic'")
    n_layers: int = Field(ge=1, le=1000)
    hidden_size: int = Field(ge=1, le=1_000_000)
    n_heads: int = Field(ge=1, le=10_000)
    n_kv_heads: int | None = Field(default=None, ge=1, le=10_000, description="None = n_heads (multi-head)")
    head_dim: int | None = Field(default=None, ge=1, le=100_000, description="None = hidden_size // n_heads")
    ffn_size: int = Field(ge=1, le=10_000_000, description="intermediate size of one MLP (one expert for MoE)")
    ffn_kind: Literal["gelu", "swiglu"] = Field(
        default="swiglu", description="gelu: two matrices (any pointwise activation); swiglu: gate, up and down"
    )
    vocab_size: int = Field(ge=1, le=10_000_000)
    tied_embeddings: bool = False
    learned_position_embeddings: int = Field(default=0, ge=0, le=10_000_000, description="rows; 0 = rotary/ALiBi")
    norm_kind: Literal["layernorm", "rmsnorm"] = "rmsnorm"
    norms_per_layer: int = Field(default=2, ge=0, le=16, description="hidden-width norms per layer (Gemma 2/3: 4; Gemma 4 MoE: 7)")
    final_norm: bool = True
    embedding_norm: bool = False
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    fused_qkv: bool = Field(default=False, description="Q, K, V are one nn.Linear (GPT-2, GPT-NeoX, BLOOM, Falcon)")
    parallel_attention: bool = Field(
        default=False,
        description="attention and MLP read the same block input and their outputs are added to one residual "
        "(GPT-NeoX use_parallel_residual, Falcon parallel_attn / new_decoder_architecture); no parameter change",
    )
    embedding_dim: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="width of the token embedding and lm_head when it differs from hidden_size (OPT's "
        "word_embed_proj_dim; its project_in/project_out matrices go in extra_parameters); None = hidden_size",
    )
    n_experts: int = Field(default=1, ge=1, le=10_000)
    experts_per_token: int = Field(default=1, ge=1, le=10_000)
    fused_experts: bool = Field(default=False, description="all experts' weights live in one module")
    # -- 2024-26 families (transformers 5.24 modeling_<family>.py; every field defaults to the layout above) --
    fused_gate_up: bool = Field(
        default=False, description="gate and up projections are one nn.Linear (Phi-3 gate_up_proj, GLM-4)"
    )
    qk_norm: Literal["none", "head", "full", "l2"] = Field(
        default="none",
        description="RMSNorm weights on queries and keys: 'head' one head_dim vector each (Qwen3 q_norm/k_norm, "
        "Gemma 3, Qwen3-Next); 'full' over the whole q and k widths (OLMo 2 q_norm(n_heads*head_dim), "
        "k_norm(n_kv_heads*head_dim)); 'l2' a weight-free L2 norm per head (Llama 4 Llama4TextL2Norm)",
    )
    rotary_fraction: float = Field(
        default=1.0, gt=0.0, le=1.0,
        description="fraction of each head's width that is rotated (partial_rotary_factor: GLM-4 0.5); no "
        "parameter change",
    )
    nope_layers: int = Field(
        default=0, ge=0, le=1000,
        description="attention layers without rotary embedding and without the q/k norm (Llama 4 no_rope_layers "
        "entries 0, every no_rope_layer_interval-th layer by default); no parameter change",
    )
    q_lora_rank: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="MLA (DeepSeek-V2/V3, arXiv 2405.04434 Sec. 2.1): rank of the query down-projection q_a_proj "
        "(with its q_a_layernorm); None with kv_lora_rank set = a full-rank q_proj",
    )
    kv_lora_rank: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="MLA: rank of the joint key/value compression kv_a_proj_with_mqa (None = no MLA); query/key "
        "head width is head_dim (qk_nope_head_dim + qk_rope_head_dim)",
    )
    qk_rope_head_dim: int = Field(default=0, ge=0, le=100_000, description="MLA: decoupled rotary key width")
    v_head_dim: int | None = Field(default=None, ge=1, le=100_000, description="MLA: value head width")
    attention_layers: int | None = Field(
        default=None, ge=0, le=1000,
        description="layers whose token mixer is the softmax attention the head fields describe; None = n_layers. "
        "The other layers' mixers (Qwen3-Next Gated DeltaNet, Nemotron-H Mamba-2, Gemma 4 full-attention layers "
        "of another shape) are counted exactly in other_mixer_params",
    )
    other_mixer_params: int = Field(
        default=0, ge=0, le=10**15, description="total parameters of the mixers of the other layers (see above)"
    )
    other_mixer_largest_module: int = Field(
        default=0, ge=0, le=10**15, description="largest single module among those other mixers"
    )
    linear_mixer: LinearMixer | None = Field(
        default=None,
        description="the shape of the other layers' mixer when it is a linear-attention or state-space mixer "
        "(Qwen3-Next Gated DeltaNet, Nemotron-H Mamba-2), for its activations; None = none, or not described",
    )
    moe_layers: int | None = Field(
        default=None, ge=0, le=1000,
        description="layers with the routed-expert MLP; None = all layers when n_experts > 1, else 0 "
        "(DeepSeek first_k_dense_replace, Qwen decoder_sparse_step / mlp_only_layers, Llama 4 "
        "interleave_moe_layer_step, Nemotron-H pattern 'E')",
    )
    dense_mlp_layers: int | None = Field(
        default=None, ge=0, le=1000,
        description="layers with a dense MLP of dense_ffn_size; None = n_layers - moe_layers (Gemma 4 MoE layers "
        "have both; Nemotron-H Mamba and attention blocks have neither)",
    )
    dense_ffn_size: int | None = Field(
        default=None, ge=1, le=10_000_000, description="width of the dense MLP; None = ffn_size"
    )
    shared_expert_ffn_size: int = Field(
        default=0, ge=0, le=10_000_000,
        description="total width of the always-active shared expert MLP of every MoE layer (DeepSeek "
        "n_shared_experts * moe_intermediate_size, Qwen3-Next shared_expert_intermediate_size, Llama 4 "
        "intermediate_size); 0 = none",
    )
    shared_expert_gate: bool = Field(default=False, description="sigmoid gate Linear(hidden, 1) on the shared expert")
    router_bias: bool = Field(default=False, description="the router Linear has a bias (gpt-oss)")
    router_groups: int = Field(
        default=1, ge=1, le=10_000,
        description="expert groups of a group-limited router (DeepSeek-V3 / GLM-4.5 n_group; 1 = no grouping)",
    )
    router_top_groups: int = Field(
        default=1, ge=1, le=10_000, description="groups each token may route to (DeepSeek-V3 / GLM-4.5 topk_group)"
    )
    router_norm_topk: bool = Field(
        default=False, description="the top-k routing weights are renormalised to sum to 1 (norm_topk_prob)"
    )
    layer_extra_params: int = Field(
        default=0, ge=0, le=10**12,
        description="small per-layer parameters not above: gpt-oss attention sinks (n_heads), Gemma 4 router "
        "scale + per_expert_scale (hidden + n_experts)",
    )
    vision_params: int = Field(
        default=0, ge=0, le=10**14,
        description="vision tower + projector parameters of a vision-language model (trainable or frozen: "
        "TrainingSpec.freeze_vision)",
    )
    vision_tokens_per_image: int = Field(
        default=0, ge=0, le=1_000_000,
        description="language-model tokens one image becomes (Gemma 4 vision_soft_tokens_per_image; Qwen2-VL "
        "depends on the resolution: (H/28)*(W/28), 256 at 448x448 is the default taken here)",
    )
    vision: VisionTower | None = Field(
        default=None,
        description="the vision encoder's shape for its own activations (Qwen2-VL / Qwen2.5-VL / Gemma 3 / "
        "Gemma 4 / Llama 4); None = not priced (text-only models, and vision-language families read only through "
        "transformers: their towers' parameters are counted, their activations are not)",
    )
    global_head_dim: int | None = Field(
        default=None, ge=1, le=100_000,
        description="head width of Gemma 4's full-attention layers (global_head_dim; the layers beyond "
        "attention_layers); None = head_dim",
    )
    global_kv_heads: int | None = Field(
        default=None, ge=1, le=10_000,
        description="key/value heads of Gemma 4's full-attention layers (num_global_key_value_heads); None = "
        "n_kv_heads",
    )
    sliding_window: int | None = Field(
        default=None, ge=1, le=100_000_000, description="window of the sliding-window attention layers"
    )
    sliding_window_layers: int = Field(default=0, ge=0, le=1000, description="layers with sliding-window attention")
    gated_attention: bool = Field(
        default=False,
        description="q_proj also emits a sigmoid output gate of the same width (Qwen3-Next attn_output_gate)",
    )
    attn_logit_softcapping: bool = Field(
        default=False,
        description="Gemma 2 tanh soft-capping of attention logits: flash/sdpa kernels do not apply it, "
        "transformers uses eager attention (O(s^2) scores saved); priced as flash_attention=False",
    )
    final_logit_softcapping: bool = Field(
        default=False,
        description="tanh soft-capping of the output logits (Gemma 2 / Gemma 4 final_logit_softcapping): the tanh "
        "output is saved, one more logits-sized tensor; no parameter change",
    )
    dropout: bool = Field(default=False, description="dropout active in training (saves 1-byte masks)")
    extra_parameters: int = Field(
        default=0, ge=0, description="parameters outside the blocks above, e.g. OPT's project_in/project_out"
    )
    parameter_count_override: int | None = Field(
        default=None, ge=1, le=10**15, description="exact Ψ when the architecture is synthesised from a bare count"
    )
    largest_module_override: int | None = Field(
        default=None, ge=1, le=10**15,
        description="exact largest module when the architecture comes from a transformers meta-device build",
    )
    max_position_embeddings: int | None = Field(default=None, ge=1)
    source: str = Field(default="", max_length=500, description="where these numbers come from")

    @model_validator(mode="after")
    def _check_heads(self) -> Architecture:
        kv = self.kv_heads
        if kv > self.n_heads or self.n_heads % kv:
            raise ValueError(f"n_kv_heads={kv} must divide n_heads={self.n_heads}")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds n_experts={self.n_experts}")
        if self.head_dim is None and self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by n_heads={self.n_heads}")
        for name in ("attention_layers", "moe_layers", "dense_mlp_layers", "sliding_window_layers", "nope_layers"):
            value = getattr(self, name)
            if value is not None and value > self.n_layers:
                raise ValueError(f"{name}={value} exceeds n_layers={self.n_layers}")
        if self.linear_mixer is not None and self.linear_mixer.layers + self.n_attention_layers > self.n_layers:
            raise ValueError(f"linear_mixer.layers={self.linear_mixer.layers} + attention_layers="
                             f"{self.n_attention_layers} exceeds n_layers={self.n_layers}")
        if self.n_moe_layers and self.n_experts == 1:
            raise ValueError(f"moe_layers={self.moe_layers} needs n_experts > 1")
        if self.vision is not None and self.vision.tokens_per_image != self.vision_tokens_per_image:
            raise ValueError(f"vision_tokens_per_image={self.vision_tokens_per_image} must equal the tower's "
                             f"patches_per_image / merge_size^2 = {self.vision.tokens_per_image}")
        if self.router_top_groups > self.router_groups:
            raise ValueError(f"router_top_groups={self.router_top_groups} exceeds router_groups={self.router_groups}")
        if self.kv_lora_rank is None and (self.q_lora_rank is not None or self.v_head_dim is not None):
            raise ValueError("q_lora_rank / v_head_dim are MLA fields and need kv_lora_rank")
        if self.kv_lora_rank is not None and (self.v_head_dim is None or self.qk_rope_head_dim >= self.dim_head):
            raise ValueError(
                f"MLA needs v_head_dim and qk_rope_head_dim={self.qk_rope_head_dim} < head_dim={self.dim_head}"
            )
        return self

    # -- shapes --------------------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def dim_head(self) -> int:
        """Query/key head width (for MLA: qk_nope_head_dim + qk_rope_head_dim)."""
        return self.head_dim or self.hidden_size // self.n_heads

    @property
    def q_size(self) -> int:
        """Width of the query projection output (n_heads * head_dim)."""
        return self.n_heads * self.dim_head

    @property
    def kv_size(self) -> int:
        """Width of one of the key/value projection outputs (n_kv_heads * head_dim)."""
        return self.kv_heads * self.dim_head

    @property
    def embed_width(self) -> int:
        """Width of the token embedding and of the lm_head input (embedding_dim, else hidden_size)."""
        return self.embedding_dim or self.hidden_size

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def n_attention_layers(self) -> int:
        return self.n_layers if self.attention_layers is None else self.attention_layers

    @property
    def n_moe_layers(self) -> int:
        if self.moe_layers is not None:
            return self.moe_layers
        return self.n_layers if self.n_experts > 1 else 0

    @property
    def n_dense_layers(self) -> int:
        if self.dense_mlp_layers is not None:
            return self.dense_mlp_layers
        return self.n_layers - self.n_moe_layers

    @property
    def dense_width(self) -> int:
        return self.dense_ffn_size or self.ffn_size

    # -- parameter counts ---------------------------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        return 2 * self.hidden_size if self.norm_kind == "layernorm" else self.hidden_size

    @property
    def qk_norm_params(self) -> int:
        if self.qk_norm == "head":
            return 2 * self.dim_head
        if self.qk_norm == "full":
            return self.q_size + self.kv_size
        return 0

    def _mla_matrices(self) -> dict[str, int]:
        """MLA weight matrices of one layer (DeepseekV3Attention, transformers 5.24), elements each."""
        h, heads, qh = self.hidden_size, self.n_heads, self.dim_head
        rq, rkv, rope, v = self.q_lora_rank, self.kv_lora_rank or 0, self.qk_rope_head_dim, self.v_head_dim or 0
        mats = {}
        if rq:
            mats["q_a_proj"] = h * rq
            mats["q_b_proj"] = rq * heads * qh
        else:
            mats["q_proj"] = h * heads * qh
        mats["kv_a_proj_with_mqa"] = h * (rkv + rope)
        mats["kv_b_proj"] = rkv * heads * (qh - rope + v)
        mats["o_proj"] = heads * v * h
        return mats

    @property
    def attention_params(self) -> int:
        """Q, K, V and output projections of one attention layer, with biases and q/k norms."""
        h = self.hidden_size
        if self.mla:
            # q_a_proj, kv_a_proj_with_mqa and o_proj carry attention_bias; q_b_proj, kv_b_proj never do; the
            # two low-rank RMSNorms (q_a_layernorm, kv_a_layernorm)
            rq, rkv = self.q_lora_rank or 0, self.kv_lora_rank or 0
            biases = ((rq if rq else 0) + rkv + self.qk_rope_head_dim) * self.qkv_bias + h * self.out_bias
            return sum(self._mla_matrices().values()) + rq + rkv + biases
        q_out = self.q_size * (2 if self.gated_attention else 1)
        qkv = h * (q_out + 2 * self.kv_size) + (q_out + 2 * self.kv_size) * self.qkv_bias
        out = self.q_size * h + h * self.out_bias
        return qkv + out + self.qk_norm_params

    def _mlp(self, width: int, bias: bool) -> int:
        h = self.hidden_size
        if self.ffn_kind == "swiglu":
            return 3 * h * width + (2 * width + h) * bias
        return 2 * h * width + (width + h) * bias

    @property
    def mlp_params(self) -> int:
        """One MLP (one expert for MoE), with biases."""
        return self._mlp(self.ffn_size, self.mlp_bias)

    @property
    def dense_mlp_params(self) -> int:
        """The dense MLP of a non-MoE layer (dense_ffn_size wide)."""
        return self._mlp(self.dense_width, self.mlp_bias)

    @property
    def shared_expert_params(self) -> int:
        """The shared expert(s) of one MoE layer (bias-free) and their gate."""
        if not self.shared_expert_ffn_size:
            return 0
        return self._mlp(self.shared_expert_ffn_size, False) + self.hidden_size * self.shared_expert_gate

    @property
    def router_params(self) -> int:
        return (self.hidden_size + self.router_bias) * self.n_experts if self.n_experts > 1 else 0

    @property
    def moe_block_params(self) -> int:
        """One MoE layer's MLP: every routed expert, the router and the shared expert."""
        return self.n_experts * self.mlp_params + self.router_params + self.shared_expert_params

    @cached_property
    def layer_params(self) -> int:
        """Parameters of the decoder layers divided by their number (exact when the layers are alike)."""
        return self.blocks_params // self.n_layers

    @cached_property
    def blocks_params(self) -> int:
        """Parameters of all decoder layers."""
        return (
            self.n_attention_layers * self.attention_params
            + self.other_mixer_params
            + self.n_moe_layers * self.moe_block_params
            + self.n_dense_layers * self.dense_mlp_params
            + self.n_layers * (self.norms_per_layer * self.norm_params + self.layer_extra_params)
        )

    @property
    def embedding_params(self) -> int:
        h = self.hidden_size
        return (
            self.vocab_size * self.embed_width
            + self.learned_position_embeddings * h
            + self.embedding_norm * self.norm_params
        )

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.embed_width

    @cached_property
    def derived_parameter_count(self) -> int:
        return (
            self.embedding_params
            + self.blocks_params
            + self.final_norm * self.norm_params
            + self.lm_head_params
            + self.extra_parameters
            + self.vision_params
        )

    @cached_property
    def parameter_count(self) -> int:
        """Ψ: exact number of parameters (tied embeddings once, all experts)."""
        return self.parameter_count_override or self.derived_parameter_count

    @cached_property
    def largest_module_params(self) -> int:
        """Parameters owned directly by the largest single module.

        This is DeepSpeed's ``largest_layer_params`` (``model_to_params`` in deepspeed/runtime/zero/stage3.py:
        ``sum(p.numel() for p in m.parameters(recurse=False))`` maximised over modules).
        """
        h, f = self.hidden_size, self.ffn_size
        candidates = [self.vocab_size * self.embed_width, self.learned_position_embeddings * h]
        q_out = self.q_size * (2 if self.gated_attention else 1)
        if self.mla:
            candidates.extend(self._mla_matrices().values())
        elif self.fused_qkv:
            candidates.append(h * (q_out + 2 * self.kv_size) + (q_out + 2 * self.kv_size) * self.qkv_bias)
        else:
            candidates.append(h * q_out + q_out * self.qkv_bias)
        if self.n_attention_layers and not self.mla:
            candidates.append(self.q_size * h + h * self.out_bias)
        candidates.append(self.other_mixer_largest_module)
        gate_up = 2 if self.fused_gate_up and self.ffn_kind == "swiglu" else 1
        for width, layers in ((self.dense_width, self.n_dense_layers), (self.shared_expert_ffn_size, 1)):
            if width and layers:
                bias = self.mlp_bias and width == self.dense_width
                candidates.append(gate_up * (h * width + width * bias))
                candidates.append(width * h + h * bias)  # down projection (larger than up only when h > f)
        if self.n_moe_layers:
            if self.fused_experts:
                candidates.append(self.n_experts * self.mlp_params)
            else:
                candidates.append(h * f + f * self.mlp_bias)
                candidates.append(f * h + h * self.mlp_bias)
        largest = max(candidates)
        if self.largest_module_override:
            return self.largest_module_override
        if self.parameter_count_override:
            scale = self.parameter_count_override / max(self.derived_parameter_count, 1)
            largest = int(largest * scale)
        return largest

    @cached_property
    def matmul_params_per_token(self) -> int:
        """Weights that take part in a matrix multiply for one token (active experts only, lm_head included,
        input embedding lookup and norms excluded). Used for FLOPs (PaLM, arXiv 2204.02311, appendix B)."""
        active_moe = self.experts_per_token * self.mlp_params + self.router_params + self.shared_expert_params
        total = (
            self.n_attention_layers * self.attention_params
            + self.other_mixer_params
            + self.n_moe_layers * active_moe
            + self.n_dense_layers * self.dense_mlp_params
            + self.vocab_size * self.embed_width
        )
        if self.parameter_count_override:
            total = int(total * self.parameter_count_override / max(self.derived_parameter_count, 1))
        return total

    def lora_parameters(self, rank: int, targets: tuple[str, ...]) -> int:
        """Trainable LoRA parameters: rank * (in + out) per targeted matrix per layer (Hu et al., arXiv 2106.09685,
        Sec. 4.1; every expert's matrices are targeted for MoE)."""
        if rank <= 0:
            return 0
        h, f = self.hidden_size, self.ffn_size
        shapes = {
            "q": (h, self.q_size),
            "k": (h, self.kv_size),
            "v": (h, self.kv_size),
            "o": (self.q_size, h),
            "up": (h, f),
            "down": (f, h),
            "gate": (h, f) if self.ffn_kind == "swiglu" else None,
        }
        total = 0
        for t in targets:
            shape = shapes.get(t)
            if shape is None:
                continue
            if t in ("up", "down", "gate"):
                layers = self.n_moe_layers * self.n_experts + self.n_dense_layers
            else:
                layers = self.n_attention_layers
            total += rank * (shape[0] + shape[1]) * layers
        return total

    @classmethod
    def from_parameter_count(cls, parameters: int, name: str | None = None) -> Architecture:
        """A Llama-shaped architecture with exactly ``parameters`` parameters (Ψ is exact; the shapes used for
        activations and FLOPs are synthesised). Layer count follows Llama-2's aspect ratio hidden/layers = 128
        (Llama-2-7B: 4096/32; 13B: 5120/40; Touvron et al., arXiv 2307.09288, Table 1 of the HF configs).

        Above about 1.9e14 parameters that ratio would need more layers than ``n_layers`` allows (1000); there the
        model keeps 1000 layers and grows wider instead (hidden = sqrt(parameters / (12 x 1000)), a multiple of 128),
        so every count in [1e6, 1e15] -- the documented range of ``--params`` -- builds.

        Raises ``ValueError`` for parameters < 1e6 or > 1e15.
        """
        if not (1_000_000 <= parameters <= 10**15):
            raise ValueError(f"parameters={parameters} must be between 1e6 and 1e15")
        max_layers = _field_bound(cls, "n_layers", "le")
        hidden = max(128, int(round((128 * parameters / 12) ** (1 / 3) / 128)) * 128)
        layers = max(1, int(round(parameters / (12 * hidden * hidden))))
        if layers > max_layers:  # 12 * L * h^2 = parameters at L = max_layers
            hidden = max(128, int(round(math.sqrt(parameters / (12 * max_layers)) / 128)) * 128)
            layers = min(max_layers, max(1, int(round(parameters / (12 * hidden * hidden)))))
        ffn = int(math.ceil(8 * hidden / 3 / 256) * 256)
        heads = max(1, hidden // 128)
        return cls(
            name=name or f"generic-{_size_label(parameters)}",
            family="generic",
            n_layers=layers,
            hidden_size=hidden,
            n_heads=heads,
            ffn_size=ffn,
            ffn_kind="swiglu",
            vocab_size=32000,
            parameter_count_override=int(parameters),
            source="synthesised from a bare parameter count (Llama-2 proportions)",
        )


# ----------------------------------------------------------------------------------------------------------------
# Hardware
# ----------------------------------------------------------------------------------------------------------------
class GPUSpec(_Frozen):
    """One accelerator model. Peak numbers are dense (no sparsity) vendor figures; each catalog entry cites them."""

    name: str = Field(min_length=1, max_length=100)
    memory_bytes: int = Field(ge=1 * GIB // 4, le=2**45)
    peak_bf16_tflops: float = Field(ge=0, le=100_000, description="dense bf16 TFLOP/s (0 = unsupported)")
    peak_fp16_tflops: float = Field(gt=0, le=100_000)
    peak_fp32_tflops: float = Field(gt=0, le=100_000, description="fp32 matmul TFLOP/s (TF32 where that is default)")
    hbm_bandwidth_gb_per_s: float = Field(gt=0, le=100_000, description="GB/s (1e9 bytes/s)")
    intra_node_busbw_gb_per_s: float = Field(
        gt=0, le=100_000, description="all-reduce bus bandwidth inside one node, GB/s (nccl-tests busbw)"
    )
    intra_node_latency_seconds: float = Field(default=10e-6, gt=0, le=1.0)
    pcie_gb_per_s: float = Field(default=25.0, gt=0, le=10_000, description="host<->device GB/s, pinned")
    marketed_memory_gb: float | None = Field(
        default=None, gt=0, le=100_000,
        description="the vendor's advertised memory (the '80GB' of 'A100-80GB'), shown beside memory_bytes; "
        "memory_bytes is what PyTorch reports as total capacity, which is less",
    )
    source: str = Field(default="", max_length=1000)

    @property
    def supports_bf16(self) -> bool:
        """Whether the GPU computes in bf16 (catalog ``peak_bf16_tflops`` > 0): bf16 tensor cores arrive with
        Ampere (sm_80); V100 (sm_70) and Turing (sm_75: T4, TITAN RTX) have none."""
        return self.peak_bf16_tflops > 0

    def peak_tflops(self, precision: Precision) -> float:
        """Dense peak TFLOP/s for the training precision; fp16 stands in where bf16 is unsupported (V100)."""
        if precision == "bf16":
            return self.peak_bf16_tflops or self.peak_fp16_tflops
        if precision == "fp16":
            return self.peak_fp16_tflops
        return self.peak_fp32_tflops


class NetworkSpec(_Frozen):
    """Inter-node network: NICs per node of a given link rate (Gbit/s), the fraction of that rate NCCL reaches as
    bus bandwidth on large messages, and the latency of one ring step."""

    name: str = Field(min_length=1, max_length=100)
    kind: Literal["none", "ethernet", "roce", "infiniband"] = "ethernet"
    link_gbps: float = Field(gt=0, le=100_000, description="per NIC, Gbit/s")
    nics_per_node: int = Field(default=1, ge=1, le=64)
    efficiency: float = Field(default=0.8, gt=0, le=1.0, description="busbw / link rate on large messages")
    latency_seconds: float = Field(default=10e-6, gt=0, le=1.0, description="per ring step")
    source: str = Field(default="", max_length=1000)

    @property
    def node_busbw_bytes_per_second(self) -> float:
        """Bus bandwidth one node's NICs sustain together, bytes/s."""
        return self.link_gbps * 1e9 / 8 * self.nics_per_node * self.efficiency


class ClusterSpec(_Frozen):
    """GPUs, nodes, networks and host resources. Host RAM and NVMe are per node."""

    gpu: GPUSpec
    gpu_memory_bytes: int | None = Field(default=None, ge=GIB // 4, le=2**45, description="override gpu.memory_bytes")
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    nodes: int = Field(default=1, ge=1, le=100_000)
    network: NetworkSpec
    cpu_memory_bytes: int = Field(default=1024 * GIB, ge=GIB, le=2**50, description="host RAM per node")
    nvme_bytes: int = Field(
        default=4 * 2**40, ge=0, le=2**55,
        description="NVMe capacity per node for offload_* device nvme, bytes. Default 4 TiB: a conservative local "
        "NVMe of one GPU node, below the 15 TB (4 x 3.84 TB U.2) of an NVIDIA DGX A100 320GB and its 30 TB "
        "(8 x 3.84 TB) option (NVIDIA DGX A100 datasheet, 2020); `zeroplanner probe` sets the measured free space",
    )
    nvme_gb_per_s: float = Field(default=6.0, gt=0, le=1000, description="NVMe read/write GB/s per node")
    cpu_adam_params_per_second: float | None = Field(
        default=None, ge=1e6, le=1e13,
        description="DeepSpeedCPUAdam parameter updates per second per node, measured on your host (`zeroplanner "
        "probe --benchmarks`, applied by --cluster-from); the node's ranks share it. None = derived per rank from "
        "cpu_adam_threads_per_rank (costmodel.offload.cpu_adam_params_per_second_per_rank)",
    )
    cpu_adam_threads_per_rank: int = Field(
        default=1, ge=1, le=1024,
        description="OpenMP threads each rank's DeepSpeedCPUAdam runs on (OMP_NUM_THREADS). Default 1: what torchrun "
        "(torch/distributed/run.py) and `accelerate launch` (accelerate/commands/launch.py) set for every process "
        "when a node runs more than one; `deepspeed --bind_cores_to_rank` sets the node's cores / ranks "
        "(deepspeed/launcher/launch.py); the deepspeed launcher without it leaves torch's default, the node's "
        "physical cores, in every rank",
    )
    host_cpu_cores_per_node: int | None = Field(
        default=None, ge=1, le=100_000,
        description="physical CPU cores of one node's host, shared by its ranks' CPU-Adam threads; None = not "
        "given: enough for every rank's threads. With more threads than cores (cpu_adam_threads_per_rank x "
        "gpus_per_node > this) each rank gets cores / gpus_per_node threads' worth (costmodel/offload.py)",
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    sequence_parallel_size: int = Field(
        default=1, ge=1, le=1024,
        description="Ulysses sequence-parallel degree (DeepSpeed ALST; DeepSpeed's sequence_parallel_size, HF/"
        "accelerate ParallelismConfig sp_size): each sample's sequence is split over this many GPUs; 1 = none",
    )

    @model_validator(mode="after")
    def _check_tp(self) -> ClusterSpec:
        if self.gpus_per_node % self.tensor_parallel_size:
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} must divide gpus_per_node={self.gpus_per_node}"
            )
        if self.world_size % (self.tensor_parallel_size * self.sequence_parallel_size):
            raise ValueError(
                f"sequence_parallel_size={self.sequence_parallel_size} (x tensor_parallel_size="
                f"{self.tensor_parallel_size}) must divide the world size {self.world_size} (gpus_per_node x nodes)"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def data_parallel_degree(self) -> int:
        """ZeRO shards over the data-parallel group: world_size / tensor_parallel_size (DeepSpeed #237)."""
        return self.world_size // self.tensor_parallel_size

    @property
    def memory_per_gpu_bytes(self) -> int:
        return self.gpu_memory_bytes or self.gpu.memory_bytes


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------
class TrainingSpec(_Frozen):
    """What one optimizer step does."""

    precision: Precision = "bf16"
    optimizer: OptimizerName = "adamw"
    micro_batch: int = Field(default=1, ge=1, le=65_536, description="train_micro_batch_size_per_gpu")
    grad_accum: int = Field(default=1, ge=1, le=65_536, description="gradient_accumulation_steps")
    seq_len: int = Field(
        default=4096, ge=1, le=33_554_432,
        description="tokens per sample; up to 2^25, above the longest published trainable length (ALST, Bekman et "
        "al. arXiv 2506.13996: 15M tokens for Llama-3.1-8B on 32 H100s with Ulysses)",
    )
    checkpointing: Checkpointing = "full"
    flash_attention: bool = True
    lora_rank: int = Field(default=0, ge=0, le=65_536, description="0 = full fine-tune")
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    qlora: bool = Field(default=False, description="4-bit NF4 base weights (bitsandbytes); needs lora_rank > 0")
    freeze_vision: bool = Field(
        default=False,
        description="vision tower and projector frozen in a full fine-tune (ms-swift freeze_vit / LLaMA-Factory "
        "freeze_vision_tower): no gradients or optimizer states for Architecture.vision_params; no effect on a "
        "text-only model",
    )
    images_per_sample: int = Field(
        default=0, ge=0, le=10_000,
        description="images in one training sample; each adds the model's vision_tokens_per_image tokens to the "
        "language model's sequence (activations)",
    )
    tiled_mlp: bool = Field(
        default=False,
        description="ALST TiledMLP (arXiv 2506.13996 Sec. 3.2): the MLP runs over sequence tiles, so its "
        "intermediate activations exist for one tile at a time",
    )
    tiled_loss: bool = Field(
        default=False,
        description="logits and loss computed in sequence chunks (ALST's tiled loss / Liger fused cross-entropy): "
        "the full [tokens, vocab] logits are never held",
    )
    checkpoint_offload: bool = Field(
        default=False,
        description="activation-checkpoint offload to host RAM (ALST Sec. 3.3): the per-layer checkpointed inputs "
        "live in host memory between forward and backward; needs activation checkpointing",
    )
    allow_lossy_communication: bool = Field(
        default=False,
        description="planner option: may the planner recommend ZeRO++'s quantized collectives (zero_quantized_weights: "
        "int8 weight all-gather; zero_quantized_gradients: int4 gradient reduce-scatter), which change the numerics "
        "(ZeRO++, arXiv 2306.10209)? Off: it never picks them unless the scenario sets them itself",
    )
    bnb_4bit_quant_storage: QuantStorage = Field(
        default="uint8",
        description="QLoRA: the dtype bitsandbytes packs the 4-bit base weights into (transformers "
        "BitsAndBytesConfig(bnb_4bit_quant_storage=...), set in the training script, not in the DeepSpeed config; "
        "default uint8). ZeRO-3 shards the 4-bit base only when it is the training dtype ('bfloat16' for bf16, "
        "'float16' for fp16) and the model is loaded with that torch_dtype, as PEFT's DeepSpeed guide does "
        "(docs/source/accelerate/deepspeed.md, 'Use PEFT QLoRA and DeepSpeed with ZeRO3'); with uint8 the base "
        "is priced whole on every GPU. No effect without qlora",
    )

    @field_validator("lora_targets")
    @classmethod
    def _targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in value if t not in LORA_TARGETS]
        if bad:
            raise ValueError(f"unknown LoRA targets {bad}; allowed: {list(LORA_TARGETS)}")
        return tuple(value)

    @model_validator(mode="after")
    def _check_qlora(self) -> TrainingSpec:
        if self.qlora and self.lora_rank == 0:
            raise ValueError("qlora=True needs lora_rank >= 1")
        if not self.qlora and self.bnb_4bit_quant_storage != "uint8":
            raise ValueError(f"bnb_4bit_quant_storage={self.bnb_4bit_quant_storage!r} is a QLoRA setting (the "
                             "4-bit base's storage dtype): it needs qlora=True")
        if self.qlora and self.precision == "fp32":
            raise ValueError("qlora needs precision bf16 or fp16 (compute dtype of the 4-bit base)")
        storage = self.bnb_4bit_quant_storage
        if self.qlora and storage != "uint8" and QUANT_STORAGE_PRECISION[storage] != self.precision:
            # DeepSpeed casts every floating-point parameter that is not the training dtype to it
            # (runtime/engine.py _cast_module_mixed_precision: ``p.data.to(param_dtype)`` for CASTABLE_DTYPES),
            # which converts the packed 4-bit codes as if they were numbers
            allowed = [k for k, v in QUANT_STORAGE_PRECISION.items() if v == self.precision]
            raise ValueError(
                f"bnb_4bit_quant_storage={storage!r} with precision {self.precision}: allowed 'uint8' or the "
                f"training dtype {allowed[0]!r} (DeepSpeed casts float parameters to the training dtype, which "
                "would corrupt the packed 4-bit weights)")
        return self

    @property
    def trains_vision_tower(self) -> bool:
        """Whether a vision-language model's tower trains: not with ``freeze_vision``, nor with LoRA / QLoRA (the
        adapters go on the language model only). The one rule the activations, the FLOPs and the answers use."""
        return not (self.freeze_vision or self.lora_rank)


class OffloadSpec(_Frozen):
    """DeepSpeed ``offload_optimizer`` / ``offload_param`` block."""

    device: OffloadDevice = "none"
    pin_memory: bool = True
    nvme_path: str | None = Field(default=None, max_length=4096)


class ZeroSpec(_Frozen):
    """``zero_optimization`` block, with DeepSpeed's key names and defaults (deepspeed/runtime/zero/config.py)."""

    stage: int = Field(default=2, ge=0, le=3)
    offload_optimizer: OffloadSpec = OffloadSpec()
    offload_param: OffloadSpec = OffloadSpec()
    reduce_bucket_size: int = Field(default=500_000_000, ge=1, le=10**12, description="elements")
    allgather_bucket_size: int = Field(default=500_000_000, ge=1, le=10**12, description="elements")
    overlap_comm: bool | None = Field(default=None, description="None = DeepSpeed's default (True at stage 3)")
    contiguous_gradients: bool = True
    stage3_prefetch_bucket_size: int = Field(default=50_000_000, ge=0, le=10**12, description="elements")
    stage3_param_persistence_threshold: int = Field(default=100_000, ge=0, le=10**12, description="elements")
    stage3_max_live_parameters: int = Field(default=1_000_000_000, ge=0, le=10**13, description="elements")
    stage3_max_reuse_distance: int = Field(default=1_000_000_000, ge=0, le=10**13, description="elements")
    zero_hpz_partition_size: int = Field(default=1, ge=1, le=1024)
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False

    @model_validator(mode="after")
    def _check_stage_rules(self) -> ZeroSpec:
        if self.offload_param.device != "none" and self.stage != 3:
            raise ValueError(f"offload_param needs stage 3 (got stage {self.stage})")
        if self.offload_optimizer.device != "none" and self.stage == 0:
            raise ValueError("offload_optimizer needs stage 1, 2 or 3 (got stage 0)")
        zpp = self.zero_hpz_partition_size > 1 or self.zero_quantized_weights or self.zero_quantized_gradients
        if zpp and self.stage != 3:
            raise ValueError(f"ZeRO++ (zero_hpz_partition_size, zero_quantized_*) needs stage 3 (got {self.stage})")
        return self

    @property
    def overlap(self) -> bool:
        """Effective overlap_comm: DeepSpeed defaults it to True for stage 3 only (DeepSpeedZeroConfig)."""
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm


class Assumptions(_Frozen):
    """Model constants a user may override. Each default cites its source."""

    mfu: float | None = Field(
        default=None, gt=0, le=1.0,
        description="fraction of the GPU's dense peak the executed FLOPs run at, fixed for every GPU and size (what "
        "--mfu sets); None: the fraction depends on GPU generation and GEMM size "
        "(zeroplanner/costmodel/compute.py achieved_fraction, fitted on shared/references/THROUGHPUT.md)",
    )
    gpu_memory_margin_fraction: float = Field(
        default=0.0, ge=0, lt=1.0, description="fraction of GPU memory kept free beyond the step's peak (default 0: "
        "the planner keeps a headroom of the model's measured error of the peak instead, "
        "zeroplanner/costmodel/timeline.py memory_error_fraction, and says when an answer is below it)"
    )
    cuda_context_bytes: int = Field(
        default=287_047_680, ge=0, le=64 * GIB,
        description="the CUDA context per process, bytes: 287,047,680 measured with lazy module loading "
        "(pytorch/pytorch#86509; 666,632,192 with eager loading); the cuBLAS workspace and NCCL buffers are priced "
        "beside it (zeroplanner/costmodel/gpu_runtime.py)",
    )
    allocator_fragmentation_fraction: float = Field(
        default=0.1168, ge=0, le=1.0, description="the caching allocator's reserved-but-unallocated bytes as a "
        "fraction of the live bytes: the median of 7 published reserved/allocated pairs of DeepSpeed training runs "
        "(0.013-0.258; zeroplanner/costmodel/gpu_runtime.py ALLOCATOR_SLACK_SAMPLES)"
    )
    host_buffer_factor: float = Field(
        default=1.5, ge=1.0, le=10.0,
        description="headroom on offloaded host RAM: DeepSpeed's estimators use additional_buffer_factor=1.5 "
        "(deepspeed/runtime/zero/stage_1_and_2.py, estimate_zero2_model_states_mem_needs)",
    )
    accounting: Accounting = Field(
        default="deepspeed", description="'deepspeed': what DeepSpeed allocates; 'paper': ZeRO paper's ideal"
    )
    device: Literal["cuda", "cpu"] = Field(
        default="cuda", description="where the step runs: 'cuda' (GPUs: FusedAdam, CUDA context, workspaces, "
        "allocator slack) or 'cpu' (the engine's CPU-rank calibration, zeroplanner.calibrate: torch's AdamW, "
        "live tensor bytes only)"
    )


class Scenario(_Frozen):
    """Everything that determines one training run's cost."""

    model: Architecture
    cluster: ClusterSpec
    training: TrainingSpec = TrainingSpec()
    zero: ZeroSpec = ZeroSpec()
    assumptions: Assumptions = Assumptions()

    @property
    def parameters(self) -> int:
        return self.model.parameter_count

    @property
    def trainable_parameters(self) -> int:
        t = self.training
        if t.lora_rank:
            return self.model.lora_parameters(t.lora_rank, t.lora_targets)
        if t.freeze_vision:
            return self.model.parameter_count - self.model.vision_params
        return self.model.parameter_count

    @property
    def sequence_tokens(self) -> int:
        """Tokens the language model processes per sample: seq_len plus images_per_sample * vision tokens."""
        return self.training.seq_len + self.training.images_per_sample * self.model.vision_tokens_per_image

    @model_validator(mode="after")
    def _check_long_context(self) -> Scenario:
        """Ulysses and ALST rules (DeepSpeed 0.19.8 ``ulysses_sp.py``; costmodel.ulysses.check_ulysses): heads and
        KV heads compatible with ``sequence_parallel_size``, the sequence (with image tokens) a multiple of it (the
        pricing splits it exactly; pad the data to the next multiple, as HF/accelerate's SP collator does), a
        flash/sdpa attention (``register_with_transformers`` refuses eager); ``checkpoint_offload`` needs full
        activation checkpointing (it offloads the checkpointed layer inputs)."""
        sp, m, t = self.cluster.sequence_parallel_size, self.model, self.training
        if sp > 1:
            from .costmodel.ulysses import check_ulysses

            tokens = self.sequence_tokens
            try:
                check_ulysses(n_heads=m.n_heads, kv_heads=m.kv_heads, sp_size=sp, linear_mixer=m.linear_mixer)
            except ValueError as exc:
                what = "layers" if m.linear_mixer is not None else "heads"
                raise ValueError(f"sequence_parallel_size={sp} does not fit {m.name}'s {what}: "
                                 + str(exc).replace("sp_size", "sequence_parallel_size")) from None
            if tokens % sp:
                up = -(-tokens // sp) * sp
                raise ValueError(f"sequence_parallel_size={sp} must divide the sequence length ({tokens} tokens, "
                                 f"seq_len + image tokens): DeepSpeed's Ulysses splits it evenly; pad to {up}")
            if not t.flash_attention:
                raise ValueError(f"sequence_parallel_size={sp} needs flash_attention (flash/sdpa kernels): "
                                 "DeepSpeed's Ulysses refuses eager attention")
        if t.checkpoint_offload and t.checkpointing != "full":
            raise ValueError(f"checkpoint_offload needs checkpointing='full' (got {t.checkpointing!r}): it moves "
                             "the checkpointed layer inputs to host RAM")
        hpz, dp = self.zero.zero_hpz_partition_size, self.cluster.data_parallel_degree
        if self.zero.stage == 3 and not hpz_divides(hpz, dp):
            raise ValueError(f"zero_hpz_partition_size={hpz} must divide the data-parallel degree {dp}: DeepSpeed "
                             "asserts it when it builds the secondary-partition groups (utils/groups.py "
                             "_create_zero_param_parallel_group); use the GPUs per node "
                             f"({self.cluster.gpus_per_node}) or a divisor of it")
        return self

    @property
    def global_batch_size(self) -> int:
        """train_batch_size = micro * grad_accum * data-parallel degree (DeepSpeed's rule, DeepSpeed #6914), with
        the data-parallel degree world / (tp x sp) under Ulysses (``ClusterSpec.data_parallel_degree`` /
        ``sequence_parallel_size``: DeepSpeed 0.19.8 ``runtime/config.py`` sets ``world_size = dist.get_world_size() /
        config["sequence_parallel_size"]`` for the batch assertion)."""
        return (self.training.micro_batch * self.training.grad_accum
                * (self.cluster.data_parallel_degree // self.cluster.sequence_parallel_size))

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.training.seq_len


def hpz_divides(hpz: int, data_parallel_degree: int) -> bool:
    """Whether DeepSpeed accepts ``zero_hpz_partition_size`` ``hpz`` on ``data_parallel_degree`` ranks: it asserts
    that min(hpz, world) divides the world when it builds the secondary-partition groups (utils/groups.py
    ``_create_zero_param_parallel_group``: ``_ensure_divisibility``). hpz 1 (no hpZ) always does."""
    return hpz <= 1 or data_parallel_degree % min(hpz, data_parallel_degree) == 0


def replace(obj: BaseModel, **changes: Any) -> Any:
    """Validated copy: like ``model_copy(update=...)`` but runs every validator again."""
    data = obj.model_dump()
    for key, value in changes.items():
        data[key] = value.model_dump() if isinstance(value, BaseModel) else value
    return type(obj).model_validate(data)


def hardware_precision(scenario: Scenario) -> Precision:
    """The precision a run of ``scenario`` uses on its GPU: the scenario's, except bf16 on a GPU without bf16
    (:attr:`GPUSpec.supports_bf16` False: V100, T4, TITAN RTX), which runs fp16 with dynamic loss scaling instead
    (DeepSpeed's ``fp16`` block, ``loss_scale`` 0). Same 2 bytes per value, so memory is unchanged; compute uses the
    GPU's fp16 peak (:meth:`GPUSpec.peak_tflops`). The planner prices and says this; the config generator writes it."""
    precision = scenario.training.precision
    if precision == "bf16" and not scenario.cluster.gpu.supports_bf16:
        return "fp16"
    return precision


def weight_bytes_per_param(training: TrainingSpec) -> float:
    """Bytes of one working (compute) copy of a parameter."""
    return DTYPE_BYTES[training.precision]
