"""Ulysses sequence parallelism in configs (issue 13): read from DeepSpeed's ``sequence_parallel_size`` and
LLaMA-Factory's ``sequence_parallel`` block, written into the generated DeepSpeed JSON and accelerate's settings,
checked by lint, and the ``check`` / ``config`` command lines.

Rules the expected values come from (DeepSpeed 0.19.8, accelerate 1.15.0, transformers 5.24.0):

- DeepSpeed's batch assertion ``train_batch_size == micro * accumulation * world`` with world = ranks /
  ``sequence_parallel_size`` (runtime/config.py ``DeepSpeedConfig.__init__``: no mpu -> ``dist.get_world_size() /
  config["sequence_parallel_size"]``; the Ulysses mpu -> ``/ mpu.get_sequence_parallel_world_size()``);
- LLaMA-Factory's block (hiyouga/LLaMA-Factory src/llamafactory/model/model_utils/alst_config.py,
  ``ALSTConfig.to_deepspeed_config``): ``size``, ``ulysses.degree`` (default ``size``, capped at it), ``tiling``;
- accelerate: ``dp_replicate_size x dp_shard_size x sp_size = num_processes`` (concept_guides/
  sequence_parallelism.md) and ``train_batch_size = micro * accumulation * data_parallel_size`` (accelerator.py
  ``_prepare_deepspeed``).

The libraries' own acceptance of what is emitted is in tests/evidence/test_sequence_parallel_configs.py.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from zeroplanner.deepspeed import (
    deepspeed_train_batch_size,
    from_deepspeed_config,
    parallelism_config_kwargs,
    to_accelerate_config,
    to_deepspeed_config,
)
from zeroplanner.deepspeed.lint import lint
from zeroplanner.scenarios import build_scenario, default_scenario

from tests.helpers import DS_CONFIGS as CONFIGS_DIR

BASE = default_scenario()  # llama-2-7b (32 heads, 32 KV heads), 1 node x 8 GPUs, micro 1 x accumulation 8


def sp_scenario(sp: int, **inputs):
    return build_scenario(sequence_parallel_size=sp, **inputs)


def lf_block(**changes):
    """The block of tests/data/ds-configs/lf_z3_alst.json with changes (None removes a key)."""
    block = {"enabled": True, "size": 4, "mode": "ulysses",
             "ulysses": {"degree": 4, "seq_length_is_variable": True},
             "tiling": {"enabled": True, "chunk_size": 8192}}
    for key, value in changes.items():
        if value is None:
            block.pop(key, None)
        else:
            block[key] = value
    return block


def rules(findings, severity):
    return {f.rule for f in findings if f.severity == severity}


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes,degree,tiled", [
    ({}, 4, True),                                         # lf_z3_alst.json itself
    ({"ulysses": {"seq_length_is_variable": True}}, 4, True),  # no ulysses.degree: size
    ({"ulysses": {"degree": 8}}, 4, True),                  # degree > size: capped at size (ALSTConfig)
    ({"ulysses": {"degree": 2}}, 2, True),
    ({"tiling": None}, 4, False),                           # no tiling block: no sequence tiling
    ({"tiling": {"enabled": False}}, 4, False),
    ({"enabled": False}, 1, False),                          # LLaMA-Factory writes the block only when enabled
    ({"mode": "zigzag-ring"}, 1, False),                     # to_deepspeed_config writes mode "ulysses" only
    ({"size": 1, "ulysses": {"degree": 1}}, 1, False),
])
def test_llamafactory_block_sets_the_ulysses_degree_and_tiling(changes, degree, tiled):
    s, findings = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "sequence_parallel": lf_block(**changes)},
                                        base=BASE, mode="hf_trainer")
    assert s.cluster.sequence_parallel_size == degree
    assert (s.training.tiled_mlp, s.training.tiled_loss) == (tiled, tiled)
    assert "unknown_key" not in rules(findings, "warning") | rules(findings, "error")


def test_shipped_alst_config_priced_with_ulysses_degree_4():
    config = json.loads((CONFIGS_DIR / "lf_z3_alst.json").read_text())
    for mode in ("deepspeed", "hf_trainer"):
        s, findings = from_deepspeed_config(copy.deepcopy(config), base=BASE, mode=mode)
        assert s.cluster.sequence_parallel_size == 4 and s.training.tiled_mlp and s.training.tiled_loss
        assert not [f for f in findings if "unpriced" in f.rule and f.key.startswith("sequence_parallel")]
        assert "sequence_parallel_size" not in rules(lint(config, s, mode), "error")  # 4 divides 8 GPUs and 32 heads


def test_deepspeed_key_sets_the_degree_and_the_batch_arithmetic():
    """train_batch_size 32 with micro-batch 2 on 8 ranks and sequence_parallel_size 4: DeepSpeed derives
    accumulation = 32 / (2 * 8 / 4) = 8 (_set_batch_related_parameters over world / sp); without the key, 2."""
    config = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 4}
    s, findings = from_deepspeed_config(config, base=BASE)
    assert (s.cluster.sequence_parallel_size, s.training.micro_batch, s.training.grad_accum) == (4, 2, 8)
    assert any(f.rule == "sequence_parallel" and "8 / 4 = 2 ranks" in f.message for f in findings)
    s1, _ = from_deepspeed_config({k: v for k, v in config.items() if k != "sequence_parallel_size"}, base=BASE)
    assert (s1.cluster.sequence_parallel_size, s1.training.grad_accum) == (1, 2)
    assert "batch_mismatch" not in rules(lint(config, s), "error")
    assert "batch_mismatch" in rules(lint({**config, "gradient_accumulation_steps": 2}, s), "error")


def test_deepspeed_key_wins_over_a_disagreeing_block_with_a_warning():
    s, findings = from_deepspeed_config({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2,
                                         "sequence_parallel": lf_block()}, base=BASE)
    assert s.cluster.sequence_parallel_size == 2
    assert "sequence_parallel_mismatch" in rules(findings, "warning")


@pytest.mark.parametrize("raw", ["4", None, [4], 0, -2, 2.5])
def test_unusable_deepspeed_degree_is_priced_as_the_base_and_linted_as_an_error(raw):
    """Measured on DeepSpeed 0.19.8 (tests/evidence/test_error_rules.py ulysses_degree_deepspeed_refuses): "4",
    null, a list raise TypeError in DeepSpeedConfig, 0 ZeroDivisionError, -2 the batch assertion, 2.5 the
    Ulysses groups' RuntimeError."""
    config = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": raw}
    s, _ = from_deepspeed_config(config, base=BASE)
    assert s.cluster.sequence_parallel_size == 1
    errors = [f for f in lint(config, s) if f.severity == "error" and f.rule == "sequence_parallel_size"]
    assert errors and errors[0].key == "sequence_parallel_size"


@pytest.mark.parametrize("model,gpus,sp,why", [
    ("llama-2-7b", 8, 3, "does not divide the world size 8"),   # parallel_state_sp.py: 8 % 3
    ("llama-2-7b", 6, 3, "heads"),                              # 32 attention heads % 3
    ("qwen2.5-7b", 7, 7, "heads"),                              # 28 % 7 = 0 but 4 KV heads vs 7
])
def test_degree_the_cluster_or_model_cannot_take_is_an_error_naming_the_key(model, gpus, sp, why):
    base = build_scenario(model=model, gpus_per_node=gpus)
    for config, key in (({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": sp}, "sequence_parallel_size"),
                        ({"train_micro_batch_size_per_gpu": 1,
                          "sequence_parallel": lf_block(size=sp, ulysses={"degree": sp})}, "sequence_parallel")):
        s, findings = from_deepspeed_config(config, base=base)
        assert s.cluster.sequence_parallel_size == 1
        errors = [f for f in lint(config, s) if f.severity == "error" and f.rule == "sequence_parallel_size"]
        assert len(errors) == 1 and errors[0].key == key and why in errors[0].message


def test_hf_trainer_key_warns_that_it_turns_no_ulysses_on_and_errors_at_zero3():
    s = sp_scenario(4)
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "sequence_parallel_size": 4,
              "zero_optimization": {"stage": 2}}
    found = lint(config, s, "hf_trainer")
    assert "sequence_parallel_size" in rules(found, "warning") and "sequence_parallel_size" not in rules(found, "error")
    config["zero_optimization"]["stage"] = 3
    assert "sequence_parallel_size" in rules(lint(config, s, "hf_trainer"), "error")
    assert "sequence_parallel_size" not in rules(lint(config, s, "deepspeed"), "error")


# ----------------------------------------------------------------------------------------------------------------
# Emitting
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sp,nodes", [(2, 1), (4, 1), (8, 1), (4, 2), (16, 2)])
def test_generated_deepspeed_config_follows_deepspeeds_batch_rule(sp, nodes):
    s = sp_scenario(sp, model="llama-3.1-8b", nodes=nodes, micro_batch=2, grad_accum=3)
    config = to_deepspeed_config(s)
    world = 8 * nodes
    assert config["sequence_parallel_size"] == sp
    assert config["train_batch_size"] == deepspeed_train_batch_size(s) == 2 * 3 * world // sp
    assert "batch_mismatch" not in rules(lint(config, s), "error")
    assert from_deepspeed_config(config, base=s)[0] == s  # round trip


def test_no_sequence_parallel_key_without_ulysses():
    config = to_deepspeed_config(BASE)
    assert "sequence_parallel_size" not in config and config["train_batch_size"] == 1 * 8 * 8


def test_hf_variant_leaves_the_degree_and_batch_to_accelerate():
    """Under the HF Trainer the Trainer fills train_batch_size over all processes and accelerate then replaces it by
    micro x accumulation x data_parallel_size, so it is "auto"; the key stays out (zero.Init, see lint)."""
    s = sp_scenario(4, stage=3)
    config = to_deepspeed_config(s, mode="hf_trainer")
    assert config["train_batch_size"] == "auto" and "sequence_parallel_size" not in config
    assert config["train_micro_batch_size_per_gpu"] == 1 and config["gradient_accumulation_steps"] == 8
    assert not rules(lint(config, s, "hf_trainer"), "error")


@pytest.mark.parametrize("sp,nodes", [(4, 1), (8, 2)])
def test_accelerate_yaml_carries_the_parallelism_config_block(sp, nodes):
    s = sp_scenario(sp, nodes=nodes)
    data = yaml.safe_load(to_accelerate_config(s, main_process_ip="10.0.0.1" if nodes > 1 else None))
    pc = data["parallelism_config"]
    assert pc["parallelism_config_sp_size"] == sp and pc["parallelism_config_sp_backend"] == "deepspeed"
    assert pc["parallelism_config_dp_replicate_size"] * pc["parallelism_config_dp_shard_size"] * sp \
        == data["num_processes"] == 8 * nodes
    assert "parallelism_config" not in yaml.safe_load(to_accelerate_config(BASE))


def test_parallelism_config_refuses_what_it_cannot_write():
    with pytest.raises(ValueError, match="sequence_parallel_size is 1"):
        parallelism_config_kwargs(BASE)
    s = sp_scenario(2)
    s = s.model_copy(update={"cluster": s.cluster.model_copy(update={"tensor_parallel_size": 2})})
    with pytest.raises(ValueError, match="tensor_parallel_size 2"):
        parallelism_config_kwargs(s)
    with pytest.raises(ValueError, match="sequence_parallel_size"):
        to_accelerate_config(s)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
def test_cli_check_alst_config_priced_for_ulysses_degree_4(cli_main, capsys):
    code = cli_main(["check", str(CONFIGS_DIR / "lf_z3_alst.json"), "--gpus-per-node", "8", "--no-library-check"])
    out = capsys.readouterr().out
    priced = next(line for line in out.splitlines() if line.startswith("Priced for:"))
    read_as = next(line for line in out.splitlines() if line.startswith("Read as:"))
    assert "Ulysses degree 4" in priced and "tiled MLP" in priced and "tiled loss" in priced
    assert "data-parallel degree 2 (Ulysses sequence-parallel 4" in read_as  # 8 GPUs / 4
    assert code == 1  # the file's own errors ("auto" with raw DeepSpeed, the bf16 block), as before
    cli_main(["check", str(CONFIGS_DIR / "lf_z3_alst.json"), "--gpus-per-node", "8", "--json", "--no-library-check"])
    obj = json.loads(capsys.readouterr().out)
    assert (obj["priced"]["sequence_parallel_size"], obj["priced"]["batch_data_parallel_degree"]) == (4, 2)
    assert obj["from_config"]["--sequence-parallel-size"] == {"config": 4, "command_line": 1}


def test_cli_check_autotp_config_reads_dp4_and_prices_tp2(cli_main, capsys):
    """Issue 13's acceptance: lf_z2_autotp.json (tensor_parallel.autotp_size 2) on 8 GPUs."""
    cli_main(["check", str(CONFIGS_DIR / "lf_z2_autotp.json"), "--gpus-per-node", "8", "--no-library-check"])
    out = capsys.readouterr().out
    assert "data-parallel degree 4 (tensor-parallel 2)" in next(x for x in out.splitlines() if x.startswith("Read as:"))
    cli_main(["check", str(CONFIGS_DIR / "lf_z2_autotp.json"), "--gpus-per-node", "8", "--json",
              "--no-library-check"])
    obj = json.loads(capsys.readouterr().out)
    assert (obj["priced"]["tensor_parallel_size"], obj["priced"]["data_parallel_degree"]) == (2, 4)


@pytest.mark.parametrize("argv,words", [
    (["--sequence-parallel-size", "3"], "divide the world size 8"),
    (["--sequence-parallel-size", "3", "--gpus-per-node", "6"], "heads"),
])
def test_cli_bad_degree_is_one_line_naming_the_option(cli_main, capsys, argv, words):
    assert cli_main(["config", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zeroplanner: error: --sequence-parallel-size:") and words in err and "\n" not in err


def test_cli_config_hf_trainer_prints_the_parallelism_config(cli_main, capsys, tmp_path):
    out = tmp_path / "ds.json"
    assert cli_main(["config", "--sequence-parallel-size", "4", "--hf-trainer", "--accelerate", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "ParallelismConfig(sp_backend='deepspeed', sp_size=4, dp_replicate_size=1, dp_shard_size=2" in err
    assert "parallelism_config=parallelism_config)" in err
    assert yaml.safe_load((tmp_path / "ds.accelerate.yaml").read_text())["parallelism_config"][
        "parallelism_config_sp_size"] == 4
    cli_main(["config", "--sequence-parallel-size", "4", "--hf-trainer", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert obj["parallelism_config"]["sp_size"] == 4 and obj["config"]["train_batch_size"] == "auto"


def test_cli_check_takes_the_degree_from_the_accelerate_yaml(cli_main, capsys, tmp_path):
    """The pair `config --hf-trainer --accelerate` writes, checked the way it is launched: the Ulysses degree comes
    from the YAML's parallelism_config block (the JSON carries none), and the pair has no error."""
    out = tmp_path / "ds.json"
    cli_main(["config", "--model", "llama-3.1-8b", "--sequence-parallel-size", "4", "--hf-trainer", "--accelerate",
              "-o", str(out)])
    capsys.readouterr()
    code = cli_main(["check", str(out), "--model", "llama-3.1-8b", "--hf-trainer", "--accelerate-config",
                     str(tmp_path / "ds.accelerate.yaml"), "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert obj["priced"]["sequence_parallel_size"] == 4 and obj["errors"] == 0 and code == 0
    assert obj["from_accelerate_config"]["--sequence-parallel-size"] == {"accelerate_config": 4, "command_line": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text("num_machines: 1\nnum_processes: 8\nparallelism_config:\n  parallelism_config_sp_size: two\n")
    assert cli_main(["check", str(out), "--hf-trainer", "--accelerate-config", str(bad)]) == 2
    assert "--accelerate-config: parallelism_config_sp_size must be an integer" in capsys.readouterr().err
