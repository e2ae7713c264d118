"""The core (cost model, planner, config) imports no ipywidgets, bqplot or torch (DEVELOPERS.md Standards)."""

from __future__ import annotations

import json
import subprocess
import sys

CORE = ["zeroplanner", "zeroplanner.units", "zeroplanner.specs", "zeroplanner.catalog", "zeroplanner.costmodel",
        "zeroplanner.planner", "zeroplanner.scenarios", "zeroplanner.catalog.hfconfig", "zeroplanner.deepspeed",
        "zeroplanner.deepspeed.lint", "zeroplanner.deepspeed.library", "zeroplanner.pitfalls", "zeroplanner.inputs",
        "zeroplanner.share", "zeroplanner.report", "zeroplanner.cli", "zeroplanner.probe", "zeroplanner.calibrate"]
FORBIDDEN = ["ipywidgets", "bqplot", "torch", "deepspeed", "transformers", "voila"]


def test_core_imports_no_ui_or_torch():
    code = (
        "import importlib, json, sys\n"
        f"for m in {CORE!r}:\n"
        "    importlib.import_module(m)\n"
        "from zeroplanner import plan, default_scenario\nplan(default_scenario())\n"
        f"print(json.dumps(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
