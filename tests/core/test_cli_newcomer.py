"""What a newcomer hits first on the command line (a user's report of eight defects, each reproduced from the real
CLI before its fix): a directory or FIFO given where a file goes, a --params inside its documented range refused
with a message naming a nonexistent option, an HF config.json float count, misaligned catalog tables, lower-cased
and 1,800-character unknown-name messages, a ZeRO++ label that does not say which parts are on, a model
config.json handed to ``check``, and findings out of order.

Bad input: ONE line on stderr naming the user's option and its real range, exit status 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from zeroplanner import catalog
from zeroplanner.deepspeed import Finding
from zeroplanner.deepspeed.lint import lint, order_findings
from zeroplanner.planner import Choice, zeropp_parts
from zeroplanner.specs import Architecture

DATA = Path(__file__).resolve().parents[1] / "data"
HF_405B = DATA / "hf-configs" / "llama-3.1-405b.json"
"""meta-llama/Llama-3.1-405B's config.json as published on the hub (tests/data/hf-configs/README.md)."""
OOM_LOG = DATA / "run_logs" / "public" / "gpt4llm16_oom_1x_a100_zero3_broken_line.log"
"""A public training log ``diagnose`` reads (a CUDA OOM), so ``--config`` is reached."""

LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}
"""Llama-2-7B's shape keys (6,738,415,616 parameters, docs/references.md s.3), as in tests/core/test_cli.py."""

N_LAYERS_MAX = 1000
"""Architecture.n_layers's declared bound (zeroplanner/specs.py: ``Field(ge=1, le=1000)``), read back below."""


def _le(field: str) -> int:
    return next(m.le for m in Architecture.model_fields[field].metadata if getattr(m, "le", None) is not None)


def one_line_exit_2(cli_main, capsys, argv) -> str:
    """Run the command; assert exit 2, nothing on stdout, one line on stderr, no traceback; return that line."""
    try:
        code = cli_main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err and captured.out == "", captured
    assert lines[0].startswith("zeroplanner: error: "), lines[0]
    return lines[0]


# -- 1. a directory, a FIFO or a device where a file goes ------------------------------------------------------
@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    out = {"ds.json": tmp_path / "ds.json", "dir": tmp_path / "a folder", "fifo": tmp_path / "pipe"}
    out["ds.json"].write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    out["dir"].mkdir()
    os.mkfifo(out["fifo"])
    return out


# (the name the message gives, argv with PATH where the hostile path goes); one entry per user path the CLI reads
FILE_OPTIONS = {
    "estimate --hf-config": ("--hf-config", ["estimate", "--hf-config", "PATH"]),
    "estimate --cluster-from": ("--cluster-from", ["estimate", "--cluster-from", "PATH"]),
    "recommend --hf-config": ("--hf-config", ["recommend", "--hf-config", "PATH"]),
    "config --cluster-from": ("--cluster-from", ["config", "--cluster-from", "PATH"]),
    "check CONFIG": ("CONFIG", ["check", "PATH"]),
    "check --accelerate-config": ("--accelerate-config", ["check", "{ds.json}", "--accelerate-config", "PATH"]),
    "check --hf-config": ("--hf-config", ["check", "{ds.json}", "--hf-config", "PATH"]),
    "diagnose LOG": ("LOG", ["diagnose", "PATH"]),
    "diagnose --config": ("--config", ["diagnose", str(OOM_LOG), "--config", "PATH"]),
    "diagnose --hf-config": ("--hf-config", ["diagnose", str(OOM_LOG), "--hf-config", "PATH"]),
}
KINDS = {"dir": "is a directory, not a regular file", "fifo": "is a FIFO (named pipe), not a regular file"}


@pytest.mark.timeout(60)  # a FIFO opened for reading without a writer would block forever
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(FILE_OPTIONS))
def test_a_directory_or_fifo_where_a_file_goes_is_one_line_exit_2(cli_main, capsys, files, command, kind):
    option, argv = FILE_OPTIONS[command]
    path = str(files[kind])
    argv = [path if a == "PATH" else str(files[a[1:-1]]) if a.startswith("{") else a for a in argv]
    line = one_line_exit_2(cli_main, capsys, argv)
    # one shared reader (zeroplanner.cli.common.read_input_file): the same shape for every option
    assert line == f"zeroplanner: error: {option}: {path!r} {KINDS[kind]}"


def test_a_character_device_is_refused_like_a_directory(cli_main, capsys):
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--hf-config", os.devnull])
    assert line == f"zeroplanner: error: --hf-config: {os.devnull!r} is a character device, not a regular file"


def test_a_hub_snapshot_folder_given_to_hf_config_points_at_its_config_json(cli_main, capsys, tmp_path):
    folder = tmp_path / "Llama-2-7b-hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA2_7B))
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--hf-config", str(folder)])
    assert line.endswith(f"is a directory, not a regular file; pass the file inside it: {folder / 'config.json'}")


# -- 2. --params: its documented range is the range that works -------------------------------------------------
def test_params_documented_range_is_the_real_one(cli_main, capsys):
    from zeroplanner.inputs import BY_KEY

    low, high = BY_KEY["params"].low, BY_KEY["params"].high
    assert (low, high) == (1e6, 1e15)  # --help: "[1000000, 1000000000000000]"
    for value in ("2e14", "1e15", "1e6"):  # 2e14 said "--n_layers: Input should be less than or equal to 1000"
        assert cli_main(["estimate", "--params", value, "--json"]) in (0, 1)
        assert json.loads(capsys.readouterr().out)["parameters"] == int(float(value))
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--params", "2e16"])
    assert "--params must be an integer in [1000000, 1000000000000000] (got '2e16')" in line


def test_a_bare_parameter_count_builds_across_the_whole_range():
    assert _le("n_layers") == N_LAYERS_MAX
    counts = [int(10 ** (6 + 9 * i / 200)) for i in range(201)] + [190_000_000_000_000, 200_000_000_000_000]
    for n in counts:
        arch = Architecture.from_parameter_count(n)
        assert arch.parameter_count == n and 1 <= arch.n_layers <= N_LAYERS_MAX
    # past ~1.9e14 the layer count stays at the field's bound and the width grows instead
    widest = Architecture.from_parameter_count(10**15)
    assert widest.n_layers == N_LAYERS_MAX and widest.hidden_size % 128 == 0
    # its name says the count in B or T, never in exponent notation (a new user read "generic-1e+06B" for 1e15)
    assert all("e+" not in Architecture.from_parameter_count(n).name for n in counts + [10**15])
    names = {n: Architecture.from_parameter_count(n).name for n in
             (10**6, 5 * 10**8, 6_740_000_000, 999_400_000_000, 999_500_000_000, 10**12, 1_500_000_000_000,
              999_400_000_000_000, 999_500_000_000_000, 10**15)}
    assert names == {10**6: "generic-0.001B", 5 * 10**8: "generic-0.5B", 6_740_000_000: "generic-6.74B",
                     999_400_000_000: "generic-999B", 999_500_000_000: "generic-1T", 10**12: "generic-1T",
                     1_500_000_000_000: "generic-1.5T", 999_400_000_000_000: "generic-999T",
                     999_500_000_000_000: "generic-1000T", 10**15: "generic-1000T"}


def test_a_model_field_no_option_sets_is_named_through_the_models_option(cli_main, capsys, monkeypatch):
    """A model the Architecture refuses is the fault of the option that gave the model (--params here), named
    with the field and its value; never as an option like --n_layers that does not exist."""
    import zeroplanner.cli.common as common

    def refuse(**_):
        Architecture(name="x", n_layers=2000, hidden_size=128, n_heads=1, ffn_size=256, vocab_size=10)

    monkeypatch.setattr(common, "build_scenario", refuse)
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--params", "7e9"])
    assert line == ("zeroplanner: error: --params: the model's n_layers: Input should be less than or equal to "
                    "1000 (got 2000)")


# -- 3. an HF config.json count that is a float, or out of range -----------------------------------------------
@pytest.mark.parametrize("value, shown", [(1e12, "1000000000000.0, a number with a fraction or exponent"),
                                          (32.0, "32.0, a number with a fraction or exponent"),
                                          (2000, "2000")])
def test_an_hf_layer_count_names_the_key_and_its_real_range(cli_main, capsys, tmp_path, value, shown):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA2_7B, "num_hidden_layers": value}))
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--hf-config", str(path)])
    # the range is Architecture.n_layers's (1000), not MAX_CONFIG_INTEGER (1e8) nor a bare ">= 1"
    assert line == ("zeroplanner: error: --hf-config: config.json key 'num_hidden_layers' must be an integer "
                    f"between 1 and {N_LAYERS_MAX:,} (got {shown})")


def test_an_hf_expert_count_beyond_the_model_range_names_the_key(cli_main, capsys, tmp_path):
    qwen3_moe = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                     num_attention_heads=32, num_key_value_heads=4, vocab_size=151936, head_dim=128,
                     num_experts=20_000, moe_intermediate_size=768, num_experts_per_tok=8)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen3_moe))
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--hf-config", str(path)])
    assert f"key 'num_experts' must be an integer between 1 and {_le('n_experts'):,} (got 20000)" in line


# -- 4. catalog tables line up whatever the names' lengths -------------------------------------------------------
@pytest.mark.parametrize("kind, anchors", [
    ("models", [r" B params", r" layers", r"h="]),
    ("gpus", [r" GiB", r" TFLOP/s", r" GB/s$"]),
    ("networks", [r" Gbit/s per node", r" GB/s bus bandwidth", r" us/step$"]),
])
def test_catalog_columns_line_up(cli_main, capsys, kind, anchors):
    assert cli_main([kind]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(getattr(catalog, f"{kind[:-1]}_names")())
    longest = max(len(line.split("  ")[0]) for line in lines)
    assert longest >= 9  # the longest name is wider than the shortest, so a fixed width would show
    for anchor in anchors:  # numbers are right-aligned: each unit sits in the same column on every row
        columns = {re.search(anchor, line).start() for line in lines}
        assert len(columns) == 1, (anchor, columns)
    assert all(line == line.rstrip() for line in lines)


# -- 5. unknown names: catalog spelling, five suggestions, short --------------------------------------------------
def test_an_unknown_gpu_suggests_names_as_the_catalog_spells_them(cli_main, capsys):
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--gpu", "h200x"])
    assert "H200" in catalog.gpu_names()
    suggested = line.split("closest catalog names: ")[1].split(" (")[0].split(", ")
    assert suggested[0] == "H200" and len(suggested) == 5 and set(suggested) <= set(catalog.gpu_names())
    assert "`zeroplanner gpus` lists all" in line


def test_an_unknown_model_is_a_short_line_with_five_close_names(cli_main, capsys):
    known = set(catalog.model_names()) | set(catalog.model_hub_ids())
    # the old line listed every catalog name (59 names, 793 characters of names alone)
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--model", "foo"])
    assert len(line) < 300, len(line)
    suggested = line.split("closest catalog names: ")[1].split(" (")[0].split(", ")
    assert len(suggested) == 5 and set(suggested) <= known
    assert "`zeroplanner models` lists all" in line
    line = one_line_exit_2(cli_main, capsys, ["estimate", "--model", "LLAMA-2-7"])
    assert line.split("closest catalog names: ")[1].startswith("llama-2-7b, llama-2-70b")  # contains it first


# -- 6. the ZeRO++ label says which parts are on ------------------------------------------------------------------
def test_zeropp_label_names_its_parts():
    base = dict(stage=3, offload_optimizer="none", offload_param="none", checkpointing="full", micro_batch=8,
                grad_accum=1)
    tail = "(full activation checkpointing, micro-batch 8 x 1 accumulation steps)"
    all_on = Choice(**base, zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True)
    assert all_on.label == f"ZeRO-3 + ZeRO++ (hpZ 8, qwZ, qgZ) {tail}"
    # qgZ alone used to give no ZeRO++ in the label at all
    assert Choice(**base, zero_quantized_gradients=True).label == f"ZeRO-3 + ZeRO++ (qgZ) {tail}"
    assert Choice(**base).label == f"ZeRO-3 {tail}"
    assert zeropp_parts(1, False, False) == ""


def test_recommend_says_which_zeropp_parts_it_picked(cli_main, capsys):
    # README's example: 2 nodes on 1 Gbit/s ethernet, where the planner picks hpZ = GPUs per node
    argv = ["recommend", "--model", "llama-2-13b", "--gpus-per-node", "8", "--nodes", "2", "--network", "eth-1g"]
    assert cli_main([*argv, "--json"]) == 0
    choice = json.loads(capsys.readouterr().out)["choice"]
    assert choice["zero_hpz_partition_size"] == 8 and not choice["zero_quantized_weights"]
    assert choice["label"].startswith("ZeRO-3 + ZeRO++ (hpZ 8) (")
    assert cli_main(argv) == 0
    assert capsys.readouterr().out.startswith(f"Recommended: {choice['label']}\n")


# -- 7. a Hugging Face model config.json handed to check -----------------------------------------------------------
def test_check_recognises_a_model_config_json(cli_main, capsys):
    assert cli_main(["check", str(HF_405B), "--json"]) == 1  # 1: the config has an error
    obj = json.loads(capsys.readouterr().out)
    assert [f["rule"] for f in obj["findings"]] == ["hf_model_config"]  # was 1 error + 25 unknown-key warnings
    [f] = obj["findings"]
    assert f["severity"] == "error" and "Hugging Face model config.json" in f["message"]
    assert f"--hf-config {HF_405B}" in f["fix"]
    assert (obj["errors"], obj["warnings"], obj["estimate"]) == (1, 0, None)
    assert cli_main(["check", str(HF_405B)]) == 1
    text = capsys.readouterr().out
    assert "unknown" not in text and "ignores it without a word" not in text
    assert text.startswith("error: this is a Hugging Face model config.json") and len(text.splitlines()) == 2


def test_a_model_config_json_as_diagnose_config_is_one_line(cli_main, capsys):
    line = one_line_exit_2(cli_main, capsys, ["diagnose", str(OOM_LOG), "--config", str(HF_405B)])
    assert "is a Hugging Face model config.json, not a DeepSpeed config; pass it as --hf-config" in line


def test_a_deepspeed_config_with_a_model_type_key_is_still_linted():
    # a DeepSpeed key present: not a model config, the usual rules run
    rules = {f.rule for f in lint({"model_type": "llama", "hidden_size": 8, "train_batch_size": 7,
                                   "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1})}
    assert "hf_model_config" not in rules and "batch_mismatch" in rules


# -- 8. findings: each once, errors first, then warnings, then infos -------------------------------------------------
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def test_order_findings_dedupes_and_sorts():
    info = Finding(severity="info", key="", message="read as stage 3")
    warn = Finding(severity="warning", key="a", message="slow")
    err = Finding(severity="error", key="a", message="slow", rule="r")  # the same statement, more severe
    other = Finding(severity="error", key="b", message="bad")
    # the more severe statement takes the place where it was first said; the order given is kept within a severity
    assert order_findings([info, warn, info, other, err]) == [err, other, info]


def test_lint_merges_the_readers_findings_in_order():
    """lint() is what the app lists; its reader's findings merged in come out de-duplicated and sorted too."""
    config = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}}
    own = lint(config)
    read = [Finding(severity="info", key="", message="read"), own[0]]
    merged = lint(config, merge=read)
    assert len(merged) == len(own) + 1
    assert [SEVERITY_RANK[f.severity] for f in merged] == sorted(SEVERITY_RANK[f.severity] for f in merged)


@pytest.mark.parametrize("extra", [[], ["--hf-trainer"]])
def test_check_findings_are_unique_and_errors_first(cli_main, capsys, tmp_path, extra):
    # errors (fp16 with bf16), warnings (unknown top-level key) and infos (no optimizer block) together
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True},
                                "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
                                "not_a_key": 1}))
    assert cli_main(["check", str(path), "--no-library-check", "--json", *extra]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    ranks = [SEVERITY_RANK[f["severity"]] for f in findings]
    assert set(ranks) == {0, 1, 2} and ranks == sorted(ranks)
    said = [(f["key"], f["message"]) for f in findings]
    assert len(said) == len(set(said))
    assert cli_main(["check", str(path), "--no-library-check", *extra]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.split(" ", 1)[0].rstrip(":") in SEVERITY_RANK]
    text_ranks = [SEVERITY_RANK[ln.split(" ", 1)[0].rstrip(":")] for ln in lines]
    assert text_ranks == ranks
