"""Diagnose a training run's log against the plan: what was read, predicted vs measured, the bottleneck, the fix.

:func:`diagnose` takes a :class:`~zeroplanner.runlog.LogReading` and the run's Scenario (from its DeepSpeed config
and the user's options) and returns a :class:`Diagnosis`:

- ``read``: every figure used, with the log line it came from;
- ``comparisons``: predicted vs measured per part, flagged where they differ by more than the model's error
  (step time: the planner's tolerance, ``planner.DEFAULT_TOLERANCE``, the order of the step-time model's error in
  docs/validation.md section 5; memory: the step peak's stated error, ``timeline.memory_error_fraction``);
- ``problems``: an out-of-memory error (the phase it happened in against the predicted peak phase, and whether
  the allocator's reserved-but-unallocated bytes alone would have served the request: fragmentation, for which
  PyTorch's own message names ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), communication over 30% of the
  step (the rule of thumb of the article the product grew from: "if all-gather or reduce takes more than 30% of the
  step, communication is the bottleneck");
- ``remedy``: the smallest configuration change that fits (``planner.nearest_fit``) or the planner's pick, priced,
  as a list of setting changes;
- :func:`calibration` turns the measured all-reduce into a file ``--cluster-from`` reads
  (``probe.cluster_from_probe``).

Units: bytes, seconds; GiB (2^30) and Gbit/s where DeepSpeed prints them. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .runlog import LogReading
from .specs import Scenario
from .units import GIB

OUTSIDE_SHARE = 0.20
"""An OOM where more than this share of the GPU is in use but not held by the process's PyTorch allocator (total -
free - reserved, from PyTorch's own message) is put down to memory the planner does not price (another process, a
generation server, non-PyTorch allocations): a threshold of this tool, not a measured figure."""

BEFORE_TRAINING = ("engine initialisation", "model loading")
"""The phases of runlog's OOM traceback reading that come before the first training step."""

COMM_SHARE_LIMIT = 0.30
"""Communication above this share of the step is the bottleneck: the rule of thumb the article the product grew
from states (docs/references.md), the same 30% the planner's cluster advice uses (advice.py)."""

# comms logger op names (deepspeed/comm/comm.py functions the logger wraps) -> the planner's collective names
_OPS = {"all_reduce": "all_reduce", "inference_all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
        "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_fn": "reduce_scatter",
        "reduce_scatter": "reduce_scatter", "all_gather_into_tensor": "all_gather", "allgather_fn": "all_gather",
        "all_gather": "all_gather", "all_gather_base": "all_gather", "all_to_all_single": "all_to_all",
        "broadcast": "broadcast"}


@dataclass
class Comparison:
    part: str
    measured: float
    predicted: float
    unit: str
    tolerance: float
    source: str
    lower_bound: bool = False
    """The measured figure is a lower bound (what an OOM shows): only a measured value above the prediction
    disagrees."""

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted else float("inf")

    @property
    def disagrees(self) -> bool:
        if self.lower_bound:
            return self.ratio - 1.0 > self.tolerance
        return abs(self.ratio - 1.0) > self.tolerance


@dataclass
class Diagnosis:
    """See the module docstring; ``healthy``: see the property."""

    read: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    remedy: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    comm_share: float | None = None
    oom_phase: str = ""
    predicted_peak_phase: str = ""
    measured_step_seconds: float | None = None
    """The log's mean step time (DeepSpeed's timers), for charts."""
    measured_memory_gib: float | None = None
    measured_memory_label: str = ""
    """The log's memory figure for charts: see_memory_usage's Max_MA, or at an OOM what PyTorch held plus the
    request (a lower bound of what the step needed)."""

    @property
    def healthy(self) -> bool | None:
        """True: something was compared and no problem found; False: a problem; None: nothing to compare."""
        if self.problems:
            return False
        return True if self.comparisons else None

    def to_json(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "read": self.read, "problems": self.problems, "remedy": self.remedy,
                "notes": self.notes, "comm_share_of_step": self.comm_share, "oom_phase": self.oom_phase or None,
                "predicted_peak_phase": self.predicted_peak_phase or None,
                "comparisons": [{"part": c.part, "measured": c.measured, "predicted": c.predicted, "unit": c.unit,
                                 "ratio": c.ratio, "tolerance": c.tolerance, "disagrees": c.disagrees,
                                 "lower_bound": c.lower_bound, "source": c.source} for c in self.comparisons]}

    def text(self) -> str:
        out = ["Read from the log:"]
        out += [f"  {r['what']}: {r['value']} (line {r['line_number']}: {_cut(r['line'])})" for r in self.read]
        if self.comparisons:
            out.append("Predicted vs measured:")
            for c in self.comparisons:
                flag = "  <- outside the model's error" if c.disagrees else ""
                bound = "at least " if c.lower_bound else ""
                out.append(f"  {c.part}: measured {bound}{c.measured:.4g} {c.unit}, predicted {c.predicted:.4g} {c.unit} "
                           f"(x{c.ratio:.2f}; model error {c.tolerance:.0%}){flag}")
        out += [f"Problem: {p}" for p in self.problems]
        if self.remedy:
            out.append(f"Fix: {self.remedy['text']}")
        out += [f"note: {n}" for n in self.notes]
        out.append({True: "healthy: no problem found", False: "a problem was found",
                    None: "nothing to compare: no verdict"}[self.healthy])
        return "\n".join(out)


def _cut(line: str, limit: int = 120) -> str:
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " ..."


def _read(d: Diagnosis, what: str, value: Any, fig_line: int, line: str) -> None:
    d.read.append({"what": what, "value": value, "line_number": fig_line, "line": line})


def _steps(reading: LogReading) -> list[dict[str, float]]:
    """Per-step global timers, the first dropped as warm-up when more than one step was printed."""
    steps = [t for t in reading.global_timers() if {"fwd", "bwd", "step"} <= set(t)]
    return steps[1:] if len(steps) > 1 else steps


def _remedy_from_plan(scenario: Scenario, why: str, below_bytes: float | None = None) -> dict[str, Any] | None:
    """The planner's pick as a change list; with ``below_bytes`` only if its step peak is below that (a pick with
    less headroom than what already failed is no fix)."""
    from .planner import choice_changes, plan

    p = plan(scenario)
    if below_bytes is not None and p.fits and p.estimate.step_peak.bytes >= below_bytes:
        return {"text": f"{why} has less headroom than this one ({p.choice.label}: "
                f"{p.estimate.step_peak.verdict()}); no priced change would have avoided this OOM: measure what "
                "holds the memory (torch.cuda.memory_summary() at the failing step)", "changes": [], "label": None,
                "tokens_per_second": None}
    if not p.fits:
        return {"text": f"{why}: nothing the planner searches fits this cluster ({p.warnings[0] if p.warnings else ''})",
                "changes": [], "label": None, "tokens_per_second": None}
    changes = choice_changes(scenario, p.choice)
    return {"text": f"{why}: {p.choice.label}, {p.estimate.tokens_per_second:,.0f} tokens/s predicted, "
            f"{p.estimate.step_peak.verdict()}; change " + ("; ".join(changes) or "nothing (it is the pick)"),
            "changes": changes, "label": p.choice.label, "tokens_per_second": p.estimate.tokens_per_second,
            "advice": [a.text for a in p.cluster_advice or []]}


def same_phase(log_phase: str, timeline_phase: str) -> bool:
    """Whether a traceback's phase (runlog: forward, loss, backward, optimizer step) is the timeline's
    (costmodel/timeline.py PHASES). ``engine.backward`` runs the loss backward and the layers' backward, and the
    model's forward call computes the loss too, so "backward" matches both backward phases and "forward" both
    forward phases."""
    groups = {"forward": ("forward", "loss forward"), "loss": ("loss forward", "loss backward"),
              "backward": ("loss backward", "backward"), "optimizer step": ("optimizer step",)}
    return timeline_phase in groups.get(log_phase, ())


def diagnose(reading: LogReading, scenario: Scenario) -> Diagnosis:
    """Compare ``reading`` with what the cost model predicts for ``scenario`` (see the module docstring).
    Raises nothing for a valid Scenario; a reading with nothing in it gives a Diagnosis with a note saying so."""
    from .costmodel import estimate
    from .costmodel.measured_peaks import predicted_peak_bytes
    from .planner import DEFAULT_TOLERANCE

    d = Diagnosis()
    d.notes += reading.skipped
    est = estimate(scenario)
    peak = est.step_peak
    d.predicted_peak_phase = peak.phase if peak else ""
    if reading.empty:
        d.notes.append("nothing this reader knows was found in the log (CUDA OOM messages, DeepSpeed's "
                       "wall_clock_breakdown timers, the comms logger summary, see_memory_usage lines, the HF "
                       "Trainer's metrics, the flops profiler)")
        return d
    for key, fig in reading.settings.items():
        _read(d, f"log states {key}", fig.value, fig.line_number, fig.line)
    for key, fig in reading.flops.items():  # shown, not compared (the profiler's own FLOP count and latencies)
        _read(d, f"flops profiler {key}", fig.value, fig.line_number, fig.line)
    micro = reading.micro_timers()
    if micro and not reading.global_timers():
        line = reading.timers[-1]
        means = {k: round(sum(t.get(k, 0.0) for t in micro) / len(micro), 2)
                 for k in ("fwd_microstep", "bwd_microstep", "step_microstep")}
        _read(d, f"micro-step timers, mean of {len(micro)} (ms; no per-step totals printed, so not compared)", means,
              line.line_number, line.line)

    # -- step time from DeepSpeed's timers (milliseconds, summed over a step's micro-steps)
    steps = _steps(reading)
    step_seconds = None
    if steps:
        line = next(t for t in reversed(reading.timers) if "fwd" in t.value or "forward" in t.value)
        def mean_seconds(*names: str) -> float:  # DeepSpeed's timers are milliseconds
            return sum(s[n] for s in steps for n in names) / len(steps) / 1e3

        step_seconds = mean_seconds("fwd", "bwd", "step")
        _read(d, "step time (fwd + bwd + step, s, mean of the printed steps after the first)", round(step_seconds, 4),
              line.line_number, line.line)
        d.measured_step_seconds = step_seconds
        d.comparisons.append(Comparison("step", step_seconds, est.step_seconds, "s", DEFAULT_TOLERANCE,
                                        "wall_clock_breakdown fwd + bwd + step"))
        # forward vs backward: the matmul FLOPs split 1 : 2 (backward computes the gradients of the inputs and of
        # the weights; Narayanan et al. 2021, arXiv 2104.04473, section 5.1), full checkpointing adds one forward to
        # the backward (1 : 3); the backward also carries the exposed communication and ZeRO's hooks
        full = scenario.training.checkpointing == "full"
        fwd_share = 0.25 if full else 1.0 / 3.0
        comp = est.compute_seconds_per_step
        predicted_fwd = comp * fwd_share
        predicted_bwd = (comp * (1.0 - fwd_share) + est.communication.exposed_seconds_per_step
                         + est.fetch_overhead_seconds_per_step)
        d.comparisons.append(Comparison("forward", mean_seconds("fwd"), predicted_fwd,
                                        "s", DEFAULT_TOLERANCE, "wall_clock_breakdown fwd vs compute x "
                                        + ("1/4 (full checkpointing)" if full else "1/3")))
        d.comparisons.append(Comparison("backward", mean_seconds("bwd"), predicted_bwd,
                                        "s", DEFAULT_TOLERANCE, "wall_clock_breakdown bwd vs the rest of compute + "
                                        "exposed communication + ZeRO-3 fetch overhead"))
        opt = mean_seconds("step")
        predicted_opt = est.optimizer_seconds_per_step + est.offload_seconds_per_step
        if predicted_opt > 0:
            d.comparisons.append(Comparison("optimizer step", opt, predicted_opt, "s", DEFAULT_TOLERANCE,
                                            "wall_clock_breakdown step"))
    trainer = [t for t in reading.trainer if "train_samples_per_second" in t.value]
    if trainer:
        t = trainer[-1]
        sps = t.value["train_samples_per_second"]
        _read(d, "train_samples_per_second (HF Trainer)", sps, t.line_number, t.line)
        predicted = est.tokens_per_second / scenario.training.seq_len
        d.comparisons.append(Comparison("samples/s", sps, predicted, "samples/s", DEFAULT_TOLERANCE,
                                        "HF Trainer metrics (includes data loading, logging and the first steps)"))

    # -- collectives. The engine's own timers come first where they separate the communication: bwd_allreduce is
    # the gradient reduction inside backward (ZeRO-0/1/2), optimizer_allgather the parameter all-gather after the
    # step (ZeRO-1/2); ZeRO-3's gathers run inside fwd/bwd, so there the comms logger's times are used
    if steps and all("bwd_allreduce" in st for st in steps) and scenario.zero.stage < 3:
        gathers = [t.value.get("optimizer_allgather", 0.0) for t in reading.timers if "optimizer_allgather" in t.value]
        gather = sum(gathers[1:]) / max(1, len(gathers) - 1) if len(gathers) > 1 else sum(gathers)
        comm = mean_seconds("bwd_allreduce") * 1e3 + gather
        d.comm_share = comm / 1e3 / step_seconds
        d.notes.append(f"communication share = DeepSpeed's bwd_allreduce + optimizer_allgather timers / the step: "
                       f"{comm:.4g} ms of {step_seconds * 1e3:.4g} ms")

    if reading.comms:
        # the training collectives only (broadcasts and barriers are initialisation), each row's trimmed mean
        # latency x count (DeepSpeed's avg_latency is trim_mean(..., 0.1): the first, slow calls are left out)
        train = [r for r in reading.comms if _OPS.get(r.op) in ("all_reduce", "reduce_scatter", "all_gather",
                                                                 "all_to_all")]
        total_ms = sum(r.avg_latency_ms * r.count for r in train)
        by_op: dict[str, float] = {}
        for r in reading.comms:
            by_op[r.op] = by_op.get(r.op, 0.0) + r.total_latency_ms
        first = reading.comms[0]
        _read(d, "comms logger: total latency by op (ms, whole run)", {k: round(v, 2) for k, v in by_op.items()},
              first.line_number, f"{first.op} ...")
        big = max(reading.comms, key=lambda r: r.message_bytes)
        _read(d, f"busbw of the largest message ({big.op}, {big.message_bytes:,} bytes), Gbit/s", big.busbw_gbps,
              big.line_number, f"{big.op} {big.message_bytes} B x {big.count}: {big.busbw_gbps} Gbps")
        printed = len(reading.global_timers())
        if step_seconds and printed and d.comm_share is None:  # no share from the timers
            per_step = total_ms / 1e3 / printed
            d.comm_share = per_step / step_seconds
            d.notes.append(f"communication share = the comms logger's all-reduce, reduce-scatter and all-gather "
                           f"time (mean latency x count) / the {printed} printed steps / the mean step time: "
                           f"{per_step:.3g} s of {step_seconds:.3g} s (the logger times each collective whole, "
                           "overlapped or not)")
            if d.comm_share > 1.0:
                d.notes.append(f"the logged collective time is {d.comm_share:.1f}x the step: the comms logger's "
                               "latencies include waits for the other ranks (stragglers), so no share is judged")
                d.comm_share = None

        collective = _OPS.get(big.op)
        if collective:
            one_node = scenario.cluster.nodes == 1
            gb = (scenario.cluster.gpu.intra_node_busbw_gb_per_s if one_node
                  else scenario.cluster.network.node_busbw_bytes_per_second / 1e9)
            d.comparisons.append(Comparison(f"{collective} busbw at {big.message_bytes:,} bytes", big.busbw_gbps,
                                            gb * 8, "Gbit/s", DEFAULT_TOLERANCE,
                                            "comms logger busbw_avg vs the cluster's "
                                            + ("intra-node busbw" if one_node else "inter-node bus bandwidth")))

    # -- memory
    if reading.memory and peak:
        m = max(reading.memory, key=lambda f: f.value["max_ma_gib"])
        _read(d, "see_memory_usage Max_MA / CA / Max_CA (GiB)",
              (m.value["max_ma_gib"], m.value["ca_gib"], m.value["max_ca_gib"]),
              m.line_number, m.line)
        err = peak.error_fraction
        d.measured_memory_gib = m.value["max_ma_gib"]
        d.measured_memory_label = f"your log: Max_MA {m.value['max_ma_gib']:.1f} GiB"
        d.comparisons.append(Comparison("peak allocated", m.value["max_ma_gib"],
                                        predicted_peak_bytes(scenario, "max_memory_allocated") / GIB, "GiB", err,
                                        "see_memory_usage Max_MA vs the step peak (live tensors + cuBLAS workspace)"))
        reserved = max(f.value["max_ca_gib"] for f in reading.memory)
        reserved = max(reserved, max(f.value["ca_gib"] for f in reading.memory))  # Max_CA is printed rounded
        d.comparisons.append(Comparison("peak reserved", reserved,
                                        predicted_peak_bytes(scenario, "max_memory_reserved") / GIB, "GiB", err,
                                        "see_memory_usage Max_CA vs the step peak with the allocator's slack"))

    # -- out of memory
    if d.comm_share is not None and d.comm_share > COMM_SHARE_LIMIT:
        d.problems.append(f"communication is {d.comm_share:.0%} of the step, above the {COMM_SHARE_LIMIT:.0%} "
                          "rule of thumb: communication is the bottleneck (raise the buckets, accumulate "
                          "more micro-steps per step, or change the parallelism)")
    if reading.ooms:
        _diagnose_oom(d, reading.ooms[-1], scenario, est)
    elif d.comm_share is not None and d.comm_share > COMM_SHARE_LIMIT:
        d.remedy = _remedy_from_plan(scenario, "the planner's pick for this cluster")
    _log_vs_scenario(d, reading, scenario)
    off = [c for c in d.comparisons if c.disagrees]
    if off and not d.problems:
        worst = max(off, key=lambda c: abs(c.ratio - 1.0))
        d.problems.append(f"the measured {worst.part} is x{worst.ratio:.2f} the prediction ({worst.measured:.4g} vs "
                          f"{worst.predicted:.4g} {worst.unit}), outside the model's error of {worst.tolerance:.0%}"
                          + (f" ({len(off)} parts are)" if len(off) > 1 else "") + ": check that the scenario is "
                          "the run's (model, GPUs, micro-batch, precision), or the model is off here")
    if not d.comparisons and not d.problems:
        d.notes.append("nothing read from this log can be compared with the plan (e.g. only micro-step timers or "
                       "the flops profiler): the reading is shown, no verdict is given")
    return d


def _log_vs_scenario(d: Diagnosis, reading: LogReading, scenario: Scenario) -> None:
    """A note for each setting the log states that differs from the scenario diagnosed, and for an OOM's GPU
    capacity that differs from the scenario's GPU memory by more than 2%."""
    st = reading.settings
    have = {"world_size": scenario.cluster.world_size, "zero_stage": scenario.zero.stage,
            "micro_batch": scenario.training.micro_batch, "grad_accum": scenario.training.grad_accum}
    for key, fig in st.items():
        if key in have and fig.value != have[key]:
            d.notes.append(f"the log states {key} {fig.value} (line {fig.line_number}) but the scenario diagnosed has "
                           f"{have[key]}: the predictions are for the scenario")
    if reading.ooms:
        total = reading.ooms[-1].total_bytes
        mem = scenario.cluster.gpu_memory_bytes or scenario.cluster.gpu.memory_bytes
        if abs(total - mem) > 0.02 * mem:
            d.notes.append(f"the OOM's GPU has {total / GIB:.2f} GiB, the scenario {mem / GIB:.2f} GiB: give --gpu or "
                           "--gpu-memory-gib to diagnose against the run's GPU")


def _fragmentation_advice(o) -> str:
    """What to set when the allocator's cache alone failed the request: the hint PyTorch's message gives."""
    if "expandable_segments" in o.line or o.wording == "new":
        return "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the advice PyTorch gives in this message)"
    if o.wording == "1.x":
        return ("set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<MB> (the advice this PyTorch's message gives; "
                "expandable_segments needs PyTorch 2.1 or newer)")
    return "upgrade PyTorch (2.1+ has PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation)"


def _diagnose_oom(d: Diagnosis, o, scenario: Scenario, est) -> None:
    from .planner import nearest_fit

    peak = est.step_peak
    gpu = "?" if o.gpu_index is None else o.gpu_index
    _read(d, f"CUDA out of memory ({o.wording} PyTorch wording): requested / total / free GiB",
          (round(o.tried_bytes / GIB, 2), round(o.total_bytes / GIB, 2), round(o.free_bytes / GIB, 2)),
          o.line_number, o.line)
    if o.allocated_bytes is not None:
        _read(d, "held by PyTorch at the OOM: allocated / reserved but unallocated GiB",
              (round(o.allocated_bytes / GIB, 2), None if o.reserved_unallocated_bytes is None
               else round(o.reserved_unallocated_bytes / GIB, 2)), o.line_number, o.line)
        d.measured_memory_gib = (o.allocated_bytes + o.tried_bytes) / GIB
        d.measured_memory_label = f"your log: OOM at >= {d.measured_memory_gib:.1f} GiB"
        if peak and o.phase not in BEFORE_TRAINING:
            d.comparisons.append(Comparison("allocated at the OOM + the request", d.measured_memory_gib,
                                            peak.bytes / GIB, "GiB", peak.error_fraction,
                                            "PyTorch's OOM message vs the step peak (a lower bound of what the step "
                                            "needed)", lower_bound=True))
    d.oom_phase = o.phase
    where = (f" during {o.phase}" if o.phase in BEFORE_TRAINING
             else f" in the {o.phase}" if o.phase else "")
    text = (f"CUDA out of memory{where} on GPU {gpu} ({o.total_bytes / GIB:.2f} GiB total, "
            f"{o.tried_bytes / GIB:.2f} GiB requested, {o.free_bytes / GIB:.2f} GiB free)")
    if peak:
        text += f"; the model puts this step's peak in the {peak.phase} at {peak.bytes / GIB:.1f} GiB"
        if o.phase in BEFORE_TRAINING:
            text += " (this OOM is before the first training step: the step's peak is not this moment)"
        elif o.phase:
            text += " (the same phase)" if same_phase(o.phase, peak.phase) else f" (not the {o.phase})"
    fragmented = o.reserved_unallocated_bytes is not None and o.reserved_unallocated_bytes >= o.tried_bytes
    if o.reserved_unallocated_bytes is not None:
        text += (f"; {o.reserved_unallocated_bytes / GIB:.2f} GiB reserved by PyTorch but unallocated "
                 f"({o.reserved_unallocated_bytes / o.total_bytes:.0%} of the GPU)")
        if fragmented:
            text += ": more than the request, so fragmentation alone failed it"
    predicted_fits = bool(peak) and peak.headroom_bytes >= 0
    held = o.reserved_bytes
    context = scenario.assumptions.cuda_context_bytes
    outside = (o.total_bytes - o.free_bytes - held - context) if held is not None else None
    elsewhere = predicted_fits and outside is not None and outside > OUTSIDE_SHARE * o.total_bytes
    if elsewhere:
        text += (f"; {outside / GIB:.1f} GiB of the GPU's used memory is neither this process's PyTorch memory nor "
                 f"its CUDA context ({context / GIB:.2f} GiB assumed): other processes on the GPU (e.g. a generation "
                 "server) or non-PyTorch allocations; the planner prices this process's tensors only")
    d.problems.append(text)
    if not predicted_fits and peak:
        fit = nearest_fit(scenario)
        if fit is not None:
            d.remedy = {"text": f"the model agrees this configuration does not fit ({peak.verdict(unfit_said=True)}); the nearest "
                        f"configuration that fits: {fit.label} ({fit.why_not}), {fit.estimate.tokens_per_second:,.0f} "
                        f"tokens/s predicted, {fit.estimate.step_peak.verdict()}",
                        "changes": fit.why_not.split("; "), "label": fit.label,
                        "tokens_per_second": fit.estimate.tokens_per_second}
        else:
            d.remedy = {"text": f"the model agrees this configuration does not fit ({peak.verdict(unfit_said=True)}), and nothing the "
                        "planner searches fits this cluster: more GPUs, a smaller model, LoRA/QLoRA "
                        "(`zeroplanner recommend` prices them)", "changes": [], "label": None,
                        "tokens_per_second": None}
    elif elsewhere:
        d.remedy = {"text": f"free the {outside / GIB:.1f} GiB held outside this process's PyTorch allocator, "
                    "or budget for it: no ZeRO setting changes it (the planner's memory is per process)",
                    "changes": [], "label": None, "tokens_per_second": None}
    elif fragmented:
        d.remedy = {"text": _fragmentation_advice(o) + "; the model's step peak "
                    + (f"leaves {peak.headroom_bytes / GIB:.1f} GiB" if peak else "is not known"),
                    "changes": ["PYTORCH_CUDA_ALLOC_CONF"], "label": None, "tokens_per_second": None}
    else:
        d.remedy = _remedy_from_plan(scenario, "the model predicts this configuration fits"
                                     + (f" ({peak.verdict()})" if peak else "")
                                     + ", so the run holds more than it prices; the planner's pick",
                                     below_bytes=peak.bytes if peak else None)


def calibration(reading: LogReading, scenario: Scenario) -> tuple[dict[str, Any], list[str]]:
    """A file for ``--cluster-from`` (a probe result, probe/cluster.py ``cluster_changes``) from what the log
    measured, and one line per figure saying what it determines and what a log cannot determine.

    - all-reduce at two or more message sizes (comms logger: avg latency per size) -> ``world`` records for the
      alpha-beta fit: on one node the intra-node busbw and latency, over several the network's efficiency;
    Not determinable from a log: the CPU-Adam rate (the step timer bounds it from below only), GPU memory (the OOM's
    total capacity is reported, not applied), host RAM, PCIe. Returns ``({}, notes)`` when nothing can be
    calibrated."""
    notes: list[str] = []
    c = scenario.cluster
    ranks = c.world_size
    out: dict[str, Any] = {"source": "zeroplanner diagnose --write-calibration",
                           "message": "figures measured in a training log; GPUs kept as given",
                           "cuda_available": False, "nodes": c.nodes, "backend": "from a training log"}
    records = [{"collective": "all_reduce", "ranks": ranks, "bytes": r.message_bytes,
                "seconds": r.avg_latency_ms / 1e3} for r in reading.comms if _OPS.get(r.op) == "all_reduce"
               and r.avg_latency_ms > 0]
    if len({r["bytes"] for r in records}) >= 2:
        out["world"] = records
        if c.nodes > 1:
            out["intra_node"] = []
        notes.append(f"all-reduce at {len(records)} message sizes -> "
                     + ("intra-node busbw and latency" if c.nodes == 1 else "the network's efficiency and latency"))
    else:
        notes.append("all-reduce at fewer than two message sizes: the bandwidth cannot be fitted")
    notes.append("not written: a CPU-Adam rate (DeepSpeed's step timer also holds the copy back and the "
                 "gradient norm, so it bounds the rate from below only; measure it with `zeroplanner probe "
                 "--benchmarks`)")
    notes.append("not determinable from a log: GPU memory, host RAM, NVMe, PCIe bandwidth")
    if "world" not in out:
        return {}, notes
    return out, notes
