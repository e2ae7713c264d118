"""Small configs of the 2024-26 families: each family's layout (same layer kinds, keys as the released config.json
files spell them) at widths of 64, so transformers builds them in milliseconds on the meta device and runs them on
CPU. Used by the reader tests (exact counts against the meta build) and by the activation census of
``benchmarks/make_validation.py`` (docs/validation.md, "Activation census: 2024-26 families"). Data, and the
bytes the census sees differently from a GPU run (:func:`census_seen_differently_bytes`); for the
vision-language models the census with one image (:func:`measure_vision_activation_bytes`, torch imported
inside it), the matching prediction and the named CPU-vs-GPU differences."""

from __future__ import annotations

import copy

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
                   vision_config=dict(hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, image_size=56, patch_size=14, projector_input_dim=64,
                                      projector_output_dim=64, vision_output_dim=64, pixel_shuffle_ratio=0.5)),
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


CENSUS_KERNEL_STAND_INS: dict[str, str] = {
    "qwen3_next": "the Gated DeltaNet core saves fla's chunk_gated_delta_rule tensors (L2-normalised q and k with "
                  "their fp32 rstd, the contiguous v, the fp32 chunk-local gate cumsum, beta and the (s, value heads, "
                  "64) WY matrix in bf16) and the short convolution causal_conv1d's (its input)",
    "nemotron_h": "the Mamba-2 mixer's fused conv + scan + gated norm + out_proj saves mamba_ssm's "
                  "mamba_split_conv1d_scan_combined tensors (in_proj's output zxbcdt, the ungated scan output in "
                  "bf16 and the fp32 per-group norm rstd)",
}
"""Labels the census also runs with ``measure_activation_bytes(..., gpu_kernel_stand_ins=True)``: their
non-attention mixers' cores are CUDA-only kernels whose saved tensors zeroplanner/calibrate/kernel_stand_ins.py
stands in for on CPU (the lists read from flash-linear-attention 0.6.0, causal_conv1d 1.7.0 and mamba_ssm 2.3.2,
cited there); the plain rows measure transformers' reference PyTorch path, which saves fp32 per-chunk matrices the
kernels do not. The cost model prices the kernel path."""

NOT_CENSUSED: dict[str, str] = {}
"""Small configs the activation census does not run, and why."""

VISION_CENSUS = ("qwen2_5_vl", "qwen2_vl", "gemma3", "gemma4", "llama4")
"""Vision-language small configs the census runs with an image (:func:`measure_vision_activation_bytes`): the
towers costmodel/vision.py prices."""


def census_labels() -> list[str]:
    """The :data:`SMALL` labels the causal-LM activation census runs (all but :data:`NOT_CENSUSED` and
    :data:`VISION_CENSUS`) and :data:`CENSUS_EXTRA`, sorted."""
    skip = set(NOT_CENSUSED) | set(VISION_CENSUS)
    return sorted([label for label in SMALL if SMALL[label]["model_type"] not in skip] + list(CENSUS_EXTRA))


VISION_CENSUS_UNSEEN = {
    "llama4": "under full checkpointing transformers 5.24 cuts the gradient below Llama 4's vision adapter: "
              "Llama4VisionEncoder calls each layer with keyword arguments only (hidden_state=...), and "
              "GradientCheckpointingLayer hands the reentrant checkpoint only positional ones "
              "(partial(forward, **kwargs), *args), so it sees no tensor input, its output requires no grad (torch "
              "warns 'None of the inputs have requires_grad=True') and the blocks record and train nothing; the cost "
              "model prices the tower as it trains when the gradient reaches it (non-reentrant checkpointing)",
}
"""Vision census labels whose full-checkpointing tower the census cannot see as priced, and why: their rows are
matched to the byte once the unseen bytes are named, but not held to 5% as priced."""


def vision_census_config(label: str) -> dict:
    """The :data:`VISION_CENSUS` config ``label`` as the census runs it: :func:`census_config` plus a multimodal
    rotary section that fits the small head width (mrope_section sums to head_dim / 2 = 8; the released files'
    [16, 24, 24] is for 128-wide heads); for gemma3 the nested configs at vocabulary 512 with a 224-pixel image
    (16 x 16 patches of 14 pooled into 16 tokens); for gemma4 the nested configs at vocabulary 512 with the released
    file's patch_size 16, standardize and use_bidirectional_attention "vision" (google/gemma-4-26b-a4b config.json,
    ../shared/hf-configs/gemma-4-26b-a4b.json), one 12 x 12-patch image pooled 3 x 3 into its 16 tokens. Raises
    KeyError for a label not in :data:`VISION_CENSUS`; for llama4 the nested configs at vocabulary 512 with one
    224-pixel tile (256 patches of 14 and the class token, pixel-shuffled 2 x 2 into 64 tokens)."""
    if label not in VISION_CENSUS:
        raise KeyError(label)
    if label == "llama4":  # one 224-pixel tile: 256 patches of 14 (+ the class token), shuffled into 64 tokens
        cfg = copy.deepcopy(SMALL[label])
        cfg["text_config"].update(vocab_size=512, max_position_embeddings=1024)
        cfg["vision_config"].update(image_size=224)
        return dict(cfg, image_token_index=5)
    if label == "gemma4":
        cfg = copy.deepcopy(SMALL[label])
        cfg["text_config"].update(vocab_size=512, max_position_embeddings=1024, use_bidirectional_attention="vision")
        cfg["vision_config"].update(patch_size=16, standardize=True)
        return dict(cfg, image_token_id=5, boi_token_id=6, eoi_token_id=7, video_token_id=8, audio_token_id=9)
    if label == "gemma3":  # nested text_config; a 224-pixel image of 256 patches pooled 4 x 4 into 16 tokens
        cfg = copy.deepcopy(SMALL[label])
        cfg["text_config"].update(vocab_size=512, max_position_embeddings=1024)
        cfg["vision_config"].update(image_size=224, vision_use_head=False)
        return dict(cfg, mm_tokens_per_image=16, image_token_index=5, boi_token_index=6, eoi_token_index=7)
    return dict(census_config(label), rope_parameters=dict(rope_type="default", rope_theta=1_000_000.0,
                                                          mrope_section=[2, 3, 3]))


def measure_vision_activation_bytes(label: str, *, checkpointing: str = "none", freeze_vision: bool = False,
                                    attn_implementation: str = "sdpa", seq_len: int = CENSUS_SEQ_LEN,
                                    seed: int = 0) -> dict[str, int]:
    """Bytes a real transformers vision-language model keeps for backward after one training forward with one
    image, measured on CPU, split between the vision tower and the language model.

    As ``calibrate.measure_activation_bytes`` (bf16 cast, train mode, ``use_cache=False``, every tensor autograd
    saves counted once by storage, parameters and buffers excluded; full checkpointing = HF's
    ``activation_checkpointing_enable`` with ``use_reentrant=True``, which checkpoints the vision blocks too) for
    ``AutoModelForImageTextToText`` built from :func:`vision_census_config`, with one image of the tower's
    ``patches_per_image`` patches (a square grid, random pixel values: Qwen's flattened patches with
    ``image_grid_thw`` = (1, g, g) after a vision-start marker; Gemma 3's (1, 3, H, W) image with
    ``token_type_ids``; Gemma 4's (1, P, 3·p²) patches in [0, 1] with their (x, y) ``image_position_ids`` and
    ``mm_token_type_ids``) whose tokens stand in the sequence: ``seq_len`` text tokens + the image's tokens.
    ``freeze_vision``: the tower's (and projector's) parameters get ``requires_grad=False`` (as ms-swift
    ``freeze_vit`` / LLaMA-Factory ``freeze_vision_tower`` do).

    Attribution: a tensor saved while the tower's forward runs (Gemma 3 and Llama 4: and the projector's; Gemma 4: and
    embed_vision's) is the tower's; in
    backward everything recomputed after the gradient reaches the tower's output is the tower's (the tower runs
    first, so its blocks are recomputed last), the rest the language model's. Recomputed bytes are divided by the block (layer) count as
    in ``measure_activation_bytes``.

    Returns bytes: ``tower`` (saved + one block recomputed), ``language`` (saved + the logits when not saved +
    one layer recomputed), ``total`` (their sum), and ``parameters`` (count). Needs torch and transformers.
    """
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    from ..catalog.hfconfig import architecture_from_hf_config

    cfg = vision_census_config(label)
    vision = architecture_from_hf_config(cfg).vision
    cfg = dict(cfg)
    model_type = cfg.pop("model_type")
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **cfg)
    model = AutoModelForImageTextToText.from_config(config, attn_implementation=attn_implementation)
    model = model.to(torch.bfloat16)
    model.train()
    gemma = model_type == "gemma3"
    if model_type == "gemma4":
        towers = [model.model.vision_tower, model.model.embed_vision]
    elif model_type == "llama4":
        towers = [model.vision_model, model.multi_modal_projector]
        # transformers 5.24 Llama4ForConditionalGeneration.forward reads ``outputs.image_outputs`` from its language
        # model's output, which has no such field (AttributeError after the loss); give it one (None: unused here)
        model.language_model.register_forward_hook(lambda _m, _a, o: setattr(o, "image_outputs", None))
    elif gemma:
        towers = [model.model.vision_tower, model.model.multi_modal_projector]
    else:
        towers = [model.model.visual]
    if freeze_vision:
        for param in (param for t in towers for param in t.parameters()):
            param.requires_grad_(False)
    if checkpointing == "full":
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    excluded = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}

    state = {"phase": "forward", "in_tower": 0, "tower_backward": False}
    saved: dict[str, dict[int, int]] = {"tower": {}, "language": {}, "tower_recompute": {}, "language_recompute": {}}
    keep: list = []

    def pack(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if not ptr or ptr in excluded or t.device.type == "meta" or any(ptr in d for d in saved.values()):
            return t
        if state["phase"] == "forward":
            where = "tower" if state["in_tower"] else "language"
        else:
            where = "tower_recompute" if state["tower_backward"] else "language_recompute"
        saved[where][ptr] = s.nbytes()
        keep.append(t)
        return t

    def enter(*_):
        state["in_tower"] += 1

    def leave(_module, _args, output):
        state["in_tower"] -= 1
        out = output if isinstance(output, torch.Tensor) else output.pooler_output
        if out.requires_grad:
            out.register_hook(lambda grad: state.update(tower_backward=True))

    for t in towers:
        t.register_forward_pre_hook(enter)
    towers[-1].register_forward_hook(leave)
    for t in towers[:-1]:
        t.register_forward_hook(lambda *_: state.update(in_tower=state["in_tower"] - 1))

    side = int(round(vision.patches_per_image ** 0.5))
    tokens = vision.tokens_per_image
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(16, config.text_config.vocab_size, (1, seq_len + tokens), generator=gen)
    ids[0, 5:5 + tokens] = config.image_token_id
    kinds = (ids == config.image_token_id).int()
    if model_type == "gemma4":  # the image processor's patches in [0, 1] with their (x, y) grid positions
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        inputs = dict(pixel_values=torch.rand(1, vision.patches_per_image, vision.patch_input_size, generator=gen),
                      image_position_ids=torch.stack([xs.reshape(-1), ys.reshape(-1)], -1)[None],
                      mm_token_type_ids=kinds.long())
    elif model_type == "llama4":  # Llama4VisionModel reads (tiles, channels, H, W)
        patch = int(round((vision.patch_input_size // 3) ** 0.5))
        inputs = dict(pixel_values=torch.randn(1, 3, side * patch, side * patch, generator=gen).to(torch.bfloat16))
    elif gemma:  # SiglipVisionModel reads (images, channels, H, W); Gemma3Model needs token_type_ids in training
        patch = int(round((vision.patch_input_size // 3) ** 0.5))  # 3 channels x patch_size^2
        inputs = dict(pixel_values=torch.randn(1, 3, side * patch, side * patch, generator=gen),
                      token_type_ids=kinds.long())
    else:  # Qwen: flattened patches with their (t, h, w) grid after a vision-start marker
        ids[0, 4] = config.vision_start_token_id
        inputs = dict(pixel_values=torch.randn(vision.patches_per_image, vision.patch_input_size, generator=gen),
                      image_grid_thw=torch.tensor([[1, side, side]]), mm_token_type_ids=kinds)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=ids, use_cache=False, **inputs)
        loss, logits_t = out.loss, out.logits
        state["phase"] = "backward"
        logits_ptr = logits_t.untyped_storage().data_ptr()
        logits = 0 if logits_ptr in saved["language"] else logits_t.untyped_storage().nbytes()
        loss.backward()
    full = checkpointing == "full"
    tower_bytes = sum(saved["tower"].values()) + (sum(saved["tower_recompute"].values()) // vision.layers
                                                  if full else 0)
    layers = int(config.text_config.num_hidden_layers)
    language = sum(saved["language"].values()) + logits + (sum(saved["language_recompute"].values()) // layers
                                                            if full else 0)
    return {"tower": int(tower_bytes), "language": int(language), "total": int(tower_bytes + language),
            "parameters": int(sum(p.numel() for p in model.parameters()))}


def predicted_vision_activation_bytes(label: str, *, checkpointing: str = "none", freeze_vision: bool = False,
                                      flash_attention: bool = True, seq_len: int = CENSUS_SEQ_LEN) -> dict[str, float]:
    """The cost model's activation bytes for the :func:`measure_vision_activation_bytes` run of ``label`` (bf16,
    micro-batch 1, one image, ``seq_len`` text tokens): ``tower`` (the activation term's vision part), ``language``
    (the rest: the sequence includes the image's tokens) and ``total``. Needs no torch."""
    from .. import catalog
    from ..catalog.hfconfig import architecture_from_hf_config
    from ..costmodel import Candidates, make_context
    from ..costmodel.activations import activation_parts
    from ..specs import ClusterSpec, NetworkSpec, Scenario, TrainingSpec

    arch = architecture_from_hf_config(vision_census_config(label), name="tiny")
    cluster = ClusterSpec(gpu=catalog.gpu("A100-80GB"), gpus_per_node=1, nodes=1,
                          network=NetworkSpec(name="none", link_gbps=100))
    training = TrainingSpec(precision="bf16", micro_batch=1, grad_accum=1, seq_len=seq_len,
                            checkpointing=checkpointing, flash_attention=flash_attention, images_per_sample=1,
                            freeze_vision=freeze_vision)
    sc = Scenario(model=arch, cluster=cluster, training=training)
    parts = {k: float(v.reshape(-1)[0]) for k, v in activation_parts(make_context(sc), Candidates.from_scenario(sc))
             .items()}
    tower = parts.pop("vision")
    return {"tower": tower, "language": sum(parts.values()), "total": tower + sum(parts.values())}


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


def vision_census_seen_differently_bytes(label: str, *, checkpointing: str = "none", freeze_vision: bool = False,
                                         attn_implementation: str = "sdpa") -> tuple[float, str]:
    """Bytes to add to the cost model's tower prediction (:func:`predicted_vision_activation_bytes`) so that it
    counts what the CPU census of :func:`measure_vision_activation_bytes` counts where the two differ for a reason
    that is not a pricing error, and the reasons (``(0.0, "")`` when they agree). Every term is derived from the
    shapes and was matched to the byte by the census (docs/validation.md section 6):

    - sdpa on CPU, trainable Qwen tower: transformers runs the non-flash_attention_2 path per window (per image
      for Qwen2-VL) and joins the outputs (``torch.cat``), a new a_b·P·e tensor that the proj Linear keeps, in
      every recorded block; flash_attention_2's varlen kernel (what is priced) returns the output the proj reads
      (SigLIP has no such join: CPU sdpa's output is already laid out (b, s, heads, d));
    - LayerNorm (Qwen2-VL, SigLIP): CPU ``layer_norm`` keeps mean and rstd in the input's dtype (bf16, 2 bytes
      each per row), CUDA in fp32 (priced): (2·a_b - 8)·P per recorded norm (two per block, one in the merger or
      SigLIP's post_layernorm; Llama 4: two per block, layernorm_pre and layernorm_post, over P + 1 rows);
    - full checkpointing: the fp32 rotary cos/sin tables stay alive as keyword arguments of the checkpointed
      blocks but are saved tensors only inside each recomputed block, which the census divides by the block count:
      it sees 1/L of them (Gemma 4's are in the working precision).
    Gemma 4's tower has no other: its RMSNorms run in fp32 on both devices, and CPU sdpa, like CUDA's flash
    kernel, lays its output out (b, s, heads, d), so o_proj reads the kernel output.
    Raises KeyError for a label not in :data:`VISION_CENSUS`. Needs no torch."""
    from ..catalog.hfconfig import architecture_from_hf_config

    v = architecture_from_hf_config(vision_census_config(label)).vision
    full = checkpointing == "full"
    if freeze_vision and (not full or v.family == "gemma4"):
        return 0.0, ""  # nothing is recorded in a frozen tower (Gemma 4's: not even checkpointed)
    p, e, ab = float(v.patches_per_image), float(v.hidden_size), 2.0
    recorded = 1 if full else v.layers  # blocks whose tensors the census counts (one recomputed under full)
    extra, reasons = 0.0, []
    if attn_implementation == "sdpa" and not freeze_vision and v.family in ("qwen2_vl", "qwen2_5_vl"):
        extra += recorded * ab * p * e
        reasons.append("CPU sdpa's per-window path concatenates the attention outputs into a new proj input")
    if v.family in ("qwen2_vl", "gemma3"):
        extra += (2 * recorded + 1) * (2.0 * ab - 8.0) * p
        reasons.append("CPU layer_norm keeps mean and rstd in bf16 (CUDA: fp32)")
    if v.family == "llama4":  # two per block, layernorm_pre and layernorm_post, over the patches + class token
        rows = p + v.class_tokens
        if full:  # the checkpointed blocks record nothing (VISION_CENSUS_UNSEEN); frozen: nor does what follows
            from ..costmodel.vision import _norm_bytes, vision_activation_parts

            parts = vision_activation_parts(v, 1, activation_bytes=ab, checkpointing=2, trainable=not freeze_vision,
                                            flash_attention=attn_implementation != "eager")
            extra -= float(parts["blocks"])
            if freeze_vision:  # only layernorm_pre (fed by the hooked patch embedding) records anything
                extra -= float(parts["merger"]) - float(_norm_bytes(v, rows, ab, False))
            reasons.append(VISION_CENSUS_UNSEEN["llama4"])
        norms = (1 if freeze_vision else 2) if full else 2 * recorded + 2
        extra += norms * (2.0 * ab - 8.0) * rows
        reasons.append("CPU layer_norm keeps mean and rstd in bf16 (CUDA: fp32)")
    if full and v.family not in ("gemma3", "llama4"):  # SigLIP: learned positions; Llama 4: its rotary table is
        # a buffer (Llama4VisionRotaryEmbedding.freqs_ci), not an activation
        # Qwen's tables are fp32; Gemma4VisionRotaryEmbedding casts its cos and sin to the working precision
        tables = 2.0 * (ab if v.family == "gemma4" else 4.0) * p * v.head_width
        extra -= tables * (1.0 - 1.0 / v.layers)
        reasons.append("rotary tables held by the checkpointed blocks' keyword arguments, seen in 1/L of them")
    return extra, "; ".join(reasons)


def vision_census_language_gap_bytes(label: str, *, checkpointing: str = "none",
                                     attn_implementation: str = "sdpa") -> tuple[float, str]:
    """Bytes the census of ``label``'s language model saves beyond the cost model's prediction, with their
    measured cause, where the cost model does not price them (``(0.0, "")`` elsewhere). Gemma 3 with sdpa and no
    checkpointing: the image tokens attend to each other bidirectionally (Gemma3Model builds the mask from
    ``token_type_ids``), so every layer hands sdpa an explicit (1, 1, s, s) bf16 mask, which it saves, and
    transformers' ``use_gqa_in_sdpa`` refuses the kernel's own GQA with a mask, so K and V are repeated to
    n_heads: L·(a_b·s² + 2·a_b·s·(h_q - h_kv)) (measured per tensor: 4 x 41,472 + 4 x 36,864 bytes at s = 144).
    Gemma 4 likewise, in its sliding-window layers only (measured: 5 x 41,472 + 5 x 18,432 bytes at s = 144;
    Gemma4Model refuses flash_attention_2, so a GPU run saves them too). The cost model prices the flash kernel
    (causal, GQA inside). Needs no torch."""
    from ..catalog.hfconfig import architecture_from_hf_config

    if label not in ("gemma3", "gemma4") or attn_implementation != "sdpa" or checkpointing != "none":
        return 0.0, ""
    arch = architecture_from_hf_config(vision_census_config(label))
    s = float(CENSUS_SEQ_LEN + arch.vision_tokens_per_image)
    # Gemma 4 (use_bidirectional_attention "vision", as the released files): only the sliding-window layers get the
    # bidirectional overlay (create_masks_for_vision_model: full-attention layers stay causal, sdpa's is_causal)
    layers = arch.sliding_window_layers if label == "gemma4" else arch.n_layers
    gap = layers * (2.0 * s * s + 2.0 * 2.0 * s * (arch.q_size - arch.kv_size))
    return gap, ("the image tokens' bidirectional mask: an explicit (1, 1, s, s) mask saved per layer and K/V "
                 "repeated to n_heads (use_gqa_in_sdpa refuses GQA with a mask)")


def vision_census_comparison(row: dict) -> dict:
    """One stored vision census row (``label``, ``checkpointing``, ``freeze_vision``, ``attn_implementation``,
    ``measured``: {"tower", "language"} bytes) beside the cost model: ``predicted`` (the same keys,
    :func:`predicted_vision_activation_bytes`; flash when the census ran sdpa), ``measured``, ``seen_differently``
    ((bytes, reasons) of :func:`vision_census_seen_differently_bytes`) and ``language_gap`` ((bytes, cause) of
    :func:`vision_census_language_gap_bytes`). The figures docs/validation.md renders and the census tests check.
    Needs no torch."""
    ck, freeze, attn = row["checkpointing"], row["freeze_vision"], row["attn_implementation"]
    return {
        "predicted": predicted_vision_activation_bytes(row["label"], checkpointing=ck, freeze_vision=freeze,
                                                       flash_attention=attn == "sdpa"),
        "measured": row["measured"],
        "seen_differently": vision_census_seen_differently_bytes(row["label"], checkpointing=ck,
                                                                 freeze_vision=freeze, attn_implementation=attn),
        "language_gap": vision_census_language_gap_bytes(row["label"], checkpointing=ck, attn_implementation=attn),
    }
