"""Joins memory, communication and compute into step time, throughput and fit verdicts.

:func:`evaluate` is vectorised over :class:`~.context.Candidates`; :func:`estimate` is the one-scenario view with
labelled terms, warnings and the JSON shape the CLI prints.
"""

from __future__ import annotations

import numpy as np

from ..pitfalls import COMMUNICATION_SHARE_LIMIT, scenario_pitfalls
from ..specs import Output, Scenario
from ..units import gib
from .communication import communication_terms
from .activations import checkpoint_offload_bytes_per_micro
from .compute import compute_terms, optimizer_and_offload_terms
from .context import Candidates, Context, data_parallel_degree, make_context, overlap_comm
from .memory import TERMS, memory_term_parts, memory_terms
from .timeline import PHASES, memory_error_fraction, timeline, peak
from .terms import TERM_INFO

COMM_SHARE_WARNING = COMMUNICATION_SHARE_LIMIT
"""Exposed communication above 30% of the step is a bottleneck (one value with :mod:`zeroplanner.pitfalls`)."""


def hidden_behind(work: np.ndarray, other: np.ndarray, loss: float) -> np.ndarray:
    """Seconds of ``work`` left exposed when it overlaps ``other``: what does not fit under it, plus ``loss`` of the
    overlapped part (concurrent kernels share SMs and HBM; the fitted ``overlap_loss``)."""
    return np.maximum(0.0, work - other) + loss * np.minimum(work, other)


def step_parts(ctx: Context, cand: Candidates, comm, comp, opt) -> dict[str, np.ndarray]:
    """Step seconds and its parts (compute, exposed communication, ZeRO host overhead, offload, optimizer).

    Per micro-step the GPU runs compute (incl. QLoRA dequantisation) plus the communication and PCIe traffic that
    overlapping does not hide (:func:`hidden_behind` with overlap_comm, all of it without). ZeRO-3's host work per
    module hook (``zero3_fetch_seconds`` x modules with parameters x 2, forward and backward) runs ahead of the GPU and is exposed only
    where it is longer than the GPU's micro-step; ZeRO-2/3 gradient hooks (``grad_hook_seconds`` x parameter
    tensors) are serial with backward, and so are AutoTP's per-layer all-reduces (communication.autotp_terms).
    Boundary collectives, the parameter upload, NVMe swapping and the optimizer step are exposed.
    "comm_exposed_seconds" includes the ZeRO host overhead (fetch + hooks: the collectives' coordination),
    "collectives_exposed_seconds" is the collectives alone.
    """
    from .steptime_constants import FITTED

    loss = FITTED["overlap_loss"]
    ga = cand.grad_accum.astype(np.float64)
    overlap = overlap_comm(ctx, cand)
    fwd_c, bwd_c = comp["fwd_seconds_micro"], comp["bwd_seconds_micro"]
    bwd_comm = comm["bwd_seconds_micro"] + comm["reduce_seconds_micro"]
    fwd_exposed = np.where(overlap, hidden_behind(comm["fwd_seconds_micro"], fwd_c, loss), comm["fwd_seconds_micro"])
    bwd_exposed = np.where(overlap, hidden_behind(bwd_comm, bwd_c, loss), bwd_comm)
    micro_compute = fwd_c + bwd_c + comp["dequant_seconds_micro"]
    pcie_micro = hidden_behind(opt["pcie_seconds_micro"], micro_compute, loss)
    # Ulysses all-to-alls sit between the projections and the attention kernel (exposed); ALST's checkpoint
    # offload copies blocking (activations.checkpoint_offload_bytes_per_micro): both serial with compute
    a2a = comm["a2a_seconds_micro"]
    split = bool(np.any(cand.sp > 1))
    offloading = ctx.scenario.training.checkpoint_offload
    ckpt_pcie = checkpoint_offload_bytes_per_micro(ctx, cand) / ctx.pcie_bytes_per_second if offloading else a2a * 0.0
    gpu_micro = micro_compute + fwd_exposed + bwd_exposed + pcie_micro
    if split or offloading:
        gpu_micro = gpu_micro + a2a + ckpt_pcie
    st = cand.stage
    # every module with parameters gets ZeRO-3's pre-/post-forward and pre-/post-backward hooks, whether it then
    # gathers (partitioned) or finds its parameters available (persistent or still resident)
    fetch_host = np.where(st == 3, FITTED["zero3_fetch_seconds"] * 2.0 * ctx.hooked_modules, 0.0)
    fetch_exposed = np.maximum(0.0, fetch_host - gpu_micro)
    # ZeRO-2/3 only: ZeRO-1 with overlap_comm also reduces in backward hooks, but the measured ZeRO-2 / ZeRO-1
    # ratios of section 1 (BELLE's config: overlap_comm on for both) price what ZeRO-2's partitioned gradients add
    hooked = st >= 2
    n = data_parallel_degree(ctx, cand)
    hooks = np.where(hooked & (n > 1), FITTED["grad_hook_seconds"] * ctx.param_tensors, 0.0)
    # Ulysses' all-to-alls and AutoTP's per-layer all-reduces are serial with compute (communication.ulysses_terms,
    # communication.autotp_terms): exposed in full
    micro = (fwd_exposed + bwd_exposed + a2a) if split else (fwd_exposed + bwd_exposed)
    collectives = comm["boundary_seconds"] + ga * (micro + comm["tp_seconds_micro"])
    host = ga * (fetch_exposed + hooks)
    offload = (ga * (pcie_micro + ckpt_pcie) if offloading else ga * pcie_micro) + opt["pcie_seconds_boundary"] \
        + opt["nvme_seconds"]
    compute = comp["seconds"]
    step = compute + collectives + host + offload + opt["optimizer_seconds"]
    return {"comm_exposed_seconds": collectives + host, "collectives_exposed_seconds": collectives,
            "offload_seconds": offload, "fetch_overhead_seconds": ga * fetch_exposed, "hook_seconds": ga * hooks,
            "step_seconds": step, "fwd_exposed_micro": fwd_exposed, "bwd_exposed_micro": bwd_exposed,
            "pcie_exposed_micro": pcie_micro, "sp_all_to_all_seconds": ga * a2a,
            "checkpoint_offload_seconds": ga * ckpt_pcie}


def evaluate(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """Every number of the cost model for every candidate. Float/bool arrays shaped like ``cand``.

    Step time = compute + exposed communication (incl. ZeRO host overhead) + exposed offload traffic + optimizer
    step, as :func:`step_parts` composes it: overlap (overlap_comm: stage 3 gathers behind forward/backward compute,
    stage 1-2 reductions behind backward) hides all but ``overlap_loss`` of the shorter side; boundary collectives
    and the optimizer step are exposed; ZeRO-3 module hooks cost host time the GPU waits for only beyond its own
    micro-step. The constants fitted on measured runs are in :mod:`.steptime_constants`.
    """
    parts = memory_term_parts(ctx, cand)
    mem = memory_terms(ctx, cand, parts)
    step_peak, peak_phase = peak(timeline(ctx, cand, parts))
    comm = communication_terms(ctx, cand)
    comp = compute_terms(ctx, cand)
    opt = optimizer_and_offload_terms(ctx, cand)
    a = ctx.scenario.assumptions
    c = ctx.scenario.cluster
    ga = cand.grad_accum.astype(np.float64)
    parts = step_parts(ctx, cand, comm, comp, opt)
    comm_exposed = parts["comm_exposed_seconds"]
    offload_seconds = parts["offload_seconds"]
    step = parts["step_seconds"]

    n = data_parallel_degree(ctx, cand)
    # ZeRO shards over the whole world (n, Ulysses ranks included: ulysses.zero_shard_degree); the batch is split
    # over the data-parallel degree world / (tp x sp): each sequence-parallel group trains one micro-batch
    # (train_batch_size = micro x accumulation x world / sp, DeepSpeed's sequence-data-parallel arithmetic)
    split = bool(np.any(cand.sp > 1))
    batch_n = n // cand.sp if split else n
    tokens = cand.micro_batch * ga * batch_n * ctx.scenario.training.seq_len
    usable = ctx.gpu_memory_bytes * (1.0 - a.gpu_memory_margin_fraction)
    # the step's peak (timeline.py), not the sum of every term at its own maximum, decides the fit
    fits_gpu = step_peak <= usable
    headroom = ctx.gpu_memory_bytes - step_peak
    fits_cpu = mem["host_per_node"] * a.host_buffer_factor <= c.cpu_memory_bytes
    fits_nvme = mem["nvme_per_node"] <= c.nvme_bytes
    out = dict(mem)
    out.update(
        {
            "peak": step_peak,
            "peak_phase": peak_phase.astype(np.float64),
            "headroom": headroom,
            # headroom below the model's measured error of the peak: the fit is not proven (timeline.py)
            "memory_risky": headroom < memory_error_fraction(a.device) * step_peak,
            "data_parallel_degree": n,
            "comm_all_reduce": comm["all_reduce"],
            "comm_reduce_scatter": comm["reduce_scatter"],
            "comm_all_gather": comm["all_gather"],
            "comm_wire_bytes": comm["wire_bytes"],
            "comm_seconds": comm["seconds"],
            "comm_exposed_seconds": comm_exposed,
            "autotp_seconds": ga * comm["tp_seconds_micro"],  # AutoTP's all-reduces, exposed (in the above)
            "compute_seconds": comp["seconds"],
            "achieved_fraction": comp["achieved_fraction"],
            "collectives_exposed_seconds": parts["collectives_exposed_seconds"],
            "fetch_overhead_seconds": parts["fetch_overhead_seconds"],
            "hook_seconds": parts["hook_seconds"],
            "offload_seconds": offload_seconds,
            "optimizer_seconds": opt["optimizer_seconds"],
            "step_seconds": step,
            "tokens_per_second": tokens / step,
            "tflops_per_gpu": comp["model_flops"] / step / 1e12,
            "mfu": comp["model_flops"] / step / ctx.peak_flops,
            "fits_gpu": fits_gpu,
            "fits_cpu": fits_cpu,
            "fits_nvme": fits_nvme,
            "fits": fits_gpu & fits_cpu & fits_nvme,
        }
    )
    if split or ctx.scenario.training.checkpoint_offload:
        # the long-context figures (absent = 1 / 0: keeps the common case's per-estimate work unchanged)
        out.update({"batch_data_parallel_degree": batch_n, "sequence_parallel_size": cand.sp,
                    "comm_all_to_all": comm["all_to_all"], "sp_all_to_all_seconds": parts["sp_all_to_all_seconds"],
                    "checkpoint_offload_seconds": parts["checkpoint_offload_seconds"]})
    return out


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

    def verdict(self) -> str:
        """One line: the peak of GPU memory, its phase, the headroom in GiB and %, and whether that is below the
        model's error, e.g. "peak in the loss backward: 37.5 of 39.5 GiB per GPU; headroom 2.0 GiB (5%): below
        the model's error of 11.2% of the peak, risky"."""
        line = (f"peak in the {self.phase}: {gib(self.bytes):.1f} of {gib(self.gpu_memory_bytes):.1f} GiB per GPU; "
                f"headroom {gib(self.headroom_bytes):.1f} GiB ({self.headroom_fraction:.0%})")
        if self.headroom_bytes < 0:
            return line + ": does not fit"
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
        peak = (self.step_peak.verdict() if self.step_peak is not None
                else f"{gib(m.total):.1f} GiB per GPU of {gib(self.gpu_memory_bytes):.1f}")
        return (
            f"{peak} ({verdict}); {ram}\n"
            f"step {self.step_seconds:.3f} s (compute {self.compute_seconds_per_step:.3f} s, exposed comm "
            f"{self.communication.exposed_seconds_per_step - host:.3f} s"
            + (f" + ZeRO host hooks {host:.3f} s" if host > 0 else "")
            + f"), {self.tokens_per_second:,.0f} tokens/s"
        )


def _with_fix(p) -> str:
    """One warning line: the pitfall's message, then its fix as a clause."""
    fix = p.fix.rstrip(".")
    return f"{p.message}; {fix[:1].lower()}{fix[1:]}" if fix else p.message


def scenario_warnings(scenario: Scenario, values: dict[str, float]) -> list[str]:
    """Plain-language warnings for one evaluated scenario: the shared run-level pitfalls
    (:func:`zeroplanner.pitfalls.scenario_pitfalls`, the same rules ``zeroplanner check`` reports) followed by what
    this estimate itself does not price or does not fit."""
    z, t, c, m = scenario.zero, scenario.training, scenario.cluster, scenario.model
    pitfalls = scenario_pitfalls(scenario, values)
    host = ("pinned_exceeds_host", "host_ram_short")
    w = [_with_fix(p) for p in pitfalls if p.rule not in host]
    if m.max_position_embeddings and t.seq_len > m.max_position_embeddings:
        w.append(f"seq_len {t.seq_len} exceeds the model's max_position_embeddings {m.max_position_embeddings} "
                 "(context extension changes the model; memory is still estimated)")
    step = values["step_seconds"]
    if z.stage == 3 and c.data_parallel_degree > 1 and values.get("fetch_overhead_seconds", 0.0) > 0.1 * step:
        w.append(f"ZeRO-3's per-module host work (hooks, fetch coordination) is "
                 f"{values['fetch_overhead_seconds'] / step:.0%} of the step: the GPU waits for the host, as in the "
                 "measured small-model runs (ZeRO-3 2.5-3.3x slower than ZeRO-1, LianjiaTech/BELLE #402: "
                 "BLOOM-560M on 2 GPUs); a larger micro-batch or ZeRO-1/2 hides it")
    if not values["fits_gpu"]:
        w.append(f"GPU memory: the step peaks at {gib(values['peak']):.1f} GiB per GPU, "
                 f"{gib(c.memory_per_gpu_bytes * (1 - scenario.assumptions.gpu_memory_margin_fraction)):.1f} GiB "
                 "usable")
    w += [_with_fix(p) for p in pitfalls if p.rule in host]
    if not values["fits_nvme"]:
        w.append(f"NVMe: needs {gib(values['nvme_per_node']):.0f} GiB per node, node has {gib(c.nvme_bytes):.0f} GiB")
    return w


def estimate(scenario: Scenario) -> Estimate:
    """Evaluate one scenario: per-GPU memory by term, host/NVMe, communication, step time, throughput.

    Raises nothing for a valid Scenario (validation happens when the Scenario is built).
    """
    values = evaluate(make_context(scenario), Candidates.from_scenario(scenario))
    return estimate_from_values(scenario, values, 0)


def estimate_from_values(scenario: Scenario, values: dict[str, np.ndarray], index) -> Estimate:
    """The Estimate of candidate ``index`` of an :func:`evaluate` result; ``scenario`` must be that candidate's
    scenario (same stage, offload, checkpointing, batch and nodes)."""
    shape = np.shape(values["total"])
    flat = int(np.ravel_multi_index(index, shape)) if isinstance(index, tuple) else int(index)
    v = {k: float(a.item(flat)) for k, a in values.items()}
    mem = MemoryBreakdown(**{k: int(round(v[k])) for k in (*TERMS, "total")})
    terms = [
        Term(name=TERM_INFO[k].name, category=k, bytes=getattr(mem, k), formula=TERM_INFO[k].formula,
             source=TERM_INFO[k].source)
        for k in TERMS
    ]
    return Estimate(
        parameters=scenario.parameters,
        trainable_parameters=scenario.trainable_parameters,
        data_parallel_degree=scenario.cluster.data_parallel_degree,
        per_gpu_bytes=mem,
        gpu_memory_bytes=scenario.cluster.memory_per_gpu_bytes,
        per_node_cpu_bytes=int(round(v["host_per_node"])),
        host_required_bytes=int(round(v["host_per_node"] * scenario.assumptions.host_buffer_factor)),
        cpu_memory_bytes=int(scenario.cluster.cpu_memory_bytes),
        nvme_bytes=int(round(v["nvme_per_node"])),
        fits_gpu=bool(v["fits_gpu"]),
        fits_cpu=bool(v["fits_cpu"]),
        fits=bool(v["fits"]),
        communication=Communication(
            bytes_per_gpu_per_step=int(round(v["comm_wire_bytes"])),
            seconds_per_step=v["comm_seconds"],
            exposed_seconds_per_step=v["comm_exposed_seconds"],
            by_collective={k: int(round(v[f"comm_{k}"])) for k in ("all_reduce", "reduce_scatter", "all_gather")}
            | ({"all_to_all": int(round(v["comm_all_to_all"]))} if v.get("comm_all_to_all", 0.0) > 0 else {}),
        ),
        compute_seconds_per_step=v["compute_seconds"],
        offload_seconds_per_step=v["offload_seconds"],
        optimizer_seconds_per_step=v["optimizer_seconds"],
        step_seconds=v["step_seconds"],
        tokens_per_second=v["tokens_per_second"],
        tflops_per_gpu=v["tflops_per_gpu"],
        mfu=v["mfu"],
        fetch_overhead_seconds_per_step=v["fetch_overhead_seconds"],
        hook_seconds_per_step=v["hook_seconds"],
        **({"sequence_parallel_size": int(v["sequence_parallel_size"]),
            "sp_all_to_all_seconds_per_step": v["sp_all_to_all_seconds"],
            "checkpoint_offload_seconds_per_step": v["checkpoint_offload_seconds"]}
           if "sequence_parallel_size" in v else {}),
        achieved_fraction=v["achieved_fraction"],
        warnings=scenario_warnings(scenario, v),
        terms=terms,
        step_peak=step_peak_of(scenario, v),
    )


def step_peak_of(scenario: Scenario, v: dict[str, float]) -> StepPeak:
    """The :class:`StepPeak` of one scenario: its timeline (recomputed for this one candidate) and the peak, phase
    and headroom of the evaluated values ``v``."""
    ctx = make_context(scenario)
    pts = timeline(ctx, Candidates.from_scenario(scenario))
    points = [TimelinePoint(phase=p.phase, label=p.label, bytes={k: int(round(float(x.item())))
                                                                   for k, x in p.terms.items()},
                            total=int(round(float(p.total.item())))) for p in pts]
    mem = scenario.cluster.memory_per_gpu_bytes
    runtime = []
    if scenario.assumptions.device != "cpu":
        from .gpu_runtime import ALLOCATOR_SLACK_SAMPLES
        from .memory import runtime_parts

        runtime = [RuntimePart(label=label, bytes=int(b), source=src) for label, b, src in
                   runtime_parts(ctx)]
        runtime.append(RuntimePart(
            label="caching-allocator slack (reserved but unallocated), per live byte",
            fraction_of_live=scenario.assumptions.allocator_fragmentation_fraction,
            source=f"Assumptions.allocator_fragmentation_fraction; default: the median of {len(ALLOCATOR_SLACK_SAMPLES)} "
                   "published reserved/allocated pairs (zeroplanner/costmodel/gpu_runtime.py ALLOCATOR_SLACK_SAMPLES)"))
    return StepPeak(runtime_parts=runtime, bytes=int(round(v["peak"])), phase=PHASES[int(v["peak_phase"])], gpu_memory_bytes=mem,
                    headroom_bytes=int(round(v["headroom"])), headroom_fraction=v["headroom"] / mem,
                    error_fraction=memory_error_fraction(scenario.assumptions.device), risky=bool(v["memory_risky"]), timeline=points)
