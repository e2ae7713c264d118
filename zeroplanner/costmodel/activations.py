"""Activation memory per GPU: tensors saved for backward, from the architecture.

Follows the accounting of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198, Sec. 4.1, Eq. 1-2): a GPT block with 16-bit activations and 1-byte dropout masks saves
``s*b*h*(34 + 5*a*s/h)`` bytes, of which attention is ``11sbh + 5as^2b``, the MLP ``19sbh`` and the two LayerNorms
``4sbh``. Generalised here term by term to grouped-query attention (K and V widths), SwiGLU MLPs (gate, up,
activation and product saved: 4 tensors of width f instead of 2), no-dropout blocks (no masks), flash attention
(no s^2 terms; the output and an fp32 log-sum-exp per head are saved instead; Dao et al., arXiv 2205.14135, Alg. 2),
MoE (MLP activations for each of the k routed experts, the shared expert and the router logits; dense and MoE
layers weighted by their counts), vision-language models (image tokens added to the sequence) and tensor parallelism (inner terms divided by t;
Korthikanti Eq. 2).

Checkpointing: "selective" recomputes the attention core (drops the s^2 terms; Korthikanti Sec. 4.3); "full" keeps
only each layer's input (2sbh) plus one layer's activations during its recomputation (Chen et al., arXiv
1604.06174).

Approximate for the hybrid families: layers whose mixer is not softmax attention (Qwen3-Next Gated DeltaNet,
Nemotron-H Mamba-2) are priced as the attention layer; MLA as attention with q/k width head_dim; the vision
encoder's own activations are not included.

The logits: the 16-bit logits returned by the model (``2sbV``) plus the fp32 log-softmax output saved by the
cross-entropy loss (``4sbV``; Korthikanti Sec. 4.1 "fp32 logits"), both per tensor-parallel rank.
"""

from __future__ import annotations

import numpy as np

from .context import Candidates, Context
from .terms import TermParts, term

_GEMMA_NORM_FAMILIES = frozenset({"gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text"})
"""Families whose RMSNorm keeps its normalised output in fp32 ((1 + w) scaling in fp32; transformers 5.24
Gemma2RMSNorm / Gemma3RMSNorm / Gemma4RMSNorm.forward)."""


def layer_activation_bytes(ctx: Context, micro_batch: np.ndarray, checkpointing: np.ndarray) -> np.ndarray:
    """Bytes saved for backward by ONE transformer layer for a micro-batch, without checkpointing.

    micro_batch, checkpointing: int arrays (checkpointing 1 = selective drops the s^2 attention terms).
    Returns float array, bytes.
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    s = float(sc.sequence_tokens)  # seq_len + image tokens (vision-language models)
    b = micro_batch.astype(np.float64)
    tp = float(ctx.tp)
    ta = ctx.tp_attention_share  # attention's per-rank share: 1/tp, or the largest uneven AutoTP head shard
    ab = 4.0 if t.precision == "fp32" else 2.0  # activation element bytes
    h, hq, hk, f = float(m.hidden_size), float(m.q_size), float(m.kv_size), float(m.ffn_size)
    a = float(m.n_heads)
    drop = 1.0 if m.dropout else 0.0
    k_experts = float(m.experts_per_token)
    sb = s * b

    # Corrections from the saved-tensor measurement of real HF models (zeroplanner.calibrate.measure_activation_bytes,
    # transformers 5.24, bf16 on CPU, sdpa; table in docs/validation.md), per layer:
    # - HF RMSNorm computes in fp32: it saves the fp32 upcast of its input, the fp32 rstd and the normalised
    #   tensor in the working precision, (4 + ab)·sbh + 4sb, not ab·sbh (LlamaRMSNorm / Qwen2RMSNorm /
    #   MistralRMSNorm); LayerNorm saves its input and mean/rstd;
    # - the flash/sdpa output is laid out (b, s, heads, d): with separate Q/K/V projections (llama family) the
    #   output projection's input is a view of the saved attention output; fused-QKV models keep the whole fused
    #   output saved whenever one of Q/K/V is a view of it, and may copy the attention output (below);
    # - GPT-2's gelu_new (tanh approximation, composed of pointwise ops) saves 5 tensors of width f, exact GELU 2;
    # - GPT-NeoX's parallel residual feeds both LayerNorms the same input: the second saves only its statistics.
    rms = m.norm_kind == "rmsnorm"
    stats = 4.0 * sb * (1.0 if rms else 2.0)  # fp32 rstd (RMSNorm) or mean + rstd (LayerNorm) per token
    # Gemma's RMSNorm (Gemma2/3/4RMSNorm) multiplies by (1 + w) in fp32 before casting: its normalised tensor is
    # saved in fp32 (measured: 8 bytes per element with the fp32 upcast), not in the working precision
    nb = 4.0 if m.family in _GEMMA_NORM_FAMILIES else ab
    norm = ((4.0 + nb) * sb * h if rms else ab * sb * h) + stats
    qkv_in = ab * sb * h  # norm output, input of the Q/K/V projections
    rotary = m.learned_position_embeddings == 0 and m.family not in ("bloom",)
    # Gemma 2's attention-logit soft-capping is not implemented by flash/sdpa kernels: transformers runs eager
    # attention for it (Gemma2Config docs; modeling_gemma2.py eager_attention_forward applies the tanh cap)
    if t.flash_attention and not m.attn_logit_softcapping:
        q_k_v = ab * sb * (hq + 2 * hk) * ta  # inputs of the attention kernel
        out_copy = 0.0 * b
        if m.fused_qkv:
            # a view of the fused QKV output keeps all of it saved (GPT-2: Q, K, V are views; GPT-NeoX: V is, and
            # the rotary Q and K are new copies beside it); the output projection's input is a copy for GPT-NeoX
            # and, when the layer is recomputed under checkpointing, for GPT-2 (measured; a view otherwise)
            q_k_v = q_k_v + (ab * sb * (hq + hk) * ta if rotary else 0.0)
            out_copy = np.where(checkpointing == 2, 1.0, 1.0 if rotary else 0.0) + 0.0 * b
        core = (ab * sb * hq + 4.0 * a * s * b) * ta  # output + fp32 log-sum-exp per head
        core_s2 = 0.0 * b
        out_in = out_copy * ab * sb * hq * ta
    else:
        q_k_v = ab * sb * (hq + 2 * hq) * ta  # eager attention repeats K/V heads to n_heads before matmuls
        core = 0.0 * b
        core_s2 = (ab * a * s * s * b + drop * (a * s * s * b + ab * a * s * s * b)) * ta  # softmax (+mask, +out)
        out_in = ab * sb * hq * ta  # input of the output projection
    attn_drop = drop * sb * h
    # q/k RMSNorms (Qwen3, Gemma 3/4, OLMo 2, Qwen3-Next): like the block norms, each saves its fp32 upcast input
    # and rstd (per head for 'head', per token for 'full') besides its normalised output (the kernel input)
    if m.qk_norm != "none":
        rows = (a + m.kv_heads) if m.qk_norm == "head" else 2.0
        q_k_v = q_k_v + ((4.0 + nb) * sb * (hq + hk) + 4.0 * sb * rows) * ta
    # norms beyond the two pre-norms (Gemma's post-attention / post-feedforward, OLMo 2's, GLM-4's sandwich
    # norms, Gemma 4's MoE norms): each as a block norm on a hidden-width tensor
    extra_norms = max(0, m.norms_per_layer - 2) * norm
    attention = norm + qkv_in + q_k_v + core + np.where(checkpointing >= 1, 0.0, core_s2) + out_in + extra_norms
    attention = attention + attn_drop

    # MLP block (Korthikanti 19sbh for f = 4h, generalised)
    parallel = bool(getattr(m, "parallel_attention", False))
    mlp_norm = stats if parallel else norm
    mlp_in = ab * sb * h
    if m.ffn_kind == "swiglu":
        width = 4.0  # gate, up, act(gate), product
    else:
        width = 5.0 if m.family == "gpt2" else 2.0  # gelu_new's composed ops vs exact GELU (input, output)
    inner = width * ab * sb * f / tp
    mlp_drop = drop * sb * h
    router = ab * sb * m.n_experts if m.n_experts > 1 else 0.0  # router logits
    # MoE layers: the k routed experts each see the tokens routed to them (k·s·b token-expert pairs in all), plus
    # the always-active shared expert; dense layers one MLP of dense_ffn_size. Layers of both kinds are averaged
    # over n_layers (exact for the total; the recomputed layer under full checkpointing is the average layer).
    shared = (mlp_in + width * ab * sb * m.shared_expert_ffn_size / tp) if m.shared_expert_ffn_size else 0.0
    moe = k_experts * (mlp_in + inner) + router + shared
    dense = mlp_in + width * ab * sb * m.dense_width / tp
    layers = float(m.n_layers)
    mlp = mlp_norm + mlp_drop + (m.n_moe_layers / layers) * moe + (m.n_dense_layers / layers) * dense
    return attention + mlp


ACTIVATION_GROUPS = {
    "layers": ("layer inputs + one layer recomputed", "saved layer activations"),
    "final": ("final norm + lm_head inputs",),
    "inputs": ("token ids, labels, rotary tables",),
    "logits": ("logits + fp32 log-softmax",),
}
"""The keys of :func:`activation_parts` and the labels of the :func:`activation_term` parts each one sums."""


def activation_term(ctx: Context, cand: Candidates) -> TermParts:
    """Peak activation bytes per GPU for one micro-batch (forward finished, backward starting), by part:

    - the layers: L layers' saved tensors (none/selective), or with full checkpointing the L stored layer inputs
      plus one layer recomputed in backward, minus the recomputed layer's LayerNorm input, which is the stored
      layer input itself (measured: no new storage; HF's RMSNorm saves an fp32 upcast instead, a new storage);
    - the final norm (as in the layers: RMSNorm's fp32 upcast and rstd, LayerNorm's input and statistics) and
      the lm_head input;
    - int64 input ids and labels (8 bytes each per token) and the rotary cos/sin tables shared by all layers
      (2·a_b·s·b·head_dim; none with learned positions);
    - the 16-bit logits the model returns and the fp32 log-softmax the loss saves, (a_b + 4)·s·b·V / t.
    Every part was checked against the saved-tensor measurement (docs/validation.md).
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    rms = m.norm_kind == "rmsnorm"
    rotary = m.learned_position_embeddings <= 0
    full = cand.checkpointing == 2
    x = {"L": float(m.n_layers), "s": float(sc.sequence_tokens), "b": cand.micro_batch.astype(np.float64),
         "h": float(m.hidden_size), "V": float(m.vocab_size), "a_b": 4.0 if t.precision == "fp32" else 2.0,
         "d_head": float(m.dim_head), "t": float(ctx.tp),
         "n_b": 4.0 if m.family in _GEMMA_NORM_FAMILIES else (4.0 if t.precision == "fp32" else 2.0),
         "layer": layer_activation_bytes(ctx, cand.micro_batch, cand.checkpointing)}
    return term("activations", x, [
        ("layer inputs + one layer recomputed", "L*a_b*s*b*h + layer", full & rms),
        ("layer inputs + one layer recomputed", "L*a_b*s*b*h + layer - a_b*s*b*h", full & (not rms)),
        ("saved layer activations", "L*layer", ~full),
        ("final norm + lm_head inputs", "(4+n_b)*s*b*h + 4*s*b + a_b*s*b*h", rms),
        ("final norm + lm_head inputs", "a_b*s*b*h + 8*s*b + a_b*s*b*h", not rms),
        ("token ids, labels, rotary tables", "16*s*b + 2*a_b*s*b*d_head", rotary),
        ("token ids, labels, rotary tables", "16*s*b", not rotary),
        ("logits + fp32 log-softmax", "(a_b+4)*s*b*V/t", True),
    ])


def activation_parts(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """The parts of :func:`activation_term` grouped as :data:`ACTIVATION_GROUPS` ("layers", "final", "inputs",
    "logits"), bytes per GPU (float arrays shaped like ``cand``); they sum to :func:`activation_bytes`."""
    parts = activation_term(ctx, cand)
    return {k: parts.sum_of(labels) for k, labels in ACTIVATION_GROUPS.items()}


def activation_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """Peak activation bytes per GPU for one micro-batch (forward finished, backward starting): the sum of
    :func:`activation_term`'s parts. Returns float array shaped like ``cand``.
    """
    return activation_term(ctx, cand).value
