"""Every setting a generated DeepSpeed config writes that differs from DeepSpeed's default has a one-line reason
(zeroplanner.deepspeed.explain_config, `zeroplanner config --explain`), and the defaults it compares with are
DeepSpeed's own (read from DeepSpeed's config models when DeepSpeed is installed)."""

from __future__ import annotations

import json

import pytest

from zeroplanner.cli import main
from zeroplanner.deepspeed import explain_config, to_deepspeed_config
from zeroplanner.deepspeed.emit import _flat
from zeroplanner.deepspeed.keys import DEEPSPEED_DEFAULTS, deepspeed_overlap_comm_default
from zeroplanner.planner import plan
from zeroplanner.scenarios import build_scenario

SCENARIOS = [
    dict(model="llama-2-13b", gpus_per_node=8, nodes=2, network="eth-1g"),  # ZeRO-3 + ZeRO++
    dict(model="llama-3.1-70b", gpu="RTX-4090", gpus_per_node=4, lora_rank=16, cpu_memory_gib=128),  # NVMe params
    dict(model="llama-2-7b", nodes=2),  # ZeRO-1, overlap_comm false written
    dict(model="llama-2-7b", gpu="V100-32GB", optimizer="sgd"),  # fp16, untested optimizer
    dict(model="llama-3.1-70b", gpu="H100-80GB", gpus_per_node=8, nodes=4, network="eth-100g"),  # CPU optimizer
]


@pytest.mark.parametrize("kw", SCENARIOS)
@pytest.mark.parametrize("mode", ["deepspeed", "hf_trainer"])
def test_every_non_default_setting_has_a_reason(kw, mode):
    p = plan(build_scenario(**kw), advice=False)
    config = to_deepspeed_config(p.scenario, mode=mode)
    why = explain_config(config, p.scenario)
    for key, value in _flat(config).items():
        default = DEEPSPEED_DEFAULTS.get(key, object())
        if key == "zero_optimization.overlap_comm" or value != default:
            assert why.get(key), f"{key}={value!r} differs from DeepSpeed's default {default!r} without a reason"
        else:
            assert key not in why
    if "overlap_comm" in config["zero_optimization"]:  # the reason says what DeepSpeed would do without the key
        stage = p.scenario.zero.stage
        default = str(deepspeed_overlap_comm_default(stage)).lower()
        assert f"DeepSpeed's default at stage {stage}: {default}" in why["zero_optimization.overlap_comm"]


def test_cli_explain_lines(capsys):
    assert main(["config", "--recommend", "--model", "llama-2-7b", "--nodes", "2", "--explain"]) == 0
    err = capsys.readouterr().err
    assert "why zero_optimization.overlap_comm: reduces gradients without overlapping the backward" in err
    assert main(["config", "--recommend", "--model", "llama-2-7b", "--nodes", "2", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["explain"] == explain_config(obj["config"], plan(build_scenario(model="llama-2-7b", nodes=2)).scenario)


def test_defaults_are_deepspeeds():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import constants as C
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    assert DEEPSPEED_DEFAULTS["gradient_clipping"] == C.GRADIENT_CLIPPING_DEFAULT
    assert DEEPSPEED_DEFAULTS["steps_per_print"] == C.STEPS_PER_PRINT_DEFAULT
    assert DEEPSPEED_DEFAULTS["wall_clock_breakdown"] == C.WALL_CLOCK_BREAKDOWN_DEFAULT
    assert DEEPSPEED_DEFAULTS["zero_allow_untested_optimizer"] == C.ZERO_ALLOW_UNTESTED_OPTIMIZER_DEFAULT
    assert DEEPSPEED_DEFAULTS["zero_force_ds_cpu_optimizer"] == C.ZERO_FORCE_DS_CPU_OPTIMIZER_DEFAULT
    zero = DeepSpeedZeroConfig().model_dump(by_alias=True)
    for key, value in DEEPSPEED_DEFAULTS.items():
        parts = key.split(".")
        if parts[0] == "zero_optimization" and len(parts) == 2:
            assert zero[parts[1]] == value, key
        elif parts[0] == "zero_optimization":
            model = (DeepSpeedZeroOffloadOptimizerConfig if parts[1] == "offload_optimizer"
                     else DeepSpeedZeroOffloadParamConfig)()
            assert getattr(model, parts[2]) == value or str(getattr(model, parts[2])) == value, key
        elif parts[0] == "activation_checkpointing":
            assert ACT_CHKPT_DEFAULT[parts[1]] == value, key
    for stage in range(4):
        assert DeepSpeedZeroConfig(stage=stage).overlap_comm == deepspeed_overlap_comm_default(stage)
