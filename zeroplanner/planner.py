"""The planner: evaluate every candidate configuration, keep those that fit, rank them, explain the choice.

Candidates: ZeRO stage x offload_optimizer x offload_param (stage 3) x activation checkpointing x micro-batch
(the samples per GPU per step, micro_batch x gradient_accumulation_steps, stay fixed, so the global batch is the
user's) x ZeRO++ (stage 3 on more than one node) x overlap_comm (stages 1-2) x reduce bucket (LoRA) x, for long
sequences (:data:`SP_MIN_SEQUENCE_TOKENS`) or when nothing fits without it, the Ulysses degree
(:func:`sequence_parallel_options`: divisors of the GPUs per node that the heads allow). All are evaluated in one
vectorised call. ``held`` (input keys of :data:`SEARCH_INPUTS`) fixes an axis at the scenario's
value: ``plan(s, held={"stage"})`` searches only ``s.zero.stage`` (the CLI holds every option the user gave).
DeepSpeed AutoTP degrees 2, 4, 8 (:func:`autotp_degrees`) join as one more grid per degree only on one node, in a
full fine-tune without a Ulysses search, with the scenario at tp 1 and no tp-1 candidate at ZeRO-0/1/2 fitting
without offload (so tp 1 needs ZeRO-3 or offload): AutoTP's per-layer all-reduces need the node's NVLink (across
nodes they would run at NIC speed, so it is never a multi-node candidate), and the rule keeps plan time unchanged
whenever ZeRO-0/1/2 fit at tp 1 (measured: 1.7 ms for benchmarks/bench_costmodel.py's scenario before and after;
1.7 -> 5.0 ms for llama-3.1-8b on 8 x A100-40GB, where it applies).

Ranking policy (documented, and tested in tests/core/test_planner*.py):
1. Keep candidates whose step peak (costmodel/timeline.py) fits GPU memory (less ``gpu_memory_margin_fraction``,
   default 0), host RAM (with DeepSpeed's 1.5x buffer factor) and NVMe.
2. Candidates within ``tolerance`` (default 10%) of the best predicted throughput are treated as equal: the
   model's step-time error is of that order (docs/validation.md), and a higher stage is not free: ZeRO-3 measured
   2.5-3.3x slower than ZeRO-2 on a small model (LianjiaTech/BELLE #402, BLOOM-560M on 2 GPUs).
   Parameter offload (``offload_param``) is considered only when no candidate without it fits.
   A candidate whose headroom is below the model's measured error of the peak (timeline.memory_error_fraction x
   peak: on a GPU from published GPU runs, on the engine's CPU ranks from its step-peak census) is not a proven fit: it is considered only when no proven one exists,
   and then the one with the most headroom first.
3. Among equals prefer, in order: no offload (offload is a last resort: PCIe/CPU-bound; DeepSpeed #1130), the
   smaller Ulysses degree (fewer all-to-alls, a larger data-parallel batch), the smaller AutoTP degree (its
   all-reduces are serial with compute), stages 0-2 over stage 3 (2Ψ instead of 3Ψ per step; ZeRO paper Sec. 7), no
   ZeRO++, then the most GPU memory headroom (ZeRO-2 frees gradients at ZeRO-1's communication volume), then
   throughput.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from .advice import ClusterAdvice, MethodAdvice
from .costmodel import Candidates, Estimate, estimate, evaluate, make_context
from .costmodel.communication import autotp_collectives_per_micro_step
from .costmodel.evaluate import estimate_from_values
from .costmodel.context import CHECKPOINT_CODES, OFFLOAD_CODES
from .costmodel.timeline import memory_error_fraction
from .specs import Architecture, Scenario, hardware_precision
from .units import gib

DEFAULT_TOLERANCE = 0.10

_OFFLOAD_NAMES = {v: k for k, v in OFFLOAD_CODES.items()}
_CKPT_NAMES = {v: k for k, v in CHECKPOINT_CODES.items()}

VARIANTS: tuple[tuple[str, int, int, int], ...] = (
    ("ZeRO-0", 0, 0, 0),
    ("ZeRO-1", 1, 0, 0),
    ("ZeRO-2", 2, 0, 0),
    ("ZeRO-3", 3, 0, 0),
    ("ZeRO-2 + CPU optimizer", 2, 1, 0),
    ("ZeRO-3 + CPU optimizer", 3, 1, 0),
    ("ZeRO-3 + CPU optimizer & params", 3, 1, 1),
    ("ZeRO-3 + NVMe optimizer & params", 3, 2, 2),
)
"""(label, stage, offload_optimizer code, offload_param code) shown side by side in charts."""


SEARCH_INPUTS: dict[str, str] = {
    "stage": "ZeRO stage",
    "offload_optimizer": "optimizer offload",
    "offload_param": "parameter offload",
    "checkpointing": "activation checkpointing",
    "micro_batch": "micro-batch split",
    "grad_accum": "micro-batch split",
    "overlap_comm": "overlap_comm",
    "reduce_bucket_size": "reduce bucket",
    "zero_hpz_partition_size": "ZeRO++",
    "zero_quantized_weights": "ZeRO++",
    "zero_quantized_gradients": "ZeRO++",
    "sequence_parallel_size": "sequence parallelism",
    "autotp_size": "AutoTP degree",
}
"""Input keys (:data:`zeroplanner.inputs.INPUTS`) the planner varies, and the search axis each one fixes when held.
micro_batch and grad_accum are one axis (their product, the samples per GPU per step, is always kept); the three
ZeRO++ keys are one axis."""


def _check_held(held) -> frozenset[str]:
    held = frozenset(held)
    unknown = held - set(SEARCH_INPUTS)
    if unknown:
        raise ValueError(f"held={sorted(unknown)}: the planner varies only {', '.join(SEARCH_INPUTS)}")
    return held


def _axis_values(cand: Candidates, tp: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Search axis name -> its column in the candidate grid (ZeRO++ as one code per (hpz, qwz, qgz); the AutoTP
    degree ``tp``, or one value when not given)."""
    cols = {"AutoTP degree": np.ones(cand.shape, dtype=np.int64) if tp is None else tp,
            "ZeRO stage": cand.stage, "optimizer offload": cand.offload_optimizer,
            "parameter offload": cand.offload_param, "activation checkpointing": cand.checkpointing,
            "micro-batch split": cand.micro_batch, "overlap_comm": cand.overlap, "reduce bucket": cand.reduce_bucket,
            "ZeRO++": cand.hpz * 4 + cand.qwz * 2 + cand.qgz, "sequence parallelism": cand.sp}
    return {a: np.asarray(cols[a]) for a in dict.fromkeys(SEARCH_INPUTS.values())}


def varied_axes(cand: Candidates, tp: np.ndarray | None = None) -> list[str]:
    """The search axes (:data:`SEARCH_INPUTS` names) on which the candidate grid holds more than one value (``tp``:
    the AutoTP degree of each candidate, when the plan varied it)."""
    return [a for a, col in _axis_values(cand, tp).items() if col.size and col.min() != col.max()]


def zeropp_parts(hpz_partition_size: int, quantized_weights: bool, quantized_gradients: bool) -> str:
    """Which ZeRO++ parts are on, in the ZeRO++ paper's names (Wang et al., arXiv 2306.10209): ``hpZ N``
    (``zero_hpz_partition_size`` N > 1: a secondary weight shard over N GPUs), ``qwZ`` (``zero_quantized_weights``:
    int8 weight all-gather), ``qgZ`` (``zero_quantized_gradients``: int4 gradient reduce-scatter); "" when none is.

    >>> zeropp_parts(8, True, True)
    'hpZ 8, qwZ, qgZ'
    >>> zeropp_parts(1, False, True)
    'qgZ'
    """
    parts = [f"hpZ {hpz_partition_size}"] if hpz_partition_size > 1 else []
    return ", ".join(parts + ["qwZ"] * bool(quantized_weights) + ["qgZ"] * bool(quantized_gradients))


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Choice(_Out):
    """One configuration the planner can pick (DeepSpeed key names where they exist)."""

    stage: int
    offload_optimizer: str
    offload_param: str
    checkpointing: str
    micro_batch: int
    grad_accum: int
    overlap_comm: bool | None = None
    reduce_bucket_size: int | None = None
    zero_hpz_partition_size: int = 1
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    sequence_parallel_size: int = 1
    autotp_size: int | None = None
    """DeepSpeed AutoTP degree (``tensor_parallel.autotp_size``); None: the scenario's, unchanged."""

    @property
    def label(self) -> str:
        parts = [f"ZeRO-{self.stage}"]
        if (self.autotp_size or 1) > 1:
            parts.append(f"+ AutoTP {self.autotp_size}")
        off = []
        if self.offload_optimizer != "none":
            off.append(f"{self.offload_optimizer.upper() if self.offload_optimizer == 'cpu' else 'NVMe'} optimizer")
        if self.offload_param != "none":
            off.append(f"{self.offload_param.upper() if self.offload_param == 'cpu' else 'NVMe'} params")
        if off:
            parts.append("+ " + " & ".join(off))
        zpp = zeropp_parts(self.zero_hpz_partition_size, self.zero_quantized_weights, self.zero_quantized_gradients)
        if zpp:
            parts.append(f"+ ZeRO++ ({zpp})")
        if self.sequence_parallel_size > 1:
            parts.append(f"+ Ulysses SP {self.sequence_parallel_size}")
        ckpt = {"none": "no", "selective": "selective", "full": "full"}[self.checkpointing]
        parts.append(f"({ckpt} activation checkpointing, micro-batch {self.micro_batch} x "
                     f"{self.grad_accum} accumulation steps)")
        return " ".join(parts)


class Option(_Out):
    """A labelled, evaluated configuration. ``why_not``: for an alternative predicted faster than the pick, why
    it was not picked (empty otherwise)."""

    label: str
    choice: Choice
    scenario: Scenario
    estimate: Estimate
    why_not: str = ""


def _short(c: Choice) -> str:
    """A label without '&' (reasons are matched verbatim in HTML)."""
    parts = [f"ZeRO-{c.stage}"]
    if (c.autotp_size or 1) > 1:
        parts.append(f"autotp_size {c.autotp_size}")
    if c.offload_optimizer != "none":
        parts.append(f"offload_optimizer {c.offload_optimizer}")
    if c.offload_param != "none":
        parts.append(f"offload_param {c.offload_param}")
    zpp = zeropp_parts(c.zero_hpz_partition_size, c.zero_quantized_weights, c.zero_quantized_gradients)
    if zpp:
        parts.append(f"ZeRO++ ({zpp})")
    if c.sequence_parallel_size > 1:
        parts.append(f"sequence_parallel_size {c.sequence_parallel_size}")
    parts.append(f"{c.checkpointing} checkpointing, micro-batch {c.micro_batch} x {c.grad_accum}")
    return ", ".join(parts)


def step_breakdown(est: Estimate) -> str:
    """One line: where the predicted step time goes (compute, exposed collectives, ZeRO host overhead, offload,
    optimizer), so a reader sees why one stage wins."""
    host = est.fetch_overhead_seconds_per_step + est.hook_seconds_per_step
    collectives = est.communication.exposed_seconds_per_step - host
    return (f"Step {est.step_seconds:.3f} s = compute {est.compute_seconds_per_step:.3f} s "
            f"({est.achieved_fraction:.0%} of peak) + exposed communication {collectives:.3f} s + ZeRO-3 fetch "
            f"overhead {est.fetch_overhead_seconds_per_step:.3f} s + gradient hooks {est.hook_seconds_per_step:.3f} s "
            f"+ offload {est.offload_seconds_per_step:.3f} s + optimizer {est.optimizer_seconds_per_step:.3f} s.")


def _why_not(best: Choice, best_est: Estimate, alt: Choice, alt_est: Estimate, tolerance: float,
             param_offload_excluded: bool) -> str:
    """Why a faster alternative lost: the ranking rule that put the pick first. Faster is tokens/s (the step
    seconds' ratio when both have the same data-parallel degree; an AutoTP candidate's step carries fewer tokens)."""
    gain = alt_est.tokens_per_second / best_est.tokens_per_second - 1.0
    if gain <= 0.005:
        return ""
    head = f"{gain:.0%} faster than the pick, not picked: "
    alt_off = (alt.offload_optimizer != "none") + (alt.offload_param != "none")
    best_off = (best.offload_optimizer != "none") + (best.offload_param != "none")
    if gain > tolerance and param_offload_excluded:
        return head + "it offloads parameters, which is used only when nothing fits without it."
    if alt_off > best_off:
        return head + (f"within the {tolerance:.0%} model tolerance and it needs offload (PCIe/host-bound, the "
                       "pick does without).")
    if alt.stage == 3 and best.stage < 3:
        return head + (f"within the {tolerance:.0%} model tolerance; ZeRO-3 adds per-module parameter gathers "
                       "and host hooks the pick avoids (measured ZeRO-3 2.5-3.3x slower on small models, "
                       "LianjiaTech/BELLE #402: BLOOM-560M on 2 GPUs).")
    zpp_alt = alt.zero_hpz_partition_size > 1 or alt.zero_quantized_weights or alt.zero_quantized_gradients
    zpp_best = best.zero_hpz_partition_size > 1 or best.zero_quantized_weights or best.zero_quantized_gradients
    if zpp_alt and not zpp_best:
        what = ("quantised collectives" if alt.zero_quantized_weights or alt.zero_quantized_gradients
                else "hpZ's secondary weight copy per node")
        return head + f"within the {tolerance:.0%} model tolerance and it needs ZeRO++ ({what})."
    headroom = best_est.step_peak.headroom_bytes
    alt_headroom = alt_est.step_peak.headroom_bytes
    if alt_est.step_peak.risky and not best_est.step_peak.risky:
        return head + (f"within the {tolerance:.0%} model tolerance, but its headroom "
                       f"({gib(alt_headroom):.2f} GiB) is below the model's error of "
                       f"{alt_est.step_peak.error_fraction:.0%} of its peak; the pick leaves {gib(headroom):.2f} GiB.")
    if alt_headroom < headroom:
        return head + (f"within the {tolerance:.0%} model tolerance; the pick leaves more GPU memory free "
                       f"({gib(headroom):.2f} vs {gib(alt_headroom):.2f} GiB), safer against fragmentation and "
                       "longer batches.")
    return head + f"within the {tolerance:.0%} model tolerance; the pick is simpler."


class Plan(_Out):
    """The planner's answer for one scenario."""

    fits: bool
    choice: Choice | None
    scenario: Scenario
    estimate: Estimate
    reasons: list[str]
    warnings: list[str]
    alternatives: list[Option]
    variants: list[Option]
    candidates_evaluated: int
    held: dict[str, Any] = {}
    varied: list[str] = []
    assumptions: list[str] = []
    """Defaults the verdict rests on that the user did not give (:func:`zeroplanner.advice.verdict_assumptions`);
    shown with the verdict, before the reasons."""
    cluster_advice: ClusterAdvice | None = None
    """Fewer nodes, when exposed communication is the bottleneck (:func:`zeroplanner.advice.cluster_advice`)."""
    method_advice: list[MethodAdvice] = []
    """Cheaper methods (LoRA, QLoRA), priced, when the pick offloads or nothing fits
    (:func:`zeroplanner.advice.method_advice`); never picked."""

    @property
    def advice(self) -> list[str]:
        """The advice texts, cluster first: what to say before the reasons."""
        return ([self.cluster_advice.text] if self.cluster_advice else []) + [m.text for m in self.method_advice]


# ---------------------------------------------------------------------------------------------------------------
ZERO_PP_PAPER = "the ZeRO++ paper (Wang et al., arXiv 2306.10209)"


def quantized_zeropp_allowed(scenario: Scenario) -> tuple[bool, bool]:
    """(zero_quantized_weights, zero_quantized_gradients) the planner may pick: both when the scenario's
    ``training.allow_lossy_communication`` is on, else only what the scenario sets itself (a user who sets a flag
    keeps it). Lossy because qwZ all-gathers weights in int8 and qgZ reduce-scatters gradients in int4
    (:data:`ZERO_PP_PAPER`)."""
    z = scenario.zero
    allowed = scenario.training.allow_lossy_communication
    return allowed or z.zero_quantized_weights, allowed or z.zero_quantized_gradients


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


SP_MIN_SEQUENCE_TOKENS = 16_384
"""From this sequence length on the planner also searches Ulysses sequence parallelism even when sp = 1 fits: the
length where activations, not model states, start to decide the fit of an 8B model on an 80 GB GPU (ALST,
Bekman et al. arXiv 2506.13996 Sec. 1: Llama-8B "with sequence over 32K runs out of memory on a basic Hugging
Face model" on one H100; half of it, so that the search starts before the wall). Below it sp > 1 is searched only
when nothing fits at sp = 1 (:func:`plan`)."""


def sequence_parallel_options(scenario: Scenario, held=(), *, within_node: bool = True) -> list[int]:
    """Ulysses degrees the planner may try: the scenario's own when ``sequence_parallel_size`` is held; else 1 and
    every divisor P > 1 of the GPUs per node (``within_node``: the all-to-alls stay on NVLink; else of the world
    size) that DeepSpeed accepts for the model (:func:`~zeroplanner.costmodel.ulysses.check_ulysses`: heads and KV
    heads), that divides the sequence and, with tensor parallelism, the world size / tp; none without a flash/sdpa
    attention (Ulysses refuses eager). Ascending ints."""
    from .costmodel.ulysses import check_ulysses

    held = _check_held(held)
    c, m, t = scenario.cluster, scenario.model, scenario.training
    if "sequence_parallel_size" in held:
        return [c.sequence_parallel_size]
    out = [1]
    if not t.flash_attention:
        return out
    for d in _divisors(c.gpus_per_node if within_node else c.world_size)[1:]:
        try:
            check_ulysses(n_heads=m.n_heads, kv_heads=m.kv_heads, sp_size=d, linear_mixer=m.linear_mixer)
        except ValueError:
            continue
        if scenario.sequence_tokens % d == 0 and c.world_size % (c.tensor_parallel_size * d) == 0:
            out.append(d)
    return out


def candidate_grid(scenario: Scenario, held=(), sp_values: Sequence[int] | None = None) -> Candidates:
    """Every candidate for the scenario (see module docstring); the axes of the ``held`` input keys
    (:data:`SEARCH_INPUTS`) take the scenario's value only. ``sp_values``: the Ulysses degrees to grid over
    (default: the scenario's ``sequence_parallel_size``; :func:`plan` passes :func:`sequence_parallel_options` for
    long sequences). With ``checkpoint_offload`` only full checkpointing is a candidate (it offloads the
    checkpointed inputs). Returns 1-D Candidates (empty when the held values leave no valid combination, e.g.
    offload_optimizer held at ``cpu`` with stage held at 0). Raises ValueError for a held key the planner does
    not vary."""
    held = _check_held(held)
    t, c, z = scenario.training, scenario.cluster, scenario.zero
    samples = t.micro_batch * t.grad_accum
    micros = [m for m in _divisors(samples) if m <= 64] or [1]
    if "micro_batch" in held or "grad_accum" in held:
        micros = [t.micro_batch]
    zpp = [(1, 0, 0)]
    if c.nodes > 1:
        # hpZ (a secondary weight copy per node) is lossless; the quantized collectives (qwZ int8 weights, qgZ int4
        # gradients) change the numerics, so they are candidates only when allowed or set by the user
        qw, qg = quantized_zeropp_allowed(scenario)
        zpp.append((c.gpus_per_node, int(qw), int(qg)))
    zpp_held_on = False
    if held & {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"}:
        zpp = [(z.zero_hpz_partition_size, int(z.zero_quantized_weights), int(z.zero_quantized_gradients))]
        zpp_held_on = zpp[0] != (1, 0, 0)  # ZeRO++ is stage 3 only: a held ZeRO++ setting rules out stages 0-2
    stages = (z.stage,) if "stage" in held else range(4)
    oos = (OFFLOAD_CODES[z.offload_optimizer.device],) if "offload_optimizer" in held else (0, 1, 2)
    ops = (OFFLOAD_CODES[z.offload_param.device],) if "offload_param" in held else (0, 1, 2)
    cks = (CHECKPOINT_CODES[t.checkpointing],) if "checkpointing" in held or t.checkpoint_offload else (0, 1, 2)
    sps = tuple(sp_values) if sp_values is not None else (c.sequence_parallel_size,)
    ov_held = None if "overlap_comm" not in held or z.overlap_comm is None else int(z.overlap_comm)
    # DeepSpeed allocates the whole reduce bucket however few parameters train (memory.buffer_bytes), so with
    # Ψ_t below the bucket (LoRA/QLoRA) a bucket of Ψ_t (rounded up to 1e6 elements) is also a candidate: same
    # number of collectives, less memory.
    rb = scenario.zero.reduce_bucket_size
    small = int(max(1, math.ceil(scenario.trainable_parameters / c.tensor_parallel_size / 1e6)) * 1e6)
    buckets = (rb, small) if small < rb and "reduce_bucket_size" not in held else (rb,)
    rows = []
    for stage in stages:
        if zpp_held_on and stage < 3:
            continue
        for oo in ((0,) if stage == 0 else (0, 1, 2)):
            if oo not in oos:
                continue
            for op in ((0, 1, 2) if stage == 3 else (0,)):
                if op not in ops:
                    continue
                for hpz, qw, qg in (zpp if stage == 3 else [(1, 0, 0)]):
                    ovs = (0, 1) if stage in (1, 2) else (1,) if stage == 3 else (0,)
                    for ov in (ovs if ov_held is None or stage == 0 else (ov_held,)):
                        for b in (buckets if stage > 0 else (rb,)):
                            for ck in cks:
                                for m in micros:
                                    rows.append((stage, oo, op, ck, m, samples // m, hpz, qw, qg, ov, b))
    a = np.array(rows, dtype=np.int64).reshape(-1, 11)
    sp_col = sps[0]
    if len(sps) > 1:  # every configuration at every Ulysses degree
        sp_col = np.tile(np.asarray(sps, dtype=np.int64), a.shape[0])
        a = np.repeat(a, len(sps), axis=0)
    return Candidates.build(
        stage=a[:, 0], offload_optimizer=a[:, 1], offload_param=a[:, 2], checkpointing=a[:, 3],
        micro_batch=a[:, 4], grad_accum=a[:, 5], nodes=c.nodes, hpz=a[:, 6], qwz=a[:, 7], qgz=a[:, 8],
        overlap=a[:, 9], reduce_bucket=a[:, 10], sp=sp_col,
    )


def _choice_at(cand: Candidates, i: int, tp: np.ndarray | None = None) -> Choice:
    return Choice(
        autotp_size=None if tp is None else int(tp[i]),
        stage=int(cand.stage[i]),
        offload_optimizer=_OFFLOAD_NAMES[int(cand.offload_optimizer[i])],
        offload_param=_OFFLOAD_NAMES[int(cand.offload_param[i])],
        checkpointing=_CKPT_NAMES[int(cand.checkpointing[i])],
        micro_batch=int(cand.micro_batch[i]),
        grad_accum=int(cand.grad_accum[i]),
        overlap_comm=None if cand.overlap[i] < 0 else bool(cand.overlap[i]),
        reduce_bucket_size=int(cand.reduce_bucket[i]),
        zero_hpz_partition_size=int(cand.hpz[i]),
        zero_quantized_weights=bool(cand.qwz[i]),
        zero_quantized_gradients=bool(cand.qgz[i]),
        sequence_parallel_size=int(cand.sp[i]),
    )


def apply_choice(scenario: Scenario, choice: Choice, *, validate: bool = True) -> Scenario:
    """The scenario with the choice's settings. ``validate=False`` skips re-validation for choices the planner
    built itself from valid candidate codes (fast path: only changed sub-models are copied)."""
    z0, t0 = scenario.zero, scenario.training

    def offload(spec, device):
        return spec if spec.device == device else spec.model_copy(update={"device": device})

    z = z0.model_copy(update={
        "stage": choice.stage,
        "offload_optimizer": offload(z0.offload_optimizer, choice.offload_optimizer),
        "offload_param": offload(z0.offload_param, choice.offload_param),
        "zero_hpz_partition_size": choice.zero_hpz_partition_size,
        "zero_quantized_weights": choice.zero_quantized_weights,
        "zero_quantized_gradients": choice.zero_quantized_gradients,
        "overlap_comm": choice.overlap_comm,
        "reduce_bucket_size": choice.reduce_bucket_size or z0.reduce_bucket_size,
    })
    t = t0.model_copy(update={
        "checkpointing": choice.checkpointing, "micro_batch": choice.micro_batch, "grad_accum": choice.grad_accum,
    })
    c = scenario.cluster
    if c.sequence_parallel_size != choice.sequence_parallel_size:
        c = c.model_copy(update={"sequence_parallel_size": choice.sequence_parallel_size})
    if choice.autotp_size is not None and choice.autotp_size != c.tensor_parallel_size:
        c = c.model_copy(update={"tensor_parallel_size": choice.autotp_size})
    if validate:
        return Scenario.model_validate({**scenario.model_dump(), "zero": z.model_dump(), "training": t.model_dump(),
                                        "cluster": c.model_dump()})
    return scenario.model_copy(update={"zero": z, "training": t, "cluster": c})


def rank_candidates(values: dict[str, np.ndarray], cand: Candidates, tolerance: float = DEFAULT_TOLERANCE,
                    gpu_memory_bytes: float = 0.0, tp: np.ndarray | None = None) -> np.ndarray:
    """Indices of fitting candidates, best first, by the module's ranking policy (``tp``: each candidate's AutoTP
    degree, when the plan varied it)."""
    fits = np.flatnonzero(values["fits"])
    if fits.size == 0:
        return fits
    # a headroom below the model's measured error of the peak (costmodel/timeline.py memory_error_fraction) is not a
    # proven fit: such candidates come after every proven one, and among themselves the most headroom first
    proven = fits[~values["memory_risky"][fits]]
    if proven.size:
        fits = proven
    # parameter offload only when nothing fits without it: it moves every parameter over PCIe in every forward
    # and backward, and the model's overlap of that traffic is the least checked part of the step time
    no_param_offload = fits[cand.offload_param[fits] == 0]
    if no_param_offload.size:
        fits = no_param_offload
    tps = values["tokens_per_second"][fits]
    near = tps >= (1.0 - tolerance) * tps.max()
    offloads = (cand.offload_optimizer[fits] > 0).astype(int) + (cand.offload_param[fits] > 0).astype(int)
    stage3 = (cand.stage[fits] == 3).astype(int)
    zpp = ((cand.hpz[fits] > 1) | (cand.qwz[fits] > 0)).astype(int)
    headroom = gpu_memory_bytes - values["peak"][fits]
    # only risky candidates left: the most headroom first, before speed
    risky_headroom = -headroom if not proven.size else np.zeros(fits.size)
    degree = np.ones(fits.size, dtype=np.int64) if tp is None else tp[fits]
    # among equals the smaller Ulysses degree (fewer all-to-alls, a larger data-parallel batch), after offload, then
    # the smaller AutoTP degree
    sp = cand.sp[fits]
    # np.lexsort: last key is primary
    order = np.lexsort((-tps, -headroom, zpp, stage3, degree, sp, offloads, ~near, risky_headroom))
    return fits[order]


def _reasons(scenario: Scenario, best: Choice, est: Estimate, values, cand, ranked, tolerance, tp=None) -> list[str]:
    r: list[str] = []
    n = scenario.cluster.world_size // (best.autotp_size or scenario.cluster.tensor_parallel_size)
    margin = scenario.assumptions.gpu_memory_margin_fraction
    kept = f", {margin:.0%} kept free" if margin > 0 else ""
    r.append(f"{best.label} fits: {est.step_peak.verdict()}{kept}; "
             f"{est.tokens_per_second:,.0f} tokens/s predicted ({est.step_seconds:.2f} s per step).")
    fastest = ranked[np.argmax(values["tokens_per_second"][ranked])]
    if values["tokens_per_second"][fastest] > est.tokens_per_second * 1.01:
        fc = _choice_at(cand, int(fastest), tp)
        label = fc.label
        if label == best.label:  # it differs in a setting the label does not show (overlap_comm, bucket)
            label += " with " + ", ".join(f"{k} {getattr(fc, k)}" for k in Choice.model_fields
                                          if getattr(fc, k) != getattr(best, k))
        top = values["tokens_per_second"][fastest]
        r.append(f"The fastest fitting option, {label}, is {top / est.tokens_per_second - 1:.0%} faster; this choice "
                 f"is {1 - est.tokens_per_second / top:.1%} slower than it, within the {tolerance:.0%} model "
                 "tolerance, and simpler or safer.")
    fitting = np.flatnonzero(values["fits"])
    quickest = int(fitting[np.argmax(values["tokens_per_second"][fitting])])
    if values["memory_risky"][quickest] and not est.step_peak.risky \
            and values["tokens_per_second"][quickest] > est.tokens_per_second * 1.01:
        room = values["headroom"][quickest]
        r.append(f"{_choice_at(cand, quickest, tp).label} would be "
                 f"{values['tokens_per_second'][quickest] / est.tokens_per_second - 1:.0%} faster, but its step "
                 f"peaks at {gib(values['peak'][quickest]):.1f} GiB, leaving {gib(room):.1f} GiB "
                 f"({room / est.gpu_memory_bytes:.0%}): below the model's error of {est.step_peak.error_fraction:.1%} of the "
                 "peak, not a proven fit.")
    if n == 1:
        r.append("Data-parallel degree 1: no ZeRO stage saves memory here (DeepSpeed #4953), so the simplest "
                 "configuration is preferred.")
    no_offload = best.offload_optimizer == "none" and best.offload_param == "none"
    for st in range(best.stage if no_offload else 4):
        mask = (cand.stage == st) & (cand.offload_optimizer == 0) & (cand.offload_param == 0)
        if tp is not None:
            mask &= tp == (best.autotp_size or 1)
        if mask.any() and not values["fits_gpu"][mask].any():
            need = values["peak"][mask].min()
            r.append(f"ZeRO-{st} without offload does not fit: at least {gib(need):.1f} GiB per GPU.")
    if best.offload_optimizer != "none" or best.offload_param != "none":
        f = scenario.assumptions.host_buffer_factor
        r.append(f"With offload, host RAM per node {gib(est.per_node_cpu_bytes * f):.0f} GiB "
                 f"({gib(est.per_node_cpu_bytes):.0f} GiB of offloaded states and pinned buffers x {f} safety "
                 f"factor) of {gib(scenario.cluster.cpu_memory_bytes):.0f} GiB.")
    if best.stage == 3 and no_offload:
        share = est.communication.exposed_seconds_per_step / est.step_seconds if est.step_seconds else 0.0
        r.append("ZeRO-3 without offload: parameters, gradients and optimizer states are all sharded "
                 f"{n} ways; " + ("compute hides most of its 1.5x communication." if share < 0.15 else
                                  f"its 1.5x communication is not hidden ({share:.0%} of the step is exposed "
                                  "communication), but nothing else fits or runs faster."))
    if best.stage in (1, 2) and n > 1:
        r.append(f"ZeRO-{best.stage} shards optimizer states" + (" and gradients" if best.stage == 2 else "")
                 + " and keeps ZeRO-3's per-layer parameter gathers off the network: DeepSpeed 0.19.8 all-reduces "
                 "the gradients " + ("every micro-step" if best.stage == 2 or best.overlap_comm else "once per step")
                 + " and all-gathers the parameters once per step.")
    if best.reduce_bucket_size and best.reduce_bucket_size < scenario.zero.reduce_bucket_size:
        r.append(f"reduce_bucket_size lowered from {scenario.zero.reduce_bucket_size:,} to "
                 f"{best.reduce_bucket_size:,} elements: only {scenario.trainable_parameters:,} parameters train and "
                 "DeepSpeed allocates the whole bucket.")
    if best.zero_quantized_weights or best.zero_quantized_gradients:
        parts = [p for p, on in (("zero_quantized_weights (int8 weight all-gather)", best.zero_quantized_weights),
                                 ("zero_quantized_gradients (int4 gradient reduce-scatter)",
                                  best.zero_quantized_gradients)) if on]
        why = ("allowed by allow_lossy_communication" if scenario.training.allow_lossy_communication
               else "set in the scenario")
        r.append(f"Numerics: {' and '.join(parts)} ({why}) quantize communication, so the step is not bit-for-bit "
                 f"the full-precision one; {ZERO_PP_PAPER} reports pretraining loss matching the baseline with its "
                 "block-wise quantization, but compare your loss curve against a short unquantized run.")
    elif scenario.cluster.nodes > 1 and not any(quantized_zeropp_allowed(scenario)):
        r.append("ZeRO++ quantized weights (int8) and gradients (int4) were not considered: they change the numerics "
                 f"({ZERO_PP_PAPER}); allow them with --allow-lossy-communication (allow_lossy_communication).")
    comm_share = est.communication.exposed_seconds_per_step / est.step_seconds
    r.append(f"Exposed communication is {comm_share:.0%} of the step.")
    r.append(step_breakdown(est))
    return r


def _activation_parts_at(ctx, cand: Candidates, i: int, tp: np.ndarray | None = None) -> dict[str, float]:
    """Candidate ``i``'s activation bytes by group (:data:`~zeroplanner.costmodel.activations.ACTIVATION_GROUPS`),
    with the context of its AutoTP degree ``tp[i]`` when that is not ``ctx``'s (the AutoTP grids of
    :func:`_with_autotp`)."""
    from .costmodel.activations import activation_parts

    if tp is not None and int(tp[i]) != ctx.tp:
        sc = ctx.scenario
        ctx = make_context(sc.model_copy(update={"cluster": sc.cluster.model_copy(
            update={"tensor_parallel_size": int(tp[i])})}))
    return {k: float(v[0]) for k, v in activation_parts(ctx, cand.take(np.array([i]))).items()}


def _activation_text(parts: dict[str, float]) -> str:
    """``activations 154.5 GiB (layers 32.3, logits 94.0, ...)``: :func:`_activation_parts_at`'s bytes, GiB."""
    inner = ", ".join(f"{k} {gib(v):.1f}" for k, v in parts.items() if v > 0)
    return f"activations {gib(sum(parts.values())):.1f} GiB ({inner})"


def _sp_reasons(scenario: Scenario, best: Choice, est: Estimate, values, cand: Candidates, ctx,
                searched: bool) -> list[str]:
    """Why the plan's Ulysses degree: what smaller degrees lacked (memory, with the activations, or speed) and
    what the split costs (tokens per GPU, all-to-all time, ZeRO and batch degrees)."""
    p = best.sequence_parallel_size
    r: list[str] = []
    if searched and p > 1:
        for v in sorted({int(x) for x in np.unique(cand.sp)} - {p}):
            if v > p:
                continue
            mask = cand.sp == v
            fit = mask & values["fits"]
            if not fit.any():
                i = int(np.flatnonzero(mask)[np.argmin(values["peak"][mask])])
                r.append(f"Sequence parallelism {p} is needed: with sequence_parallel_size={v} nothing fits; the "
                         f"candidate needing the least GPU memory ({_choice_at(cand, i).label}) needs "
                         f"{gib(values['peak'][i]):.1f} GiB per GPU, of it "
                         f"{_activation_text(_activation_parts_at(ctx, cand, i))}: "
                         "no ZeRO stage shards activations, splitting the sequence does.")
            else:
                plain = fit & (cand.offload_optimizer == 0) & (cand.offload_param == 0)
                pick_plain = best.offload_optimizer == "none" and best.offload_param == "none"
                if pick_plain and not plain.any():
                    tps = float(values["tokens_per_second"][fit].max())
                    r.append(f"With sequence_parallel_size={v} only candidates with offload fit (the fastest "
                             f"{tps:,.0f} tokens/s, against the pick's {est.tokens_per_second:,.0f}); offload is a "
                             "last resort (PCIe/host-bound), so the larger degree without it is picked.")
                else:
                    tps = float(values["tokens_per_second"][plain if pick_plain else fit].max())
                    rel = tps / est.tokens_per_second - 1.0
                    r.append(f"With sequence_parallel_size={v} the fastest fitting candidate"
                             f"{' without offload' if pick_plain else ''} is predicted {tps:,.0f} tokens/s, "
                             f"{abs(rel):.0%} {'slower' if rel < 0 else 'faster'} than the pick "
                             f"({est.tokens_per_second:,.0f} with {p}).")
    if p > 1:
        c = scenario.cluster
        s = scenario.sequence_tokens
        link = "NVLink inside the node" if p <= c.gpus_per_node else f"{c.network.name} between nodes"
        share = est.sp_all_to_all_seconds_per_step / est.step_seconds if est.step_seconds else 0.0
        r.append(f"Ulysses sequence parallelism over {p} GPUs (sequence_parallel_size={p}): each GPU holds "
                 f"{s // p:,} of the {s:,} tokens of a sample outside attention and {scenario.model.n_heads // p} of "
                 f"{scenario.model.n_heads} heads inside it; the two all-to-alls per attention layer (forward and "
                 f"backward) run over {link}, {est.sp_all_to_all_seconds_per_step:.2f} s of the "
                 f"{est.step_seconds:.2f} s step ({share:.0%}, exposed); ZeRO shards over all "
                 f"{c.world_size // c.tensor_parallel_size} GPUs, the batch's data-parallel degree is "
                 f"{c.world_size // c.tensor_parallel_size // p}.")
    elif searched:
        r.append(f"Sequence parallelism searched ({', '.join(str(v) for v in sorted(set(cand.sp.tolist())))}): "
                 "sequence_parallel_size=1 fits and is within the tolerance of the fastest, so no split.")
    return r


def _held_text(scenario: Scenario, held: frozenset[str]) -> str:
    """``stage=2, checkpointing=full``: the held inputs with the scenario's values, in table order."""
    return ", ".join(f"{k}={_held_value(scenario, k)}" for k in SEARCH_INPUTS if k in held)


def _search_reason(scenario: Scenario, held: frozenset[str], cand: Candidates, tp: np.ndarray | None = None) -> str:
    """The reason line saying which search axes the plan varied and which options it held (and at what)."""
    varied = varied_axes(cand, tp)
    said = f"Varied: {', '.join(varied) if varied else 'nothing'} ({cand.stage.size} candidates)"
    if not held:
        return said + "; no option held."
    return f"Held as given: {_held_text(scenario, held)}. {said}."


def _held_value(scenario: Scenario, key: str):
    z, t = scenario.zero, scenario.training
    return {"offload_optimizer": z.offload_optimizer.device, "offload_param": z.offload_param.device,
            "checkpointing": t.checkpointing, "micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
            "sequence_parallel_size": scenario.cluster.sequence_parallel_size,
            "autotp_size": scenario.cluster.tensor_parallel_size}.get(key, getattr(z, key, None))


AUTOTP_DEGREES = (2, 4, 8)
"""AutoTP degrees the planner tries (powers of two up to one 8-GPU node: DeepSpeed's AutoTP training tutorial and
the LLaMA-Factory / ms-swift presets use 2-8; more than a node is never tried, see :func:`autotp_degrees`)."""


def autotp_degrees(scenario: Scenario, held, values, cand: Candidates) -> tuple[int, ...]:
    """The AutoTP degrees to add to the search, by the rule of the module docstring: one node, ``autotp_size`` not
    held, the scenario at tp 1, a full fine-tune (AutoTP with LoRA adapters is not priced), and no tp-1 candidate
    at ZeRO stage 0-2 that fits without offload with a headroom of at least the model's error of the peak
    (a fit below it is not proven; costmodel/timeline.py memory_error_fraction) (AutoTP shards the 16-bit weights and gradients that ZeRO-1/2 keep
    whole; next to ZeRO-3, which shards them over the same GPUs, it changes little memory). Each degree divides
    the GPUs per node, the attention and KV heads (uneven head splits are priced, but even ones do not waste the
    largest rank's memory) and, with Ulysses, world / sp."""
    c, m, t = scenario.cluster, scenario.model, scenario.training
    if (c.nodes != 1 or "autotp_size" in held or c.tensor_parallel_size != 1 or t.lora_rank or t.qlora
            or (values["fits"] & ~values["memory_risky"] & (cand.stage < 3) & (cand.offload_optimizer == 0)).any()):
        return ()
    world = c.world_size // c.sequence_parallel_size
    return tuple(d for d in AUTOTP_DEGREES
                 if c.gpus_per_node % d == 0 and m.kv_heads % d == 0 and m.n_heads % d == 0 and world % d == 0)


def _with_autotp(scenario: Scenario, held, cand: Candidates, values, tp: np.ndarray, degrees):
    """The candidate grid, its values and AutoTP column with one more grid per degree appended (each evaluated with
    its own context: the shards, the data-parallel degree and AutoTP's all-reduces change)."""
    cands, vals, tps = [cand], [values], [tp]
    for d in degrees:
        sd = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"tensor_parallel_size": d})})
        cd = candidate_grid(sd, held)
        cands.append(cd)
        vals.append(evaluate(make_context(sd), cd))
        tps.append(np.full(cd.shape, d, dtype=np.int64))
    n = cand.stage.size

    def joined(k):  # per-candidate arrays are joined; entries that are not per candidate (scalars) are shared
        a = values[k]
        return np.concatenate([np.reshape(v[k], -1) for v in vals]) if np.ndim(a) and np.size(a) == n else a

    return Candidates.concat(*cands), {k: joined(k) for k in values}, np.concatenate(tps)


def _autotp_reasons(scenario: Scenario, best: Choice, best_i: int, values, cand, tp, degrees) -> list[str]:
    """Why AutoTP was tried and was or was not picked (figures of the evaluated candidates)."""
    if not degrees:
        return []
    plain = (tp == 1) & (cand.stage < 3) & (cand.offload_optimizer == 0)
    need = gib(values["peak"][plain].min()) if plain.any() else float("nan")
    tried = ", ".join(str(d) for d in degrees)
    head = (f"AutoTP degrees {tried} were tried because at tensor-parallel degree 1 no ZeRO-0/1/2 configuration "
            f"fits without offload with the model's {memory_error_fraction(scenario.assumptions.device):.0%} error of headroom (the step peaks at "
            f"{need:.1f} GiB per GPU or more); AutoTP stays inside the node (its per-layer "
            "all-reduces across nodes would run at NIC speed, so the planner never spreads it over nodes).")
    d = best.autotp_size or 1
    if d == 1:
        return [head + " The pick, at degree 1, is faster or simpler than every fitting AutoTP candidate."]
    n = scenario.cluster.world_size // d
    counts = autotp_collectives_per_micro_step(scenario.model, best.checkpointing)
    same = (tp == 1) & (cand.stage == best.stage) & (cand.checkpointing == cand.checkpointing[best_i]) & \
        (cand.offload_optimizer == cand.offload_optimizer[best_i]) & (cand.offload_param == cand.offload_param[best_i])
    versus = ""
    if same.any():
        j = int(np.flatnonzero(same)[np.argmin(values["peak"][same])])
        versus = (f" (the same configuration at degree 1 needs {gib(values['peak'][j]):.1f} GiB per GPU, "
                  f"activations {gib(values['activations'][j]):.1f} GiB; here {gib(values['peak'][best_i]):.1f} and "
                  f"{gib(values['activations'][best_i]):.1f} GiB)")
    step = values["step_seconds"][best_i]
    why = (f"AutoTP {d} (tensor_parallel.autotp_size {d}) splits each layer's linear weights, their gradients, "
           f"optimizer states and activations {d} ways inside the node and ZeRO-{best.stage} shards the rest over "
           f"world / {d} = {n} data-parallel ranks, so this configuration fits{versus}; the price is "
           f"{counts['forward']} all-reduces of one activation per micro-step in forward and "
           f"{counts['backward'] + counts['recompute']} in backward over the node's link, not overlapped: "
           f"{values['autotp_seconds'][best_i]:.3f} s of the {step:.3f} s step.")
    return [head, why]


def plan(scenario: Scenario, *, tolerance: float = DEFAULT_TOLERANCE, alternatives: int = 5, held=(),
         advice: bool = True, given=None) -> Plan:
    """Evaluate every candidate for ``scenario`` and recommend one.

    ``held``: input keys of :data:`SEARCH_INPUTS` whose axis is fixed at the scenario's value (the CLI passes the
    options the user gave: ``--stage 2`` searches ZeRO-2 only); the reasons say what was held and what varied.
    ``advice``: also price fewer nodes and cheaper methods (:mod:`zeroplanner.advice`; each re-plans a changed
    scenario, with advice off); ``given``: the input keys the user set, for :attr:`Plan.assumptions` (None: values
    equal to the defaults count as not given).
    Returns a Plan; when nothing fits, ``fits`` is False, ``choice`` is None and ``estimate`` is the scenario as
    given, with warnings saying what is short. Alternatives: per ZeRO stage, offload, ZeRO++ and AutoTP degree
    the fastest candidate the ranking keeps (micro-batch, checkpointing and overlap searched), at most
    ``alternatives`` of them. Raises ValueError for tolerance outside [0, 1), a held key the planner does not vary,
    or held values that leave no valid candidate.
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance} must be in [0, 1)")
    precision_note = []
    if hardware_precision(scenario) != scenario.training.precision:
        g = scenario.cluster.gpu
        scenario = scenario.model_copy(update={
            "training": scenario.training.model_copy(update={"precision": hardware_precision(scenario)})})
        precision_note.append(
            f"Precision: {g.name} has no bf16 (bf16 tensor cores need Ampere, sm_80, or newer), so this plan is "
            f"priced and configured as fp16 with dynamic loss scaling (DeepSpeed fp16 block, loss_scale 0) at the "
            f"GPU's fp16 peak of {g.peak_fp16_tflops:g} TFLOP/s; memory is the same (2 bytes per value).")
    held = _check_held(held)
    ctx = make_context(scenario)
    cand = candidate_grid(scenario, held)
    if cand.stage.size == 0:
        raise ValueError(f"held {sorted(held)}: no candidate configuration has these values together")
    held_values = {k: _held_value(scenario, k) for k in SEARCH_INPUTS if k in held}
    # Ulysses as a search axis: for long sequences from the start (SP_MIN_SEQUENCE_TOKENS), else only when nothing
    # fits without it, which the first evaluation tells
    long = scenario.sequence_tokens >= SP_MIN_SEQUENCE_TOKENS
    sp_options = sequence_parallel_options(scenario, held) if long else [1]
    if len(sp_options) > 1:
        cand = candidate_grid(scenario, held, sp_options)
    vlabels, vcand = _variant_candidates(scenario, np.array([scenario.cluster.nodes]))
    values, vvalues = _split_values(evaluate(ctx, Candidates.concat(cand, vcand)), cand.shape, vcand.shape)
    if not long and not values["fits"].any():
        sp_options = sequence_parallel_options(scenario, held)
        if len(sp_options) > 1:
            cand = candidate_grid(scenario, held, sp_options)
            values = evaluate(ctx, cand)
    sp_searched = len(sp_options) > 1
    tp = np.full(cand.shape, scenario.cluster.tensor_parallel_size, dtype=np.int64)
    # AutoTP is not searched together with Ulysses (their combination is not priced against the engine)
    degrees = () if sp_searched else autotp_degrees(scenario, held, values, cand)
    if degrees:
        cand, values, tp = _with_autotp(scenario, held, cand, values, tp, degrees)
    ranked = rank_candidates(values, cand, tolerance, ctx.gpu_memory_bytes, tp)
    variants = _variant_options_from(scenario, vvalues)
    if ranked.size == 0:
        est = estimate(scenario)
        smallest = int(np.argmin(values["peak"]))
        t = scenario.training
        remedies = ["add GPUs or nodes", "shorten the sequence", "use a GPU with more memory"]
        methods = []
        if advice:
            from .advice import method_advice

            methods = method_advice(scenario, None, held, tolerance)
        for m in reversed(methods):
            remedies.insert(2, (
                "set bnb_4bit_quant_storage to the training dtype so ZeRO-3 shards the 4-bit base"
                if m.method == "qlora_storage" else "change the method") + f" ({m.flags} fits at "
                f"{m.tokens_per_second:,.0f} tokens/s: see the advice)")
        priced = " (priced: it does not fit either)" if advice else ""
        if not methods:  # else each priced method is a remedy above
            if not t.lora_rank:
                remedies.insert(2, f"use LoRA/QLoRA, a change of method{priced}")
            elif not t.qlora:
                remedies.insert(2, f"use QLoRA (4-bit base weights), a change of method{priced}")
            elif t.bnb_4bit_quant_storage == "uint8":
                remedies.insert(2, "set bnb_4bit_quant_storage to the training dtype so ZeRO-3 shards the 4-bit "
                                "base" + priced)
        if scenario.cluster.cpu_memory_bytes < 4 * 2**40:
            remedies.append("add host RAM for offload")
        if "sequence_parallel_size" in held:
            free_sp = sequence_parallel_options(scenario)
            if len(free_sp) > 1:
                c2 = candidate_grid(scenario, held - {"sequence_parallel_size"}, free_sp)
                v2 = evaluate(ctx, c2)
                ok = np.flatnonzero(v2["fits"])
                if ok.size:
                    j = int(ok[np.argmin(c2.sp[ok])])
                    remedies.insert(0, f"split the sequence with Ulysses sequence parallelism "
                                       f"(--sequence-parallel-size {int(c2.sp[j])} fits: "
                                       f"{gib(v2['peak'][j]):.1f} GiB per GPU at the step's peak)")
        act = _activation_parts_at(ctx, cand, smallest, tp)
        if not t.tiled_loss and act["logits"] > 0.25 * values["peak"][smallest]:
            remedies.insert(0, f"compute the loss in chunks (--tiled-loss: the logits and their fp32 log-softmax "
                               f"are {gib(act['logits']):.1f} GiB)")
        within = f" with the options held ({_held_text(scenario, held)})" if held else ""
        warn = [f"Nothing fits{within}. The candidate needing the least GPU memory "
                f"({_choice_at(cand, smallest, tp).label}) "
                f"peaks at {gib(values['peak'][smallest]):.1f} GiB per GPU of "
                f"{gib(ctx.gpu_memory_bytes * (1 - scenario.assumptions.gpu_memory_margin_fraction)):.1f} GiB usable "
                f"and {gib(values['host_per_node'][smallest]):.0f} GiB host RAM per node (x"
                f"{scenario.assumptions.host_buffer_factor:g} buffer factor: "
                f"{gib(values['host_per_node'][smallest] * scenario.assumptions.host_buffer_factor):.0f} GiB needed of "
                f"{gib(scenario.cluster.cpu_memory_bytes):.0f}); of it "
                f"{_activation_text(act)}. Options: "
                + ", ".join(remedies) + "."]
        warn += [f"As configured (ZeRO-{scenario.zero.stage}): {w_}" for w_ in est.warnings] + precision_note
        from .advice import verdict_assumptions

        return Plan(fits=False, choice=None, scenario=scenario, estimate=est, reasons=[], warnings=warn,
                    alternatives=[], variants=variants, candidates_evaluated=int(cand.stage.size),
                    held=held_values, varied=varied_axes(cand, tp), method_advice=methods,
                    assumptions=verdict_assumptions(scenario, None, given))
    best_i = int(ranked[0])
    best = _choice_at(cand, best_i, tp)
    chosen = apply_choice(scenario, best, validate=False)
    est = estimate_from_values(chosen, values, best_i)
    alts: list[Option] = []
    keys = np.stack([cand.stage, cand.offload_optimizer, cand.offload_param, cand.hpz, tp], axis=1)
    # each (stage, offload, ZeRO++, AutoTP) group is represented by its fastest candidate the ranking keeps, listed
    # in the order the ranking first meets the group
    fastest: dict[tuple, int] = {}
    for i in ranked:
        key = tuple(keys[i])
        if key not in fastest or values["tokens_per_second"][i] > values["tokens_per_second"][fastest[key]]:
            fastest[key] = int(i)
    del fastest[tuple(keys[best_i])]  # the pick's own group
    for i in fastest.values():
        ch = _choice_at(cand, i, tp)
        sc = apply_choice(scenario, ch, validate=False)
        alt_est = estimate_from_values(sc, values, int(i))
        alts.append(Option(label=ch.label, choice=ch, scenario=sc, estimate=alt_est,
                           why_not=_why_not(best, est, ch, alt_est, tolerance, False)))
        if len(alts) >= alternatives:
            break
    reasons = (precision_note + _reasons(scenario, best, est, values, cand, ranked, tolerance, tp)
               + _sp_reasons(scenario, best, est, values, cand, ctx, sp_searched)
               + _autotp_reasons(scenario, best, best_i, values, cand, tp, degrees)
               + [_search_reason(scenario, held, cand, tp)])
    for a in alts:
        if a.why_not:
            reasons.append(f"Alternative {_short(a.choice)}: {a.why_not}")
    po = np.flatnonzero(values["fits"] & (cand.offload_param > 0))
    if po.size:
        j = int(po[np.argmax(values["tokens_per_second"][po])])
        if values["tokens_per_second"][j] > est.tokens_per_second * 1.01:
            pc = _choice_at(cand, j, tp)
            reasons.append(f"{_short(pc)} is predicted "
                           f"{values['tokens_per_second'][j] / est.tokens_per_second - 1:.0%} faster but offloads the "
                           "parameters (every forward and backward fetches them over PCIe), which the planner uses "
                           "only when nothing fits without it.")
    warnings = _priced_fixes(list(est.warnings), values, cand, est.tokens_per_second)
    if scenario.training.qlora and np.any(values["fits"] & (cand.stage < 3)):
        # not when only ZeRO-3 fits (a base sharded with bnb_4bit_quant_storage = the training dtype)
        warnings.append("QLoRA: ZeRO-1 or 2 is enough; ZeRO-3 adds per-layer parameter all-gathers of the 4-bit "
                        "base for little memory gain (the base is frozen: no gradients or optimizer states to shard).")
    from .advice import cluster_advice, method_advice, verdict_assumptions

    out = Plan(
        fits=True, choice=best, scenario=chosen, estimate=est,
        reasons=reasons,
        warnings=warnings, alternatives=alts, variants=variants, candidates_evaluated=int(cand.stage.size),
        held=held_values, varied=varied_axes(cand, tp), assumptions=verdict_assumptions(scenario, best, given),
    )
    if not advice:
        return out
    return out.model_copy(update={"cluster_advice": cluster_advice(scenario, out, held, tolerance),
                                  "method_advice": method_advice(scenario, out, held, tolerance)})


_IF_IT_FITS = re.compile(r"(?i)(ZeRO-([0-3]) (?:if|where) it fits)(?: \(([^)]*)\))?")


def _priced_fixes(warnings: list[str], values, cand: Candidates, pick_tps: float) -> list[str]:
    """The estimate's warnings with every "ZeRO-N if it fits" fix followed by what the planner priced for it (the
    fastest fitting ZeRO-N candidate, or that none fits), so a warning never sends the user to try a stage the
    plan already rejected without saying so."""
    def priced(m: re.Match) -> str:
        st = int(m.group(2))
        ok = np.flatnonzero(values["fits"] & (cand.stage == st))
        why = f"{m.group(3)}; " if m.group(3) else ""
        if not ok.size:
            return f"{m.group(1)} ({why}priced here: no ZeRO-{st} candidate fits)"
        tps = float(values["tokens_per_second"][ok].max())
        than = "slower than" if tps < pick_tps else "faster than"
        return f"{m.group(1)} ({why}priced here: at best {tps:,.0f} tokens/s, {than} the pick)"

    return [_IF_IT_FITS.sub(priced, w) for w in warnings]


def nearest_fit(scenario: Scenario, *, tolerance: float = DEFAULT_TOLERANCE) -> Option | None:
    """The fitting candidate closest to ``scenario``'s own configuration: fewest search axes
    (:data:`SEARCH_INPUTS`) changed from the scenario's values, ties broken by the planner's ranking (then
    tokens/s). None when no candidate fits. Its ``why_not`` lists the changes (``stage 2 -> 3``).
    Raises ValueError for tolerance outside [0, 1)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance} must be in [0, 1)")
    ctx = make_context(scenario)
    cand = candidate_grid(scenario)
    values = evaluate(ctx, cand)
    fits = np.flatnonzero(values["fits"])
    if fits.size == 0:
        return None
    ranked = rank_candidates(values, cand, tolerance, ctx.gpu_memory_bytes)
    rest = np.setdiff1d(fits, ranked)
    order = np.concatenate([ranked, rest[np.argsort(-values["tokens_per_second"][rest], kind="stable")]])
    own = _axis_values(Candidates.from_scenario(scenario))
    axes = _axis_values(cand)
    if scenario.zero.overlap_comm is None:  # DeepSpeed's default: any candidate's overlap_comm is no change
        del axes["overlap_comm"]
    changed = sum((axes[a][order] != own[a].reshape(-1)[0]).astype(int) for a in axes)
    i = int(order[np.argsort(changed, kind="stable")[0]])
    ch = _choice_at(cand, i)
    sc = apply_choice(scenario, ch, validate=False)
    return Option(label=ch.label, choice=ch, scenario=sc, estimate=estimate_from_values(sc, values, i),
                  why_not="; ".join(choice_changes(scenario, ch)))


def choice_changes(scenario: Scenario, choice: Choice) -> list[str]:
    """The settings ``choice`` changes from ``scenario``'s own configuration, one ``"stage 2 -> 3"`` per
    :class:`Choice` field that differs (``overlap_comm`` left to DeepSpeed's default is no change)."""
    z = scenario.zero
    now = Choice(stage=z.stage, offload_optimizer=z.offload_optimizer.device, offload_param=z.offload_param.device,
                 checkpointing=scenario.training.checkpointing, micro_batch=scenario.training.micro_batch,
                 grad_accum=scenario.training.grad_accum, overlap_comm=z.overlap_comm,
                 reduce_bucket_size=z.reduce_bucket_size, zero_hpz_partition_size=z.zero_hpz_partition_size,
                 zero_quantized_weights=z.zero_quantized_weights, zero_quantized_gradients=z.zero_quantized_gradients,
                 sequence_parallel_size=scenario.cluster.sequence_parallel_size)
    return [f"{k} {getattr(now, k)} -> {getattr(choice, k)}" for k in Choice.model_fields
            if getattr(now, k) != getattr(choice, k) and not (k == "overlap_comm" and now.overlap_comm is None)]


def _split_values(values: dict[str, np.ndarray], *shapes: tuple[int, ...]) -> list[dict[str, np.ndarray]]:
    """Cut the :func:`evaluate` result of ``Candidates.concat`` of candidate sets back into one result per set
    (shapes in concatenation order); entries that are not per candidate (scalars) are shared."""
    total = sum(int(np.prod(sh)) for sh in shapes)
    out, start = [], 0
    for sh in shapes:
        n = int(np.prod(sh))
        out.append({k: (a.reshape(-1)[start:start + n].reshape(sh) if np.size(a) == total and np.ndim(a) else a)
                    for k, a in values.items()})
        start += n
    return out


def variant_options(scenario: Scenario, ctx=None) -> list[Option]:
    """The chart variants (:data:`VARIANTS`) evaluated with the scenario's other settings, in one vectorised call."""
    ctx = ctx or make_context(scenario)
    labels, cand = _variant_candidates(scenario, np.array([scenario.cluster.nodes]))
    return _variant_options_from(scenario, evaluate(ctx, cand))


def _variant_options_from(scenario: Scenario, values: dict[str, np.ndarray]) -> list[Option]:
    """:func:`variant_options` from the variants' :func:`evaluate` values (shape ``(len(VARIANTS), 1)``)."""
    t = scenario.training
    out = []
    for i, (label, stage, oo, op) in enumerate(VARIANTS):
        ch = Choice(stage=stage, offload_optimizer=_OFFLOAD_NAMES[oo], offload_param=_OFFLOAD_NAMES[op],
                    checkpointing=t.checkpointing, micro_batch=t.micro_batch, grad_accum=t.grad_accum,
                    overlap_comm=scenario.zero.overlap_comm, reduce_bucket_size=scenario.zero.reduce_bucket_size,
                    sequence_parallel_size=scenario.cluster.sequence_parallel_size)
        sc = apply_choice(scenario, ch, validate=False)
        out.append(Option(label=label, choice=ch, scenario=sc, estimate=estimate_from_values(sc, values, (i, 0))))
    return out


def _variant_candidates(scenario: Scenario, nodes: np.ndarray) -> tuple[list[str], Candidates]:
    t = scenario.training
    labels = [v[0] for v in VARIANTS]
    st = np.array([v[1] for v in VARIANTS])[:, None]
    oo = np.array([v[2] for v in VARIANTS])[:, None]
    op = np.array([v[3] for v in VARIANTS])[:, None]
    cand = Candidates.build(
        stage=st, offload_optimizer=oo, offload_param=op, checkpointing=CHECKPOINT_CODES[t.checkpointing],
        micro_batch=t.micro_batch, grad_accum=t.grad_accum, nodes=nodes[None, :], hpz=1, qwz=0, qgz=0,
        overlap=-1 if scenario.zero.overlap_comm is None else int(scenario.zero.overlap_comm),
        reduce_bucket=scenario.zero.reduce_bucket_size, sp=scenario.cluster.sequence_parallel_size,
    )
    return labels, cand


def scaling(scenario: Scenario, nodes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, dict[str, list]]:
    """Tokens/s and fit per variant against node count (per-GPU batch fixed).

    Returns {label: {"nodes": [...], "tokens_per_second": [...], "fits": [...]}}. Raises ValueError for node
    counts < 1.
    """
    nodes_arr = np.asarray(list(nodes), dtype=np.int64)
    if nodes_arr.size == 0 or nodes_arr.min() < 1:
        raise ValueError(f"nodes must be >= 1 (got {list(nodes)})")
    labels, cand = _variant_candidates(scenario, nodes_arr)
    values = evaluate(make_context(scenario), cand)
    return {
        label: {"nodes": nodes_arr.tolist(), "tokens_per_second": values["tokens_per_second"][i].tolist(),
                "fits": values["fits"][i].tolist()}
        for i, label in enumerate(labels)
    }


def largest_model(scenario: Scenario, *, low: float = 1e8, high: float = 1e13, points: int = 81) -> dict[str, int]:
    """Largest parameter count each variant can train on the scenario's cluster (0 if none on the grid).

    Models are Llama-shaped (:meth:`Architecture.from_parameter_count`) on a log grid between ``low`` and
    ``high``, with the scenario's training settings (its Ulysses degree too: shapes whose heads it does not split
    are skipped); the answer is the largest grid point that fits (grid spacing 10**(log10(high/low)/(points-1)),
    15% for the defaults). :func:`largest_model_limits` also says what stops each variant there.
    """
    return {label: r["parameters"] for label, r in largest_model_limits(scenario, low=low, high=high,
                                                                        points=points).items()}


LIMIT_NAMES = {"fits_gpu": "GPU memory", "fits_cpu": "host RAM", "fits_nvme": "NVMe"}
"""The resources a candidate must fit in (the cost model's ``evaluate``: ``fits = fits_gpu & fits_cpu & fits_nvme``),
by the names :func:`largest_model_limits` gives them."""
GRID_TOP = "the search's top"
""":func:`largest_model_limits`' ``limited_by`` for a variant that fits even the largest model searched."""


def largest_limit_text(limit: dict) -> str:
    """What stops one variant of the largest-model table from training the next size searched (one value of :func:`largest_model_limits`):
    the resources the next size searched does not fit in, and that size ("host RAM at 154.0 B")."""
    names = tuple(limit.get("limited_by") or ())
    if names == (GRID_TOP,) or not names:
        return "nothing up to the largest size searched"
    return f"{' and '.join(names)} at {limit['next_parameters'] / 1e9:,.1f} B"


def largest_model_limits(scenario: Scenario, *, low: float = 1e8, high: float = 1e13,
                         points: int = 81) -> dict[str, dict[str, Any]]:
    """:func:`largest_model` with what limits each variant: {label: {"parameters": the largest grid point that
    fits (0 if none), "next_parameters": the next size searched above it (0 if none), "limited_by": the resources
    that size does not fit in, a tuple of :data:`LIMIT_NAMES` values ("GPU memory", "host RAM", "NVMe"), or
    (:data:`GRID_TOP`,) when the largest size searched fits}}. Same grid and shapes as :func:`largest_model`; the
    limit is read from the cost model's ``fits_gpu`` / ``fits_cpu`` / ``fits_nvme`` at ``next_parameters``.

    Offloading moves memory from the GPU to host RAM or NVMe, so an offload variant can stop at a *smaller* model
    than one that offloads less: its limit is then host RAM (or NVMe), not GPU memory.
    """
    grid = np.geomspace(low, high, points)
    labels = [v[0] for v in VARIANTS]
    best = dict.fromkeys(labels, 0)
    # per label: (size, {resource: fits}) of every size evaluated, in grid order
    seen: dict[str, list[tuple[int, dict[str, bool]]]] = {label: [] for label in labels}
    from .costmodel.ulysses import check_ulysses

    sp = scenario.cluster.sequence_parallel_size
    for p in grid:
        arch = Architecture.from_parameter_count(int(p))
        try:
            check_ulysses(n_heads=arch.n_heads, kv_heads=arch.kv_heads, sp_size=sp, linear_mixer=arch.linear_mixer)
        except ValueError:
            continue  # the scenario's Ulysses degree does not split this shape's heads
        sc = scenario.model_copy(update={"model": arch})
        _, cand = _variant_candidates(sc, np.array([sc.cluster.nodes]))
        values = evaluate(make_context(sc), cand)
        for i, label in enumerate(labels):
            seen[label].append((int(p), {k: bool(values[k][i, 0]) for k in LIMIT_NAMES}))
            if values["fits"][i, 0]:
                best[label] = int(p)
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        above = [(size, ok) for size, ok in seen[label] if size > best[label]]
        if not above:
            out[label] = {"parameters": best[label], "next_parameters": 0, "limited_by": (GRID_TOP,)}
            continue
        size, ok = above[0]
        out[label] = {"parameters": best[label], "next_parameters": size,
                      "limited_by": tuple(name for key, name in LIMIT_NAMES.items() if not ok[key])}
    return out


LONGEST_SEQUENCE_QUANTUM = 1024
"""Sequence lengths :func:`longest_sequence` tries are multiples of this (and of every Ulysses degree tried)."""


def longest_sequence(scenario: Scenario, *, sp_values: Sequence[int] | None = None, high: int = 2**26,
                     precision: float = 1 / 64) -> dict[str, dict[str, int]]:
    """The longest sequence each variant (:data:`VARIANTS`) can train on the scenario's cluster and model, with the
    scenario's other training settings (micro-batch, checkpointing, tiled MLP / loss, checkpoint offload).

    ``sp_values``: the Ulysses degrees tried (default :func:`sequence_parallel_options` over the whole world, not
    only one node, heads rules applied; the scenario's own degree alone when that is 1 option). Every variant is
    evaluated at every degree on sequence lengths that are multiples of q = lcm(1024, degrees): powers of two
    times q up to ``high`` tokens, then bisection between the last that fits and the next, to within
    ``precision`` (relative) of the longest fitting multiple of q (memory and host RAM only grow with the
    sequence, so the fit is monotone). Returns {label: {"seq_len": tokens (0 when even q does not fit),
    "sequence_parallel_size": the smallest degree that fits it (0 when none)}}. Raises ValueError for an empty
    ``sp_values`` or a degree that does not divide the world size.
    """
    c = scenario.cluster
    sps = sorted(set(sp_values)) if sp_values is not None else sequence_parallel_options(scenario, within_node=False)
    if not sps or any(p < 1 or c.world_size % (c.tensor_parallel_size * p) for p in sps):
        raise ValueError(f"sp_values={list(sps)}: each must divide the world size {c.world_size} (x tensor_parallel_"
                         f"size {c.tensor_parallel_size}) and at least one is needed")
    q = math.lcm(LONGEST_SEQUENCE_QUANTUM, *sps)
    labels, base = _variant_candidates(scenario, np.array([c.nodes]))
    n_var = len(labels)
    cand = Candidates.build(**{f: np.repeat(getattr(base, f).reshape(n_var, 1), len(sps), axis=1)
                               for f in base.__dataclass_fields__ if f != "sp"},
                            sp=np.asarray(sps, dtype=np.int64)[None, :])
    image_tokens = scenario.sequence_tokens - scenario.training.seq_len

    def fits_at(seq: int, rows=slice(None)) -> np.ndarray:
        """(variants, degrees) bool: what fits at ``seq`` tokens (only ``rows`` evaluated)."""
        sc = scenario.model_copy(update={"training": scenario.training.model_copy(update={"seq_len": int(seq)})})
        if image_tokens and (seq + image_tokens) % q:  # the split needs every token count to divide evenly
            return np.zeros((n_var, len(sps)), dtype=bool)[rows]
        return evaluate(make_context(sc), cand.take(rows))["fits"]

    last = np.zeros(n_var, dtype=np.int64)  # longest multiple of q known to fit, per variant
    k = q
    while k <= high:
        ok = fits_at(k).any(axis=1)
        if not ok.any():
            break
        last[ok & (last == k // 2)] = k
        last[ok & (k == q)] = k
        k *= 2
    out: dict[str, dict[str, int]] = {}
    for i, label in enumerate(labels):
        lo = int(last[i])
        if lo == 0:
            out[label] = {"seq_len": 0, "sequence_parallel_size": 0}
            continue
        hi = min(2 * lo, (high // q + 1) * q)
        while hi - lo > max(q, int(lo * precision)):
            mid = (lo + hi) // 2 // q * q
            if mid <= lo:
                break
            if fits_at(mid, rows=slice(i, i + 1)).any():
                lo = mid
            else:
                hi = mid
        row = fits_at(lo, rows=slice(i, i + 1))[0]
        out[label] = {"seq_len": lo, "sequence_parallel_size": int(np.asarray(sps)[row][0])}
    return out


def sweep(scenario: Scenario, **axes: Sequence[int]) -> dict[str, np.ndarray]:
    """Evaluate the cartesian product of candidate axes (Candidates field names -> values); unspecified axes take
    the scenario's value. Returns the raw arrays of :func:`zeroplanner.costmodel.evaluate` (flattened) plus the
    axes. Raises TypeError for unknown axis names."""
    base = Candidates.from_scenario(scenario)
    names = list(axes)
    unknown = set(names) - set(base.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown sweep axes {sorted(unknown)}")
    grids = np.meshgrid(*[np.asarray(axes[n]) for n in names], indexing="ij")
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    for n, g in zip(names, grids):
        fields[n] = g.reshape(-1)
    cand = Candidates.build(**fields)
    out = evaluate(make_context(scenario), cand)
    out.update({f"axis_{n}": fields[n] for n in names})
    return out


__all__ = ["Choice", "Option", "Plan", "plan", "varied_axes", "SEARCH_INPUTS", "nearest_fit", "step_breakdown", "scaling", "largest_model", "largest_model_limits", "largest_limit_text", "sweep", "candidate_grid",
           "longest_sequence", "sequence_parallel_options",
           "apply_choice", "VARIANTS", "zeropp_parts"]
