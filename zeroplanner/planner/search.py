""":func:`plan`: the candidate grid (:mod:`.grid`), evaluated once with the chart variants, ranked
(:mod:`.rank`), explained (:mod:`.reasons`) and returned as a :class:`~.models.Plan`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from ..costmodel import Candidates, Evaluation, estimate, evaluate, make_context
from ..costmodel.evaluate import estimate_from_values
from ..specs import Scenario
from .grid import (SP_MIN_SEQUENCE_TOKENS, activation_parts_at, apply_choice, at_hardware_precision, autotp_degrees,
                   candidate_grid, check_held, choice_at, held_values, sequence_parallel_fit,
                   sequence_parallel_options, varied_axes, with_autotp)
from .models import Choice, Option, Plan
from .rank import DEFAULT_TOLERANCE, alternative_indices, check_tolerance, rank_candidates
from .reasons import Standing, fit_reasons, fit_warnings, nothing_fits_warnings, precision_notes, why_not
from .sweeps import variant_candidates, variant_options_from

if TYPE_CHECKING:
    from ..costmodel.context import Context


@dataclass(frozen=True)
class Search:
    """One plan's evaluated candidates: the grid ``cand`` (1-D), its :func:`~zeroplanner.costmodel.evaluate`
    ``values``, each candidate's tensor-parallel degree ``tp``, the chart variants' values ``variant_values``,
    whether Ulysses degrees were searched (``sp_searched``) and the AutoTP degrees added (``degrees``);
    ``varied``: the search axes the grid varies (:func:`~.grid.varied_axes`, read by the plan and its reasons)."""

    ctx: Context
    cand: Candidates
    values: Evaluation
    tp: np.ndarray
    variant_values: Evaluation
    sp_searched: bool
    degrees: tuple[int, ...]

    @cached_property
    def varied(self) -> list[str]:
        return varied_axes(self.cand, self.tp)


def search(scenario: Scenario, held: frozenset[str]) -> Search:
    """Evaluate the scenario's candidate grid and the chart variants in one call. Ulysses degrees join the grid for
    long sequences (:data:`~.grid.SP_MIN_SEQUENCE_TOKENS`) from the start, else only when nothing fits without
    them (one more evaluation); AutoTP degrees (:func:`~.grid.autotp_degrees`) add one grid each, never together
    with a Ulysses search (their combination is not priced against the engine). Raises ValueError when the held
    values leave no candidate."""
    ctx = make_context(scenario)
    cand = candidate_grid(scenario, held)
    if cand.stage.size == 0:
        raise ValueError(f"held {sorted(held)}: no candidate configuration has these values together")
    long = scenario.sequence_tokens >= SP_MIN_SEQUENCE_TOKENS
    sp_options = sequence_parallel_options(scenario, held) if long else [1]
    if len(sp_options) > 1:
        cand = candidate_grid(scenario, held, sp_options)
    _, vcand = variant_candidates(scenario, np.array([scenario.cluster.nodes]))
    values, vvalues = evaluate(ctx, Candidates.concat(cand, vcand)).split(cand.shape, vcand.shape)
    if not long and not values.fits.any():
        sp_options = sequence_parallel_options(scenario, held)
        if len(sp_options) > 1:
            cand = candidate_grid(scenario, held, sp_options)
            values = evaluate(ctx, cand)
    sp_searched = len(sp_options) > 1
    tp = np.full(cand.shape, scenario.cluster.tensor_parallel_size, dtype=np.int64)
    degrees = () if sp_searched else autotp_degrees(scenario, held, values, cand)
    if degrees:
        cand, values, tp = with_autotp(scenario, held, cand, values, tp, degrees)
    return Search(ctx, cand, values, tp, vvalues, sp_searched, degrees)


def plan(scenario: Scenario, *, tolerance: float = DEFAULT_TOLERANCE, alternatives: int = 5, held=(),
         advice: bool = True, given=None) -> Plan:
    """Evaluate every candidate for ``scenario`` and recommend one.

    ``held``: input keys of :data:`~.grid.SEARCH_INPUTS` whose axis is fixed at the scenario's value (the CLI
    passes the options the user gave: ``--stage 2`` searches ZeRO-2 only); the reasons say what was held and what
    varied. ``advice``: also price fewer nodes and cheaper methods (:mod:`zeroplanner.advice`; each re-plans a
    changed scenario, with advice off); ``given``: the input keys the user set, for :attr:`Plan.assumptions` (None:
    values equal to the defaults count as not given).
    Returns a Plan; when nothing fits, ``fits`` is False, ``choice`` is None and ``estimate`` is the scenario as
    given, with warnings saying what is short. Alternatives: per ZeRO stage, offload, ZeRO++ and AutoTP degree
    the fastest candidate the ranking keeps (micro-batch, checkpointing and overlap searched), at most
    ``alternatives`` of them. Raises ValueError for tolerance outside [0, 1), a held key the planner does not vary,
    or held values that leave no valid candidate.
    """
    from ..advice import cluster_advice, method_advice, verdict_assumptions

    check_tolerance(tolerance)
    notes = precision_notes(scenario)
    scenario = at_hardware_precision(scenario)
    held = check_held(held)
    found = search(scenario, held)
    ranked = rank_candidates(found.values, found.cand, tolerance, found.ctx.gpu_memory_bytes, found.tp)
    common = {"variants": variant_options_from(scenario, found.variant_values), "held": held_values(scenario, held),
              "candidates_evaluated": int(found.cand.stage.size), "varied": found.varied}
    if ranked.size == 0:
        return _nothing_fits(scenario, held, found, notes, tolerance, advice, given, common)
    best_i = int(ranked[0])
    best = choice_at(found.cand, best_i, found.tp)
    chosen = apply_choice(scenario, best, validate=False)
    est = estimate_from_values(chosen, found.values, best_i)
    standing = Standing.of(est)
    alts = [_option(scenario, found, i, best, standing, tolerance)
            for i in alternative_indices(found.values, found.cand, found.tp, ranked, alternatives)]
    out = Plan(fits=True, choice=best, scenario=chosen, estimate=est, alternatives=alts,
               reasons=fit_reasons(scenario, held, found, ranked, best, est, alts, tolerance, notes),
               warnings=fit_warnings(scenario, found, est),
               assumptions=verdict_assumptions(scenario, best, given, priced=(chosen, est)), **common)
    if not advice:
        return out
    return out.model_copy(update={"cluster_advice": cluster_advice(scenario, out, held, tolerance),
                                  "method_advice": method_advice(scenario, out, held, tolerance)})


def _option(scenario: Scenario, found: Search, i: int, best: Choice, best_standing: Standing,
            tolerance: float) -> Option:
    """Candidate ``i`` as an alternative to the pick ``best`` (whose figures are ``best_standing``), with why it
    was not picked."""
    ch = choice_at(found.cand, i, found.tp)
    sc = apply_choice(scenario, ch, validate=False)
    return Option.of(found.values, int(i), label=ch.label, choice=ch, scenario=sc,
                     why_not=why_not(best, best_standing, ch, Standing.at(sc, found.values, int(i)), tolerance,
                                     False))


def _nothing_fits(scenario: Scenario, held: frozenset[str], found: Search, notes: list[str], tolerance: float,
                  advice: bool, given, common: dict) -> Plan:
    """The plan when no candidate fits: the scenario as given, estimated, with warnings saying what is short (the
    candidate needing the least GPU memory) and the remedies, priced where they can be."""
    from ..advice import method_advice, verdict_assumptions

    est = estimate(scenario)
    smallest = int(np.argmin(found.values.step_peak.bytes))
    methods = method_advice(scenario, None, held, tolerance) if advice else []
    act = activation_parts_at(found.ctx, found.cand, smallest, found.tp)
    warnings = nothing_fits_warnings(scenario, held, found, est, smallest, act, methods, advice,
                                     sequence_parallel_fit(scenario, held, found.ctx))
    return Plan(fits=False, choice=None, scenario=scenario, estimate=est, reasons=[], warnings=warnings + notes,
                alternatives=[], method_advice=methods,
                assumptions=verdict_assumptions(scenario, None, given, priced=(scenario, est)),
                **common)
