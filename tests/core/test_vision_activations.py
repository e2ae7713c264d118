"""The vision tower's own activations (zeroplanner/costmodel/vision.py) against the stored saved-tensor census,
the Qwen-VL readers' tower shape, bad vision_config input, and the seed article's Qwen-VL-on-8xA100 scenario.

Sources: the census rows in zeroplanner/_measurements/activations_vision.json, measured by
``benchmarks/make_validation.py --only-vision`` (``calibrate.families.measure_vision_activation_bytes``:
transformers 5.24 on CPU, bf16; docs/validation.md section 6); the Qwen2.5-VL-7B-Instruct config.json as
transcribed in tests/core/test_catalog_modern.py; the seed article (../shared/seed/, the paragraph on ms-swift
and Qwen-VL-Max: "单机8×A100（共320GB显存）" and its ZeRO-3 + CPU offload config).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from zeroplanner import catalog
from zeroplanner.calibrate.families import (
    NOT_CENSUSED,
    SMALL,
    VISION_CENSUS,
    VISION_CENSUS_UNSEEN,
    vision_census_comparison,
)
from zeroplanner.catalog.hfconfig import architecture_from_hf_config
from zeroplanner.costmodel.activations import activation_bytes, activation_parts
from zeroplanner.costmodel.context import Candidates, make_context
from zeroplanner.costmodel.vision import vision_activation_bytes
from zeroplanner.planner import plan
from zeroplanner.scenarios import build_scenario
from zeroplanner.specs import Architecture, VisionTower, replace

from tests.helpers import HF_CONFIGS

STORED = Path(__file__).resolve().parents[2] / "zeroplanner" / "_measurements" / "activations_vision.json"
ROWS = json.loads(STORED.read_text())
GIB = 2 ** 30


def _one(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def _row_id(r) -> str:
    return f"{r['label']}-{r['checkpointing']}-{'frozen' if r['freeze_vision'] else 'trainable'}-" \
           f"{r['attn_implementation']}"


def test_the_stored_census_covers_every_vision_family_and_case():
    cases = {(r["label"], r["checkpointing"], r["freeze_vision"], r["attn_implementation"]) for r in ROWS}
    assert len(cases) == len(ROWS) == len(VISION_CENSUS) * 8


@pytest.mark.parametrize("row", ROWS, ids=_row_id)
def test_tower_and_language_model_against_the_stored_census(row):
    """Tower within 5% as priced (GPU semantics), and to the byte once the named CPU-vs-GPU differences are
    added; the language model with the image's tokens in its sequence within 5%, and within 1% once the one
    measured gap (Gemma 3's bidirectional image mask under sdpa) is added."""
    ck = row["checkpointing"]
    c = vision_census_comparison(row)
    pred, meas, (extra, reasons), (gap, cause) = c["predicted"], c["measured"], c["seen_differently"], c["language_gap"]
    assert pred["tower"] + extra == meas["tower"], reasons
    if ck == "full" and row["label"] in VISION_CENSUS_UNSEEN:
        assert VISION_CENSUS_UNSEEN[row["label"]] in reasons  # the census cannot see the priced blocks (named)
        assert meas["tower"] < pred["tower"]
    elif meas["tower"]:
        assert pred["tower"] == pytest.approx(meas["tower"], rel=0.05)
    else:
        assert pred["tower"] == 0.0  # a frozen tower without checkpointing records nothing (measured)
    if gap:
        assert pred["language"] + gap == pytest.approx(meas["language"], rel=0.01), cause
    else:
        assert pred["language"] == pytest.approx(meas["language"], rel=0.05)


def test_qwen2_5_vl_7b_tower_shape_from_its_config():
    """Qwen/Qwen2.5-VL-7B-Instruct vision_config: depth 32, hidden_size 1280, num_heads 16, intermediate_size
    3420, patch_size 14, temporal_patch_size 2, in_chans 3, spatial_merge_size 2, window_size 112,
    fullatt_block_indexes [7, 15, 23, 31]; a 448x448 image is (448/14)^2 = 1024 patches, 256 tokens."""
    from tests.core.test_catalog_modern import config_of

    v = architecture_from_hf_config(config_of("qwen2.5-vl-7b")).vision
    assert v == VisionTower(family="qwen2_5_vl", layers=32, hidden_size=1280, heads=16, ffn_size=3420,
                            patch_input_size=3 * 2 * 14 * 14, patches_per_image=1024, merge_size=2,
                            full_attention_layers=4, window_patches=(112 // 14) ** 2)
    assert catalog.model("qwen2.5-vl-7b").vision == v


def _qwen25_vl_small(**vision):
    cfg = json.loads(json.dumps(SMALL["qwen2_5_vl"]))
    cfg["vision_config"].update(vision)
    return cfg


@pytest.mark.parametrize("vision,key", [
    (dict(window_size=20), "vision_config.window_size"),
    (dict(fullatt_block_indexes=[5]), "fullatt_block_indexes"),
    (dict(num_heads=5), "vision_config.num_heads"),
    (dict(depth=-1), "depth"),
    (dict(patch_size=500), "patch_size"),
    (dict(spatial_merge_size=64), "spatial_merge_size"),
    (dict(hidden_size=2_000_000, num_heads=4), "vision_config.hidden_size"),  # the key path, its range 1-1e6
    (dict(in_chans=100_000), "in_channels x temporal_patch_size"),
    (dict(intermediate_size=10 ** 8), "intermediate_size"),
])
def test_bad_vision_config_is_refused_naming_the_key(vision, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        architecture_from_hf_config(_qwen25_vl_small(**vision))


def test_vision_tower_bounds_name_the_field():
    base = dict(family="qwen2_5_vl", layers=2, hidden_size=32, heads=4, ffn_size=48, patch_input_size=1176,
                patches_per_image=1024, merge_size=2, full_attention_layers=1, window_patches=64)
    with pytest.raises(ValidationError, match="patches_per_image=1025"):
        VisionTower(**dict(base, patches_per_image=1025))
    with pytest.raises(ValidationError, match="full_attention_layers=3"):
        VisionTower(**dict(base, full_attention_layers=3))
    with pytest.raises(ValidationError, match="layers"):
        VisionTower(**dict(base, layers=0))
    arch = catalog.model("qwen2.5-vl-7b")
    with pytest.raises(ValidationError, match="vision_tokens_per_image=100"):
        Architecture(**dict(arch.model_dump(), vision_tokens_per_image=100))


def _vl(model="qwen2.5-vl-7b", **training):
    sc = build_scenario(model=model, gpu="A100-80GB", seq_len=2048, checkpointing="none")
    return replace(sc, training=replace(sc.training, **training))


def _act(sc) -> float:
    return _one(activation_bytes(make_context(sc), Candidates.from_scenario(sc)))


def test_tower_activations_are_one_part_and_follow_the_images():
    """The tower's part is the only difference freezing makes to the activations (the language model's sequence
    holds the image tokens either way), it is linear in the images (flash attention per image: no s^2 term;
    Dao et al. arXiv 2205.14135), and no images means no tower part."""
    one, two = _vl(images_per_sample=1), _vl(images_per_sample=2)
    parts = {k: _one(v) for k, v in activation_parts(make_context(one), Candidates.from_scenario(one)).items()}
    assert sum(parts.values()) == pytest.approx(_act(one), rel=1e-12)
    v = one.model.vision
    tower = _one(vision_activation_bytes(v, 1, activation_bytes=2.0, checkpointing=0))
    assert parts["vision"] == tower > 0
    assert _act(one) - _act(_vl(images_per_sample=1, freeze_vision=True)) == pytest.approx(tower, rel=1e-12)
    assert _act(_vl(images_per_sample=1, lora_rank=16)) == _act(_vl(images_per_sample=1, freeze_vision=True))
    two_parts = activation_parts(make_context(two), Candidates.from_scenario(two))
    assert _one(two_parts["vision"]) == pytest.approx(2 * tower, rel=1e-12)
    none = _vl(images_per_sample=0)
    assert _one(activation_parts(make_context(none), Candidates.from_scenario(none))["vision"]) == 0.0


def test_text_only_and_unpriced_towers_have_no_vision_part():
    sc = _vl(model="llama-3.1-8b", images_per_sample=1)
    assert sc.model.vision is None
    assert _one(activation_parts(make_context(sc), Candidates.from_scenario(sc))["vision"]) == 0.0
    # every multimodal small config's tower is priced and censused now (Gemma 4 and Llama 4 were the last)
    assert "llama4" not in NOT_CENSUSED and "gemma4" not in NOT_CENSUSED
    assert {"gemma4", "llama4"} <= set(VISION_CENSUS)




def test_gemma_4_26b_tower_shape_from_its_config():
    """google/gemma-4-26b-a4b config.json (tests/data/hf-configs/gemma-4-26b-a4b.json) vision_config: 27 layers,
    hidden_size 1152, 16 heads and 16 key/value heads of head_dim 72, intermediate_size 4304, patch_size 16,
    pooling_kernel_size 3; vision_soft_tokens_per_image 280, so the image processor's budget is 280 x 3^2 = 2520
    patches of 3 x 16^2 pixels (image_processing_gemma4.py pads every image to it)."""
    path = HF_CONFIGS / "gemma-4-26b-a4b.json"
    v = architecture_from_hf_config(json.loads(path.read_text())).vision
    assert v == VisionTower(family="gemma4", layers=27, hidden_size=1152, heads=16, ffn_size=4304,
                            patch_input_size=3 * 16 * 16, patches_per_image=280 * 9, merge_size=3,
                            full_attention_layers=27, window_patches=280 * 9, head_dim=72, kv_heads=16)
    assert v.tokens_per_image == 280 and v.head_width == 72
    assert catalog.model("gemma-4-26b-a4b").vision == v


def test_gemma4_frozen_tower_saves_nothing_even_checkpointed():
    """Measured (stored rows, docs/validation.md section 6): Gemma4VisionModel names no input-embedding layer, so
    transformers' enable_input_require_grads hooks none in the tower and a frozen tower records nothing under full
    checkpointing either (unlike the Qwen and SigLIP towers); LoRA prices it frozen too."""
    frozen = [r for r in ROWS if r["label"] == "gemma4" and r["freeze_vision"]]
    assert len(frozen) == 4 and all(r["measured"]["tower"] == 0 for r in frozen)
    v = architecture_from_hf_config(SMALL["gemma4"]).vision
    for ck in (0, 1, 2):
        assert _one(vision_activation_bytes(v, 1, activation_bytes=2, checkpointing=ck, trainable=False)) == 0.0
        assert _one(vision_activation_bytes(v, 1, activation_bytes=2, checkpointing=ck)) > 0.0


def _gemma4_small(**vision):
    cfg = json.loads(json.dumps(SMALL["gemma4"]))
    cfg["vision_config"].update(vision)
    return cfg


@pytest.mark.parametrize("vision,key", [
    (dict(num_key_value_heads=3), "vision_config.num_key_value_heads"),
    (dict(pooling_kernel_size=100), "pooling_kernel_size"),
    (dict(head_dim=-8), "head_dim"),
    (dict(num_hidden_layers=5000), "num_hidden_layers"),
])
def test_bad_gemma4_vision_config_is_refused_naming_the_key(vision, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        architecture_from_hf_config(_gemma4_small(**vision))


def _llama4_small(**vision):
    cfg = json.loads(json.dumps(SMALL["llama4"]))
    cfg["vision_config"].update(vision)
    return cfg


def test_llama4_tower_shape_from_the_small_config():
    """SMALL["llama4"]: a 56-pixel tile of 14-pixel patches is (56/14)^2 = 16 patches plus the class token;
    pixel_shuffle_ratio 0.5 folds 2 x 2 patches into one of the (16 x 0.25 =) 4 tokens; the adapter is
    projector_input_dim 64 wide (Llama4VisionPixelShuffleMLP, transformers 5.24)."""
    v = architecture_from_hf_config(SMALL["llama4"]).vision
    assert v == VisionTower(family="llama4", layers=2, hidden_size=32, heads=4, ffn_size=128,
                            patch_input_size=3 * 14 * 14, patches_per_image=16, merge_size=2,
                            full_attention_layers=2, window_patches=16, class_tokens=1, adapter_size=64)
    assert v.tokens_per_image == architecture_from_hf_config(SMALL["llama4"]).vision_tokens_per_image == 4


@pytest.mark.parametrize("vision,key", [
    (dict(pixel_shuffle_ratio=0.3), "pixel_shuffle_ratio"),
    (dict(intermediate_size=96), "vision_config.intermediate_size"),
    (dict(vision_output_dim=48), "vision_output_dim"),
    (dict(num_attention_heads=5), "vision_config.num_attention_heads"),
])
def test_bad_llama4_vision_config_is_refused_naming_the_key(vision, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        architecture_from_hf_config(_llama4_small(**vision))


def test_gemma4_absurd_image_budget_is_refused_naming_the_keys():
    with pytest.raises(ValueError, match="vision_soft_tokens_per_image"):
        architecture_from_hf_config(dict(SMALL["gemma4"], vision_soft_tokens_per_image=10 ** 9))


@pytest.mark.parametrize("freeze", [False, True], ids=["tower-trainable", "tower-frozen"])
def test_seed_qwen_vl_full_fine_tune_on_one_node_of_8_a100(freeze):
    """The seed: ms-swift full fine-tune of a Qwen-VL-Max-class multimodal model on ONE node of 8 x A100 (320 GB
    of GPU memory: A100-40GB) with ZeRO-3 + CPU offload. Qwen2.5-VL-72B (the largest open Qwen-VL), one 448x448
    image per sample, 2 TiB host RAM (as tests/evidence/test_seed_table.py's 70B case). Without offload nothing
    fits; the planner picks ZeRO-3 with offload, as the seed, with reasons. Since the step-peak model the optimizer
    offload alone is not enough: ZeRO-3 + CPU optimizer peaks in the loss backward at 40.3 of 39.5 GiB (7.4 GiB of
    it the loss's 12 bytes per logit at 4096 tokens x 152k vocabulary, docs/validation.md section 9), so the
    parameters go to host RAM too (and the optimizer states, 1.7 TB with the 1.5x buffer, to NVMe). The tower's
    activations are in the plan's activation term (trainable: every block; frozen under full checkpointing: the
    recomputed blocks transformers still records)."""
    sc = build_scenario(model="qwen2.5-vl-72b", gpu="A100-40GB", gpus_per_node=8, nodes=1, seq_len=4096,
                        cpu_memory_gib=2048)
    sc = replace(sc, training=replace(sc.training, images_per_sample=1, freeze_vision=freeze))
    p = plan(sc)
    assert p.fits and p.choice is not None
    # trainable tower: ZeRO-3 with parameters in host RAM; frozen tower (fewer optimizer states): ZeRO-2 with AutoTP 8
    # inside the node and the optimizer in host RAM also fits, and is faster
    assert p.choice.offload_optimizer != "none"
    assert (p.choice.stage == 3 and p.choice.offload_param == "cpu") or p.choice.autotp_size == 8
    assert p.reasons and f"ZeRO-{p.choice.stage}" in p.reasons[0]
    assert any("without offload does not fit" in r for r in p.reasons)
    chosen = replace(sc, training=replace(sc.training, checkpointing=p.choice.checkpointing,
                                          micro_batch=p.choice.micro_batch))
    parts = activation_parts(make_context(chosen), Candidates.from_scenario(chosen))
    ck = {"none": 0, "selective": 1, "full": 2}[p.choice.checkpointing]
    tower = _one(vision_activation_bytes(sc.model.vision, p.choice.micro_batch, activation_bytes=2.0,
                                         checkpointing=ck, trainable=not freeze))
    assert _one(parts["vision"]) == pytest.approx(tower, rel=1e-12)
    assert tower > 0 if (not freeze or ck == 2) else tower == 0
