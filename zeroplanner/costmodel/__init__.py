"""The cost model: per-GPU memory by term, host RAM / NVMe, communication, compute, step time.

Pure numpy + pydantic. ``estimate(scenario)`` for one scenario (an :class:`Estimate`);
``evaluate(make_context(s), candidates)`` for vectorised sweeps (an :class:`Evaluation`: one frozen dataclass of
arrays shaped like the candidates, its fields named like Estimate's, ``ev.per_gpu_bytes.parameters``,
``ev.communication.exposed_seconds_per_step``, ``ev.step_peak.bytes``; ``ev.at(i)`` is candidate ``i``).

How to add a cost term
----------------------
A term's number is computed by an expression string, the same string explain mode prints
(:mod:`.terms`); :data:`.terms.TERM_INFO` says once what the term is called and where its value lives, and
everything that shows a term (charts, explain panel, tutorial, report) reads that registry. For a step-time term
(say the seconds per step of gradient clipping, ``t_clip``):

1. **The expression**: in ``costmodel/evaluate.py`` :func:`~.evaluate.step_terms`, one
   ``d("t_clip", [(label, expression, condition), ...])`` after the quantities it uses, and ``t_clip`` added to
   ``t_step``'s parts. Every name in an expression (its inputs and ``t_clip`` itself) needs a ``Symbol`` in
   ``costmodel/terms.py`` :data:`~.terms.SYMBOLS` (LaTeX, unit, words); a new input also goes into ``env`` there.
   :data:`~.evaluate.STEP_OWNERS` says which explained term shows its formula as a "where" line.
2. **The registry**: a ``TermInfo(...)`` row in ``costmodel/terms.py`` ``_INFO`` (label, title, symbol, category
   "time", unit "seconds", colour, words, formula in words, source) with ``field="clip_seconds_per_step"`` and
   ``quantity="t_clip"``. The maps of where a term lives (:data:`~.terms.TERM_FIELDS`,
   :data:`~.terms.TIME_TERM_QUANTITIES`) are derived from these two. To draw it as its own bar segment, add a
   ``Segment`` to :data:`~.terms.TIME_SEGMENTS`.
3. **The dataclass**: the field ``clip_seconds_per_step: Value`` in ``costmodel/evaluation.py``
   :class:`Evaluation`, filled in :func:`~.evaluate.evaluate` from ``v["t_clip"]``.
4. **The Estimate**: the field ``clip_seconds_per_step: float = 0.0`` on :class:`Estimate` (``evaluate.py``),
   set in :func:`~.evaluate.estimate_from_values` from ``float(v.clip_seconds_per_step)``. Same name, same path:
   ``term_value(est, "clip")`` and ``term_value(ev, "clip")`` read the same number.
5. **Explain mode**: a function ``clip(scenario)`` returning ``_time(scenario, "clip")`` in
   ``costmodel/explain_terms.py``, listed in its ``TIME_FUNCTIONS`` (hence ``ALL_FUNCTIONS``, ``explain.KEYS``).
6. **Tests**: ``tests/core/test_evaluation.py`` checks that every ``TermInfo.field`` resolves on both classes to
   the same value; extend ``tests/core/test_formula_reevaluation.py`` with a scenario where the term is not 0
   (every displayed formula is re-evaluated from its displayed numbers; every part must show non-zero in some
   scenario). If the planner's numbers move on purpose, rewrite the goldens
   (``python3 -m tests.core.test_recommend_golden``) and say why in the commit.

A memory term is the same with ``costmodel/memory.py``: a ``*_parts`` function of ``(label, expression,
condition)`` rows, its key in ``memory_term_parts`` and :data:`~.terms.MEMORY_TERM_KEYS` (the chart's order),
``field="per_gpu_bytes.<key>"`` in its ``TermInfo``, a field of :class:`~.evaluation.MemoryArrays` and of
:class:`MemoryBreakdown` (both are built from ``MEMORY_TERM_KEYS``: a missing one fails at once), the sum in
``memory_terms``, the phases of the step that hold it (``costmodel/timeline.py``: the step's peak decides the
fit), and a function in ``explain_terms.MEMORY_FUNCTIONS``. A new *part* of an existing term is one more row in
its parts list (and a ``Symbol`` per new input name): nothing else changes. docs/architecture.md has the same
steps.
"""

from .context import Candidates, Context, make_context
from .deepspeed_estimator import DeepSpeedEstimateRow, deepspeed_estimate_table
from .evaluate import Estimate, MemoryBreakdown, Term, estimate, evaluate
from .evaluation import Evaluation

__all__ = [
    "Candidates", "Context", "make_context", "evaluate", "Evaluation", "estimate", "Estimate", "MemoryBreakdown",
    "Term", "deepspeed_estimate_table", "DeepSpeedEstimateRow",
]
