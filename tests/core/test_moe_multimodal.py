"""MoE and vision-language models in the cost model: what is sharded, what is active per token, what is frozen.

Sources: the published active-parameter counts of each MoE (cited per row); ZeRO's model-state accounting
(Rajbhandari et al., arXiv 1910.02054, Sec. 3.1/5: 2Ψ 16-bit weights, 2Ψ gradients, KΨ = 12Ψ Adam states in mixed
precision, each divided by N_d at the stage that partitions it) applied to Ψ from transformers' meta-device count;
Korthikanti et al. (arXiv 2205.05198) for activations, whose per-token tensors do not depend on experts that
receive no tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from zeroplanner import catalog
from zeroplanner.costmodel.activations import activation_bytes, activation_parts
from zeroplanner.costmodel.context import Candidates, make_context
from zeroplanner.costmodel.memory import model_state_bytes
from zeroplanner.planner import plan
from zeroplanner.scenarios import build_scenario
from zeroplanner.specs import replace

# Active (per-token) parameters as published; the conventions differ on whether the input embedding lookup is
# counted, so the reference must lie between matmul_params_per_token (lm_head in, input embedding out) and that
# plus the input embedding, within the rounding of the published figure (3%).
PUBLISHED_ACTIVE = {
    "qwen3-235b-a22b": 22e9,  # Qwen3 Technical Report, arXiv 2505.09388, Table 2 (22B activated)
    "qwen3-30b-a3b": 3.3e9,  # ibid. (3B activated; model card: 3.3B)
    "deepseek-v3": 37e9,  # DeepSeek-V3 Technical Report, arXiv 2412.19437, abstract (37B activated per token)
    "deepseek-v2-lite": 2.4e9,  # DeepSeek-V2, arXiv 2405.04434, Appendix B (2.4B activated)
    "gpt-oss-20b": 3.61e9,  # gpt-oss-120b & gpt-oss-20b Model Card, arXiv 2508.10925, Table 1 (3.61B active)
    "gpt-oss-120b": 5.13e9,  # ibid. (5.13B active)
    "mixtral-8x22b": 39e9,  # Mistral AI, "Cheaper, Better, Faster, Stronger" (2024): 39B active of 141B
    "llama-4-scout-17b-16e-text": 17e9,  # Meta Llama 4 model card: 17B activated, 109B total (with vision)
}


def _one(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


@pytest.mark.parametrize("name,active", sorted(PUBLISHED_ACTIVE.items()))
def test_moe_flops_use_the_active_experts(name, active):
    m = catalog.model(name)
    low = m.matmul_params_per_token
    high = low + m.vocab_size * m.embed_width
    assert low * 0.97 <= active <= high * 1.03, (low, high)
    assert m.parameter_count > 2.5 * high  # every expert is counted in Ψ, only k of them per token


def _scenario(model, stage, nodes=8, **training):
    s = build_scenario(model=model, gpu="H100-80GB", gpus_per_node=8, nodes=nodes, stage=stage, seq_len=4096)
    return replace(s, training=replace(s.training, **training)) if training else s


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_experts_states_are_sharded(stage):
    """Qwen3-235B-A22B, 64 GPUs: Adam states (12Ψ) of ALL experts divided by N_d from stage 1, gradients (2Ψ)
    from stage 2, weights (2Ψ) at stage 3, Ψ = 235,093,634,560 (param_counts.json)."""
    sc = _scenario("qwen3-235b-a22b", stage)
    ctx = make_context(sc)
    states = model_state_bytes(ctx, Candidates.from_scenario(sc))
    psi, n = 235_093_634_560, 64
    assert _one(states["optimizer_states"]) == pytest.approx(12 * psi / n, rel=1e-6)
    if stage == 3:
        assert _one(states["parameters"]) == pytest.approx(2 * psi / n, rel=0.01)


def test_expert_activations_follow_top_k_not_the_expert_count():
    """Experts that receive no tokens save nothing: with k fixed, more experts add only the router's fp32 softmax
    (4 bytes per token per expert, Qwen3MoeTopKRouter.forward) and the int32 expert offsets of
    grouped_mm_experts_forward (4 bytes per expert), as the saved-tensor census measures them (docs/validation.md
    section 6, qwen3_moe)."""
    base = catalog.model("qwen3-30b-a3b")
    more = replace(base, n_experts=2 * base.n_experts)
    acts = []
    for arch in (base, more):
        sc = build_scenario(architecture=arch, gpu="H100-80GB", seq_len=2048, checkpointing="none")
        acts.append(_one(activation_bytes(make_context(sc), Candidates.from_scenario(sc))))
    router = (4 * 2048 + 4) * base.n_experts * base.n_layers
    assert acts[1] - acts[0] == pytest.approx(router, rel=1e-9)
    fewer_k = replace(base, experts_per_token=1)
    sc = build_scenario(architecture=fewer_k, gpu="H100-80GB", seq_len=2048, checkpointing="none")
    assert _one(activation_bytes(make_context(sc), Candidates.from_scenario(sc))) < 0.6 * acts[0]


def test_image_tokens_are_added_to_the_sequence():
    """Qwen2.5-VL: one 448x448 image is (448/28)^2 = 256 tokens in the language model's sequence (Qwen2.5-VL
    processor: 14-pixel patches merged 2x2)."""
    vl = catalog.model("qwen2.5-vl-7b")
    assert vl.vision_tokens_per_image == 256
    with_image = build_scenario(model="qwen2.5-vl-7b", gpu="A100-80GB", seq_len=2048)
    with_image = replace(with_image, training=replace(with_image.training, images_per_sample=2))
    longer = build_scenario(model="qwen2.5-vl-7b", gpu="A100-80GB", seq_len=2048 + 512)
    a = activation_bytes(make_context(with_image), Candidates.from_scenario(with_image))
    b = activation_bytes(make_context(longer), Candidates.from_scenario(longer))
    # the rest is the vision tower's own activations (costmodel/vision.py; tests/core/test_vision_activations.py)
    tower = activation_parts(make_context(with_image), Candidates.from_scenario(with_image))["vision"]
    assert _one(tower) > 0
    np.testing.assert_allclose(a - tower, b, rtol=1e-12)


def test_vision_tower_params_match_transformers_and_freezing_removes_their_states():
    """The seed article's scenario: a Qwen2.5-VL model, full fine-tune on 8 x A100-80GB, vision tower trainable
    and frozen. Vision parameters: transformers 5.24's meta-device Qwen2_5_VLForConditionalGeneration, module
    model.visual; frozen ones keep their bf16 weights and lose gradients and the 12-byte Adam states."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.core.test_catalog_modern import config_of  # the transcribed Qwen2.5-VL-7B config

    config = config_of("qwen2.5-vl-7b")
    cfg = transformers.AutoConfig.for_model("qwen2_5_vl", **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    vision = sum(p.numel() for p in model.model.visual.parameters())
    arch = catalog.model("qwen2.5-vl-7b")
    assert arch.vision_params == vision == 676_550_144

    answers = {}
    for freeze in (False, True):
        sc = build_scenario(model="qwen2.5-vl-7b", gpu="A100-80GB", gpus_per_node=8, stage=2, seq_len=4096)
        sc = replace(sc, training=replace(sc.training, freeze_vision=freeze, images_per_sample=1))
        assert sc.trainable_parameters == arch.parameter_count - (vision if freeze else 0)
        states = model_state_bytes(make_context(sc), Candidates.from_scenario(sc))
        answers[freeze] = {k: _one(v) for k, v in states.items()}
        p = plan(sc)
        assert p.fits and p.choice is not None and p.reasons
    saved = answers[False]["optimizer_states"] - answers[True]["optimizer_states"]
    assert saved == pytest.approx(12 * vision / 8, rel=1e-9)
    assert answers[False]["parameters"] == pytest.approx(answers[True]["parameters"], rel=1e-9)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_vision_tower_flops_follow_the_6n_rule_and_freezing_leaves_the_forward(checkpointing):
    """The tower's FLOPs per sample, on top of the language model's (whose sequence already holds the image
    tokens): 6·Ψ_v per patch row trained, 2·Ψ_v frozen (no backward at all: frozen weights, pixel inputs), plus
    2·Ψ_v recomputed under full checkpointing when trained (compute.vision_flops_per_token). Review finding:
    --freeze-vision left the compute time unchanged."""
    from zeroplanner.costmodel.compute import flops_per_token

    def flops(images, freeze):
        sc = build_scenario(model="qwen2.5-vl-7b", gpu="A100-80GB", seq_len=2048, checkpointing=checkpointing)
        sc = replace(sc, training=replace(sc.training, images_per_sample=images, freeze_vision=freeze))
        model, executed, _ = flops_per_token(make_context(sc), Candidates.from_scenario(sc))
        return _one(model) * sc.sequence_tokens, _one(executed) * sc.sequence_tokens

    vl = catalog.model("qwen2.5-vl-7b")
    rows = 2 * vl.vision.patches_per_image  # two 448 x 448 images: 1,024 patches of 14 px each
    text_model, text_exec = flops(0, False)
    trained_model, trained_exec = flops(2, False)
    frozen_model, frozen_exec = flops(2, True)
    # the language model's share is the same for all three once the 512 image tokens are counted in its sequence
    lm = build_scenario(model="qwen2.5-vl-7b", gpu="A100-80GB", seq_len=2048 + 512, checkpointing=checkpointing)
    lm_model, lm_exec = (_one(x) * lm.sequence_tokens for x in flops_per_token(make_context(lm),
                                                                           Candidates.from_scenario(lm))[:2])
    recompute = 2.0 if checkpointing == "full" else 0.0
    assert trained_model - lm_model == pytest.approx(6.0 * rows * vl.vision_params, rel=1e-9)
    assert trained_exec - lm_exec == pytest.approx((6.0 + recompute) * rows * vl.vision_params, rel=1e-9)
    assert frozen_model - lm_model == pytest.approx(2.0 * rows * vl.vision_params, rel=1e-9)
    assert frozen_exec - lm_exec == pytest.approx(2.0 * rows * vl.vision_params, rel=1e-9)
    assert text_model < lm_model  # no images: a shorter sequence and no tower
