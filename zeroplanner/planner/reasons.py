"""Every sentence the planner writes: the names of configurations (:func:`choice_label`), the reasons for the pick
and against each faster alternative, the warnings, what to do when nothing fits, and the words of the sweeps'
tables. The other planner modules compute; this one only reads their figures (the evaluated candidate grid, the
estimate, the ranking) and says them. Names that are also keys of a result (the :data:`~.sweeps.VARIANTS` labels,
the :data:`~.grid.SEARCH_INPUTS` axis names, :data:`~.sweeps.LIMIT_NAMES`) stay with the code that keys by them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..costmodel import Candidates, Estimate, Evaluation
from ..costmodel.communication import autotp_collectives_per_micro_step
from ..costmodel.timeline import memory_error_fraction
from ..specs import Scenario, hardware_precision
from ..units import gib
from .grid import SEARCH_INPUTS, activation_parts_at, choice_at, held_value, quantized_zeropp_allowed, varied_axes
from .models import Choice
from .sweeps import GRID_TOP

if TYPE_CHECKING:
    from ..advice import MethodAdvice
    from .models import Option
    from .search import Search

ZERO_PP_PAPER = "the ZeRO++ paper (Wang et al., arXiv 2306.10209)"


# ---------------------------------------------------------------------------------------------------------------
# names of configurations

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


def choice_label(c: Choice) -> str:
    """:attr:`~.models.Choice.label`: ``ZeRO-3 + CPU optimizer + ZeRO++ (hpZ 8) (full activation checkpointing,
    micro-batch 1 x 8 accumulation steps)``."""
    parts = [f"ZeRO-{c.stage}"]
    if (c.autotp_size or 1) > 1:
        parts.append(f"+ AutoTP {c.autotp_size}")
    off = []
    if c.offload_optimizer != "none":
        off.append(f"{c.offload_optimizer.upper() if c.offload_optimizer == 'cpu' else 'NVMe'} optimizer")
    if c.offload_param != "none":
        off.append(f"{c.offload_param.upper() if c.offload_param == 'cpu' else 'NVMe'} params")
    if off:
        parts.append("+ " + " & ".join(off))
    zpp = zeropp_parts(c.zero_hpz_partition_size, c.zero_quantized_weights, c.zero_quantized_gradients)
    if zpp:
        parts.append(f"+ ZeRO++ ({zpp})")
    if c.sequence_parallel_size > 1:
        parts.append(f"+ Ulysses SP {c.sequence_parallel_size}")
    ckpt = {"none": "no", "selective": "selective", "full": "full"}[c.checkpointing]
    parts.append(f"({ckpt} activation checkpointing, micro-batch {c.micro_batch} x "
                 f"{c.grad_accum} accumulation steps)")
    return " ".join(parts)


def short_label(c: Choice) -> str:
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


def choice_changes(scenario: Scenario, choice: Choice) -> list[str]:
    """The settings ``choice`` changes from ``scenario``'s own configuration, one ``"stage 2 -> 3"`` per
    :class:`~.models.Choice` field that differs (``overlap_comm`` left to DeepSpeed's default is no change)."""
    z = scenario.zero
    now = Choice(stage=z.stage, offload_optimizer=z.offload_optimizer.device, offload_param=z.offload_param.device,
                 checkpointing=scenario.training.checkpointing, micro_batch=scenario.training.micro_batch,
                 grad_accum=scenario.training.grad_accum, overlap_comm=z.overlap_comm,
                 reduce_bucket_size=z.reduce_bucket_size, zero_hpz_partition_size=z.zero_hpz_partition_size,
                 zero_quantized_weights=z.zero_quantized_weights, zero_quantized_gradients=z.zero_quantized_gradients,
                 sequence_parallel_size=scenario.cluster.sequence_parallel_size)
    return [f"{k} {getattr(now, k)} -> {getattr(choice, k)}" for k in Choice.model_fields
            if getattr(now, k) != getattr(choice, k) and not (k == "overlap_comm" and now.overlap_comm is None)]


def step_breakdown(est: Estimate) -> str:
    """One line: where the predicted step time goes (compute, exposed collectives, ZeRO host overhead, offload,
    optimizer), so a reader sees why one stage wins."""
    host = est.fetch_overhead_seconds_per_step + est.hook_seconds_per_step
    collectives = est.communication.exposed_seconds_per_step - host
    return (f"Step {est.step_seconds:.3f} s = compute {est.compute_seconds_per_step:.3f} s "
            f"({est.achieved_fraction:.0%} of peak) + exposed communication {collectives:.3f} s + ZeRO-3 fetch "
            f"overhead {est.fetch_overhead_seconds_per_step:.3f} s + gradient hooks {est.hook_seconds_per_step:.3f} s "
            f"+ offload {est.offload_seconds_per_step:.3f} s + optimizer {est.optimizer_seconds_per_step:.3f} s.")


def held_text(scenario: Scenario, held: frozenset[str]) -> str:
    """``stage=2, checkpointing=full``: the held inputs with the scenario's values, in table order."""
    return ", ".join(f"{k}={held_value(scenario, k)}" for k in SEARCH_INPUTS if k in held)


def activation_text(parts: dict[str, float]) -> str:
    """``activations 154.5 GiB (layers 32.3, logits 94.0, ...)``: :func:`~.grid.activation_parts_at`'s bytes,
    GiB."""
    inner = ", ".join(f"{k} {gib(v):.1f}" for k, v in parts.items() if v > 0)
    return f"activations {gib(sum(parts.values())):.1f} GiB ({inner})"


def largest_limit_text(limit: dict) -> str:
    """What stops one variant of the largest-model table from training the next size searched (one value of
    :func:`~.sweeps.largest_model_limits`): the resources the next size searched does not fit in, and that size
    ("host RAM at 154.0 B")."""
    names = tuple(limit.get("limited_by") or ())
    if names == (GRID_TOP,) or not names:
        return "nothing up to the largest size searched"
    return f"{' and '.join(names)} at {limit['next_parameters'] / 1e9:,.1f} B"


# ---------------------------------------------------------------------------------------------------------------
# notes and warnings

def precision_notes(scenario: Scenario) -> list[str]:
    """The note that the plan is priced in fp16 when the scenario's GPU has no bf16 (:func:`~.grid.at_hardware_
    precision`); empty when the scenario's precision is the GPU's."""
    if hardware_precision(scenario) == scenario.training.precision:
        return []
    g = scenario.cluster.gpu
    return [f"Precision: {g.name} has no bf16 (bf16 tensor cores need Ampere, sm_80, or newer), so this plan is "
            f"priced and configured as fp16 with dynamic loss scaling (DeepSpeed fp16 block, loss_scale 0) at the "
            f"GPU's fp16 peak of {g.peak_fp16_tflops:g} TFLOP/s; memory is the same (2 bytes per value)."]


_IF_IT_FITS = re.compile(r"(?i)(ZeRO-([0-3]) (?:if|where) it fits)(?: \(([^)]*)\))?")


def _priced_fixes(warnings: list[str], values: Evaluation, cand: Candidates, pick_tps: float) -> list[str]:
    """The estimate's warnings with every "ZeRO-N if it fits" fix followed by what the planner priced for it (the
    fastest fitting ZeRO-N candidate, or that none fits), so a warning never sends the user to try a stage the
    plan already rejected without saying so."""
    def priced(m: re.Match) -> str:
        st = int(m.group(2))
        ok = np.flatnonzero(values.fits & (cand.stage == st))
        why = f"{m.group(3)}; " if m.group(3) else ""
        if not ok.size:
            return f"{m.group(1)} ({why}priced here: no ZeRO-{st} candidate fits)"
        tps = float(values.tokens_per_second[ok].max())
        than = "slower than" if tps < pick_tps else "faster than"
        return f"{m.group(1)} ({why}priced here: at best {tps:,.0f} tokens/s, {than} the pick)"

    return [_IF_IT_FITS.sub(priced, w) for w in warnings]


def fit_warnings(scenario: Scenario, found: Search, est: Estimate) -> list[str]:
    """The pick's warnings: the estimate's, with each "ZeRO-N if it fits" fix priced, and QLoRA's stage advice."""
    values, cand = found.values, found.cand
    warnings = _priced_fixes(list(est.warnings), values, cand, est.tokens_per_second)
    if scenario.training.qlora and np.any(values.fits & (cand.stage < 3)):
        # not when only ZeRO-3 fits (a base sharded with bnb_4bit_quant_storage = the training dtype)
        warnings.append("QLoRA: ZeRO-1 or 2 is enough; ZeRO-3 adds per-layer parameter all-gathers of the 4-bit "
                        "base for little memory gain (the base is frozen: no gradients or optimizer states to shard).")
    return warnings


def nothing_fits_warnings(scenario: Scenario, held: frozenset[str], found: Search, est: Estimate, smallest: int,
                          act: dict[str, float], methods: list[MethodAdvice], advice: bool,
                          sp_fit: tuple[int, float] | None) -> list[str]:
    """What is short when no candidate fits: the candidate needing the least GPU memory (``smallest``, with its
    activations ``act``) against the GPU and host RAM, the remedies (``methods``: the priced cheaper methods;
    ``advice``: whether they were priced; ``sp_fit``: a Ulysses degree that would fit, and its peak), then the
    estimate's warnings for the scenario as configured."""
    values, cand, ctx, tp = found.values, found.cand, found.ctx, found.tp
    t = scenario.training
    remedies = ["add GPUs or nodes", "shorten the sequence", "use a GPU with more memory"]
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
    if sp_fit is not None:
        remedies.insert(0, f"split the sequence with Ulysses sequence parallelism "
                           f"(--sequence-parallel-size {sp_fit[0]} fits: "
                           f"{gib(sp_fit[1]):.1f} GiB per GPU at the step's peak)")
    if not t.tiled_loss and act["logits"] > 0.25 * values.step_peak.bytes[smallest]:
        remedies.insert(0, f"compute the loss in chunks (--tiled-loss: the logits and their fp32 log-softmax "
                           f"are {gib(act['logits']):.1f} GiB)")
    within = f" with the options held ({held_text(scenario, held)})" if held else ""
    a = scenario.assumptions
    host = values.per_node_cpu_bytes[smallest]
    warn = [f"Nothing fits{within}. The candidate needing the least GPU memory "
            f"({choice_at(cand, smallest, tp).label}) "
            f"peaks at {gib(values.step_peak.bytes[smallest]):.1f} GiB per GPU of "
            f"{gib(ctx.gpu_memory_bytes * (1 - a.gpu_memory_margin_fraction)):.1f} GiB usable "
            f"and {gib(host):.0f} GiB host RAM per node (x{a.host_buffer_factor:g} buffer factor: "
            f"{gib(host * a.host_buffer_factor):.0f} GiB needed of "
            f"{gib(scenario.cluster.cpu_memory_bytes):.0f}); of it "
            f"{activation_text(act)}. Options: "
            + ", ".join(remedies) + "."]
    return warn + [f"As configured (ZeRO-{scenario.zero.stage}): {w_}" for w_ in est.warnings]


# ---------------------------------------------------------------------------------------------------------------
# reasons for the pick

class Standing(NamedTuple):
    """What :func:`why_not` compares of two configurations: the figures of their
    :class:`~zeroplanner.costmodel.Estimate` (``tokens_per_second``; ``step_peak``'s ``headroom_bytes``, ``risky``
    and ``error_fraction``), read without building one (:meth:`at`)."""

    tokens_per_second: float
    headroom_bytes: int
    risky: bool
    error_fraction: float

    @classmethod
    def of(cls, est: Estimate) -> Standing:
        """From a built Estimate."""
        sp = est.step_peak
        return cls(est.tokens_per_second, sp.headroom_bytes, sp.risky, sp.error_fraction)

    @classmethod
    def at(cls, scenario: Scenario, values: Evaluation, index: int) -> Standing:
        """Candidate ``index`` of ``values`` at its ``scenario``: the same numbers
        :func:`~zeroplanner.costmodel.evaluate.estimate_from_values` puts in its Estimate (same conversions;
        tests/core/test_planner_one_evaluate.py compares them)."""
        return cls(float(values.tokens_per_second.flat[index]),
                   int(round(float(values.step_peak.headroom_bytes.flat[index]))),
                   bool(values.step_peak.risky.flat[index]), memory_error_fraction(scenario.assumptions.device))


def why_not(best: Choice, best_est: Standing, alt: Choice, alt_est: Standing, tolerance: float,
            param_offload_excluded: bool) -> str:
    """Why a faster alternative lost: the ranking rule that put the pick first. Faster is tokens/s (the step
    seconds' ratio when both have the same data-parallel degree; an AutoTP candidate's step carries fewer tokens).
    ``best_est``, ``alt_est``: their :class:`Standing`."""
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
    headroom = best_est.headroom_bytes
    alt_headroom = alt_est.headroom_bytes
    if alt_est.risky and not best_est.risky:
        return head + (f"within the {tolerance:.0%} model tolerance, but its headroom "
                       f"({gib(alt_headroom):.2f} GiB) is below the model's error of "
                       f"{alt_est.error_fraction:.0%} of its peak; the pick leaves {gib(headroom):.2f} GiB.")
    if alt_headroom < headroom:
        return head + (f"within the {tolerance:.0%} model tolerance; the pick leaves more GPU memory free "
                       f"({gib(headroom):.2f} vs {gib(alt_headroom):.2f} GiB), safer against fragmentation and "
                       "longer batches.")
    return head + f"within the {tolerance:.0%} model tolerance; the pick is simpler."


def fit_reasons(scenario: Scenario, held: frozenset[str], found: Search, ranked: np.ndarray, best: Choice,
                est: Estimate, alts: list[Option], tolerance: float, notes: list[str]) -> list[str]:
    """The reasons for the pick ``best`` (``ranked[0]``, estimated ``est``), in order: ``notes``, why it fits and
    what faster candidates lacked, the Ulysses and AutoTP degrees, what the search varied and held, each faster
    alternative's :attr:`~.models.Option.why_not`, and the fastest parameter-offload candidate when it was faster."""
    values, cand, tp = found.values, found.cand, found.tp
    r = (notes + _pick_reasons(scenario, best, est, values, cand, ranked, tolerance, tp)
         + _sp_reasons(scenario, best, est, values, cand, found.ctx, found.sp_searched)
         + _autotp_reasons(scenario, best, int(ranked[0]), values, cand, tp, found.degrees)
         + [search_reason(scenario, held, cand, tp, found.varied)])
    r += [f"Alternative {short_label(a.choice)}: {a.why_not}" for a in alts if a.why_not]
    po = np.flatnonzero(values.fits & (cand.offload_param > 0))
    if po.size:
        j = int(po[np.argmax(values.tokens_per_second[po])])
        if values.tokens_per_second[j] > est.tokens_per_second * 1.01:
            r.append(f"{short_label(choice_at(cand, j, tp))} is predicted "
                     f"{values.tokens_per_second[j] / est.tokens_per_second - 1:.0%} faster but offloads the "
                     "parameters (every forward and backward fetches them over PCIe), which the planner uses "
                     "only when nothing fits without it.")
    return r


def search_reason(scenario: Scenario, held: frozenset[str], cand: Candidates, tp: np.ndarray | None = None,
                  varied: list[str] | None = None) -> str:
    """The reason line saying which search axes the plan varied and which options it held (and at what).
    ``varied``: :func:`~.grid.varied_axes` of ``cand`` and ``tp`` when already computed."""
    varied = varied_axes(cand, tp) if varied is None else varied
    said = f"Varied: {', '.join(varied) if varied else 'nothing'} ({cand.stage.size} candidates)"
    if not held:
        return said + "; no option held."
    return f"Held as given: {held_text(scenario, held)}. {said}."


def _pick_reasons(scenario: Scenario, best: Choice, est: Estimate, values: Evaluation, cand, ranked, tolerance,
                  tp=None) -> list[str]:
    """Why the pick fits, what the faster fitting candidates lacked, what the smaller stages need, and what the
    pick's stage, bucket and ZeRO++ settings do."""
    r: list[str] = []
    n = scenario.cluster.world_size // (best.autotp_size or scenario.cluster.tensor_parallel_size)
    margin = scenario.assumptions.gpu_memory_margin_fraction
    kept = f", {margin:.0%} kept free" if margin > 0 else ""
    r.append(f"{best.label} fits: {est.step_peak.verdict()}{kept}; "
             f"{est.tokens_per_second:,.0f} tokens/s predicted ({est.step_seconds:.2f} s per step).")
    fastest = ranked[np.argmax(values.tokens_per_second[ranked])]
    if values.tokens_per_second[fastest] > est.tokens_per_second * 1.01:
        fc = choice_at(cand, int(fastest), tp)
        label = fc.label
        if label == best.label:  # it differs in a setting the label does not show (overlap_comm, bucket)
            label += " with " + ", ".join(f"{k} {getattr(fc, k)}" for k in Choice.model_fields
                                          if getattr(fc, k) != getattr(best, k))
        top = values.tokens_per_second[fastest]
        r.append(f"The fastest fitting option, {label}, is {top / est.tokens_per_second - 1:.0%} faster, within the "
                 f"{tolerance:.0%} model tolerance; the planner prefers this choice because "
                 f"{_preferred_because(scenario, values, cand, int(ranked[0]), int(fastest), tp)}.")
    fitting = np.flatnonzero(values.fits)
    quickest = int(fitting[np.argmax(values.tokens_per_second[fitting])])
    if values.step_peak.risky[quickest] and not est.step_peak.risky \
            and values.tokens_per_second[quickest] > est.tokens_per_second * 1.01:
        room = values.step_peak.headroom_bytes[quickest]
        r.append(f"{choice_at(cand, quickest, tp).label} would be "
                 f"{values.tokens_per_second[quickest] / est.tokens_per_second - 1:.0%} faster, but its step "
                 f"peaks at {gib(values.step_peak.bytes[quickest]):.1f} GiB, leaving {gib(room):.1f} GiB "
                 f"({room / est.gpu_memory_bytes:.0%}): below the model's error of {est.step_peak.error_fraction:.1%} "
                 "of the peak, not a proven fit.")
    if n == 1:
        r.append("Data-parallel degree 1: no ZeRO stage saves memory here (DeepSpeed #4953), so the simplest "
                 "configuration is preferred.")
    no_offload = best.offload_optimizer == "none" and best.offload_param == "none"
    for st in range(best.stage if no_offload else 4):
        mask = (cand.stage == st) & (cand.offload_optimizer == 0) & (cand.offload_param == 0)
        if tp is not None:
            mask &= tp == (best.autotp_size or 1)
        if mask.any() and not values.fits_gpu[mask].any():
            need = values.step_peak.bytes[mask].min()
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
    host = est.fetch_overhead_seconds_per_step + est.hook_seconds_per_step
    # the share counts ZeRO's host hooks as communication (they coordinate the collectives; step_breakdown lists
    # them apart): say so, or "15%" sits beside "exposed communication 0.157 s" of a 3.8 s step
    if host > 0:
        coll = (est.communication.exposed_seconds_per_step - host) / est.step_seconds
        r.append(f"Exposed communication is {comm_share:.1%} of the step: collectives {coll:.1%}, ZeRO's fetch and "
                 f"gradient hooks {host / est.step_seconds:.1%}.")
    else:
        r.append(f"Exposed communication is {comm_share:.0%} of the step.")
    r.append(step_breakdown(est))
    return r


def _sp_reasons(scenario: Scenario, best: Choice, est: Estimate, values: Evaluation, cand: Candidates, ctx,
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
            fit = mask & values.fits
            if not fit.any():
                i = int(np.flatnonzero(mask)[np.argmin(values.step_peak.bytes[mask])])
                r.append(f"Sequence parallelism {p} is needed: with sequence_parallel_size={v} nothing fits; the "
                         f"candidate needing the least GPU memory ({choice_at(cand, i).label}) needs "
                         f"{gib(values.step_peak.bytes[i]):.1f} GiB per GPU, of it "
                         f"{activation_text(activation_parts_at(ctx, cand, i))}: "
                         "no ZeRO stage shards activations, splitting the sequence does.")
            else:
                plain = fit & (cand.offload_optimizer == 0) & (cand.offload_param == 0)
                pick_plain = best.offload_optimizer == "none" and best.offload_param == "none"
                if pick_plain and not plain.any():
                    tps = float(values.tokens_per_second[fit].max())
                    r.append(f"With sequence_parallel_size={v} only candidates with offload fit (the fastest "
                             f"{tps:,.0f} tokens/s, against the pick's {est.tokens_per_second:,.0f}); offload is a "
                             "last resort (PCIe/host-bound), so the larger degree without it is picked.")
                else:
                    tps = float(values.tokens_per_second[plain if pick_plain else fit].max())
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


def _autotp_reasons(scenario: Scenario, best: Choice, best_i: int, values: Evaluation, cand, tp,
                    degrees) -> list[str]:
    """Why AutoTP was tried and was or was not picked (figures of the evaluated candidates)."""
    if not degrees:
        return []
    plain = (tp == 1) & (cand.stage < 3) & (cand.offload_optimizer == 0)
    need = gib(values.step_peak.bytes[plain].min()) if plain.any() else float("nan")
    tried = ", ".join(str(d) for d in degrees)
    head = (f"AutoTP degrees {tried} were tried because at tensor-parallel degree 1 no ZeRO-0/1/2 configuration "
            f"fits without offload with the model's {memory_error_fraction(scenario.assumptions.device):.0%} error "
            f"of headroom (the step peaks at {need:.1f} GiB per GPU or more); AutoTP stays inside the node (its "
            "per-layer all-reduces across nodes would run at NIC speed, so the planner never spreads it over nodes).")
    d = best.autotp_size or 1
    if d == 1:
        return [head + " The pick, at degree 1, is faster or simpler than every fitting AutoTP candidate."]
    n = scenario.cluster.world_size // d
    counts = autotp_collectives_per_micro_step(scenario.model, best.checkpointing)
    same = (tp == 1) & (cand.stage == best.stage) & (cand.checkpointing == cand.checkpointing[best_i]) & \
        (cand.offload_optimizer == cand.offload_optimizer[best_i]) & (cand.offload_param == cand.offload_param[best_i])
    versus = ""
    if same.any():
        peak, act = values.step_peak.bytes, values.per_gpu_bytes.activations
        j = int(np.flatnonzero(same)[np.argmin(peak[same])])
        versus = (f" (the same configuration at degree 1 needs {gib(peak[j]):.1f} GiB per GPU, "
                  f"activations {gib(act[j]):.1f} GiB; here {gib(peak[best_i]):.1f} and "
                  f"{gib(act[best_i]):.1f} GiB)")
    step = values.step_seconds[best_i]
    why = (f"AutoTP {d} (tensor_parallel.autotp_size {d}) splits each layer's linear weights, their gradients, "
           f"optimizer states and activations {d} ways inside the node and ZeRO-{best.stage} shards the rest over "
           f"world / {d} = {n} data-parallel ranks, so this configuration fits{versus}; the price is "
           f"{counts['forward']} all-reduces of one activation per micro-step in forward and "
           f"{counts['backward'] + counts['recompute']} in backward over the node's link, not overlapped: "
           f"{values.autotp_seconds_per_step[best_i]:.3f} s of the {step:.3f} s step.")
    return [head, why]


PREFERENCE_TEXT: dict[str, str] = {
    "offloads": "no offload: fewer of the optimizer states and the parameters offloaded (offload is PCIe- and "
                "CPU-bound)",
    "sequence_parallel": "the smaller Ulysses sequence-parallel degree (fewer all-to-alls)",
    "autotp": "the smaller AutoTP degree (its all-reduces are serial with compute)",
    "stage3": "ZeRO-0, 1 or 2 over ZeRO-3 (per-layer parameter gathers); ZeRO-0, 1 and 2 count as equal here",
    "zeropp": "no ZeRO++",
    "headroom": "the most GPU memory free at the step's peak",
    "tokens_per_second": "the most tokens/s",
}
"""The sentence of each tie-break of :data:`zeroplanner.planner.rank.PREFERENCE_ORDER` (the tutorial lists them in
that order)."""


def _preferred_because(scenario: Scenario, values: Evaluation, cand, pick: int, other: int, tp=None) -> str:
    """Why the ranking puts candidate ``pick`` before the faster ``other`` within the tolerance: the first tie-break
    of :data:`~zeroplanner.planner.rank.PREFERENCE_ORDER` on which they differ, in words."""
    from .rank import PREFERENCE_ORDER, preference_keys

    keys = preference_keys(values, cand, np.array([pick, other]), scenario.cluster.memory_per_gpu_bytes, tp)
    first = next((k for k in PREFERENCE_ORDER if keys[k][0] != keys[k][1]), "tokens_per_second")
    if first == "headroom":
        free = [gib(-float(keys["headroom"][i])) for i in (0, 1)]
        return (f"it leaves {free[0]:.1f} GiB of GPU memory free at the step's peak against {free[1]:.1f} GiB "
                "(the tie-break after offload, parallel degrees, ZeRO-3 and ZeRO++)")
    return PREFERENCE_BECAUSE[first]


PREFERENCE_BECAUSE: dict[str, str] = {
    "offloads": "it offloads less to the host (offload is PCIe- and CPU-bound)",
    "sequence_parallel": "its Ulysses sequence-parallel degree is smaller (fewer all-to-alls)",
    "autotp": "its AutoTP degree is smaller (its all-reduces are serial with compute)",
    "stage3": "it avoids ZeRO-3's per-layer parameter gathers",
    "zeropp": "it needs no ZeRO++",
    "tokens_per_second": "it ranks first on the planner's tie-breaks",
}
"""The reason :func:`_preferred_because` gives for each tie-break but the headroom (whose reason carries its GiB)."""
