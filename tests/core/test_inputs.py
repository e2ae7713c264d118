"""The input table (zeroplanner/inputs.py) drives every front end: each input set through the CLI, a share link and
the app's control gives the same Scenario and the same DeepSpeed config; bad values give one line naming the input
and its allowed range in each."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from zeroplanner import inputs as table
from zeroplanner.cli import build_parser, main, scenario_from_args
from zeroplanner.deepspeed import from_deepspeed_config, to_deepspeed_config
from zeroplanner.inputs import BY_KEY, INPUTS
from zeroplanner.scenarios import build_scenario
from zeroplanner.share import ShareError, format_value, read_link, scenario_from_query
from zeroplanner.specs import ClusterSpec, Scenario, TrainingSpec, ZeroSpec

# input key -> (a value that is not the default, inputs it needs besides itself). Adding an input to the table
# without an example here fails test_every_input_has_an_example.
EXAMPLES: dict[str, tuple[object, dict]] = {
    "model": ("llama-2-13b", {}),
    "params": (3_000_000_000, {}),
    "gpu": ("H100-80GB", {}),
    "gpu_memory_gib": (40.0, {}),
    "gpus_per_node": (4, {}),
    "nodes": (4, {}),
    "network": ("eth-25g", {"nodes": 2}),
    "inter_node_gbps": (100.0, {"nodes": 2}),
    "cpu_memory_gib": (512.0, {}),
    "stage": (3, {}),
    "offload_optimizer": ("cpu", {}),
    "offload_param": ("cpu", {"stage": 3}),
    "precision": ("fp16", {}),
    "optimizer": ("sgd", {}),
    "micro_batch": (4, {}),
    "grad_accum": (2, {}),
    "seq_len": (2048, {}),
    "checkpointing": ("selective", {}),
    "flash_attention": (False, {}),
    "lora_rank": (16, {}),
    "qlora": (True, {"lora_rank": 16}),
    "mfu": (0.5, {}),
    "reduce_bucket_size": (200_000_000, {}),
    "allgather_bucket_size": (100_000_000, {}),
    "stage3_prefetch_bucket_size": (10_000_000, {"stage": 3}),
    "overlap_comm": (False, {}),
    "contiguous_gradients": (False, {}),
    "stage3_param_persistence_threshold": (10_000, {"stage": 3}),
    "stage3_max_live_parameters": (300_000_000, {"stage": 3}),
    "stage3_max_reuse_distance": (0, {"stage": 3}),
    "zero_hpz_partition_size": (8, {"stage": 3, "nodes": 2}),
    "zero_quantized_weights": (True, {"stage": 3, "nodes": 2}),
    "zero_quantized_gradients": (True, {"stage": 3, "nodes": 2}),
    "pin_memory": (False, {"stage": 3, "offload_optimizer": "cpu"}),
    "freeze_vision": (True, {"model": "qwen2.5-vl-7b"}),
    "images_per_sample": (2, {"model": "qwen2.5-vl-7b"}),
    "allow_lossy_communication": (True, {}),
    "nvme_capacity_gib": (2048.0, {"stage": 3, "offload_optimizer": "nvme"}),
    "cpu_adam_params_per_second": (1.4e9, {"stage": 2, "offload_optimizer": "cpu"}),
    "cpu_adam_threads_per_rank": (8, {"stage": 2, "offload_optimizer": "cpu"}),
    "host_cpu_cores_per_node": (16, {"stage": 2, "offload_optimizer": "cpu", "cpu_adam_threads_per_rank": 8}),
    "sequence_parallel_size": (2, {}),
    "tiled_mlp": (True, {}),
    "tiled_loss": (True, {}),
    "checkpoint_offload": (True, {"checkpointing": "full"}),
    "bnb_4bit_quant_storage": ("bfloat16", {"lora_rank": 16, "qlora": True, "stage": 3}),
    "autotp_size": (2, {}),
}
NO_APP_CONTROL = {"stage", "offload_optimizer", "offload_param", "tiled_mlp", "tiled_loss", "checkpoint_offload",
                  "host_cpu_cores_per_node"}
"""The app compares every stage and offload choice side by side (and the planner picks one), so it has no control
for them; it takes them from a link (checked below). The ALST memory switches and the host's core count (it only
matters with more CPU-Adam threads than cores) are CLI and link inputs."""


def cli_argv(values: dict) -> list[str]:
    """Scenario options spelling ``values`` (input key -> value) as a user types them."""
    argv: list[str] = []
    for key, value in values.items():
        inp = BY_KEY[key]
        if inp.kind == "bool":
            if inp.nullable:
                argv.append(f"--{key.replace('_', '-')}" if value else f"--no-{key.replace('_', '-')}")
            else:
                assert value != inp.default, key  # a flag only moves a bool away from its default
                argv.append(inp.cli_flag)
        else:
            argv += [inp.cli_flag, format_value(key, value)]
    return argv


def via_cli(values: dict) -> Scenario:
    return scenario_from_args(build_parser().parse_args(["estimate", *cli_argv(values)]))


def via_link(values: dict) -> Scenario:
    from urllib.parse import urlencode

    return scenario_from_query(urlencode({k: format_value(k, v) for k, v in values.items()}))


def widget_value(inp, value):
    for shown, meant in inp.widget.values:
        if meant == value:
            return shown
    return value / inp.widget.scale if inp.widget.scale != 1 else value


def via_app(values: dict, key: str):
    """The app opened on the example's other inputs, then the input's own widget moved."""
    from zeroplanner.ui import PlannerApp
    from zeroplanner.ui.state import state_from_scenario

    context = {k: v for k, v in values.items() if k != key}
    app = PlannerApp(state=state_from_scenario(build_scenario(**context)))
    inp = BY_KEY[key]
    app.controls.widgets[inp.control_key].value = widget_value(inp, values[key])
    assert app.message.value == "", app.message.value
    return app


def test_every_input_has_an_example():
    assert set(EXAMPLES) == set(BY_KEY)
    for key, (value, _) in EXAMPLES.items():
        assert value != BY_KEY[key].default, key


@pytest.mark.parametrize("key", list(BY_KEY))
def test_each_input_gives_the_same_scenario_and_config_through_cli_link_and_app(key, capsys):
    pytest.importorskip("ipywidgets")
    value, context = EXAMPLES[key]
    values = {**context, key: value}
    expected = build_scenario(**values)
    assert expected != build_scenario(**context), f"{key}={value!r} changed nothing"
    assert BY_KEY[key].read(expected) == value or key == "model"  # the table reads back what it wrote
    assert via_cli(values) == expected
    assert via_link(values) == expected
    config = to_deepspeed_config(expected)
    assert main(["config", *cli_argv(values)]) == 0
    assert json.loads(capsys.readouterr().out) == config
    if key in NO_APP_CONTROL:
        assert BY_KEY[key].control_key is None
        from zeroplanner.ui.app import initial_state

        import os
        from urllib.parse import urlencode

        os.environ["QUERY_STRING"] = urlencode({k: format_value(k, v) for k, v in values.items()})
        try:
            assert initial_state()[0].scenario == expected
        finally:
            del os.environ["QUERY_STRING"]
        return
    app = via_app(values, key)
    assert app.state.scenario == expected
    assert to_deepspeed_config(app.state.scenario) == config
    # and the widget shows it back after a recompute
    assert app.controls.widgets[BY_KEY[key].control_key].value == widget_value(BY_KEY[key], value) or \
        BY_KEY[key].kind in ("model",)


def test_zeropp_from_the_app_makes_the_scenario_zero3_and_passes_deepspeeds_config_classes():
    pytest.importorskip("ipywidgets")
    zero_config = pytest.importorskip("deepspeed.runtime.zero.config")
    from zeroplanner.ui import PlannerApp

    app = PlannerApp()
    app.set(nodes=2, zero_hpz_partition_size=8, zero_quantized_weights=True, zero_quantized_gradients=True)
    expected = build_scenario(nodes=2, stage=3, zero_hpz_partition_size=8, zero_quantized_weights=True,
                              zero_quantized_gradients=True)
    assert app.state.scenario == expected
    assert via_cli({"nodes": 2, "stage": 3, "zero_hpz_partition_size": 8, "zero_quantized_weights": True,
                    "zero_quantized_gradients": True}) == expected
    assert app.view.memory.labels[-1] == "ZeRO-3 + ZeRO++ (hpZ 8, qwZ, qgZ)"
    block = to_deepspeed_config(expected)["zero_optimization"]
    parsed = zero_config.DeepSpeedZeroConfig(**block)
    assert (parsed.zero_hpz_partition_size, parsed.zero_quantized_weights, parsed.zero_quantized_gradients) == \
        (8, True, True)
    # and a DeepSpeed config carrying them reads back into the same scenario
    assert from_deepspeed_config(to_deepspeed_config(expected), base=expected)[0] == expected


def _out_of_range(inp):
    return inp.high + 1 if inp.kind == "int" else inp.high * 2


@pytest.mark.parametrize("key", [i.key for i in INPUTS if i.kind in ("int", "float")])
def test_out_of_range_is_one_line_naming_the_input_and_its_range(key):
    inp = BY_KEY[key]
    bad = _out_of_range(inp)
    text = format_value(key, bad)
    with pytest.raises(ShareError) as info:
        scenario_from_query(f"{key}={text}", strict=True)
    assert info.value.key == key and inp.range_text in str(info.value)
    link = read_link(f"{key}={text}")  # a link leaves it out, names it with the same range, applies the rest
    assert link.scenario == build_scenario() and link.ignored[0].key == key and inp.range_text in link.note
    proc = subprocess.run([sys.executable, "-m", "zeroplanner.cli", "estimate", inp.cli_flag, text],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and inp.cli_flag in lines[0] and inp.range_text in lines[0], proc.stderr
    if inp.control_key is None or key == "params":
        return
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.state import apply_changes, default_state, error_message

    with pytest.raises(ValueError) as app_info:
        apply_changes(default_state(), {inp.control_key: bad / inp.widget.scale})
    message = error_message(app_info.value)
    assert "\n" not in message and inp.range_text in message and inp.path.split(".")[-1] in message, message


def test_bounds_are_the_spec_fields_own():
    """No bound is written twice: the table's ranges are the pydantic fields' (in the input's unit)."""
    assert BY_KEY["seq_len"].high == TrainingSpec.model_fields["seq_len"].metadata[-1].le == 33_554_432
    assert BY_KEY["micro_batch"].range_text == "[1, 65536]"
    assert BY_KEY["cpu_memory_gib"].range_text == f"[1, {2**50 // 2**30}]"
    assert BY_KEY["mfu"].range_text == "(0, 1]"
    assert BY_KEY["nodes"].high == ClusterSpec.model_fields["nodes"].metadata[-1].le
    assert BY_KEY["zero_hpz_partition_size"].high == ZeroSpec.model_fields["zero_hpz_partition_size"].metadata[-1].le
    assert BY_KEY["precision"].choices == ("bf16", "fp16", "fp32")
    assert BY_KEY["grad_accum"].default == 8  # build_scenario's, not the field's 1
    assert table.zero_aliases("int")["prefetch_bucket_size"] == "stage3_prefetch_bucket_size"


# -- one grammar per input (issue 30, item 6): Input.parse, read by the CLI, share links and the app -----------------
TYPED = [  # (input key, what a user types, the value it means)
    ("params", "7B", 7_000_000_000), ("params", "1.5B", 1_500_000_000), ("params", "7e9", 7_000_000_000),
    ("params", "500M", 500_000_000), ("model", "Qwen/Qwen3-8B", "qwen3-8b"), ("model", "LLAMA-2-13B", "llama-2-13b"),
    ("gpu", "h100-80gb", "H100-80GB"), ("nodes", "4", 4), ("nodes", "2.0", 2), ("seq_len", "4k", 4000),
    ("mfu", ".5", 0.5), ("gpu_memory_gib", "40", 40.0), ("precision", "FP16", "fp16"),
    ("checkpointing", "selective", "selective"), ("overlap_comm", "off", False), ("qlora", "yes", True),
]
BAD = [  # (input key, text, words of the one message every front end gives)
    ("nodes", "abc", "must be an integer in [1, 100000] (got 'abc')"),
    ("nodes", "1.5", "must be an integer in [1, 100000]"), ("nodes", "1_000", "must be an integer"),
    ("params", "7", "[1000000, 1000000000000000] (got '7'); a count such as 7e9, 7B or 500M"),
    ("mfu", "nan", "must be a number in (0, 1]"), ("mfu", "0x10", "must be a number"),
    ("precision", "bf17", "must be one of bf16, fp16, fp32"),
    ("model", "gpt-5", "unknown model 'gpt-5'; closest catalog names: "),
    ("model", "no-owner/Qwen3-8B", "unknown model"),  # a hub id no catalog entry has: nothing is fetched
    ("model", "a b", "contains spaces"), ("gpu", "x" * 80, "the limit is 64"),
]


@pytest.mark.parametrize(("key", "text", "value"), TYPED, ids=lambda v: str(v))
def test_a_typed_value_means_the_same_in_the_cli_a_link_and_the_app(key, text, value):
    inp = BY_KEY[key]
    assert inp.parse(text) == value
    context = {"lora_rank": 16} if key == "qlora" else {}
    expected = build_scenario(**context, **{key: value})
    argv = ["--lora-rank", "16"] if context else []
    if inp.kind == "bool":  # a CLI flag, not a value: the same value through the flag
        argv += [f"--{key.replace('_', '-')}" if value else f"--no-{key.replace('_', '-')}"]
    else:
        argv += [inp.cli_flag, text]
    assert scenario_from_args(build_parser().parse_args(["estimate", *argv])) == expected
    assert scenario_from_query("&".join([*(f"{k}={v}" for k, v in context.items()), f"{key}={text}"]),
                               strict=True) == expected
    if inp.control_key is None or inp.widget.kind == "checkbox":
        return
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.state import apply_changes, state_from_scenario

    state = apply_changes(state_from_scenario(build_scenario(**context)), {inp.control_key: text})
    assert state.scenario == expected


@pytest.mark.parametrize(("key", "text", "words"), BAD, ids=lambda v: str(v)[:20])
def test_a_bad_typed_value_is_one_message_naming_the_input_everywhere(key, text, words, capsys):
    inp = BY_KEY[key]
    with pytest.raises(table.InputError) as info:
        inp.parse(text)
    assert info.value.key == key and words in info.value.detail
    if inp.kind in table.CATALOG_KINDS:  # kept as typed by argparse (JSON "given"), checked building the scenario
        assert main(["estimate", inp.cli_flag, text]) == 2
    else:  # checked by argparse (the option's type)
        with pytest.raises(SystemExit) as exit_info:
            main(["estimate", inp.cli_flag, text])
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{inp.cli_flag}" in err and words in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(ShareError) as share_info:
        scenario_from_query(f"{key}={text}", strict=True)
    assert share_info.value.key == key and words in str(share_info.value)
    assert words in read_link(f"{key}={text}").note
    if inp.control_key is None:
        return
    pytest.importorskip("ipywidgets")
    from zeroplanner.ui.state import apply_changes, default_state, error_message

    with pytest.raises(ValueError) as app_info:
        apply_changes(default_state(), {inp.control_key: text})
    assert words in error_message(app_info.value)


def test_the_app_takes_a_hub_id_and_opens_a_link_with_a_note_naming_what_it_ignored(monkeypatch):
    pytest.importorskip("ipywidgets")
    import html

    from zeroplanner.ui import PlannerApp
    from zeroplanner.ui.app import initial_state

    app = PlannerApp(debounce_seconds=0)
    app.set(model="Qwen/Qwen3-8B")
    assert app.message.value == "" and app.state.scenario == build_scenario(model="qwen3-8b")
    assert app.controls.widgets["model"].value == "qwen3-8b"
    state, note = initial_state({"QUERY_STRING": "model=llama-2-13b&nodez=4&nodes=abc"})
    assert state.scenario == build_scenario(model="llama-2-13b")
    assert "nodez (unknown key; did you mean nodes?)" in note and "nodes (must be an integer" in note
    monkeypatch.setenv("QUERY_STRING", "model=Qwen/Qwen3-8B&params=7B&nodes=2&nodez=4")
    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    app = PlannerApp(debounce_seconds=0)
    assert app.state.scenario == build_scenario(model="qwen3-8b", nodes=2)
    shown = html.unescape(app.message.value)
    assert shown.startswith("<div class='zp-error'>Not used from the link: nodez (unknown key")
    assert "params (give either model or params, not both; the model was used)" in shown
