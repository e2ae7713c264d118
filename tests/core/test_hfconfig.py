"""zeroplanner.catalog.hfconfig against transformers instantiated on the meta device (no downloads, no weights).

Reference for each count: the model ``transformers`` 5.24 builds from the same config dict, parameters
deduplicated by identity (tied embeddings once). Reference for the largest module: DeepSpeed's own definition,
``deepspeed.runtime.zero.stage3.model_to_params`` (max over modules of the parameters each owns directly), which
feeds ``estimate_zero3_model_states_mem_needs_all_live``.
"""

from __future__ import annotations

import json

import pytest

from zeroplanner import catalog
from zeroplanner.catalog.hfconfig import (
    MAX_CONFIG_BYTES,
    SUPPORTED_MODEL_TYPES,
    architecture_from_hf_config,
    load_hf_config,
)

# ------------------------------------------------------------------------------------------------------------------
# Small configs, one or more variants per family. Widths are kept tiny so a meta instantiation takes milliseconds;
# vocab 1000 keeps the default special-token ids inside the vocabulary.
# ------------------------------------------------------------------------------------------------------------------
SMALL_CONFIGS: dict[str, dict] = {
    "llama-mha-untied": dict(model_type="llama", hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                             num_attention_heads=4, vocab_size=1000),
    "llama-gqa-tied-biases": dict(model_type="llama", hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                  num_attention_heads=8, num_key_value_heads=2, vocab_size=1000,
                                  tie_word_embeddings=True, attention_bias=True, mlp_bias=True),
    "llama-head-dim": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1000),
    "mistral-gqa": dict(model_type="mistral", hidden_size=64, intermediate_size=224, num_hidden_layers=2,
                        num_attention_heads=8, num_key_value_heads=2, vocab_size=1000, sliding_window=16),
    "mistral-defaults": dict(model_type="mistral", hidden_size=64, intermediate_size=224, num_hidden_layers=1,
                             num_attention_heads=8, vocab_size=1000),
    "qwen2-untied": dict(model_type="qwen2", hidden_size=56, intermediate_size=296, num_hidden_layers=2,
                         num_attention_heads=7, num_key_value_heads=1, vocab_size=1000, tie_word_embeddings=False),
    # Mistral-Nemo-style head_dim (num_heads * head_dim != hidden_size)
    "mistral-head-dim": dict(model_type="mistral", hidden_size=64, intermediate_size=224, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1000),
    "qwen2-head-dim": dict(model_type="qwen2", hidden_size=64, intermediate_size=200, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=1000),
    "qwen2-tied": dict(model_type="qwen2", hidden_size=64, intermediate_size=200, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
    "mixtral": dict(model_type="mixtral", hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    vocab_size=1000),
    "gpt2": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128),
    "gpt2-n-inner-untied": dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=1000,
                                n_positions=64, tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0),
    "gpt_neox": dict(model_type="gpt_neox", hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, vocab_size=1000),
    "gpt_neox-tied-nobias": dict(model_type="gpt_neox", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                 num_attention_heads=4, vocab_size=1000, tie_word_embeddings=True,
                                 attention_bias=False, use_parallel_residual=False, hidden_dropout=0.1),
    "bloom": dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=4, vocab_size=1000),
    "bloom-n-embed-untied": dict(model_type="bloom", n_embed=48, n_layer=3, num_attention_heads=4, vocab_size=1000,
                                 tie_word_embeddings=False),
    "opt": dict(model_type="opt", hidden_size=64, ffn_dim=256, num_hidden_layers=2, num_attention_heads=4,
                vocab_size=1000, max_position_embeddings=100),
    "opt-project-in-out": dict(model_type="opt", hidden_size=64, ffn_dim=256, num_hidden_layers=2,
                               num_attention_heads=4, vocab_size=1000, max_position_embeddings=100,
                               word_embed_proj_dim=32, do_layer_norm_before=False),
    "opt-nobias-untied-noaffine": dict(model_type="opt", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                       num_attention_heads=4, vocab_size=1000, max_position_embeddings=50,
                                       enable_bias=False, tie_word_embeddings=False,
                                       layer_norm_elementwise_affine=False),
    # falcon-7b layout: multi-query, parallel attention, one LayerNorm per block, no biases
    "falcon-old-mq": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          vocab_size=1000, multi_query=True, parallel_attn=True, bias=False),
    # falcon-rw layout: multi-head, sequential, two LayerNorms, biases, ALiBi
    "falcon-old-sequential-bias": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, vocab_size=1000, multi_query=False,
                                       parallel_attn=False, bias=True, alibi=True),
    # falcon-40b layout: new decoder architecture, grouped KV heads, ln_attn + ln_mlp
    "falcon-new-gqa": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                           num_kv_heads=2, vocab_size=1000, new_decoder_architecture=True, parallel_attn=True),
    # falcon2-11B layout: new decoder architecture with a single LayerNorm, untied, custom FFN width
    "falcon-new-one-ln": dict(model_type="falcon", hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                              num_kv_heads=2, vocab_size=1000, new_decoder_architecture=True,
                              num_ln_in_parallel_attn=1, ffn_hidden_size=96, tie_word_embeddings=False),
}

# ------------------------------------------------------------------------------------------------------------------
# Released configs (shape keys of the published config.json files) for the catalog entries that have one. GPT-3 has
# no HF release; its entry is expressed as a GPT-2 config with the GPT-3 paper's Table 2.1 shapes.
# ------------------------------------------------------------------------------------------------------------------
def _llama(h, f, layers, heads, kv, vocab, pos, **extra):
    return dict(model_type="llama", hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=pos,
                tie_word_embeddings=False, **extra)


def _qwen(h, f, layers, heads, kv, vocab, tied, pos):
    return dict(model_type="qwen2", hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied,
                max_position_embeddings=pos)


def _gpt2(h, layers, heads, positions=1024, vocab=50257):
    return dict(model_type="gpt2", n_embd=h, n_layer=layers, n_head=heads, n_positions=positions, vocab_size=vocab)


RELEASED_CONFIGS: dict[str, dict] = {
    "llama-2-7b": _llama(4096, 11008, 32, 32, 32, 32000, 4096),
    "llama-2-13b": _llama(5120, 13824, 40, 40, 40, 32000, 4096),
    "llama-2-70b": _llama(8192, 28672, 80, 64, 8, 32000, 4096),
    "llama-3-8b": _llama(4096, 14336, 32, 32, 8, 128256, 8192),
    "llama-3-70b": _llama(8192, 28672, 80, 64, 8, 128256, 8192),
    "llama-3.1-8b": _llama(4096, 14336, 32, 32, 8, 128256, 131072),
    "llama-3.1-70b": _llama(8192, 28672, 80, 64, 8, 128256, 131072),
    "llama-3.1-405b": _llama(16384, 53248, 126, 128, 8, 128256, 131072),
    "mistral-7b": dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                       max_position_embeddings=32768, tie_word_embeddings=False),
    "mixtral-8x7b": dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                         max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2,
                         tie_word_embeddings=False),
    "qwen2.5-0.5b": _qwen(896, 4864, 24, 14, 2, 151936, True, 32768),
    "qwen2.5-1.5b": _qwen(1536, 8960, 28, 12, 2, 151936, True, 131072),
    "qwen2.5-3b": _qwen(2048, 11008, 36, 16, 2, 151936, True, 32768),
    "qwen2.5-7b": _qwen(3584, 18944, 28, 28, 4, 152064, False, 131072),
    "qwen2.5-14b": _qwen(5120, 13824, 48, 40, 8, 152064, False, 131072),
    "qwen2.5-32b": _qwen(5120, 27648, 64, 40, 8, 152064, False, 131072),
    "qwen2.5-72b": _qwen(8192, 29568, 80, 64, 8, 152064, False, 131072),
    "gpt2": _gpt2(768, 12, 12),
    "gpt2-medium": _gpt2(1024, 24, 16),
    "gpt2-large": _gpt2(1280, 36, 20),
    "gpt2-xl": _gpt2(1600, 48, 25),
    "gpt-3-175b": _gpt2(12288, 96, 96, positions=2048),
    "bloom-176b": dict(model_type="bloom", n_embed=14336, n_layer=70, num_attention_heads=112, vocab_size=250880,
                       hidden_dropout=0.0, attention_dropout=0.0),
    "falcon-7b": dict(model_type="falcon", hidden_size=4544, num_hidden_layers=32, num_attention_heads=71,
                      vocab_size=65024, multi_query=True, parallel_attn=True, new_decoder_architecture=False,
                      bias=False, alibi=False, hidden_dropout=0.0, attention_dropout=0.0),
    "gpt-neox-20b": dict(model_type="gpt_neox", hidden_size=6144, intermediate_size=24576, num_hidden_layers=44,
                         num_attention_heads=64, vocab_size=50432, max_position_embeddings=2048,
                         tie_word_embeddings=False, use_parallel_residual=True, rotary_pct=0.25),
    "opt-1.3b": dict(model_type="opt", hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
                     vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=2048,
                     do_layer_norm_before=True, dropout=0.1, attention_dropout=0.0),
    "opt-6.7b": dict(model_type="opt", hidden_size=4096, ffn_dim=16384, num_hidden_layers=32,
                     num_attention_heads=32, vocab_size=50272, max_position_embeddings=2048,
                     word_embed_proj_dim=4096, do_layer_norm_before=True, dropout=0.1, attention_dropout=0.0),
}

# docs/references.md section 3 (parameter counts of the released HF models).
REFERENCE_COUNTS = {
    "llama-2-7b": 6_738_415_616,
    "qwen2.5-7b": 7_615_616_512,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
}


# ------------------------------------------------------------------------------------------------------------------
# transformers / DeepSpeed side
# ------------------------------------------------------------------------------------------------------------------
def _meta_model(config: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg_kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **cfg_kwargs)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


def _dedup_count(model) -> int:
    """Parameters counted once per tensor object (tied embeddings once); meta tensors share data_ptr 0, so
    identity is used instead of DeepSpeed's data_ptr."""
    return sum(dict((id(p), p.numel()) for _, p in model.named_parameters(remove_duplicate=False)).values())


def _deepspeed_largest_layer(model) -> int:
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    _, largest = stage3.model_to_params(model)
    return largest


@pytest.fixture(scope="module", params=sorted(SMALL_CONFIGS))
def small_case(request):
    config = SMALL_CONFIGS[request.param]
    return request.param, config, _meta_model(config)


def test_small_config_parameter_count_matches_transformers_meta(small_case):
    label, config, model = small_case
    arch = architecture_from_hf_config(config)
    assert arch.parameter_count == _dedup_count(model), label


def test_small_config_largest_module_matches_deepspeed(small_case):
    label, config, model = small_case
    arch = architecture_from_hf_config(config)
    assert arch.largest_module_params == _deepspeed_largest_layer(model), label


def test_every_supported_family_has_a_small_case():
    from zeroplanner.calibrate.families import SMALL  # the 2024-26 families' cases

    covered = {c["model_type"] for c in SMALL_CONFIGS.values()} | {c["model_type"] for c in SMALL.values()}
    assert covered == set(SUPPORTED_MODEL_TYPES)


@pytest.fixture(scope="module", params=sorted(RELEASED_CONFIGS))
def released_case(request):
    config = RELEASED_CONFIGS[request.param]
    return request.param, config, _meta_model(config)


def test_released_config_matches_transformers_meta_and_deepspeed(released_case):
    """Full-size models on the meta device (no memory): count and largest module of every catalog entry."""
    name, config, model = released_case
    arch = architecture_from_hf_config(config, name=name)
    assert arch.parameter_count == _dedup_count(model)
    assert arch.largest_module_params == _deepspeed_largest_layer(model)


@pytest.mark.parametrize("name", sorted(RELEASED_CONFIGS))
def test_catalog_entry_agrees_with_its_released_config(name):
    from_config = architecture_from_hf_config(RELEASED_CONFIGS[name], name=name)
    entry = catalog.model(name)
    for field in ("family", "n_layers", "hidden_size", "n_heads", "kv_heads", "dim_head", "ffn_size", "ffn_kind",
                  "vocab_size", "tied_embeddings", "learned_position_embeddings", "norm_kind", "norms_per_layer",
                  "final_norm", "embedding_norm", "qkv_bias", "out_bias", "mlp_bias", "fused_qkv", "n_experts",
                  "experts_per_token", "fused_experts", "parallel_attention", "dropout", "embed_width",
                  "max_position_embeddings"):
        assert getattr(entry, field) == getattr(from_config, field), (name, field)
    assert entry.parameter_count == from_config.parameter_count
    assert entry.largest_module_params == from_config.largest_module_params


@pytest.mark.parametrize("name,count", sorted(REFERENCE_COUNTS.items()))
def test_reference_counts_from_config(name, count):
    # docs/references.md section 3
    assert architecture_from_hf_config(RELEASED_CONFIGS[name]).parameter_count == count


# ------------------------------------------------------------------------------------------------------------------
# Field mapping details that a count alone would not catch
# ------------------------------------------------------------------------------------------------------------------
def test_flags_per_family():
    mixtral = architecture_from_hf_config(SMALL_CONFIGS["mixtral"])
    assert (mixtral.n_experts, mixtral.experts_per_token, mixtral.fused_experts) == (4, 2, True)
    gpt2 = architecture_from_hf_config(SMALL_CONFIGS["gpt2"])
    assert gpt2.dropout and gpt2.fused_qkv and gpt2.tied_embeddings and gpt2.learned_position_embeddings == 128
    assert not architecture_from_hf_config(SMALL_CONFIGS["gpt2-n-inner-untied"]).dropout
    opt = architecture_from_hf_config(SMALL_CONFIGS["opt-project-in-out"])
    assert opt.learned_position_embeddings == 102 and opt.embed_width == 32 and opt.extra_parameters == 2 * 64 * 32
    assert opt.dropout and not opt.final_norm
    neox = architecture_from_hf_config(SMALL_CONFIGS["gpt_neox"])
    assert neox.parallel_attention and not neox.tied_embeddings and neox.learned_position_embeddings == 0
    assert architecture_from_hf_config(SMALL_CONFIGS["gpt_neox-tied-nobias"]).dropout
    falcon_mq = architecture_from_hf_config(SMALL_CONFIGS["falcon-old-mq"])
    assert (falcon_mq.kv_heads, falcon_mq.norms_per_layer, falcon_mq.parallel_attention) == (1, 1, True)
    falcon_new = architecture_from_hf_config(SMALL_CONFIGS["falcon-new-gqa"])
    assert (falcon_new.kv_heads, falcon_new.norms_per_layer) == (2, 2)
    falcon_seq = architecture_from_hf_config(SMALL_CONFIGS["falcon-old-sequential-bias"])
    assert (falcon_seq.kv_heads, falcon_seq.norms_per_layer, falcon_seq.parallel_attention) == (4, 2, False)
    qwen = architecture_from_hf_config(SMALL_CONFIGS["qwen2-untied"])
    assert qwen.qkv_bias and not qwen.out_bias and not qwen.mlp_bias
    bloom = architecture_from_hf_config(SMALL_CONFIGS["bloom-n-embed-untied"])
    assert bloom.hidden_size == 48 and bloom.embedding_norm and bloom.ffn_size == 4 * 48


# ------------------------------------------------------------------------------------------------------------------
# Errors and file handling
# ------------------------------------------------------------------------------------------------------------------
def test_unsupported_model_type_names_it_and_the_supported_list():
    with pytest.raises(ValueError, match=r"model_type 't5'.*supported: llama, mistral, qwen2"):
        architecture_from_hf_config({"model_type": "t5", "d_model": 512})


def test_missing_model_type():
    with pytest.raises(ValueError, match="model_type"):
        architecture_from_hf_config({"hidden_size": 64})


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                 "vocab_size"])
def test_missing_shape_key_is_named(key):
    config = dict(RELEASED_CONFIGS["llama-2-7b"])
    del config[key]
    with pytest.raises(ValueError, match=repr(key)):
        architecture_from_hf_config(config)


def test_missing_key_names_aliases():
    config = dict(RELEASED_CONFIGS["gpt2"])
    del config["n_embd"]
    with pytest.raises(ValueError, match=r"'n_embd' \(or 'hidden_size'\)"):
        architecture_from_hf_config(config)


@pytest.mark.parametrize("value", ["4096", 4096.0, True, -1, 0, None])
def test_bad_integer_value_is_named(value):
    config = dict(RELEASED_CONFIGS["llama-2-7b"], hidden_size=value)
    with pytest.raises(ValueError, match="hidden_size"):
        architecture_from_hf_config(config)


def test_bad_flag_and_probability():
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        architecture_from_hf_config(dict(RELEASED_CONFIGS["gpt2"], tie_word_embeddings="yes"))
    with pytest.raises(ValueError, match="resid_pdrop"):
        architecture_from_hf_config(dict(RELEASED_CONFIGS["gpt2"], resid_pdrop=1.5))


def test_inconsistent_heads_raise_value_error():
    with pytest.raises(ValueError, match="n_kv_heads"):
        architecture_from_hf_config(dict(RELEASED_CONFIGS["llama-2-7b"], num_key_value_heads=5))
    with pytest.raises(ValueError, match="not divisible"):
        architecture_from_hf_config(dict(RELEASED_CONFIGS["llama-2-7b"], num_attention_heads=31))


def test_auto_map_is_ignored_and_unknown_type_with_custom_code_rejected():
    custom = {"model_type": "RefinedWebModel", "auto_map": {"AutoModelForCausalLM": "x.Model"}}
    with pytest.raises(ValueError, match="not supported"):
        architecture_from_hf_config(custom)
    with_map = dict(RELEASED_CONFIGS["llama-2-7b"], auto_map={"AutoConfig": "evil.Config"})
    assert architecture_from_hf_config(with_map).parameter_count == REFERENCE_COUNTS["llama-2-7b"]


def test_reads_file_and_directory(tmp_path):
    model_dir = tmp_path / "Llama-2-7b-hf"
    model_dir.mkdir()
    path = model_dir / "config.json"
    path.write_text(json.dumps(RELEASED_CONFIGS["llama-2-7b"]), encoding="utf-8")
    from_file = architecture_from_hf_config(path)
    from_dir = architecture_from_hf_config(str(model_dir))
    assert from_file.parameter_count == from_dir.parameter_count == REFERENCE_COUNTS["llama-2-7b"]
    assert from_file.name == "Llama-2-7b-hf" and str(path) in from_file.source
    assert architecture_from_hf_config(path, name="mine").name == "mine"


def test_file_errors(tmp_path):
    with pytest.raises(ValueError, match="not a readable file"):
        load_hf_config(tmp_path / "absent.json")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ValueError, match="limit"):
        load_hf_config(big)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hf_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(ValueError, match="JSON object"):
        load_hf_config(arr)
    nan = tmp_path / "nan.json"
    nan.write_text('{"model_type": "llama", "rope_theta": NaN}', encoding="utf-8")
    with pytest.raises(ValueError, match="NaN"):
        load_hf_config(nan)
