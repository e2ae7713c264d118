"""The CLI contract: JSON keys scripts depend on, one-line errors with exit status 2, defaults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zeroplanner import build_scenario, estimate, plan
from zeroplanner.cli import main

from tests.helpers import HF_CONFIGS

ESTIMATE_KEYS = {"parameters", "trainable_parameters", "data_parallel_degree", "per_gpu_bytes", "gpu_memory_bytes",
                 "per_node_cpu_bytes", "nvme_bytes", "fits_gpu", "fits_cpu", "fits", "communication",
                 "compute_seconds_per_step", "step_seconds", "tokens_per_second", "warnings"}
PER_GPU_KEYS = {"parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead", "total"}


def run_json(capsys, *argv):
    rc = main(list(argv) + ["--json"])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_estimate_defaults_match_python_api(capsys):
    d = run_json(capsys, "estimate")
    assert ESTIMATE_KEYS <= set(d)
    assert set(d["per_gpu_bytes"]) == PER_GPU_KEYS
    assert {"bytes_per_gpu_per_step", "seconds_per_step", "exposed_seconds_per_step"} <= set(d["communication"])
    # default scenario: Llama-2-7B (6,738,415,616 params, docs/references.md s.3) on one node of 8 A100-80GB
    assert d["parameters"] == 6_738_415_616
    assert d["data_parallel_degree"] == 8
    # A100-80GB: PyTorch's total capacity, 79.14 GiB in a public CUDA OOM message (lianqi1008/Control-GIC#6),
    # stored as the nearest MiB (zeroplanner/catalog/gpus.json)
    assert d["gpu_memory_bytes"] == 81039 * 2**20
    e = estimate(build_scenario())
    assert d["per_gpu_bytes"]["total"] == e.per_gpu_bytes.total
    assert d["step_seconds"] == pytest.approx(e.step_seconds)


def test_estimate_options_change_the_answer(capsys):
    base = run_json(capsys, "estimate", "--stage", "2")
    z3 = run_json(capsys, "estimate", "--stage", "3")
    assert z3["per_gpu_bytes"]["parameters"] < base["per_gpu_bytes"]["parameters"]
    off = run_json(capsys, "estimate", "--stage", "2", "--offload-optimizer", "cpu")
    assert off["per_gpu_bytes"]["optimizer_states"] == 0 and off["per_node_cpu_bytes"] > 0
    two = run_json(capsys, "estimate", "--nodes", "2", "--network", "eth-25g")
    assert two["data_parallel_degree"] == 16
    assert two["communication"]["exposed_seconds_per_step"] > base["communication"]["exposed_seconds_per_step"]


def test_params_and_hf_config(capsys, tmp_path):
    d = run_json(capsys, "estimate", "--params", "13e9")
    assert d["parameters"] == 13_000_000_000
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = run_json(capsys, "estimate", "--hf-config", str(path))
    assert d["parameters"] == 6_738_415_616  # Llama-2-7B shapes (docs/references.md s.3)


def test_recommend_json(capsys):
    d = run_json(capsys, "recommend")
    assert {"fits", "choice", "estimate", "reasons", "warnings", "alternatives"} <= set(d)
    assert {"stage", "offload_optimizer", "offload_param", "checkpointing", "micro_batch"} <= set(d["choice"])
    p = plan(build_scenario())
    assert d["choice"]["stage"] == p.choice.stage
    assert d["reasons"] == p.reasons


@pytest.mark.parametrize("argv,option", [
    (["estimate", "--micro-batch", "0"], "--micro-batch"),
    (["estimate", "--micro-batch", "x"], "--micro-batch"),
    (["estimate", "--nodes", "-1"], "--nodes"),
    (["estimate", "--model", "no-such-model"], "--model"),
    (["estimate", "--gpu", "no-such-gpu"], "--gpu"),
    (["estimate", "--network", "carrier-pigeon"], "--network"),
    (["estimate", "--stage", "4"], "--stage"),
    (["estimate", "--qlora"], "--qlora"),
    (["estimate", "--params", "12"], "--params"),
    (["estimate", "--hf-config", "/nonexistent/config.json"], "--hf-config"),
    (["estimate", "--stage", "2", "--offload-param", "cpu"], "--offload-param"),
    (["recommend", "--gpu-memory-gib", "0"], "--gpu-memory-gib"),
    (["deepspeed-estimate", "--params", "0", "--largest-layer-params", "1"], "--params"),
])
def test_bad_input_is_one_line_exit_2(argv, option):
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", *argv], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert option in lines[0]
    assert "Traceback" not in proc.stderr


def test_bad_hf_config_content(tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "estimate", "--hf-config", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--hf-config" in proc.stderr and "Traceback" not in proc.stderr
    big = tmp_path / "big.json"
    big.write_text(" " * 2_000_000 + "{}")
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "estimate", "--hf-config", str(big)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "limit" in proc.stderr


@pytest.mark.parametrize("value", ["-7e9", "-7B", "-7", "-0.5"])
def test_a_negative_number_gets_the_options_range_message(capsys, value):
    # argparse alone reads "-7e9" as an option and says "expected one argument" (its matcher knows -7 and -.7)
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--params", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"--params must be an integer in [1000000, 1000000000000000] (got '{value}')" in err


def test_an_hf_config_file_names_the_model(capsys, tmp_path):
    # a model read from a file is named after it: the folder of a config.json (hub snapshot / save_pretrained),
    # else the file's stem; a _name_or_path inside the file wins
    def model_name(path):
        main(["estimate", "--hf-config", str(path), "--json"])  # exit 0 or 1 (fits or not): both print the JSON
        return json.loads(capsys.readouterr().out)["inputs"]["model"]

    cfg = json.loads((HF_CONFIGS / "gpt-oss-20b.json").read_text())
    folder = tmp_path / "my-finetune"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(cfg))
    assert model_name(folder / "config.json") == "my-finetune"
    assert model_name(HF_CONFIGS / "gpt-oss-20b.json") == "gpt-oss-20b"
    (tmp_path / "named.json").write_text(json.dumps({**cfg, "_name_or_path": "org/model"}))
    assert model_name(tmp_path / "named.json") == "org/model"


def test_vision_language_output_states_the_image_tokens(capsys):
    """A VL model's answer says what the language model was priced at: Qwen2.5-VL's vision_config (patch_size 14,
    spatial_merge_size 2; the catalog's 448 x 448 image = 32 x 32 = 1,024 patches) merges 2 x 2 patches into one
    token, 256 per image; 2 images on 2,048 text tokens = 2,560 tokens per sample."""
    argv = ["estimate", "--model", "qwen2.5-vl-7b", "--gpu", "a100-80gb", "--images-per-sample", "2",
            "--seq-len", "2048"]
    d = run_json(capsys, *argv)
    assert d["sequence"] == {"text_tokens": 2048, "images_per_sample": 2, "tokens_per_image": 256,
                             "patches_per_image": 1024, "image_tokens": 512, "tokens": 2560,
                             "vision_parameters": d["sequence"]["vision_parameters"], "vision_tower_trains": True}
    assert d["sequence"]["vision_parameters"] > 0
    main(argv)
    assert ("per sample: 2,048 text + 2 image(s) x 256 tokens (1,024 patches merged) = 2,560 tokens through the "
            "language model; vision tower") in capsys.readouterr().out
    rec = run_json(capsys, "recommend", *argv[1:], "--freeze-vision")
    assert rec["sequence"]["tokens"] == 2560 and rec["sequence"]["vision_tower_trains"] is False
    assert run_json(capsys, "estimate", "--model", "llama-2-7b")["sequence"] is None  # text-only: no such line


def test_answers_state_what_they_assume_about_the_model(capsys, tmp_path):
    """Review finding: the hybrid kernels and the transformers-path approximations never reached the output."""
    main(["estimate", "--model", "nemotron-3-nano-30b-a3b", "--gpu", "h100-80gb", "--stage", "3", "--json"])
    d = json.loads(capsys.readouterr().out)  # fits or not, the assumptions are stated
    assert any("mamba2 layers' activations are priced as the GPU kernels save them" in a and "4.1x" in a
               for a in d["assumptions"])
    assert run_json(capsys, "estimate", "--model", "llama-2-7b")["assumptions"] == []
    custom = tmp_path / "custom.json"
    custom.write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, vocab_size=1000,
                                      auto_map={"AutoModelForCausalLM": "modeling_x.X"})), encoding="utf-8")
    assert any("custom code (auto_map): never run" in a
               for a in run_json(capsys, "estimate", "--hf-config", str(custom))["assumptions"])
    pytest.importorskip("transformers")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(dict(model_type="granite", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)), encoding="utf-8")
    rec = run_json(capsys, "recommend", "--hf-config", str(cfg))
    assert any("read by transformers on the meta device" in a and "approximate" in a for a in rec["assumptions"])


def test_subcommand_table_is_what_the_modules_register():
    """main() builds the parser of the one module a command line names (cli.SUBCOMMANDS, issue 35 item 3); the
    table must be what each module's register() adds, or a command would parse with the wrong options."""
    import argparse
    import importlib

    from zeroplanner import cli

    registered = {}
    for name in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"zeroplanner.cli.{name}").register(sub, cli.add_scenario_options)
        registered.update(dict.fromkeys(sub.choices, name))
    assert registered == cli.SUBCOMMANDS
    full = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(full.choices) == list(registered)  # --help lists every command, in the modules' order


def test_estimate_imports_only_what_it_needs():
    """`zeroplanner estimate` imports neither the planner, the config checker, the probes, ipywidgets, torch nor
    DeepSpeed (issue 35 item 3; its whole-process time is in benchmarks/bench_cli.py)."""
    code = ("import sys, io, contextlib\n"
            "from zeroplanner.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): rc = main(['estimate'])\n"
            "print(rc, ' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('zeroplanner', 'torch', 'deepspeed', 'ipywidgets', 'transformers'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "0"
    loaded = set(out[1:])
    for heavy in ("zeroplanner.planner", "zeroplanner.cli.config", "zeroplanner.cli.probe", "zeroplanner.probe",
                  "zeroplanner.deepspeed.lint", "torch", "deepspeed", "ipywidgets", "transformers"):
        assert heavy not in loaded, heavy
    assert "zeroplanner.costmodel.evaluate" in loaded


def test_estimate_of_a_catalog_model_does_not_load_the_config_reader():
    """The config.json reader (catalog.hfconfig, 20 ms to import) is loaded by `estimate` only for a model read from
    a config.json; its auto_map note is still said for one (test_answers_state_what_they_assume_about_the_model)."""
    code = ("import sys, io, contextlib\n"
            "from zeroplanner.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['estimate', '--model', 'llama-2-7b'])\n"
            "print('zeroplanner.catalog.hfconfig' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]
