"""The vision encoder's own activations: what a Qwen2-VL / Qwen2.5-VL / Gemma 3 / Gemma 4 / Llama 4 vision tower
saves for backward.

The tower is a ViT over the patches of every image (transformers 5.24 ``Qwen2VisionTransformerPretrainedModel``,
``Qwen2_5_VisionTransformerPretrainedModel``, Gemma 3's ``SiglipVisionModel``): a patch embedding, ``layers``
blocks of pre-norm attention (no causal mask) and MLP, and a merger / projector that turns ``merge_size``^2
neighbouring patches into one language-model token. The terms follow Korthikanti et al. (arXiv 2205.05198,
Sec. 4.1) generalised as :mod:`zeroplanner.costmodel.activations` does for a text layer, each one a tensor
transformers saves, found and checked with the saved-tensor census of tiny copies on CPU
(``calibrate.families.measure_vision_activation_bytes``; docs/validation.md section 6). ``P`` patches of width
``e``, ``a`` heads of width ``d = e/a``, MLP width ``f``, ``a_b`` activation element bytes (2 in bf16/fp16, 4 in
fp32), ``m`` the merge size, ``T = P/m²`` tokens:

- norms: RMSNorm (Qwen2.5-VL ``Qwen2_5_VLRMSNorm``) saves its fp32 upcast, fp32 rstd and the normalised tensor
  in the working precision, (4 + a_b)·P·e + 4·P; LayerNorm (Qwen2-VL, SigLIP) its input and fp32 mean and rstd,
  a_b·P·e + 8·P; each norm's output is the next Linear's input, a_b·P·e;
- attention: Qwen's fused qkv output is kept whole (V is a view of it), 3·a_b·P·e, and the rotated Q and K
  (``apply_rotary_pos_emb_vision`` returns them in the working precision), 2·a_b·P·e; SigLIP's separate q, k, v
  outputs, 3·a_b·P·e (no rotary); with a flash kernel its output and fp32 log-sum-exp per head,
  a_b·P·e + 4·a·P (Dao et al., arXiv 2205.14135, Alg. 2), the output being the out-projection's input
  (flash_attention_2 returns it (s, heads, d): a view); without one (eager) the fp32 softmax and its
  working-precision copy per window, (4 + a_b)·a·(full·P² + windowed·P·W) for ``W`` patches per window, and the
  out-projection's input a_b·P·e;
- MLP: SwiGLU (Qwen2.5-VL ``Qwen2_5_VLMLP``) gate, up, act(gate) and product, 4·a_b·P·f; Qwen2-VL's quick_gelu
  (``x * sigmoid(1.702 x)``) the fc1 output, the sigmoid and the product, 3·a_b·P·f; SigLIP's gelu_pytorch_tanh
  the fc1 output and the GELU output, 2·a_b·P·f;
- once per tower: the patch embedding's input in the working precision (the convolution keeps it for its weight
  gradient), a_b·P·(channels·temporal·p²); Qwen: the fp32 rotary cos and sin tables, 2·4·P·d, Qwen2.5-VL's int64
  window permutation and its inverse, 2·8·T, and the merger's norm, its output, and the GELU's input and output
  (T rows of m²·e), 2·a_b·P·e; Gemma 3: SigLIP's post LayerNorm, the contiguous copy the projector's average
  pool keeps, a_b·P·e, and Gemma3RMSNorm over the T pooled tokens (fp32 upcast, rstd, normalised fp32 output,
  the fp32 (1 + weight) copy: 8·T·e + 4·T + 4·e) with the projection matmul's input a_b·T·e.

Gemma 4 (transformers 5.24 ``Gemma4VisionModel`` and ``Gemma4MultimodalEmbedder``, modeling_gemma4.py): every
norm is a Gemma4RMSNorm computed in fp32 whatever the working precision (``hidden_states.float()``, ``pow``,
``mean``, ``torch.pow(ms, -0.5)``), which saves the fp32 upcast and two fp32 statistics per row, and with a scale
the fp32 normalised tensor and the fp32 weight copy: 8·N·w + 8·N + 4·w over N rows of width w (unscaled:
4·N·w + 8·N). A block: four scaled norms over e, the attention and MLP inputs (a_b·P·e each), q_norm and k_norm
(scaled) and v_norm (unscaled) over ``head_dim`` d per head, the normed and rotated q, k, v the attention reads
(a_b·P·d·(a + 2·kv)), flash: the kernel output, which is o_proj's input, and the fp32 log-sum-exp
(a_b·P·a·d + 4·a·P); eager: the fp32 softmax and its copy, (4 + a_b)·a·P², and o_proj's input a_b·P·a·d; the
GeGLU MLP's gate, up, GELU and product, 4·a_b·P·f. Once per tower: input_proj's input a_b·P·3p², the int64 (x, y)
position indices (16·P) and the bool padding mask (P), the rotary cos and sin in the working precision
(2·a_b·P·d), the pooler's fp32 one-hot averaging weights (4·P·T) and its bool token mask (T), standardize's fp32
std_scale copy (4·e), the embedder's unscaled norm over T tokens of e and the projection's input (a_b·T·e). Each
image is the image processor's budget of T·k² patches (image_processing_gemma4.py pads to it; a padded image
would also hand sdpa a (P, P) mask: not priced). Frozen, the tower saves nothing, checkpointed or not:
Gemma4VisionModel names no input-embedding layer, so ``enable_input_require_grads`` hooks none in it (measured:
0 bytes).

Llama 4 (``Llama4VisionModel``, modeling_llama4.py): SigLIP's block terms (LayerNorms, separate biased q, k, v,
nn.GELU's 2 tensors of width f) over the patches plus the class token (``class_tokens``); its complex rotary
multiplies by the ``freqs_ci`` buffer and saves no activation; eager: ``vision_eager_attention_forward`` keeps
the softmax in the working precision only, a_b·a·P². Once per tower: the unfolded patches (Linear input,
a_b·P·3p²), layernorm_pre and layernorm_post, and Llama4VisionPixelShuffleMLP: fc1's shuffled input a_b·P·e, the
two GELUs' inputs and the last GELU's output (the projector's input), 4·a_b·T·c for the adapter width c
(``adapter_size``); frozen under full checkpointing only the GELUs' inputs. Measured to the byte without
checkpointing; under full checkpointing transformers 5.24 records no Llama 4 block at all (its reentrant
checkpoint sees only keyword arguments, so no gradient reaches the blocks: calibrate.families
VISION_CENSUS_UNSEEN), and the cost model prices the tower as it trains when the gradient does reach it.

Full checkpointing (the vision blocks are ``GradientCheckpointingLayer`` modules, checkpointed with the language
model's layers): each block keeps its input, a_b·P·e, and one block is recomputed in backward; the LayerNorm of
the recomputed block reads the stored input (no new storage). Selective checkpointing drops the s² terms (eager
only). The recomputed tower block and the language model's recomputed layer are added: an upper bound by one
block (the tower is recomputed after the language model's backward has freed its layers).

Frozen tower (``freeze_vision``, or LoRA / QLoRA, which train adapters of the language model only): no tower
parameter requires a gradient and pixel values do not either, so without checkpointing autograd records nothing
in the tower and it saves nothing (measured: 0 bytes; transformers needs no ``torch.no_grad`` for it). With full
checkpointing it does save: transformers 5.24 ``PreTrainedModel.gradient_checkpointing_enable`` calls
``enable_input_require_grads``, which hooks every sub-model's input embedding, the tower's patch embedding
included (Qwen ``_input_embed_layer = "patch_embed"``, SigLIP ``embeddings.patch_embedding``), to return a tensor
that requires grad; the checkpointed blocks then keep their inputs and are recomputed in backward, saving what
the gradient of their input needs (no Linear inputs, no normalised tensor for a norm weight, no MLP product;
measured to the byte). A trainable projector with a frozen tower (ms-swift ``freeze_aligner=False``) is not an
input here.

Not priced: the tower under tensor or sequence parallelism (it runs whole on every rank), videos, images of other
sizes than the Architecture's ``patches_per_image``. Shapes: ``images`` and ``checkpointing`` are numpy arrays of
one shape (or scalars); every result has that shape. Pure numpy; no torch.
"""

from __future__ import annotations

import numpy as np

from ..specs import VisionTower

_FULL, _SELECTIVE = 2, 1  # costmodel.context checkpointing codes (0 none, 1 selective, 2 full)

_MLP_WIDTHS = {"qwen2_5_vl": 4.0, "qwen2_vl": 3.0, "gemma3": 2.0, "llama4": 2.0}
"""Tensors of width f one trainable block's MLP saves: SwiGLU gate, up, act(gate), product (Qwen2_5_VLMLP);
quick_gelu fc1 output, sigmoid, product (Qwen2-VL VisionMlp); gelu_pytorch_tanh fc1 output, GELU output
(SiglipMLP); nn.GELU fc1 output, GELU output (Llama4VisionMLP). Measured (docs/validation.md section 6)."""

_ROTARY = frozenset({"qwen2_vl", "qwen2_5_vl"})
"""Towers with 2D rotary position embeddings (VisionRotaryEmbedding); SigLIP adds learned positions instead."""


def _norm_bytes(v: VisionTower, p, ab: float, trainable: bool):
    """One norm over ``p`` patches: RMSNorm (Qwen2.5-VL) fp32 upcast + fp32 rstd, and the normalised tensor the
    weight multiplies when the weight is trained; LayerNorm (Qwen2-VL) its input and fp32 mean and rstd
    (CUDA layer_norm_cuda allocates them in the accumulate type; aten/src/ATen/native/cuda/layer_norm_kernel.cu)."""
    e = float(v.hidden_size)
    if v.family == "qwen2_5_vl":
        return (4.0 + (ab if trainable else 0.0)) * p * e + 4.0 * p
    return ab * p * e + 8.0 * p


def _gemma4_rms_bytes(rows, width: float, scaled: bool = True):
    """One Gemma4RMSNorm over ``rows`` rows of ``width`` (computed in fp32 whatever the working precision:
    ``hidden_states.float()``, ``pow(2).mean() + eps``, ``torch.pow(ms, -0.5)``): the fp32 upcast, the fp32
    mean square and its pow, 4·rows·width + 8·rows; with a (trained) scale also the fp32 normalised tensor and the
    fp32 copy of the weight, 4·rows·width + 4·width. Measured to the byte (docs/validation.md section 6)."""
    base = 4.0 * rows * width + 8.0 * rows
    return base + (4.0 * rows * width + 4.0 * width if scaled else 0.0)


def _gemma4_block_bytes(v: VisionTower, n, ab: float, flash_attention: bool, drop_s2):
    """One trainable Gemma4VisionEncoderLayer (transformers 5.24 modeling_gemma4.py) for ``n`` images: four scaled
    Gemma4RMSNorms over the width e (input, post-attention, pre- and post-feedforward), the attention input
    (read by q/k/v_proj) and the MLP input (read by gate/up_proj), a_b·P·e each; q_norm and k_norm (scaled) and
    v_norm (unscaled) over head_dim d for a and kv heads; the rotated, normed q, k, v attention reads,
    a_b·P·d·(a + 2·kv); flash: the kernel output (= o_proj's input: CPU and CUDA sdpa lay it out (b, s, heads, d),
    so transformers' transpose is a view) and the fp32 log-sum-exp, a_b·P·a·d + 4·a·P; eager: the fp32 softmax and
    its working-precision copy, (4 + a_b)·a·P², and o_proj's input (the transposed matmul output made contiguous),
    a_b·P·a·d; the GeGLU MLP's gate and up outputs, the GELU output and the product, 4·a_b·P·f. K and V are
    priced at kv heads (the released towers have kv = heads; eager's repeat_kv is then a no-op)."""
    p = n * v.patches_per_image
    e, f, a, kv, d = (float(v.hidden_size), float(v.ffn_size), float(v.heads), float(v.key_value_heads),
                      float(v.head_width))
    norms = 4.0 * _gemma4_rms_bytes(p, e) + 2.0 * ab * p * e
    head_norms = _gemma4_rms_bytes(p * a, d) + _gemma4_rms_bytes(p * kv, d) + _gemma4_rms_bytes(p * kv, d, False)
    qkv = ab * p * d * (a + 2.0 * kv)
    if flash_attention:
        core = ab * p * a * d + 4.0 * a * p
    else:
        pp = float(v.patches_per_image)
        core = ab * p * a * d + np.where(drop_s2, 0.0, (4.0 + ab) * a * n * pp * pp)
    return norms + head_norms + qkv + core + 4.0 * ab * p * f


def vision_block_bytes(v: VisionTower, images, activation_bytes: float, flash_attention: bool,
                       drop_s2=False, trainable: bool = True) -> np.ndarray:
    """Bytes ONE vision block of ``v`` saves for backward for ``images`` images (float or array), averaged over
    the full-attention and windowed blocks (they differ only in the eager s² term). ``activation_bytes`` is a_b
    (2 or 4); ``drop_s2`` (bool or array) drops the eager s² term (selective checkpointing); ``trainable=False``
    keeps only what the gradient of the block's input needs (frozen weights: the Linears' inputs, the normalised
    tensor the RMSNorm weight multiplies, the MLP product are not saved). Formulas: module docstring. Returns
    bytes (shaped like ``images``)."""
    ab = float(activation_bytes)
    n = np.asarray(images, dtype=np.float64)
    if v.family == "gemma4":  # a frozen Gemma 4 tower records nothing (module docstring)
        block = _gemma4_block_bytes(v, n, ab, flash_attention, drop_s2)
        return block if trainable else 0.0 * block
    p = n * (v.patches_per_image + v.class_tokens)  # rows in the micro-batch (Llama 4: patches + class token)
    e, f, a = float(v.hidden_size), float(v.ffn_size), float(v.heads)
    linear_in = ab * p * e if trainable else 0.0 * p  # a Linear keeps its input only for its weight gradient
    # the MLP's saved tensors of width f; frozen: without the last (down_proj / fc2's input)
    widths = _MLP_WIDTHS[v.family] - (0.0 if trainable else 1.0)
    norms = 2.0 * (_norm_bytes(v, p, ab, trainable) + linear_in)  # norm1, norm2 and the qkv / MLP inputs
    # q, k, v (Qwen: the fused output kept whole, V a view of it) and Qwen's rotated Q and K
    qkv = 3.0 * ab * p * e + (2.0 * ab * p * e if v.family in _ROTARY else 0.0)
    if flash_attention:
        core = ab * p * e + 4.0 * a * p  # kernel output (= the proj input) + fp32 log-sum-exp per head
    else:
        layers = float(v.layers)
        windowed = (layers - v.full_attention_layers) / layers
        pp = float(v.patches_per_image + v.class_tokens)
        # Llama 4's vision_eager_attention_forward: softmax in the working precision (no fp32 copy)
        probs = ab if v.family == "llama4" else 4.0 + ab
        s2 = probs * a * n * pp * (v.full_attention_layers / layers * pp + windowed * v.window_patches)
        core = linear_in + np.where(drop_s2, 0.0, s2)  # proj input + fp32 softmax and its copy per window
    return norms + qkv + core + widths * ab * p * f


def vision_activation_parts(v: VisionTower, images, *, activation_bytes: float, checkpointing,
                            flash_attention: bool = True, trainable: bool = True) -> dict[str, np.ndarray]:
    """The tower's saved bytes for ``images`` images of ``patches_per_image`` patches (per micro-batch: images per
    sample x micro-batch), by part: ``blocks`` (all blocks' saved tensors, or under full checkpointing the stored
    block inputs plus one block recomputed), ``patch embedding`` (its working-precision input), ``rotary and
    window indices`` (fp32 cos/sin; Qwen2.5-VL's int64 window permutation and inverse) and ``merger``.
    ``trainable=False``: the frozen tower under full checkpointing (module docstring; all parts 0 otherwise).
    ``checkpointing``: int array or scalar (0 none, 1 selective, 2 full). Returns bytes, each shaped like the
    broadcast of ``images`` and ``checkpointing``. Formulas and sources: module docstring."""
    ab = float(activation_bytes)
    n = np.asarray(images, dtype=np.float64)
    ck = np.asarray(checkpointing)
    full = ck == _FULL
    p = n * v.patches_per_image
    rows = n * (v.patches_per_image + v.class_tokens)  # what the blocks carry (Llama 4: + the class token)
    e, d = float(v.hidden_size), float(v.hidden_size // v.heads)
    block = vision_block_bytes(v, n, ab, flash_attention, drop_s2=ck == _SELECTIVE, trainable=trainable)
    inputs = ab * rows * e  # one block's stored input under full checkpointing
    # the recomputed block's LayerNorm reads the stored input itself (no new storage); RMSNorm saves an fp32 upcast
    recomputed = block - (inputs if v.family not in ("qwen2_5_vl", "gemma4") else 0.0)
    blocks = np.where(full, v.layers * inputs + recomputed, v.layers * block)
    tokens = p / v.merge_size ** 2
    window = 2.0 * 8.0 * tokens if v.family == "qwen2_5_vl" else 0.0 * p
    linear_in = ab * p * e if trainable else 0.0
    if v.family == "llama4":
        # layernorm_pre and layernorm_post over the patches and the class token (input + fp32 mean and rstd);
        # Llama4VisionPixelShuffleMLP: fc1's input (the shuffled copy of the patches, T rows of m²·e), the two
        # nn.GELUs' inputs (fc1 and fc2 outputs, T rows of adapter_size) and the last GELU's output, which
        # Llama4MultiModalProjector's Linear reads; frozen: only the GELUs' inputs
        c = float(v.adapter_size or 0)
        merger = 2.0 * _norm_bytes(v, rows, ab, trainable) + \
            ((ab * p * e + 4.0 * ab * tokens * c) if trainable else 2.0 * ab * tokens * c)
    elif v.family == "gemma4":
        # Gemma4VisionPooler: the fp32 one-hot averaging weights (P x T; the matmul keeps them for the input's
        # gradient), the bool mask that strips padding tokens; Gemma4MultimodalEmbedder: the unscaled
        # Gemma4RMSNorm over the T tokens and the projection's working-precision input
        # (standardize, set in the released files: the fp32 copy of the std_scale buffer, 4·e; priced always)
        merger = 4.0 * p * tokens + tokens + 4.0 * e + _gemma4_rms_bytes(tokens, e, False) + ab * tokens * e
    elif v.family == "gemma3":
        # SigLIP post_layernorm; Gemma3MultiModalProjector: the avg pool's contiguous input, Gemma3RMSNorm over
        # the pooled tokens (fp32 upcast, rstd, (1 + weight) in fp32, the normalised fp32 output for the weight
        # gradient) and the projection matmul's input (for the weight gradient)
        gemma_norm = 4.0 * tokens * e + 4.0 * tokens + 4.0 * e + (4.0 * tokens * e if trainable else 0.0)
        merger = _norm_bytes(v, p, ab, trainable) + ab * p * e + gemma_norm + \
            (ab * tokens * e if trainable else 0.0)
    else:
        # ln_q, its output (the first Linear's input), the GELU's input (T rows of m²·e) and output
        merger = _norm_bytes(v, p, ab, trainable) + linear_in + ab * p * e + linear_in
    patch = ab * p * v.patch_input_size if trainable else 0.0 * p
    rotary = (2.0 * 4.0 * p * d if v.family in _ROTARY else 0.0) + window
    if v.family == "gemma4":
        # Gemma4VisionPatchEmbedder: besides input_proj's input, the int64 (x, y) position indices the two
        # F.embedding lookups keep and the bool padding mask (torch.where; the pooler's masked_fill reuses it);
        # Gemma4VisionRotaryEmbedding's cos and sin, cast to the working precision, over head_dim
        patch = patch + 2.0 * 8.0 * p + p
        rotary = 2.0 * ab * p * v.head_width
    parts = {
        "blocks": blocks,
        "patch embedding": patch,
        "rotary and window indices": rotary,
        "merger": merger,
    }
    shape = np.broadcast(n, ck).shape
    on = np.ones(shape) if trainable else full.astype(np.float64) * np.ones(shape)
    if v.family == "gemma4" and not trainable:
        on = np.zeros(shape)  # a frozen Gemma 4 tower records nothing, checkpointed or not (module docstring)
    return {k: np.broadcast_to(np.asarray(x, dtype=np.float64), shape) * on for k, x in parts.items()}


def vision_activation_bytes(v: VisionTower | None, images, *, activation_bytes: float, checkpointing,
                            flash_attention: bool = True, trainable: bool = True) -> np.ndarray:
    """Bytes the vision tower saves for backward for ``images`` images per micro-batch: the sum of
    :func:`vision_activation_parts`; for a frozen tower (``trainable=False``: freeze_vision, LoRA, QLoRA) 0
    without full checkpointing and the frozen blocks' recomputation with it; 0 for a model without a priced tower
    (``v`` None). Shaped like the broadcast of ``images`` and ``checkpointing``.

    >>> from zeroplanner.specs import VisionTower
    >>> v = VisionTower(family="qwen2_5_vl", layers=2, hidden_size=32, heads=4, ffn_size=48, patch_input_size=1176,
    ...                 patches_per_image=1024, merge_size=2, full_attention_layers=1, window_patches=64)
    >>> int(vision_activation_bytes(v, 1, activation_bytes=2, checkpointing=0))  # census, docs/validation.md s. 6
    5545984
    >>> int(vision_activation_bytes(v, 1, activation_bytes=2, checkpointing=0, trainable=False))
    0
    """
    if v is None:
        shape = np.broadcast(np.asarray(images), np.asarray(checkpointing)).shape
        return np.zeros(shape)
    parts = vision_activation_parts(v, images, activation_bytes=activation_bytes, checkpointing=checkpointing,
                                    flash_attention=flash_attention, trainable=trainable)
    return sum(parts.values())
