"""The planner: evaluate every candidate configuration, keep those that fit, rank them, explain the choice.

One module per concern:

- :mod:`.grid` — the candidate grid (:func:`candidate_grid`: ZeRO stage, offload, checkpointing, micro-batch,
  ZeRO++, overlap_comm, reduce bucket, Ulysses and AutoTP degrees; what ``held`` fixes) and the way from a grid row
  to a :class:`Choice` and a scenario (:func:`apply_choice`).
- :mod:`.rank` — the ranking policy (:func:`rank_candidates`, documented there), the alternatives listed beside
  the pick, :func:`nearest_fit`.
- :mod:`.reasons` — every sentence the planner writes: configuration names, reasons, warnings, remedies.
- :mod:`.sweeps` — the chart variants (:data:`VARIANTS`) against node count (:func:`scaling`), model size
  (:func:`largest_model`) and sequence length (:func:`longest_sequence`), and the raw :func:`sweep`.
- :mod:`.models` — what it returns: :class:`Choice`, :class:`Option`, :class:`Plan`.
- :mod:`.search` — :func:`plan`, which composes them: grid -> one evaluation -> ranking -> reasons -> Plan.

Core package: imports the core only (no ipywidgets, bqplot or torch).
"""

from __future__ import annotations

from .grid import (AUTOTP_DEGREES, SEARCH_INPUTS, SP_MIN_SEQUENCE_TOKENS, apply_choice, autotp_degrees,
                   candidate_grid, quantized_zeropp_allowed, sequence_parallel_options, split_values, varied_axes)
from .models import Choice, Option, Plan
from .rank import DEFAULT_TOLERANCE, PREFERENCE_ORDER, nearest_fit, rank_candidates
from .reasons import PREFERENCE_TEXT, ZERO_PP_PAPER, choice_changes, largest_limit_text, step_breakdown, zeropp_parts
from .search import plan
from .sweeps import (GRID_TOP, LIMIT_NAMES, LONGEST_SEQUENCE_QUANTUM, VARIANTS, largest_model, largest_model_limits,
                     longest_sequence, scaling, sweep, variant_candidates, variant_options)

_split_values = split_values  # the names tests/core/test_planner_one_evaluate.py imports
_variant_candidates = variant_candidates

__all__ = ["Choice", "Option", "Plan", "plan", "varied_axes", "SEARCH_INPUTS", "nearest_fit", "step_breakdown",
           "scaling", "largest_model", "largest_model_limits", "largest_limit_text", "sweep", "candidate_grid",
           "longest_sequence", "sequence_parallel_options",
           "apply_choice", "VARIANTS", "zeropp_parts"]
