"""What the planner returns: :class:`Choice` (one configuration it can pick), :class:`Option` (a labelled,
evaluated configuration) and :class:`Plan` (its answer for one scenario). Frozen pydantic models; the names they
show (:attr:`Choice.label`) are written in :mod:`.reasons`, with the rest of the planner's English."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, computed_field, model_serializer

from ..advice import ClusterAdvice, MethodAdvice
from ..costmodel import Estimate
from ..specs import Scenario

if TYPE_CHECKING:
    from ..costmodel import Evaluation


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
        """``ZeRO-3 + CPU optimizer (full activation checkpointing, micro-batch 1 x 8 accumulation steps)``: the one
        name the CLI, the JSON and the app give this configuration (:func:`.reasons.choice_label`)."""
        from .reasons import choice_label  # reasons imports the grid, which builds Choices

        return choice_label(self)


class Option(_Out):
    """A labelled, evaluated configuration. ``why_not``: for an alternative predicted faster than the pick, why
    it was not picked (empty otherwise).

    ``estimate`` is built when first read: a plan lists 5 alternatives and 8 chart variants, and building their
    :class:`~zeroplanner.costmodel.Estimate` objects (about 0.25 ms each: warnings, the timeline's points) was half
    of a plan's time (docs/performance.md). :meth:`of` keeps the evaluation and the candidate's index instead;
    ``Option(..., estimate=est)`` takes a built one (an Estimate, or its ``model_dump()``, as
    ``Plan.model_validate(plan.model_dump())`` passes it). Either way ``estimate``, ``model_dump()`` (keys in the
    order label, choice, scenario, estimate, why_not), ``==`` and pickling behave as with an ordinary field: the
    estimate is built first where its value matters (comparing, pickling, ``model_copy`` with changes, which would
    otherwise price the old candidate at the new scenario). Raises ValueError when neither is given."""

    label: str
    choice: Choice
    scenario: Scenario
    why_not: str = ""
    _source: Any = PrivateAttr(default=None)

    def __init__(self, *, estimate: Estimate | dict | None = None, _source: tuple | None = None,
                 **data: Any) -> None:
        if estimate is None and _source is None:
            raise ValueError("Option needs an estimate (or Option.of(values, index, ...))")
        super().__init__(**data)
        if estimate is not None:
            if not isinstance(estimate, Estimate):
                estimate = Estimate.model_validate(estimate)
            self.__dict__["estimate"] = estimate  # cached_property's slot: read as is
        else:
            self._source = _source

    @classmethod
    def of(cls, values: Evaluation, index: int | tuple[int, ...], **data: Any) -> Option:
        """An Option whose estimate is :func:`~zeroplanner.costmodel.evaluate.estimate_from_values` of candidate
        ``index`` of ``values`` (an :func:`~zeroplanner.costmodel.evaluate` result), at ``data["scenario"]``, built
        when first read. ``data``: the other fields."""
        return cls(_source=(values, index), **data)

    @computed_field  # type: ignore[prop-decorator]
    @cached_property
    def estimate(self) -> Estimate:
        """The configuration's :class:`~zeroplanner.costmodel.Estimate` (built once, on first read)."""
        from ..costmodel.evaluate import estimate_from_values

        values, index = self._source
        return estimate_from_values(self.scenario, values, index)

    @model_serializer(mode="wrap")
    def _in_field_order(self, handler) -> dict[str, Any]:
        """``model_dump()`` with ``estimate`` where it stood as a field, before ``why_not``."""
        out = handler(self)
        if isinstance(out, dict) and "estimate" in out and "why_not" in out:
            out["why_not"] = out.pop("why_not")
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Option):
            return NotImplemented
        return (self.label, self.choice, self.scenario, self.why_not, self.estimate) == \
            (other.label, other.choice, other.scenario, other.why_not, other.estimate)

    __hash__ = None  # type: ignore[assignment]  # an Estimate holds lists: never hashable

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Option:
        if update:
            self.estimate  # priced at this Option's own scenario before a field changes
        return super().model_copy(update=update, deep=deep)

    def __getstate__(self) -> dict[Any, Any]:
        self.estimate  # a pickle carries the Estimate, not the whole plan's evaluation
        state = super().__getstate__()
        state["__pydantic_private__"] = {**(state.get("__pydantic_private__") or {}), "_source": None}
        return state


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
