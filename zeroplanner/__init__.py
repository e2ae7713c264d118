"""zeroplanner: plan DeepSpeed ZeRO runs (memory, communication, step time, config) before renting GPUs.

Public API (pinned by tests/core/test_public_api.py)::

    from zeroplanner import build_scenario, estimate, plan
    s = build_scenario(model="llama-2-13b", nodes=2, network="ib-hdr")
    plan(s).choice
"""

from __future__ import annotations


from .costmodel import Estimate, deepspeed_estimate_table, estimate
from .planner import Plan, largest_model, plan, scaling
from .scenarios import build_scenario, default_scenario
from .specs import (
    Architecture,
    Assumptions,
    ClusterSpec,
    GPUSpec,
    NetworkSpec,
    OffloadSpec,
    Scenario,
    TrainingSpec,
    ZeroSpec,
)

__version__ = "0.1.0"

__all__ = [
    "Architecture", "Assumptions", "ClusterSpec", "Estimate", "GPUSpec", "NetworkSpec", "OffloadSpec", "Plan",
    "Scenario", "TrainingSpec", "ZeroSpec", "build_scenario", "deepspeed_estimate_table",
    "default_scenario", "estimate", "largest_model", "plan", "scaling", "__version__",
]
