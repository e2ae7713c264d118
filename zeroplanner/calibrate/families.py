"""Small configs of the 2024-26 families: each family's layout (same layer kinds, keys as the released config.json
files spell them) at widths of 64, so transformers builds them in milliseconds on the meta device and runs them on
CPU. Used by the reader tests (exact counts against the meta build) and by the activation census of
``benchmarks/make_validation.py`` (docs/validation.md, "Activation census: 2024-26 families"). Data, and the
bytes the census sees differently from a GPU run (:func:`census_seen_differently_bytes`)."""

from __future__ import annotations

BASE: dict = dict(  # the widths every small config starts from
    hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=1000, pad_token_id=0, bos_token_id=1, eos_token_id=1)

SMALL: dict[str, dict] = {
    "qwen3": dict(BASE, model_type="qwen3", head_dim=32),
    "qwen3-bias-tied": dict(BASE, model_type="qwen3", attention_bias=True, tie_word_embeddings=True),
    "qwen3_moe": dict(BASE, model_type="qwen3_moe", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      head_dim=32),
    "qwen3_moe-sparse-step-mlp-only": dict(BASE, model_type="qwen3_moe", moe_intermediate_size=32, num_experts=4,
                                           num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen3_next": dict(BASE, model_type="qwen3_next", moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                       shared_expert_intermediate_size=48, head_dim=16, linear_num_value_heads=4,
                       linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=12,
                       linear_conv_kernel_dim=4),
    "gemma2": dict(BASE, model_type="gemma2", head_dim=32),
    "gemma3_text": dict(BASE, model_type="gemma3_text", head_dim=32, num_hidden_layers=7),
    "gemma3": dict(model_type="gemma3", text_config=dict(BASE, head_dim=32), mm_tokens_per_image=16,
                   vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, patch_size=14, image_size=56)),
    "gemma4_text-moe": dict(BASE, model_type="gemma4_text", head_dim=16, global_head_dim=32,
                            num_global_key_value_heads=1, attention_k_eq_v=True, enable_moe_block=True,
                            num_experts=4, top_k_experts=2, moe_intermediate_size=24, hidden_size_per_layer_input=0,
                            num_hidden_layers=6, sliding_window=32),
    "gemma4_text-dense": dict(BASE, model_type="gemma4_text", head_dim=16, hidden_size_per_layer_input=0,
                              num_hidden_layers=6),
    "gemma4": dict(model_type="gemma4", tie_word_embeddings=True, vision_soft_tokens_per_image=16,
                   text_config=dict(BASE, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                                    attention_k_eq_v=True, enable_moe_block=True, num_experts=4, top_k_experts=2,
                                    moe_intermediate_size=24, hidden_size_per_layer_input=0, num_hidden_layers=6),
                   vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, head_dim=8, patch_size=4,
                                      position_embedding_size=64)),
    "phi3": dict(BASE, model_type="phi3", num_key_value_heads=4),
    "phi3-gqa": dict(BASE, model_type="phi3", resid_pdrop=0.1),
    "deepseek_v2": dict(BASE, model_type="deepseek_v2", moe_intermediate_size=32, n_routed_experts=4,
                        n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=24,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12),
    "deepseek_v2-lite-no-q-lora": dict(BASE, model_type="deepseek_v2", moe_intermediate_size=32, n_routed_experts=4,
                                       n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1,
                                       q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                                       v_head_dim=12),
    "deepseek_v3": dict(BASE, model_type="deepseek_v3", moe_intermediate_size=32, n_routed_experts=4,
                        n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=24,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, n_group=1,
                        topk_group=1),
    "llama4_text": dict(BASE, model_type="llama4_text", intermediate_size_mlp=80, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=2, head_dim=16),
    "llama4": dict(model_type="llama4", text_config=dict(BASE, intermediate_size_mlp=80, num_local_experts=4,
                                                          interleave_moe_layer_step=2, head_dim=16),
                   vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, image_size=56, patch_size=14, projector_input_dim=64,
                                      projector_output_dim=64, vision_output_dim=48, pixel_shuffle_ratio=0.5)),
    "gpt_oss": dict(BASE, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=16),
    "glm4": dict(BASE, model_type="glm4", head_dim=16),
    "glm4_moe": dict(BASE, model_type="glm4_moe", moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1,
                     num_experts_per_tok=2, first_k_dense_replace=1, head_dim=16, use_qk_norm=True),
    "olmo2": dict(BASE, model_type="olmo2"),
    "qwen2_vl": dict(BASE, model_type="qwen2_vl", image_token_id=5, video_token_id=6, vision_start_token_id=7,
                     vision_config=dict(depth=2, embed_dim=32, hidden_size=64, mlp_ratio=2, num_heads=4)),
    "qwen2_5_vl": dict(BASE, model_type="qwen2_5_vl", image_token_id=5, video_token_id=6, vision_start_token_id=7,
                       vision_config=dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=48,
                                          num_heads=4, fullatt_block_indexes=[1])),
    "nemotron_h": dict({k: v for k, v in BASE.items() if k != "num_hidden_layers"}, model_type="nemotron_h",
                       hybrid_override_pattern="M-M*E", moe_intermediate_size=32,
                       moe_shared_expert_intermediate_size=48, n_routed_experts=4, num_experts_per_tok=2,
                       mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=8, head_dim=16),
}


CENSUS_EXTRA: dict[str, dict] = {
    # the MoE family before 2024-26, censused for the routing tensors the cost model shares with the new MoE
    # families (MixtralTopKRouter keeps fp32 routing weights); not a reader case (SMALL holds those)
    "mixtral": dict(BASE, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
}
"""Configs the activation census runs beside :data:`SMALL`."""


CENSUS_SEQ_LEN = 128
"""Sequence length of the census (as section 2's shortest)."""


def census_config(label: str) -> dict:
    """The :data:`SMALL` (or :data:`CENSUS_EXTRA`) config ``label`` as the activation census runs it: vocabulary
    512 (as section 2), position limit 1024; for DeepSeek's MLA num_key_value_heads = heads (its forward needs them
    equal; no parameters)."""
    cfg = dict({**SMALL, **CENSUS_EXTRA}[label], vocab_size=512, max_position_embeddings=1024)
    if cfg["model_type"].startswith("deepseek"):
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    return cfg


CENSUS_EAGER = {
    "gemma2": "transformers refuses sdpa for it (attention-logit soft-capping); the cost model prices it eager",
    "gpt_oss": "transformers refuses sdpa for it (attention sinks); a GPU runs a sink-aware flash kernel, which the "
               "cost model prices with flash_attention on, so the census row is predicted with it off",
}
"""Model types the census runs with eager attention (predicted with ``flash_attention=False``), and why."""


def census_attention(label: str) -> str:
    """``"eager"`` for the :data:`CENSUS_EAGER` model types, else ``"sdpa"``: the attn_implementation the census
    builds ``label`` with. Raises KeyError for an unknown label."""
    return "eager" if census_config(label)["model_type"] in CENSUS_EAGER else "sdpa"


NOT_CENSUSED = {
    "gemma3": "vision-language: the census builds causal LMs only (gemma3_text is censused)",
    "gemma4": "vision-language: the census builds causal LMs only (gemma4_text is censused)",
    "llama4": "vision-language: the census builds causal LMs only (llama4_text is censused)",
    "qwen2_vl": "vision-language: the census builds causal LMs only",
    "qwen2_5_vl": "vision-language: the census builds causal LMs only",
}
"""Small configs the activation census does not run, and why."""


def census_labels() -> list[str]:
    """The :data:`SMALL` labels the activation census runs (all but :data:`NOT_CENSUSED`) and :data:`CENSUS_EXTRA`,
    sorted."""
    return sorted([label for label in SMALL if SMALL[label]["model_type"] not in NOT_CENSUSED] + list(CENSUS_EXTRA))


def _mla_cpu_math_minus_flash_bytes(arch, seq_len: int) -> float:
    """Bytes one MLA layer's attention core saves on CPU sdpa's math path minus what the priced flash kernel saves
    (bf16, micro-batch 1; a heads, q/k width d_qk, value width d_v). CPU sdpa takes its math path because the q/k
    and value head widths differ. Math path (measured, deepseek_v3 layer 1: fp32 (a, s, d_qk) Q and (a, d_qk, s)
    K^T, fp32 (a, s, d_v) V, fp32 (1, a, s, s) probabilities: the CPU math fallback computes bf16 inputs in fp32):
    4·s·a·(2·d_qk + d_v) + 4·a·s². Flash (costmodel/activations.py): bf16 Q, K (a·d_qk each), V and output
    (a·d_v each) and the fp32 log-sum-exp per head: 2·s·a·(2·d_qk + 2·d_v) + 4·a·s."""
    s, a, dqk, dv = float(seq_len), arch.n_heads, arch.dim_head, arch.v_head_dim
    return 4.0 * s * a * (2 * dqk + dv) + 4.0 * a * s * s - (2.0 * s * a * (2 * dqk + 2 * dv) + 4.0 * a * s)


def census_seen_differently_bytes(label: str, checkpointing: str, seq_len: int = CENSUS_SEQ_LEN) -> tuple[float, str]:
    """Bytes to add to the cost model's prediction (bf16, micro-batch 1) so that it counts what the CPU census
    counts where the two differ for a reason that is not a pricing error, and the reasons (``(0.0, "")`` when
    they agree):

    - MLA (deepseek_v2/v3): the attention core on CPU sdpa's math path instead of flash, in every attention layer
      (in the one recomputed layer under full checkpointing);
    - full checkpointing with rotary positions: the cos/sin tables stay alive for the whole step, bound as keyword
      arguments of each checkpointed layer (transformers 5.24 GradientCheckpointingLayer.__call__:
      ``partial(forward, self, **kwargs)``), but they are saved tensors only inside each recomputed layer, which
      the census divides by the L layers: it sees 1/L of them (large for Gemma 4's global_head_dim table).
    Raises KeyError for a label the census does not know. Needs no torch.
    """
    from ..catalog.hfconfig import architecture_from_hf_config
    from ..costmodel.activations import rotary_table_bytes

    arch = architecture_from_hf_config(census_config(label))
    extra, reasons = 0.0, []
    if arch.mla:
        layers = arch.n_attention_layers if checkpointing == "none" else 1
        extra += layers * _mla_cpu_math_minus_flash_bytes(arch, seq_len)
        reasons.append("CPU sdpa's fp32 math path for MLA's unequal q/k and value widths, in place of flash")
    tables = rotary_table_bytes(arch, seq_len, "bf16")
    if checkpointing == "full" and tables:
        extra -= tables * (1.0 - 1.0 / arch.n_layers)
        reasons.append("rotary tables held by the checkpointed layers' keyword arguments, seen in 1/L of them")
    return extra, "; ".join(reasons)
