"""Activation memory per GPU: tensors saved for backward, from the architecture.

Follows the accounting of Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198, Sec. 4.1, Eq. 1-2): a GPT block with 16-bit activations and 1-byte dropout masks saves
``s*b*h*(34 + 5*a*s/h)`` bytes, of which attention is ``11sbh + 5as^2b``, the MLP ``19sbh`` and the two LayerNorms
``4sbh``. Generalised here term by term to grouped-query attention (K and V widths), SwiGLU MLPs (gate, up,
activation and product saved: 4 tensors of width f instead of 2), no-dropout blocks (no masks), flash attention
(no s^2 terms; the output and an fp32 log-sum-exp per head are saved instead; Dao et al., arXiv 2205.14135, Alg. 2),
MoE (the k routed experts' MLP activations, the router and dispatch tensors transformers saves, the shared expert:
:func:`moe_block_bytes`; dense and MoE layers weighted by their counts), MLA (latent norms and projections,
v_head_dim-wide values), Gemma 4's full-attention layers, vision-language models (image tokens added to the
sequence) and tensor parallelism (inner terms divided by t; Korthikanti Eq. 2). Each family term was checked
against the saved-tensor census of transformers 5.24 (docs/validation.md sections 2 and 6).

Checkpointing: "selective" recomputes the attention core (drops the s^2 terms; Korthikanti Sec. 4.3); "full" keeps
only each layer's input (2sbh) plus one layer's activations during its recomputation (Chen et al., arXiv
1604.06174).

Hybrid families: layers whose mixer is not softmax attention (Qwen3-Next Gated DeltaNet, Nemotron-H Mamba-2;
``Architecture.linear_mixer``) are priced as their GPU kernels save them (:func:`linear_mixer_bytes`), and
Nemotron-H's blocks hold one mixer or one MLP each. The vision encoder's own activations (Qwen2-VL /
Qwen2.5-VL / Gemma 3 / Gemma 4 / Llama 4 towers) are :mod:`zeroplanner.costmodel.vision`'s, added as one part;
towers of families read only through transformers are not priced.
Attention is priced as the GPU flash kernel saves it (flash_attention_2 semantics): CPU sdpa's sliding-window mask
and its math path for MLA's unequal head widths are not (docs/validation.md section 6 shows both).

The logits: the 16-bit logits returned by the model (``2sbV``) plus the fp32 log-softmax output saved by the
cross-entropy loss (``4sbV``; Korthikanti Sec. 4.1 "fp32 logits"), both per tensor-parallel rank.
"""

from __future__ import annotations

import numpy as np

from .context import Candidates, Context
from .terms import TermParts, term
from .vision import vision_activation_bytes

_GEMMA_NORM_FAMILIES = frozenset({"gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text", "olmo2", "gpt_oss",
                                  "nemotron_h", "qwen3_next"})
"""Families whose RMSNorm keeps its normalised output in fp32: Gemma's (1 + w) scaling in fp32 (transformers 5.24
Gemma2RMSNorm / Gemma3RMSNorm / Gemma4RMSNorm.forward), OLMo 2's and gpt-oss's ``(self.weight * hidden_states)
.to(input_dtype)`` (Olmo2RMSNorm / GptOssRMSNorm.forward), which multiply the weight before the cast, and
Nemotron-H's ``(self.weight.to(torch.float32) * hidden_states).to(input_dtype)`` (NemotronHRMSNorm.forward) and
Qwen3-Next's ``output * (1.0 + self.weight.float())`` before ``type_as`` (Qwen3NextRMSNorm.forward)."""

_FP32_NORM_WEIGHT_FAMILIES = frozenset({"nemotron_h", "qwen3_next"})
"""Non-Gemma families whose RMSNorms (block and q/k norms) also save an fp32 copy of their weight (4 bytes per
element per norm): ``self.weight.to(torch.float32)`` in NemotronHRMSNorm.forward and ``1.0 + self.weight.float()``
in Qwen3NextRMSNorm.forward (the modules are bf16 under DeepSpeed's bf16 mode; measured: a (width,) fp32 tensor
saved per norm). Gemma's norms save theirs too (``gemma_weight`` below)."""

GDN_CHUNK_SIZE = 64
"""fla's chunk length for the gated delta rule, the last dimension of the WY matrix A its autograd Function saves
(flash-linear-attention / fla-core 0.6.0 fla/ops/gated_delta_rule/chunk.py ``chunk_gated_delta_rule``:
``kwargs.pop('chunk_size', 64)``; chunk_fwd.py ``chunk_gated_delta_rule_fwd_intra``: A of (B, T, HV, BT) in k's
dtype). transformers' Qwen3NextGatedDeltaNet passes no chunk_size."""


def linear_mixer_bytes(lm, sb, ab: float):
    """Bytes ONE linear-attention / state-space mixer layer saves for backward on the GPU kernel path that
    transformers 5.24 takes in training with the kernels installed, the block norm and its output (the input
    projections' saved input) excluded. ``lm`` the ``Architecture.linear_mixer``, ``sb`` tokens (float or array),
    ``ab`` activation element bytes. Checked to the byte in bf16 against the CPU census with the kernels' saved
    tensors stood in (zeroplanner/calibrate/kernel_stand_ins.py, docs/validation.md section 6).

    Gated DeltaNet (Qwen3NextGatedDeltaNet.forward, nk x dk keys K = nk·dk, nv x dv values E = nv·dv):
    - the short convolution (causal_conv1d 1.7.0 ``CausalConv1dFn.forward``: ``save_for_backward(x, weight, ...)``)
      keeps its input, the concatenated q/k/v projection, a·(2K + E);
    - the core (fla 0.6.0 ``ChunkGatedDeltaRuleFunction.forward`` with use_qk_l2norm_in_kernel:
      ``save_for_backward(q, q_rstd, k, k_rstd, v, g, beta_raw, beta, A, ...)``): the L2-normalised q and k
      (a·2K) and their fp32 rstd per head (8·nk), the contiguous v (a·E), the fp32 chunk-local cumsum of the gate
      (4·nv), beta (a·nv; the same tensor as the sigmoid's output, which keeps it too) and the WY matrix A
      (a·nv·:data:`GDN_CHUNK_SIZE`);
    - the gate g = -exp(A_log) · softplus(a + dt_bias), in fp32: softplus's input and output (8·nv);
    - Qwen3NextRMSNormGated (PyTorch in transformers 5.24 unless the Hub kernels are requested): the fp32 upcast
      of the core output (4·E), the fp32 rsqrt per head (4·nv), the normalised output in the working precision
      times the weight (2·a·E: both products kept), the fp32 gate and its SiLU (8·E), and out_proj's input (a·E).
    Mamba-2 (NemotronHMamba2Mixer.forward in training: mamba_ssm 2.3.2 ``MambaSplitConv1dScanCombinedFn.forward``,
    conv, scan, gated RMSNorm and out_proj fused, ``save_for_backward(zxbcdt, conv1d_weight, conv1d_bias, out_x,
    A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias)``; d_inner D =
    heads·head_dim, G groups of state N): in_proj's output zxbcdt a·(2·D + 2·G·N + heads), the ungated scan output
    out_x a·D and the fp32 norm rstd per group 4·G. Nothing of out_proj is saved besides (its input is recomputed).

    Not divided by the tensor-parallel degree (how AutoTP shards these mixers is not measured: priced whole, an
    upper bound); under Ulysses ``sb`` is the rank's local tokens, as for every per-token term (not measured).
    """
    if lm.kind == "mamba2":
        d, g = float(lm.value_width), float(lm.key_heads)
        zxbcdt = 2.0 * d + 2.0 * g * float(lm.key_head_dim) + float(lm.value_heads)
        return ab * sb * (zxbcdt + d) + 4.0 * sb * g
    k, e = float(lm.key_width), float(lm.value_width)
    nk, nv = float(lm.key_heads), float(lm.value_heads)
    conv = ab * sb * (2.0 * k + e)
    core = ab * sb * 2.0 * k + 8.0 * sb * nk + ab * sb * e + 4.0 * sb * nv + ab * sb * nv + ab * sb * nv * GDN_CHUNK_SIZE
    gate = 8.0 * sb * nv
    norm = 4.0 * sb * e + 4.0 * sb * nv + 2.0 * ab * sb * e + 8.0 * sb * e + ab * sb * e
    return conv + core + gate + norm

_GEMMA4_FAMILIES = frozenset({"gemma4", "gemma4_text"})
"""Gemma4RMSNorm.forward (transformers 5.24): ``hidden * torch.pow(mean_sq, -0.5)`` saves the fp32 upcast, the mean
square and its power (two fp32 values per row), and ``* self.weight.float()`` a new fp32 copy of the weight (the
module is bf16 under DeepSpeed's bf16 mode) besides the fp32 normalised tensor; Gemma4TextAttention adds a
weight-free v_norm."""

_FP32_ROTARY_FAMILIES = frozenset({"olmo2"})
"""Families whose rotary cos/sin tables stay fp32 (Olmo2RotaryEmbedding.forward returns them without the
``.to(x.dtype)`` of LlamaRotaryEmbedding.forward; measured: 4-byte tables)."""


_NO_POSITION_FAMILIES = frozenset({"nemotron_h"})
"""Families without position embeddings of any kind: NemotronHAttention.forward applies no rotary embedding and
NemotronHModel builds no cos/sin tables (transformers 5.24 modeling_nemotron_h.py; measured: none saved)."""

_SINK_FAMILIES = frozenset({"gpt_oss"})
"""Attention with a learned sink logit per head (GptOssAttention ``sinks``; modeling_gpt_oss.py)."""

_WORKING_PRECISION_SOFTMAX_FAMILIES = frozenset({"llama4", "llama4_text"})
"""Eager attention whose softmax runs in the working precision, with no fp32 copy (transformers 5.24
modeling_llama4.py eager_attention_forward: ``softmax(attn_weights, dim=-1)``, no ``dtype=float32``; its output
is what the matmul with V keeps). On the llama4_text census config under eager attention (seq 128) the fp32 pricing
was +31% (no checkpointing) / +21% (full) over the census, this one -0.0% / +0.5%
(tests/evidence/test_activations_modern.py)."""

_TOPK_SOFTMAX_ROUTER_FAMILIES = frozenset({"gpt_oss"})
"""Routers that take the top-k logits first and softmax only those, in the working precision (GptOssTopKRouter
.forward: ``softmax(router_top_value, dim=1, dtype=router_top_value.dtype)``)."""

_EXPERT_SAVED_WIDTHS = {"gpt_oss": 7.0}
"""Tensors of width moe_intermediate_size each routed pair saves, where not the SwiGLU 4 (gate_up counted 2):
GptOssExperts._apply_gate reads gate and up as strided views of gate_up (the whole 2f kept) and saves the clamped
gate, its sigmoid, up + 1, the GLU and the product: 2 + 5 (measured)."""

_FP32_ROUTER_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3", "glm4_moe", "nemotron_h"})
"""Routers that compute in fp32 from fp32 copies of their input and weight (``F.linear(hidden.type(float32),
weight.type(float32))``: transformers 5.24 DeepseekV2TopkRouter / DeepseekV3TopkRouter / Glm4MoeTopkRouter /
NemotronHTopkRouter.forward;
the weight copy is new because DeepSpeed's bf16 mode casts the module, measured)."""

_SIGMOID_GROUP_ROUTER_FAMILIES = frozenset({"deepseek_v3", "glm4_moe", "nemotron_h"})
"""Sigmoid scores with group-limited top-k (DeepseekV3TopkRouter / Glm4MoeTopkRouter / NemotronHTopkRouter
.forward)."""

_FP32_ROUTING_WEIGHT_FAMILIES = frozenset({"mixtral", "deepseek_v2", "deepseek_v3", "glm4_moe", "nemotron_h"})
"""Routers whose top-k weights stay fp32 into the experts (MixtralTopKRouter returns the fp32 softmax values; the
Qwen routers cast them back with ``.to(router_logits.dtype)``)."""

_FP32_LOGITS_FAMILIES = frozenset({"nemotron_h"})
"""Models that return fp32 logits: ``logits = self.lm_head(hidden_states).float()`` (transformers 5.24
NemotronHForCausalLM.forward; measured: the returned logits are 4 bytes per element), so the model's logits are
4·s·b·V / t_V beside the loss's fp32 log-softmax instead of a_b·s·b·V / t_V."""

_ALL_EXPERTS_FAMILIES = frozenset({"llama4", "llama4_text"})
"""MoE blocks that run every expert on every token, the non-selected ones with a zero score (Llama4TextMoe.forward:
``hidden_states.repeat(num_experts, 1) * router_scores``; Llama4TextExperts.forward: one bmm over all experts)."""


def moe_block_bytes(m, sb, ab: float, inner, width: float, tp: float):
    """Bytes ONE MoE layer's MLP block saves for backward (the block norm excluded), from what transformers 5.24
    saves (counted with ``calibrate.measure_activation_bytes``, docs/validation.md section 6).

    ``sb`` tokens (seq x micro-batch, float or array), ``ab`` activation element bytes, ``inner`` one expert's
    saved intermediate tensors for ``sb`` tokens (``width`` tensors of ffn_size, bytes), ``tp`` tensor-parallel
    degree. Returns bytes (shaped like ``sb``).

    - Router (``E`` experts, top ``k``): the softmax routers (Qwen3MoeTopKRouter / MixtralTopKRouter.forward)
      save their bf16 input, the fp32 softmax (4·sb·E, ``softmax(..., dtype=float)``) and the int64 top-k indices
      (8·sb·k); the fp32 routers (:data:`_FP32_ROUTER_FAMILIES`) an fp32 input copy (4·sb·h) and weight copy
      (4·h·E) instead of the bf16 input; the sigmoid group routers (:data:`_SIGMOID_GROUP_ROUTER_FAMILIES`) also
      the int64 indices of the top-2 per group (16·sb·G) and of the top groups (8·sb·G_k) and the bool expert
      mask (sb·E). Renormalised top-k weights (norm_topk_prob) add the fp32 divisor and dividend, 4·sb·(1 + k).
    - Experts dispatched by ``transformers.integrations.moe.grouped_mm_experts_forward`` (the default experts
      implementation of every ``@use_experts_implementation`` class): for the S = k·sb token-expert pairs, the
      int64 sort permutation, gather index and inverse permutation (24·S), the int32 expert offsets (4·E), the
      gathered input (a·S·h), each expert's ``inner`` tensors, its output kept for the routing-weight multiply
      (a·S·h) and the routing weights (a or 4 bytes per pair, :data:`_FP32_ROUTING_WEIGHT_FAMILIES`).
    - Llama 4 (:data:`_ALL_EXPERTS_FAMILIES`): every expert sees every token, so E copies of the input (the
      repeat and its product with the scores, 2·a·E·sb·h), E experts' ``inner`` and the bf16 score column
      (a·sb·E); its router saves the bf16 input, the int64 top-k indices and the fp32 sigmoid (4·sb·E).
    - The shared expert: ``width`` tensors of shared_expert_ffn_size; its input is the router's bf16 input (one
      storage, counted once); Qwen3-Next's sigmoid gate keeps the shared output and the gate (a·sb·(h + 1)).
    """
    h, e, k = float(m.hidden_size), float(m.n_experts), float(m.experts_per_token)
    fam = m.family
    shared = m.shared_expert_ffn_size
    norm_out = ab * sb * h  # the block norm's output, when a bf16 consumer (router or shared expert) keeps it
    if fam in _GEMMA4_FAMILIES:
        # Gemma4TextRouter.forward: a weight-free norm (fp32 upcast + two fp32 values per token), its output times
        # the scale vector and the product (the proj input), both bf16, the fp32 softmax, int64 top-k indices, the
        # renormalisation (fp32 divisor and dividend) and the per-expert scale gathered per pair (bf16) times the
        # fp32 weights (kept); the experts' input is pre_feedforward_layernorm_2's output (a block norm)
        router = (4.0 * sb * h + 8.0 * sb + 2.0 * ab * sb * h + 4.0 * sb * e + 8.0 * sb * k + 4.0 * sb * (1.0 + k)
                  + (ab + 4.0) * sb * k)
        experts = k * (2.0 * ab * sb * h + inner) + k * sb * (24.0 + 4.0) + 4.0 * e
    elif fam in _ALL_EXPERTS_FAMILIES:
        router = norm_out + 8.0 * sb * k + 4.0 * sb * e
        experts = e * (2.0 * ab * sb * h + inner) + ab * sb * e
    else:
        if fam in _FP32_ROUTER_FAMILIES:
            router = 4.0 * sb * h + 4.0 * h * e + 4.0 * sb * e + 8.0 * sb * k + (norm_out if shared else 0.0)
            if fam in _SIGMOID_GROUP_ROUTER_FAMILIES:
                router = router + 16.0 * sb * m.router_groups + 8.0 * sb * m.router_top_groups + sb * e
        elif fam in _TOPK_SOFTMAX_ROUTER_FAMILIES:
            router = norm_out + 8.0 * sb * k + ab * sb * k
        else:
            router = norm_out + 4.0 * sb * e + 8.0 * sb * k
        if m.router_norm_topk:
            router = router + 4.0 * sb * (1.0 + k)
        weight_bytes = 4.0 if fam in _FP32_ROUTING_WEIGHT_FAMILIES else ab
        experts = k * (2.0 * ab * sb * h + inner) + k * sb * (24.0 + weight_bytes) + 4.0 * e
    shared_bytes = width * ab * sb * shared / tp if shared else 0.0
    if shared and m.shared_expert_gate:
        shared_bytes = shared_bytes + ab * sb * (h + 1.0)
    return router + experts + shared_bytes


def layer_activation_bytes(ctx: Context, micro_batch: np.ndarray, checkpointing: np.ndarray,
                           sp: np.ndarray | None = None) -> np.ndarray:
    """Bytes saved for backward by ONE transformer layer for a micro-batch on one GPU, without checkpointing.

    micro_batch, checkpointing: int arrays (checkpointing 1 = selective drops the s^2 attention terms); sp: the
    Ulysses sequence-parallel degree P per candidate (int array, default 1). Returns float array, bytes.

    Ulysses (Jacobs et al., arXiv 2309.14509 Sec. 3; DeepSpeed 0.19.8 ``UlyssesSPAttentionHF``): everything outside
    attention's core holds the rank's s/P tokens (``sb`` below is the local tokens s·b/P); the core runs on the full
    sequence with n_heads/P query heads and max(kv_heads, P)/P KV heads, whose bytes are the local tokens times all
    heads (the KV width taken as max(kv_heads, P)·head_dim: DeepSpeed repeats KV heads up to P), its fp32
    log-sum-exp 4·(a/P)·s·b and the s^2 terms of eager attention (a/P)·s²·b; with P > 1 the output projection's
    input is the second all-to-all's output, a new tensor, and the kernel's q/k/v are the first all-to-all's
    outputs (so a fused QKV output is not kept alive through views). The llama layout of this is
    :func:`~.ulysses.activation_bytes_per_rank`, measured on the real engine (tests/evidence/
    test_ulysses_engine.py); the other families follow the same substitution, not measured under Ulysses. With P = 1
    every expression reduces to the unsplit one exactly (division by 1.0). ``TrainingSpec.tiled_mlp`` (ALST TiledMLP,
    DeepSpeed ``ulysses_sp.py`` ``TiledMLP``: the MLP runs over sequence tiles under no_grad and saves only its
    input) drops the dense MLP's intermediates here; one tile's are added once by :func:`tiled_mlp_tile_bytes`.
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
    split = sp is not None and bool(np.any(sp > 1))  # some candidate splits the sequence
    P = np.asarray(sp).astype(np.float64) if split else 1.0
    ulysses = P > 1.0
    sb = s * b / P  # tokens on this GPU (all of them without sequence parallelism)

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
    gemma_weight = (m.family in _GEMMA_NORM_FAMILIES and m.family.startswith("gemma")
                    or m.family in _FP32_NORM_WEIGHT_FAMILIES)
    if gemma_weight:
        # Gemma2/3RMSNorm save the fp32 (1 + weight.float()), Gemma4RMSNorm and NemotronHRMSNorm weight.float(): 4h
        norm = norm + 4.0 * h
    if m.family in _GEMMA4_FAMILIES:
        norm = norm + 4.0 * sb  # Gemma4RMSNorm: the torch.pow(mean_sq, -0.5) output beside the mean square
    qkv_in = ab * sb * h  # norm output, input of the Q/K/V projections
    rotary = m.learned_position_embeddings == 0 and m.family not in ("bloom",)
    def mixer(hq, hk, a, kv, d, repeat_kv):
        """Q/K/V kernel inputs, the attention core and the output projection's input for one layer shape."""
        # Gemma 2's attention-logit soft-capping is not implemented by flash/sdpa kernels: transformers runs eager
        # attention for it (Gemma2Config docs; modeling_gemma2.py eager_attention_forward applies the tanh cap)
        if t.flash_attention and not m.attn_logit_softcapping:
            # K/V repeated to n_heads before the kernel when transformers' use_gqa_in_sdpa refuses the kernel's
            # own GQA (integrations/sdpa_attention.py: a mask is present, or the head width exceeds 256)
            # Ulysses: K/V repeated to max(kv_heads, P) heads before the exchange (ulysses_sp.py
            # kv_replication_factor); the width per local token is then max(kv, P)·d
            kk = hq if repeat_kv else (np.where(ulysses, d * np.maximum(kv, P), hk) if split else hk)
            q_k_v = ab * sb * (hq + kk + (hv_mla or kk)) * ta  # inputs of the attention kernel
            out_copy = 0.0 * b
            if m.fused_qkv:
                # a view of the fused QKV output keeps all of it saved (GPT-2: Q, K, V are views; GPT-NeoX: V is,
                # and the rotary Q and K are new copies beside it); the output projection's input is a copy for
                # GPT-NeoX and, when the layer is recomputed under checkpointing, for GPT-2 (measured; a view
                # otherwise)
                fused_kept = ab * sb * (hq + hk) * ta if rotary else 0.0
                q_k_v = q_k_v + (np.where(ulysses, 0.0, fused_kept) if split else fused_kept)
                out_copy = np.where(checkpointing == 2, 1.0, 1.0 if rotary else 0.0) + 0.0 * b
            if m.rotary_fraction < 1.0:
                # partial rotary (GLM-4): apply_rotary_pos_emb concatenates the rotated and the passed-through
                # halves into new (b, heads, s, d)-contiguous Q and K, so the kernel output needs a copy before
                # o_proj (measured: one sbh-wide saved tensor per layer)
                out_copy = out_copy + 1.0
            if m.mla:
                # DeepseekV2/V3Attention.forward builds Q and K with torch.cat((pass, rot)) in (b, heads, s, d)
                # layout, so the output is copied before o_proj as with partial rotary (measured on CPU)
                out_copy = out_copy + 1.0
            hout = hv_mla or hq  # the output has the value width
            core = (ab * sb * hout + 4.0 * a * s * b / P) * ta  # output + fp32 log-sum-exp per (local) head
            core_s2 = 0.0 * b
            # Ulysses: the output projection reads the second all-to-all's output, one new tensor
            out_in = (np.where(ulysses, 1.0, out_copy) if split else out_copy) * ab * sb * hout * ta
        else:
            # eager attention repeats K/V heads to n_heads before matmuls
            q_k_v = ab * sb * (2 * hq + (hv_mla or hq)) * ta
            core = 0.0 * b
            # transformers' eager_attention_forward (llama, gemma2, ...): softmax(..., dtype=float32) saves its
            # fp32 output and .to(query.dtype) gives the bf16 probabilities the matmul with V saves (with dropout:
            # its 1-byte mask and output instead); Gemma 2's soft-capping adds tanh's output (measured: 8·a·s²
            # bytes per layer in bf16 with the cap)
            cast = ab if (ab < 4.0 or drop) else 0.0  # in fp32 the cast is the softmax output itself
            cap = ab if m.attn_logit_softcapping else 0.0
            core_s2 = (4.0 + cast + cap + drop) * a * s * s * b / P * ta
            if m.family in _WORKING_PRECISION_SOFTMAX_FAMILIES:
                # the softmax output in the working precision (saved by softmax and by the matmul with V); with
                # dropout also its 1-byte mask and output
                core_s2 = (ab + drop * (1.0 + ab)) * a * s * s * b / P * ta
            if m.family in _SINK_FAMILIES:
                # gpt-oss eager_attention_forward: the sink logit concatenated as column s + 1, the int64 argmax
                # of the max subtraction, softmax in the working precision (its output, s + 1 wide, is what the
                # matmul with V keeps, through a view)
                core_s2 = (ab * a * s * (s + 1.0) * b + 8.0 * a * s * b
                           + drop * (a * s * s * b + ab * a * s * s * b)) / P * ta
            out_in = ab * sb * (hv_mla or hq) * ta  # input of the output projection
        # q/k RMSNorms (Qwen3, Gemma 3/4, OLMo 2, Qwen3-Next): like the block norms, each saves its fp32 upcast
        # input and rstd (per head for 'head', per token for 'full') besides its normalised output (the kernel
        # input); Llama 4's weight-free L2 norm (Llama4TextL2Norm: x.float() * rsqrt(mean(x^2))) only the upcast
        # and the rstd
        if m.qk_norm in ("head", "full"):
            rows = (a + kv) if m.qk_norm == "head" else 2.0
            q_k_v = q_k_v + ((4.0 + nb) * sb * (hq + hk) + 4.0 * sb * rows) * ta
            if gemma_weight:  # the q and k norms' fp32 weight copies (d each), Gemma 4's power outputs
                q_k_v = q_k_v + (8.0 * d + (4.0 * sb * rows if gemma4 else 0.0)) * ta
        elif m.qk_norm == "l2":
            # Llama 4 NoPE layers have no q/k norm; they scale the queries by an fp32 temperature per position
            # instead (attn_temperature_tuning, Llama4TextAttention.forward: 4 bytes per token saved)
            nope = m.nope_layers / float(m.n_layers)
            q_k_v = q_k_v + (1.0 - nope) * (4.0 * sb * (hq + hk) + 4.0 * sb * (a + kv)) * ta + nope * 4.0 * s / P
        if gemma4:
            # Gemma4TextAttention.forward: v_norm (Gemma4RMSNorm with_scale=False) on the values: the fp32 upcast,
            # the mean square and its power per head
            q_k_v = q_k_v + (4.0 * sb * hk + 8.0 * sb * kv) * ta
        if m.gated_attention:
            # Qwen3NextAttention.forward: ``attn_output * torch.sigmoid(gate)`` keeps the sigmoid output beside the
            # attention output, and o_proj keeps the product (measured: two more sbh-wide tensors per layer)
            out_in = out_in + 2.0 * ab * sb * hq * ta
        # selective checkpointing drops the s^2 terms; under full checkpointing the recomputed layer saves them
        return q_k_v + core + np.where(checkpointing == 1, 0.0, core_s2) + out_in

    gemma4 = m.family in _GEMMA4_FAMILIES
    kv_heads = float(m.kv_heads)
    # MLA (DeepSeek-V2/V3, arXiv 2405.04434 Sec. 2.1; DeepseekV3Attention.forward): the kernel's values are
    # v_head_dim wide; the low-rank path saves q_a_layernorm and kv_a_layernorm (RMSNorms on the q_lora_rank and
    # kv_lora_rank latents) and the inputs of q_b_proj and kv_b_proj (the normalised latents)
    hv_mla = a * float(m.v_head_dim) if m.mla else 0.0
    mla_proj = 0.0
    if m.mla:
        for rank in (m.kv_lora_rank, m.q_lora_rank):
            if rank:
                mla_proj = mla_proj + (4.0 + ab) * sb * rank + 4.0 * sb + ab * sb * rank
    # K/V are repeated only for head widths above 256 (no flash kernel takes them); a sliding-window mask makes
    # transformers' sdpa path repeat them too, which flash_attention_2 does not (it applies the window itself):
    # the GPU kernel is what is priced
    if gemma4 and m.n_attention_layers < m.n_layers:
        # Gemma 4's full-attention layers (Gemma4TextAttention with layer_config.head_dim = global_head_dim,
        # num_global_key_value_heads); the other attention_layers are the sliding layers
        n_full = float(m.n_layers - m.n_attention_layers)
        gd = float(m.global_head_dim or m.dim_head)
        gkv = float(m.global_kv_heads or m.kv_heads)
        std = mixer(hq, hk, a, kv_heads, float(m.dim_head), m.dim_head > 256)
        full_layer = mixer(a * gd, gkv * gd, a, gkv, gd, gd > 256)
        layers = float(m.n_layers)
        mixed = ((layers - n_full) * std + n_full * full_layer) / layers
    else:
        mixed = mixer(hq, hk, a, kv_heads, float(m.dim_head), m.dim_head > 256)
    attn_drop = drop * sb * h
    # norms beyond the two pre-norms (Gemma's post-attention / post-feedforward, OLMo 2's, GLM-4's sandwich
    # norms, Gemma 4's MoE norms): each as a block norm on a hidden-width tensor
    extra_norms = max(0, m.norms_per_layer - 2) * norm
    lm = m.linear_mixer
    if lm is None:
        attention = norm + qkv_in + mixed + mla_proj + extra_norms
    else:
        # hybrid layers, averaged over n_layers as the MLP kinds below: attention_layers hold ``mixed``, the
        # linear_mixer layers :func:`linear_mixer_bytes`; both read the block norm's output (qkv_in). Layers with
        # neither (Nemotron-H's MLP and MoE blocks) have no mixer norm either
        n_att, n_lin = float(m.n_attention_layers), float(lm.layers)
        share = (n_att + n_lin) / float(m.n_layers)
        attention = (share * (norm + qkv_in) + (n_att * mixed + n_lin * linear_mixer_bytes(lm, sb, ab))
                     / float(m.n_layers) + mla_proj + extra_norms)
    attention = attention + attn_drop

    # MLP block (Korthikanti 19sbh for f = 4h, generalised)
    parallel = bool(getattr(m, "parallel_attention", False))
    mlp_norm = stats if parallel else norm
    mlp_in = ab * sb * h
    if m.ffn_kind == "swiglu":
        width = 4.0  # gate, up, act(gate), product
    else:
        width = 5.0 if m.family == "gpt2" else 2.0  # gelu_new's composed ops vs exact GELU (input, output)
    mlp_drop = drop * sb * h
    # MoE layers (moe_block_bytes); dense layers one MLP of dense_ffn_size. Layers of both kinds are averaged over
    # n_layers (exact for the total; the recomputed layer under full checkpointing is the average layer).
    expert_width = _EXPERT_SAVED_WIDTHS.get(m.family, width)
    moe = moe_block_bytes(m, sb, ab, expert_width * ab * sb * f / tp, width, tp) if m.n_moe_layers else 0.0
    # TiledMLP saves only its input (the norm output, mlp_in); the intermediates exist for one tile at a time
    dense = mlp_in + (0.0 if t.tiled_mlp else width * ab * sb * m.dense_width / tp)
    layers = float(m.n_layers)
    if lm is not None and m.norms_per_layer == 1:
        # one norm per block (Nemotron-H NemotronHBlock: norm, then one mixer or one MLP): the MLP norm only in
        # the MoE and dense-MLP blocks
        mlp_norm = mlp_norm * (m.n_moe_layers + m.n_dense_layers) / layers
    mlp = mlp_norm + mlp_drop + (m.n_moe_layers / layers) * moe + (m.n_dense_layers / layers) * dense
    return attention + mlp


def _rotary_table_width(m) -> float:
    """Width (elements per token) of the rotary cos/sin tables all layers share: head_dim x rotary_fraction, plus a
    second table of global_head_dim for Gemma 4's full-attention layers (Gemma4TextRotaryEmbedding builds one
    table per layer type; measured: (s, global_head_dim) cos and sin saved once)."""
    width = float(m.dim_head) * m.rotary_fraction
    if m.family in _GEMMA4_FAMILIES and m.n_attention_layers < m.n_layers:
        width += float(m.global_head_dim or m.dim_head)
    return width


def rotary_table_bytes(m, tokens: float, precision: str) -> float:
    """Bytes of the rotary cos/sin tables all layers share for ``tokens`` tokens (seq x micro-batch):
    2·r_b·tokens·d_rot with d_rot from :func:`_rotary_table_width` and r_b the working precision's element bytes
    (4 for OLMo 2's fp32 tables, :data:`_FP32_ROTARY_FAMILIES`); 0 with learned positions. The same quantity as
    :func:`activation_term`'s rotary part."""
    if m.learned_position_embeddings > 0 or m.family in _NO_POSITION_FAMILIES:
        return 0.0
    r_b = 4.0 if (m.family in _FP32_ROTARY_FAMILIES or precision == "fp32") else 2.0
    return 2.0 * r_b * float(tokens) * _rotary_table_width(m)


ACTIVATION_GROUPS = {
    "layers": ("layer inputs + one layer recomputed", "saved layer activations",
               "one layer input (the others offloaded to host) + one layer recomputed",
               "one TiledMLP tile's intermediates"),
    "final": ("final norm + lm_head inputs",),
    "inputs": ("token ids, labels, rotary tables",),
    "logits": ("logits + fp32 log-softmax", "soft-capped logits (tanh output)",
               "one loss chunk's logits + fp32 log-softmax, lm_head input gradient (tiled loss)",
               "one loss chunk's soft-capped logits (tiled loss)"),
    "vision": ("vision tower",),
}
"""The keys of :func:`activation_parts` and the labels of the :func:`activation_term` parts each one sums."""

TILED_LOSS_CHUNK_FP32_BYTES = 2**30
"""Tiled loss: fp32 logits bytes per chunk the shard count aims at, ``num_shards = ceil(tokens * vocab * 4 / 2**30)``
(transformers Trainer's ALST loss path and ArcticTraining ``sft_trainer.py``: "parameterize to about 1GB fp32 logits
shards", ``slice_size_in_gb = 1``), each chunk ``ceil(tokens / num_shards)`` tokens (``torch.chunk`` on the flattened
batch x sequence in DeepSpeed 0.19.8 ``TiledFusedLogitsLoss.forward``)."""


def sequence_parallel_degree(cand: Candidates) -> np.ndarray:
    """The Ulysses degree P per candidate as a float array (1.0 without sequence parallelism)."""
    return cand.sp.astype(np.float64)


def local_tokens(ctx: Context, cand: Candidates) -> np.ndarray:
    """Tokens one GPU holds per micro-batch: micro_batch x sequence_tokens / P (float array)."""
    return cand.micro_batch.astype(np.float64) * float(ctx.scenario.sequence_tokens) / sequence_parallel_degree(cand)


def loss_chunk_tokens(ctx: Context, cand: Candidates) -> np.ndarray:
    """Tokens of one tiled-loss chunk (:data:`TILED_LOSS_CHUNK_FP32_BYTES`): ceil(t / ceil(4·t·V / 2^30)) for the
    local tokens t (float array)."""
    tok = np.ceil(local_tokens(ctx, cand))
    shards = np.maximum(1.0, np.ceil(tok * 4.0 * ctx.scenario.model.vocab_size / TILED_LOSS_CHUNK_FP32_BYTES))
    return np.ceil(tok / shards)


def tiled_mlp_tile_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """Bytes of ONE TiledMLP tile's MLP intermediates (its recomputation with grad in backward), per GPU.

    DeepSpeed 0.19.8 ``ulysses_sp.py`` ``TiledMLP`` (ALST, Bekman et al. arXiv 2506.13996 Sec. 3.2): the dense MLP
    runs under no_grad over ``num_shards = ceil(seqlen / hidden_size)`` chunks of the local sequence
    (``tiled_mlp_forward`` in its docstring, the form ArcticTraining's ``enable_tiled_mlp_compute`` uses), saving
    only its input; backward recomputes one chunk at a time, ``torch.chunk`` of the flattened ``b * s_l`` tokens
    into ``num_shards``: ``ceil(b * s_l / num_shards)`` tokens, each with the dense MLP's saved width (SwiGLU 4
    tensors of ffn_size, GELU 2, GPT-2's gelu_new 5). Measured on CPU (tests/evidence/test_tiled_mlp_census.py:
    DeepSpeed's TiledMLP in transformers' LlamaMLP, saved-tensor census): the forward saves no MLP intermediates
    and each recomputed tile saves exactly this. MoE layers are not tiled (TiledMLP wraps a dense MLP). Float
    array, bytes; 0 when ``tiled_mlp`` is off.
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    if not t.tiled_mlp or m.n_dense_layers == 0:
        return np.zeros(cand.shape)
    ab = 4.0 if t.precision == "fp32" else 2.0
    s_local = np.ceil(float(sc.sequence_tokens) / sequence_parallel_degree(cand))
    shards = np.ceil(s_local / float(m.hidden_size))
    tile = np.ceil(cand.micro_batch.astype(np.float64) * s_local / shards)
    width = 4.0 if m.ffn_kind == "swiglu" else (5.0 if m.family == "gpt2" else 2.0)
    return width * ab * tile * float(m.dense_width) / float(ctx.tp)


def activation_term(ctx: Context, cand: Candidates) -> TermParts:
    """Peak activation bytes per GPU for one micro-batch (forward finished, backward starting), by part:

    - the layers: L layers' saved tensors (none/selective), or with full checkpointing the L stored layer inputs
      plus one layer recomputed in backward, minus the recomputed layer's LayerNorm input, which is the stored
      layer input itself (measured: no new storage; HF's RMSNorm saves an fp32 upcast instead, a new storage);
      with ``checkpoint_offload`` the stored inputs live in host RAM (memory.host_parts) and one is back on the GPU
      for the layer being recomputed (ALST Sec. 3.3; ArcticTraining ``CheckpointFunctionWithCPUOffload``);
    - the final norm (as in the layers: RMSNorm's fp32 upcast and rstd, LayerNorm's input and statistics) and
      the lm_head input;
    - int64 input ids and labels (8 bytes each per token) and the rotary cos/sin tables shared by all layers
      (2·r_b·s·b·d_rot: the rotated width head_dim x rotary_fraction, r_b = a_b, 4 for OLMo 2's fp32 tables;
      none with learned positions);
    - the 16-bit logits the model returns (fp32 for :data:`_FP32_LOGITS_FAMILIES`) and the fp32 log-softmax the
      loss saves, (a_b + 4)·s·b·V / t_V, and with
      final_logit_softcapping (Gemma 2/4) the tanh output over the logits, a_b·s·b·V / t_V
      (Gemma2ForCausalLM.forward: ``logits = torch.tanh(logits / cap) * cap``); t_V = t where DeepSpeed's AutoTP
      computes a tied head's loss vocab-parallel, 1 for an untied lm_head, whose logits AutoTP gathers whole on
      every rank (``LinearLayer(gather_output=True)``, module_inject/auto_tp.py ``training_column_lm_head``;
      measured: tests/evidence/test_autotp_engine.py); with ``tiled_loss`` (DeepSpeed
      ``TiledFusedLogitsLoss``: backward inside forward, chunk by chunk) one chunk's (s_c tokens,
      :func:`loss_chunk_tokens`) plus the gradient of the lm_head input it fills, a_b·s·b·h / P;
    - with ``tiled_mlp`` one tile's MLP intermediates (:func:`tiled_mlp_tile_bytes`);
    - the vision tower's saved tensors for images_per_sample x micro-batch images (Qwen2-VL / Qwen2.5-VL /
      Gemma 3 / Gemma 4 / Llama 4; :func:`zeroplanner.costmodel.vision.vision_activation_bytes`: trainable, or frozen under
      full checkpointing, where transformers still records the checkpointed blocks, except Gemma 4's), not split by sequence parallelism.

    Ulysses sequence parallelism (degree p = ``sequence_parallel_size``): every per-token part holds the GPU's
    s/p tokens (the layer term as :func:`layer_activation_bytes` splits it). Every part except the
    sequence-parallel, offload and tiling ones was checked against the saved-tensor measurement
    (docs/validation.md); the Ulysses llama layout on the real engine (tests/evidence/test_ulysses_engine.py).
    """
    sc = ctx.scenario
    m, t = sc.model, sc.training
    rms = m.norm_kind == "rmsnorm"
    rotary = m.learned_position_embeddings <= 0 and m.family not in _NO_POSITION_FAMILIES
    full = cand.checkpointing == 2
    off = full & t.checkpoint_offload
    keep = full & (not t.checkpoint_offload)
    tiled = t.tiled_loss
    split = bool(np.any(cand.sp > 1))
    x = {"L": float(m.n_layers), "s": float(sc.sequence_tokens), "b": cand.micro_batch.astype(np.float64),
         "h": float(m.hidden_size), "V": float(m.vocab_size), "a_b": 4.0 if t.precision == "fp32" else 2.0,
         "d_rot": _rotary_table_width(m), "t": float(ctx.tp), "p": sequence_parallel_degree(cand) if split else 1.0,
         "t_V": float(ctx.tp) if m.tied_embeddings else 1.0,
         "r_b": 4.0 if (m.family in _FP32_ROTARY_FAMILIES or t.precision == "fp32") else 2.0,
         "n_b": 4.0 if m.family in _GEMMA_NORM_FAMILIES else (4.0 if t.precision == "fp32" else 2.0),
         "layer": layer_activation_bytes(ctx, cand.micro_batch, cand.checkpointing, cand.sp if split else None),
         "s_c": loss_chunk_tokens(ctx, cand) if tiled else 0.0,
         "A_tile": tiled_mlp_tile_bytes(ctx, cand) if t.tiled_mlp else 0.0,
         "vision": vision_activation_bytes(  # the trainable tower's saved tensors (costmodel/vision.py)
             m.vision, t.images_per_sample * cand.micro_batch, activation_bytes=4.0 if t.precision == "fp32" else 2.0,
             checkpointing=cand.checkpointing, flash_attention=t.flash_attention,
             trainable=t.trains_vision_tower)}
    rows = [
        ("layer inputs + one layer recomputed", "L*a_b*s/p*b*h + layer", keep & rms),
        ("layer inputs + one layer recomputed", "L*a_b*s/p*b*h + layer - a_b*s/p*b*h", keep & (not rms)),
    ]
    if t.checkpoint_offload:
        rows += [("one layer input (the others offloaded to host) + one layer recomputed", "a_b*s/p*b*h + layer",
                  off & rms),
                 ("one layer input (the others offloaded to host) + one layer recomputed", "layer", off & (not rms))]
    rows.append(("saved layer activations", "L*layer", ~full))
    if t.tiled_mlp:
        rows.append(("one TiledMLP tile's intermediates", "A_tile", True))
    rows += [
        ("final norm + lm_head inputs", "(4+n_b)*s/p*b*h + 4*s/p*b + a_b*s/p*b*h", rms),
        ("final norm + lm_head inputs", "a_b*s/p*b*h + 8*s/p*b + a_b*s/p*b*h", not rms),
        ("token ids, labels, rotary tables", "16*s/p*b + 2*r_b*s/p*b*d_rot", rotary),
        ("token ids, labels, rotary tables", "16*s/p*b", not rotary),
    ]
    if tiled:
        rows += [("one loss chunk's logits + fp32 log-softmax, lm_head input gradient (tiled loss)",
                  "(a_b+4)*s_c*V/t_V + a_b*s/p*b*h", True),
                 ("one loss chunk's soft-capped logits (tiled loss)", "a_b*s_c*V/t_V", m.final_logit_softcapping)]
    else:
        fp32_logits = m.family in _FP32_LOGITS_FAMILIES
        rows += [("logits + fp32 log-softmax", "(a_b+4)*s/p*b*V/t_V", not fp32_logits),
                 ("logits + fp32 log-softmax", "(4+4)*s/p*b*V/t_V", fp32_logits),
                 ("soft-capped logits (tanh output)", "a_b*s/p*b*V/t_V", m.final_logit_softcapping)]
    # the vision tower's images are not split over the Ulysses ranks (each rank encodes them whole; not measured)
    rows.append(("vision tower", "vision", m.vision is not None and t.images_per_sample > 0))
    if not split:  # no candidate splits the sequence: the formulas as shown without Ulysses
        rows = [(label, expr.replace("s/p*", "s*"), when) for label, expr, when in rows]
    return term("activations", x, rows)


def checkpoint_offload_bytes_per_micro(ctx: Context, cand: Candidates) -> np.ndarray:
    """Bytes ``checkpoint_offload`` moves over PCIe per GPU per micro-step: the L checkpointed layer inputs
    (a_b·s·b·h / P each) to the host in forward and back in backward, 2·L·a_b·s·b·h / P; 0 without it (or without
    full checkpointing). ArcticTraining's ``CheckpointFunctionWithCPUOffload`` (the ALST implementation) copies
    them blocking ("isn't yet efficient (blocking)", ArcticTraining projects/sequence-parallelism USAGE.md), so
    evaluate.step_terms prices the transfer as exposed. Float array, bytes."""
    t = ctx.scenario.training
    if not t.checkpoint_offload:
        return np.zeros(cand.shape)
    ab = 4.0 if t.precision == "fp32" else 2.0
    m = ctx.scenario.model
    per = 2.0 * m.n_layers * ab * local_tokens(ctx, cand) * float(m.hidden_size)
    return np.where(cand.checkpointing == 2, per, 0.0)


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
