"""The public surface is deliberate: __all__ is pinned (STYLE.md, httpx)."""

import zeroplanner

PINNED = [
    "Architecture", "Assumptions", "ClusterSpec", "Estimate", "GPUSpec", "NetworkSpec", "OffloadSpec", "Plan",
    "Scenario", "TrainingSpec", "ZeroSpec", "build_scenario", "deepspeed_estimate_table",
    "default_scenario", "estimate", "largest_model", "plan", "scaling", "__version__",
]


def test_all_is_pinned():
    assert sorted(zeroplanner.__all__) == sorted(PINNED)
    for name in PINNED:
        assert hasattr(zeroplanner, name)
