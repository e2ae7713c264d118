"""What `estimate` says about the step's peak (issue 27 acceptance): the JSON names the phase and gives the timeline
(bytes by term per point), the text says "peak in <phase>", and the timeline's points add up to the peak."""

from __future__ import annotations

import json

from zeroplanner.cli import main
from zeroplanner.costmodel.timeline import PHASES, TIMELINE_TERMS

ARGS = ["estimate", "--model", "llama-2-13b", "--gpus-per-node", "8"]


def test_estimate_json_names_the_peak_phase_and_gives_the_timeline(capsys):
    assert main([*ARGS, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    sp = d["step_peak"]
    assert sp["phase"] in PHASES
    points = sp["timeline"]
    assert [p["phase"] for p in points] == sorted((p["phase"] for p in points), key=PHASES.index)
    assert {p["phase"] for p in points} == set(PHASES)
    for p in points:
        assert set(p["bytes"]) == set(TIMELINE_TERMS) and sum(p["bytes"].values()) == p["total"] or \
            abs(sum(p["bytes"].values()) - p["total"]) <= len(TIMELINE_TERMS)  # each term rounded to a byte
    top = max(points, key=lambda p: p["total"])
    assert top["phase"] == sp["phase"] and abs(top["total"] - sp["bytes"]) <= 1
    assert sp["headroom_bytes"] == d["gpu_memory_bytes"] - sp["bytes"]
    assert d["fits_gpu"] == (sp["bytes"] <= d["gpu_memory_bytes"])


def test_estimate_text_says_peak_in_phase(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert any(f"peak in the {ph}: " in out for ph in PHASES)
    assert "headroom" in out


def test_gpu_only_parts_are_named_with_their_source(capsys):
    assert main([*ARGS, "--json"]) == 0
    parts = json.loads(capsys.readouterr().out)["step_peak"]["runtime_parts"]
    labels = " ".join(p["label"] for p in parts)
    assert "CUDA context" in labels and "cuBLAS workspace" in labels and "NCCL buffers" in labels
    assert "allocator slack" in labels
    assert all(p["source"] for p in parts)
    # the context is pytorch/pytorch#86509's lazy-loading measurement (zeroplanner/costmodel/gpu_runtime.py)
    assert parts[0]["bytes"] == 287_047_680
