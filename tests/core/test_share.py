"""Shareable scenarios: query string and JSON round trips; a link's unknown or bad key left out and named (the rest
applied), the strict readings' refusal of hostile or malformed input naming the key."""

from __future__ import annotations

import json
import re
import warnings
from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeroplanner import catalog
from zeroplanner.costmodel import estimate
from zeroplanner.catalog.hfconfig import architecture_from_hf_config
from zeroplanner.scenarios import build_scenario
from zeroplanner.share import (
    KEYS,
    MAX_QUERY_CHARS,
    SHARE_KEYS,
    Ignored,
    ShareError,
    ShareWarning,
    link_from_environment,
    page_url,
    parse_query,
    read_link,
    scenario_from_environment,
    scenario_from_json,
    scenario_from_query,
    scenario_inputs,
    scenario_to_json,
    scenario_to_query,
    share_link,
)
from zeroplanner.specs import Architecture, OffloadSpec

CLI_OPTIONS = ("model", "params", "gpu", "gpu_memory_gib", "gpus_per_node", "nodes", "network", "inter_node_gbps",
               "cpu_memory_gib", "stage", "offload_optimizer", "offload_param", "precision", "optimizer",
               "micro_batch", "grad_accum", "seq_len", "checkpointing", "flash_attention", "lora_rank", "qlora",
               "mfu")


def test_keys_are_the_cli_scenario_options():
    """The brief's key list: the CLI's scenario option names with underscores (zeroplanner/cli/common.py, generated from zeroplanner/inputs.py)."""
    names = [k.name for k in SHARE_KEYS]
    assert names[:len(CLI_OPTIONS)] == list(CLI_OPTIONS)
    import argparse

    from zeroplanner.cli import add_scenario_options

    parser = argparse.ArgumentParser()
    add_scenario_options(parser)
    dests = {a.dest for a in parser._actions}
    assert set(names) <= dests  # every link key is a CLI option too (both come from zeroplanner.inputs.INPUTS)
    flags = {f for a in parser._actions for f in a.option_strings}
    assert {"--no-flash-attention", "--no-pin-memory", "--overlap-comm", "--no-overlap-comm"} <= flags


def test_brief_example_builds_the_named_scenario():
    s = scenario_from_query("?model=llama-2-70b&nodes=4&network=ib-hdr")
    assert s == build_scenario(model="llama-2-70b", nodes=4, network="ib-hdr")
    assert s.cluster.nodes == 4 and s.model.name == "llama-2-70b" and s.cluster.network.name == "ib-hdr"


@pytest.mark.parametrize("model", catalog.model_names())
def test_round_trip_for_every_catalog_model(model):
    s = build_scenario(model=model, nodes=2, gpu="H100-80GB", network="ib-ndr", stage=3, micro_batch=2)
    query = scenario_to_query(s)
    assert scenario_from_query(query) == s
    assert f"model={model}" in query


def test_round_trip_with_every_key_set():
    s = build_scenario(params=13_000_000_000, gpu="A100-40GB", gpu_memory_gib=38.5, gpus_per_node=4, nodes=3,
                       network="eth-25g", inter_node_gbps=50, cpu_memory_gib=512, stage=3,
                       offload_optimizer="cpu", offload_param="cpu", precision="fp16", optimizer="adam8bit",
                       micro_batch=2, grad_accum=16, seq_len=2048, checkpointing="selective", flash_attention=False,
                       lora_rank=16, qlora=True, mfu=0.33, cpu_adam_params_per_second=2e9,
                       cpu_adam_threads_per_rank=4, host_cpu_cores_per_node=32,
                       zero_overrides={"reduce_bucket_size": 200_000_000, "allgather_bucket_size": 100_000_000,
                                       "stage3_prefetch_bucket_size": 10_000_000, "overlap_comm": False})
    query = scenario_to_query(s, full=True)
    assert [k for k, _ in parse_qsl(query)] == [k.name for k in SHARE_KEYS if k.name != "model"]
    assert scenario_from_query(query) == s
    assert len(query) < MAX_QUERY_CHARS
    # the estimate the link reproduces is the same to the byte
    assert estimate(scenario_from_query(query)) == estimate(s)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(catalog.model_names()),
    gpu=st.sampled_from(catalog.gpu_names()),
    network=st.sampled_from(catalog.network_names()),
    nodes=st.integers(1, 512),
    gpus=st.sampled_from([1, 2, 4, 8]),
    stage=st.integers(0, 3),
    micro_batch=st.integers(1, 64),
    grad_accum=st.integers(1, 64),
    seq_len=st.integers(128, 32768),
    gbps=st.one_of(st.none(), st.floats(0.1, 6400, allow_nan=False)),
    mfu=st.one_of(st.none(), st.floats(0.01, 1.0)),
    cpu_gib=st.floats(1, 4096),
)
def test_round_trip_property(model, gpu, network, nodes, gpus, stage, micro_batch, grad_accum, seq_len, gbps, mfu,
                             cpu_gib):
    s = build_scenario(model=model, gpu=gpu, network=network, nodes=nodes, gpus_per_node=gpus, stage=stage,
                       micro_batch=micro_batch, grad_accum=grad_accum, seq_len=seq_len, inter_node_gbps=gbps,
                       mfu=mfu, cpu_memory_gib=cpu_gib)
    assert scenario_from_query(scenario_to_query(s)) == s
    assert scenario_from_json(scenario_to_json(s)) == s


def test_app_style_network_override_and_custom_size_round_trip():
    """The app sets the per-node bandwidth by keeping the preset's NICs and renaming the network, and builds a
    custom-size model with Architecture.from_parameter_count: both must survive a link with the same estimate."""
    base = build_scenario(network="ib-ndr-8x")
    net = base.cluster.network
    custom_net = net.model_copy(update={"link_gbps": 800.0 / net.nics_per_node,
                                        "name": "ib-ndr-8x at 800 Gb/s per node"})
    s = base.model_copy(update={"model": Architecture.from_parameter_count(3_000_000_000),
                                "cluster": base.cluster.model_copy(update={"network": custom_net})})
    query = scenario_to_query(s)
    assert "params=3000000000" in query and "network=ib-ndr-8x" in query and "inter_node_gbps=800" in query
    assert estimate(scenario_from_query(query)) == estimate(s)


def test_hf_config_model_is_refused_in_a_link_but_travels_in_json():
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 2048}
    s = build_scenario(architecture=architecture_from_hf_config(cfg))
    with pytest.raises(ShareError) as info:
        scenario_to_query(s)
    assert info.value.key == "model" and "scenario_to_json" in str(info.value)
    approx = scenario_to_query(s, approximate_model=True)
    assert f"params={s.parameters}" in approx
    assert scenario_from_query(approx).parameters == s.parameters
    assert scenario_from_json(scenario_to_json(s)) == s
    _, unshared = scenario_inputs(s)
    assert unshared == ["model"]


def test_zero_keys_and_pin_memory_round_trip():
    s = build_scenario(stage=3, offload_optimizer="cpu", offload_param="cpu", nodes=2,
                       zero_overrides={"zero_hpz_partition_size": 8, "zero_quantized_weights": True,
                                       "zero_quantized_gradients": True, "contiguous_gradients": False,
                                       "stage3_param_persistence_threshold": 10_000,
                                       "stage3_max_live_parameters": 300_000_000, "stage3_max_reuse_distance": 0})
    z = s.zero
    s = s.model_copy(update={"zero": z.model_copy(update={
        "offload_optimizer": z.offload_optimizer.model_copy(update={"pin_memory": False}),
        "offload_param": z.offload_param.model_copy(update={"pin_memory": False})})})
    query = scenario_to_query(s)
    assert "pin_memory=false" in query and "zero_hpz_partition_size=8" in query
    assert scenario_from_query(query) == s
    with pytest.raises(ShareError) as info:
        scenario_from_query("zero_quantized_weights=true", strict=True)  # ZeRO++ needs stage 3 (ZeroSpec's rule)
    assert info.value.key == "zero_quantized_weights"
    link = read_link("zero_quantized_weights=true&nodes=2")  # leniently: left out and named, nodes applied
    assert link.scenario == build_scenario(nodes=2) and [i.key for i in link.ignored] == ["zero_quantized_weights"]


def test_settings_without_a_key_are_named():
    s = build_scenario(stage=3, offload_optimizer="cpu")
    s = s.model_copy(update={"zero": s.zero.model_copy(update={"offload_optimizer": OffloadSpec(device="cpu",
                                                                                              pin_memory=False)})})
    with pytest.raises(ShareError) as info:
        scenario_to_query(s)
    assert info.value.key == "zero.offload_optimizer.pin_memory"
    assert "pin_memory" not in scenario_to_query(s, strict=False)


@pytest.mark.parametrize(
    ("query", "key", "words"),
    [
        ("model=gpt-5", "model", "unknown model"),
        ("nodes=-1", "nodes", "[1, 100000]"),
        ("nodes=0", "nodes", "[1, 100000]"),
        ("nodes=1.5", "nodes", "integer"),
        ("nodes=2e5", "nodes", "[1, 100000]"),
        ("stage=4", "stage", "[0, 3]"),
        ("mfu=nan", "mfu", "number"),
        ("mfu=inf", "mfu", "number"),
        ("mfu=1e309", "mfu", "number"),
        ("gpu_memory_gib=0x10", "gpu_memory_gib", "number"),
        ("precision=bf17", "precision", "bf16, fp16, fp32"),
        ("flash_attention=maybe", "flash_attention", "true or false"),
        ("evil=1", "evil", "unknown key"),
        ("__class__=x", "__class__", "unknown key"),
        ("nodes=2&nodes=3", "nodes", "more than once"),
        ("model=llama-2-7b&params=7e9", "params", "either model or params"),
        ("qlora=true", "qlora", "lora_rank"),
        ("stage=2&offload_param=cpu", "offload_param", "stage 3"),
        ("stage=0&offload_optimizer=cpu", "offload_optimizer", "stage"),
        ("model=__import__('os').system('id')", "model", "unknown model"),
        ("model=llama-2-7b%0Aprint(1)", "model", "control"),
        ("network=ib-hdr%00", "network", "control"),
        ("gpu=%C3%A9", "gpu", "non-ASCII"),
        ("seq_len=" + "9" * 80, "seq_len", "limit"),
        ("nodes", "query", "malformed"),
        ("nodes=1&&stage=2", "query", "malformed"),
        ("a" * (MAX_QUERY_CHARS + 1), "query", "limit"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else str(v),
)
def test_hostile_or_malformed_queries_are_refused_naming_the_key(query, key, words):
    with pytest.raises(ShareError) as info:
        scenario_from_query(query, strict=True)
    assert info.value.key == key
    assert words in str(info.value)
    assert len(str(info.value)) < 1200
    # read as a link: the key is left out and named with the same reason, the rest applied; only a query refused
    # as a whole (too long, malformed) still raises
    if key == "query":
        with pytest.raises(ShareError) as info:
            read_link(query)
        assert info.value.key == "query" and words in str(info.value)
        return
    link = read_link(query)
    assert key in [i.key for i in link.ignored], link.ignored
    reason = next(i.reason for i in link.ignored if i.key == key)
    assert words in reason or words == "more than once" and "given 2 times" in reason
    assert key in link.note and len(link.note) < 1200
    with pytest.warns(ShareWarning, match=re.escape(key)):
        assert scenario_from_query(query) == link.scenario


def test_acceptance_examples_read_as_on_the_cli():
    """Issue 30: ``params=7B`` and a hub id read as ``--params 7B`` / ``--model Qwen/Qwen3-8B`` do; one unknown key
    leaves the rest applied and is named."""
    from zeroplanner.cli import build_parser, scenario_from_args

    def cli(*argv):
        return scenario_from_args(build_parser().parse_args(["estimate", *argv]))

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing ignored: no warning
        assert scenario_from_query("params=7B") == build_scenario(params=7_000_000_000) == cli("--params", "7B")
        assert scenario_from_query("model=Qwen/Qwen3-8B") == build_scenario(model="qwen3-8b") == \
            cli("--model", "Qwen/Qwen3-8B")
        assert scenario_from_query("model=qwen%2FQwen3-8B") == build_scenario(model="qwen3-8b")  # escaped, any case
        assert scenario_from_query("params=1.5B&nodes=2").parameters == 1_500_000_000
    with pytest.warns(ShareWarning) as record:
        s = scenario_from_query("model=llama-2-13b&nodez=4")
    assert s == build_scenario(model="llama-2-13b")
    assert len(record) == 1 and "nodez" in str(record[0].message)
    link = read_link("model=llama-2-13b&nodez=4")
    assert link.scenario == s and link.ignored == (Ignored("nodez", "unknown key; did you mean nodes?"),)
    assert link.note == ("Not used from the link: nodez (unknown key; did you mean nodes?). The rest of the link "
                         "was applied.")
    # the link writes the catalog's name back, so it reopens the same scenario
    assert "model=qwen3-8b" in scenario_to_query(scenario_from_query("model=Qwen/Qwen3-8B"))


def test_a_bad_value_is_ignored_with_a_note_naming_it():
    link = read_link("model=llama-2-13b&nodes=abc&gpu=H100-80GB")
    assert link.scenario == build_scenario(model="llama-2-13b", gpu="H100-80GB")
    assert link.ignored == (Ignored("nodes", "must be an integer in [1, 100000] (got 'abc')"),)
    assert "nodes (must be an integer in [1, 100000] (got 'abc'))" in link.note
    # several problems: each named once, in the link's order, the rest applied
    link = read_link("nodes=2&nodes=3&stage=2&offload_param=cpu&foo=1&precision=fp16&model=gpt-5")
    assert [i.key for i in link.ignored] == ["nodes", "foo", "model", "offload_param"]
    assert link.scenario == build_scenario(stage=2, precision="fp16")
    # a link of only bad keys: the default scenario, with the note
    assert read_link("evil=1").scenario == build_scenario()
    # model and params together: the model is used, params named
    link = read_link("model=llama-2-13b&params=7B")
    assert link.scenario.model.name == "llama-2-13b" and [i.key for i in link.ignored] == ["params"]


def test_unknown_keys_are_never_used_and_shown_clipped():
    long_key = "k" * 200
    link = read_link(f"{long_key}=1&%3Cscript%3E=2&nodes=2")
    assert link.scenario == build_scenario(nodes=2)
    assert [len(i.key) <= 46 for i in link.ignored] == [True, True]  # clipped (repr of 40 characters at most)
    assert "k" * 41 not in link.note
    with pytest.raises(ShareError):  # more fields than any link has: the query as a whole
        read_link("&".join(f"x{i}=1" for i in range(len(SHARE_KEYS) + 10)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises_anything_but_share_error(text):
    for strict in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ShareWarning)
                scenario_from_query(text, strict=strict)
        except ShareError:
            pass


def test_voila_arguments_are_ignored_and_whole_urls_accepted():
    assert parse_query("?theme=dark&template=zeroplanner") == {}
    s = scenario_from_query("http://127.0.0.1:8866/?nodes=2&gpu=h100-80gb")
    assert s.cluster.nodes == 2 and s.cluster.gpu.name == "H100-80GB"  # catalog names are case-insensitive


def test_environment_reads_voila_query_string():
    assert scenario_from_environment({}) is None
    assert scenario_from_environment({"QUERY_STRING": ""}) is None
    assert scenario_from_environment({"QUERY_STRING": "theme=dark"}) is None
    s = scenario_from_environment({"QUERY_STRING": "model=llama-2-13b&nodes=2"})
    assert s == build_scenario(model="llama-2-13b", nodes=2)
    with pytest.raises(ShareError, match="nodes"):  # the strict reading
        scenario_from_environment({"QUERY_STRING": "nodes=zero"})
    # the planner page's reading (ui.app.initial_state): the rest applied, the bad key named
    assert link_from_environment({}) is None and link_from_environment({"QUERY_STRING": "theme=dark"}) is None
    link = link_from_environment({"QUERY_STRING": "model=llama-2-13b&nodes=zero&theme=dark"})
    assert link.scenario == build_scenario(model="llama-2-13b") and [i.key for i in link.ignored] == ["nodes"]
    assert link_from_environment({"QUERY_STRING": "nodez=4"}).scenario == build_scenario()


def test_share_link_uses_the_page_url():
    env = {"VOILA_REQUEST_URL": "http://127.0.0.1:8866/voila/render/planner.ipynb?nodes=9"}
    assert page_url(env) == "http://127.0.0.1:8866/voila/render/planner.ipynb"
    assert page_url({"VOILA_REQUEST_URL": "javascript:alert(1)"}) is None
    s = build_scenario(model="llama-2-70b", nodes=4)
    link = share_link(s, environ=env)
    assert link == ("http://127.0.0.1:8866/voila/render/planner.ipynb?model=llama-2-70b&gpu=A100-80GB"
                    "&gpus_per_node=8&nodes=4&network=ib-hdr")
    assert scenario_from_query(link) == s
    assert share_link(s, environ={}).startswith("?model=")


def test_json_document_and_flat_json():
    s = build_scenario(model="mistral-7b", nodes=2, stage=3)
    doc = json.loads(scenario_to_json(s))
    assert doc["format"] == "zeroplanner-scenario" and doc["version"] == 1
    assert doc["query"] == scenario_to_query(s)
    assert scenario_from_json(scenario_to_json(s).encode()) == s
    assert scenario_from_json('{"model": "mistral-7b", "nodes": 2, "stage": 3}') == s
    assert scenario_from_json('{"model": "mistral-7b", "nodes": "2", "stage": "3"}') == s
    # the inputs' one grammar here too, and strict: a flat JSON object is a file a tool wrote, so an unknown key is
    # refused rather than left out (test_bad_json_is_refused_naming_the_key)
    assert scenario_from_json('{"params": "7B"}') == build_scenario(params=7_000_000_000)
    assert scenario_from_json('{"model": "Qwen/Qwen3-8B"}') == build_scenario(model="qwen3-8b")


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[1, 2]", "json", "object"),
        ("{", "json", "not valid JSON"),
        ("[" * 100_001 + "]" * 100_001, "json", "limit"),
        ("[" * 50_000 + "]" * 50_000, "json", "JSON"),
        ('{"nodes": true}', "nodes", "integer"),
        ('{"nodes": 2.5}', "nodes", "integer"),
        ('{"nodes": [2]}', "nodes", "single value"),
        ('{"nodes": null}', "nodes", "single value"),
        ('{"evil": 1}', "evil", "unknown key"),
        ('{"format": "other"}', "format", "zeroplanner-scenario"),
        ('{"format": "zeroplanner-scenario", "version": 2}', "version", "must be 1"),
        ('{"format": "zeroplanner-scenario", "version": 1, "scenario": {}}', "scenario.model", "required"),
        ('{"format": "zeroplanner-scenario", "version": 1, "scenario": 1, "x": 1}', "x", "unknown key"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else str(v),
)
def test_bad_json_is_refused_naming_the_key(text, key, words):
    with pytest.raises(ShareError) as info:
        scenario_from_json(text)
    assert info.value.key == key
    assert words in str(info.value)


def test_json_field_errors_name_the_field_path():
    doc = json.loads(scenario_to_json(build_scenario()))
    doc["scenario"]["cluster"]["nodes"] = 0
    with pytest.raises(ShareError) as info:
        scenario_from_json(json.dumps(doc))
    assert info.value.key == "scenario.cluster.nodes" and "greater than or equal to 1" in str(info.value)


def test_every_key_is_type_checked():
    for spec in SHARE_KEYS:
        with pytest.raises(ShareError) as info:
            scenario_from_query(f"{spec.name}=%7B%7D", strict=True)  # "{}"
        assert info.value.key == spec.name
        assert [i.key for i in read_link(f"{spec.name}=%7B%7D").ignored] == [spec.name]
    assert set(KEYS) == {k.name for k in SHARE_KEYS}


def test_page_url_prefers_the_fresh_request_info():
    """A pooled Voilà kernel keeps the VOILA_REQUEST_URL of the request that started it; the request info
    (SERVER_NAME, SERVER_PORT, SCRIPT_NAME; voila/handler.py) is the current page's."""
    env = {"VOILA_REQUEST_URL": "https://old.example/?nodes=9", "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8866",
           "SCRIPT_NAME": "/"}
    assert page_url(env) == "https://127.0.0.1:8866/"
    assert page_url({"SERVER_NAME": "host name", "SCRIPT_NAME": "/"}) is None
    assert page_url({"SERVER_NAME": "h", "SERVER_PORT": "80x", "SCRIPT_NAME": "/"}) is None


def test_waiting_for_voila_is_a_no_op_outside_preheated_kernels(monkeypatch):
    from zeroplanner.share import wait_for_voila_request

    monkeypatch.delenv("VOILA_PREHEAT", raising=False)
    wait_for_voila_request()  # returns at once (would block on a websocket otherwise)
    monkeypatch.setenv("VOILA_PREHEAT", "True")
    monkeypatch.setenv("QUERY_STRING", "nodes=2")
    wait_for_voila_request()
    assert scenario_from_environment().cluster.nodes == 2


def test_app_copy_link_carries_the_apps_scenario_or_says_why_not():
    pytest.importorskip("ipywidgets")
    import html as _html
    import re as _re

    from zeroplanner.ui.app import PlannerApp
    from zeroplanner.ui.state import state_from_scenario

    app = PlannerApp(state=state_from_scenario(build_scenario(model="llama-2-13b", nodes=2)))
    app.set(nodes=3, network="eth-100g", pin_memory=False)
    title = _html.unescape(_re.search(r"title='([^']*)'", app.share_link.value).group(1))
    assert scenario_from_query(title) == app.state.scenario
    cfg = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000}
    app = PlannerApp(state=state_from_scenario(build_scenario(architecture=architecture_from_hf_config(cfg))))
    assert "No link for this setup: model:" in app.share_link.value and "zp-copy-link" not in app.share_link.value
