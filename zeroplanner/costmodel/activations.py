"""Activation memory per GPU: tensors saved for backward, from the architecture.

Follows the accounting of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198, Sec. 4.1, Eq. 1-2): a GPT block with 16-bit activations and 1-byte dropout masks saves
``s*b*h*(34 + 5*a*s/h)`` bytes, of which attention is ``11sbh + 5as^2b``, the MLP ``19sbh`` and the two LayerNorms
``4sbh``. Generalised here term by term to grouped-query attention (K and V widths), SwiGLU MLPs (gate, up,
activation and product saved: 4 tensors of width f instead of 2), no-dropout blocks (no masks), flash attention
(no s^2 terms; the output and an fp32 log-sum-exp per head are saved instead; Dao et al., arXiv 2205.14135, Alg. 2),
MoE (MLP activations for each of the k routed experts) and tensor parallelism (inner terms divided by t;
Korthikanti Eq. 2).

Checkpointing: "selective" recomputes the attention core (drops the s^2 terms; Korthikanti Sec. 4.3); "full" keeps
only each layer's input (2sbh) plus one layer's activations during its recomputation (Chen et al., arXiv
1604.06174).

The logits: the 16-bit logits returned by the model (``2sbV``) plus the fp32 log-softmax output saved by the
cross-entropy loss (``4sbV``; Korthikanti Sec. 4.1 "fp32 logits"), both per tensor-parallel rank.
"""

from __future__ import annotations

import numpy as np

from .context import Candidates, Context


def layer_activation_bytes(ctx: Context, micro_batch: np.ndarray, checkpointing: np.ndarray) -> np.ndarray:
    """Bytes saved for backward by ONE transformer layer for a micro-batch, without checkpointing.

    micro_batch, checkpointing: int arrays (checkpointing 1 = selective drops the s^2 attention terms).
    Returns float array, bytes.
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    s = float(t.seq_len)
    b = micro_batch.astype(np.float64)
    tp = float(ctx.tp)
    ab = 4.0 if t.precision == "fp32" else 2.0  # activation element bytes
    h, hq, hk, f = float(m.hidden_size), float(m.q_size), float(m.kv_size), float(m.ffn_size)
    a = float(m.n_heads)
    drop = 1.0 if m.dropout else 0.0
    k_experts = float(m.experts_per_token)
    sb = s * b

    # Attention block (Korthikanti 11sbh + 5as^2b, generalised)
    norm_in = ab * sb * h  # LayerNorm/RMSNorm input
    norm_stats = 4.0 * sb * (2.0 if m.norm_kind == "layernorm" else 1.0)  # fp32 mean/rstd per token
    qkv_in = ab * sb * h  # norm output, input of the Q/K/V projections
    if t.flash_attention:
        q_k_v = ab * sb * (hq + 2 * hk) / tp  # inputs of the attention kernel
        core = (ab * sb * hq + 4.0 * a * s * b) / tp  # output + fp32 log-sum-exp per head
        core_s2 = 0.0 * b
    else:
        q_k_v = ab * sb * (hq + 2 * hq) / tp  # eager attention repeats K/V heads to n_heads before matmuls
        core = 0.0 * b
        core_s2 = (ab * a * s * s * b + drop * (a * s * s * b + ab * a * s * s * b)) / tp  # softmax (+mask, +out)
    out_in = ab * sb * hq / tp  # input of the output projection
    attn_drop = drop * sb * h
    attention = norm_in + norm_stats + qkv_in + q_k_v + core + np.where(checkpointing >= 1, 0.0, core_s2) + out_in
    attention = attention + attn_drop

    # MLP block (Korthikanti 19sbh for f = 4h, generalised)
    mlp_norm_in = ab * sb * h + norm_stats
    mlp_in = ab * sb * h
    inner = (4.0 if m.ffn_kind == "swiglu" else 2.0) * ab * sb * f / tp
    mlp_drop = drop * sb * h
    router = ab * sb * m.n_experts if m.n_experts > 1 else 0.0
    mlp = mlp_norm_in + k_experts * (mlp_in + inner) + mlp_drop + router
    return attention + mlp


def activation_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """Peak activation bytes per GPU for one micro-batch (forward finished, backward starting).

    none/selective: L layers' saved tensors + logits; full: L layer inputs + one layer's saved tensors (being
    recomputed) + logits. Returns float array shaped like ``cand``.
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    b = cand.micro_batch.astype(np.float64)
    sb = float(t.seq_len) * b
    ab = 4.0 if t.precision == "fp32" else 2.0
    per_layer = layer_activation_bytes(ctx, cand.micro_batch, cand.checkpointing)
    layers = float(m.n_layers)
    stored = np.where(cand.checkpointing == 2, layers * ab * sb * m.hidden_size + per_layer, layers * per_layer)
    final = ab * sb * m.hidden_size * 2  # final norm input + lm_head input
    logits = (ab + 4.0) * sb * m.vocab_size / ctx.tp
    return stored + final + logits
