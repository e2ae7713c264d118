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


def test_submodules_are_attributes_after_import_zeroplanner():
    """The public names import on first use (PEP 562); the submodules `import zeroplanner` made reachable when it
    imported everything up front stay reachable (`zeroplanner.costmodel.evaluate`), in a fresh process."""
    import subprocess
    import sys

    code = ("import zeroplanner\n"
            "for name in ('advice', 'catalog', 'costmodel', 'inputs', 'pitfalls', 'planner', 'scenarios', 'specs',"
            " 'units'):\n"
            "    assert getattr(zeroplanner, name).__name__ == 'zeroplanner.' + name, name\n"
            "assert zeroplanner.costmodel.evaluate and zeroplanner.plan\n"
            "try:\n"
            "    zeroplanner.no_such_name\n"
            "except AttributeError:\n"
            "    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
