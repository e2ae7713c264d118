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


_SUBMODULES = ("advice", "catalog", "costmodel", "inputs", "pitfalls", "planner", "scenarios", "specs", "units")
"""Submodules reachable as attributes after ``import zeroplanner`` (``zeroplanner.costmodel.evaluate``), as when
the package imported them all up front."""


def _submodule(name: str):
    """Submodule ``name`` of :data:`_SUBMODULES`, by import statements, not a computed name (docs/security.md
    section 3). Absolute ones: ``from . import costmodel`` first asks this module for the attribute, which would
    come back here."""
    if name == "advice":
        import zeroplanner.advice as module
    elif name == "catalog":
        import zeroplanner.catalog as module
    elif name == "costmodel":
        import zeroplanner.costmodel as module
    elif name == "inputs":
        import zeroplanner.inputs as module
    elif name == "pitfalls":
        import zeroplanner.pitfalls as module
    elif name == "planner":
        import zeroplanner.planner as module
    elif name == "scenarios":
        import zeroplanner.scenarios as module
    elif name == "specs":
        import zeroplanner.specs as module
    else:
        import zeroplanner.units as module
    return module


def __getattr__(name: str):
    if name in _SUBMODULES:
        return _submodule(name)
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'zeroplanner' has no attribute {name!r}")
    value = getattr(_submodule(home[1:]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | set(_SUBMODULES))


__version__ = "0.1.0"

__all__ = [
    "Architecture", "Assumptions", "ClusterSpec", "Estimate", "GPUSpec", "NetworkSpec", "OffloadSpec", "Plan",
    "Scenario", "TrainingSpec", "ZeroSpec", "build_scenario", "deepspeed_estimate_table",
    "default_scenario", "estimate", "largest_model", "plan", "scaling", "__version__",
]
