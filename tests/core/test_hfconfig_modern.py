"""Built-in readers of the 2024-26 families against transformers 5.24 on the meta device.

References: the model ``transformers`` builds from the same config on the meta device (parameters deduplicated by
identity, tied weights once), and DeepSpeed's ``model_to_params`` for the largest module (the input of
``estimate_zero3_model_states_mem_needs_all_live``); for the seven released files in ``tests/data/hf-configs/``
also ``param_counts.json`` there (transformers 5.24 meta-device counts). Small configs shrink the widths of each
family's layout (same layer kinds, keys as the released files spell them) so a meta build takes milliseconds.
"""

from __future__ import annotations

import json

import pytest

from zeroplanner.calibrate.families import BASE, SMALL
from zeroplanner.catalog.hfconfig import SUPPORTED_MODEL_TYPES, architecture_from_hf_config

from tests.helpers import HF_CONFIGS

MULTIMODAL = {"gemma3", "gemma4", "llama4", "qwen2_vl", "qwen2_5_vl"}


def _meta(config: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "auto_map")}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    auto = transformers.AutoModelForImageTextToText if config["model_type"] in MULTIMODAL else \
        transformers.AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(cfg)


def _count(model) -> int:
    return sum(dict((id(p), p.numel()) for _, p in model.named_parameters(remove_duplicate=False)).values())


def _largest(model) -> int:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    return stage3.model_to_params(model)[1]


def _vision(model) -> int:
    names = ("visual", "vision_tower", "vision_model", "multi_modal_projector", "embed_vision")
    return sum(p.numel() for n, p in model.named_parameters() if any(f".{x}." in f".{n}" for x in names))


@pytest.fixture(scope="module", params=sorted(SMALL))
def small(request):
    return request.param, SMALL[request.param], _meta(SMALL[request.param])


def test_small_count_matches_transformers_meta(small):
    label, config, model = small
    arch = architecture_from_hf_config(config)
    assert arch.parameter_count == _count(model), label
    assert arch.vision_params == _vision(model), label


def test_small_largest_module_matches_deepspeed_within_1_percent(small):
    label, config, model = small
    arch = architecture_from_hf_config(config)
    assert arch.largest_module_params == pytest.approx(_largest(model), rel=0.01), label


def test_every_new_family_has_a_small_case():
    new = set(SUPPORTED_MODEL_TYPES) - {"llama", "mistral", "qwen2", "mixtral", "gpt2", "gpt_neox", "bloom", "opt",
                                        "falcon"}
    assert new == {c["model_type"] for c in SMALL.values()}


def _shared_files():
    return sorted(p.stem for p in HF_CONFIGS.glob("*.json") if p.stem != "param_counts")


@pytest.mark.parametrize("name", _shared_files())
def test_shared_real_config_exact_count(name):
    """param_counts.json: transformers 5.24 meta-device counts of the published config.json files."""
    expected = json.loads((HF_CONFIGS / "param_counts.json").read_text())[name]
    arch = architecture_from_hf_config(HF_CONFIGS / f"{name}.json")
    assert arch.parameter_count == expected["parameters"]
    assert arch.tied_embeddings == expected["tied"]
    if "breakdown" in expected:
        b = expected["breakdown"]
        assert arch.vision_params == b["model.vision_tower"] + b["model.embed_vision"]


# ------------------------------------------------------------------------------------------------------------------
# Families only transformers knows (the hf extra): meta-device build, never remote code
# ------------------------------------------------------------------------------------------------------------------
_GRANITE = dict(model_type="granite", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False)


def test_family_only_transformers_knows_is_built_on_meta():
    """Granite's layers are Llama's (GraniteForCausalLM: same projections, RMSNorms, untied lm_head; its
    multipliers are scalars, not parameters), so the built-in llama reader is an independent reference."""
    pytest.importorskip("transformers")
    granite = architecture_from_hf_config(dict(_GRANITE, auto_map={"AutoModelForCausalLM": "evil.Model"}))
    llama = architecture_from_hf_config(dict(_GRANITE, model_type="llama"))
    assert granite.parameter_count == llama.parameter_count == 189_760
    assert granite.largest_module_params == llama.largest_module_params == 64_000
    assert granite.family == "granite" and "approximate" in granite.source and not granite.tied_embeddings


@pytest.mark.parametrize("key, value, message", [
    ("num_hidden_layers", 5_000_000, r"'num_hidden_layers' must be an integer 1-1,000 \(got 5000000\)"),
    ("hidden_size", -64, r"'hidden_size' must be an integer 1-1,000,000 \(got -64\)"),
    ("vocab_size", 10**9, r"'vocab_size' must be an integer 1-10,000,000"),
])
def test_family_only_transformers_knows_is_size_checked_before_it_is_built(key, value, message):
    """transformers builds what it is given: a Starcoder2 config.json with 5,000,000 layers held 7.5 GB and was
    still building after 180 s (new-user review); the size keys are checked against Architecture's ranges first,
    and the error names the key (a negative width read as "not supported" before)."""
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=message):
        architecture_from_hf_config(dict(_GRANITE, **{key: value}))


def test_family_only_transformers_knows_refuses_too_many_expert_modules():
    pytest.importorskip("transformers")
    cfg = dict(_GRANITE, model_type="granitemoe", num_local_experts=1000, num_experts_per_tok=2,
               num_hidden_layers=900)
    with pytest.raises(ValueError, match=r"layers x experts = 900 x 1,000 exceeds 200,000"):
        architecture_from_hf_config(cfg)


def test_auto_map_note_survives_a_long_source(tmp_path):
    """The note that custom code was ignored ends the 500-character source whole, however long the file's path
    (the answers' assumptions look for it there)."""
    from zeroplanner.catalog.hfconfig import AUTO_MAP_NOTE

    deep = tmp_path / ("d" * 200) / ("e" * 200) / ("f" * 200)
    deep.mkdir(parents=True)
    (deep / "config.json").write_text(json.dumps(dict(_GRANITE, model_type="llama",
                                                      auto_map={"AutoModelForCausalLM": "x.Y"})), encoding="utf-8")
    arch = architecture_from_hf_config(deep / "config.json")
    assert len(arch.source) == 500 and arch.source.endswith(f"{AUTO_MAP_NOTE}: priced as llama")


def test_unknown_to_transformers_and_encoder_decoder_are_refused():
    with pytest.raises(ValueError, match=r"'RefinedWebModel' is not supported.*auto_map is never run"):
        architecture_from_hf_config({"model_type": "RefinedWebModel", "auto_map": {"AutoConfig": "x.C"}})
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match=r"'t5'.*no causal-LM"):
        architecture_from_hf_config({"model_type": "t5", "d_model": 64})


def _without_transformers(monkeypatch):
    import importlib.util

    from zeroplanner.catalog import hfconfig

    real = importlib.util.find_spec
    monkeypatch.setattr(hfconfig.importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else real(name, *a))


def test_without_transformers_unknown_family_names_supported_and_extra(monkeypatch):
    _without_transformers(monkeypatch)
    with pytest.raises(ValueError, match=r"'granite' is not supported.*qwen3_moe.*deepseek_v3.*zeroplanner\[hf\]"):
        architecture_from_hf_config(_GRANITE)


def test_cli_without_transformers_exits_2_with_the_message(monkeypatch, tmp_path, capsys):
    from zeroplanner import cli

    _without_transformers(monkeypatch)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_GRANITE), encoding="utf-8")
    assert cli.main(["estimate", "--hf-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--hf-config" in err and "'granite' is not supported" in err and "zeroplanner[hf]" in err


# ------------------------------------------------------------------------------------------------------------------
# Hostile or malformed files: refused with the key named, nothing executed
# ------------------------------------------------------------------------------------------------------------------
_QWEN3 = dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
              num_attention_heads=32, num_key_value_heads=8, vocab_size=151936, head_dim=128)


@pytest.mark.parametrize("key,value,match", [
    ("hidden_size", 10**30, "between 1 and 1,000,000"),  # Architecture.hidden_size le=1_000_000
    ("num_hidden_layers", -3, "between 1 and 1,000"),  # Architecture.n_layers le=1000
    ("vocab_size", "151936", "integer"),
    ("intermediate_size", [1, 2], "integer"),
    ("head_dim", 1.5, "integer"),
    ("num_key_value_heads", 0, "between 1"),
])
def test_hostile_values_name_the_key(key, value, match):
    with pytest.raises(ValueError, match=rf"{key!r}.*{match}"):
        architecture_from_hf_config(dict(_QWEN3, **{key: value}))


def test_hostile_family_keys_name_the_key():
    base = SMALL["nemotron_h"]
    with pytest.raises(ValueError, match="'hybrid_override_pattern'"):
        architecture_from_hf_config(dict(base, hybrid_override_pattern="M*X"))
    with pytest.raises(ValueError, match="'mlp_only_layers'"):
        architecture_from_hf_config(dict(SMALL["qwen3_moe"], mlp_only_layers=[99]))
    with pytest.raises(ValueError, match="'layer_types'"):
        architecture_from_hf_config(dict(SMALL["gpt_oss"], layer_types=["sliding_attention"] * 3 + ["evil"]))
    with pytest.raises(ValueError, match="'text_config'"):
        architecture_from_hf_config(dict(SMALL["gemma4"], text_config="not an object"))
    with pytest.raises(ValueError, match=r"'vision_config.hidden_size'|'gemma4.vision_config'|hidden_size"):
        architecture_from_hf_config(dict(SMALL["gemma4"], vision_config=dict(SMALL["gemma4"]["vision_config"],
                                                                             hidden_size=-1)))
    with pytest.raises(ValueError, match="'first_k_dense_replace'"):
        architecture_from_hf_config(dict(SMALL["deepseek_v3"], first_k_dense_replace=10**6))
    # keys the activation model reads (router groups, partial rotary, Llama 4 NoPE layers)
    with pytest.raises(ValueError, match="'topk_group'"):
        architecture_from_hf_config(dict(SMALL["deepseek_v3"], n_group=2, topk_group=3))
    with pytest.raises(ValueError, match="'n_group'"):
        architecture_from_hf_config(dict(SMALL["glm4_moe"], n_group=-1))
    with pytest.raises(ValueError, match="'partial_rotary_factor'"):
        architecture_from_hf_config(dict(SMALL["glm4"], partial_rotary_factor=0))
    with pytest.raises(ValueError, match="'partial_rotary_factor'"):
        architecture_from_hf_config(dict(SMALL["glm4_moe"], partial_rotary_factor=1.5))
    with pytest.raises(ValueError, match="'no_rope_layers'"):
        architecture_from_hf_config(dict(SMALL["llama4_text"], no_rope_layers=[1, 0, "x", 1]))
    with pytest.raises(ValueError, match="'no_rope_layers'"):
        architecture_from_hf_config(dict(SMALL["llama4_text"], no_rope_layers=[1, 0]))
    with pytest.raises(ValueError, match="'final_logit_softcapping'"):
        architecture_from_hf_config(dict(SMALL["gemma2"], final_logit_softcapping="30"))


def test_activation_fields_follow_the_config():
    """The fields activations.py reads, as transformers 5.24's configs define them: Llama4TextConfig's NoPE layers
    (no_rope_layers 0 entries; default every no_rope_layer_interval-th = 4th layer), GLM-4's
    partial_rotary_factor (default 0.5), DeepSeek-V3's group-limited router (n_group / topk_group)."""
    llama4 = architecture_from_hf_config(dict(SMALL["llama4_text"], num_hidden_layers=8))
    assert (llama4.qk_norm, llama4.nope_layers) == ("l2", 2)
    assert architecture_from_hf_config(dict(SMALL["llama4_text"], no_rope_layers=[1, 1, 0, 0])).nope_layers == 2
    assert architecture_from_hf_config(dict(SMALL["llama4_text"], use_qk_norm=False)).qk_norm == "none"
    assert architecture_from_hf_config(SMALL["glm4"]).rotary_fraction == 0.5
    assert architecture_from_hf_config(dict(SMALL["glm4"], partial_rotary_factor=1.0)).rotary_fraction == 1.0
    v3 = architecture_from_hf_config(dict(SMALL["deepseek_v3"], n_group=2, topk_group=1))
    assert (v3.router_groups, v3.router_top_groups, v3.router_norm_topk) == (2, 1, True)
    assert not architecture_from_hf_config(SMALL["deepseek_v2"]).router_norm_topk  # V2's router never renormalises
    # final_logit_softcapping: Gemma2Config default 30.0, Gemma3TextConfig / Gemma4TextConfig None
    assert architecture_from_hf_config(SMALL["gemma2"]).final_logit_softcapping
    assert not architecture_from_hf_config(dict(SMALL["gemma2"], final_logit_softcapping=None)).final_logit_softcapping
    assert not architecture_from_hf_config(SMALL["gemma3_text"]).final_logit_softcapping
    assert architecture_from_hf_config(dict(SMALL["gemma4_text-dense"], final_logit_softcapping=30.0)
                                       ).final_logit_softcapping


def test_deeply_nested_and_huge_files_are_refused(tmp_path):
    from zeroplanner.catalog.hfconfig import MAX_CONFIG_BYTES, load_hf_config

    deep = tmp_path / "deep.json"
    deep.write_text('{"model_type": "qwen3", "x": ' + "[" * 50_000 + "]" * 50_000 + "}", encoding="utf-8")
    with pytest.raises(ValueError, match="nested deeper"):
        load_hf_config(deep)
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps(dict(_QWEN3, rope_scaling={"a": {"b": {"c": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}}})),
                      encoding="utf-8")
    with pytest.raises(ValueError, match=r"'rope_scaling\.a\.b\.c.*nested deeper than 20"):
        architecture_from_hf_config(nested)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(dict(_QWEN3, padding="x" * 10_000_000)), encoding="utf-8")
    with pytest.raises(ValueError, match=f"limit is {MAX_CONFIG_BYTES}"):
        architecture_from_hf_config(big)


def test_deeply_nested_dict_is_refused_without_recursion():
    config: dict = dict(_QWEN3)
    node = config
    for _ in range(5000):
        node["n"] = {}
        node = node["n"]
    with pytest.raises(ValueError, match="nested deeper than 20"):
        architecture_from_hf_config(config)


def test_cli_refuses_a_deeply_nested_file_with_exit_2(tmp_path, capsys):
    from zeroplanner import cli

    deep = tmp_path / "deep.json"
    deep.write_text('{"model_type": "qwen3", "x": ' + "[" * 50_000 + "]" * 50_000 + "}", encoding="utf-8")
    assert cli.main(["estimate", "--hf-config", str(deep)]) == 2
    assert "--hf-config" in capsys.readouterr().err


@pytest.mark.parametrize("label", sorted(SMALL) + [f"shared:{n}" for n in _shared_files()])
def test_cli_estimate_reads_every_family(label, tmp_path, capsys):
    """`zeroplanner estimate --hf-config X --json` answers for each family (and reports Ψ exactly)."""
    from zeroplanner import cli

    if label.startswith("shared:"):
        path = HF_CONFIGS / f"{label[7:]}.json"
    else:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(SMALL[label]), encoding="utf-8")
    code = cli.main(["estimate", "--hf-config", str(path), "--stage", "3", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == (0 if out["fits"] else 1)  # exit status 1: does not fit (deepseek-v3 on 8 GPUs)
    assert out["parameters"] == architecture_from_hf_config(path).parameter_count


@pytest.mark.parametrize("name", _shared_files())
def test_shared_real_config_largest_module_matches_deepspeed(name):
    """Largest module of each released model: DeepSpeed's model_to_params on transformers' meta-device build
    (quantization_config dropped: the count is of logical parameters, as in param_counts.json)."""
    expected = json.loads((HF_CONFIGS / "param_counts.json").read_text())[name]
    config = json.loads((HF_CONFIGS / f"{name}.json").read_text())
    config.pop("quantization_config", None)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.for_model(
        config["model_type"], **{k: v for k, v in config.items() if k not in ("model_type", "auto_map")})
    with torch.device("meta"):
        model = getattr(transformers, expected["auto_class"]).from_config(cfg)
    assert _count(model) == expected["parameters"]
    assert architecture_from_hf_config(HF_CONFIGS / f"{name}.json").largest_module_params == \
        pytest.approx(_largest(model), rel=0.01)


def test_quantised_checkpoint_is_counted_logically_and_says_so():
    """param_counts.json README: deepseek-v3's fp8 and gpt-oss-20b's mxfp4 quantization_config do not change the
    logical parameter count."""
    arch = architecture_from_hf_config(HF_CONFIGS / "gpt-oss-20b.json")
    assert arch.parameter_count == 20_914_757_184
    assert "mxfp4 checkpoint: logical parameters" in arch.source


def test_variant_the_reader_does_not_count_goes_to_transformers_or_is_named(monkeypatch):
    """Gemma 4 E2B/E4B layouts (per-layer input embeddings, the gemma4_text default hidden_size_per_layer_input
    256) are not counted by the built-in reader: transformers builds them when installed, else the message names
    the variant."""
    config = dict(BASE, model_type="gemma4_text", head_dim=16, num_hidden_layers=6)
    import importlib.util

    if importlib.util.find_spec("transformers") is not None:
        assert architecture_from_hf_config(config).parameter_count == _count(_meta(config))
    _without_transformers(monkeypatch)
    with pytest.raises(ValueError, match="gemma4 with per-layer input embeddings.*zeroplanner\\[hf\\]"):
        architecture_from_hf_config(config)


@pytest.mark.parametrize("field,value,match", [
    ("attention_layers", 99, "attention_layers=99 exceeds n_layers"),
    ("moe_layers", 99, "moe_layers=99 exceeds n_layers"),
    ("other_mixer_params", -1, "other_mixer_params"),
    ("qk_rope_head_dim", 10**6, "qk_rope_head_dim"),
    ("norms_per_layer", 17, "norms_per_layer"),
    ("vision_params", -5, "vision_params"),
])
def test_architecture_fields_are_bounded(field, value, match):
    from pydantic import ValidationError

    arch = architecture_from_hf_config(SMALL["qwen3_moe"])
    with pytest.raises(ValidationError, match=match):
        type(arch).model_validate(dict(arch.model_dump(), **{field: value}))


def test_cli_estimate_family_only_transformers_knows(tmp_path, capsys):
    pytest.importorskip("transformers")
    from zeroplanner import cli

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_GRANITE), encoding="utf-8")
    assert cli.main(["estimate", "--hf-config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == 189_760  # = the llama reader's count (above)
