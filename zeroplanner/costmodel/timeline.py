"""Memory over one training step, per GPU: a few points per phase, bytes by term; the step's peak is their maximum.

A step does not peak at the sum of every term at its own maximum (``memory.memory_terms``' ``total``): the logits'
gradients exist only in the loss backward, the fp32 gradient partition and the optimizer's temporaries only in the
optimizer step, the saved activations not after backward. This module places each term at the moments it is alive:

- ``forward`` (points after each quarter of the layers): held states + the saved activations so far (+ ZeRO-3's
  gathered parameters);
- ``loss forward``: + the logits (a_b), their fp32 upcast (4) and the fp32 log-softmax (4) per token and vocabulary
  entry (transformers ``ForCausalLMLoss``: ``logits = logits.float()`` then ``cross_entropy``; a model returning
  fp32 logits has no upcast copy);
- ``loss backward``: the log-softmax output saved for backward, its incoming gradient and the gradient it produces,
  4 + 4 + 4 bytes per logit (``log_softmax_backward_data``), the 16-bit logits already freed;
- ``backward`` (start, quarters, end): the LM head's weight gradient at the start; the gradient flowing through
  the layers (the residual stream's and the current layer's input gradient, 2 a_b per token and hidden unit); the
  saved activations freed layer by layer while the gradients the stage keeps grow to the end-of-backward figure (stage 0: the 16-bit
  gradients; ZeRO-1/2/3: the 16-bit partition) and the reduce bucket is in use;
- ``optimizer step``: the gradients at the step (``memory.gradient_parts``: the measured gradient peak) and the
  optimizer's temporaries: none for DeepSpeed's FusedAdam on a GPU (multi-tensor, in place) or for the CPU optimizer
  of offload; on the engine's CPU ranks torch's single-tensor AdamW (torch/optim/adamw.py ``_single_tensor_adam``:
  ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``: two fp32 temporaries the size of the tensor
  it steps, the flat fp32 partition under ZeRO), while ZeRO-1/2 have already freed the 16-bit partition
  (stage_1_and_2.py ``step``: ``free_grad_in_param_list`` before ``optimizer.step``).

Gradient accumulation: later micro-steps also hold what the earlier ones accumulated (stage 0 and ZeRO-1 the full
16-bit gradients, ZeRO-2/3 the 16-bit partition).

Every point is measured against the step-peak census (DeepSpeed 0.19.8 on 2 CPU ranks, live tensor bytes from
torch's allocator events; zeroplanner.calibrate.peak, docs/validation.md "Peak memory over one step"). On a GPU the
runtime parts (CUDA context, workspaces, NCCL buffers, allocator slack: ``memory.overhead_parts``) are added to
every point; on CPU (``Assumptions.device = "cpu"``) there are none.

:func:`timeline` returns the points for every candidate (arrays shaped like ``cand``); :func:`peak` their maximum
and the index of the phase it falls in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .activations import _FP32_LOGITS_FAMILIES, ACTIVATION_GROUPS, local_tokens
from .context import Candidates, Context, data_parallel_degree

PHASES = ("forward", "loss forward", "loss backward", "backward", "optimizer step")
"""The phases of one micro-step, in order (the names the step-peak census uses)."""

TIMELINE_TERMS = ("parameters", "optimizer_states", "gradients", "activations", "logits", "buffers",
                  "temporaries", "offloaded", "runtime")
"""The terms of a timeline point. ``logits``: the loss's logits, upcast, log-softmax and their gradients;
``temporaries``: the optimizer's and the LM head's transient tensors; ``offloaded``: on the engine's CPU ranks
only, what offload keeps in host RAM, which there is the same memory (``memory.host_parts`` per rank; 0 on a GPU);
``runtime``: the GPU-only parts
(``memory.overhead_parts``: CUDA context, workspaces, allocator slack; 0 on CPU)."""


class Runtime:
    """A timeline point's GPU runtime bytes, kept as how to compute them: ``fixed`` (CUDA context, cuBLAS workspace,
    NCCL buffers) + ``fraction`` (the caching allocator's slack) x the point's live bytes (its other terms added
    in :data:`TIMELINE_TERMS` order: :func:`live_bytes`). Not stored as an array per point: in a sweep it would be
    the one term of every point over every candidate. A plain class: a dataclass costs the command's start 0.3 ms
    to create."""

    __slots__ = ("fixed", "fraction")

    def __init__(self, fixed: float, fraction: float):
        self.fixed, self.fraction = fixed, fraction

    def of(self, live):
        """The runtime bytes over ``live`` bytes (array or scalar)."""
        return self.fixed + self.fraction * live


def live_bytes(row):
    """A timeline row's live bytes: its values (arrays or scalars; None is 0, a :class:`Runtime` is not live) added
    in order, None left out (adding 0.0 changes no value but -0.0)."""
    live = None
    for value in row:
        if value is not None and not isinstance(value, Runtime):
            live = value if live is None else live + value
    return live


@dataclass(frozen=True)
class Timeline:
    """The moments of the step: each point's phase and label, its bytes per GPU by :data:`TIMELINE_TERMS` as one of
    ``stack`` or ``rows``, and ``totals``, each point's bytes, (points, *candidates): its terms added in
    :data:`TIMELINE_TERMS` order. From ``_ROWS_FROM`` candidates the points are kept as ``rows`` and the stack is
    not built (a sweep of 10^5 candidates that only asks for the peak never builds its 108 float64 per candidate:
    filling it was the largest part of the sweep's timeline, benchmarks/bench_costmodel.py);
    :class:`~.evaluation.TimelineStore` builds it from the rows when it is read (:func:`stack_rows`)."""

    phases: tuple[str, ...]
    labels: tuple[str, ...]
    stack: np.ndarray | None
    """Bytes per GPU shaped (points, :data:`TIMELINE_TERMS`, *candidates), 0 where a point holds none of a term;
    None when the points are kept as ``rows``."""
    rows: tuple[tuple[object, ...], ...] | None
    """Per point, per term: an array that broadcasts to the candidates' ``shape``, None where the point holds none
    of the term, or the :class:`Runtime` that gives the runtime term; None when ``stack`` was built."""
    shape: tuple[int, ...]
    """The candidates' shape."""
    totals: np.ndarray


def stack_rows(rows, shape: tuple[int, ...]) -> np.ndarray:
    """``rows`` (:attr:`Timeline.rows`) as one float64 array shaped (points, terms, *shape)."""
    stack = np.zeros((len(rows), len(rows[0]) if rows else 0, *shape))
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if isinstance(value, Runtime):
                stack[i, j] = value.of(live_bytes(row))
            elif value is not None:
                stack[i, j] = value
    return stack


def row_at(row, at: tuple, shape: tuple[int, ...]) -> list[float]:
    """One candidate's values of a timeline row (:attr:`Timeline.rows`; ``at``: its index into the candidates'
    ``shape``), the runtime computed: the values :func:`stack_rows` gives it."""
    values = [value if value is None or isinstance(value, Runtime) or np.ndim(value) == 0
              else value[at] if value.shape == shape else np.broadcast_to(value, shape)[at]
              for value in row]
    out = [0.0 if v is None else v for v in values]
    for j, v in enumerate(values):
        if isinstance(v, Runtime):
            out[j] = v.of(live_bytes(values))
    return out


def timeline(ctx: Context, cand: Candidates, parts: dict | None = None) -> Timeline:
    """The points of one optimizer step (the last micro-step of a gradient-accumulation cycle), per GPU, bytes.

    ``parts``: :func:`zeroplanner.costmodel.memory.memory_term_parts` if already computed. Every term is shaped like
    ``cand`` (:class:`Timeline`). Raises nothing for a valid context."""
    from .memory import memory_term_parts

    parts = parts if parts is not None else memory_term_parts(ctx, cand)
    sc = ctx.scenario
    m, t = sc.model, sc.training
    cpu = sc.assumptions.device == "cpu"
    z = np.zeros(cand.shape)
    st = cand.stage
    n = data_parallel_degree(ctx, cand).astype(np.float64)
    w = float(ctx.weight_bytes)
    a_b = 4.0 if t.precision == "fp32" else 2.0
    psi_t = float(ctx.trainable)
    off_opt = cand.offload_optimizer > 0
    full = cand.checkpointing == 2

    params = parts["parameters"].value + z
    states = parts["optimizer_states"].value + z
    a = sc.assumptions
    if not cpu:  # the context, cuBLAS workspace and NCCL buffers memory.overhead_parts priced
        x_ovh = parts["overhead"].inputs
        fixed_runtime = float(x_ovh["C"] + x_ovh["W_cublas"] + x_ovh["B_nccl"])
    offloaded = parts["host_memory"].value / float(ctx.gpus_per_node) + z if cpu else z
    buf = parts["buffers"]

    # -- gradients held by the last micro-step before its own backward (accumulation)
    accum = cand.grad_accum > 1
    grad_end_bwd = np.where(st <= 1, w * psi_t, w * psi_t / n)  # 16-bit: full (stage 0, ZeRO-1) or the partition
    grad_end_bwd = np.where((off_opt & (st >= 1)) | (st == 3), 0.0, grad_end_bwd)  # ZeRO-3: in held3 below
    grad_held = np.where(accum, grad_end_bwd, 0.0)

    # -- activations
    # the activation term memory_term_parts already evaluated: its groups (activations.activation_parts) and the
    # one layer's bytes (activation_term's input "layer": what full checkpointing recomputes)
    act_term = parts["activations"]
    act = {k: act_term.sum_of(labels) for k, labels in ACTIVATION_GROUPS.items()}
    tokens = local_tokens(ctx, cand)
    h = float(m.hidden_size)
    recomputed = np.where(full, act_term.inputs["layer"], 0.0)
    layers_fwd = act["layers"] - recomputed  # stored inputs only under full checkpointing
    a_fwd = layers_fwd + act["final"] + act["inputs"] + act.get("vision", z)

    # -- logits (per token and vocabulary entry over the tensor-parallel ranks: activations.activation_term's t_V)
    t_v = float(ctx.tp) if m.tied_embeddings else 1.0
    logit_elems = tokens * float(m.vocab_size) / t_v
    fp32_logits = m.family in _FP32_LOGITS_FAMILIES or t.precision == "fp32"
    cap = a_b if m.final_logit_softcapping else 0.0
    if t.tiled_loss:
        # one chunk at a time, its backward inside the forward (activations.activation_term): the chunk's logits
        # part, priced twice (forward and gradient; not measured)
        chunk = act["logits"]
        loss_fwd = chunk + z
        loss_bwd = 2.0 * chunk + z
    else:
        loss_fwd = logit_elems * ((4.0 if fp32_logits else a_b + 4.0) + 4.0 + cap)
        loss_bwd = logit_elems * (12.0 + cap)

    # -- buffers by phase
    stage3 = st == 3
    gathered = buf.sum_of(("gathered live parameters",))
    module_grad = buf.sum_of(("largest module's gradient",))
    bucket = buf.sum_of(("reduce bucket", "all-reduce bucket"))
    staging = buf.sum_of(("offload staging buffer",))
    dequant = buf.sum_of(("dequantised 4-bit weight",))
    head_elems = float(m.vocab_size * m.embed_width) / float(ctx.tp)
    head_grad = w * head_elems + z

    rows: list[tuple[str, str, dict]] = []

    def point(phase, label, **terms):
        rows.append((phase, label, terms))

    # ZeRO-3 allocates its 16-bit gradient partition (grad_partitions_flat_buffer, on the host with optimizer
    # offload) and its reduce bucket once, at initialisation (stage3.py ``__init__``): held in every phase
    held3 = np.where(stage3, bucket + np.where(off_opt, 0.0, w * psi_t / n), 0.0)
    fwd_bufs = np.where(stage3, gathered, 0.0) + held3 + dequant
    for q in (1, 2, 3, 4):
        done = q / 4.0
        point("forward", f"forward, {q}/4 of the layers", gradients=grad_held,
              activations=layers_fwd * done + act["inputs"] + (act["final"] if q == 4 else 0.0), buffers=fwd_bufs)
    point("loss forward", "loss forward: logits, fp32 upcast, log-softmax", gradients=grad_held,
          activations=a_fwd, logits=loss_fwd, buffers=fwd_bufs)
    point("loss backward", "loss backward: log-softmax and its gradients", gradients=grad_held,
          activations=a_fwd, logits=loss_bwd, buffers=fwd_bufs)
    bwd_bufs = np.where(stage3, gathered + module_grad + held3, bucket) + staging + dequant
    # the gradient flowing back through the layers: the residual stream's gradient and the gradient the layer
    # being differentiated produces for its input, a_b bytes per token and hidden unit each (over the Ulysses ranks)
    act_grads = 2.0 * a_b * tokens * h
    for q in (0, 1, 2, 3, 4):
        done = q / 4.0
        grads = grad_held + (grad_end_bwd - grad_held) * done
        label = "backward start: LM head gradient" if q == 0 else f"backward, {q}/4 of the layers"
        point("backward", label, gradients=grads,
              activations=(layers_fwd * (1.0 - done) + np.where(full & (q < 4), recomputed, 0.0)
                           + (act["inputs"] + act_grads if q < 4 else 0.0)),
              temporaries=head_grad if q == 0 else z, buffers=bwd_bufs)
    # optimizer step
    grad_step = parts["gradients"].value + z
    if cpu:
        # torch's _single_tensor_adam steps one tensor at a time, and ``denom`` of the previous tensor is still bound
        # while the next one's two temporaries are made: 4 bytes x the previous tensor + 8 x the current one. ZeRO
        # steps one flat partition (no previous); stage 0 steps the model's own tensors in registration order, where
        # the largest pair is the largest module alone or, with learned positions, the token embedding followed by
        # the position table (GPT-2: wte, wpe; measured, gpt2-s0-short: 12 bytes x 65,536)
        embed = float(m.vocab_size * m.embed_width)
        pos = float(m.learned_position_embeddings * m.hidden_size)
        per_module = max(float(ctx.largest_module), embed / 2.0 + pos) if pos else float(ctx.largest_module)
        flat = np.where(st == 0, per_module, psi_t / n)
        temps = np.where(off_opt, 0.0, 2.0 * 4.0 * flat)
        # ZeRO-1/2 free the 16-bit partition before the optimizer runs
        grad_step = np.where((st >= 1) & (st <= 2) & ~off_opt, 4.0 * psi_t / n, grad_step)
    else:
        temps = z
    # ZeRO-3: the 16-bit partition is the held buffer (held3); the step adds the fp32 partition
    grad_step = np.where(stage3 & ~off_opt, 4.0 * psi_t / n, grad_step)
    # stage 0's all-reduce bucket is a flattened copy made and freed inside the all-reduce (engine.py
    # ``allreduce_and_copy``): gone by the step; ZeRO-1/2 keep their reduce bucket (stage_1_and_2.py ipg buffer)
    step_bucket = np.where(st == 0, bucket - buf.sum_of(("all-reduce bucket",)), bucket)
    point("optimizer step", "optimizer step: gradients for the step + optimizer temporaries",
          gradients=grad_step, temporaries=temps, buffers=np.where(stage3, held3, step_bucket) + staging)

    # each point's terms in TIMELINE_TERMS order (None: the point holds none of it, or holds the zeros z); what is
    # live at a point is its terms but the runtime added in that order (runtime is last). The GPU runtime: CUDA
    # context, cuBLAS workspace, NCCL buffers, and the caching allocator's slack over what is live
    # (memory.overhead_parts)
    runtime = None if cpu else Runtime(fixed_runtime, a.allocator_fragmentation_fraction)
    held = {"parameters": params, "optimizer_states": states, "offloaded": offloaded if cpu else None,
            "runtime": runtime}
    phases, labels = tuple(r[0] for r in rows), tuple(r[1] for r in rows)
    if math.prod(cand.shape) >= _ROWS_FROM:
        out_rows = tuple(tuple(None if v is z else v for v in (held[k] if k in held else terms.get(k)
                                                               for k in TIMELINE_TERMS))
                         for _, _, terms in rows)
        # a term that is 0 is not added: x + 0.0 is x for every x but -0.0, and the running total is never -0.0
        # (parameters, added first, is a sum with z's +0.0: never -0.0)
        totals = np.empty((len(rows), *cand.shape))
        for i, row in enumerate(out_rows):
            live = live_bytes(row)
            totals[i] = live if runtime is None else live + runtime.of(live)
        return Timeline(phases, labels, None, out_rows, cand.shape, totals)
    # few candidates: the stack at once, each term added over all points in one call (fewer, larger numpy calls;
    # the same sums: a term a point does not hold adds 0.0)
    where = {k: j for j, k in enumerate(TIMELINE_TERMS)}
    stack = np.zeros((len(rows), len(TIMELINE_TERMS), *cand.shape))
    for i, (_, _, terms) in enumerate(rows):
        for k, value in terms.items():
            stack[i, where[k]] = value
    for k, value in held.items():  # the same in every point (the runtime is computed below)
        if value is not None and value is not runtime:
            stack[:, where[k]] = value
    at = where["runtime"]
    live = stack[:, 0]
    for j in range(1, at):
        live = live + stack[:, j]
    if runtime is not None:
        stack[:, at] = runtime.of(live)
    return Timeline(phases, labels, stack, None, cand.shape, live + stack[:, at])


_ROWS_FROM = 4096
"""Candidates from which :func:`timeline` keeps its points as rows and builds the stack only when it is read (a
sweep's); below, the stack is built at once (a plan's or an estimate's few candidates: fewer numpy calls, and one
candidate's column is a view of it). Measured with benchmarks/bench_costmodel.py."""


ENGINE_MEMORY_ERROR_FRACTION = 0.027
"""The model's stated error of the step peak on the engine's CPU ranks (``Assumptions.device = "cpu"``), as a
fraction of the predicted peak: the headroom that covers the measured peak on 90% of the step-peak census
(``calibrate.peak.peak_error_fraction``: the 0.9 quantile of (measured - predicted) / predicted over the 45 rows of
docs/validation.md section 9, 2.63%, rounded up to 0.1%; tests/evidence/test_step_peaks.py recomputes it). The
largest error there is 3.5% (gpt2-s2-offload, an under-prediction); every row is within 5%."""

GPU_MEMORY_ERROR_FRACTION = 0.112
"""The model's stated error of the step peak on a GPU, as a fraction of the predicted peak: the headroom that covers
the measured peak on 3 of 4 of the 20 published GPU runs of docs/validation.md section 10
(``measured_peaks.gpu_peak_error_fraction``: the 0.75 quantile of (measured - predicted) / predicted, 11.1%, rounded
up to 0.1%; tests/evidence/test_public_peaks.py recomputes it). Not the 0.9 quantile, as on the census: with 20
rows it would be set by the two under-predictions section 10 cannot explain (23% and 44%: a reserved figure at 8K
tokens, and a run that measured 64 GiB where the same flags at half the accumulation measured 39). The engine
census (:data:`ENGINE_MEMORY_ERROR_FRACTION`) covers the live tensors; this covers, besides, what a GPU run adds and
the published runs leave open (kernels' workspaces, the allocator, settings not stated)."""


def memory_error_fraction(device: str) -> float:
    """The model's stated error of the step peak for ``device`` (``Assumptions.device``: "cpu" for the engine's CPU
    ranks, anything else a GPU): :data:`ENGINE_MEMORY_ERROR_FRACTION` or :data:`GPU_MEMORY_ERROR_FRACTION`."""
    return ENGINE_MEMORY_ERROR_FRACTION if device == "cpu" else GPU_MEMORY_ERROR_FRACTION


def peak(points: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(peak bytes, index into :data:`PHASES` of the phase the peak falls in), arrays shaped like the candidates;
    the first point wins a tie."""
    totals = points.totals
    at = np.argmax(totals, axis=0)
    phase_index = np.array([PHASES.index(p) for p in points.phases])[at]
    return np.max(totals, axis=0), phase_index
