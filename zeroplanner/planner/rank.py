"""Ranking: which fitting candidate the planner picks, which it lists beside the pick, and the fitting candidate
nearest to the user's own configuration.

Ranking policy (documented, and tested in tests/core/test_planner*.py):
1. Keep candidates whose step peak (costmodel/timeline.py) fits GPU memory (less ``gpu_memory_margin_fraction``,
   default 0), host RAM (with DeepSpeed's 1.5x buffer factor) and NVMe.
2. Candidates within ``tolerance`` (default 10%) of the best predicted throughput are treated as equal: the
   model's step-time error is of that order (docs/validation.md), and a higher stage is not free: ZeRO-3 measured
   2.5-3.3x slower than ZeRO-2 on a small model (LianjiaTech/BELLE #402, BLOOM-560M on 2 GPUs).
   Parameter offload (``offload_param``) is considered only when no candidate without it fits.
   A candidate whose headroom is below the model's measured error of the peak (timeline.memory_error_fraction x
   peak: on a GPU from published GPU runs, on the engine's CPU ranks from its step-peak census) is not a proven
   fit: it is considered only when no proven one exists, and then the one with the most headroom first.
3. Among equals prefer, in order: no offload (offload is a last resort: PCIe/CPU-bound; DeepSpeed #1130), the
   smaller Ulysses degree (fewer all-to-alls, a larger data-parallel batch), the smaller AutoTP degree (its
   all-reduces are serial with compute), stages 0-2 over stage 3 (2Ψ instead of 3Ψ per step; ZeRO paper Sec. 7), no
   ZeRO++, then the most GPU memory headroom (ZeRO-2 frees gradients at ZeRO-1's communication volume), then
   throughput.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import Candidates, Evaluation, evaluate, make_context
from ..specs import Scenario
from .grid import apply_choice, axis_values, candidate_grid, choice_at
from .models import Option
from .reasons import choice_changes

DEFAULT_TOLERANCE = 0.10

PREFERENCE_ORDER: tuple[str, ...] = ("offloads", "sequence_parallel", "autotp", "stage3", "zeropp", "headroom",
                                     "tokens_per_second")
"""Step 3 of the ranking policy: among candidates within ``tolerance`` of the fastest, the keys
:func:`rank_candidates` sorts on, primary first, smaller preferred: offloaded state kinds (0-2), Ulysses degree,
AutoTP degree, ZeRO-3 (1) or not, ZeRO++ (1) or not, minus the headroom, minus tokens/s. Their sentences are
:data:`zeroplanner.planner.reasons.PREFERENCE_TEXT`; the tutorial states the rule from both."""


def check_tolerance(tolerance: float) -> None:
    """Raises ValueError for a tolerance outside [0, 1)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance={tolerance} must be in [0, 1)")


def rank_candidates(values: Evaluation, cand: Candidates, tolerance: float = DEFAULT_TOLERANCE,
                    gpu_memory_bytes: float = 0.0, tp: np.ndarray | None = None) -> np.ndarray:
    """Indices of fitting candidates, best first, by the module's ranking policy (``tp``: each candidate's AutoTP
    degree, when the plan varied it)."""
    fits = np.flatnonzero(values.fits)
    if fits.size == 0:
        return fits
    # a headroom below the model's measured error of the peak (costmodel/timeline.py memory_error_fraction) is not a
    # proven fit: such candidates come after every proven one, and among themselves the most headroom first
    proven = fits[~values.step_peak.risky[fits]]
    if proven.size:
        fits = proven
    # parameter offload only when nothing fits without it: it moves every parameter over PCIe in every forward
    # and backward, and the model's overlap of that traffic is the least checked part of the step time
    no_param_offload = fits[cand.offload_param[fits] == 0]
    if no_param_offload.size:
        fits = no_param_offload
    tps = values.tokens_per_second[fits]
    near = tps >= (1.0 - tolerance) * tps.max()
    keys = preference_keys(values, cand, fits, gpu_memory_bytes, tp)
    # only risky candidates left: the most headroom first, before speed
    risky_headroom = keys["headroom"] if not proven.size else np.zeros(fits.size)
    # np.lexsort: last key is primary: risky headroom, then within the tolerance or not, then PREFERENCE_ORDER
    order = np.lexsort((*(keys[k] for k in reversed(PREFERENCE_ORDER)), ~near, risky_headroom))
    return fits[order]


def preference_keys(values: Evaluation, cand: Candidates, idx: np.ndarray, gpu_memory_bytes: float = 0.0,
                    tp: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The tie-break keys of :data:`PREFERENCE_ORDER` for the candidates ``idx`` (smaller is preferred): offloaded
    state kinds, Ulysses degree, AutoTP degree (``tp``, 1 when not varied), ZeRO-3 or not, ZeRO++ or not, minus the
    headroom (bytes: ``gpu_memory_bytes`` - the step's peak), minus tokens/s."""
    offloads = (cand.offload_optimizer[idx] > 0).astype(int) + (cand.offload_param[idx] > 0).astype(int)
    stage3 = (cand.stage[idx] == 3).astype(int)
    zpp = ((cand.hpz[idx] > 1) | (cand.qwz[idx] > 0)).astype(int)
    headroom = gpu_memory_bytes - values.step_peak.bytes[idx]
    degree = np.ones(np.size(idx), dtype=np.int64) if tp is None else tp[idx]
    return {"offloads": offloads, "sequence_parallel": cand.sp[idx], "autotp": degree, "stage3": stage3,
            "zeropp": zpp, "headroom": -headroom, "tokens_per_second": -values.tokens_per_second[idx]}


def alternative_indices(values: Evaluation, cand: Candidates, tp: np.ndarray, ranked: np.ndarray,
                        count: int) -> list[int]:
    """The alternatives to list beside the pick (``ranked[0]``): per (stage, offload, ZeRO++, AutoTP degree) group
    other than the pick's, its fastest candidate the ranking keeps, in the order the ranking first meets the group;
    at most ``count`` of them (at least one when there is another group)."""
    # one row of Python values per ranked candidate (a numpy index per candidate was most of this function's time)
    keys = np.stack([cand.stage, cand.offload_optimizer, cand.offload_param, cand.hpz, tp], axis=1)[ranked].tolist()
    tps = values.tokens_per_second[ranked].tolist()
    fastest: dict[tuple, int] = {}  # group -> position in ranked
    for j, row in enumerate(keys):
        key = tuple(row)
        if key not in fastest or tps[j] > tps[fastest[key]]:
            fastest[key] = j
    del fastest[tuple(keys[0])]  # the pick's own group
    return [int(ranked[j]) for j in list(fastest.values())[:max(count, 1)]]


def nearest_fit(scenario: Scenario, *, tolerance: float = DEFAULT_TOLERANCE) -> Option | None:
    """The fitting candidate closest to ``scenario``'s own configuration: fewest search axes
    (:data:`~.grid.SEARCH_INPUTS`) changed from the scenario's values, ties broken by the planner's ranking (then
    tokens/s). None when no candidate fits. Its ``why_not`` lists the changes (``stage 2 -> 3``).
    Raises ValueError for tolerance outside [0, 1)."""
    check_tolerance(tolerance)
    ctx = make_context(scenario)
    cand = candidate_grid(scenario)
    values = evaluate(ctx, cand)
    fits = np.flatnonzero(values.fits)
    if fits.size == 0:
        return None
    ranked = rank_candidates(values, cand, tolerance, ctx.gpu_memory_bytes)
    rest = np.setdiff1d(fits, ranked)
    order = np.concatenate([ranked, rest[np.argsort(-values.tokens_per_second[rest], kind="stable")]])
    own = axis_values(Candidates.from_scenario(scenario))
    axes = axis_values(cand)
    if scenario.zero.overlap_comm is None:  # DeepSpeed's default: any candidate's overlap_comm is no change
        del axes["overlap_comm"]
    changed = sum((axes[a][order] != own[a].reshape(-1)[0]).astype(int) for a in axes)
    i = int(order[np.argsort(changed, kind="stable")[0]])
    ch = choice_at(cand, i)
    sc = apply_choice(scenario, ch, validate=False)
    return Option.of(values, i, label=ch.label, choice=ch, scenario=sc,
                     why_not="; ".join(choice_changes(scenario, ch)))
