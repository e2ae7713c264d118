"""What zeroplanner writes for Ulysses sequence parallelism (issue 13) is accepted by the libraries that read it:
DeepSpeed's ``DeepSpeedConfig`` (both ways DeepSpeed takes the degree), accelerate's ``ParallelismConfig`` (built
directly, and from the YAML through accelerate's own launcher), and transformers' ``TrainingArguments`` with the
printed snippet. DeepSpeed 0.19.8, accelerate 1.15.0, transformers 5.24.0; nothing here needs a GPU or starts ranks.

DeepSpeedConfig takes its world size from ``deepspeed.comm`` (the stand-in of zeroplanner/deepspeed/library.py,
``_deepspeed_world``, answers rank 0 of the given world); the two Ulysses paths of runtime/config.py
``DeepSpeedConfig.__init__``:

- no mpu (raw ``deepspeed.initialize`` without one, or transformers' ``zero.Init``): world / the config's
  ``sequence_parallel_size``;
- an mpu without ``get_data_parallel_world_size`` -- the Ulysses mpu, ``parallel_state_sp`` returned by
  ``UlyssesSPAttentionHF.register_with_transformers`` -- : world / ``mpu.get_sequence_parallel_world_size()``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from zeroplanner.deepspeed import (
    deepspeed_train_batch_size,
    parallelism_config_kwargs,
    parallelism_config_snippet,
    to_accelerate_config,
    to_deepspeed_config,
)
from zeroplanner.scenarios import build_scenario

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

from deepspeed.runtime.config import DeepSpeedConfig  # noqa: E402

from zeroplanner.deepspeed.library import _deepspeed_world, library_findings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(2, 1), (4, 1), (8, 1), (4, 2), (16, 2)]  # (Ulysses degree, nodes of 8 GPUs)


def sp_scenario(sp: int, nodes: int = 1, stage: int = 3):
    return build_scenario(model="llama-3.1-8b", sequence_parallel_size=sp, nodes=nodes, micro_batch=2,
                          grad_accum=3, stage=stage)


@pytest.mark.parametrize("sp,nodes", SHAPES)
def test_deepspeed_config_accepts_the_generated_json_both_ways(sp, nodes):
    s = sp_scenario(sp, nodes)
    config = to_deepspeed_config(s)
    world = 8 * nodes
    with _deepspeed_world(world):  # no mpu: DeepSpeedConfig divides by the key
        plain = DeepSpeedConfig(copy.deepcopy(config))
    import deepspeed.runtime.sequence_parallel.parallel_state_sp as ulysses_mpu

    assert not hasattr(ulysses_mpu, "get_data_parallel_world_size")  # so DeepSpeedConfig takes the SP branch
    mpu = types.SimpleNamespace(get_sequence_parallel_world_size=lambda: sp)
    with _deepspeed_world(world):
        with_mpu = DeepSpeedConfig(copy.deepcopy(config), mpu=mpu)
    for ds in (plain, with_mpu):
        assert ds.world_size == world / sp
        assert ds.train_batch_size == deepspeed_train_batch_size(s) == 2 * 3 * world // sp
    assert library_findings(config, s, "deepspeed") == []


def test_without_the_key_and_without_an_mpu_deepspeed_refuses_the_batch():
    """The key is what makes the batch arithmetic right when no mpu is passed: the same JSON without it fails
    DeepSpeed's batch assertion on all 8 ranks (8 != 2 x 3 x 8)."""
    config = to_deepspeed_config(sp_scenario(4))
    del config["sequence_parallel_size"]
    with _deepspeed_world(8), pytest.raises(AssertionError, match="train_batch_size is not equal"):
        DeepSpeedConfig(config)


@pytest.mark.parametrize("sp,nodes", SHAPES)
def test_parallelism_config_accepts_the_kwargs_and_matches_deepspeeds_batch(sp, nodes):
    from accelerate import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    s = sp_scenario(sp, nodes)
    kw = parallelism_config_kwargs(s)
    pc = ParallelismConfig(**{**kw, "sp_handler": DeepSpeedSequenceParallelConfig(**kw["sp_handler"])})
    assert (pc.sp_size, pc.sp_backend, pc.total_size) == (sp, "deepspeed", 8 * nodes)
    # accelerate's train_batch_size (accelerator.py _prepare_deepspeed) is the DeepSpeed JSON's
    assert 2 * 3 * pc.data_parallel_size == deepspeed_train_batch_size(s)


def test_hf_variant_passes_the_trainer_fill_accelerate_and_deepspeed():
    """library_findings under the HF Trainer: transformers' HfTrainerDeepSpeedConfig fill (train_batch_size "auto"
    -> micro x accumulation x 8), accelerate's replacement by micro x accumulation x 2, DeepSpeedConfig with the
    Ulysses mpu's world 8 / 4; and zero.Init's DeepSpeedConfig at ZeRO-3 does not see a key."""
    s = sp_scenario(4)
    config = to_deepspeed_config(s, mode="hf_trainer")
    assert config["train_batch_size"] == "auto" and "sequence_parallel_size" not in config
    assert library_findings(config, s, "hf_trainer") == []


def test_accelerate_launcher_turns_the_yaml_into_the_parallelism_config(tmp_path, monkeypatch):
    """accelerate launch --config_file on the YAML, as launch_command does it up to the launch itself
    (commands/launch.py _validate_launch_command, utils/launch.py prepare_deepspeed_cmd_env): the environment it
    gives the training processes builds ParallelismConfig() (accelerator.py reads ACCELERATE_USE_PARALLELISM_CONFIG)
    with the degree and the data-parallel size of the DeepSpeed JSON."""
    from accelerate import ParallelismConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    s = sp_scenario(4)
    ds_path = tmp_path / "ds_config.json"
    ds_path.write_text(json.dumps(to_deepspeed_config(s, mode="hf_trainer")))
    yaml_path = tmp_path / "ds_config.accelerate.yaml"
    yaml_path.write_text(to_accelerate_config(s, str(ds_path)))
    args = launch_command_parser().parse_args(["--config_file", str(yaml_path), "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    assert args.use_deepspeed and args.use_parallelism_config
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config.keys())  # launch_command
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(ds_path)
    for key, value in env.items():
        if key.startswith("PARALLELISM_CONFIG_"):
            monkeypatch.setenv(key, value)
    pc = ParallelismConfig()
    assert (pc.sp_size, pc.sp_backend, pc.data_parallel_size, pc.total_size) == (4, "deepspeed", 2, 8)
    assert pc.sp_handler.sp_seq_length_is_variable and pc.sp_handler.sp_attn_implementation == "sdpa"
    assert 2 * 3 * pc.data_parallel_size == deepspeed_train_batch_size(s)


def test_printed_snippet_runs_and_training_arguments_take_it(tmp_path):
    """The snippet `zeroplanner config --hf-trainer` prints, run in a fresh process (accelerate keeps process-wide
    state), handed to transformers' TrainingArguments with the generated JSON."""
    s = sp_scenario(4)
    ds_path = tmp_path / "ds_config.json"
    ds_path.write_text(json.dumps(to_deepspeed_config(s, mode="hf_trainer")))
    code = parallelism_config_snippet(s) + (
        "from transformers import TrainingArguments\n"
        f"args = TrainingArguments(output_dir={str(tmp_path / 'out')!r}, deepspeed={str(ds_path)!r}, "
        "per_device_train_batch_size=2, gradient_accumulation_steps=3, bf16=True, use_cpu=True, "
        "parallelism_config=parallelism_config)\n"
        "pc = args.parallelism_config\n"
        "print(pc.sp_size, pc.sp_backend, pc.data_parallel_size, "
        "args.hf_deepspeed_config.config['train_micro_batch_size_per_gpu'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["4", "deepspeed", "2", "2"]
