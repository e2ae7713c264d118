"""Issue 20, part B: generated configs follow the hardware and the plan.

1. a GPU without bf16 (V100) gets fp16 with dynamic loss scaling, never a ``bf16`` block, and the planner prices
   fp16 at the GPU's fp16 peak and says so;
2. the HF Trainer variant keeps the plan's batch, precision and bucket values unless ``--hf-auto`` is given;
3. the multi-node accelerate YAML carries ``main_process_ip``, ``main_process_port`` and a note on ``machine_rank``;
4. quantized ZeRO++ is recommended only with ``allow_lossy_communication`` (or when the user sets the flags);
5. the GPU catalog's memory is PyTorch's total capacity, quoted per card, with the marketed size beside it.

Every generated config is handed to DeepSpeed's own ``DeepSpeedConfig`` (and, for the HF variant, transformers'
``HfTrainerDeepSpeedConfig`` fill) as in tests/core/test_dsconfig.py.
"""

from __future__ import annotations

import json
import re
import types

import pytest

from zeroplanner import catalog
from zeroplanner.deepspeed import hf_training_arguments, to_deepspeed_config
from zeroplanner.planner import candidate_grid, plan
from zeroplanner.scenarios import build_scenario
from zeroplanner.units import GIB

from ..helpers import hf_args  # noqa: E402

DeepSpeedConfig = pytest.importorskip("deepspeed.runtime.config").DeepSpeedConfig


@pytest.fixture
def ds_world(monkeypatch):
    """DeepSpeedConfig takes rank and world size from deepspeed.comm (world 1 without a process group); patch those
    two functions so its batch assertion runs at the scenario's world size (as tests/core/test_dsconfig.py does)."""
    import deepspeed.comm as dist

    def set_world(size: int) -> None:
        monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
        monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: size)

    return set_world


def run_json(cli_main, capsys, argv: list[str]) -> dict:
    """The command's JSON; its exit status is README's: 0 when the configuration fits, 1 when it does not."""
    code = cli_main([*argv, "--json"])
    captured = capsys.readouterr()
    assert code in (0, 1), captured.err
    obj = json.loads(captured.out)
    assert code == (0 if obj.get("fits", True) else 1), obj.get("fits")
    return obj


def trainer_fill(config: dict, s) -> dict:
    """transformers' own HfTrainerDeepSpeedConfig fill of ``config`` with the TrainingArguments zeroplanner prints
    (hf_training_arguments) and transformers' defaults for the rest; a mismatch raises ValueError."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    args = hf_args(s)
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(config)))
    try:
        hf.trainer_config_process(args)
        model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=s.model.hidden_size))
        hf.trainer_config_finalize(args, model, num_training_steps=1000)
        return hf.config
    finally:
        unset_hf_deepspeed_config()


# ---- 1. precision follows the hardware -----------------------------------------------------------------------
def test_estimate_on_v100_says_it_priced_fp16(cli_main, capsys):
    """estimate and check state the same pitfall the config generator follows (zeroplanner.pitfalls)."""
    code = cli_main(["estimate", "--gpu", "V100-32GB", "--json"])
    obj = json.loads(capsys.readouterr().out)
    assert code == (0 if obj["fits"] else 1)  # README's exit statuses: 0 fits, 1 does not fit
    assert obj["inputs"]["resolved"]["precision"] == "bf16" and obj["inputs"]["priced_precision"] == "fp16"
    assert any("bf16_unsupported" in w or "has no bf16" in w for w in map(str, obj["warnings"])), obj["warnings"]


def test_v100_config_is_fp16_with_dynamic_loss_scaling_never_bf16(cli_main, capsys, ds_world):
    obj = run_json(cli_main, capsys, ["config", "--gpu", "V100-32GB"])  # precision left at its bf16 default
    config = obj["config"]
    assert "bf16" not in config
    # DeepSpeed's dynamic loss scaling: loss_scale 0 (deepspeed/runtime/precision_config.py, DeepSpeedFP16Config)
    assert config["fp16"]["enabled"] is True and config["fp16"]["loss_scale"] == 0
    warned = [f["rule"] for f in obj["notes"] + obj["findings"] if f["severity"] == "warning"]
    assert warned.count("bf16_unsupported") == 1  # one rule (zeroplanner.pitfalls), stated once
    ds_world(8)
    parsed = DeepSpeedConfig(config)
    # DeepSpeedFP16Config: "loss_scale ... 0 means dynamic loss scaling instead of static loss scale"
    assert parsed.float16_config.enabled and not parsed.bfloat16_config.enabled
    assert parsed.float16_config.loss_scale == 0
    # an Ampere GPU keeps bf16
    a100 = run_json(cli_main, capsys, ["config", "--gpu", "A100-80GB"])["config"]
    assert a100["bf16"] == {"enabled": True} and "fp16" not in a100


@pytest.mark.parametrize("extra", [[], ["--hf-auto"]])
def test_v100_hf_variant_has_no_bf16_block_and_the_trainer_fills_fp16(cli_main, capsys, ds_world, extra):
    config = run_json(cli_main, capsys, ["config", "--gpu", "V100-32GB", "--hf-trainer", *extra])["config"]
    assert "bf16" not in config and config["fp16"]["loss_scale"] == 0
    s = build_scenario(gpu="V100-32GB")
    assert hf_training_arguments(s)["fp16"] is True and hf_training_arguments(s)["bf16"] is False
    filled = trainer_fill(config, s)
    assert filled["fp16"]["enabled"] is True
    ds_world(8)
    assert DeepSpeedConfig(filled).float16_config.enabled


def test_planner_prices_fp16_on_v100_at_its_fp16_peak_and_says_so(cli_main, capsys):
    rec = run_json(cli_main, capsys, ["recommend", "--gpu", "V100-32GB"])
    assert rec["reasons"][0].startswith("Precision: V100-32GB has no bf16")
    # NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOPS fp16 tensor (the catalog entry's source); mfu = achieved / peak
    assert catalog.gpu("V100-32GB").peak_tflops("fp16") == 125
    est = rec["estimate"]
    assert est["tflops_per_gpu"] / est["mfu"] == pytest.approx(125, rel=1e-9)
    # the recommended config is the fp16 one, and its estimate is the fp16 scenario's
    p = plan(build_scenario(gpu="V100-32GB"))
    assert p.scenario.training.precision == "fp16"
    assert "bf16" not in to_deepspeed_config(p) and to_deepspeed_config(p)["fp16"]["loss_scale"] == 0
    c = rec["choice"]
    same = run_json(cli_main, capsys, [
        "estimate", "--gpu", "V100-32GB", "--precision", "fp16", "--stage", str(c["stage"]),
        "--offload-optimizer", c["offload_optimizer"], "--offload-param", c["offload_param"],
        "--checkpointing", c["checkpointing"], "--micro-batch", str(c["micro_batch"]),
        "--grad-accum", str(c["grad_accum"]), "--reduce-bucket-size", str(c["reduce_bucket_size"]),
        *(["--overlap-comm"] if c["overlap_comm"] else ["--no-overlap-comm"])])
    assert same["compute_seconds_per_step"] == pytest.approx(est["compute_seconds_per_step"], rel=1e-12)
    assert same["per_gpu_bytes"]["total"] == est["per_gpu_bytes"]["total"]


# ---- 2. the HF variant keeps the plan's values -------------------------------------------------------------
def test_hf_variant_keeps_the_planners_values_unless_hf_auto(cli_main, capsys, ds_world):
    argv = ["--model", "llama-2-7b", "--lora-rank", "16", "--recommend"]
    rec = run_json(cli_main, capsys, ["recommend", *argv[:-1]])["choice"]
    # LoRA: the planner lowers reduce_bucket_size below DeepSpeed's 5e8 default (planner.candidate_grid)
    assert rec["reduce_bucket_size"] < 500_000_000
    plain = run_json(cli_main, capsys, ["config", *argv])["config"]
    hf = run_json(cli_main, capsys, ["config", *argv, "--hf-trainer"])["config"]
    assert hf["zero_optimization"] == plain["zero_optimization"]
    assert hf["zero_optimization"]["reduce_bucket_size"] == rec["reduce_bucket_size"]
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16"):
        assert hf[key] == plain[key], key
    assert hf["train_micro_batch_size_per_gpu"] == rec["micro_batch"]
    assert hf["gradient_accumulation_steps"] == rec["grad_accum"]
    assert hf["optimizer"]["params"]["lr"] == "auto"  # the plan has no learning rate: the Trainer fills it
    # the Trainer accepts the plan's values (no mismatch with the printed TrainingArguments) and keeps them
    s = plan(build_scenario(model="llama-2-7b", lora_rank=16)).scenario
    filled = trainer_fill(hf, s)
    assert filled["zero_optimization"]["reduce_bucket_size"] == rec["reduce_bucket_size"]
    ds_world(8)
    DeepSpeedConfig(filled)
    # --hf-auto: the Trainer's own values (hidden_size ** 2 = 4096 ** 2 for Llama-2-7B, transformers
    # integrations/deepspeed.py trainer_config_finalize)
    auto = run_json(cli_main, capsys, ["config", *argv, "--hf-trainer", "--hf-auto"])["config"]
    assert auto["zero_optimization"]["reduce_bucket_size"] == "auto" and auto["train_batch_size"] == "auto"
    assert trainer_fill(auto, s)["zero_optimization"]["reduce_bucket_size"] == 4096 ** 2


def test_hf_variant_keeps_stage3_buckets(cli_main, capsys):
    argv = ["config", "--stage", "3", "--stage3-prefetch-bucket-size", "20000000",
            "--stage3-param-persistence-threshold", "50000", "--hf-trainer"]
    zero = run_json(cli_main, capsys, argv)["config"]["zero_optimization"]
    assert (zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]) == (20_000_000, 50_000)
    assert cli_main(["config", "--hf-auto"]) == 2
    assert "--hf-auto" in capsys.readouterr().err


# ---- 3. multi-node launch files -----------------------------------------------------------------------------
def test_two_node_accelerate_yaml_carries_main_process_ip_port_and_machine_rank(cli_main, capsys, tmp_path):
    from accelerate.commands.config.config_args import ClusterConfig

    out = tmp_path / "ds.json"
    obj = run_json(cli_main, capsys, ["config", "--nodes", "2", "-o", str(out), "--accelerate",
                                      "--main-process-ip", "10.1.2.3"])
    yaml_path = tmp_path / "ds.accelerate.yaml"
    assert obj["files"] == [str(out), str(yaml_path)]
    cfg = ClusterConfig.from_yaml_file(str(yaml_path))
    # accelerate 1.15.0 utils/launch.py: main_process_port None -> 29500; we write it explicitly
    assert (cfg.main_process_ip, cfg.main_process_port, cfg.machine_rank, cfg.num_machines, cfg.num_processes) == \
        ("10.1.2.3", 29500, 0, 2, 16)
    text = yaml_path.read_text()
    assert "# machine_rank: 0 on node 0" in text and "--machine_rank" in text
    assert not [n for n in obj["notes"] if n["rule"] == "main_process_ip_placeholder"]

    # no address given: a placeholder that cannot resolve, and a warning saying so
    obj = run_json(cli_main, capsys, ["config", "--nodes", "2", "-o", str(out), "--accelerate"])
    assert ClusterConfig.from_yaml_file(str(yaml_path)).main_process_ip == "NODE0_ADDRESS"
    assert [n["severity"] for n in obj["notes"] if n["rule"] == "main_process_ip_placeholder"] == ["warning"]

    # one node: nothing to rendezvous with
    run_json(cli_main, capsys, ["config", "-o", str(out), "--accelerate"])
    assert ClusterConfig.from_yaml_file(str(yaml_path)).main_process_ip is None

    # a value that is no host name is one line naming the option, exit 2
    assert cli_main(["config", "--nodes", "2", "-o", str(out), "--accelerate", "--main-process-ip", "a;b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--main-process-ip" in err[0]


def test_launch_script_multi_node_lines_carry_address_port_and_node_rank(cli_main, capsys):
    tr = run_json(cli_main, capsys, ["launch-script", "--launcher", "torchrun", "--nodes", "2", "--gpus-per-node",
                                     "8", "--master-addr", "10.1.2.3"])
    assert "--rdzv-endpoint 10.1.2.3:29500" in tr["commands"][0] and tr["per_node"]
    ds = run_json(cli_main, capsys, ["launch-script", "--launcher", "deepspeed", "--nodes", "2", "--gpus-per-node",
                                     "8", "--hosts", "n0,n1"])
    assert "--master_addr n0 --master_port 29500" in ds["commands"][0]
    assert "--node_rank NODE_RANK" in ds["no_ssh_command"]


# ---- 4. quantized ZeRO++ only when allowed -------------------------------------------------------------------
MULTI_NODE = ["--model", "llama-2-70b", "--nodes", "4", "--network", "eth-25g"]


def test_quantized_zeropp_needs_allow_lossy_communication(cli_main, capsys):
    off = run_json(cli_main, capsys, ["recommend", *MULTI_NODE])
    options = [off["choice"]] + [a["choice"] for a in off["alternatives"]]
    assert not any(c["zero_quantized_weights"] or c["zero_quantized_gradients"] for c in options)
    assert any("--allow-lossy-communication" in r for r in off["reasons"])
    s_off = build_scenario(model="llama-2-70b", nodes=4, network="eth-25g")
    grid = candidate_grid(s_off)
    assert grid.qwz.max() == 0 and grid.qgz.max() == 0 and grid.hpz.max() == 8  # hpZ (lossless) stays

    on = run_json(cli_main, capsys, ["recommend", *MULTI_NODE, "--allow-lossy-communication"])
    grid_on = candidate_grid(build_scenario(model="llama-2-70b", nodes=4, network="eth-25g",
                                            allow_lossy_communication=True))
    assert grid_on.qwz.max() == 1 and grid_on.qgz.max() == 1
    if on["choice"]["zero_quantized_weights"] or on["choice"]["zero_quantized_gradients"]:
        numerics = [r for r in on["reasons"] if r.startswith("Numerics:")]
        assert len(numerics) == 1 and "arXiv 2306.10209" in numerics[0]


def test_user_set_zeropp_flags_are_kept(cli_main, capsys, ds_world):
    s = build_scenario(model="llama-2-70b", nodes=4, network="eth-25g", stage=3, zero_quantized_weights=True)
    grid = candidate_grid(s)
    assert grid.qwz.max() == 1 and grid.qgz.max() == 0  # only the flag the user set
    zero = run_json(cli_main, capsys, ["config", "--nodes", "2", "--stage", "3", "--zero-quantized-weights",
                                       "--zero-quantized-gradients"])["config"]["zero_optimization"]
    assert zero["zero_quantized_weights"] is True and zero["zero_quantized_gradients"] is True
    ds_world(16)
    parsed = DeepSpeedConfig({"train_batch_size": 128, "train_micro_batch_size_per_gpu": 1,
                              "gradient_accumulation_steps": 8, "zero_optimization": zero})
    assert parsed.zero_config.zero_quantized_weights and parsed.zero_config.zero_quantized_gradients


# ---- 5. GPU memory is PyTorch's total capacity ---------------------------------------------------------------
# (catalog name, GiB in the PyTorch CUDA OOM message "total capacity", the public issue quoting it, marketed GB).
# Several quotes for one card: the lowest is kept (a plan that fits it fits them all).
QUOTED = [
    ("V100-16GB", 15.78, "kchengiva/Shift-GCN#34", 16),
    ("V100-32GB", 31.74, "liucongg/ChatGLM-Finetuning#73", 32),
    ("RTX-3090", 23.70, "GaoLii/DSP#10", 24),
    ("RTX-4090", 23.64, "3DTopia/Phidias-Diffusion#8", 24),
    ("L40S", 44.40, "QwenLM/Qwen3-VL#2097", 48),  # quoted for an L40 (same board memory); no L40S quote found
    ("A100-40GB", 39.50, "TianheWu/CoSeR#10", 40),
    ("A100-80GB", 79.14, "lianqi1008/Control-GIC#6", 80),
    ("A800-80GB", 79.33, "hahnyuan/PB-LLM#3", 80),
    ("H100-80GB", 79.11, "vllm-project/vllm#27508", 80),
]
UNQUOTED = {"A10": 24, "H200": 141, "MI300X": 192}  # no published quote found: an upper bound, said in the source


@pytest.mark.parametrize("name, quoted_gib, issue, marketed_gb", QUOTED)
def test_gpu_memory_is_pytorchs_total_capacity_with_its_source(cli_main, capsys, name, quoted_gib, issue,
                                                               marketed_gb):
    row = {g["name"]: g for g in run_json(cli_main, capsys, ["gpus"])["gpus"]}[name]
    # stored as the whole MiB nearest the two-decimal GiB quote
    assert row["memory_bytes"] == round(quoted_gib * 1024) * 2**20
    assert round(row["memory_gib"], 2) == quoted_gib
    assert row["marketed_memory_gb"] == marketed_gb
    assert issue in row["source"] and "total capacity" in row["source"]


def test_every_gpu_says_where_its_memory_figure_comes_from(cli_main, capsys):
    rows = run_json(cli_main, capsys, ["gpus"])["gpus"]
    assert {r["name"] for r in rows} == {q[0] for q in QUOTED} | set(UNQUOTED)
    for r in rows:
        if r["name"] in UNQUOTED:
            assert "no published PyTorch OOM message" in r["source"] and "upper bound" in r["source"], r["name"]
            assert r["marketed_memory_gb"] == UNQUOTED[r["name"]]
        # PyTorch reports less than the marketed size, even read as GiB (all but the unquoted MI300X, whose
        # nominal 192 GiB is kept)
        if r["name"] != "MI300X":
            assert r["memory_bytes"] < r["marketed_memory_gb"] * GIB, r["name"]
    assert cli_main(["gpus"]) == 0
    text_rows = capsys.readouterr().out.splitlines()
    # columns are padded to their widest cell (zeroplanner.cli.plan.text_table), so the gaps vary in width
    assert any(re.match(r"A100-80GB +79\.14 GiB +\(sold as 80 GB\)", line) for line in text_rows)
