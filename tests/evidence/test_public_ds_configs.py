"""`zeroplanner check` refuses what the engine refuses, on DeepSpeed configs public projects ship.

The configs: tests/data/public_ds_configs (49 files from 14 repositories; SOURCES.json gives each one's repository,
path and commit, and how the project launches it). The truth: tests/data/public_ds_configs/judged.json, each config
run on the real engine on one CPU rank the way its project launches it (the HF Trainer's ``train()`` for one step,
or ``deepspeed.initialize`` and one step; zeroplanner/calibrate/config_judge.py, benchmarks/judge_public_configs.py).
Both sides see the same dict on one GPU (``config_judge.for_one_rank``); verdicts caused by this CPU-only machine
(``environment``: NVMe offload without libaio, GPU-only optimizers) are not compared. A raw DeepSpeed config
without an optimizer block is judged with the optimizer such a script passes, torch's AdamW (SOURCES.json says
where a project passes DeepSpeedCPUAdam instead).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from zeroplanner.calibrate.config_judge import for_one_rank, judge_config
from zeroplanner.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "public_ds_configs"
SOURCES = json.loads((DATA / "SOURCES.json").read_text())
JUDGED = json.loads((DATA / "judged.json").read_text())["configs"]
COMPARED = [f for f, v in sorted(JUDGED.items()) if v["verdict"] in ("accepted", "refused")]
LIBRARIES = all(importlib.util.find_spec(m) for m in ("deepspeed", "transformers"))


def _check(file: str, mode: str, tmp_path: Path, capsys) -> list[dict]:
    config, _ = for_one_rank(json.loads((DATA / file).read_text()))
    path = tmp_path / file
    path.write_text(json.dumps(config))
    main(["check", str(path), "--gpus-per-node", "1", "--json", *(["--hf-trainer"] if mode == "hf_trainer" else [])])
    return [f for f in json.loads(capsys.readouterr().out)["findings"] if f["severity"] == "error"]


def test_the_corpus_is_sourced_and_judged():
    assert len(SOURCES) >= 25 and len({s["repo"] for s in SOURCES}) >= 8
    for s in SOURCES:
        assert (DATA / s["file"]).is_file() and len(s["commit"] or "") == 40 and s["url"].startswith("https://")
    assert set(JUDGED) == {s["file"] for s in SOURCES}
    assert len(COMPARED) >= 25
    assert any(v["verdict"] == "refused" for v in JUDGED.values())


@pytest.mark.skipif(not LIBRARIES, reason="the library check needs deepspeed and transformers")
@pytest.mark.parametrize("file", COMPARED)
def test_check_errors_exactly_when_the_engine_refuses(file, tmp_path, capsys):
    truth = JUDGED[file]
    errors = _check(file, truth["mode"], tmp_path, capsys)
    if truth["verdict"] == "refused":
        assert errors, f"the engine refused it ({truth['error']}), check gave no error"
    else:
        assert not errors, [e["message"] for e in errors]


ENGINE = LIBRARIES and importlib.util.find_spec("torch") is not None


@pytest.mark.engine
@pytest.mark.skipif(not ENGINE, reason="needs torch, deepspeed and transformers")
@pytest.mark.parametrize("file", ["huggingface__transformers__tests__deepspeed__ds_config_zero2_bf16.json",
                                  "axolotl-ai-cloud__axolotl__deepspeed_configs__zero2.json"])
def test_the_engine_gives_the_stored_verdict(file):
    """Two stored verdicts measured again: a refusal (the legacy ``bfloat16`` block with "auto", which the HF Trainer
    does not fill) and an acceptance."""
    stored = JUDGED[file]
    config, _ = for_one_rank(json.loads((DATA / file).read_text()))
    assert judge_config(config, stored["mode"])["verdict"] == stored["verdict"]
