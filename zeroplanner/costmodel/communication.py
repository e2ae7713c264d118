"""Communication volume and time per optimizer step, per GPU.

Volumes (ZeRO paper, arXiv 1910.02054, Sec. 7): data parallelism all-reduces the gradients (2Ψ per GPU as
reduce-scatter + all-gather); ZeRO-1/2 reduce-scatter gradients and all-gather updated parameters (2Ψ); ZeRO-3
all-gathers parameters in forward and again in backward and reduce-scatters gradients (3Ψ). ZeRO++ (Wang et al.,
arXiv 2306.10209, Sec. 3; DeepSpeed blog): qwZ sends int8 weights in the forward all-gather (0.5x), hpZ keeps a
secondary copy inside the node so the backward all-gather never crosses nodes, qgZ reduces gradients in int4
(0.25x).

What DeepSpeed 0.19.8 actually sends (accounting "deepspeed"): stage 0 all-reduces once per step after backward
(engine.allreduce_gradients); stages 1-2 reduce each gradient bucket with an ALL-REDUCE, not a reduce-scatter
(stage_1_and_2.py ``average_tensor``: ``use_multi_rank_bucket_allreduce`` defaults to True in
deepspeed/runtime/zero/config.py, so buckets go through ``allreduce_and_scatter``), i.e. 2Ψ for the gradients plus
Ψ for the parameter all-gather; stage 1 reduces at the gradient-accumulation boundary, stage 2 every micro-step
inside backward (ipg buckets); stage 3 gathers and reduces every micro-step (stage3.py). Accounting "paper" uses
the paper's reduce-scatter.

Time (alpha-beta, Hockney 1994) of ring collectives over n ranks: latency + factor * bytes / busbw with
factor 2(n-1)/n for all-reduce and (n-1)/n for reduce-scatter / all-gather and busbw as defined by nccl-tests
(PERFORMANCE.md); the latency follows NCCL's tuning model (see :func:`ring_seconds`). Across nodes the ring's
bandwidth is the smaller of the NVLink/PCIe bus bandwidth and the node's NICs together. Each bucket is one
collective and pays the latency again.
"""

from __future__ import annotations

import numpy as np

from .context import Candidates, Context, data_parallel_degree, overlap_comm
from .terms import TermParts, term

STAGE0_ALLREDUCE_BUCKET = 500_000_000
"""DeepSpeed's stage-0 gradient all-reduce bucket (MEMORY_OPT_ALLREDUCE_SIZE in deepspeed/runtime/engine.py,
used by engine.allreduce_gradients -> buffered_allreduce_fallback)."""

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


NCCL_BASE_LATENCY_SECONDS = 8.4e-6
"""Fixed cost of one NCCL ring/Simple collective (``baseLat`` in NVIDIA/nccl src/graph/tuning.cc, NCCL 2.19+)."""
NCCL_MULTINODE_ALLREDUCE_PLATEAU = 1.4
"""NCCL's latency factor for multi-node ring all-reduce on Ampere and newer (tuning.cc; x1.9 on Volta)."""


def ring_seconds(
    ctx: Context,
    kind: str,
    message_bytes: np.ndarray,
    ranks: np.ndarray,
    collectives: np.ndarray,
    cross_node: np.ndarray,
    nodes: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds for ``collectives`` ring collectives moving ``message_bytes`` in total among ``ranks`` ranks.

    kind: "all_reduce" | "reduce_scatter" | "all_gather". message_bytes is the nccl-tests "size" (the full tensor
    of an all-reduce, the input of a reduce-scatter, the output of an all-gather), summed over the buckets.
    Latency per collective follows NCCL's own model (src/graph/tuning.cc): base + intra-node steps x the GPU's
    link latency + network steps x the network's latency, with 2*nodes network steps for an all-reduce and
    nodes-1 for reduce-scatter / all-gather (and NCCL's x1.4 plateau for multi-node all-reduce). Bandwidth: the
    ring's bus bandwidth, the smaller of the intra-node busbw and the node's NICs when it crosses nodes.
    Returns 0 where ranks == 1.
    """
    n = np.maximum(ranks.astype(np.float64), 1.0)
    k = np.where(cross_node, np.maximum(nodes if nodes is not None else 2, 2), 1).astype(np.float64)
    if kind == "all_reduce":
        factor, steps = 2.0 * (n - 1.0) / n, 2.0 * (n - 1.0)
        inter = np.where(cross_node, 2.0 * k, 0.0)
        plateau = np.where(cross_node, NCCL_MULTINODE_ALLREDUCE_PLATEAU, 1.0)
    else:
        factor, steps = (n - 1.0) / n, n - 1.0
        inter = np.where(cross_node, k - 1.0, 0.0)
        plateau = 1.0
    inter = np.minimum(inter, steps)
    latency = plateau * (NCCL_BASE_LATENCY_SECONDS + (steps - inter) * ctx.intra_latency + inter * ctx.inter_latency)
    busbw = np.where(cross_node, min(ctx.intra_busbw, ctx.node_nic_busbw), ctx.intra_busbw)
    t = collectives * latency + factor * message_bytes / busbw
    return np.where(n > 1, t, 0.0)


def stage3_collective_counts(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """ZeRO-3 collectives (float arrays of the candidates' shape): per micro-step "all_gather_forward",
    "all_gather_backward", "reduce_scatter"; per optimizer step "all_gather_step".

    All-gathers in forward and backward: DeepSpeed's fetch-and-prefetch schedule replayed over the module trace
    (:func:`~zeroplanner.costmodel.context.stage3_fetch_schedule`, a scenario scalar in ``ctx``): one call per
    module fetch that finds a parameter not gathered, plus one per prefetch, which coalesces the upcoming
    parameters up to ``stage3_prefetch_bucket_size`` elements (and ``stage3_max_live_parameters``) into one
    ``all_gather_coalesced``; parameters still resident (a later use already prefetched, or within
    ``stage3_max_reuse_distance``) are not gathered again. The backward includes the input embedding when it
    trains (its output needs a gradient, so its backward pre-hook fetches it: the one all-gather per step that an
    earlier version of this model could not place). Reduce-scatter: one per reduce bucket of gradients. After the
    optimizer step: one all-gather per persistent trainable tensor (its updated value; bytes measured to match the
    norms' size exactly, docs/validation.md section 1). Counted by DeepSpeed's comms logger on 2 CPU ranks:
    tests/evidence/test_zero3_collective_count.py (two models, two thresholds, no prefetch) and
    tests/evidence/test_steptime.py (prefetch buckets on the tiny Llama).
    """
    if ctx.scenario.training.qlora and not ctx.quantized_shardable:
        # uint8-stored 4-bit base weights are not partitioned (context.qlora_base_shardable); LoRA weights are
        # below threshold. With the training dtype as storage the base is gathered like a LoRA base.
        fwd = bwd = step = 0.0
    else:
        f_calls, _, b_calls, _ = ctx.stage3_fetch_schedule
        fwd, bwd = float(f_calls), float(b_calls)
        step = float(ctx.persistent_trainable_tensors) if ctx.fetch_modules else 0.0
    zero = np.zeros(cand.shape)
    return {"all_gather_forward": zero + fwd, "all_gather_backward": zero + bwd,
            "reduce_scatter": zero + np.ceil(ctx.trainable / cand.reduce_bucket),
            "all_gather_step": zero + step}


def ulysses_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """Ulysses sequence parallelism's collectives per micro-step, per GPU (float arrays of the candidates' shape).

    Per attention layer and forward, DeepSpeed 0.19.8's ``UlyssesSPAttentionHF`` issues four all-to-alls (q, k, v
    before the kernel, the output after it) of ``b*(s/P)*width`` elements each, width ``n_heads*d`` for q and the
    output and ``max(kv_heads, P)*d`` for k and v, plus one all-gather of the int64 ``position_ids`` (``b*s/P*8``
    bytes); backward sends each all-to-all again (the exchange's autograd rule), and full activation checkpointing
    re-runs the forward's four in backward (all counted and sized on the real engine:
    :func:`~.ulysses.all_to_all_bytes_per_step`, tests/evidence/test_ulysses_engine.py; this function is the same
    formula over candidate arrays, checked equal to it in tests/core/test_ulysses_costmodel.py). Element bytes: the
    working precision (ALST's ``seq_parallel_communication_data_type: bf16``).

    Time: an all-to-all among P ranks sends (P-1)/P of its input from each rank, the bus-bandwidth factor
    nccl-tests gives alltoall and all-gather alike (PERFORMANCE.md), so each is priced as :func:`ring_seconds`
    "all_gather" of the same message size: over NVLink when the P ranks share a node (P <= GPUs per node; the HF/
    accelerate launchers place consecutive ranks, and DeepSpeed's sequence-parallel groups are consecutive ranks,
    ``groups._create_sequence_parallel_group``), over the node's NICs otherwise. The exchanges sit between
    projections and the attention kernel on the critical path, so evaluate.step_terms counts them exposed.

    Returns "a2a_message_bytes_micro" (all-to-all message bytes of one micro-step), "a2a_calls_micro",
    "position_ids_bytes_micro", "seconds_micro" (all of it, forward + backward). Zero where P = 1.
    """
    m, t = ctx.scenario.model, ctx.scenario.training
    if not np.any(cand.sp > 1):
        zero = np.zeros(cand.shape)
        return {"a2a_message_bytes_micro": zero, "a2a_calls_micro": zero, "position_ids_bytes_micro": zero,
                "seconds_micro": zero}
    P = cand.sp.astype(np.float64)
    on = P > 1.0
    eb = 4.0 if t.precision == "fp32" else 2.0
    L = float(m.n_attention_layers)
    d = float(m.dim_head)
    tokens = cand.micro_batch.astype(np.float64) * float(ctx.scenario.sequence_tokens) / P
    per_layer = eb * tokens * d * (2.0 * m.n_heads + 2.0 * np.maximum(float(m.kv_heads), P))
    passes = np.where(cand.checkpointing == 2, 3.0, 2.0)  # forward, backward (+ the recomputed forward)
    message = np.where(on, L * per_layer * passes, 0.0)
    calls = np.where(on, L * 4.0 * passes, 0.0)
    pos_msg = np.where(on, L * 8.0 * tokens * np.where(cand.checkpointing == 2, 2.0, 1.0), 0.0)
    pos_calls = np.where(on, L * np.where(cand.checkpointing == 2, 2.0, 1.0), 0.0)
    cross = P > float(ctx.gpus_per_node)
    nodes = np.ceil(P / float(ctx.gpus_per_node))
    # all-gather message = its output (P x the rank's input), as ring_seconds expects
    seconds = (ring_seconds(ctx, "all_gather", message, P, calls, cross, nodes)
               + ring_seconds(ctx, "all_gather", pos_msg * P, P, pos_calls, cross, nodes))
    return {"a2a_message_bytes_micro": message, "a2a_calls_micro": calls, "position_ids_bytes_micro": pos_msg,
            "seconds_micro": np.where(on, seconds, 0.0)}
def autotp_collectives_per_micro_step(m, checkpointing: str = "none") -> dict[str, int]:
    """Collectives DeepSpeed's AutoTP training issues in one micro-step (forward + backward), by where they happen.

    Returns ``{"forward": n, "backward": n, "recompute": n}``: all-reduces of one activation tensor each
    (``tokens x hidden`` elements per TP rank), plus ``"logits_all_gather"`` (0 or 1) and
    ``"loss_all_reduce"`` (small all-reduces of per-token loss scalars). From deepspeed/module_inject/layers.py
    (DeepSpeed 0.19.8):

    - forward: every row-parallel linear (``LinearAllreduce``: attention ``o_proj``, MLP ``down_proj``) all-reduces
      its output (``RowParallel.forward``; its backward sends nothing); a tied embedding is vocab-parallel and
      all-reduces its output too (``VocabParallelEmbedding``);
    - backward: every column-parallel linear (``LinearLayer``: ``q/k/v_proj`` or one fused ``qkv``, ``gate/up``
      or one fused ``gate_up``, ``fc1``) all-reduces the gradient of its input (``ColumnParallel.backward``), one
      call per linear, not one per block as in Megatron-LM's ``f`` operator; the lm_head is column-parallel
      (``training_column_lm_head`` in module_inject/auto_tp.py) and adds one;
    - the untied lm_head gathers its vocabulary-split logits (``gather_output``: one all-gather); a tied head
      computes the loss vocabulary-parallel instead (three all-reduces of one fp32 scalar per token);
    - full activation checkpointing, as transformers runs it (``torch.utils.checkpoint`` non-reentrant, its
      default): the recomputation stops at the last tensor backward needs, before ``down_proj``'s all-reduce, so
      each attention layer repeats only ``o_proj``'s. Selective (attention-core) recomputation repeats none.

    Measured with DeepSpeed's comms logger on 2 CPU ranks (tests/evidence/test_autotp_engine.py), exactly.
    """
    attn, layers = m.n_attention_layers, m.n_layers
    column_attn = 1 if m.fused_qkv else 3
    column_mlp = 1 if (m.ffn_kind != "swiglu" or m.fused_gate_up) else 2
    tied = bool(m.tied_embeddings)
    return {
        "forward": attn + layers + int(tied),
        "backward": attn * column_attn + layers * column_mlp + 1,
        "recompute": attn if checkpointing == "full" else 0,
        "logits_all_gather": 0 if tied else 1,
        "loss_all_reduce": 3 if tied else 0,
    }


LOSS_SCALAR_BYTES = 4
"""A tied vocab-parallel loss all-reduces fp32 per-token scalars (max logit, sum of exponentials, target logit)."""


def autotp_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """AutoTP's own collectives per micro-step, among the ``tensor_parallel_size`` ranks of one node (float arrays
    shaped like ``cand``; zeros when tp = 1).

    Counts: :func:`autotp_collectives_per_micro_step`. Message bytes (nccl-tests size) per all-reduce: tokens per
    rank (micro_batch x sequence tokens / sequence_parallel_size) x hidden x the 16-bit activation bytes; the
    logits all-gather's output is tokens x vocabulary x the same bytes. Time: :func:`ring_seconds` over the
    intra-node link (AutoTP is one node: the planner never spreads it across nodes). None of it overlaps compute:
    each all-reduce's result is the next kernel's input (``tp_overlap_comm``, which overlaps the backward
    all-reduce with the weight-gradient GEMM, is not priced).

    Returns "all_reduce_micro", "all_gather_micro" (message bytes), "count_micro", "seconds_micro".
    """
    zero = np.zeros(cand.shape)
    tp = ctx.tp
    if tp <= 1:
        return {"all_reduce_micro": zero, "all_gather_micro": zero, "count_micro": zero, "seconds_micro": zero}
    sc = ctx.scenario
    m = sc.model
    tokens = cand.micro_batch.astype(np.float64) * sc.sequence_tokens / sc.cluster.sequence_parallel_size
    act = tokens * m.hidden_size * ctx.weight_bytes
    plain = autotp_collectives_per_micro_step(m, "none")
    full = autotp_collectives_per_micro_step(m, "full")
    activations = plain["forward"] + plain["backward"] + np.where(cand.checkpointing == 2, full["recompute"], 0)
    loss = plain["loss_all_reduce"] * tokens * LOSS_SCALAR_BYTES
    logits = plain["logits_all_gather"] * tokens * m.vocab_size * ctx.weight_bytes
    ranks = np.full(cand.shape, tp)
    local = np.zeros(cand.shape, dtype=bool)
    seconds = (ring_seconds(ctx, "all_reduce", activations * act, ranks, activations + 0.0 * act, local)
               + ring_seconds(ctx, "all_reduce", loss + 0.0 * act, ranks, plain["loss_all_reduce"] + zero, local)
               + ring_seconds(ctx, "all_gather", logits + 0.0 * act, ranks, plain["logits_all_gather"] + zero,
                              local))
    return {"all_reduce_micro": activations * act + loss, "all_gather_micro": logits + 0.0 * act,
            "count_micro": activations + plain["loss_all_reduce"] + plain["logits_all_gather"] + zero,
            "seconds_micro": seconds}


def wire_parts(ctx: Context, cand: Candidates, ar_bytes, rs_bytes, ag_bytes, a2a_bytes, uly, tp) -> TermParts:
    """Bytes each GPU sends per step, by part (:class:`~.terms.TermParts` "communication_volume", float arrays):
    ring collectives send 2(N_d-1)/N_d of an all-reduce's message and (N_d-1)/N_d of a reduce-scatter's or
    all-gather's among the N_d data-parallel ranks; Ulysses' all-to-alls (p-1)/p of theirs and of the position_ids
    all-gather among the p sequence-parallel ranks (each rank's b s/p x 8 bytes, to p-1 ranks); AutoTP's
    all-reduces and logits all-gather among the t tensor-parallel ranks, every micro-step. ``ar_bytes``,
    ``rs_bytes``, ``ag_bytes``: the data-parallel message bytes per step; ``a2a_bytes``: the all-to-alls' per step;
    ``uly``, ``tp``: :func:`ulysses_terms`, :func:`autotp_terms`."""
    x = {"N_d": data_parallel_degree(ctx, cand).astype(np.float64), "S_ar": ar_bytes, "S_rs": rs_bytes,
         "S_ag": ag_bytes, "GA": cand.grad_accum.astype(np.float64)}
    parts = [("all-reduce", "2*S_ar*((N_d-1)/N_d)", True),
             ("reduce-scatter + all-gather", "(S_rs + S_ag)*((N_d-1)/N_d)", True)]
    if np.any(cand.sp > 1):
        x.update({"S_a2a": a2a_bytes, "S_pos": uly["position_ids_bytes_micro"], "p": cand.sp.astype(np.float64)})
        parts.append(("Ulysses all-to-all + position_ids", "(S_a2a + GA*S_pos*p)*(p-1)/p", True))
    if ctx.tp > 1:
        x.update({"t": float(ctx.tp), "S_tar": tp["all_reduce_micro"], "S_tag": tp["all_gather_micro"]})
        parts.append(("AutoTP all-reduce + all-gather", "GA*((t-1)/t)*(2*S_tar + S_tag)", True))
    return term("communication_volume", x, parts)


def communication_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """Per-GPU message bytes per collective type per step, on-the-wire bytes, and seconds per phase.

    Returns a dict of float arrays:
      "all_reduce", "reduce_scatter", "all_gather": message bytes per step (nccl-tests "size", summed);
      "wire_bytes": bytes each GPU sends per step (ring volume), the value of "wire_parts", its parts as
      expressions (:func:`wire_parts`, a :class:`~.terms.TermParts`: explain mode prints them);
      "seconds": total collective time per step;
      "fwd_seconds_micro", "bwd_seconds_micro": stage-3 gathers/reduces per micro-step (overlappable);
      "reduce_seconds_micro": stage-2 gradient reduce-scatter per micro-step (overlappable);
      "boundary_seconds": collectives at the step boundary (not overlapped);
      "a2a_seconds_micro", "all_to_all": Ulysses' all-to-alls and position_ids all-gathers per micro-step
      (seconds, exposed) and their message bytes per step (:func:`ulysses_terms`; 0 without sequence
      parallelism), included in "seconds" and "wire_bytes".
      "tp_seconds_micro", "tp_all_reduce_micro": AutoTP's collectives per micro-step (:func:`autotp_terms`; not
      overlapped; their bytes are included in "all_reduce"/"all_gather", their time in "seconds").
    """
    z = ctx.scenario.zero
    n = data_parallel_degree(ctx, cand)
    nf = n.astype(np.float64)
    cross = cand.nodes > 1
    st = cand.stage
    ga = cand.grad_accum.astype(np.float64)
    T, P = ctx.trainable, ctx.params
    gw, w = ctx.grad_bytes, ctx.weight_bytes
    qlora = ctx.scenario.training.qlora

    grad_msg = T * gw
    reduce_buckets = np.ceil(T / cand.reduce_bucket)
    # DeepSpeed 0.19.8 ignores allgather_bucket_size when torch has all_gather_into_tensor (runtime/utils.py
    # all_gather_dp_groups -> all_gather_into_tensor_dp_groups): one all-gather per parameter group per step
    gather_buckets = 1.0

    # stage 0: one all-reduce of all gradients per step
    # A stage's collective times are computed only when some candidate is at that stage: each is read through
    # np.where / np.select on its stage's mask, which give 0.0 wherever the mask is False whatever the value, so a
    # stage no candidate has contributes the same zeros unpriced (one estimate is one stage; ZeRO-3's count also
    # replays the fetch schedule, context.stage3_fetch_schedule)
    is0, is3 = st == 0, st == 3
    is12 = (st == 1) | (st == 2)
    ar_bytes = np.where(is0, grad_msg, 0.0)
    ar_t = 0.0
    if np.count_nonzero(is0):
        stage0_buckets = np.ceil(T / STAGE0_ALLREDUCE_BUCKET)
        ar_t = ring_seconds(ctx, "all_reduce", grad_msg + 0.0 * nf, n, stage0_buckets, cross, cand.nodes)
    ar_t = np.where(is0, ar_t, 0.0)

    # stages 1-2: gradient reduction (stage 1 once, stage 2 every micro-step), all-gather updated params once
    # stage 1 reduces in backward hooks every micro-step only with overlap_comm (stage_1_and_2.py: hooks are
    # created when partition_gradients or overlap_comm), else once at the boundary (engine.allreduce_gradients)
    per_micro = (st == 2) | ((st == 1) & overlap_comm(ctx, cand))
    rs_times = np.where(per_micro, ga, 1.0)
    kind12 = "reduce_scatter" if ctx.scenario.assumptions.accounting == "paper" else "all_reduce"
    rs12_micro = ag12 = 0.0  # read only where a candidate is at stage 1 or 2 (per_micro and is12 imply it)
    if np.count_nonzero(is12):
        rs12_micro = ring_seconds(ctx, kind12, grad_msg + 0.0 * nf, n, reduce_buckets, cross, cand.nodes)
        ag12 = ring_seconds(ctx, "all_gather", T * w + 0.0 * nf, n, gather_buckets, cross, cand.nodes)

    ag3_fwd = ag3_bwd = rs3 = rs3_msg = ag3_bytes = 0.0  # read only where is3
    if np.count_nonzero(is3):
        # stage 3: gathers of the partitioned (non-persistent) parameters, forward and backward, every micro-step
        # QLoRA: the LoRA weights, plus the packed 4-bit base (w-byte elements) when it is partitioned
        gathered = (ctx.stage3_partitioned_elements if qlora else P) - ctx.persistent_params
        gathered = max(gathered, 0.0)
        counts = stage3_collective_counts(ctx, cand)
        fetches = counts["all_gather_forward"]
        fwd_elem_bytes = np.where(cand.qwz > 0, 1.0, w)  # qwZ: int8 weights
        fwd_msg = gathered * fwd_elem_bytes
        ag3_fwd = ring_seconds(ctx, "all_gather", fwd_msg, n, fetches + 0.0 * nf, cross, cand.nodes)
        hpz = cand.hpz > 1
        bwd_ranks = np.where(hpz, np.minimum(cand.hpz, n), n)
        # Parameters still resident when backward starts are not gathered again: up to stage3_max_live_parameters
        # within stage3_max_reuse_distance (stage3.py PartitionedParameterCoordinator; measured: with DeepSpeed's
        # defaults scaled to a tiny model the backward gathers exactly that much less, docs/validation.md).
        kept = min(z.stage3_max_live_parameters, z.stage3_max_reuse_distance, gathered)
        if ctx.scenario.assumptions.accounting == "paper":
            kept = 0.0  # the paper's 3Ψ: every parameter gathered again in backward
        bwd_gathered = gathered - kept
        ag3_bwd = ring_seconds(ctx, "all_gather", bwd_gathered * w + 0.0 * nf, bwd_ranks,
                              counts["all_gather_backward"] + 0.0 * nf, cross & ~hpz, cand.nodes)
        rs3_msg = np.where(cand.qgz > 0, T * 0.5, grad_msg)  # qgZ: int4 gradients
        rs3 = ring_seconds(ctx, "reduce_scatter", rs3_msg + 0.0 * nf, n, reduce_buckets + 0.0 * nf, cross,
                           cand.nodes)
        ag3_bytes = (fwd_msg + bwd_gathered * w) * ga

    if kind12 == "all_reduce":
        ar_bytes = ar_bytes + np.where(is12, grad_msg * rs_times, 0.0)
        rs_bytes = np.where(is3, rs3_msg * ga, 0.0)
    else:
        rs_bytes = np.select([is12, is3], [grad_msg * rs_times, rs3_msg * ga], 0.0)
    ag_bytes = np.select([is12, is3], [T * w + 0.0 * nf, ag3_bytes], 0.0)

    fwd_micro = np.where(is3, ag3_fwd, 0.0)
    bwd_micro = np.where(is3, ag3_bwd + rs3, 0.0)
    reduce_micro = np.where(per_micro, rs12_micro, 0.0)
    boundary = ar_t + np.where((st == 1) & ~per_micro, rs12_micro, 0.0) + np.where(is12, ag12, 0.0)
    seconds = boundary + ga * (fwd_micro + bwd_micro + reduce_micro)

    uly = ulysses_terms(ctx, cand)
    a2a_bytes = uly["a2a_message_bytes_micro"]  # zeros without sequence parallelism
    split = bool(np.any(cand.sp > 1))
    if split:
        a2a_bytes = ga * a2a_bytes
        seconds = seconds + ga * uly["seconds_micro"]
    # AutoTP's collectives among the node's TP ranks, every micro-step, on the critical path (autotp_terms)
    tp = autotp_terms(ctx, cand)
    volume = wire_parts(ctx, cand, ar_bytes, rs_bytes, ag_bytes, a2a_bytes, uly, tp)
    ar_bytes = ar_bytes + ga * tp["all_reduce_micro"]
    ag_bytes = ag_bytes + ga * tp["all_gather_micro"]
    wire = volume.value
    seconds = seconds + ga * tp["seconds_micro"]
    return {
        "wire_parts": volume,
        "all_to_all": a2a_bytes,
        "a2a_seconds_micro": uly["seconds_micro"],
        "all_reduce": ar_bytes + 0.0 * nf,
        "reduce_scatter": rs_bytes + 0.0 * nf,
        "all_gather": ag_bytes + 0.0 * nf,
        "wire_bytes": wire,
        "seconds": seconds,
        "tp_seconds_micro": tp["seconds_micro"],
        "tp_all_reduce_micro": tp["all_reduce_micro"],
        "fwd_seconds_micro": fwd_micro,
        "bwd_seconds_micro": bwd_micro,
        "reduce_seconds_micro": reduce_micro,
        "boundary_seconds": boundary,
    }
