"""What :func:`~.evaluate.evaluate` returns: one typed, frozen :class:`Evaluation` per call, its fields named like
:class:`~.evaluate.Estimate`'s.

Every field is an array shaped like the candidates (float; bool for the fit verdicts; int for degrees and the
peak's phase index). A quantity :class:`~.evaluate.Estimate` reports has the name and the nesting it has there:
``ev.per_gpu_bytes.parameters`` is ``est.per_gpu_bytes.parameters`` for every candidate,
``ev.communication.exposed_seconds_per_step`` is ``est.communication.exposed_seconds_per_step``,
``ev.step_peak.bytes`` is ``est.step_peak.bytes``, so one dotted path (:attr:`~.terms.TermInfo.field`) finds a
term's value in both. :meth:`Evaluation.at` is one candidate's values (Python scalars in the same fields; what
``estimate_from_values`` builds the Estimate from); :meth:`~Evaluation.take`, :meth:`~Evaluation.split` and
:meth:`~Evaluation.concat` cut and join evaluations the way :meth:`~.context.Candidates.take` and
:meth:`~.context.Candidates.concat` cut and join their candidates (the planner evaluates its grid and the chart
variants in one call and splits the result).

Pure numpy; no UI imports.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, TypeVar, Union

import numpy as np

Value = Union[np.ndarray, float, int, bool]
"""A field's value: an array over the candidates, or (:meth:`Evaluation.at`) one candidate's Python scalar."""

_G = TypeVar("_G", bound="_Group")


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class _Group:
    """Leaf-wise operations shared by :class:`Evaluation` and its nested groups."""

    __slots__ = ()

    @classmethod
    def _join(cls: type[_G], items: Sequence[_G], leaf: Callable[[list], Any]) -> _G:
        """One ``cls`` whose every leaf is ``leaf`` of the same leaf of each of ``items`` (nested groups
        recursively)."""
        out = {}
        for name in _names(cls):
            values = [getattr(it, name) for it in items]
            first = values[0]
            out[name] = type(first)._join(values, leaf) if isinstance(first, _Group) else leaf(values)
        return cls(**out)

    def _map(self: _G, leaf: Callable[[Any], Any]) -> _G:
        return self._fork(lambda value: (leaf(value),))[0]

    def _fork(self: _G, leaf: Callable[[Any], Sequence[Any]]) -> list[_G]:
        """One ``type(self)`` per value ``leaf`` returns for each leaf (all return as many): the k-th group's
        every leaf is the k-th value of ``leaf`` of the same leaf of ``self`` (nested groups recursively). What
        :meth:`_map` with one ``leaf`` per output would give, visiting each leaf once."""
        cls = type(self)
        names = _names(cls)
        forked = [v._fork(leaf) if isinstance(v, _Group) else leaf(v) for v in (getattr(self, n) for n in names)]
        return [cls(**dict(zip(names, values))) for values in zip(*forked)]


@dataclass(frozen=True, slots=True)
class MemoryArrays(_Group):
    """Per-GPU bytes by term, as :class:`~.evaluate.MemoryBreakdown` (``Estimate.per_gpu_bytes``): each term at
    its own maximum, and their sum ``total``."""

    parameters: Value
    gradients: Value
    optimizer_states: Value
    activations: Value
    buffers: Value
    overhead: Value
    total: Value


@dataclass(frozen=True, slots=True)
class CommunicationArrays(_Group):
    """Per-GPU communication per optimizer step, as :class:`~.evaluate.Communication`
    (``Estimate.communication``): bytes sent, seconds on the wire, seconds exposed (incl. the ZeRO host overhead),
    the exposed collectives alone, and the message bytes per collective (``by_collective``)."""

    bytes_per_gpu_per_step: Value
    seconds_per_step: Value
    exposed_seconds_per_step: Value
    collectives_exposed_seconds_per_step: Value
    """The exposed collectives without the ZeRO host overhead (module and gradient hooks)."""
    all_reduce: Value
    reduce_scatter: Value
    all_gather: Value
    all_to_all: Value
    """Ulysses' all-to-alls and position_ids all-gathers (0 without sequence parallelism)."""


class TimelineStore:
    """The timeline of one :func:`~.evaluate.evaluate` call, shared by every evaluation cut from it: each point's
    phase and label, the term names, and :attr:`stack`, bytes per GPU shaped (points, terms, candidates flat).

    Made from a :class:`~.timeline.Timeline` it keeps the timeline's rows (:attr:`~.timeline.Timeline.rows`: per
    point and term an array that broadcasts to the candidates' shape or a scalar, None for 0, or how the runtime
    term is computed) and builds :attr:`stack` only when it is read; :meth:`column` reads one candidate's bytes
    from the rows without it."""

    __slots__ = ("phases", "labels", "names", "_stack", "_rows", "_shape")

    def __init__(self, phases: tuple[str, ...], labels: tuple[str, ...], names: tuple[str, ...],
                 stack: np.ndarray | None = None, *, rows=None, shape: tuple[int, ...] = ()):
        self.phases, self.labels, self.names = phases, labels, names
        self._stack, self._rows, self._shape = stack, rows, shape

    @classmethod
    def from_timeline(cls, points) -> TimelineStore:
        """From a costmodel/timeline.py :class:`~.timeline.Timeline`: its stack when it has one (candidates
        flattened: a view), else its rows (the stack is built when read)."""
        from .timeline import TIMELINE_TERMS

        st = points.stack
        if st is not None:
            return cls(points.phases, points.labels, TIMELINE_TERMS, st.reshape(st.shape[0], st.shape[1], -1))
        return cls(points.phases, points.labels, TIMELINE_TERMS, rows=points.rows, shape=points.shape)

    @property
    def stack(self) -> np.ndarray:
        """Bytes per GPU shaped (points, terms, candidates flat); built from the rows when first read."""
        if self._stack is None:
            from .timeline import stack_rows

            st = stack_rows(self._rows, self._shape)
            self._stack = st.reshape(st.shape[0], st.shape[1], -1)
        return self._stack

    def column(self, flat: int) -> np.ndarray:
        """Candidate ``flat``'s bytes (its index with the candidates flattened), shaped (points, terms): the same
        values as ``stack[:, :, flat]``."""
        if self._stack is not None:
            return self._stack[:, :, flat]
        from .timeline import row_at

        shape = self._shape
        flat = flat + math.prod(shape) if flat < 0 else flat  # as the stack's indexing reads -1
        at = np.unravel_index(flat, shape) if len(shape) > 1 else (flat,)
        return np.array([row_at(row, at, shape) for row in self._rows], dtype=np.float64)


@dataclass(frozen=True, slots=True)
class TimelineArrays(_Group):
    """The step's timeline (costmodel/timeline.py points), as ``Estimate.step_peak.timeline``: a shared
    :class:`TimelineStore` and, per candidate, its column there (``index``: an int array shaped like the
    candidates, or one int after :meth:`Evaluation.at`). Cutting an evaluation cuts ``index`` only."""

    store: TimelineStore
    index: Value

    @classmethod
    def _join(cls, items, leaf):
        """``leaf`` of the indices; evaluations of different calls (:meth:`Evaluation.concat`) get one store with
        their columns side by side."""
        first = items[0].store
        if all(it.store is first for it in items):
            return cls(store=first, index=leaf([it.index for it in items]))
        offsets = np.cumsum([0] + [it.store.stack.shape[-1] for it in items[:-1]])
        store = TimelineStore(first.phases, first.labels, first.names,
                              np.concatenate([it.store.stack for it in items], axis=-1))
        return cls(store=store, index=leaf([np.asarray(it.index) + o for it, o in zip(items, offsets)]))

    def _fork(self, leaf):
        """``leaf`` of the indices; the store is shared (as :meth:`_join` keeps one store)."""
        return [type(self)(store=self.store, index=index) for index in leaf(self.index)]

    def by_point(self) -> dict[str, Value]:
        """``{"<point>.<term>": bytes}`` for every point and term: arrays shaped like the candidates (one value each
        after :meth:`Evaluation.at`), whatever store the evaluation was cut from."""
        st, idx = self.store, np.asarray(self.index)
        return {f"{i}.{k}": st.stack[i, j][idx] for i in range(len(st.phases)) for j, k in enumerate(st.names)}

    def column(self) -> np.ndarray:
        """One candidate's timeline (after :meth:`Evaluation.at`): bytes shaped (points, terms), the store's phases,
        labels and names giving the rows and columns (:meth:`TimelineStore.column`)."""
        return self.store.column(int(self.index))

    def points(self) -> list[tuple[str, str, dict[str, float]]]:
        """(phase, label, bytes by term) of each point, for one candidate (after :meth:`Evaluation.at`)."""
        st, col = self.store, self.column()
        return [(phase, label, dict(zip(st.names, col[p].tolist())))
                for p, (phase, label) in enumerate(zip(st.phases, st.labels))]


@dataclass(frozen=True, slots=True)
class StepPeakArrays(_Group):
    """The step's peak per GPU (costmodel/timeline.py), as :class:`~.evaluate.StepPeak` (``Estimate.step_peak``):
    bytes, the index of its phase in :data:`~.timeline.PHASES` (``StepPeak.phase`` is the name), the headroom
    left of the GPU's memory (bytes), whether that headroom is below the model's measured error (``risky``), and the
    timeline it is the peak of."""

    bytes: Value
    phase_index: Value
    headroom_bytes: Value
    risky: Value
    timeline: TimelineArrays


@dataclass(frozen=True, slots=True)
class Evaluation(_Group):
    """Every number of the cost model for every candidate (:func:`~.evaluate.evaluate`). Bytes, seconds per
    optimizer step, tokens/s, TFLOP/s; names as :class:`~.evaluate.Estimate`'s."""

    per_gpu_bytes: MemoryArrays
    per_node_cpu_bytes: Value
    """Host RAM per node for what is offloaded (before ``Assumptions.host_buffer_factor``)."""
    nvme_bytes: Value
    """NVMe per node."""
    step_peak: StepPeakArrays
    data_parallel_degree: Value
    """GPUs ZeRO shards over (Ulysses ranks included)."""
    batch_data_parallel_degree: Value
    """GPUs the batch is split over: data_parallel_degree / sequence_parallel_size."""
    sequence_parallel_size: Value
    communication: CommunicationArrays
    compute_seconds_per_step: Value
    achieved_fraction: Value
    offload_seconds_per_step: Value
    optimizer_seconds_per_step: Value
    fetch_overhead_seconds_per_step: Value
    """ZeRO-3 module-hook host time the GPU waits for (part of communication.exposed_seconds_per_step)."""
    hook_seconds_per_step: Value
    """ZeRO-2/3 gradient-hook host time (part of communication.exposed_seconds_per_step)."""
    autotp_seconds_per_step: Value
    """AutoTP's all-reduces, exposed (part of communication.exposed_seconds_per_step)."""
    sp_all_to_all_seconds_per_step: Value
    """Ulysses' all-to-alls, exposed (part of communication.exposed_seconds_per_step; 0 without Ulysses)."""
    checkpoint_offload_seconds_per_step: Value
    """ALST's checkpoint-offload copies (part of offload_seconds_per_step; 0 without checkpoint offload)."""
    step_seconds: Value
    tokens_per_second: Value
    tflops_per_gpu: Value
    mfu: Value
    fits_gpu: Value
    """The step's peak within the usable GPU memory."""
    fits_cpu: Value
    """per_node_cpu_bytes x host_buffer_factor within the node's RAM."""
    fits_nvme: Value
    fits: Value
    """fits_gpu & fits_cpu & fits_nvme."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The candidates' shape."""
        return np.shape(self.per_gpu_bytes.total)

    def at(self, index: int | tuple[int, ...]) -> Evaluation:
        """Candidate ``index`` (flat, or a multi-index into :attr:`shape`): the same fields as Python scalars
        (float, bool, int)."""
        flat = int(np.ravel_multi_index(index, self.shape)) if isinstance(index, tuple) else int(index)
        return self._map(lambda a: a.item(flat))

    def take(self, index) -> Evaluation:
        """The candidates ``index`` selects (numpy indexing of the candidate arrays, as
        :meth:`~.context.Candidates.take`); values that are not per candidate are kept."""
        shape = self.shape
        return self._map(lambda a: a[index] if np.shape(a) == shape else a)

    def split(self, *shapes: tuple[int, ...]) -> list[Evaluation]:
        """The evaluation of :meth:`~.context.Candidates.concat` of candidate sets cut back into one per set
        (``shapes`` in concatenation order); values that are not per candidate (scalars) are shared."""
        shapes = tuple((int(sh),) if isinstance(sh, (int, np.integer)) else tuple(sh) for sh in shapes)
        sizes = [math.prod(sh) for sh in shapes]
        total = sum(sizes)
        bounds = [0, *itertools.accumulate(sizes)]
        # (start, end, shape or None where the 1-D slice already has the shape)
        pieces = [(start, end, None if len(sh) == 1 else sh) for start, end, sh in zip(bounds, bounds[1:], shapes)]

        def cut(a):
            if isinstance(a, np.ndarray) and a.ndim and a.size == total:
                flat = a if a.ndim == 1 else a.reshape(-1)
                return [flat[start:end] if sh is None else flat[start:end].reshape(sh) for start, end, sh in pieces]
            return [a] * len(shapes)

        return self._fork(cut)

    @classmethod
    def concat(cls, *parts: Evaluation) -> Evaluation:
        """One flat (1-D) evaluation of ``parts``' candidates, in order (the values of
        :meth:`~.context.Candidates.concat` of their candidates); values that are not per candidate (scalars)
        are taken from the first."""
        n = int(np.prod(parts[0].shape))

        def joined(values: list):
            a = values[0]
            return np.concatenate([np.reshape(v, -1) for v in values]) if np.ndim(a) and np.size(a) == n else a

        return cls._join(parts, joined)


def field_value(obj: object, path: str) -> Any:
    """The value at the dotted attribute ``path`` ("per_gpu_bytes.parameters") of an :class:`Evaluation` or an
    :class:`~.evaluate.Estimate` (the same paths name the same quantities in both)."""
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj
