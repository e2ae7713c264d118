"""Sweeps: the chart variants (:data:`VARIANTS`) against node count (:func:`scaling`), model size
(:func:`largest_model`, :func:`largest_model_limits`) and sequence length (:func:`longest_sequence`), and the raw
cartesian :func:`sweep`. Each evaluates its whole grid in vectorised calls; none ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..costmodel import Candidates, Evaluation, evaluate, make_context
from ..costmodel.context import CHECKPOINT_CODES
from ..costmodel.evaluate import Fits, fits
from ..specs import Architecture, Scenario
from .grid import OFFLOAD_NAMES, apply_choice, sequence_parallel_options
from .models import Choice, Option

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

LIMIT_NAMES = {"fits_gpu": "GPU memory", "fits_cpu": "host RAM", "fits_nvme": "NVMe"}
"""The resources a candidate must fit in (the cost model's ``evaluate``: ``fits = fits_gpu & fits_cpu & fits_nvme``),
by the names :func:`largest_model_limits` gives them; keys name the fields of
:class:`~zeroplanner.costmodel.Evaluation` (:func:`_limits` reads them)."""


def _limits(values: Fits, index) -> dict[str, bool]:
    """Whether candidate ``index`` fits in each resource of :data:`LIMIT_NAMES`."""
    return {"fits_gpu": bool(values.fits_gpu[index]), "fits_cpu": bool(values.fits_cpu[index]),
            "fits_nvme": bool(values.fits_nvme[index])}
GRID_TOP = "the search's top"
""":func:`largest_model_limits`' ``limited_by`` for a variant that fits even the largest model searched."""

LARGEST_LOW, LARGEST_HIGH, LARGEST_POINTS = 1e8, 1e13, 81
"""The largest-model search's default grid: ``LARGEST_POINTS`` parameter counts spaced evenly in log from
``LARGEST_LOW`` to ``LARGEST_HIGH`` (:func:`largest_model`)."""


def grid_step(low: float = LARGEST_LOW, high: float = LARGEST_HIGH, points: int = LARGEST_POINTS) -> float:
    """The ratio between neighbouring sizes of the largest-model grid, less 1 (0.155 for the defaults: each size
    searched is 15.5% above the one below it)."""
    return (high / low) ** (1 / (points - 1)) - 1


LONGEST_SEQUENCE_QUANTUM = 1024
"""Sequence lengths :func:`longest_sequence` tries are multiples of this (and of every Ulysses degree tried)."""


def variant_candidates(scenario: Scenario, nodes: np.ndarray) -> tuple[list[str], Candidates]:
    """The :data:`VARIANTS` labels and their candidates, shape ``(len(VARIANTS), len(nodes))``, with the
    scenario's other settings."""
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


def variant_options(scenario: Scenario, ctx=None) -> list[Option]:
    """The chart variants (:data:`VARIANTS`) evaluated with the scenario's other settings, in one vectorised call."""
    ctx = ctx or make_context(scenario)
    labels, cand = variant_candidates(scenario, np.array([scenario.cluster.nodes]))
    return variant_options_from(scenario, evaluate(ctx, cand))


def variant_options_from(scenario: Scenario, values: Evaluation) -> list[Option]:
    """:func:`variant_options` from the variants' :func:`evaluate` values (shape ``(len(VARIANTS), 1)``)."""
    t = scenario.training
    out = []
    for i, (label, stage, oo, op) in enumerate(VARIANTS):
        ch = Choice(stage=stage, offload_optimizer=OFFLOAD_NAMES[oo], offload_param=OFFLOAD_NAMES[op],
                    checkpointing=t.checkpointing, micro_batch=t.micro_batch, grad_accum=t.grad_accum,
                    overlap_comm=scenario.zero.overlap_comm, reduce_bucket_size=scenario.zero.reduce_bucket_size,
                    sequence_parallel_size=scenario.cluster.sequence_parallel_size)
        sc = apply_choice(scenario, ch, validate=False)
        out.append(Option.of(values, (i, 0), label=label, choice=ch, scenario=sc))
    return out


def scaling(scenario: Scenario, nodes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, dict[str, list]]:
    """Tokens/s and fit per variant against node count (per-GPU batch fixed).

    Returns {label: {"nodes": [...], "tokens_per_second": [...], "fits": [...]}}. Raises ValueError for node
    counts < 1.
    """
    nodes_arr = np.asarray(list(nodes), dtype=np.int64)
    if nodes_arr.size == 0 or nodes_arr.min() < 1:
        raise ValueError(f"nodes must be >= 1 (got {list(nodes)})")
    labels, cand = variant_candidates(scenario, nodes_arr)
    values = evaluate(make_context(scenario), cand)
    return {
        label: {"nodes": nodes_arr.tolist(), "tokens_per_second": values.tokens_per_second[i].tolist(),
                "fits": values.fits[i].tolist()}
        for i, label in enumerate(labels)
    }


def largest_model(scenario: Scenario, *, low: float = LARGEST_LOW, high: float = LARGEST_HIGH,
                  points: int = LARGEST_POINTS) -> dict[str, int]:
    """Largest parameter count each variant can train on the scenario's cluster (0 if none on the grid).

    Models are Llama-shaped (:meth:`Architecture.from_parameter_count`) on a log grid between ``low`` and
    ``high``, with the scenario's training settings (its Ulysses degree too: shapes whose heads it does not split
    are skipped); the answer is the largest grid point that fits (grid spacing 10**(log10(high/low)/(points-1)),
    15.5% for the defaults: :func:`grid_step`). :func:`largest_model_limits` also says what stops each variant there.
    """
    return {label: r["parameters"] for label, r in largest_model_limits(scenario, low=low, high=high,
                                                                        points=points).items()}


def largest_model_limits(scenario: Scenario, *, low: float = LARGEST_LOW, high: float = LARGEST_HIGH,
                         points: int = LARGEST_POINTS) -> dict[str, dict[str, Any]]:
    """:func:`largest_model` with what limits each variant: {label: {"parameters": the largest grid point that
    fits (0 if none), "next_parameters": the next size searched above it (0 if none), "limited_by": the resources
    that size does not fit in, a tuple of :data:`LIMIT_NAMES` values ("GPU memory", "host RAM", "NVMe"), or
    (:data:`GRID_TOP`,) when the largest size searched fits}}. Same grid and shapes as :func:`largest_model`; the
    limit is read from the cost model's ``fits_gpu`` / ``fits_cpu`` / ``fits_nvme`` at ``next_parameters``
    (:func:`~.reasons.largest_limit_text` says it in words).

    Offloading moves memory from the GPU to host RAM or NVMe, so an offload variant can stop at a *smaller* model
    than one that offloads less: its limit is then host RAM (or NVMe), not GPU memory.
    """
    grid = np.geomspace(low, high, points)
    labels = [v[0] for v in VARIANTS]
    best = dict.fromkeys(labels, 0)
    # per label: the smallest size evaluated above its best so far, and what that size fits in
    above: dict[str, tuple[int, dict[str, bool]] | None] = dict.fromkeys(labels)
    from ..costmodel.ulysses import check_ulysses

    sp = scenario.cluster.sequence_parallel_size
    # From the largest size down, each variant until the first size that fits it: that is its largest fitting
    # size, and the size evaluated just before it the next one above. The same answer as evaluating every size (no
    # assumption that a fit at one size implies a fit at smaller ones), without the sizes below every variant's
    # answer (a third of them for llama-2-70b on 4 nodes).
    for p in grid[::-1]:
        arch = Architecture.from_parameter_count(int(p))
        try:
            check_ulysses(n_heads=arch.n_heads, kv_heads=arch.kv_heads, sp_size=sp, linear_mixer=arch.linear_mixer)
        except ValueError:
            continue  # the scenario's Ulysses degree does not split this shape's heads
        sc = scenario.model_copy(update={"model": arch})
        _, cand = variant_candidates(sc, np.array([sc.cluster.nodes]))
        values = fits(make_context(sc), cand)
        for i, label in enumerate(labels):
            if best[label]:
                continue
            if values.fits[i, 0]:
                best[label] = int(p)
                continue
            above[label] = (int(p), _limits(values, (i, 0)))
        if all(best.values()):
            break
    out: dict[str, dict[str, Any]] = {}
    for label in labels:
        if above[label] is None:
            out[label] = {"parameters": best[label], "next_parameters": 0, "limited_by": (GRID_TOP,)}
            continue
        size, ok = above[label]
        out[label] = {"parameters": best[label], "next_parameters": size,
                      "limited_by": tuple(name for key, name in LIMIT_NAMES.items() if not ok[key])}
    return out


def longest_sequence(scenario: Scenario, *, sp_values: Sequence[int] | None = None, high: int = 2**26,
                     precision: float = 1 / 64) -> dict[str, dict[str, int]]:
    """The longest sequence each variant (:data:`VARIANTS`) can train on the scenario's cluster and model, with the
    scenario's other training settings (micro-batch, checkpointing, tiled MLP / loss, checkpoint offload).

    ``sp_values``: the Ulysses degrees tried (default :func:`~.grid.sequence_parallel_options` over the whole
    world, not only one node, heads rules applied; the scenario's own degree alone when that is 1 option). Every
    variant is evaluated at every degree on sequence lengths that are multiples of q = lcm(1024, degrees): powers
    of two times q up to ``high`` tokens, then bisection between the last that fits and the next, to within
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
    labels, base = variant_candidates(scenario, np.array([c.nodes]))
    n_var = len(labels)
    cand = Candidates.build(**{f: np.repeat(getattr(base, f).reshape(n_var, 1), len(sps), axis=1)
                               for f in base.__dataclass_fields__ if f != "sp"},
                            sp=np.asarray(sps, dtype=np.int64)[None, :])
    image_tokens = scenario.sequence_tokens - scenario.training.seq_len

    known: dict[int, np.ndarray] = {}

    def fits_at(seq: int, rows=slice(None)) -> np.ndarray:
        """(variants, degrees) bool: what fits at ``seq`` tokens (``rows`` of it). Every variant is evaluated at
        once and kept: the variants' bisections often try the same lengths, and the last look at each answer is
        one already evaluated (each candidate's values do not depend on the others evaluated with it:
        tests/core/test_planner_package.py)."""
        if seq not in known:
            sc = scenario.model_copy(update={"training": scenario.training.model_copy(update={"seq_len": int(seq)})})
            if image_tokens and (seq + image_tokens) % q:  # the split needs every token count to divide evenly
                known[seq] = np.zeros((n_var, len(sps)), dtype=bool)
            else:
                known[seq] = fits(make_context(sc), cand).fits
        return known[seq][rows]

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


def sweep(scenario: Scenario, **axes: Sequence[int]) -> tuple[Evaluation, dict[str, np.ndarray]]:
    """Evaluate the cartesian product of candidate axes (Candidates field names -> values); unspecified axes take
    the scenario's value. Returns the :func:`zeroplanner.costmodel.evaluate` result over the flattened product
    and each axis' value per candidate (axis name -> array). Raises TypeError for unknown axis names."""
    base = Candidates.from_scenario(scenario)
    names = list(axes)
    unknown = set(names) - set(base.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown sweep axes {sorted(unknown)}")
    # the axes as a sparse grid: most values are computed over the axes they depend on (Candidates.build's
    # sparse=True; the same numbers), the result flattened in the grid's C order
    grids = np.meshgrid(*[np.asarray(axes[n]) for n in names], indexing="ij", sparse=True)
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    for n, g in zip(names, grids):
        fields[n] = g
    cand = Candidates.build(sparse=True, **fields)
    grid = cand.shape
    values = evaluate(make_context(scenario), cand)._map(
        lambda a: a.reshape(-1) if isinstance(a, np.ndarray) and a.shape == grid else a)
    # flatten() copies: each axis' values are the caller's own, writeable arrays
    return values, {n: np.broadcast_to(fields[n], grid).flatten() for n in names}
