"""Joins memory, communication and compute into step time, throughput and fit verdicts.

:func:`evaluate` is vectorised over :class:`~.context.Candidates`; :func:`estimate` is the one-scenario view with
labelled terms, warnings and the JSON shape the CLI prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..pitfalls import COMMUNICATION_SHARE_LIMIT, scenario_pitfalls
from ..specs import Output, Scenario
from ..units import gib
from .communication import communication_terms
from .activations import checkpoint_offload_bytes_per_micro
from .offload import cpu_adam_params_per_second_per_rank, host_conversion_per_second_per_rank
from .compute import compute_terms
from .context import OPTIMIZER_BYTES_TOUCHED, Candidates, Context, data_parallel_degree, make_context, overlap_comm
from .memory import TERMS, memory_term_parts, memory_terms
from .timeline import PHASES, memory_error_fraction, timeline, peak
from .evaluation import CommunicationArrays, Evaluation, MemoryArrays, StepPeakArrays, TimelineArrays, TimelineStore
from .terms import TERM_INFO, TIME_TERM_QUANTITIES, TermParts, define

COMM_SHARE_WARNING = COMMUNICATION_SHARE_LIMIT
"""Exposed communication above 30% of the step is a bottleneck (one value with :mod:`zeroplanner.pitfalls`)."""


HIDDEN_BEHIND = "max(0, {work} - {other}) + lam*min({work}, {other})"
"""Seconds of ``work`` left exposed when it overlaps ``other``: what does not fit under it, plus ``lam`` (the fitted
``overlap_loss``) of the overlapped part (concurrent kernels share SMs and HBM). A template for the expressions of
:func:`step_terms`."""


def _hidden(work: str, other: str) -> str:
    return HIDDEN_BEHIND.format(work=work, other=other)


STEP_OWNERS: dict[str, str] = {
    **{name: "compute" for name in ("F_x", "t_micro", "t_cf", "t_cb", "t_compute")},
    **{name: "communication" for name in ("e_f", "e_b", "t_gpu", "e_fe", "t_hk", "t_coll", "t_host", "t_comm")},
    **{name: "offload" for name in ("t_c", "t_gh", "t_b32", "t_pcie", "t_pg", "e_p", "e_b32", "t_ck", "t_nvme",
                                     "t_offload")},
    "t_opt": "optimizer",
    "t_step": "step",
}
"""Step-time quantity -> the explained term whose explanation shows its formula (explain mode's where-lines); the
others a formula uses are listed with their values. :data:`REPORTED_APART` are not in any formula."""

REPORTED_APART: dict[str, str] = {"t_fetch": "fetch_overhead_seconds_per_step", "t_hooks": "hook_seconds_per_step",
                                  "t_sp": "sp_all_to_all_seconds_per_step",
                                  "t_ckpt": "checkpoint_offload_seconds_per_step"}
"""Quantities of :func:`step_terms` that are parts of the step reported on their own (they are inside t_host,
t_coll and t_offload) -> their field of :class:`~.evaluation.Evaluation` and of :class:`Estimate`."""

TIME_TERM_SYMBOLS: dict[str, str] = TIME_TERM_QUANTITIES
"""Explained step-time term (:data:`~.terms.TERM_INFO` key) -> its quantity in :class:`StepTerms` (from the
registry: :attr:`~.terms.TermInfo.quantity`)."""


@dataclass(frozen=True)
class StepTerms:
    """The step time as expressions (:mod:`.terms`): ``terms`` maps each quantity (a :data:`~.terms.SYMBOLS` name:
    "t_micro", "e_f", "t_comm", "t_step", ...) to its :class:`~.terms.TermParts`, in evaluation order (each uses
    only inputs and the quantities before it); ``values`` holds every input and quantity by name (float arrays
    shaped like the candidates, or scalars): seconds, except FLOPs per token, bytes, counts and fractions as
    :data:`~.terms.SYMBOLS` gives their units."""

    terms: dict[str, TermParts]
    values: dict[str, object]


def step_terms(ctx: Context, cand: Candidates, comm: dict | None = None, comp: dict | None = None) -> StepTerms:
    """The step's seconds and its parts, each an expression evaluated over the candidate arrays (the same strings
    explain mode prints, so the formula shown is the formula computed).

    Per micro-step the GPU runs compute (compute.compute_terms: forward t_cf, backward t_cb, with QLoRA
    dequantisation) plus the communication and PCIe traffic that overlapping does not hide
    (:data:`HIDDEN_BEHIND` with overlap_comm, all of it without): e_f the forward collectives behind the forward,
    e_b the backward ones (ZeRO-3 gathers and reduce-scatters, ZeRO-1/2 reductions) behind the backward, e_p the
    PCIe traffic (optimizer offload: the gradient copies DeepSpeed makes, t_gh, counted in the engine by
    tests/evidence/test_offload_copies.py; parameter offload: parameters from the host for forward and backward)
    behind the whole micro-step when pinned, all of it when pageable (pin_memory false: a copy from pageable memory
    is synchronous with the host, CUDA runtime API "API synchronization behavior"). ZeRO-3's host work per module hook (c_fetch x
    modules with parameters x 2, forward and backward) runs ahead of the GPU and is exposed only where it is longer
    than the GPU's micro-step t_GPU; ZeRO-2/3 gradient hooks (c_hook x parameter tensors) are serial with backward,
    and so are AutoTP's per-layer all-reduces (communication.autotp_terms) and Ulysses' all-to-alls
    (communication.ulysses_terms). ALST's checkpoint offload copies block (activations.
    checkpoint_offload_bytes_per_micro). Boundary collectives, the parameter upload (optimizer offload without
    parameter offload: Ψ_t w/N_d once per step), NVMe swapping (stage-3 optimizer states read and written once,
    2 g K Ψ_t/N_d per node; ZeRO-1/2 run an NVMe optimizer offload as CPU offload, runtime/zero/stage_1_and_2.py;
    offloaded parameters through NVMe every micro-step) and the optimizer step are exposed. Optimizer step: on
    the GPU the bytes it touches per parameter of the local shard / HBM bandwidth (roofline, Williams et al., CACM
    2009); offloaded, each rank updates Ψ_t/N_d parameters at its DeepSpeedCPUAdam rate and converts them to 16 bits
    on the host (:mod:`.offload`: threads per rank x rates measured here, or a measured node rate). The constants
    fitted on measured runs (lam, c_fetch, c_hook, the pageable copy rate) are
    :data:`~.steptime_constants.FITTED`, read at each call.

    ``comm``, ``comp``: :func:`~.communication.communication_terms` and :func:`~.compute.compute_terms` of the
    same candidates (computed when None).
    """
    from .steptime_constants import FITTED

    comm = communication_terms(ctx, cand) if comm is None else comm
    comp = compute_terms(ctx, cand) if comp is None else comp
    sc = ctx.scenario
    c = sc.cluster
    st = cand.stage
    n = data_parallel_degree(ctx, cand)
    overlap = overlap_comm(ctx, cand)
    off_opt, off_par = cand.offload_optimizer, cand.offload_param
    # Ulysses all-to-alls sit between the projections and the attention kernel, ALST's checkpoint offload copies
    # are blocking: both serial with compute (scenario-wide switches: the expressions differ, not their values)
    split = bool(np.any(cand.sp > 1))
    offloading = sc.training.checkpoint_offload
    terms = dict(comp["terms"])
    env = dict(next(iter(terms.values())).inputs)  # compute_terms' inputs and quantities, and the step's below
    env.update({
        "lam": FITTED["overlap_loss"], "c_f": FITTED["zero3_fetch_seconds"], "n_mod": ctx.hooked_modules,
        "c_h": FITTED["grad_hook_seconds"], "n_t": ctx.param_tensors,
        "t_gf": comm["fwd_seconds_micro"], "t_gb": comm["bwd_seconds_micro"], "t_rd": comm["reduce_seconds_micro"],
        "t_bnd": comm["boundary_seconds"], "t_a2a": comm["a2a_seconds_micro"], "t_tp": comm["tp_seconds_micro"],
        "Psi": ctx.params, "Psi_t": ctx.trainable, "w": ctx.weight_bytes, "w_g": ctx.grad_bytes,
        "N_d": n.astype(np.float64), "g": ctx.gpus_per_node, "K": ctx.master_bytes + ctx.optimizer_state_bytes,
        "beta": OPTIMIZER_BYTES_TOUCHED[sc.training.optimizer] if ctx.mixed else 16.0,
        "BW_HBM": ctx.hbm_bytes_per_second, "BW_pcie": ctx.pcie_bytes_per_second, "BW_nvme": c.nvme_gb_per_s * 1e9,
        "R_cpu": cpu_adam_params_per_second_per_rank(c), "R_cv": host_conversion_per_second_per_rank(c),
        "BW_pg": min(FITTED["pageable_copy_gb_per_s"] * 1e9, ctx.pcie_bytes_per_second),
    })
    if offloading:
        env["A_ck"] = checkpoint_offload_bytes_per_micro(ctx, cand)

    def d(name: str, parts) -> None:
        terms[name] = define(env, name, [p if len(p) == 3 else (*p, True) for p in parts])

    # the collectives per micro-step that compute does not hide
    d("e_f", [("overlapped with the forward", _hidden("t_gf", "t_cf"), overlap), ("not overlapped", "t_gf", ~overlap)])
    d("e_b", [("overlapped with the backward", _hidden("t_gb + t_rd", "t_cb"), overlap),
              ("not overlapped", "t_gb + t_rd", ~overlap)])
    # PCIe traffic behind the micro-step's compute (with or without overlap_comm: DeepSpeed's offload streams)
    d("t_c", [("forward + backward + dequantisation", "t_cf + t_cb + t_dq")])
    # optimizer offload's gradient copies, as DeepSpeed makes them (tests/evidence/test_offload_copies.py counts
    # them in the engine): every stage copies the fp32 gradient partition to the host once, at the boundary
    # (ZeRO-1 after the last backward; ZeRO-2/3 in its hooks, behind that backward); with accumulation ZeRO-2
    # copies every micro-step's 16-bit gradient out, and from the second micro-step back in first
    # (stage_1_and_2.py async_accumulate_grad_in_cpu_via_gpu), and ZeRO-3 keeps its gradient partition on the host,
    # out and back to the GPU every micro-step (stage3.py partition_grads). At the pinned rate, or the pageable one
    # without pin_memory
    ga = cand.grad_accum
    pin_o, pin_p = sc.zero.offload_optimizer.pin_memory, sc.zero.offload_param.pin_memory
    # the masks the parts below share, each computed once (the same bool arrays as the comparisons written out)
    oo, op = off_opt > 0, off_par > 0  # optimizer / parameter offload (cpu or nvme)
    s3 = st == 3
    bw = "BW_pcie" if pin_o else "BW_pg"
    d("t_gh", [("16-bit out every micro-step, back in from the second", f"(2*GA - 1)*w_g*Psi_t/(N_d*GA*{bw})",
                oo & (st == 2) & (ga > 1)),
               ("partition out and back in every micro-step", f"2*w_g*Psi_t/(N_d*{bw})", oo & s3)])
    d("t_b32", [("fp32 partition at the boundary", f"4*Psi_t/(N_d*{bw})", oo & (st >= 1))])
    d("t_pcie", [("gradient copies", "t_gh", oo & pin_o),
                 ("parameters from the host", "2*(Psi*w/N_d)/BW_pcie", op & pin_p)])
    # pageable copies are synchronous with the host (CUDA runtime API, "API synchronization behavior": a copy
    # from pageable memory returns once staged), so nothing hides them
    d("t_pg", [("gradient copies, pageable", "t_gh", oo & (not pin_o)),
               ("parameters from the host, pageable", "2*(Psi*w/N_d)/BW_pg", op & (not pin_p))])
    d("e_p", [("overlapped with compute", _hidden("t_pcie", "t_c")), ("pageable, not overlapped", "t_pg")])
    d("e_b32", [("after the last backward (ZeRO-1)", "t_b32", oo & (st == 1)),
                ("behind the last backward", _hidden("t_b32", "t_cb"), oo & (st >= 2) & pin_o),
                ("pageable, not overlapped", "t_b32", oo & (st >= 2) & (not pin_o))])
    if offloading:
        d("t_ck", [("checkpoints to the host and back", "A_ck/BW_pcie")])
    # ZeRO-3's module hooks: host work the GPU waits for beyond its own micro-step; every module with parameters
    # gets ZeRO-3's pre-/post-forward and pre-/post-backward hooks, whether it then gathers (partitioned) or finds
    # its parameters available (persistent or still resident)
    d("t_gpu", [("the GPU's micro-step", "t_c + e_f + e_b + e_p" + (" + t_a2a" if split else "")
                 + (" + t_ck" if offloading else ""))])
    d("e_fe", [("module hooks beyond the GPU's micro-step", "max(0, 2*c_f*n_mod - t_gpu)", s3)])
    # ZeRO-2/3 only: ZeRO-1 with overlap_comm also reduces in backward hooks, but the measured ZeRO-2 / ZeRO-1
    # ratios of section 1 (BELLE's config: overlap_comm on for both) price what ZeRO-2's partitioned gradients add
    d("t_hk", [("gradient hooks", "c_h*n_t", (st >= 2) & (n > 1))])
    d("t_coll", [("boundary + micro-steps",
                  "t_bnd + GA*(e_f + e_b + t_a2a + t_tp)" if split else "t_bnd + GA*(e_f + e_b + t_tp)")])
    d("t_host", [("module hooks + gradient hooks", "GA*(e_fe + t_hk)")])
    d("t_comm", [("exposed collectives", "t_coll"), ("ZeRO host overhead", "t_host")])
    d("t_nvme", [("optimizer states (ZeRO-3)", "2*g*K*Psi_t/N_d/BW_nvme", (off_opt == 2) & s3),
                 ("parameters", "2*GA*g*(Psi*w/N_d)/BW_nvme", off_par == 2)])
    # the updated 16-bit partition back to the GPU: ZeRO-1/2 from DeepSpeed's own host buffer (pinned with
    # pin_memory); ZeRO-3 with a blocking fp32 -> 16-bit copy, which ATen converts on the CPU into a new (pageable)
    # tensor first (aten/src/ATen/native/cuda/Copy.cu: "For blocking transfers conversions are performed on CPU")
    d("t_offload", [("PCIe, exposed" + (" + checkpoint offload" if offloading else ""),
                     "GA*(e_p + t_ck)" if offloading else "GA*e_p"),
                    ("the boundary's fp32 gradients", "e_b32"),
                    ("parameter upload", "Psi_t*w/N_d/BW_pcie", oo & (off_par == 0) & (st < 3) & pin_o),
                    ("parameter upload, pageable", "Psi_t*w/N_d/BW_pg",
                     oo & (off_par == 0) & (s3 | (not pin_o))),
                    ("NVMe", "t_nvme")])
    d("t_opt", [("GPU, the 1/N_d shard", "beta*(Psi_t/N_d)/BW_HBM", (off_opt == 0) & (st >= 1)),
                ("GPU, all parameters", "Psi_t*beta/BW_HBM", (off_opt == 0) & (st == 0)),
                ("CPU-Adam on the host", "Psi_t/N_d/R_cpu", oo),
                ("fp32 -> 16-bit copy on the host", "Psi_t/N_d/R_cv", oo & ctx.mixed)])
    d("t_step", [("compute", "t_compute"), ("exposed collectives", "t_coll"), ("ZeRO host overhead", "t_host"),
                 ("offload", "t_offload"), ("optimizer step", "t_opt")])
    # the step's figures reported apart (Estimate fields)
    d("t_fetch", [("micro-steps", "GA*e_fe")])
    d("t_hooks", [("micro-steps", "GA*t_hk")])
    if split:
        d("t_sp", [("micro-steps", "GA*t_a2a")])
    if offloading:
        d("t_ckpt", [("micro-steps", "GA*t_ck")])
    return StepTerms(terms, env)


def evaluate(ctx: Context, cand: Candidates) -> Evaluation:
    """Every number of the cost model for every candidate: an :class:`~.evaluation.Evaluation` of float/bool
    arrays shaped like ``cand``, its fields named like :class:`Estimate`'s.

    Step time = compute + exposed communication (incl. ZeRO host overhead) + exposed offload traffic + optimizer
    step, as :func:`step_terms` composes it (each part one expression): overlap (overlap_comm: stage 3 gathers
    behind forward/backward compute, stage 1-2 reductions behind backward) hides all but ``overlap_loss`` of the
    shorter side; boundary collectives
    and the optimizer step are exposed; ZeRO-3 module hooks cost host time the GPU waits for only beyond its own
    micro-step. The constants fitted on measured runs are in :mod:`.steptime_constants`.
    """
    mem, points, step_peak, peak_phase, fit = _memory(ctx, cand)
    comm = communication_terms(ctx, cand)
    comp = compute_terms(ctx, cand)
    a = ctx.scenario.assumptions
    ga = cand.grad_accum.astype(np.float64)
    v = step_terms(ctx, cand, comm, comp).values
    zero = 0.0 * v["GA"]
    step = v["t_step"]

    n = data_parallel_degree(ctx, cand)
    # ZeRO shards over the whole world (n, Ulysses ranks included: ulysses.zero_shard_degree); the batch is split
    # over the data-parallel degree world / (tp x sp): each sequence-parallel group trains one micro-batch
    # (train_batch_size = micro x accumulation x world / sp, DeepSpeed's sequence-data-parallel arithmetic)
    split = bool(np.any(cand.sp > 1))
    batch_n = n // cand.sp if split else n
    tokens = cand.micro_batch * ga * batch_n * ctx.scenario.training.seq_len
    headroom = ctx.gpu_memory_bytes - step_peak
    return _full(cand, Evaluation(
        per_gpu_bytes=MemoryArrays(**{k: mem[k] for k in (*TERMS, "total")}),
        per_node_cpu_bytes=mem["host_per_node"],
        nvme_bytes=mem["nvme_per_node"],
        # headroom below the model's measured error of the peak: the fit is not proven (timeline.py)
        step_peak=StepPeakArrays(bytes=step_peak, phase_index=peak_phase, headroom_bytes=headroom,
                                 risky=headroom < memory_error_fraction(a.device) * step_peak,
                                 timeline=TimelineArrays(
                                     store=TimelineStore.from_timeline(points),
                                     index=np.arange(int(np.prod(cand.shape))).reshape(cand.shape))),
        data_parallel_degree=n,
        batch_data_parallel_degree=batch_n,
        sequence_parallel_size=cand.sp,
        communication=CommunicationArrays(
            bytes_per_gpu_per_step=comm["wire_bytes"], seconds_per_step=comm["seconds"],
            exposed_seconds_per_step=v["t_comm"], collectives_exposed_seconds_per_step=v["t_coll"],
            all_reduce=comm["all_reduce"], reduce_scatter=comm["reduce_scatter"], all_gather=comm["all_gather"],
            all_to_all=comm["all_to_all"]),
        compute_seconds_per_step=v["t_compute"],
        achieved_fraction=comp["achieved_fraction"],
        offload_seconds_per_step=v["t_offload"],
        optimizer_seconds_per_step=v["t_opt"],
        fetch_overhead_seconds_per_step=v["t_fetch"],
        hook_seconds_per_step=v["t_hooks"],
        autotp_seconds_per_step=ga * comm["tp_seconds_micro"],  # AutoTP's all-reduces, exposed (in t_comm)
        sp_all_to_all_seconds_per_step=v.get("t_sp", zero),
        checkpoint_offload_seconds_per_step=v.get("t_ckpt", zero),
        step_seconds=step,
        tokens_per_second=tokens / step,
        tflops_per_gpu=comp["model_flops"] / step / 1e12,
        mfu=comp["model_flops"] / step / ctx.peak_flops,
        fits_gpu=fit.fits_gpu,
        fits_cpu=fit.fits_cpu,
        fits_nvme=fit.fits_nvme,
        fits=fit.fits,
    ))


def _full(cand: Candidates, values):
    """``values`` (an :class:`~.evaluation.Evaluation` or :class:`Fits`) with every per-candidate array at the
    candidates' full shape: with :meth:`~.context.Candidates.build`'s ``sparse=True`` a value is computed over
    the axes it depends on and broadcast here (the same numbers: the cost model is elementwise)."""
    if not cand.sparse:
        return values
    shape = cand.shape

    def leaf(a):
        if isinstance(a, np.ndarray) and a.ndim and a.shape != shape:
            return np.ascontiguousarray(np.broadcast_to(a, shape))
        return a

    if isinstance(values, Fits):
        return Fits(*(leaf(getattr(values, f)) for f in ("fits_gpu", "fits_cpu", "fits_nvme", "fits")))
    return values._map(leaf)


@dataclass(frozen=True)
class Fits:
    """Where each candidate fits (bool arrays shaped like the candidates), as :func:`evaluate` decides it:
    ``fits_gpu`` the step's peak within the usable GPU memory, ``fits_cpu`` host RAM per node x
    ``Assumptions.host_buffer_factor`` within the node's, ``fits_nvme`` NVMe per node within the node's, ``fits``
    all three."""

    fits_gpu: np.ndarray
    fits_cpu: np.ndarray
    fits_nvme: np.ndarray
    fits: np.ndarray


def _memory(ctx: Context, cand: Candidates):
    """The memory half of :func:`evaluate`: (memory terms, timeline, step peak, its phase index, :class:`Fits`)."""
    a, c = ctx.scenario.assumptions, ctx.scenario.cluster
    parts = memory_term_parts(ctx, cand)
    mem = memory_terms(ctx, cand, parts)
    points = timeline(ctx, cand, parts)
    step_peak, peak_phase = peak(points)
    usable = ctx.gpu_memory_bytes * (1.0 - a.gpu_memory_margin_fraction)
    # the step's peak (timeline.py), not the sum of every term at its own maximum, decides the fit
    fits_gpu = step_peak <= usable
    fits_cpu = mem["host_per_node"] * a.host_buffer_factor <= c.cpu_memory_bytes
    fits_nvme = mem["nvme_per_node"] <= c.nvme_bytes
    return mem, points, step_peak, peak_phase, Fits(fits_gpu, fits_cpu, fits_nvme, fits_gpu & fits_cpu & fits_nvme)


def fits(ctx: Context, cand: Candidates) -> Fits:
    """What :func:`evaluate` says each candidate fits in, from the memory terms alone: no communication, compute or
    step time (nor ZeRO-3's fetch-schedule replay they need), for sweeps that only ask what fits (the planner's
    largest model and longest sequence: half an evaluate's time per size). The same code as evaluate's, so the
    same booleans (tests/core/test_evaluation.py)."""
    return _full(cand, _memory(ctx, cand)[4])


# ---------------------------------------------------------------------------------------------------------------
# One scenario: labelled terms, warnings, JSON shape
# ---------------------------------------------------------------------------------------------------------------


class MemoryBreakdown(Output):
    """Per-GPU bytes by term."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    buffers: int
    overhead: int
    total: int


class Communication(Output):
    """Per-GPU communication per optimizer step."""

    bytes_per_gpu_per_step: int
    seconds_per_step: float
    exposed_seconds_per_step: float
    by_collective: dict[str, int]


class Term(Output):
    """One labelled memory term: bytes per GPU, the formula in words, and where it comes from."""

    name: str
    category: str
    bytes: int
    formula: str
    source: str


class TimelinePoint(Output):
    """One moment of the step (costmodel/timeline.py): its phase, what happens, bytes per GPU by term and in all."""

    phase: str
    label: str
    bytes: dict[str, int]
    total: int


class RuntimePart(Output):
    """One GPU-only memory part (costmodel/gpu_runtime.py): what, bytes per GPU (or a fraction of the live bytes for
    the allocator's slack), and the source."""

    label: str
    bytes: int = 0
    fraction_of_live: float = 0.0
    source: str


class StepPeak(Output):
    """The step's peak per GPU (costmodel/timeline.py) and how much memory it leaves: bytes, fractions of GPU memory.

    ``error_fraction`` is the model's measured error of the peak (timeline.memory_error_fraction: the engine census
    on CPU ranks, the published GPU runs on a GPU); ``risky`` when the
    headroom is below that error times the peak."""

    bytes: int
    phase: str
    gpu_memory_bytes: int
    headroom_bytes: int
    headroom_fraction: float
    error_fraction: float
    risky: bool
    timeline: list[TimelinePoint]
    runtime_parts: list[RuntimePart] = []
    """The GPU-only parts inside every point's ``runtime`` (none on CPU ranks): CUDA context, cuBLAS workspace,
    NCCL buffers, each with its source, and the allocator's slack fraction of the live bytes."""

    def verdict(self, *, unfit_said: bool = False) -> str:
        """One line: the peak of GPU memory, its phase, the headroom in GiB and %, and whether that is below 0 or
        below the model's error, e.g. "peak in the loss backward: 37.5 of 39.5 GiB per GPU; headroom 2.0 GiB (5%):
        below the model's error of 11.2% of the peak, risky". ``unfit_said``: the sentence around it already says
        the configuration does not fit, so a negative headroom is not followed by ": does not fit" again."""
        line = (f"peak in the {self.phase}: {gib(self.bytes):.1f} of {gib(self.gpu_memory_bytes):.1f} GiB per GPU; "
                f"headroom {gib(self.headroom_bytes):.1f} GiB ({self.headroom_fraction:.0%})")
        if self.headroom_bytes < 0:
            return line if unfit_said else line + ": does not fit"
        if self.risky:
            return line + f": below the model's error of {self.error_fraction:.1%} of the peak, risky"
        return line


class Estimate(Output):
    """Everything the cost model says about one scenario. Bytes, seconds, tokens/s, TFLOP/s.

    ``per_gpu_bytes`` gives every term at its own maximum (their sum, ``total``, is what the step would hold if all
    peaked at once); ``step_peak`` is the step's real peak and decides ``fits_gpu``."""

    parameters: int
    trainable_parameters: int
    data_parallel_degree: int
    per_gpu_bytes: MemoryBreakdown
    gpu_memory_bytes: int
    per_node_cpu_bytes: int
    host_required_bytes: int = 0  # per_node_cpu_bytes x Assumptions.host_buffer_factor: what fits_cpu compares
    cpu_memory_bytes: int = 0  # host RAM per node (ClusterSpec.cpu_memory_bytes)
    nvme_bytes: int
    fits_gpu: bool
    fits_cpu: bool
    fits: bool
    communication: Communication
    compute_seconds_per_step: float
    offload_seconds_per_step: float
    optimizer_seconds_per_step: float
    step_seconds: float
    tokens_per_second: float
    tflops_per_gpu: float
    mfu: float
    warnings: list[str]
    terms: list[Term]
    fetch_overhead_seconds_per_step: float = 0.0
    """ZeRO-3 module-hook host time the GPU waits for (part of communication.exposed_seconds_per_step)."""
    hook_seconds_per_step: float = 0.0
    """ZeRO-2/3 gradient-hook host time, serial with backward (part of communication.exposed_seconds_per_step)."""
    achieved_fraction: float = 0.0
    """Fraction of the dense peak the compute runs at (compute.achieved_fraction, or Assumptions.mfu if fixed)."""
    deepspeed_version: str = "0.19.8"
    sequence_parallel_size: int = 1
    """Ulysses degree priced (ClusterSpec.sequence_parallel_size); the batch's data-parallel degree is
    data_parallel_degree / sequence_parallel_size while ZeRO shards over data_parallel_degree."""
    sp_all_to_all_seconds_per_step: float = 0.0
    """Ulysses all-to-alls and position_ids all-gathers, exposed (part of communication.exposed_seconds_per_step)."""
    checkpoint_offload_seconds_per_step: float = 0.0
    """PCIe time of the activation-checkpoint offload, blocking (part of offload_seconds_per_step)."""
    step_peak: StepPeak | None = None
    """The peak over one step, its phase, the headroom and the timeline (costmodel/timeline.py)."""

    def summary(self) -> str:
        """Two lines for humans (GiB, s, tokens/s). Host RAM is the figure the verdict compares with the node's
        RAM: what is held there times ``Assumptions.host_buffer_factor`` (DeepSpeed's estimators' 1.5)."""
        m = self.per_gpu_bytes
        short = [name for name, ok in (("GPU memory", self.fits_gpu), ("host RAM", self.fits_cpu)) if not ok]
        verdict = "fits" if self.fits else "does NOT fit: " + (", ".join(short) or "NVMe capacity")
        host = self.fetch_overhead_seconds_per_step + self.hook_seconds_per_step
        if self.per_node_cpu_bytes and self.cpu_memory_bytes:
            ram = (f"host RAM {gib(self.host_required_bytes):.1f} GiB/node needed of "
                   f"{gib(self.cpu_memory_bytes):.0f} ({gib(self.per_node_cpu_bytes):.1f} GiB held x "
                   f"{self.host_required_bytes / self.per_node_cpu_bytes:.2g} headroom)")
        else:
            ram = f"host {gib(self.per_node_cpu_bytes):.1f} GiB/node"
        # the bracketed verdict after it says what does not fit: not "does not fit (does NOT fit: GPU memory)"
        peak = (self.step_peak.verdict(unfit_said=not self.fits) if self.step_peak is not None
                else f"{gib(m.total):.1f} GiB per GPU of {gib(self.gpu_memory_bytes):.1f}")
        return (
            f"{peak} ({verdict}); {ram}\n"
            f"step {self.step_seconds:.3f} s (compute {self.compute_seconds_per_step:.3f} s, exposed comm "
            f"{self.communication.exposed_seconds_per_step - host:.3f} s"
            + (f" + ZeRO host hooks {host:.3f} s" if host > 0 else "")
            + (f" + offload {self.offload_seconds_per_step:.3f} s" if self.offload_seconds_per_step > 0 else "")
            + f" + optimizer {self.optimizer_seconds_per_step:.3f} s"
            + f"), {self.tokens_per_second:,.0f} tokens/s"
        )


def _with_fix(p) -> str:
    """One warning line: the pitfall's message, then its fix as a clause."""
    fix = p.fix.rstrip(".")
    return f"{p.message}; {fix[:1].lower()}{fix[1:]}" if fix else p.message


def scenario_warnings(scenario: Scenario, values: Evaluation) -> list[str]:
    """Plain-language warnings for one evaluated scenario (``values``: its candidate's :meth:`Evaluation.at`):
    the shared run-level pitfalls (:func:`zeroplanner.pitfalls.scenario_pitfalls`, the same rules
    ``zeroplanner check`` reports) followed by what this estimate itself does not price or does not fit."""
    z, t, c, m = scenario.zero, scenario.training, scenario.cluster, scenario.model
    pitfalls = scenario_pitfalls(scenario, values)
    host = ("pinned_exceeds_host", "host_ram_short")
    w = [_with_fix(p) for p in pitfalls if p.rule not in host]
    if m.max_position_embeddings and t.seq_len > m.max_position_embeddings:
        w.append(f"seq_len {t.seq_len} exceeds the model's max_position_embeddings {m.max_position_embeddings} "
                 "(context extension changes the model; memory is still estimated)")
    step = float(values.step_seconds)
    fetch = float(values.fetch_overhead_seconds_per_step)
    if z.stage == 3 and c.data_parallel_degree > 1 and fetch > 0.1 * step:
        w.append(f"ZeRO-3's per-module host work (hooks, fetch coordination) is "
                 f"{fetch / step:.0%} of the step: the GPU waits for the host, as in the "
                 "measured small-model runs (ZeRO-3 2.5-3.3x slower than ZeRO-1, LianjiaTech/BELLE #402: "
                 "BLOOM-560M on 2 GPUs); a larger micro-batch or ZeRO-1/2 hides it")
    if not values.fits_gpu:
        w.append(f"GPU memory: the step peaks at {gib(float(values.step_peak.bytes)):.1f} GiB per GPU, "
                 f"{gib(c.memory_per_gpu_bytes * (1 - scenario.assumptions.gpu_memory_margin_fraction)):.1f} GiB "
                 "usable")
    w += [_with_fix(p) for p in pitfalls if p.rule in host]
    if not values.fits_nvme:
        w.append(f"NVMe: needs {gib(float(values.nvme_bytes)):.0f} GiB per node, node has {gib(c.nvme_bytes):.0f} GiB")
    return w


def estimate(scenario: Scenario) -> Estimate:
    """Evaluate one scenario: per-GPU memory by term, host/NVMe, communication, step time, throughput.

    Raises nothing for a valid Scenario (validation happens when the Scenario is built).
    """
    values = evaluate(make_context(scenario), Candidates.from_scenario(scenario))
    return estimate_from_values(scenario, values, 0)


def estimate_from_values(scenario: Scenario, values: Evaluation, index) -> Estimate:
    """The Estimate of candidate ``index`` (flat, or a multi-index) of an :func:`evaluate` result; ``scenario``
    must be that candidate's scenario (same stage, offload, checkpointing, batch and nodes). Built as one dict and
    validated once (pydantic validates a nested dict in one pass, several times faster than building each nested
    model on its own; the same values and the same models either way)."""
    v = values.at(index)
    pg, cm = v.per_gpu_bytes, v.communication
    mem = {k: int(round(getattr(pg, k))) for k in (*TERMS, "total")}
    terms = [{"name": TERM_INFO[k].name, "category": k, "bytes": mem[k], "formula": TERM_INFO[k].formula,
              "source": TERM_INFO[k].source} for k in TERMS]
    a2a = float(cm.all_to_all)
    return Estimate.model_validate({
        "parameters": scenario.parameters,
        "trainable_parameters": scenario.trainable_parameters,
        "data_parallel_degree": scenario.cluster.data_parallel_degree,
        "per_gpu_bytes": mem,
        "gpu_memory_bytes": scenario.cluster.memory_per_gpu_bytes,
        "per_node_cpu_bytes": int(round(v.per_node_cpu_bytes)),
        "host_required_bytes": int(round(v.per_node_cpu_bytes * scenario.assumptions.host_buffer_factor)),
        "cpu_memory_bytes": int(scenario.cluster.cpu_memory_bytes),
        "nvme_bytes": int(round(v.nvme_bytes)),
        "fits_gpu": bool(v.fits_gpu),
        "fits_cpu": bool(v.fits_cpu),
        "fits": bool(v.fits),
        "communication": {
            "bytes_per_gpu_per_step": int(round(cm.bytes_per_gpu_per_step)),
            "seconds_per_step": float(cm.seconds_per_step),
            "exposed_seconds_per_step": float(cm.exposed_seconds_per_step),
            "by_collective": {"all_reduce": int(round(cm.all_reduce)), "reduce_scatter": int(round(cm.reduce_scatter)),
                              "all_gather": int(round(cm.all_gather))}
            | ({"all_to_all": int(round(a2a))} if a2a > 0 else {}),
        },
        "compute_seconds_per_step": float(v.compute_seconds_per_step),
        "offload_seconds_per_step": float(v.offload_seconds_per_step),
        "optimizer_seconds_per_step": float(v.optimizer_seconds_per_step),
        "step_seconds": float(v.step_seconds),
        "tokens_per_second": float(v.tokens_per_second),
        "tflops_per_gpu": float(v.tflops_per_gpu),
        "mfu": float(v.mfu),
        "fetch_overhead_seconds_per_step": float(v.fetch_overhead_seconds_per_step),
        "hook_seconds_per_step": float(v.hook_seconds_per_step),
        "sequence_parallel_size": int(v.sequence_parallel_size),
        "sp_all_to_all_seconds_per_step": float(v.sp_all_to_all_seconds_per_step),
        "checkpoint_offload_seconds_per_step": float(v.checkpoint_offload_seconds_per_step),
        "achieved_fraction": float(v.achieved_fraction),
        "warnings": scenario_warnings(scenario, v),
        "terms": terms,
        "step_peak": _step_peak_fields(scenario, v),
    })


def _step_peak_fields(scenario: Scenario, v: Evaluation) -> dict:
    """The fields of the :class:`StepPeak` of one scenario, unvalidated (:func:`estimate_from_values` validates them
    with the rest): the timeline, peak, phase and headroom of the evaluated values ``v`` (its candidate's
    :meth:`Evaluation.at`)."""
    tl = v.step_peak.timeline
    col = tl.column()  # (points, terms) bytes of this candidate
    if not np.isfinite(col).all():
        raise ValueError(f"the step timeline has a non-finite value: {col.tolist()}")
    rows = col.tolist()
    if np.abs(col).max() < 2.0**63:
        # np.rint rounds half to even, as round() does: the same ints as int(round(x)) per value, in one call
        # (int64 holds them below 2**63)
        ints = np.rint(col).astype(np.int64).tolist()
    else:
        ints = [[int(round(x)) for x in row] for row in rows]
    names, totals = tl.store.names, [int(round(sum(row))) for row in rows]
    points = [{"phase": phase, "label": label, "bytes": dict(zip(names, row)), "total": total}
              for phase, label, row, total in zip(tl.store.phases, tl.store.labels, ints, totals)]
    mem = scenario.cluster.memory_per_gpu_bytes
    runtime = []
    if scenario.assumptions.device != "cpu":
        from .gpu_runtime import ALLOCATOR_SLACK_SAMPLES
        from .memory import scenario_runtime

        runtime = [{"label": label, "bytes": int(b), "source": src} for label, b, src in scenario_runtime(scenario)]
        runtime.append({
            "label": "caching-allocator slack (reserved but unallocated), per live byte",
            "fraction_of_live": scenario.assumptions.allocator_fragmentation_fraction,
            "source": f"Assumptions.allocator_fragmentation_fraction; default: the median of "
                      f"{len(ALLOCATOR_SLACK_SAMPLES)} published reserved/allocated pairs "
                      "(zeroplanner/costmodel/gpu_runtime.py ALLOCATOR_SLACK_SAMPLES)"})
    sp = v.step_peak
    headroom = float(sp.headroom_bytes)
    return {"runtime_parts": runtime, "bytes": int(round(sp.bytes)), "phase": PHASES[int(sp.phase_index)],
            "gpu_memory_bytes": mem, "headroom_bytes": int(round(headroom)), "headroom_fraction": headroom / mem,
            "error_fraction": memory_error_fraction(scenario.assumptions.device), "risky": bool(sp.risky),
            "timeline": points}
