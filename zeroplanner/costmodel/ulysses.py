"""Ulysses sequence parallelism (DeepSpeed ALST for HF models): all-to-all volume and per-rank activations.

Pure functions of the architecture and the batch shape (numpy only), for one Ulysses degree: the engine-checked
reference. The cost model prices the same quantities over candidate arrays (``activations.layer_activation_bytes``
with its ``sp`` column, ``communication.ulysses_terms``; tests/core/test_ulysses_costmodel.py checks them equal).

Sources:

- Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence Transformer
  Models", arXiv 2309.14509, Sec. 3: the sequence is split over P ranks; before attention an all-to-all turns the
  local (s/P)-token q, k, v (all heads) into full-sequence tensors of H/P heads, after attention a second all-to-all
  turns the output back; each all-to-all sends a rank's local ``b*(s/P)*h`` elements (the paper's ``Nh/P``).
- What DeepSpeed 0.19.8 actually sends, ``deepspeed/runtime/sequence_parallel/ulysses_sp.py``
  ``UlyssesSPAttentionHF``: per attention layer four ``all_to_all_single`` calls in forward
  (``_combine_local_sequences``, ``ulysses_sp.py:194``: q, k, v; ``_partition_global_sequence``, ``:222``: the
  output) and, through the exchange's autograd rule (``deepspeed/sequence/layer.py:342``
  ``_dim_zero_all_to_all_backward``: one all-to-all of the gradient, same shape), four in backward. With fewer KV
  heads than P, K and V are first repeated to P heads (``kv_replication_factor = P // kv_heads``, ``:134``;
  ``repeat_interleave`` on the head dimension, ``:186``), so K and V each send
  ``b*(s/P)*max(kv_heads, P)*head_dim`` elements; the output sends ``head_dim*n_heads`` per token (not
  ``hidden_size``). The forward also all-gathers the int64 ``position_ids`` once per layer (``:295``).
- Measured on the real engine (``zeroplanner/calibrate/ulysses.py``, tests/evidence/test_ulysses_engine.py: tiny
  Llama, bf16, sp 2 and 4 on CPU ranks with gloo, with and without full checkpointing, DeepSpeed's comms logger and
  a saved-tensor census): every message size and every saved tensor below matched (activations within 0.01 %,
  all-to-all bytes exactly).

Message bytes are what DeepSpeed's comms logger and nccl-tests call the size (the op's input tensor on one rank);
wire bytes are what a rank sends to the others, (P-1)/P of it (the 1/P chunk addressed to itself stays local).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ATTENTION_KINDS = ("q", "k", "v", "out")


def check_ulysses(*, n_heads: int, kv_heads: int, sp_size: int, seq_len: Any = None,
                  linear_mixer: Any = None) -> None:
    """Raise ``ValueError`` naming the field where DeepSpeed 0.19.8 refuses the combination, or where it would
    train a different model.

    Rules (``ulysses_sp.py``: ``UlyssesSPAttentionHF.__init__``, ``UlyssesSPDataLoaderAdapter.refill``;
    ``parallel_state_sp.py``: ``initialize_sequence_parallel``): ``sp_size >= 1`` (1 = no sequence parallelism),
    ``n_heads % sp_size == 0``, ``kv_heads % sp_size == 0`` or ``sp_size % kv_heads == 0``, and every sequence length
    a multiple of ``sp_size``. ``seq_len`` may be an int or an int array (checked elementwise). ``linear_mixer``
    (``Architecture.linear_mixer``: Qwen3-Next's Gated DeltaNet, Nemotron-H's Mamba-2 layers) refuses any
    ``sp_size > 1``: ``UlyssesSPAttentionHF.register_with_transformers`` replaces the attention function that
    transformers' attention layers call (its ``ALL_ATTENTION_FUNCTIONS`` entry) and the data loader hands each rank
    1/sp of the sequence, so a recurrent mixer, which calls no attention function, would scan only its rank's slice:
    a different model, not a slower one.
    """
    if linear_mixer is not None and sp_size > 1:
        raise ValueError(f"sp_size={sp_size}: Ulysses sequence parallelism splits the sequence for attention "
                         f"layers only; this model's {linear_mixer.kind} layers would each see 1/{sp_size} of the sequence "
                         "(DeepSpeed's UlyssesSPAttentionHF wraps the attention function, not recurrent mixers); "
                         "use sequence_parallel_size 1")
    if int(sp_size) != sp_size or sp_size < 1:
        raise ValueError(f"sp_size={sp_size}: must be an integer >= 1")
    if n_heads < 1 or kv_heads < 1 or n_heads % kv_heads:
        raise ValueError(f"n_heads={n_heads}, kv_heads={kv_heads}: both >= 1 and kv_heads must divide n_heads")
    if n_heads % sp_size:
        raise ValueError(f"sp_size={sp_size} must divide the attention heads (n_heads={n_heads})")
    if kv_heads % sp_size and sp_size % kv_heads:
        raise ValueError(f"sp_size={sp_size} and kv_heads={kv_heads}: one must divide the other "
                         "(DeepSpeed replicates KV heads only by a whole factor)")
    if seq_len is not None:
        s = np.asarray(seq_len)
        if np.any(s < sp_size) or np.any(s % sp_size):
            raise ValueError(f"seq_len={seq_len} must be a positive multiple of sp_size={sp_size} "
                             "(UlyssesSPDataLoaderAdapter splits it evenly; pad the batch)")


def kv_heads_exchanged(kv_heads: int, sp_size: int) -> int:
    """KV heads each rank's K (and V) all-to-all input carries: ``max(kv_heads, sp_size)``.

    ``ulysses_sp.py`` ``_combine_local_sequences``: with ``sp_size > kv_heads`` the local K/V are
    ``repeat_interleave``-d by ``sp_size // kv_heads`` on the head dimension before the exchange, so that every rank
    receives one (replicated) KV head; otherwise all ``kv_heads`` are exchanged and each rank keeps
    ``kv_heads / sp_size`` of them.
    """
    return max(int(kv_heads), int(sp_size))


def all_to_all_message_bytes_per_layer(
    *, micro_batch: Any, seq_len: Any, n_heads: int, kv_heads: int, head_dim: int, sp_size: int,
    element_bytes: int = 2,
) -> dict[str, np.ndarray]:
    """Message bytes of one rank's all-to-alls in ONE attention layer's forward, per exchanged tensor.

    Shapes (``ulysses_sp.py``): q input ``[P, s/P, b, n_heads/P, d]``, k and v ``[P, s/P, b, max(kv, P)/P, d]``,
    the output ``[P, s/P, b, n_heads*d/P]``; bytes = elements * ``element_bytes`` (2 for bf16/fp16 activations).
    ``micro_batch`` and ``seq_len`` may be int arrays (broadcast). Backward sends the same four sizes again
    (the gradient of each exchange is one all-to-all of the same shape).

    Returns ``{"q", "k", "v", "out", "total"}``, float arrays, bytes. Raises ``ValueError`` (:func:`check_ulysses`).
    Source: Jacobs et al. arXiv 2309.14509 Sec. 3 (``b*s*h/P`` per all-to-all for MHA); DeepSpeed 0.19.8 for GQA.
    """
    check_ulysses(n_heads=n_heads, kv_heads=kv_heads, sp_size=sp_size, seq_len=seq_len)
    tokens = np.asarray(micro_batch, dtype=np.float64) * np.asarray(seq_len, dtype=np.float64) / sp_size
    q = element_bytes * tokens * n_heads * head_dim
    kv = element_bytes * tokens * kv_heads_exchanged(kv_heads, sp_size) * head_dim
    parts = {"q": q, "k": kv, "v": kv, "out": q.copy()}
    if sp_size == 1:  # no exchange without sequence parallelism (register_with_transformers returns None)
        parts = {k: 0.0 * v for k, v in parts.items()}
    parts["total"] = sum(parts[k] for k in _ATTENTION_KINDS)
    return parts


def all_to_all_bytes_per_step(
    *, n_layers: int, micro_batch: Any, seq_len: Any, n_heads: int, kv_heads: int, head_dim: int, sp_size: int,
    element_bytes: int = 2, recompute_forward: bool = False,
) -> dict[str, np.ndarray]:
    """One rank's all-to-all bytes for one micro-step (forward + backward) over all layers.

    ``message_forward`` / ``message_backward``: sums of the message sizes (comms-logger bytes), ``n_layers`` times
    :func:`all_to_all_message_bytes_per_layer`'s total each; with ``recompute_forward`` (full activation
    checkpointing: each layer's forward, its two exchanges included, runs again in backward) the backward also
    carries the forward's messages once more (measured: sp 2 and 4, 2 layers, 24 calls per step). ``message_total``,
    ``wire_total`` = (P-1)/P of it (bytes that leave the rank), ``count`` = number of all-to-all calls.
    Float arrays, bytes.
    """
    per_layer = all_to_all_message_bytes_per_layer(
        micro_batch=micro_batch, seq_len=seq_len, n_heads=n_heads, kv_heads=kv_heads, head_dim=head_dim,
        sp_size=sp_size, element_bytes=element_bytes)["total"]
    fwd = n_layers * per_layer
    bwd = fwd * (2.0 if recompute_forward else 1.0)
    total = fwd + bwd
    calls = 0 if sp_size == 1 else n_layers * len(_ATTENTION_KINDS) * (3 if recompute_forward else 2)
    return {"message_forward": fwd, "message_backward": bwd, "message_total": total,
            "wire_total": total * (sp_size - 1) / sp_size, "count": np.asarray(float(calls))}


def position_ids_allgather_bytes_per_step(*, n_layers: int, micro_batch: Any, seq_len: Any, sp_size: int) -> np.ndarray:
    """Message bytes of the int64 ``position_ids`` all-gathers one rank issues per forward: one per attention layer
    of ``b * s/P * 8`` bytes (``UlyssesSPAttentionHF.forward``: ``dist.all_gather(position_ids_list, ...)``); 0 when
    ``sp_size == 1``. Float array, bytes."""
    if sp_size == 1:
        return np.asarray(0.0)
    return n_layers * 8.0 * np.asarray(micro_batch, dtype=np.float64) * np.asarray(seq_len, dtype=np.float64) / sp_size


def activation_bytes_per_rank(
    *, n_layers: int, hidden_size: int, n_heads: int, kv_heads: int, head_dim: int, ffn_size: int, vocab_size: int,
    seq_len: Any, micro_batch: Any, sp_size: int, element_bytes: int = 2,
    checkpointing: str = "none",
) -> dict[str, np.ndarray]:
    """Activation bytes one Ulysses rank holds when backward starts, by part; with ``checkpointing="full"`` the
    peak in backward (the stored layer inputs plus one layer recomputed).

    Scope: the llama layout of transformers 5.24 (``LlamaDecoderLayer``: RMSNorm, separate q/k/v/o projections,
    rotary positions, SwiGLU MLP, untied lm_head) with ``sdpa``/flash attention (the kernel saves its q, k, v, output
    and an fp32 log-sum-exp per head and query), 16-bit activations (``element_bytes=2``; the only width measured).
    Everything outside attention's core holds ``s/P`` tokens; the core runs on the full sequence with ``n_heads/P``
    query heads and ``max(kv_heads, P)/P`` KV heads (:func:`kv_heads_exchanged`). With ``P = 1`` this is the
    cost model's llama activation term (``costmodel/activations.py``, Korthikanti et al. arXiv 2205.05198 Sec. 4.1
    generalised; tests/core/test_ulysses_formulas.py checks the equality).

    Per layer (a_b = element_bytes, s_l = s/P, t = s_l*b tokens, d = head_dim):

    - two RMSNorms: fp32 upcast input, fp32 rstd, normalised tensor: ``2*((4 + a_b)*t*h + 4*t)``;
    - the norm outputs the q/k/v projections and the MLP read: ``2*a_b*t*h``;
    - the attention kernel's q, k, v and output (full sequence, local heads) and its log-sum-exp:
      ``a_b*b*s*d*(2*n_heads + 2*max(kv, P))/P + 4*b*s*n_heads/P``;
    - the o_proj input: with ``P > 1`` a new tensor ``a_b*t*n_heads*d`` (the second all-to-all's output; with
      ``P = 1`` it is a view of the kernel output, measured, so 0);
    - the SwiGLU MLP: gate, up, act(gate), product, ``4*a_b*t*f``.

    ``checkpointing="full"`` (HF ``gradient_checkpointing_enable``; Chen et al. arXiv 1604.06174): the L layer
    inputs ``L*a_b*t*h`` plus ONE layer as above, recomputed in backward (its all-to-alls included, see
    :func:`all_to_all_bytes_per_step`); measured: the forward saves exactly the layer inputs, and the backward's
    recomputation saves L such layers (each freed after its own backward) plus the rotary tables once.

    Outside the layers: the final norm and the lm_head input ``(4 + a_b)*t*h + 4*t + a_b*t*h``; token ids and
    (shifted) labels, int64, ``16*t`` (each rank's own chunk, as ``UlyssesSPDataLoaderAdapter`` hands it on CUDA);
    the rotary cos/sin ``2*a_b*t*d``; the 16-bit logits and the fp32 log-softmax of the loss, ``(a_b + 4)*t*V``. Not modelled: the loss aggregation's scalars (measured
    ``8*(P + 1) + 4`` bytes).

    ``seq_len`` and ``micro_batch`` may be int arrays (broadcast). Returns ``{"layer", "layers", "final",
    "inputs", "logits", "total"}`` (``layer``: one layer's saved bytes; ``total`` sums the other four), float
    arrays, bytes. Raises ``ValueError`` (:func:`check_ulysses`; ``checkpointing`` not "none"/"full").
    """
    check_ulysses(n_heads=n_heads, kv_heads=kv_heads, sp_size=sp_size, seq_len=seq_len)
    if checkpointing not in ("none", "full"):
        raise ValueError(f"checkpointing={checkpointing!r}: must be 'none' or 'full'")
    ab = float(element_bytes)
    P = float(sp_size)
    s = np.asarray(seq_len, dtype=np.float64)
    b = np.asarray(micro_batch, dtype=np.float64)
    t = s * b / P  # local tokens
    h, d, f, V = float(hidden_size), float(head_dim), float(ffn_size), float(vocab_size)
    hq = n_heads * d
    norms = 2.0 * ((4.0 + ab) * t * h + 4.0 * t)
    norm_outputs = 2.0 * ab * t * h
    core = ab * b * s * d * (2.0 * n_heads + 2.0 * kv_heads_exchanged(kv_heads, sp_size)) / P \
        + 4.0 * b * s * n_heads / P
    o_proj_input = ab * t * hq if sp_size > 1 else 0.0 * t
    mlp = 4.0 * ab * t * f
    layer = norms + norm_outputs + core + o_proj_input + mlp
    parts = {
        "layers": n_layers * ab * t * h + layer if checkpointing == "full" else n_layers * layer,
        "final": (4.0 + ab) * t * h + 4.0 * t + ab * t * h,
        "inputs": 16.0 * t + 2.0 * ab * t * d,
        "logits": (ab + 4.0) * t * V,
    }
    parts["total"] = parts["layers"] + parts["final"] + parts["inputs"] + parts["logits"]
    parts["layer"] = layer
    return parts


def zero_shard_degree(*, world_size: int, sp_size: int) -> int:
    """Ranks ZeRO partitions model states over under Ulysses: the sequence-data-parallel group, ``world_size``
    (= dp * sp), not ``world_size / sp_size``.

    DeepSpeed 0.19.8 ``deepspeed/utils/groups.py`` ``_get_sequence_data_parallel_group`` ("the process group for zero
    sharding and gradient allreduce must be across both dimensions of data and sequence parallelism") and
    ``runtime/engine.py``: the ZeRO optimizer gets ``dp_process_group=self.seq_data_parallel_group``. Measured: with
    sp 2 and 4 on a world of 2 and 4 (data-parallel degree 1) ZeRO-1's parameter all-gather input is 1/2 and 1/4
    of the 16-bit parameters. Raises ``ValueError`` unless ``sp_size`` divides ``world_size``.
    """
    if sp_size < 1 or world_size < 1 or world_size % sp_size:
        raise ValueError(f"sp_size={sp_size} must divide world_size={world_size} (both >= 1)")
    return int(world_size)
