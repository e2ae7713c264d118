"""The soak mode of benchmarks/load_voila.py (issue 15), tiny: 2 waves of 1 visitor with a pool of 1, pages closed
with their unload beacon so no wave waits for the culler. The full soak (6 waves of 20) is a benchmark, run by hand;
its figures are in docs/reliability.md."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..browserkit import CHROMIUM

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.browser
@pytest.mark.timeout(400)
def test_soak_runs_waves_and_records_memory_and_server_timings(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    pytest.importorskip("playwright")
    out, raw = tmp_path / "reliability.md", tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "load_voila.py"), "--sessions", "1", "--waves", "2", "--pool",
         "1", "--close", "unload", "--cull-idle-seconds", "60", "--session-timeout-seconds", "240",
         "--deadline-seconds", "360", "--output", str(out), "--json", str(raw)],
        cwd=ROOT, capture_output=True, text=True, timeout=380, env=dict(os.environ))
    report = json.loads(raw.read_text())
    waves = report["waves"]
    assert [w["wave"] for w in waves] == [1, 2], proc.stderr[-2000:]
    assert [s["ok"] for s in report["sessions"]] == [True, True], [s["error"] for s in report["sessions"]]
    # each wave's visitor had its own kernel, shut down by the page's beacon before the next wave
    ids = [s["kernel_id"] for s in report["sessions"]]
    assert len(set(ids)) == 2
    for w in waves:
        assert w["peak"]["kernels"] and w["after"] is not None
        assert len(w["after"]["kernels"]) == 1  # back to the refilled pool of 1
    # the server logged its widget-state time for each page, the browser the page's HTML time
    assert all(s["state_seconds"] is not None and s["state_seconds"] >= 0 for s in report["sessions"])
    assert all(s["html_seconds"] is not None and s["html_seconds"] > 0 for s in report["sessions"])
    assert report["tracebacks"] == 0
    assert report["extra_status"] == 503 and report["extra_full_page"]
    assert proc.returncode == (0 if report["passed"] else 1)
    text = out.read_text()
    assert "## Run 1: 2 waves of 1 simultaneous visitors, pool of 1" in text
    assert "**2 / 2**" in text
    assert re.search(r"\| 2 \| 1 / 1 \| [\d.]+ s \| [\d.]+ s \| \d+ MiB \| \d+ MiB \|", text), text
    assert "closed tabs" in text
