"""zeroplanner.deepspeed.library: DeepSpeed's own config classes (and transformers' fill) on planted mistakes agree with
zeroplanner's key tables, for the client each rule names, and the world size is the scenario's."""

from __future__ import annotations

import copy

import pytest

from zeroplanner.deepspeed import from_deepspeed_config, to_deepspeed_config
from zeroplanner.deepspeed.lint import lint
from zeroplanner.pitfalls import config_checked
from tests.core.test_dsconfig import scenario

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")
from zeroplanner.deepspeed.library import library_findings  # noqa: E402

BASE = scenario(2, nodes=1)  # 8 GPUs, micro 2 x accumulation 4


def planted(mode: str, **changes):
    config = to_deepspeed_config(BASE, mode)
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return config


CASES = [  # (id, mode, config, rule the tables report)
    ("stage_7", "deepspeed", planted("deepspeed", zero_optimization__stage=7), "wrong_type"),
    ("offload_device_gpu", "deepspeed", planted("deepspeed", zero_optimization__offload_optimizer={"device": "gpu"}),
     "wrong_type"),
    ("bf16_loss_scale", "deepspeed", planted("deepspeed", bf16__loss_scale=0), "unknown_key"),
    ("zero_typo", "hf_trainer", planted("hf_trainer", zero_optimization__overlap_com=True), "unknown_key"),
    ("tp_typo", "deepspeed", planted("deepspeed", tensor_parallel={"autotp_size": 2, "tp_sise": 2}), "unknown_key"),
    ("autotp_not_int", "deepspeed", planted("deepspeed", tensor_parallel={"autotp_size": "two"}), "wrong_type"),
    ("bucket_5e8_string", "deepspeed", planted("deepspeed", zero_optimization__reduce_bucket_size="5e8"),
     "integer_type"),
    ("batch_mismatch", "deepspeed", planted("deepspeed", train_batch_size=7), "batch_mismatch"),
    ("batch_mismatch_hf", "hf_trainer", planted("hf_trainer", train_batch_size=7), "batch_mismatch"),
    ("fp16_and_bf16", "deepspeed", planted("deepspeed", fp16={"enabled": True}), "fp16_and_bf16"),
    ("removed_amp", "deepspeed", planted("deepspeed", amp={"enabled": True}), "removed_key"),
    ("auto_batch_raw", "deepspeed", planted("deepspeed", train_micro_batch_size_per_gpu="auto"), "auto_outside_hf"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_planted_error_found_by_tables_and_by_the_library(case):
    _, mode, config, rule = case
    s, parsed = from_deepspeed_config(copy.deepcopy(config), base=BASE, mode=mode)
    table = parsed + lint(config, s, mode)
    assert rule in {f.rule for f in table if config_checked(f)}
    library = library_findings(config, s, mode)
    assert library, "DeepSpeed's own classes accept what the tables call an error"
    keyed = {f.key for f in library if f.key}
    assert keyed <= {f.key for f in table if f.severity == "error"}


def test_generated_configs_pass_the_library_under_both_clients():
    for s in (BASE, scenario(3, opt="cpu", par="cpu", nodes=2), scenario(1, precision="fp16", optimizer="sgd")):
        for mode in ("deepspeed", "hf_trainer"):
            assert library_findings(to_deepspeed_config(s, mode), s, mode) == [], (s.zero, mode)


def test_world_size_is_the_data_parallel_degree():
    """DeepSpeedConfig's batch assertion runs with the scenario's data-parallel degree: 2 x 4 x 8 = 64 passes on
    8 GPUs and fails on 16 (without the stand-in it would silently use world size 1 and fail both)."""
    config = to_deepspeed_config(BASE)
    assert config["train_batch_size"] == 64
    assert library_findings(config, BASE) == []
    two_nodes = scenario(2, nodes=2)
    found = library_findings(config, two_nodes)
    assert [f.rule for f in found] == ["deepspeed_rejects"] and "64 != 2 * 4 * 16" in found[0].message
    import deepspeed.runtime.config as ds_config
    import deepspeed.comm

    assert ds_config.dist is deepspeed.comm  # restored


def test_hf_fill_mismatch_in_zeroplanners_words():
    """transformers' trainer_config_finalize raises on a concrete value that disagrees with what the Trainer
    computes; the finding names the key and both values."""
    config = planted("hf_trainer", train_batch_size=7)
    found = library_findings(config, BASE, "hf_trainer")
    assert [f.rule for f in found] == ["hf_fill_mismatch"] and found[0].key == "train_batch_size"
    assert "7" in found[0].message and "64" in found[0].message


def test_auto_zero_key_silently_becomes_deepspeeds_default(monkeypatch):
    """auto_outside_hf outside the batch keys: DeepSpeedConfig accepts "auto" in zero_optimization and uses its
    default (500000000), not the value the user meant -- accepted, so a warning that says so ("drops it")."""
    import types

    import deepspeed.runtime.config as ds_config

    config = planted("deepspeed", zero_optimization__reduce_bucket_size="auto")
    monkeypatch.setattr(ds_config, "dist", types.SimpleNamespace(get_rank=lambda *a, **k: 0,
                                                                 get_world_size=lambda *a, **k: 8))
    assert ds_config.DeepSpeedConfig(config).zero_config.reduce_bucket_size == 500_000_000
    found = [f for f in lint(config) if f.rule == "auto_outside_hf"]
    assert [f.severity for f in found] == ["warning"] and "drops it" in found[0].message


def test_autotp_batch_arithmetic_uses_all_ranks_like_deepspeed(monkeypatch):
    """deepspeed.initialize builds DeepSpeedConfig without an mpu when AutoTP comes from the config
    (deepspeed/__init__.py), so its batch assertion counts all dist ranks: on 8 GPUs with autotp_size 2,
    train_batch_size = micro 1 x accumulation 8 x 8 = 64, not x 4, although ZeRO shards over 4."""
    import types

    import deepspeed.runtime.config as ds_config

    monkeypatch.setattr(ds_config, "dist", types.SimpleNamespace(get_rank=lambda *a, **k: 0,
                                                                 get_world_size=lambda *a, **k: 8))
    base = scenario(2, nodes=1, micro=1, accum=8)
    for tb, ok in ((64, True), (32, False)):
        config = {"train_batch_size": tb, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                  "zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2}}
        if ok:
            ds_config.DeepSpeedConfig(copy.deepcopy(config))
        else:
            with pytest.raises(AssertionError):
                ds_config.DeepSpeedConfig(copy.deepcopy(config))
        s, _ = from_deepspeed_config(config, base=base)
        assert s.cluster.data_parallel_degree == 4
        assert ("batch_mismatch" in {f.rule for f in lint(config, s)}) is not ok
        assert bool(library_findings(config, s)) is not ok


def test_hf_fill_that_fails_in_its_constructor_is_a_finding_not_a_crash():
    """HfTrainerDeepSpeedConfig's constructor already reads zero_optimization (.get on it): a non-object block
    raised AttributeError out of library_findings; it is the fill failing, reported as such."""
    found = library_findings({"train_micro_batch_size_per_gpu": 2, "zero_optimization": 5}, BASE, "hf_trainer")
    assert [f.rule for f in found] == ["hf_fill_mismatch"] and "AttributeError" in found[0].message


# ---------------------------------------------------------------------------------------------------------------
# The fill in a child process (``zeroplanner check --hf-trainer`` run as a command: hf_fill.FillChild)
# ---------------------------------------------------------------------------------------------------------------
CHILD_CASES = {  # what the child must answer exactly as this process does: accepted, the Trainer's and
    "accepted": planted("hf_trainer"),  # accelerate's refusals, and the constructor failing
    "trainer_mismatch": planted("hf_trainer", train_batch_size=7),
    "accelerate_auto_left": {**planted("hf_trainer"), "bfloat16": {"enabled": "auto"}},
    "constructor_fails": {"train_micro_batch_size_per_gpu": 2, "zero_optimization": 5},
}


def test_fill_in_a_child_gives_this_process_answer():
    """FillChild runs hf_fill.py as a file in a fresh interpreter (no zeroplanner import): its answer is the same
    filled config and findings as hf_fill.fill here, for an accepted config and each kind of refusal."""
    from zeroplanner.deepspeed import hf_fill
    from zeroplanner.deepspeed.library import fill_shape

    for name, config in CHILD_CASES.items():
        shape = fill_shape(config, BASE)
        with hf_fill.FillChild() as child:
            answer = child.fill(copy.deepcopy(config), shape)
        assert answer == hf_fill.fill(copy.deepcopy(config), shape), name
    assert hf_fill.fill(CHILD_CASES["accelerate_auto_left"], fill_shape({}, BASE))[1][0]["key"] == "bfloat16.enabled"


def test_a_child_that_cannot_answer_leaves_the_fill_to_this_process(monkeypatch):
    """A child that exits without an answer (here: an interpreter that is not Python) is no answer: fill() returns
    None and library_findings fills in this process, with the same findings as without a child."""
    from zeroplanner.deepspeed import hf_fill

    config = CHILD_CASES["trainer_mismatch"]
    monkeypatch.setattr(hf_fill.sys, "executable", "/bin/false")
    with hf_fill.FillChild() as child:
        assert child.fill(config, {"world_size": 8}) is None
    with hf_fill.FillChild() as child:
        assert library_findings(config, BASE, "hf_trainer", child) == library_findings(config, BASE, "hf_trainer")


def test_check_as_a_command_says_what_check_in_process_says(tmp_path, capsys):
    """The whole-process command (``python -m zeroplanner.cli``: the child fill) and main() in this process (the
    in-process fill) print the same JSON, on a config the fill accepts and one accelerate refuses."""
    import json
    import subprocess
    import sys

    from zeroplanner.cli import main

    for name in ("accepted", "accelerate_auto_left"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(CHILD_CASES[name]))
        args = ["check", str(path), "--hf-trainer", "--json"]
        rc = main(args)
        here = json.loads(capsys.readouterr().out)
        done = subprocess.run([sys.executable, "-m", "zeroplanner.cli", *args], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == rc, done.stderr[-2000:]
        assert json.loads(done.stdout) == here, name
