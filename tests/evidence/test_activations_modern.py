"""Activation census of the 2024-26 families: the cost model against the bytes a real transformers model saves.

As tests/evidence/test_activations_measured.py: a tiny copy of each family (the small configs of zeroplanner/calibrate/families.py,
same layer kinds, vocabulary 512) built by transformers 5.24 on CPU in bf16 with sdpa attention, and
``calibrate.measure_activation_bytes`` counting every tensor autograd saves in one training forward. Families
within 5% are asserted; the others are strict xfails recording the measured gap (docs/validation.md, section
"Activation census: 2024-26 families"), so a fix shows up as an unexpected pass. Where the gap is a tensor the
census sees differently from a GPU run, a second test adds exactly those bytes (derived from the shapes, cited) to
the prediction and asserts the rest within 5%. Qwen3-Next's and Nemotron-H's non-attention mixers run CUDA-only
kernels on a GPU: their census also runs with those kernels' saved tensors stood in (families.CENSUS_KERNEL_STAND_INS)
and is asserted within 5% that way; the plain reference-path rows stay recorded gaps.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from zeroplanner.calibrate import measure_activation_bytes, predicted_activation_bytes  # noqa: E402
from zeroplanner.calibrate.families import (  # noqa: E402
    CENSUS_KERNEL_STAND_INS,
    CENSUS_SEQ_LEN,
    census_attention,
    census_config,
    census_seen_differently_bytes,
)

pytestmark = pytest.mark.timeout(300)

SEQ = CENSUS_SEQ_LEN

WITHIN_5 = ["phi3", "phi3-gqa", "qwen3", "qwen3-bias-tied", "glm4", "glm4_moe", "gemma3_text", "gemma4_text-moe",
            "qwen3_moe", "qwen3_moe-sparse-step-mlp-only", "olmo2", "llama4_text", "mixtral", "gemma2", "gpt_oss"]
"""Within 5% with no and with full checkpointing (docs/validation.md section 6)."""

WITHIN_5_WITHOUT_CHECKPOINTING = ["gemma4_text-dense"]
"""Within 5% without checkpointing; the full-checkpointing row is in KNOWN_GAPS."""

# measured gaps (seq 128): what the census sees that the model prices differently, or does not price
KNOWN_GAPS = {
    ("deepseek_v2", "none"): "MLA: q/k head width (nope + rope) != v head width, so CPU sdpa runs its math path "
                             "(fp32 Q, K, V and the fp32 s x s probabilities); flash on a GPU is what is priced",
    ("deepseek_v2-lite-no-q-lora", "none"): "MLA on CPU sdpa's math path (as deepseek_v2)",
    ("deepseek_v3", "none"): "MLA on CPU sdpa's math path (as deepseek_v2)",
    ("deepseek_v2", "full"): "MLA on CPU sdpa's math path, in the recomputed layer",
    ("deepseek_v2-lite-no-q-lora", "full"): "MLA on CPU sdpa's math path, in the recomputed layer",
    ("deepseek_v3", "full"): "MLA on CPU sdpa's math path, in the recomputed layer",
    ("gemma4_text-dense", "full"): "the rotary tables (one of global_head_dim 512) are kept alive by the "
                                   "checkpointed layers' keyword arguments, not saved tensors: the census sees "
                                   "them only in each recomputed layer, 1/L of the time",
    ("qwen3_next", "none"): "Gated DeltaNet layers run transformers' reference torch_chunk_gated_delta_rule "
                            "and causal_conv1d_fn (flash-linear-attention and causal_conv1d not installed): fp32 "
                            "per-chunk 64 x 64 matrices, 1,055,264 bytes per linear_attn module here against 244,768 "
                            "on the kernels' path (measured per module); the kernel path is what is priced "
                            "(test_linear_mixer_census_within_5_percent_with_the_gpu_kernels_saved_tensors)",
    ("qwen3_next", "full"): "Gated DeltaNet reference implementation (as without checkpointing)",
    ("nemotron_h", "none"): "Mamba-2 layers run transformers' reference PyTorch conv and scan (mamba_ssm and "
                            "causal_conv1d not installed): fp32 chunk states and segment sums the fused "
                            "mamba_split_conv1d_scan_combined does not keep; the kernel path is what is priced",
    ("nemotron_h", "full"): "Mamba-2 reference implementation (as without checkpointing)",
}


def _both(label: str, checkpointing: str, stand_ins: bool = False) -> tuple[float, float]:
    cfg = census_config(label)
    attn = census_attention(label)  # eager for the families transformers refuses sdpa for (families.CENSUS_EAGER)
    measured = measure_activation_bytes(cfg, seq_len=SEQ, checkpointing=checkpointing, attn_implementation=attn,
                                        gpu_kernel_stand_ins=stand_ins)["total"]
    predicted = predicted_activation_bytes(cfg, seq_len=SEQ, checkpointing=checkpointing,
                                           flash_attention=attn == "sdpa")
    return measured, predicted


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("label", WITHIN_5)
def test_activation_census_within_5_percent(label, checkpointing):
    measured, predicted = _both(label, checkpointing)
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("label", WITHIN_5_WITHOUT_CHECKPOINTING)
def test_activation_census_within_5_percent_without_checkpointing(label):
    measured, predicted = _both(label, "none")
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("case", sorted(KNOWN_GAPS), ids=lambda c: f"{c[0]}-{c[1]}")
def test_known_gaps_are_recorded(case):
    label, checkpointing = case
    measured, predicted = _both(label, checkpointing)
    if predicted != pytest.approx(measured, rel=0.05):
        pytest.xfail(f"{label}/{checkpointing}: {KNOWN_GAPS[case]} (measured {measured}, predicted {predicted:.0f})")
    pytest.fail(f"{label}/{checkpointing} is now within 5%: move it out of KNOWN_GAPS")


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("label", ["deepseek_v2", "deepseek_v2-lite-no-q-lora", "deepseek_v3"])
def test_mla_census_within_5_percent_once_the_cpu_math_kernel_is_swapped_in(label, checkpointing):
    """Everything MLA saves outside the attention kernel (q_a/kv_a_layernorm, the latent inputs of q_b_proj and
    kv_b_proj, the v_head_dim-wide output copy, the MoE blocks) is priced within 5%: swapping the flash core for
    the math path the census runs (families.census_seen_differently_bytes)."""
    measured, predicted = _both(label, checkpointing)
    extra, reason = census_seen_differently_bytes(label, checkpointing)
    assert "math path" in reason
    assert predicted + extra == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("label", sorted(CENSUS_KERNEL_STAND_INS))
def test_linear_mixer_census_within_5_percent_with_the_gpu_kernels_saved_tensors(label, checkpointing):
    """Qwen3-Next (Gated DeltaNet) and Nemotron-H (Mamba-2) with their mixers' CUDA-kernel cores stood in on CPU
    (zeroplanner/calibrate/kernel_stand_ins.py: the reference's result, the kernel's saved tensors; everything else
    runs as transformers runs it): the cost model's pricing of those layers (costmodel/activations.py
    linear_mixer_bytes) and of the rest of both models is within 5%, and the stand-ins change what is measured."""
    measured, predicted = _both(label, checkpointing, stand_ins=True)
    assert predicted == pytest.approx(measured, rel=0.05)
    reference, _ = _both(label, checkpointing)
    assert reference > 1.3 * measured  # the reference path's fp32 per-chunk tensors (KNOWN_GAPS) are gone


def test_gemma4_full_checkpointing_within_5_percent_once_tables_are_counted_as_the_census_sees_them():
    """The one gemma4_text-dense gap: the cos/sin tables the model holds for the whole step are saved tensors
    only inside each recomputed layer (families.census_seen_differently_bytes); counted as the census sees them,
    the rest is within 5%."""
    measured, predicted = _both("gemma4_text-dense", "full")
    extra, reason = census_seen_differently_bytes("gemma4_text-dense", "full")
    assert extra < 0 and "rotary tables" in reason
    assert predicted + extra == pytest.approx(measured, rel=0.05)


def test_only_mla_and_checkpointed_rotary_tables_are_adjusted():
    assert census_seen_differently_bytes("gemma4_text-dense", "none") == (0.0, "")
    assert census_seen_differently_bytes("qwen3", "none") == (0.0, "")
    extra, reason = census_seen_differently_bytes("qwen3", "full")
    # qwen3 small: bf16 cos and sin of head_dim 32 for 128 tokens, 3 of the 4 layers unseen
    assert extra == -2 * 2 * 128 * 32 * 3 / 4 and reason.startswith("rotary tables")


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_llama4_eager_attention_keeps_no_fp32_softmax(checkpointing):
    """Llama 4's text eager_attention_forward runs its softmax in bf16 (modeling_llama4.py, no dtype=float32):
    priced as other families' fp32 softmax plus its bf16 cast, the census config was +31% / +21% over; priced
    as its source runs, within 5% (measured -0.0% / +0.5%)."""
    cfg = census_config("llama4_text")
    measured = measure_activation_bytes(cfg, seq_len=SEQ, checkpointing=checkpointing,
                                        attn_implementation="eager")["total"]
    predicted = predicted_activation_bytes(cfg, seq_len=SEQ, checkpointing=checkpointing, flash_attention=False)
    assert predicted == pytest.approx(measured, rel=0.05)
