"""Scalar facts of a scenario and the candidate arrays the vectorised cost model evaluates.

The cost model is written once, over numpy arrays: every function takes a :class:`Context` (scalars derived from
one :class:`~zeroplanner.specs.Scenario`) and a :class:`Candidates` (equal-shaped integer arrays, one element per
candidate configuration) and returns arrays of the same shape. A single estimate is the 1-element case.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ..specs import Scenario
from ..units import DTYPE_BYTES

OFFLOAD_CODES = {"none": 0, "cpu": 1, "nvme": 2}
CHECKPOINT_CODES = {"none": 0, "selective": 1, "full": 2}

OPTIMIZER_STATE_BYTES = {"adamw": 8.0, "adam": 8.0, "sgd": 4.0, "adam8bit": 2.0}
"""Optimizer-state bytes per trainable parameter, excluding fp32 master weights: Adam keeps fp32 momentum and
variance (ZeRO paper, arXiv 1910.02054, Sec. 3.1: K = 12 = 4 master + 4 + 4); SGD with momentum one fp32 buffer;
bitsandbytes 8-bit Adam one byte each for both moments (Dettmers et al., arXiv 2110.02861, Sec. 2)."""

OPTIMIZER_BYTES_TOUCHED = {"adamw": 34.0, "adam": 34.0, "sgd": 22.0, "adam8bit": 22.0}
"""HBM bytes read+written per parameter by one fused optimizer step in mixed precision (fp32 master r/w 8,
moments r/w 16 or 8, fp32 gradient read 4, 16-bit parameter write 2, 16-bit gradient read 2, rounded up to whole
tensors); the step is memory-bound, so time = bytes / HBM bandwidth (roofline; Williams et al., CACM 2009)."""


NF4_CODE_BYTES = 4 / 8
"""Bytes of one 4-bit NF4 code per base weight (Dettmers et al., QLoRA, arXiv 2305.14314, Sec. 3 "4-bit
NormalFloat"); bitsandbytes packs them into bnb_4bit_quant_storage elements (2 per uint8, 4 per bfloat16) without
changing the bytes."""
NF4_CONSTANT_BYTES = (8 / 64 + 32 / (64 * 256)) / 8
"""Bytes of quantisation constants per 4-bit weight with double quantisation: one 8-bit absmax per 64-weight block
plus one fp32 second-level constant per 256 blocks, 0.127 bits (QLoRA, arXiv 2305.14314, Sec. 3 "Double
Quantization": "from 32/64 = 0.5 bits, to 8/64 + 32/(64 * 256) = 0.127 bits"; bitsandbytes' 4-bit blocksize 64).
PEFT's ZeRO-3 example runs with it (``--use_nested_quant True``); without it they are 0.5 bits, not modelled.
They live in each weight's ``quant_state``, not in a Parameter, so ZeRO-3 does not partition them."""


def qlora_quantized_params(m) -> int:
    """Elements bitsandbytes stores in 4 bits in a QLoRA model of architecture ``m``, whole model (not per
    tensor-parallel rank).

    transformers replaces every ``nn.Linear`` by ``bnb.nn.Linear4bit`` (integrations/bitsandbytes.py
    ``replace_with_bnb_linear``: ``type(module) is nn.Linear``) except the output embedding and tied weights
    (quantizers/base.py ``get_keys_to_not_convert``). What stays in the load dtype, subtracted here: embeddings
    (``nn.Embedding``), lm_head, norm weights (per layer, final, q/k norms, MLA's low-rank norms), the Linear4bit
    biases (kept as ordinary parameters), per-layer extra tensors, MoE routers and fused expert tensors
    (``nn.Parameter`` of transformers 5's ``*TopKRouter`` / ``*Experts`` modules, not ``nn.Linear``). Other mixers (linear attention, Mamba) and the vision tower count as 4-bit: their few
    non-linear tensors (convolutions, A_log) are not separated. Scaled like the parameter count when
    ``parameter_count_override`` is set.
    """
    h = m.hidden_size
    norms = (m.n_layers * m.norms_per_layer + m.final_norm) * m.norm_params + m.n_layers * m.layer_extra_params
    q_out = m.q_size * (2 if m.gated_attention else 1)
    if m.mla:
        attn_kept = m.attention_params - sum(m._mla_matrices().values())  # the two low-rank norms, biases
    else:
        attn_kept = m.qk_norm_params + (q_out + 2 * m.kv_size) * m.qkv_bias + h * m.out_bias
    mlp_bias = (m.mlp_params - m._mlp(m.ffn_size, False))
    dense_bias = (m.dense_mlp_params - m._mlp(m.dense_width, False))
    kept = (m.embedding_params + m.lm_head_params + norms + m.n_attention_layers * attn_kept
            + m.n_dense_layers * dense_bias + m.n_moe_layers * (m.n_experts * mlp_bias + m.router_params))
    if m.fused_experts and m.n_experts > 1:
        kept += m.n_moe_layers * m.n_experts * m._mlp(m.ffn_size, False)
    quantized = max(m.derived_parameter_count - m.extra_parameters - kept, 0)
    if m.parameter_count_override:
        quantized = int(quantized * m.parameter_count_override / max(m.derived_parameter_count, 1))
    return quantized


def largest_quantized_linear(m) -> int:
    """Elements of the largest 4-bit weight, which bitsandbytes dequantises whole to the compute dtype before its
    matmul (``bnb.functional.dequantize_4bit`` in ``MatMul4Bit`` forward and backward), one at a time: the largest
    decoder-block matrix among the attention projections and the MLP (expert) matrices."""
    h, f = m.hidden_size, m.ffn_size
    q_out = m.q_size * (2 if m.gated_attention else 1)
    if m.mla:
        mats = list(m._mla_matrices().values())
    elif m.fused_qkv:
        mats = [h * (q_out + 2 * m.kv_size), m.q_size * h]
    else:
        mats = [h * q_out, h * m.kv_size, m.q_size * h]
    gate_up = 2 if m.fused_gate_up and m.ffn_kind == "swiglu" else 1
    if m.n_dense_layers:
        mats += [gate_up * h * m.dense_width, m.dense_width * h]
    if m.n_moe_layers and not (m.fused_experts and m.n_experts > 1):
        mats += [h * f]
    if m.shared_expert_ffn_size:
        mats += [gate_up * h * m.shared_expert_ffn_size]
    if m.other_mixer_largest_module:
        mats.append(m.other_mixer_largest_module)
    return int(max(mats))


def qlora_base_shardable(training) -> bool:
    """Whether ZeRO-3 partitions a QLoRA model's 4-bit base: only when ``bnb_4bit_quant_storage`` is the training
    dtype (TrainingSpec refuses any other float). transformers loads a quantised model without
    ``deepspeed.zero.Init`` (modeling_utils.py: ``needs_zero3_init = is_deepspeed_zero3_enabled() and not
    _is_quantized``), quantised on the CPU so that DeepSpeed shards it when the engine starts (transformers #29587,
    which added the quant_storage option "required for FSDP+QLoRA" and this path for ZeRO-3); PEFT's guide sets the
    storage and torch_dtype to bfloat16 for ZeRO-3. With bitsandbytes' uint8 default users report ZeRO-3 keeping
    a full copy per GPU (DeepSpeed #5819, peft #2016): priced whole. DeepSpeed's own code treats integer
    parameters apart: it casts only floating-point tensors to the training dtype (partition_parameters.py
    ``zero_wrapper_for_fp_tensor_constructor``: ``tensor.is_floating_point()``; engine.py CASTABLE_DTYPES) and its
    all-reduce fetch path needs one dtype per coalesced gather (``get_only_unique_item(p.ds_tensor.dtype ...)``);
    0.19.8's all-gather path groups by dtype, so whether it now shards uint8 storage is not measured here.
    False without QLoRA; the stage is the candidate's (memory.py applies this at stage 3 only)."""
    return bool(training.qlora and training.bnb_4bit_quant_storage != "uint8")


@dataclass(frozen=True)
class Candidates:
    """Equal-shaped arrays, one element per candidate configuration (or, :attr:`sparse`, arrays that broadcast to
    one shape, :attr:`shape`).

    stage: 0-3; offload_optimizer / offload_param: 0 none, 1 cpu, 2 nvme; checkpointing: 0 none, 1 selective,
    2 full; micro_batch, grad_accum, nodes: positive integers; hpz: zero_hpz_partition_size; qwz / qgz: 0/1 for
    zero_quantized_weights / zero_quantized_gradients; overlap: overlap_comm 0/1, or -1 for DeepSpeed's default;
    reduce_bucket: reduce_bucket_size in elements; sp: Ulysses sequence-parallel degree (1 = none; optional in
    :meth:`build`, default 1).
    """

    stage: np.ndarray
    offload_optimizer: np.ndarray
    offload_param: np.ndarray
    checkpointing: np.ndarray
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    nodes: np.ndarray
    hpz: np.ndarray
    qwz: np.ndarray
    qgz: np.ndarray
    overlap: np.ndarray
    reduce_bucket: np.ndarray
    sp: np.ndarray

    @classmethod
    def from_scenario(cls, scenario: Scenario) -> Candidates:
        z, t = scenario.zero, scenario.training
        return cls.build(
            stage=z.stage,
            offload_optimizer=OFFLOAD_CODES[z.offload_optimizer.device],
            offload_param=OFFLOAD_CODES[z.offload_param.device],
            checkpointing=CHECKPOINT_CODES[t.checkpointing],
            micro_batch=t.micro_batch,
            grad_accum=t.grad_accum,
            nodes=scenario.cluster.nodes,
            hpz=z.zero_hpz_partition_size,
            qwz=int(z.zero_quantized_weights),
            qgz=int(z.zero_quantized_gradients),
            overlap=-1 if z.overlap_comm is None else int(z.overlap_comm),
            reduce_bucket=z.reduce_bucket_size,
            sp=scenario.cluster.sequence_parallel_size,
        )

    @classmethod
    def build(cls, *, sparse: bool = False, **arrays) -> Candidates:
        """Broadcast keyword arrays (all fields required but ``sp``, which defaults to 1) to one shape.

        ``sparse=True`` keeps each array at its own shape (they must broadcast together: a grid's axes as
        ``np.meshgrid(..., sparse=True)`` gives them) and :attr:`shape` is the shape they broadcast to. The cost
        model is elementwise, so every value is the same; most are computed over the axes they depend on, not over
        every candidate (the timeline's points and a few zeros are built at the full shape;
        :func:`~.evaluate.evaluate` returns arrays of the full shape either way)."""
        names = [f.name for f in fields(cls)]
        arrays.setdefault("sp", 1)
        missing = set(names) - set(arrays)
        if missing:
            raise TypeError(f"missing candidate fields: {sorted(missing)}")
        given = [np.asarray(arrays[n], dtype=np.int64) for n in names]
        shape = np.broadcast_shapes(*(a.shape for a in given)) or (1,)
        if sparse:
            out = cls(**{n: a.reshape((1,) * (len(shape) - a.ndim) + a.shape) for n, a in zip(names, given)})
            object.__setattr__(out, "_shape", shape)
            return out
        # what np.ascontiguousarray(np.broadcast_arrays(...)) gives, without its per-array Python overhead: at
        # least 1-D (all scalars give one candidate, shape (1,)), an array already of the shape and contiguous used
        # as is, any other copied out at the shape
        out = {}
        for n, a in zip(names, given):
            if a.shape != shape or not a.flags.c_contiguous:
                full = np.empty(shape, dtype=np.int64)
                full[...] = a
                a = full
            out[n] = a
        return cls(**out)

    @property
    def shape(self) -> tuple[int, ...]:
        """The candidates' shape (every field's, or the one they broadcast to: :meth:`build`)."""
        return self.__dict__.get("_shape") or self.stage.shape

    @property
    def sparse(self) -> bool:
        """Whether the fields are kept at their own shapes (:meth:`build` with ``sparse=True``)."""
        return "_shape" in self.__dict__

    def full(self) -> Candidates:
        """These candidates with every field at :attr:`shape` (itself when they already are)."""
        if not self.sparse:
            return self
        return Candidates.build(**{f.name: getattr(self, f.name) for f in fields(self)})

    def take(self, index) -> Candidates:
        c = self.full()
        return Candidates(**{f.name: getattr(c, f.name)[index] for f in fields(c)})

    @classmethod
    def concat(cls, *parts: Candidates) -> Candidates:
        """One flat (1-D) set of the candidates of ``parts``, in order: evaluating it once costs about what
        evaluating one of them does (the cost of :func:`~zeroplanner.costmodel.evaluate.evaluate` is per call,
        not per candidate, at these sizes)."""
        parts = [p.full() for p in parts]
        return cls(**{f.name: np.concatenate([getattr(p, f.name).reshape(-1) for p in parts])
                      for f in fields(cls)})


@dataclass(frozen=True)
class Context:
    """Scalars of one scenario, in bytes, elements, seconds and FLOP/s."""

    scenario: Scenario
    params: float  # Ψ per tensor-parallel rank
    trainable: float  # trainable parameters per tensor-parallel rank
    frozen: float
    weight_bytes: float  # bytes per element of the 16-bit (or fp32) working copy
    frozen_weight_bytes: float  # QLoRA: one 4-bit code (NF4_CODE_BYTES), else weight_bytes
    grad_bytes: float  # gradient element bytes as communicated
    master_bytes: float  # fp32 master copy per trainable parameter (0 in pure fp32)
    optimizer_state_bytes: float
    mixed: bool
    gpus_per_node: int
    tp: int
    tp_attention_share: float  # share of each attention layer the largest AutoTP rank holds (1/tp when even)
    largest_module: float
    persistent_params: float  # stage-3 parameters below stage3_param_persistence_threshold (kept whole)
    param_modules: int  # modules whose parameters stage 3 gathers separately
    peak_flops: float
    hbm_bytes_per_second: float
    pcie_bytes_per_second: float
    intra_busbw: float  # bytes/s
    intra_latency: float
    node_nic_busbw: float  # bytes/s
    inter_latency: float
    gpu_memory_bytes: float
    fetch_modules: int = 0  # stage 3: modules holding a partitioned (non-persistent) parameter, one forward pass
    fetch_module_params: float = 0.0  # elements those modules gather, one forward pass
    persistent_trainable_tensors: int = 0  # stage 3: trainable tensors kept whole (re-gathered after each step)
    hooked_modules: int = 0  # modules owning parameters (ZeRO-3 pre/post hooks run on each, forward and backward)
    param_tensors: int = 0  # trainable parameter tensors (one backward gradient hook each in ZeRO-2/3)
    hidden_size: int = 1
    gpu_name: str = ""
    # QLoRA (0 / False without it): base elements stored in 4 bits per tensor-parallel rank
    # (qlora_quantized_params), whether ZeRO-3 partitions them (qlora_base_shardable), the largest 4-bit weight
    # (largest_quantized_linear, elements), quantisation-constant bytes per 4-bit weight (NF4_CONSTANT_BYTES)
    quantized_params: float = 0.0
    quantized_shardable: bool = False
    largest_quantized: float = 0.0
    quant_constant_bytes: float = 0.0

    @property
    def stage3_fetch_schedule(self) -> tuple[int, int, int, int]:
        """Stage 3, one micro-step: all-gather calls and elements, forward and backward (:func:`stage3_fetch_schedule`
        at the scenario's ZeRO settings; the paper's accounting: no prefetch, no reuse). Computed when first read,
        from a cache: only the step time reads it, and for a large model the replay is most of a context's cost
        (a 10^13-parameter Llama shape: about 35 ms), which a memory-only evaluation (:func:`~.evaluate.fits`)
        does not pay."""
        sc = self.scenario
        z, t = sc.zero, sc.training
        paper = sc.assumptions.accounting == "paper"  # the paper's 3Ψ: every module gathered, fwd and bwd
        return stage3_fetch_schedule(
            sc.model, z.stage3_param_persistence_threshold, 0 if paper else z.stage3_prefetch_bucket_size,
            z.stage3_max_live_parameters, 0 if paper else z.stage3_max_reuse_distance, bool(t.lora_rank) or t.qlora)

    @property
    def stage3_partitioned_elements(self) -> float:
        """Elements ZeRO-3 partitions and gathers, per tensor-parallel rank, counted in elements of the working
        dtype (w bytes), as DeepSpeed's ``ds_numel`` counts them: Ψ; QLoRA with a shardable base: the 16-bit
        parameters plus the 4-bit weights packed ``w / 0.5`` to an element (PEFT: 4 codes per bfloat16); QLoRA
        with uint8 storage: the trainable (LoRA) parameters only, the base being kept whole."""
        if not self.scenario.training.qlora:
            return self.params
        if not self.quantized_shardable:
            return self.trainable
        return self.params - self.quantized_params + self.quantized_params * self.frozen_weight_bytes / self.weight_bytes


def module_parameter_shapes(m) -> list[tuple[int, tuple[int, ...]]]:
    """(count, parameter numels) per kind of module of a decoder-only transformer, as HF builds it: one entry per
    nn.Module that owns parameters directly (``parameters(recurse=False)``, what ZeRO-3 gathers per fetch;
    ``fetch_sub_module`` in deepspeed/runtime/zero/partitioned_param_coordinator.py). Tied embeddings: the lm_head
    module still runs in forward and gathers the shared weight again."""
    h, f, q, kv, L, E = m.hidden_size, m.ffn_size, m.q_size, m.kv_size, m.n_layers, m.n_experts
    out: list[tuple[int, tuple[int, ...]]] = []

    def lin(n_in, n_out, bias, count=L):
        out.append((count, (n_in * n_out, n_out) if bias else (n_in * n_out,)))

    if m.fused_qkv:
        lin(h, q + 2 * kv, m.qkv_bias)
    else:
        lin(h, q, m.qkv_bias)
        lin(h, kv, m.qkv_bias)
        lin(h, kv, m.qkv_bias)
    lin(q, h, m.out_bias)
    mats = [(h, f), (h, f), (f, h)] if m.ffn_kind == "swiglu" else [(h, f), (f, h)]
    if m.fused_experts and E > 1:
        out.append((L, tuple(a * b * E for a, b in mats)))
    else:
        for a, b in mats:
            lin(a, b, m.mlp_bias, L * E)
    if E > 1:
        out.append((L, (h * E,)))
    norm = (h, h) if m.norm_kind == "layernorm" else (h,)
    if m.norms_per_layer:
        out.append((L * m.norms_per_layer, norm))
    out.append((1, (m.vocab_size * m.embed_width,)))
    if m.learned_position_embeddings:
        out.append((1, (m.learned_position_embeddings * h,)))
    if m.embedding_norm:
        out.append((1, norm))
    if m.final_norm:
        out.append((1, norm))
    out.append((1, (m.vocab_size * m.embed_width,)))  # lm_head (tied or not, it runs and fetches)
    return out


_Node = tuple  # (parameter ids, children, in_backward)
ALIBI_FAMILIES = ("bloom",)
"""Families without a rotary-embedding module (transformers modeling_bloom.py builds ALiBi with a function)."""


@lru_cache(maxsize=256)
def stage3_module_trace(m, frozen_embeddings: bool = False) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], int]:
    """The module trace ZeRO-3 records in the first step: (trace, numels, n_forward).

    trace: one tuple of parameter ids per ``fetch_sub_module`` call of one forward + backward, in order, the
    modules that own no parameter included (their fetch still runs the prefetch loop); numels: elements per
    parameter id; n_forward: how many of the calls are the forward pass. Every nn.Module gets DeepSpeed's hooks
    (``_register_deepspeed_module`` in deepspeed/runtime/zero/parameter_offload.py): forward in call order (a
    container before its children), backward when the gradient of the module's output arrives (a container
    before its children, the children in reverse; modules whose output needs no gradient, the rotary embedding
    and frozen embeddings, are not fetched in backward). Layout of HF's modeling_llama.py (root, model, embed,
    rotary, per layer [norm, attention(q, k, v, o), norm, mlp(gate, act, up, down)], final norm, lm_head),
    measured on 2 CPU ranks (the coordinator's calls, in order, on the tiny Llama of
    tests/evidence/test_zero3_collective_count.py, 2026-12-01); the parameter-owning modules are those of
    :func:`module_parameter_shapes` (a tied lm_head owns the embedding's parameter id), so sizes are whole-model
    elements (not per tensor-parallel rank). Approximations, for the count only: other families' parameter-less
    modules (GPT-2's dropouts) are not in the trace (the tiny GPT-2's count still matched at bucket 20,000); MoE
    layers list every expert, as if each received tokens; LoRA adapters are left out. ``m`` must be hashable
    (the frozen :class:`~zeroplanner.specs.Architecture`); raises nothing.
    """
    h, f, q, kv, L, E = m.hidden_size, m.ffn_size, m.q_size, m.kv_size, m.n_layers, m.n_experts
    numels: list[int] = []

    def new(*sizes) -> tuple[int, ...]:
        numels.extend(sizes)
        return tuple(range(len(numels) - len(sizes), len(numels)))

    def leaf(n_in, n_out, bias) -> _Node:
        return (new(n_in * n_out, n_out) if bias else new(n_in * n_out), (), True)

    norm = (h, h) if m.norm_kind == "layernorm" else (h,)
    mats = [(h, f), (h, f), (f, h)] if m.ffn_kind == "swiglu" else [(h, f), (f, h)]
    act: _Node = ((), (), True)

    def mlp() -> _Node:
        kids = [leaf(a, b, m.mlp_bias) for a, b in mats]
        return ((), tuple(kids[:1] + [act] + kids[1:]), True)

    layers = []
    for _ in range(L):
        attn = ([leaf(h, q + 2 * kv, m.qkv_bias)] if m.fused_qkv
                else [leaf(h, q, m.qkv_bias), leaf(h, kv, m.qkv_bias), leaf(h, kv, m.qkv_bias)])
        attn.append(leaf(q, h, m.out_bias))
        if m.fused_experts and E > 1:
            ffn = [(new(*(a * b * E for a, b in mats)), (), True)]
        else:
            ffn = [mlp() for _ in range(E)]
        if E > 1:
            ffn.insert(0, (new(h * E), (), True))
        norms = [(new(*norm), (), True) for _ in range(m.norms_per_layer)]
        kids = norms[:1] + [((), tuple(attn), True)] + norms[1:2] + [((), tuple(ffn), True)] + norms[2:]
        layers.append(((), tuple(kids), True))
    embed = new(m.vocab_size * m.embed_width)
    base = [(embed, (), not frozen_embeddings)]
    if m.learned_position_embeddings:
        base.append((new(m.learned_position_embeddings * h), (), not frozen_embeddings))
    elif m.family not in ALIBI_FAMILIES:
        base.append(((), (), False))  # rotary embedding: no parameter, output needs no gradient
    if m.embedding_norm:
        base.append((new(*norm), (), True))
    base.extend(layers)
    if m.final_norm:
        base.append((new(*norm), (), True))
    head = (embed if m.tied_embeddings else new(m.vocab_size * m.embed_width), (), True)
    root: _Node = ((), (((), tuple(base), True), head), True)

    def fwd(node, out):
        out.append(node[0])
        for c in node[1]:
            fwd(c, out)

    def bwd(node, out):
        if node[2]:
            out.append(node[0])
            for c in reversed(node[1]):
                bwd(c, out)

    forward: list[tuple[int, ...]] = []
    backward: list[tuple[int, ...]] = []
    fwd(root, forward)
    bwd(root, backward)
    return tuple(forward + backward), tuple(numels), len(forward)


@lru_cache(maxsize=1024)
def stage3_fetch_schedule(m, threshold: int, prefetch_bucket: int, max_live: int, reuse_distance: int,
                          frozen_embeddings: bool = False) -> tuple[int, int, int, int]:
    """(forward all-gathers, elements they gather, backward all-gathers, elements) of one ZeRO-3 micro-step.

    A replay of DeepSpeed 0.19.8's PartitionedParameterCoordinator (deepspeed/runtime/zero/
    partitioned_param_coordinator.py) over :func:`stage3_module_trace` once the trace is complete:
    ``_fetch_sub_module_impl`` gathers the module's parameters that are NOT_AVAILABLE in one
    ``__all_gather_params`` call, pops them off the parameter queue, then (bucket > 0) pops queue entries while
    the numel taken is below ``min(stage3_max_live_parameters - available, stage3_prefetch_bucket_size)``
    (the entry that crosses the bucket is still taken), skipping parameters already available but recording their
    later use, and gathers what it took in one more call; ``release_sub_module`` releases a parameter unless a
    popped use lies later (``__params_to_release``) or it is used within ``stage3_max_reuse_distance`` elements of
    upcoming modules. Each call is one ``all_gather_into_tensor`` (``all_gather_coalesced`` in
    partition_parameters.py: one flat gather per dtype, one dtype here; a single parameter goes through
    ``_all_gather_sequential``, also one call). Parameters with ``numel <= threshold`` are persistent (never
    gathered). Counted exactly by DeepSpeed's comms logger on 2 CPU ranks (tests/evidence/test_steptime.py,
    tests/evidence/test_zero3_collective_count.py). Not modelled: qwZ's second gather (scales), hpZ's split into
    two groups, activation-checkpoint recompute in the trace.

    Arguments are elements (threshold = stage3_param_persistence_threshold, prefetch_bucket =
    stage3_prefetch_bucket_size, max_live = stage3_max_live_parameters, reuse_distance =
    stage3_max_reuse_distance); returns ints; raises nothing. Cached: a scalar loop over the trace (about 1 ms
    for Llama-2-7B's 907 calls on this machine, once per scenario).
    """
    trace, numels, n_fwd = stage3_module_trace(m, frozen_embeddings)
    persistent = [n <= threshold for n in numels]
    avail = list(persistent)
    recent = [-(10 ** 10)] * len(numels)
    queue = deque((p, s) for s, ps in enumerate(trace) for p in ps)
    uses: list[list[int]] = [[] for _ in numels]
    cum = [0]
    for s, ps in enumerate(trace):
        for p in ps:
            uses[p].append(s)
        cum.append(cum[-1] + sum(numels[p] for p in ps))
    n_avail = 0
    calls = [0, 0]
    elems = [0, 0]
    for s, ps in enumerate(trace):
        phase = 0 if s < n_fwd else 1
        need = [p for p in ps if not avail[p]]
        if need:
            calls[phase] += 1
            for p in need:
                avail[p] = True
                n_avail += numels[p]
                elems[phase] += numels[p]
        todo = len({p for p in ps if recent[p] < s})
        seen: set[int] = set()
        while queue and len(seen) < todo:
            p, at = queue.popleft()
            recent[p] = at
            seen.add(p)
        if prefetch_bucket > 0:
            room = min(max_live - n_avail, prefetch_bucket)
            took, taken = 0, []
            while queue and took < room:
                p, at = queue.popleft()
                if not avail[p] and p not in taken:
                    taken.append(p)
                    took += numels[p]
                recent[p] = max(recent[p], at)
            if took:
                calls[phase] += 1
                elems[phase] += took
                n_avail += took
                for p in taken:
                    avail[p] = True
        # release after the module ran (step id s + 1): kept if a popped use lies later, or if it is used again by
        # the modules DeepSpeed walks from s + 1 until their elements reach the reuse distance (bisect on the
        # running sum instead of the walk: same modules)
        end = bisect_left(cum, cum[s + 1] + reuse_distance, lo=s + 1)
        for p in ps:
            if persistent[p] or recent[p] > s + 1 or not avail[p]:
                continue
            u = uses[p]
            i = bisect_right(u, s)
            if i < len(u) and u[i] < end:
                continue
            avail[p] = False
            n_avail -= numels[p]
    return calls[0], elems[0], calls[1], elems[1]


def stage3_fetch_modules(m, threshold: int) -> tuple[int, float]:
    """(modules fetched per forward pass, elements gathered) at ZeRO-3: a parameter stays whole on every rank when
    ``numel <= stage3_param_persistence_threshold`` (``mark_persistent_parameters`` in
    deepspeed/runtime/zero/parameter_offload.py); a module is fetched when it owns a parameter that is not."""
    modules, elements = 0, 0.0
    for count, numels in module_parameter_shapes(m):
        gathered = sum(n for n in numels if n > threshold)
        if gathered:
            modules += count
            elements += count * gathered
    return modules, elements


def attention_tp_share(n_kv_heads: int, tp: int) -> float:
    """Share of an attention layer's heads (and of its Q/K/V/O weights) that the largest tensor-parallel rank holds.

    DeepSpeed's AutoTP splits attention projections by key/value head groups and lets them be uneven: rank r of
    ``tp`` takes ``n_kv_heads // tp + (1 if r < n_kv_heads % tp else 0)`` groups (``deepspeed/module_inject/
    tp_shard.py`` ``get_shard_size``), so the largest rank holds ``ceil(n_kv_heads / tp) / n_kv_heads`` of the
    layer; that rank sets the per-GPU memory and the step. Equals ``1 / tp`` when ``tp`` divides the KV heads.
    Measured on CPU ranks: a 3-head model trains with ``autotp_size`` 2 (tests/evidence/test_error_rules.py).
    """
    return -(-n_kv_heads // tp) / n_kv_heads if tp > 1 else 1.0


def autotp_replicated_params(m) -> int:
    """Parameters DeepSpeed's AutoTP training keeps whole on every tensor-parallel rank (elements): the norms
    (``norms_per_layer`` per layer, the final and embedding norms), the row-parallel layers' biases (o_proj,
    down_proj: ``LinearAllreduce`` keeps the bias replicated, deepspeed/module_inject/layers.py) and, when the
    embeddings are not tied, the input embedding and learned position embeddings (AutoTP replaces only linears;
    a tied embedding is sharded over the vocabulary together with the lm_head). Everything else (the
    attention and MLP projections, an untied lm_head split over the vocabulary) is divided by the TP degree.
    Measured on 2 CPU ranks with autotp_size 2 (tests/evidence/test_autotp_engine.py): a tiny untied Llama keeps
    ``embed_tokens`` [V, h] and every norm whole, its ``lm_head`` is [V/2, h]; tied, ``embed_tokens`` is [V/2, h]."""
    norms = (m.n_layers * m.norms_per_layer + m.final_norm + m.embedding_norm) * m.norm_params
    biases = m.hidden_size * (m.n_attention_layers * m.out_bias + m.n_layers * m.mlp_bias)
    embedding = 0 if m.tied_embeddings else m.vocab_size * m.embed_width + m.learned_position_embeddings * m.hidden_size
    return int(norms + biases + embedding)


def make_context(scenario: Scenario) -> Context:
    """Derive the scalars the vectorised functions need. Pure; raises nothing beyond the Scenario's validation."""
    m, c, t = scenario.model, scenario.cluster, scenario.training
    tp = c.tensor_parallel_size
    attn_share = attention_tp_share(m.kv_heads, tp)
    # the largest AutoTP rank's extra attention weights when the heads do not split evenly (0 when they do)
    uneven = m.n_attention_layers * m.attention_params * (attn_share - 1.0 / tp)
    # what AutoTP leaves whole on every rank (norms, untied input embedding; autotp_replicated_params)
    whole = min(autotp_replicated_params(m), scenario.parameters) * (1.0 - 1.0 / tp) if tp > 1 else 0.0
    full = scenario.trainable_parameters == scenario.parameters
    params = scenario.parameters / tp + uneven + whole
    trainable = scenario.trainable_parameters / tp + ((uneven + whole) if full else 0.0)
    frozen = params - trainable if (t.lora_rank or t.freeze_vision) else 0.0
    mixed = t.precision != "fp32"
    w = DTYPE_BYTES[t.precision]
    threshold = scenario.zero.stage3_param_persistence_threshold
    small_tensors = []
    if m.hidden_size < threshold:
        # norm weights (and LayerNorm biases): norms_per_layer per layer + final norm (+ embedding norm)
        per_norm = m.norm_params
        small_tensors.append((m.n_layers * m.norms_per_layer + m.final_norm + m.embedding_norm) * per_norm)
        if m.out_bias:
            small_tensors.append(m.n_layers * m.hidden_size)
        if m.mlp_bias:
            small_tensors.append(m.n_layers * m.hidden_size * m.n_experts)
    attn_layers = m.n_attention_layers
    if m.qkv_bias and not m.mla and (m.q_size + 2 * m.kv_size) < threshold:
        small_tensors.append(attn_layers * (m.q_size + 2 * m.kv_size))
    if m.mlp_bias and m.ffn_size < threshold:
        small_tensors.append(m.n_layers * m.ffn_size * (2 if m.ffn_kind == "swiglu" else 1) * m.n_experts)
    if m.router_params and m.router_params < threshold:
        small_tensors.append(m.n_moe_layers * m.router_params)
    # 2024-26 layouts: q/k norm weights (head_dim wide, or q/k wide for OLMo 2), MLA's two low-rank RMSNorms,
    # attention sinks and router scales (layer_extra_params); each is its own tensor below the threshold
    if m.qk_norm != "none":
        q_norm, k_norm = (m.dim_head, m.dim_head) if m.qk_norm == "head" else (m.q_size, m.kv_size)
        small_tensors.append(attn_layers * sum(x for x in (q_norm, k_norm) if x < threshold))
    if m.mla:
        small_tensors.append(attn_layers * ((m.q_lora_rank or 0) + (m.kv_lora_rank or 0)))
    if m.layer_extra_params and m.layer_extra_params < threshold:
        small_tensors.append(m.n_layers * m.layer_extra_params)
    # modules whose parameters stage 3 gathers separately: attention projections (MLA: q_a/q_b or q, kv_a, kv_b,
    # o), about three per other mixer (in/conv/out), the MLP matrices (fused experts one module per matrix kind
    # as before), the shared expert's three
    mlp_mats = 3 if m.ffn_kind == "swiglu" else 2
    attn_mats = (4 + (m.q_lora_rank is not None)) if m.mla else (2 if m.fused_qkv else 4)
    dense_mats = 2 if (m.fused_gate_up and m.ffn_kind == "swiglu") else mlp_mats
    layer_modules = (
        attn_layers * attn_mats
        + (m.n_layers - attn_layers) * 3
        + m.n_moe_layers * mlp_mats * (1 if m.fused_experts else m.n_experts)
        + m.n_dense_layers * dense_mats
        + m.n_moe_layers * (mlp_mats if m.shared_expert_ffn_size else 0)
    )
    gpu = c.gpu
    fetch_modules, fetch_elements = stage3_fetch_modules(m, threshold)
    shapes = module_parameter_shapes(m)
    if t.lora_rank:
        # two LoRA matrices per targeted linear per layer (Hu et al., arXiv 2106.09685)
        param_tensors = 2 * m.n_layers * len(t.lora_targets)
        persistent_trainable = param_tensors if t.lora_rank * m.hidden_size <= threshold else 0
    else:
        param_tensors = sum(cnt * len(numels) for cnt, numels in shapes[:-1]) + (0 if m.tied_embeddings else 1)
        persistent_trainable = sum(cnt * sum(1 for n in numels if n <= threshold) for cnt, numels in shapes[:-1])
        if not m.tied_embeddings and m.vocab_size * m.embed_width <= threshold:
            persistent_trainable += 1
    return Context(
        scenario=scenario,
        params=float(params),
        trainable=float(trainable),
        frozen=float(frozen),
        weight_bytes=w,
        frozen_weight_bytes=NF4_CODE_BYTES if t.qlora else w,
        grad_bytes=w,
        master_bytes=4.0 if mixed else 0.0,
        optimizer_state_bytes=OPTIMIZER_STATE_BYTES[t.optimizer],
        mixed=mixed,
        gpus_per_node=c.gpus_per_node,
        tp=tp,
        tp_attention_share=attn_share,
        largest_module=float(m.largest_module_params),
        persistent_params=float(min(sum(small_tensors), scenario.parameters)) / tp,
        param_modules=int(layer_modules + 2),
        peak_flops=gpu.peak_tflops(t.precision) * 1e12,
        hbm_bytes_per_second=gpu.hbm_bandwidth_gb_per_s * 1e9,
        pcie_bytes_per_second=gpu.pcie_gb_per_s * 1e9,
        intra_busbw=gpu.intra_node_busbw_gb_per_s * 1e9,
        intra_latency=gpu.intra_node_latency_seconds,
        node_nic_busbw=c.network.node_busbw_bytes_per_second,
        inter_latency=c.network.latency_seconds,
        gpu_memory_bytes=float(c.memory_per_gpu_bytes),
        fetch_modules=fetch_modules,
        fetch_module_params=fetch_elements / tp,
        param_tensors=param_tensors,
        hooked_modules=sum(cnt for cnt, _ in shapes),
        persistent_trainable_tensors=persistent_trainable,
        hidden_size=int(m.hidden_size),
        gpu_name=gpu.name,
        quantized_params=float(min(qlora_quantized_params(m) / tp, frozen)) if t.qlora else 0.0,
        quantized_shardable=qlora_base_shardable(t),
        largest_quantized=float(largest_quantized_linear(m) / tp) if t.qlora else 0.0,
        quant_constant_bytes=NF4_CONSTANT_BYTES if t.qlora else 0.0,
    )


def data_parallel_degree(ctx: Context, cand: Candidates) -> np.ndarray:
    """N_d = nodes * gpus_per_node / tensor_parallel_size (ZeRO shards over the data-parallel group only)."""
    return cand.nodes * ctx.gpus_per_node // ctx.tp


def overlap_comm(ctx: Context, cand: Candidates) -> np.ndarray:
    """Effective overlap_comm per candidate: the candidate's value, or DeepSpeed's default where it is -1 (True only
    at stage 3; DeepSpeedZeroConfig.overlap_comm validator in deepspeed/runtime/zero/config.py)."""
    return np.where(cand.overlap < 0, cand.stage == 3, cand.overlap > 0)
