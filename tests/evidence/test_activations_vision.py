"""Activation census of the vision-language models, run live: the cost model's vision tower and language model
(with the image's tokens in its sequence) against the bytes a real transformers model saves.

``calibrate.families.measure_vision_activation_bytes`` builds the small qwen2_5_vl / qwen2_vl configs of
zeroplanner/calibrate/families.py with ``AutoModelForImageTextToText`` (transformers 5.24, CPU, bf16, sdpa), feeds
one image after 128 text tokens (Qwen: 448x448; Gemma 3: 224x224; Gemma 4: 144 patches of 16; Llama 4: one
224-pixel tile), and counts every tensor autograd saves, split between the tower and the
language model. Asserted: the tower within 5% as priced (GPU semantics) and to the byte once the CPU-vs-GPU
differences named by ``vision_census_seen_differently_bytes`` are added; the language model within 5%. The
stored rows of docs/validation.md section 6 are checked without torch in tests/core/test_vision_activations.py;
this test re-measures them so a transformers change shows up. Marked ``engine`` (real model runs, about 30 s on
2 cores) to keep it out of the fast subset.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from zeroplanner.calibrate.families import (  # noqa: E402
    VISION_CENSUS_UNSEEN,
    measure_vision_activation_bytes,
    predicted_vision_activation_bytes,
    vision_census_language_gap_bytes,
    vision_census_seen_differently_bytes,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]

CASES = [(label, ck, freeze) for label in ("qwen2_5_vl", "gemma3") for ck in ("none", "full")
         for freeze in (False, True)] + \
    [(label, ck, False) for label in ("gemma4", "llama4") for ck in ("none", "full")]
"""Qwen2.5-VL (rotary, windows, RMSNorm), Gemma 3 (SigLIP) and Gemma 4 trainable (fp32 RMSNorms, q/k/v norms,
axial rotary, pooler) and Llama 4 trainable (class token, pixel-shuffle adapter; under full checkpointing the
census sees no blocks: families.VISION_CENSUS_UNSEEN); Qwen2-VL and the other frozen rows are in the stored rows
(tests/core)."""


@pytest.mark.parametrize("label,checkpointing,freeze", CASES,
                         ids=[f"{a}-{b}-{'frozen' if c else 'trainable'}" for a, b, c in CASES])
def test_vision_census_live(label, checkpointing, freeze):
    meas = measure_vision_activation_bytes(label, checkpointing=checkpointing, freeze_vision=freeze)
    pred = predicted_vision_activation_bytes(label, checkpointing=checkpointing, freeze_vision=freeze)
    extra, reasons = vision_census_seen_differently_bytes(label, checkpointing=checkpointing, freeze_vision=freeze)
    assert pred["tower"] + extra == meas["tower"], reasons
    if freeze and checkpointing == "none":
        assert meas["tower"] == 0 == pred["tower"]  # autograd records nothing in a frozen tower
    elif checkpointing == "full" and label in VISION_CENSUS_UNSEEN:
        assert VISION_CENSUS_UNSEEN[label] in reasons and meas["tower"] < pred["tower"]
    else:
        assert pred["tower"] == pytest.approx(meas["tower"], rel=0.05)
    gap, cause = vision_census_language_gap_bytes(label, checkpointing=checkpointing)
    assert pred["language"] + gap == pytest.approx(meas["language"], rel=0.05), cause


def test_vision_census_live_eager_attention():
    """Eager attention in the tower: the fp32 softmax and its bf16 copy per 64-patch window (full-attention blocks:
    per image), priced with flash_attention off; no CPU-vs-GPU difference but the LayerNorm statistics (none for
    Qwen2.5-VL's RMSNorms)."""
    meas = measure_vision_activation_bytes("qwen2_5_vl", attn_implementation="eager")
    pred = predicted_vision_activation_bytes("qwen2_5_vl", flash_attention=False)
    assert vision_census_seen_differently_bytes("qwen2_5_vl", attn_implementation="eager") == (0.0, "")
    assert pred["tower"] == meas["tower"]
    assert pred["language"] == pytest.approx(meas["language"], rel=0.05)
