"""plan() evaluates its candidate grid and the chart variants in ONE evaluate call (Candidates.concat), which
halves a plan's time (benchmarks/bench_costmodel.py); the values must be exactly those of two separate calls."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from zeroplanner import build_scenario, plan
from zeroplanner.costmodel import Candidates, evaluate, make_context
from zeroplanner.planner import _split_values, _variant_candidates, candidate_grid, variant_options

SCENARIOS = [
    {},
    {"model": "llama-2-70b", "nodes": 4, "network": "eth-100g"},
    {"params": 1_300_000_000, "gpus_per_node": 1, "seq_len": 1024},
    {"model": "llama-2-13b", "lora_rank": 16, "qlora": True, "gpus_per_node": 2},
    {"model": "mixtral-8x7b", "gpus_per_node": 8, "checkpointing": "none", "micro_batch": 2},
]


def _leaves(values, prefix: str = "") -> dict:
    """Every field of an Evaluation by its dotted path (nested groups flattened)."""
    out = {}
    for f in dataclasses.fields(values):
        v = getattr(values, f.name)
        if f.name == "timeline":  # the timeline by point and term (its store and indices differ per call)
            out.update({f"{prefix}timeline.{k}": a for k, a in v.by_point().items()})
        elif dataclasses.is_dataclass(v):
            out.update(_leaves(v, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = v
    return out


@pytest.mark.parametrize("kw", SCENARIOS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_one_evaluate_call_gives_the_values_of_two(kw):
    s = build_scenario(**kw)
    ctx = make_context(s)
    cand = candidate_grid(s)
    _, vcand = _variant_candidates(s, np.array([s.cluster.nodes]))
    main, var = _split_values(evaluate(ctx, Candidates.concat(cand, vcand)), cand.shape, vcand.shape)
    for got, want in ((main, evaluate(ctx, cand)), (var, evaluate(ctx, vcand))):
        got_leaves, want_leaves = _leaves(got), _leaves(want)
        assert set(got_leaves) == set(want_leaves)
        for k, a in want_leaves.items():
            assert np.array_equal(np.asarray(got_leaves[k]), np.asarray(a)), k
    p = plan(s)
    assert [o.model_dump() for o in p.variants] == [o.model_dump() for o in variant_options(s)]


@pytest.mark.parametrize("kw", SCENARIOS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_lazy_options_build_the_estimate_an_eager_one_would(kw):
    """Options keep (values, index) and build their Estimate on first read (issue 35 item 2); the figures why_not
    compares are read from the values without one (reasons.Standing.at). Both must be the eager path's numbers."""
    from zeroplanner.costmodel.evaluate import estimate_from_values
    from zeroplanner.planner.reasons import Standing
    from zeroplanner.planner.search import search

    s = build_scenario(**kw)
    found = search(s, frozenset())
    p = plan(s)
    assert all("estimate" not in o.__dict__ for o in p.alternatives + p.variants)  # none built by plan()
    for o in p.alternatives:
        i = next(j for j in range(found.cand.stage.size) if _choice_matches(found, j, o.choice))
        eager = estimate_from_values(o.scenario, found.values, i)
        assert o.estimate.model_dump() == eager.model_dump()
        assert Standing.at(o.scenario, found.values, i) == Standing.of(eager)
    assert p.variants[0].estimate is p.variants[0].estimate  # built once


def _choice_matches(found, j, choice) -> bool:
    from zeroplanner.planner.grid import choice_at

    return choice_at(found.cand, j, found.tp) == choice


def test_lazy_options_compare_copy_pickle_and_round_trip_as_fields_would():
    """A lazy Option holds the plan's evaluation; equality, model_dump order, JSON round trips, pickling and
    model_copy must behave as when estimate was an ordinary field (equality used to raise on the arrays)."""
    import pickle

    from zeroplanner.planner import Option, Plan

    s = build_scenario(model="llama-2-7b", gpus_per_node=8, stage=2)
    p1, p2 = plan(s), plan(s)
    assert p1 == p2 and p1.alternatives[0] == p2.alternatives[0]
    o = p2.variants[2]
    assert list(o.model_dump()) == ["label", "choice", "scenario", "estimate", "why_not"]
    for back in (Plan.model_validate(p1.model_dump()), Plan.model_validate_json(p1.model_dump_json())):
        assert back == p1 and back.alternatives[0].estimate.tokens_per_second > 0
    again = pickle.loads(pickle.dumps(p2.alternatives[1]))
    assert again == p2.alternatives[1] and again._source is None  # the estimate travels, not the evaluation
    moved = o.model_copy(update={"scenario": build_scenario(model="llama-2-7b", gpus_per_node=4, stage=2)})
    assert moved.estimate == o.estimate  # priced at the scenario it was evaluated at, as a field would keep it
    with pytest.raises(ValueError, match="needs an estimate"):
        Option(label="x", choice=o.choice, scenario=s)
