"""Whole-process times of the ``zeroplanner`` command, against a bare ``python -c "import numpy, pydantic"``.

Each command is run ``--repeats`` times (default 5) as a fresh process, the way a user runs it, one of each per round
(interleaved), and the median wall time is printed with its ratio to the bare import measured in the same run (both
on the same machine at the same load, so the ratio is the figure to compare across machines). The second row is the
floor of any command that validates input with pydantic: the bare import plus one pydantic model made and validated
(:data:`ONE_MODEL`); each command's ratio to it is printed too. The ``check`` rows time a DeepSpeed config with
"auto" values (tests/data/ds-configs/lf_z2_offload.json, LLaMA-Factory's ds_z2_offload_config.json) in the three ways ``check`` runs:
DeepSpeed's own config class only, ``--hf-trainer`` (transformers' and accelerate's fill in a child process, then
DeepSpeed's class in this one; the target is under 3 s on the 2-core development machine), and
``--no-library-check``.

    python3 benchmarks/bench_cli.py [--repeats 5]

Requires the ``zeroplanner`` console script on PATH (``pip install -e .``); DeepSpeed and transformers for the
``check`` rows with the library check (they are reported as skipped otherwise).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "tests" / "data" / "ds-configs" / "lf_z2_offload.json"


def commands() -> list[tuple[str, list[str], bool]]:
    exe = shutil.which("zeroplanner") or sys.exit("the zeroplanner command is not on PATH: pip install -e .")
    libs = all(importlib.util.find_spec(m) is not None for m in ("deepspeed", "transformers"))
    return [
        ("bare: python -c 'import numpy, pydantic'", [sys.executable, "-c", "import numpy, pydantic"], True),
        (FLOOR, [sys.executable, "-c", ONE_MODEL], True),
        ("zeroplanner estimate", [exe, "estimate"], True),
        ("zeroplanner recommend --model llama-2-70b --nodes 4", [exe, "recommend", "--model", "llama-2-70b",
                                                                 "--nodes", "4"], True),
        ("zeroplanner check CONFIG --no-library-check", [exe, "check", str(CONFIG), "--no-library-check"], True),
        ("zeroplanner check CONFIG (DeepSpeedConfig)", [exe, "check", str(CONFIG)], libs),
        ("zeroplanner check CONFIG --hf-trainer", [exe, "check", str(CONFIG), "--hf-trainer"], libs),
    ]


FLOOR = "floor: the same + one pydantic model, validated"
ONE_MODEL = "import numpy, pydantic\nclass A(pydantic.BaseModel):\n    x: int\nA(x=1)"
"""The floor of any command that validates its input with pydantic: ``import pydantic`` is lazy (pydantic 2 loads
its model machinery when the first model class is made), so the bare import leaves out what the first model costs:
pydantic.main and its schema builder, the plugin loader (importlib.metadata) and its scan of every installed
distribution's entry points (``PYDANTIC_DISABLE_PLUGINS`` skips the scan, not the import). On the 2-core build
machine (2026-12-07, six runs) that took the process from the bare import's 0.13-0.18 s to 1.33-1.94x it."""

CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
"""The commands' environment: an installed command's, with Python's bytecode cache. A shell that sets
PYTHONDONTWRITEBYTECODE (this build machine's does) made every run compile each module edited since its cached
bytecode again, and the warm-up below could not cache it: 25 ms of recommend's 0.33 s after one session's edits
(cProfile: source_to_code 14 -> 39 ms), which read as a slowdown against an unedited checkout."""


def wall_seconds(cmd: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=CHILD_ENV)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):  # 1: the config has an error or does not fit, which is still a full run
        sys.exit(f"{' '.join(cmd)} exited {done.returncode}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = commands()
    run(rows, args.repeats)


def run(rows: list[tuple[str, list[str], bool]], repeats: int) -> None:
    """Time ``rows`` (:func:`commands`; the first is the bare import) ``repeats`` times each, print the medians and
    their ratios to the first (benchmarks/bench_costmodel.py --cli calls this too)."""
    for _, cmd, ok in rows:  # one warm-up each: the first run after an install compiles bytecode
        if ok:
            wall_seconds(cmd)
    # interleaved (one of each command per round): a change in the machine's load falls on every row alike
    times: list[list[float]] = [[] for _ in rows]
    for _ in range(repeats):
        for i, (_, cmd, ok) in enumerate(rows):
            if ok:
                times[i].append(wall_seconds(cmd))
    bare = floor = None
    print(f"median of {repeats} whole-process runs, interleaved; ratio to the bare import measured in this run "
          "(and to the one-model floor)")
    for (name, cmd, ok), seconds in zip(rows, times):
        if not ok:
            print(f"{name:58s}  skipped (DeepSpeed or transformers not installed)")
            continue
        median = statistics.median(seconds)
        if bare is None:
            bare = median
        elif name == FLOOR:
            floor = median
        extra = f"  {median / floor:5.2f}x the floor" if floor is not None and name != FLOOR else ""
        print(f"{name:58s} {median:6.2f} s  {median / bare:5.2f}x{extra}")


if __name__ == "__main__":
    main()
