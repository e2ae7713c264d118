"""Activation census of the 2024-26 families: the cost model against the bytes a real transformers model saves.

As tests/evidence/test_activations_measured.py: a tiny copy of each family (the small configs of zeroplanner/calibrate/families.py,
same layer kinds, vocabulary 512) built by transformers 5.24 on CPU in bf16 with sdpa attention, and
``calibrate.measure_activation_bytes`` counting every tensor autograd saves in one training forward. Families
within 5% are asserted; the others are strict xfails recording the measured gap (docs/validation.md, section
"Activation census: 2024-26 families"), so a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from zeroplanner.calibrate import measure_activation_bytes, predicted_activation_bytes  # noqa: E402
from zeroplanner.calibrate.families import census_config  # noqa: E402

pytestmark = pytest.mark.timeout(300)


WITHIN_5 = ["phi3", "phi3-gqa", "qwen3", "qwen3-bias-tied", "glm4", "gemma3_text",
            "qwen3_moe-sparse-step-mlp-only"]
# measured gaps (seq 128, no checkpointing): what the model does not yet price
KNOWN_GAPS = {
    "qwen3_moe": "-9.1%: expert outputs kept for the routing-weight multiply, fp32 router probabilities, int64 "
                 "routing indices (not added: they would change Mixtral's existing prediction)",
    "olmo2": "-11.8%: post-norm layers whose RMSNorm multiplies in fp32; fp32 rotary",
    "gemma4_text-dense": "-62%: full-attention layers (global_head_dim) priced as the sliding layers",
    "llama4_text": "-35%: L2 q/k norm, chunked attention and MoE routing tensors",
    "qwen3_next": "-60%: Gated DeltaNet (priced as attention)",
    "nemotron_h": "-76%: Mamba-2 mixers (priced as attention)",
    "deepseek_v3": "-46%: q/k head width != v head width makes CPU sdpa fall back to its fp32 math path (s^2 "
                   "softmax saved); flash on a GPU is what the model prices",
}


_config = census_config


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("label", WITHIN_5)
def test_activation_census_within_5_percent(label, checkpointing):
    cfg = _config(label)
    measured = measure_activation_bytes(cfg, seq_len=128, checkpointing=checkpointing)["total"]
    predicted = predicted_activation_bytes(cfg, seq_len=128, checkpointing=checkpointing)
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("label", sorted(KNOWN_GAPS))
def test_known_gaps_are_recorded(label):
    cfg = _config(label)
    measured = measure_activation_bytes(cfg, seq_len=128)["total"]
    predicted = predicted_activation_bytes(cfg, seq_len=128)
    if predicted != pytest.approx(measured, rel=0.05):
        pytest.xfail(f"{label}: {KNOWN_GAPS[label]} (measured {measured}, predicted {predicted:.0f})")
    pytest.fail(f"{label} is now within 5%: move it to WITHIN_5")
