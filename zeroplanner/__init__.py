"""zeroplanner: plan DeepSpeed ZeRO runs (memory, communication, step time, config) before renting GPUs.

Public API (pinned by tests/core/test_public_api.py)::

    from zeroplanner import build_scenario, estimate, plan
    s = build_scenario(model="llama-2-13b", nodes=2, network="ib-hdr")
    plan(s).choice
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .costmodel import Estimate, deepspeed_estimate_table, estimate
    from .planner import Plan, largest_model, plan, scaling
    from .scenarios import build_scenario, default_scenario
    from .specs import (Architecture, Assumptions, ClusterSpec, GPUSpec, NetworkSpec, OffloadSpec, Scenario,
                        TrainingSpec, ZeroSpec)

_HOMES = {
    **dict.fromkeys(("Estimate", "deepspeed_estimate_table", "estimate"), ".costmodel"),
    **dict.fromkeys(("Plan", "largest_model", "plan", "scaling"), ".planner"),
    **dict.fromkeys(("build_scenario", "default_scenario"), ".scenarios"),
    **dict.fromkeys(("Architecture", "Assumptions", "ClusterSpec", "GPUSpec", "NetworkSpec", "OffloadSpec", "Scenario",
                     "TrainingSpec", "ZeroSpec"), ".specs"),
}
"""Public name -> the module it lives in. Imported on first use (PEP 562), so ``zeroplanner estimate`` does not
import the planner and ``import zeroplanner.costmodel`` does not import the rest (its time:
benchmarks/bench_cli.py)."""


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home == ".costmodel":  # import statements, not a computed name (docs/security.md section 3)
        from . import costmodel as module
    elif home == ".planner":
        from . import planner as module
    elif home == ".scenarios":
        from . import scenarios as module
    elif home == ".specs":
        from . import specs as module
    else:
        raise AttributeError(f"module 'zeroplanner' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))


__version__ = "0.1.0"

__all__ = [
    "Architecture", "Assumptions", "ClusterSpec", "Estimate", "GPUSpec", "NetworkSpec", "OffloadSpec", "Plan",
    "Scenario", "TrainingSpec", "ZeroSpec", "build_scenario", "deepspeed_estimate_table",
    "default_scenario", "estimate", "largest_model", "plan", "scaling", "__version__",
]
