"""The cost model: per-GPU memory by term, host RAM / NVMe, communication, compute, step time.

Pure numpy + pydantic. ``estimate(scenario)`` for one scenario; ``evaluate(make_context(s), candidates)`` for
vectorised sweeps.
"""

from .context import Candidates, Context, make_context
from .deepspeed_estimator import DeepSpeedEstimateRow, deepspeed_estimate_table
from .evaluate import Estimate, MemoryBreakdown, Term, estimate, evaluate

__all__ = [
    "Candidates", "Context", "make_context", "evaluate", "estimate", "Estimate", "MemoryBreakdown", "Term",
    "deepspeed_estimate_table", "DeepSpeedEstimateRow",
]
