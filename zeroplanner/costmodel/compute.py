"""Compute time per optimizer step (the optimizer step and offload traffic are priced in ``evaluate.step_terms``).

FLOPs per token (PaLM, Chowdhery et al., arXiv 2204.02311, Appendix B): 6N + 12·L·H·Q·T for training, where N
counts matmul weights (active experts only) and the second term is attention (T = sequence length, H·Q the query
width). LoRA/QLoRA: frozen weights need no weight gradient, so 4N instead of 6N for them (forward 2N + input
gradients 2N; Hu et al., arXiv 2106.09685). Recomputation adds a forward: full checkpointing 2N + 4·L·H·Q·T,
selective only the attention core 4·L·H·Q·T (Korthikanti et al., arXiv 2205.05198, Sec. 5). MFU counts model FLOPs
only; the time uses executed FLOPs at :func:`achieved_fraction` of the dense peak (the GEMMs) plus the
memory-bound kernels' bytes over HBM bandwidth (:func:`memory_bound_seconds_micro`: per-token bytes counted on
real transformers models; they scale with tokens, layers x hidden, vocabulary and, for eager attention, tokens x
sequence, not with FLOPs). With ``Assumptions.mfu`` fixed by the user, that fraction covers the whole compute.
"""

from __future__ import annotations

import numpy as np

from .context import Candidates, Context
from .steptime_constants import FITTED
from .terms import define

MAMF_FRACTION = {
    "ampere": 0.869, "hopper": 0.803, "cdna3": 0.601,
}
"""Maximum achievable matmul FLOPs / dense peak, bf16, measured with mamf-finder.py (stas00/ml-engineering,
compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison table": A100 SXM 271.2 of 312 = 86.9%,
H100 SXM 794.5 of 989 = 80.3%, MI300X 781.9 of 1300 = 60.1%). Generations the table lacks use the nearest
measured one (Ada -> Ampere; Volta and Turing have their own end-to-end figure below)."""

END_TO_END_FRACTION_AMPERE = 0.72
"""End-to-end training MFU on A100 with FlashAttention-2: "up to 225 TFLOPs/s per A100 GPU (72% model FLOPs
utilization)" (Dao, arXiv 2307.08691, Sec. 4.3; GPT-3 2.7B, hidden 2560, 8k context). Divided by the A100's MAMF
fraction it gives the share of a step that runs at matmul speed (0.83: norms, activations, softmax, optimizer
kernels), applied to every generation."""

END_TO_END_FRACTION_VOLTA = 0.30
"""V100 end-to-end: "a strong single GPU baseline that sustains 39 TeraFLOPs during the overall training process,
which is 30% of the theoretical peak FLOPS" (Megatron-LM, Shoeybi et al., arXiv 1909.08053, Sec. 1 and 5.1; 1.2B
GPT-2, hidden 1536, sequence 1024, no fused attention). Used for Turing (same tensor-core generation, no bf16)."""

REFERENCE_HIDDEN = {"volta": 1536, "turing": 1536}
"""Hidden size of the run each end-to-end fraction was measured on (the GEMM-size factor is 1 there)."""


def gpu_generation(name: str) -> str:
    """volta | turing | ampere | ada | hopper | cdna3 from the catalog name (NVIDIA/AMD product families)."""
    n = name.upper()
    if n.startswith("V100"):
        return "volta"
    if "TITAN-RTX" in n or "RTX-20" in n or n.startswith("T4"):
        return "turing"
    if n.startswith(("H100", "H200", "H800", "GH200")):
        return "hopper"
    if n.startswith(("RTX-40", "L40", "L4")):
        return "ada"
    if n.startswith("MI3"):
        return "cdna3"
    return "ampere"


def achieved_fraction(ctx: Context, cand: Candidates) -> np.ndarray:
    """Fraction of the dense peak the GEMMs of a training step reach, per candidate (the memory-bound kernels are
    priced apart, :func:`memory_bound_seconds_micro`).

    ``Assumptions.mfu`` when the user fixed it (not None; then it covers the whole step); else generation x GEMM
    size: generation: Ampere 0.72 at hidden 2560 (FlashAttention-2), Hopper/CDNA3 scaled by their MAMF fraction
    against the A100's, Volta/Turing 0.30 at hidden 1536 (Megatron-LM); GEMM size: h / (h + h_half) relative to the
    reference run's, with h the hidden size per tensor-parallel rank and h_half fitted once
    (:data:`~.steptime_constants.FITTED`) on the measured runs of shared/references/THROUGHPUT.md; capped at
    :func:`ceiling_fraction` (no run beats its generation's measured matmul ceiling). Returns a float array shaped
    like ``cand``.
    """
    a = ctx.scenario.assumptions
    if a.mfu is not None:
        return np.full(cand.shape, a.mfu)
    gen = gpu_generation(ctx.gpu_name)
    h_half = FITTED["gemm_hidden_half"]
    if gen in ("volta", "turing"):
        base, h_ref = END_TO_END_FRACTION_VOLTA, REFERENCE_HIDDEN[gen]
    else:
        mamf = MAMF_FRACTION.get(gen, MAMF_FRACTION["ampere"])
        base, h_ref = END_TO_END_FRACTION_AMPERE * mamf / MAMF_FRACTION["ampere"], 2560
    h = ctx.hidden_size / ctx.tp
    frac = base * (h / (h + h_half)) / (h_ref / (h_ref + h_half))
    return np.full(cand.shape, min(frac, ceiling_fraction(gen)))


def ceiling_fraction(gen: str) -> float:
    """The most a whole training step reaches: the MAMF fraction times the matmul share of a step measured at
    FlashAttention-2's 72% on A100 (0.72 / 0.869 = 0.83); generations without a MAMF figure use the A100's."""
    mamf = MAMF_FRACTION.get(gen, MAMF_FRACTION["ampere"])
    return END_TO_END_FRACTION_AMPERE / MAMF_FRACTION["ampere"] * mamf


def flops_per_token(ctx: Context, cand: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model FLOPs per token, executed FLOPs per token, forward FLOPs per token), per tensor-parallel rank.
    Executed = model + recompute + the vision tower's recompute (:func:`flops_per_token_parts`)."""
    f = flops_per_token_parts(ctx, cand)
    return f["F_model"], f["F_model"] + f["F_rec"] + f["F_vrec"], f["F_fwd"]


def flops_per_token_parts(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """FLOPs per token per tensor-parallel rank, by part (float arrays shaped like ``cand``): "F_model" (model
    FLOPs: 6N + 12·L·H·Q·T, frozen weights 4N, + the vision tower's), "F_rec" (the language model's recompute:
    full checkpointing one forward, selective the attention core, TiledMLP the dense MLP's forward), "F_vrec" (the
    vision tower's recompute), "F_fwd" (forward FLOPs). Names are :data:`~.terms.SYMBOLS` inputs."""
    sc = ctx.scenario
    m, t = sc.model, sc.training
    tp = float(ctx.tp)
    share = ctx.tp_attention_share  # 1/tp unless AutoTP splits the heads unevenly (context.attention_tp_share)
    matmul = m.matmul_params_per_token / tp + m.n_attention_layers * m.attention_params * (share - 1.0 / tp)
    # attention layers only (hybrid models' linear-attention/Mamba blocks count in matmul_params_per_token);
    # image tokens lengthen the language model's sequence (Scenario.sequence_tokens)
    attention = 12.0 * m.n_attention_layers * m.q_size * sc.sequence_tokens * share
    if t.lora_rank:
        lora = sc.trainable_parameters / tp
        model = 4.0 * matmul + 6.0 * lora + attention
    else:
        lora = 0.0
        model = 6.0 * matmul + attention
    fwd = 2.0 * (matmul + lora) + attention / 3.0
    recompute = np.select(
        [cand.checkpointing == 2, cand.checkpointing == 1], [fwd + 0.0, attention / 3.0 + 0.0 * fwd], 0.0
    )
    if t.tiled_mlp:
        # TiledMLP runs the dense MLP's forward again in backward (no_grad forward, recompute with grad per tile;
        # DeepSpeed 0.19.8 ulysses_sp.py TiledMLP docstring: "the forward occurs twice each iteration")
        recompute = recompute + 2.0 * m.n_dense_layers * m.dense_mlp_params / tp
    v_model, v_recompute, v_fwd = vision_flops_per_token(sc, cand)
    model_arr = model + v_model + 0.0 * recompute
    return {"F_model": model_arr, "F_rec": recompute + 0.0 * model_arr, "F_vrec": v_recompute + 0.0 * model_arr,
            "F_fwd": fwd + v_fwd + 0.0 * recompute}


def vision_flops_per_token(sc, cand: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The vision tower's (model, recompute, forward) FLOPs per language-model token on one rank (zero for a
    text-only model, or a tower whose shape the reader does not know).

    Per sample the tower encodes ``images_per_sample`` images of ``patches_per_image`` (+ class tokens) rows
    through its ``vision_params`` weights: 2·Ψ_v per row forward (the 6N rule's forward, PaLM Appendix B), 6·Ψ_v
    trained, 2·Ψ_v frozen (``freeze_vision`` or LoRA on the language model: no weight gradients, and the pixel
    input needs no input gradient, so no backward at all), plus a recomputed forward under full checkpointing
    for a trained tower (transformers' vision blocks honour ``gradient_checkpointing``). Every Ulysses rank
    encodes its images whole (the language model's tokens are split, the images are not), so the per-token figure
    is multiplied by sp. Approximations: the projector / merger weights are counted over all patch rows (they run
    on the merged rows: Qwen2.5-VL's merger is ~7% of its tower's weights over 1/4 of the rows), and the tower's
    attention core (4·rows²·width per block: at most ~12% of a Qwen2.5-VL full-attention block's FLOPs at 1,024
    patches, less in its windowed blocks) is not counted."""
    m, t = sc.model, sc.training
    if m.vision is None or not t.images_per_sample or not m.vision_params:
        zero = 0.0 * cand.sp
        return zero, zero, zero
    rows = float(t.images_per_sample * (m.vision.patches_per_image + m.vision.class_tokens))
    per_token = rows * float(m.vision_params) / float(sc.sequence_tokens) * cand.sp.astype(np.float64)
    trains = t.trains_vision_tower
    fwd = 2.0 * per_token
    model = (6.0 if trains else 2.0) * per_token
    recompute = np.where(cand.checkpointing == 2, fwd, 0.0) if trains else 0.0 * fwd
    return model, recompute, fwd


COMPUTE_DEFINITIONS: tuple[tuple[str, str, str], ...] = (
    ("F_x", "executed FLOPs per token", "F_model + F_rec + F_vrec"),
    ("t_micro", "compute of one micro-step", "n_tok*F_x/(P_peak*eta) + t_mem + t_dq"),
    ("t_cf", "forward", "n_tok*F_fwd/(P_peak*eta) + t_memf"),
    ("t_cb", "backward (incl. recompute)", "t_micro - t_cf"),
    ("t_compute", "micro-steps", "GA*t_micro"),
)
"""The compute time as expressions (:mod:`.terms`; name, label, expression), evaluated in this order by
:func:`compute_terms`: executed FLOPs per token (model + recompute), a micro-step's compute (the GEMMs at
``eta`` of the dense peak, the memory-bound kernels, QLoRA dequantisation), its forward (what the forward
collectives overlap) and backward, and the step's compute (GA micro-steps)."""


def compute_terms(ctx: Context, cand: Candidates) -> dict:
    """Compute seconds per step and per micro-step (forward / backward), model FLOPs per GPU per step.

    Per micro-step: tokens x executed FLOPs per token / (peak x :func:`achieved_fraction`) + the memory-bound
    kernels (:func:`memory_bound_seconds_micro`) + QLoRA dequantisation, computed through the expressions of
    :data:`COMPUTE_DEFINITIONS` (explain mode prints the same ones).
    Returns dict of float arrays: "seconds", "fwd_seconds_micro", "bwd_seconds_micro", "model_flops",
    "dequant_seconds_micro", "memory_seconds_micro", "gemm_fraction" (:func:`achieved_fraction`) and
    "achieved_fraction" (the effective fraction of the peak of GEMMs and memory-bound kernels together: what
    ``--mfu`` would have to be for the same compute time); "terms": name -> :class:`~.terms.TermParts` of each
    definition, in order, whose ``inputs`` hold every input and defined value by :data:`~.terms.SYMBOLS` name.
    """
    flops = flops_per_token_parts(ctx, cand)
    # Ulysses: each GPU computes its s/P tokens (and attention for n_heads/P heads over the whole sequence, the same
    # FLOPs as s/P tokens' share); FLOPs per token are unchanged
    tokens_micro = cand.micro_batch.astype(np.float64) * ctx.scenario.sequence_tokens / cand.sp
    frac = achieved_fraction(ctx, cand)
    mem_total, mem_fwd = memory_bound_seconds_micro(ctx, cand)
    ga = cand.grad_accum.astype(np.float64)
    dq = qlora_dequant_seconds_micro(ctx, cand)
    env = {**flops, "GA": ga, "n_tok": tokens_micro, "P_peak": ctx.peak_flops, "eta": frac, "t_mem": mem_total,
           "t_memf": mem_fwd, "t_dq": dq}
    terms = {name: define(env, name, [(label, expr, True)]) for name, label, expr in COMPUTE_DEFINITIONS}
    micro = env["t_micro"]
    return {
        "terms": terms,
        "dequant_seconds_micro": dq,
        "seconds": env["t_compute"],
        "fwd_seconds_micro": env["t_cf"],
        "bwd_seconds_micro": env["t_cb"],
        "model_flops": ga * tokens_micro * flops["F_model"],
        "achieved_fraction": tokens_micro * env["F_x"] / (micro - dq) / ctx.peak_flops,
        "gemm_fraction": ctx.peak_flops * frac / ctx.peak_flops,
        "memory_seconds_micro": mem_total,
    }


ELEMENTWISE_BYTES_PER_HIDDEN = {"gelu": 662.0, "swiglu": 505.0}
"""HBM bytes per token per layer per unit of hidden size that the non-GEMM kernels of one training forward+backward
move (layer norms, activation function, bias, dropout, residual adds, rotary embedding, head split/merge copies).
MEASURED here, not fitted: every aten op of a real transformers model's forward and backward (eager PyTorch, bf16,
CPU) counted with a TorchDispatchMode, its input and output tensor bytes summed, GEMMs, attention kernels and views
excluded (tests/evidence/test_steptime.py ``_count_non_gemm_bytes``); bytes per step at sequence 128/256/384 solved
for per-step + per-token + per-token x s parts, 4 layers minus 2 (hidden 256, 4 heads): "gelu" on BLOOM (662.1, FFN 4 x
hidden: bigscience's tanh GeLU runs as separate eager elementwise ops), "swiglu" on Llama (504.8 eager attention,
496.9 sdpa, FFN 2.66 x hidden: eager RMSNorm, SiLU x up, rotary); other FFN widths and MoE layers are priced at
these per-hidden counts. The per-step part is 3-11 KB per layer (negligible). Memory-bound kernels:
seconds = bytes / HBM bandwidth (roofline, Williams et al., CACM 2009)."""

SCORE_BYTES_PER_ELEMENT = {"gelu": 49.0, "swiglu": 57.0}
"""HBM bytes per attention-score element (heads x sequence per token per attention layer) of eager attention,
forward and backward (scores written, scaled and masked, softmax with its fp32 upcast, probabilities read by the
second matmul, and their backward), measured by the same count as the second difference over s, 2s, 3s (BLOOM:
ALiBi baddbmm + fp32 softmax, 49.0; Llama eager 57.0); 0 with flash/sdpa attention (the same count with sdpa
measures 0.0)."""

LOGIT_BYTES_PER_ELEMENT = {"gelu": 64.0, "swiglu": 52.0}
"""HBM bytes per logit element (tokens x vocabulary) of the causal-LM loss, forward and backward (lm_head output,
fp32 upcast, log-softmax, NLL and their backward; BLOOM's shifted .contiguous() copy), measured by the same count
(vocabulary 2048 vs 4096: BLOOM 64.0, Llama 52.0)."""

FORWARD_BYTES_SHARE = 0.35
"""Share of those bytes moved in the forward pass (what a recompute repeats), measured by the same count with the
forward counted alone (hidden 512, 4 layers, sequence 256, gradients not accumulated): BLOOM 0.348, Llama eager
0.380, Llama sdpa 0.331 (tests/evidence/test_steptime.py re-measures them)."""


def memory_bound_seconds_micro(ctx: Context, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """(seconds per micro-step, of which forward) of the memory-bound non-GEMM work: tokens x (layers x hidden x
    ELEMENTWISE_BYTES_PER_HIDDEN + (eager attention only) attention layers x heads x sequence x
    SCORE_BYTES_PER_ELEMENT + vocabulary x LOGIT_BYTES_PER_ELEMENT) / HBM bandwidth; full checkpointing repeats
    the layers' forward share, selective the attention scores' forward share. 0 where ``Assumptions.mfu`` is fixed
    (the user's fraction covers the whole step)."""
    sc = ctx.scenario
    if sc.assumptions.mfu is not None:
        z = np.zeros(cand.shape)
        return z, z
    m, t = sc.model, sc.training
    kind = "swiglu" if m.ffn_kind == "swiglu" else "gelu"
    tp = float(ctx.tp)
    tokens = cand.micro_batch.astype(np.float64) * sc.sequence_tokens / cand.sp  # this GPU's tokens (Ulysses: s/P)
    layer = m.n_layers * m.hidden_size * ELEMENTWISE_BYTES_PER_HIDDEN[kind] / tp
    eager = not t.flash_attention or bool(m.attn_logit_softcapping)
    scores = (m.n_attention_layers * m.n_heads * sc.sequence_tokens * SCORE_BYTES_PER_ELEMENT[kind] / tp
              if eager else 0.0)
    # AutoTP gathers an untied lm_head's logits on every rank (the loss runs on all of them); a tied head's loss is
    # vocab-parallel (activations.activation_term, t_V)
    logits = m.vocab_size * LOGIT_BYTES_PER_ELEMENT[kind] / (tp if m.tied_embeddings else 1.0)
    recompute = np.select([cand.checkpointing == 2, cand.checkpointing == 1],
                          [FORWARD_BYTES_SHARE * (layer + scores), FORWARD_BYTES_SHARE * scores], 0.0)
    per_token = layer + scores + logits + recompute
    bw = ctx.hbm_bytes_per_second
    total = tokens * per_token / bw
    fwd = tokens * FORWARD_BYTES_SHARE * (layer + scores + logits) / bw
    return total, fwd


QLORA_DEQUANT_BYTES = 0.5 + 2.0 + 2.0
"""HBM bytes per frozen parameter per dequantisation: read the NF4 weight (0.5 B; absmax scales add ~0.016), write
the 16-bit weight (2 B) and read it back in the GEMM (2 B). bitsandbytes dequantises the whole weight before each
matmul (``bnb.functional.dequantize_4bit`` inside ``MatMul4Bit`` forward and backward; Dettmers et al., QLoRA,
arXiv 2305.14314, Sec. 3), a memory-bound kernel: time = bytes / HBM bandwidth (roofline)."""


def qlora_dequant_seconds_micro(ctx: Context, cand: Candidates) -> np.ndarray:
    """QLoRA: dequantisations per micro-step = forward + backward (input gradient) + recompute forward with full
    checkpointing, each over every frozen 4-bit weight. 0 without QLoRA."""
    if not ctx.scenario.training.qlora:
        return np.zeros(cand.shape)
    passes = 2.0 + (cand.checkpointing == 2)
    return passes * ctx.frozen * QLORA_DEQUANT_BYTES / ctx.hbm_bytes_per_second
