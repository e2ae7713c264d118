"""A CLI a practitioner can trust (issue 20, part A): ``recommend`` holds the options it is given, ``config`` says
whether what it writes fits, ``check`` says what it assumed and took from the file, JSON echoes the inputs, and
the exit statuses are the same everywhere (0 fits, 1 does not fit, 2 bad input)."""

from __future__ import annotations

import argparse
import json

import pytest

from zeroplanner import build_scenario, catalog
from zeroplanner.cli import build_parser
from zeroplanner.inputs import BY_KEY
from zeroplanner.planner import Choice, plan
from zeroplanner.units import GIB

GPU_80GB_BYTES = 80 * GIB  # the A100-80GB catalog entry's memory (zeroplanner/catalog/gpus.json)


def run(cli_main, capsys, *argv) -> tuple[int, dict]:
    code = cli_main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


# -- 1. recommend holds the options it is given ------------------------------------------------------------------
def test_recommend_holds_a_given_stage(cli_main, capsys):
    # hold a stage the free search does not pick for the default scenario, so holding must change the answer
    code, free = run(cli_main, capsys, "recommend")
    assert code == 0 and "ZeRO stage" in free["varied"] and free["held"] == {}
    stage = 1 if free["choice"]["stage"] != 1 else 2
    code, d = run(cli_main, capsys, "recommend", "--stage", str(stage))
    assert code == 0 and d["fits"]
    assert d["choice"]["stage"] == stage and d["held"] == {"stage": stage}
    assert "ZeRO stage" not in d["varied"] and "optimizer offload" in d["varied"]
    assert all(a["choice"]["stage"] == stage for a in d["alternatives"])
    assert any(r.startswith(f"Held as given: stage={stage}. Varied: ") for r in d["reasons"])
    assert d["choice"] == {"label": Choice(**{k: v for k, v in d["choice"].items() if k != "label"}).label,
                           **plan(build_scenario(stage=stage), held={"stage"}).choice.model_dump()}


def test_recommend_holds_offload_and_checkpointing(cli_main, capsys):
    code, d = run(cli_main, capsys, "recommend", "--offload-optimizer", "cpu", "--checkpointing", "full",
                  "--micro-batch", "2")
    assert code == 0
    c = d["choice"]
    assert (c["offload_optimizer"], c["checkpointing"], c["micro_batch"], c["grad_accum"]) == ("cpu", "full", 2, 8)
    assert d["held"] == {"offload_optimizer": "cpu", "checkpointing": "full", "micro_batch": 2}
    assert not {"optimizer offload", "activation checkpointing", "micro-batch split"} & set(d["varied"])
    assert "ZeRO stage" in d["varied"]


def test_recommend_holds_zeropp_and_searches_stage_3_for_it(cli_main, capsys):
    # ZeRO++ is a stage-3 feature (DeepSpeed runtime/zero/config.py: zero_hpz_partition_size, zero_quantized_*
    # act in stage3.py only), so a given ZeRO++ option means a ZeRO-3 search rather than a refused stage 2
    code, d = run(cli_main, capsys, "recommend", "--nodes", "2", "--zero-quantized-weights")
    assert code == 0 and d["choice"]["stage"] == 3 and d["choice"]["zero_quantized_weights"] is True
    assert d["held"] == {"zero_quantized_weights": True} and d["inputs"]["given"] == {
        "nodes": 2, "zero_quantized_weights": True}
    assert "ZeRO stage" not in d["varied"] and "ZeRO++" not in d["varied"]


def test_recommend_help_says_given_options_are_held(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["recommend", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--stage 2 searches ZeRO-2 only" in text and "Options left out are searched" in text
    assert "exit status: 0 fits, 1 does not fit" in text


def test_recommend_exits_1_when_nothing_fits_with_the_held_stage(cli_main, capsys):
    # llama-2-70b at ZeRO-2 on 2 x 8 A100-80GB: 2Ψ of bf16 weights alone are 2 x 68.98e9 bytes = 128 GiB > 80 GiB
    # per GPU (ZeRO paper, Sec. 5: stage 2 keeps the full fp16 parameters), so nothing with stage 2 fits
    assert 2 * catalog.model("llama-2-70b").parameter_count > GPU_80GB_BYTES
    code, d = run(cli_main, capsys, "recommend", "--model", "llama-2-70b", "--nodes", "2", "--stage", "2")
    assert code == 1 and d["fits"] is False and d["choice"] is None and d["held"] == {"stage": 2}
    assert d["warnings"][0].startswith("Nothing fits with the options held (stage=2).")
    free = d["without_held"]  # with every option free, ZeRO-3 shards the weights and something fits
    assert free["fits"] and free["choice"]["stage"] == 3
    assert cli_main(["recommend", "--model", "llama-2-70b", "--nodes", "2"]) == 0


# -- 2. config says whether what it writes fits ------------------------------------------------------------------
def test_config_of_a_config_that_does_not_fit_exits_1_with_the_nearest_that_fits(cli_main, capsys, tmp_path):
    out = tmp_path / "ds.json"
    code, d = run(cli_main, capsys, "config", "--model", "llama-2-70b", "--nodes", "2", "-o", str(out))
    assert code == 1 and d["fits"] is False and d["verdict"]["fits"] is False
    assert json.loads(out.read_text()) == d["config"] and d["config"]["zero_optimization"]["stage"] == 2
    assert d["verdict"]["per_gpu_bytes"] > d["verdict"]["usable_gpu_memory_bytes"]
    near = d["nearest_fit"]
    assert near is not None and near["choice"]["stage"] == 3 and "stage 2 -> 3" in near["changes"]
    # the nearest configuration, written out as options, is one `estimate` says fits
    c = near["choice"]
    argv = ["estimate", "--model", "llama-2-70b", "--nodes", "2", "--stage", str(c["stage"]),
            "--offload-optimizer", c["offload_optimizer"], "--offload-param", c["offload_param"],
            "--checkpointing", c["checkpointing"], "--micro-batch", str(c["micro_batch"]),
            "--grad-accum", str(c["grad_accum"])]
    code, est = run(cli_main, capsys, *argv)
    assert code == 0 and est["fits"] and est["per_gpu_bytes"]["total"] == near["per_gpu_bytes"]


def test_config_names_what_is_short_when_nothing_fits(cli_main, capsys):
    # llama-2-70b on one node of 8 A100-80GB with 1024 GiB host RAM: ZeRO-3 without offload needs 16Ψ/8 of model
    # states per GPU (ZeRO paper Sec. 5, K = 12 for mixed-precision Adam): 16 x 68.98e9 / 8 = 128 GiB > 80 GiB
    # CPU offload of all states needs 16 B/param of host RAM: 16 x 68.98e9 = 1028 GiB > 1024 GiB; NVMe offload
    # would fit (docs/validation.md section 7) but the node's NVMe is set to 100 GiB, below the 16Ψ it would hold
    assert 16 * catalog.model("llama-2-70b").parameter_count / 8 > GPU_80GB_BYTES
    assert 16 * catalog.model("llama-2-70b").parameter_count > 1024 * GIB
    short = ["--model", "llama-2-70b", "--nvme-capacity-gib", "100"]
    code, d = run(cli_main, capsys, "config", *short)
    assert code == 1 and d["verdict"]["fits"] is False and d["nearest_fit"] is None
    assert d["nothing_fits"].startswith("Nothing fits.")
    code = cli_main(["config", *short])
    err = capsys.readouterr().err
    assert code == 1 and "does NOT fit" in err and "does not fit (exit status 1)" in err
    assert cli_main(["config", "--recommend", *short]) == 1  # does not fit, not bad input
    assert "no config written" in capsys.readouterr().err


def test_config_that_fits_exits_0_and_says_so(cli_main, capsys):
    code, d = run(cli_main, capsys, "config")
    assert code == 0 and d["verdict"]["fits"] and d["nearest_fit"] is None
    assert d["inputs"]["resolved"]["stage"] == d["config"]["zero_optimization"]["stage"] == 2


# -- 3. check says what it priced and what it took from the file -------------------------------------------------
def _write(tmp_path, name, obj_or_text) -> str:
    path = tmp_path / name
    path.write_text(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text))
    return str(path)


def test_check_reports_values_taken_from_the_file(cli_main, capsys, tmp_path):
    cfg = _write(tmp_path, "c.json", {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                      "fp16": {"enabled": True}, "zero_optimization": {"stage": 3}})
    code, d = run(cli_main, capsys, "check", cfg, "--model", "meta-llama/Llama-3.1-8B", "--seq-len", "2048",
                  "--stage", "2", "--micro-batch", "1", "--precision", "bf16", "--no-library-check")
    assert d["from_config"]["--stage"] == {"config": 3, "command_line": 2}
    assert d["from_config"]["--micro-batch"] == {"config": 4, "command_line": 1}
    assert d["from_config"]["--precision"] == {"config": "fp16", "command_line": "bf16"}
    assert any(f["rule"] == "from_config" and "--stage 3" in f["message"] for f in d["findings"])
    assert (d["priced"]["model"], d["priced"]["model_from"], d["priced"]["seq_len"]) == ("llama-3.1-8b", "--model",
                                                                                        2048)
    assert d["inputs"]["given"]["model"] == "meta-llama/Llama-3.1-8B" and d["inputs"]["resolved"]["stage"] == 3
    assert not any(f["rule"] == "assumed_model" for f in d["findings"])
    assert code == (0 if d["fits"] else 1)


def test_check_warns_when_it_assumes_the_model(cli_main, capsys, tmp_path):
    cfg = _write(tmp_path, "c.json", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
    _, d = run(cli_main, capsys, "check", cfg, "--no-library-check")
    assert d["priced"]["model_from"] == "default" and d["priced"]["model"] == "llama-2-7b"
    assert any(f["rule"] == "assumed_model" and f["severity"] == "warning" for f in d["findings"])


def test_check_takes_the_shape_from_an_accelerate_config(cli_main, capsys, tmp_path):
    cfg = _write(tmp_path, "c.json", {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}})
    acc = _write(tmp_path, "acc.yaml", "distributed_type: DEEPSPEED\nnum_machines: 2\nnum_processes: 8\n")
    code, d = run(cli_main, capsys, "check", cfg, "--accelerate-config", acc, "--no-library-check")
    assert (d["priced"]["nodes"], d["priced"]["gpus_per_node"], d["priced"]["data_parallel_degree"]) == (2, 4, 8)
    assert d["from_accelerate_config"] == {"--nodes": {"accelerate_config": 2, "command_line": 1},
                                           "--gpus-per-node": {"accelerate_config": 4, "command_line": 8}}
    bad = _write(tmp_path, "bad.yaml", "num_machines: 2\nnum_processes: 7\n")
    assert cli_main(["check", cfg, "--accelerate-config", bad]) == 2
    assert "--accelerate-config: num_processes 7 is not a multiple of num_machines 2" in capsys.readouterr().err
    evil = _write(tmp_path, "evil.yaml", '!!python/object/apply:os.system ["echo executed"]\n')
    assert cli_main(["check", cfg, "--accelerate-config", evil]) == 2  # safe_load: the tag is refused, not run
    assert "executed" not in capsys.readouterr().out


def test_check_hf_trainer_agrees_with_itself_about_stage3_auto(cli_main, capsys, tmp_path):
    """transformers trainer_config_finalize (integrations/deepspeed.py) fills stage3_prefetch_bucket_size =
    int(0.9 * h**2) and stage3_param_persistence_threshold = 10 * h only ``if self.is_zero3()``; llama-2-7b's h is
    4096 (catalog, meta-llama/Llama-2-7b-hf config.json)."""
    zero = {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto"}
    for stage in (3, 2):
        cfg = _write(tmp_path, f"z{stage}.json", {"train_micro_batch_size_per_gpu": "auto",
                                                  "zero_optimization": {"stage": stage, **zero}})
        _, d = run(cli_main, capsys, "check", cfg, "--hf-trainer", "--model", "llama-2-7b", "--no-library-check")
        filled = next(f["message"] for f in d["findings"] if f["rule"] == "auto_outside_hf" and not f["key"])
        not_filled = {f["key"] for f in d["findings"] if f["rule"] == "auto_not_filled"}
        stage3_keys = {"zero_optimization.stage3_prefetch_bucket_size",
                       "zero_optimization.stage3_param_persistence_threshold"}
        assert f"zero_optimization.reduce_bucket_size={4096 ** 2}" in filled
        if stage == 3:
            assert f"stage3_prefetch_bucket_size={int(0.9 * 4096 ** 2)}" in filled
            assert f"stage3_param_persistence_threshold={10 * 4096}" in filled and not not_filled & stage3_keys
            assert d["scenario"]["zero"]["stage3_prefetch_bucket_size"] == int(0.9 * 4096 ** 2)
        else:
            # below stage 3 the Trainer leaves them and accelerate's hidden-size fill takes them (judged: accepted)
            assert "stage3_prefetch_bucket_size=" not in filled and not not_filled & stage3_keys
            assert "accelerate's hidden-size fill" in filled


def test_check_reads_hjson_and_refuses_duplicate_keys(cli_main, capsys, tmp_path):
    """DeepSpeed 0.19.8 reads a config file with hjson.load(..., object_pairs_hook=dict_raise_error_on_duplicate_keys)
    (deepspeed/runtime/config.py): comments and trailing commas are fine, a duplicate key raises."""
    text = '{\n  // ZeRO-2\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 2,},\n}\n'
    code, d = run(cli_main, capsys, "check", _write(tmp_path, "h.json", text), "--no-library-check")
    assert code == 0 and d["errors"] == 0 and d["scenario"]["zero"]["stage"] == 2
    dup = '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "stage": 3}}'
    code, d = run(cli_main, capsys, "check", _write(tmp_path, "d.json", dup), "--no-library-check")
    assert code == 1 and any(f["rule"] == "duplicate_key" and f["severity"] == "error" for f in d["findings"])


def test_check_exits_1_when_the_config_does_not_fit(cli_main, capsys, tmp_path):
    # ZeRO-2 keeps 2Ψ of 16-bit weights per GPU: 2 x 68.98e9 bytes = 128 GiB > 80 GiB for llama-2-70b
    cfg = _write(tmp_path, "z2.json", {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                                       "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    code, d = run(cli_main, capsys, "check", cfg, "--model", "llama-2-70b", "--no-library-check")
    assert d["errors"] == 0 and d["fits"] is False and code == 1
    assert cli_main(["check", cfg, "--model", "llama-2-7b", "--no-library-check"]) == 0
    assert "fits; exit status 0" in capsys.readouterr().out


# -- 4. JSON echoes the inputs; exit statuses; hub ids; help ----------------------------------------------------
def test_estimate_json_echoes_resolved_inputs_and_exits_1_when_it_does_not_fit(cli_main, capsys):
    code, d = run(cli_main, capsys, "estimate", "--stage", "3", "--nodes", "2")
    assert code == 0 and d["inputs"]["given"] == {"stage": 3, "nodes": 2}
    r = d["inputs"]["resolved"]
    assert (r["stage"], r["nodes"], r["model"], r["gpu"], r["seq_len"]) == (3, 2, "llama-2-7b", "A100-80GB", 4096)
    assert set(r) == set(BY_KEY) and d["inputs"]["model_from"] == "default"
    code, d = run(cli_main, capsys, "estimate", "--model", "llama-2-70b")
    assert code == 1 and d["fits"] is False


def test_model_accepts_the_hub_id_of_a_catalog_entry(cli_main, capsys):
    # llama-3.1-8b's catalog source is "meta-llama/Llama-3.1-8B config.json"
    assert catalog.model_hub_ids()["meta-llama/Llama-3.1-8B"] == "llama-3.1-8b"
    _, by_name = run(cli_main, capsys, "estimate", "--model", "llama-3.1-8b")
    _, by_hub = run(cli_main, capsys, "estimate", "--model", "meta-llama/Llama-3.1-8B")
    assert by_hub["parameters"] == by_name["parameters"] == catalog.model("llama-3.1-8b").parameter_count
    assert by_hub["inputs"]["resolved"]["model"] == "llama-3.1-8b"
    assert by_hub["inputs"]["given"]["model"] == "meta-llama/Llama-3.1-8B"
    assert cli_main(["estimate", "--model", "meta-llama/No-Such-Model"]) == 2
    assert "hub id" in capsys.readouterr().err
    _, models = run(cli_main, capsys, "models")  # where the error message sends the user
    row = next(m for m in models["models"] if m["name"] == "llama-3.1-8b")
    assert row["hub_id"] == "meta-llama/Llama-3.1-8B" and row["source"].startswith(row["hub_id"])


@pytest.mark.parametrize("command", ["estimate", "recommend", "config", "check"])
def test_bad_input_is_exit_2_in_every_scenario_command(cli_main, capsys, command, tmp_path):
    argv = [command] + ([_write(tmp_path, "c.json", {"zero_optimization": {"stage": 2}})] if command == "check"
                        else []) + ["--micro-batch", "0"]
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    assert exc.value.code == 2 and "--micro-batch" in capsys.readouterr().err
    assert cli_main([*argv[:-2], "--model", "no-such-model"]) == 2


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def test_every_option_of_every_subcommand_has_help_and_shows_its_default():
    missing = []
    for name, sub in _subparsers().items():
        for a in sub._actions:
            if not a.option_strings or isinstance(a, argparse._HelpAction):
                continue
            text = (a.help or "").strip()
            if not text or text == argparse.SUPPRESS:
                missing.append(f"{name} {a.option_strings[0]}: no help")
                continue
            inp = BY_KEY.get(a.dest) if a.default is None else None
            scenario_default = inp.default if inp is not None and a.option_strings[0] == inp.cli_flag else None
            flag = isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            default = a.default if a.default is not None else scenario_default
            if default not in (None, False) and not flag and not a.required and "default" not in text.lower():
                missing.append(f"{name} {a.option_strings[0]}: default {default!r} not shown")
    assert not missing, missing


# -- 5. docs/guide.md's check run is real -----------------------------------------------------------------------
def test_readme_check_run_names_its_assumptions(cli_main, capsys, tmp_path, monkeypatch):
    """docs/guide.md's `check` example, run: the lines that state what it assumed and took from the file are the
    guide's, word for word (tests/core/test_readme.py compares the whole output)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "guide.md").read_text(encoding="utf-8")
    block = readme.split("$ zeroplanner config --model llama-3.1-8b", 1)[1].split("```", 1)[0]
    commands = [line[2:].split()[1:] for line in block.splitlines() if line.startswith("$ ")]
    config_argv = ("config --model llama-3.1-8b" + block.splitlines()[0]).split()
    monkeypatch.chdir(tmp_path)
    assert cli_main(config_argv) == 0
    capsys.readouterr()
    assert cli_main([*commands[0], "--no-library-check"]) == 1  # the train_batch_size error
    out = capsys.readouterr().out.splitlines()
    stated = [line for line in out if line.startswith(("Read as:", "Priced for:", "info: priced with the config"))]
    assert len(stated) == 3 and all(line in block for line in stated)


def test_check_prints_no_accelerator_detection_warning(tmp_path):
    """A new user's `zeroplanner check` on a laptop printed DeepSpeed's "Setting accelerator to CPU. If you have GPU
    ..." on stderr (real_accelerator.py get_accelerator, at import): validation uses no accelerator, so the line is
    filtered (zeroplanner.deepspeed.library._quiet). A fresh process, since deepspeed logs it once per import."""
    import os
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    run = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "check", str(path), "--model", "llama-2-7b"],
                         capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert run.returncode in (0, 1), run.stderr
    assert "Setting accelerator" not in run.stderr + run.stdout
    assert "Priced for: llama-2-7b" in run.stdout


def test_two_model_options_name_the_options(cli_main, capsys):
    """A new user's try-out: `--model X --params Y` answered with the Python names (model, hf_config, params)."""
    assert cli_main(["estimate", "--model", "llama-2-7b", "--params", "7e9"]) == 2
    err = capsys.readouterr().err
    assert "--model, --hf-config, --params" in err and err.count("\n") == 1


def test_a_verdict_that_does_not_fit_says_it_once(capsys):
    """The summary line of a configuration over the GPU's memory names what does not fit once: the step peak's own
    ": does not fit" is left to the bracketed verdict ("(-1714%) (does NOT fit: GPU memory)"), where a new user
    read "does not fit (does NOT fit: GPU memory)"."""
    from zeroplanner import build_scenario, estimate

    est = estimate(build_scenario(model="llama-2-70b", gpus_per_node=8, stage=0))
    first = est.summary().splitlines()[0]
    assert first.count("fit") == 1 and "(does NOT fit: GPU memory)" in first, first
    assert "peak in the optimizer step" in first and "headroom -" in first
    # StepPeak.verdict says ": does not fit" unless the sentence around it has (the app, reports and tutorial keep it)
    peak = est.step_peak
    assert peak.verdict().endswith(": does not fit")
    assert peak.verdict(unfit_said=True) == peak.verdict().removesuffix(": does not fit")
    assert first.startswith(peak.verdict(unfit_said=True) + " (does NOT fit")


def test_diagnose_says_a_predicted_misfit_once(tmp_path, capsys):
    """diagnose's remedy when the model agrees the run does not fit: "does not fit (peak ...; headroom -X)", not
    "does not fit (peak ...: does not fit)" (the twin of the summary line above)."""
    import json

    from zeroplanner.cli import main

    from .test_runlog_diagnose import BACKWARD, NEW

    log = tmp_path / "oom.log"
    log.write_text("\n".join(BACKWARD + [NEW]))
    main(["diagnose", str(log), "--model", "llama-2-70b", "--stage", "0", "--gpus-per-node", "8", "--json"])
    text = json.loads(capsys.readouterr().out)["remedy"]["text"]
    head = text.split("; the nearest configuration")[0]
    assert head.startswith("the model agrees this configuration does not fit (peak in the optimizer step: "), text
    assert head.count("does not fit") == 1 and "headroom -" in head, head
