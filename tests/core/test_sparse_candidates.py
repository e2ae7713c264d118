"""Candidates kept at their axes' shapes (``Candidates.build(sparse=True)``, what ``planner.sweep`` evaluates)
give every value of the cost model bit for bit as the same candidates built at the full shape; the timeline's rows,
read one candidate at a time, give the values of its stacked array; and the masked zeros of a term's parts on large
arrays (``terms.where_zero``) are np.where's. Each value is compared as bytes, with its dtype and shape, so a changed
bit, a sign of a zero or a changed dtype fails."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from zeroplanner.costmodel import Candidates, evaluate, make_context, terms
from zeroplanner.costmodel.evaluate import fits
from zeroplanner.planner import sweep
from zeroplanner.scenarios import build_scenario

SCENARIOS = {
    "default": {},
    "stage3-nvme-13b": dict(stage=3, offload_optimizer="nvme", offload_param="nvme", model="llama-2-13b"),
    "qlora-70b-1-gpu": dict(model="llama-2-70b", qlora=True, lora_rank=16, gpus_per_node=1),
    "ulysses-8b-64k": dict(model="llama-3.1-8b", seq_len=65536, sequence_parallel_size=8, stage=3),
    "checkpoint-offload": dict(model="llama-3.1-8b", seq_len=32768, checkpoint_offload=True, stage=3),
    "autotp-13b": dict(model="llama-2-13b", autotp_size=2, stage=1),
    "moe-mixtral": dict(model="mixtral-8x7b", nodes=2, stage=3),
    "fp32-cpu-ranks": dict(model="qwen2.5-0.5b", precision="fp32", stage=0, gpus_per_node=2),
}
"""build_scenario inputs: the evaluate golden's kinds of run (tests/core/test_evaluate_golden.py); the last priced
for the engine's CPU ranks (Assumptions.device = "cpu": the timeline's offloaded term, no runtime term)."""


def _scenario(name: str):
    s = build_scenario(**SCENARIOS[name])
    if name.endswith("cpu-ranks"):
        s = s.model_copy(update={"assumptions": s.assumptions.model_copy(update={"device": "cpu"})})
    return s

AXES = dict(stage=[0, 1, 2, 3], offload_optimizer=[0, 1, 2], offload_param=[0, 2], checkpointing=[0, 1, 2],
            micro_batch=[1, 2, 4, 8], grad_accum=[1, 3, 16], nodes=[1, 2, 4, 8, 16, 32])
"""A grid of 5,184 candidates: at least terms._COPYTO_FROM and timeline._ROWS_FROM, so a term's parts over every
candidate take the masked copy and the timeline keeps its rows (asserted below)."""


def test_the_grid_takes_the_large_array_paths():
    from zeroplanner.costmodel import timeline

    size = int(np.prod([len(v) for v in AXES.values()]))
    assert size >= terms._COPYTO_FROM and size >= timeline._ROWS_FROM


def _grid(scenario, *, sparse: bool) -> Candidates:
    base = Candidates.from_scenario(scenario)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    grids = np.meshgrid(*AXES.values(), indexing="ij", sparse=sparse)
    fields.update(zip(AXES, grids))
    return Candidates.build(sparse=sparse, **fields)


def _leaves(obj, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if f.name == "timeline":
            out[prefix + "timeline.stack"] = v.store.stack[:, :, np.asarray(v.index).reshape(-1)]
        elif dataclasses.is_dataclass(v):
            out.update(_leaves(v, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = np.asarray(v)
    return out


def _same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for k in a:
        x, y = a[k], b[k]
        assert (x.dtype, x.shape) == (y.dtype, y.shape), k
        assert np.ascontiguousarray(x).tobytes() == np.ascontiguousarray(y).tobytes(), k


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_candidates_kept_at_their_axes_give_the_same_bits(name):
    """Every leaf of evaluate (the timeline point by point and term by term) and of fits: the same dtype, shape and
    bytes whether the grid's fields are kept at their axes' shapes or built at the full shape."""
    s = _scenario(name)
    ctx = make_context(s)
    dense, sparse = _grid(s, sparse=False), _grid(s, sparse=True)
    assert sparse.sparse and not dense.sparse and sparse.shape == dense.shape
    assert sparse.stage.shape == (4, 1, 1, 1, 1, 1, 1)  # kept at its axis: no copy over the other axes
    _same_bits(_leaves(evaluate(ctx, dense)), _leaves(evaluate(ctx, sparse)))
    _same_bits({k: np.asarray(v) for k, v in dataclasses.asdict(fits(ctx, dense)).items()},
               {k: np.asarray(v) for k, v in dataclasses.asdict(fits(ctx, sparse)).items()})


@pytest.mark.parametrize("name", ["default", "fp32-cpu-ranks", "ulysses-8b-64k"])
def test_large_arrays_zero_their_parts_as_np_where_does(name, monkeypatch):
    """The grid above terms._COPYTO_FROM candidates (zeros filled by np.copyto) against the same grid with every
    part through np.where."""
    s = _scenario(name)
    ctx = make_context(s)
    copied = _leaves(evaluate(ctx, _grid(s, sparse=False)))
    monkeypatch.setattr(terms, "_COPYTO_FROM", 10**12)
    _same_bits(copied, _leaves(evaluate(ctx, _grid(s, sparse=False))))


@pytest.mark.parametrize("name", ["default", "fp32-cpu-ranks", "checkpoint-offload", "qlora-70b-1-gpu"])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "full"])
def test_the_timelines_rows_give_what_the_stack_built_at_once_gives(name, sparse, monkeypatch):
    """From timeline._ROWS_FROM candidates the timeline keeps rows (totals summed per point, the runtime computed
    from them); below, it builds the stack at once and sums each term over all points. The same grid both ways:
    every leaf (the step's peak, its phase, the headroom, the timeline point by point) as bytes."""
    from zeroplanner.costmodel import timeline

    s = _scenario(name)
    ctx = make_context(s)
    rows = evaluate(ctx, _grid(s, sparse=sparse))
    assert rows.step_peak.timeline.store._rows is not None
    monkeypatch.setattr(timeline, "_ROWS_FROM", 10**12)
    stacked = evaluate(ctx, _grid(s, sparse=sparse))
    assert stacked.step_peak.timeline.store._rows is None
    _same_bits(_leaves(stacked), _leaves(rows))


def test_cutting_and_joining_an_evaluation_kept_as_rows(monkeypatch):
    """Evaluation.at / take / split / concat and the timeline's by_point on a rows-backed evaluation of sparse
    candidates give, as bytes, what they give on the same grid built full with the stack at once."""
    from zeroplanner.costmodel import Evaluation, timeline
    from zeroplanner.costmodel.evaluate import estimate_from_values

    s = _scenario("default")
    ctx = make_context(s)
    rows = evaluate(ctx, _grid(s, sparse=True))
    monkeypatch.setattr(timeline, "_ROWS_FROM", 10**12)
    stacked = evaluate(ctx, _grid(s, sparse=False))
    n = int(np.prod(rows.shape))
    pick = np.arange(0, n, 37)
    for a, b in ((rows.take(np.unravel_index(pick, rows.shape)), stacked.take(np.unravel_index(pick, rows.shape))),
                 (Evaluation.concat(rows, stacked), Evaluation.concat(stacked, stacked)),
                 (Evaluation.concat(stacked, rows).split(rows.shape, rows.shape)[1], stacked)):
        _same_bits(_leaves(a), _leaves(b))
        assert a.step_peak.timeline.by_point().keys() == b.step_peak.timeline.by_point().keys()
        for (k, x), y in zip(a.step_peak.timeline.by_point().items(), b.step_peak.timeline.by_point().values()):
            assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), k
    for i in (0, 1, n // 2, n - 1, (1, 2, 0, 1, 3, 2, 5)):
        x, y = rows.at(i), stacked.at(i)
        _same_bits(_leaves(x), _leaves(y))
        assert x.step_peak.timeline.column().tobytes() == y.step_peak.timeline.column().tobytes()
    assert (estimate_from_values(s, rows, 5).model_dump_json() == estimate_from_values(s, stacked, 5).model_dump_json())


@pytest.mark.parametrize("name", ["default", "fp32-cpu-ranks", "checkpoint-offload"])
@pytest.mark.parametrize("kept", [True, False], ids=["kept-at-axes", "full"])
def test_one_candidates_timeline_is_its_column_of_the_stack(name, kept):
    """TimelineStore.column (read from the timeline's rows, the runtime computed per candidate; what each Estimate's
    timeline is built from) is the stacked array's column, for every 5th candidate, on a GPU (the runtime term) and
    on CPU ranks (the offloaded term)."""
    from zeroplanner.costmodel.evaluation import TimelineStore

    s = _scenario(name)
    store = evaluate(make_context(s), _grid(s, sparse=kept)).step_peak.timeline.store
    rows_only = TimelineStore(store.phases, store.labels, store.names, rows=store._rows, shape=store._shape)
    flat = range(0, int(np.prod(store._shape)), 5)
    columns = [rows_only.column(i) for i in flat]
    assert rows_only._stack is None  # the columns were read from the rows
    stack = store.stack
    for i, col in zip(flat, columns):
        assert col.dtype == np.float64 and col.tobytes() == np.ascontiguousarray(stack[:, :, i]).tobytes(), i


def test_sweep_is_the_flattened_product():
    """planner.sweep (axes kept at their shapes) returns evaluate over the full product, flattened in C order, and
    each axis' value per candidate."""
    s = _scenario("default")
    axes = dict(stage=[0, 2, 3], checkpointing=[0, 2], micro_batch=[1, 2, 4], nodes=[1, 2, 8])
    values, got_axes = sweep(s, **axes)
    grids = np.meshgrid(*axes.values(), indexing="ij")
    base = Candidates.from_scenario(s)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update({k: g.reshape(-1) for k, g in zip(axes, grids)})
    want = evaluate(make_context(s), Candidates.build(**fields))
    assert values.shape == (54,)
    _same_bits(_leaves(want), _leaves(values))
    for k, g in zip(axes, grids):
        assert got_axes[k].tolist() == g.reshape(-1).tolist()
        got_axes[k][0] = 7  # the caller's own arrays (np.broadcast_to alone would give read-only views)
    one, got = sweep(s, micro_batch=[1, 2, 3])
    assert one.shape == (3,) and got["micro_batch"].flags.writeable


def test_sparse_candidates_take_and_concat_as_full_ones():
    s = _scenario("default")
    dense, sparse = _grid(s, sparse=False), _grid(s, sparse=True)
    index = (np.array([0, 3]), slice(None), 1)
    for a, b in ((dense.take(index), sparse.take(index)),
                 (Candidates.concat(dense, dense), Candidates.concat(sparse, dense))):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            assert (x.dtype, x.shape) == (y.dtype, y.shape) and x.tobytes() == y.tobytes(), f.name
        assert a.shape == b.shape and not b.sparse


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_where_zero_is_np_where(data):
    """terms.where_zero against np.where(applies, value, 0.0), bit for bit and dtype (negative zeros, NaN and
    infinities, int and float32 values, broadcasting)."""
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=70))
    applies = data.draw(hnp.arrays(np.bool_, shape))
    value_shape = data.draw(hnp.broadcastable_shapes(shape, max_dims=2))
    dtype = data.draw(st.sampled_from([np.float64, np.float32, np.int64]))
    elements = st.integers(-2**53, 2**53) if dtype == np.int64 \
        else (st.floats(allow_nan=True, allow_infinity=True, width=np.dtype(dtype).itemsize * 8) | st.just(-0.0))
    value = data.draw(hnp.arrays(dtype, value_shape, elements=elements))
    want = np.where(applies, value, 0.0)
    got = terms.where_zero(applies, value)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("n", [7, 5000])
def test_the_peaks_phase_is_the_first_point_at_the_maximum(n):
    """timeline.peak: the peak and the index of its phase, with ties (the first point wins) and NaN columns, are
    np.max's and np.argmax's, below and above timeline._ROWS_FROM candidates (a guard for any faster way to find
    them: a backward scan was tried, and lost to argmax in the sweep)."""
    from zeroplanner.costmodel.timeline import PHASES, Timeline, peak

    rng = np.random.default_rng(n)
    phases = ("forward",) * 4 + ("loss forward", "loss backward") + ("backward",) * 5 + ("optimizer step",)
    totals = rng.integers(0, 4, size=(len(phases), n)).astype(np.float64)  # many ties
    totals[:, 3] = np.nan if n > 10 else totals[:, 3]
    top, index = peak(Timeline(phases, phases, None, None, (n,), totals))
    lookup = np.array([PHASES.index(p) for p in phases])
    assert top.tobytes() == np.max(totals, axis=0).tobytes()
    assert index.dtype == lookup.dtype and np.array_equal(index, lookup[np.argmax(totals, axis=0)])
    totals[:, 3] = 1.0
    top, index = peak(Timeline(phases, phases, None, None, (n,), totals))
    assert np.array_equal(index, lookup[np.argmax(totals, axis=0)])
