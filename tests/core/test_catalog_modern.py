"""Catalog entries of the 2024-26 families: each equals what the built-in reader makes of its config, and its
count equals transformers 5.24's meta-device build of that config.

Sources: the six entries marked ``SHARED`` are the published config.json files in ``tests/data/hf-configs/`` (their
counts are also pinned by ``param_counts.json`` there). The others are the shape keys of each model's published
config.json on the Hugging Face Hub (repository named in the entry's source), transcribed here because tests make
no downloads; keys a file does not set take the transformers 5.24 config class defaults, as in the reader.
"""

from __future__ import annotations

import json

import pytest

from zeroplanner import catalog
from zeroplanner.catalog.hfconfig import architecture_from_hf_config

from tests.helpers import HF_CONFIGS

SHARED = {  # catalog name -> file in tests/data/hf-configs
    "qwen3-235b-a22b": "qwen3-235b-a22b", "deepseek-v3": "deepseek-v3", "mixtral-8x22b": "mixtral-8x22b",
    "gemma-4-26b-a4b": "gemma-4-26b-a4b", "gpt-oss-20b": "gpt-oss-20b",
    "nemotron-3-nano-30b-a3b": "nemotron-3-nano-30b-a3b",
}


def _qwen3(h, f, layers, heads, kv, tied, pos=40960):
    return dict(model_type="qwen3", hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=128, vocab_size=151936,
                tie_word_embeddings=tied, max_position_embeddings=pos)


def _qwen25_vl(h, f, layers, heads, kv, vocab, tied):
    return dict(model_type="qwen2_5_vl", hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab, tie_word_embeddings=tied,
                max_position_embeddings=128000,
                vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                   out_hidden_size=h, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                                   in_chans=3, window_size=112, fullatt_block_indexes=[7, 15, 23, 31]))


def _llama(h, f, layers, heads, kv, tied, pos=131072):
    return dict(model_type="llama", hidden_size=h, intermediate_size=f, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, vocab_size=128256, tie_word_embeddings=tied,
                max_position_embeddings=pos)


TRANSCRIBED: dict[str, tuple[str, dict]] = {
    "qwen3-0.6b": ("Qwen/Qwen3-0.6B", _qwen3(1024, 3072, 28, 16, 8, True)),
    "qwen3-1.7b": ("Qwen/Qwen3-1.7B", _qwen3(2048, 6144, 28, 16, 8, True)),
    "qwen3-4b": ("Qwen/Qwen3-4B", _qwen3(2560, 9728, 36, 32, 8, True)),
    "qwen3-8b": ("Qwen/Qwen3-8B", _qwen3(4096, 12288, 36, 32, 8, False)),
    "qwen3-14b": ("Qwen/Qwen3-14B", _qwen3(5120, 17408, 40, 40, 8, False)),
    "qwen3-32b": ("Qwen/Qwen3-32B", _qwen3(5120, 25600, 64, 64, 8, False)),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", dict(
        model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
        tie_word_embeddings=False, max_position_embeddings=40960)),
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B-Instruct", dict(
        model_type="qwen3_next", hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, num_hidden_layers=48, full_attention_interval=4,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, num_experts=512, num_experts_per_tok=10,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, linear_value_head_dim=128,
        partial_rotary_factor=0.25, vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=262144)),
    "qwen2.5-vl-3b": ("Qwen/Qwen2.5-VL-3B-Instruct", _qwen25_vl(2048, 11008, 36, 16, 2, 151936, True)),
    "qwen2.5-vl-7b": ("Qwen/Qwen2.5-VL-7B-Instruct", _qwen25_vl(3584, 18944, 28, 28, 4, 152064, False)),
    "qwen2.5-vl-72b": ("Qwen/Qwen2.5-VL-72B-Instruct", _qwen25_vl(8192, 29568, 80, 64, 8, 152064, False)),
    "qwen2-vl-7b": ("Qwen/Qwen2-VL-7B-Instruct", dict(
        model_type="qwen2_vl", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        max_position_embeddings=32768,
        vision_config=dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=3584, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3))),
    "gemma-2-9b": ("google/gemma-2-9b", dict(
        model_type="gemma2", hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192)),
    "gemma-2-27b": ("google/gemma-2-27b", dict(
        model_type="gemma2", hidden_size=4608, intermediate_size=36864, num_hidden_layers=46,
        num_attention_heads=32, num_key_value_heads=16, head_dim=128, vocab_size=256000, sliding_window=4096,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=8192)),
    "gemma-3-1b": ("google/gemma-3-1b-pt", dict(
        model_type="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144, sliding_window=512,
        sliding_window_pattern=6, max_position_embeddings=32768)),
    "gemma-3-27b": ("google/gemma-3-27b-pt", dict(
        model_type="gemma3", mm_tokens_per_image=256,
        text_config=dict(hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                         num_key_value_heads=16, head_dim=128, vocab_size=262208, sliding_window=1024,
                         sliding_window_pattern=6, max_position_embeddings=131072, query_pre_attn_scalar=168),
        vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                           patch_size=14, image_size=896, vision_use_head=False))),
    "phi-3-mini-4k": ("microsoft/Phi-3-mini-4k-instruct", dict(
        model_type="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096, tie_word_embeddings=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    "phi-4": ("microsoft/phi-4", dict(
        model_type="phi3", hidden_size=5120, intermediate_size=17920, num_hidden_layers=40, num_attention_heads=40,
        num_key_value_heads=10, vocab_size=100352, max_position_embeddings=16384, tie_word_embeddings=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)),
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", dict(
        model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
        qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
        num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, vocab_size=102400,
        max_position_embeddings=163840, tie_word_embeddings=False)),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", _llama(2048, 8192, 16, 32, 8, True)),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", _llama(3072, 8192, 28, 24, 8, True)),
    "llama-3.3-70b": ("meta-llama/Llama-3.3-70B-Instruct", _llama(8192, 28672, 80, 64, 8, False)),
    "llama-4-scout-17b-16e-text": ("meta-llama/Llama-4-Scout-17B-16E (text_config)", dict(
        model_type="llama4_text", hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384,
        num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128, num_local_experts=16,
        num_experts_per_tok=1, interleave_moe_layer_step=1, vocab_size=202048, max_position_embeddings=10485760,
        tie_word_embeddings=False)),
    "gpt-oss-120b": ("openai/gpt-oss-120b", dict(
        model_type="gpt_oss", hidden_size=2880, intermediate_size=2880, num_hidden_layers=36,
        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128, num_experts_per_tok=4,
        vocab_size=201088, sliding_window=128, max_position_embeddings=131072, tie_word_embeddings=False,
        attention_bias=True, layer_types=["sliding_attention", "full_attention"] * 18)),
    "glm-4-9b-0414": ("THUDM/GLM-4-9B-0414", dict(
        model_type="glm4", hidden_size=4096, intermediate_size=13696, num_hidden_layers=40, num_attention_heads=32,
        num_key_value_heads=2, head_dim=128, vocab_size=151552, attention_bias=True, max_position_embeddings=32768,
        tie_word_embeddings=False)),
    "olmo-2-7b": ("allenai/OLMo-2-1124-7B", dict(
        model_type="olmo2", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=100352, max_position_embeddings=4096, tie_word_embeddings=False,
        attention_bias=False)),
}


def config_of(name: str) -> dict:
    if name in SHARED:
        return json.loads((HF_CONFIGS / f"{SHARED[name]}.json").read_text(encoding="utf-8"))
    return TRANSCRIBED[name][1]


NAMES = sorted([*SHARED, *TRANSCRIBED])


@pytest.mark.parametrize("name", NAMES)
def test_catalog_entry_is_its_config(name):
    from_config = architecture_from_hf_config(config_of(name), name=name)
    entry = catalog.model(name)
    assert entry.model_dump(exclude={"source"}) == from_config.model_dump(exclude={"source"})
    assert entry.parameter_count == from_config.parameter_count


@pytest.mark.parametrize("name", sorted(SHARED))
def test_shared_entries_match_param_counts_json(name):
    counts = json.loads((HF_CONFIGS / "param_counts.json").read_text(encoding="utf-8"))
    assert catalog.model(name).parameter_count == counts[SHARED[name]]["parameters"]


MULTIMODAL = {"gemma3", "gemma4", "qwen2_vl", "qwen2_5_vl"}


@pytest.mark.parametrize("name", sorted(TRANSCRIBED))
def test_transcribed_entries_match_transformers_meta(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = config_of(name)
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
    auto = transformers.AutoModelForImageTextToText if config["model_type"] in MULTIMODAL else \
        transformers.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(cfg)
    count = sum(dict((id(p), p.numel()) for p in model.parameters()).values())
    assert catalog.model(name).parameter_count == count
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    assert catalog.model(name).largest_module_params == pytest.approx(stage3.model_to_params(model)[1], rel=0.01)
