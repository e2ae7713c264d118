"""Scalar facts of a scenario and the candidate arrays the vectorised cost model evaluates.

The cost model is written once, over numpy arrays: every function takes a :class:`Context` (scalars derived from
one :class:`~zeroplanner.specs.Scenario`) and a :class:`Candidates` (equal-shaped integer arrays, one element per
candidate configuration) and returns arrays of the same shape. A single estimate is the 1-element case.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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


@dataclass(frozen=True)
class Candidates:
    """Equal-shaped arrays, one element per candidate configuration.

    stage: 0-3; offload_optimizer / offload_param: 0 none, 1 cpu, 2 nvme; checkpointing: 0 none, 1 selective,
    2 full; micro_batch, grad_accum, nodes: positive integers; hpz: zero_hpz_partition_size; qwz / qgz: 0/1 for
    zero_quantized_weights / zero_quantized_gradients; overlap: overlap_comm 0/1, or -1 for DeepSpeed's default;
    reduce_bucket: reduce_bucket_size in elements.
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
        )

    @classmethod
    def build(cls, **arrays) -> Candidates:
        """Broadcast keyword arrays (all fields required) to one shape."""
        names = [f.name for f in fields(cls)]
        missing = set(names) - set(arrays)
        if missing:
            raise TypeError(f"missing candidate fields: {sorted(missing)}")
        broadcast = np.broadcast_arrays(*(np.asarray(arrays[n], dtype=np.int64) for n in names))
        return cls(**{n: np.ascontiguousarray(a) for n, a in zip(names, broadcast)})

    @property
    def shape(self) -> tuple[int, ...]:
        return self.stage.shape

    def take(self, index) -> Candidates:
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


@dataclass(frozen=True)
class Context:
    """Scalars of one scenario, in bytes, elements, seconds and FLOP/s."""

    scenario: Scenario
    params: float  # Ψ per tensor-parallel rank
    trainable: float  # trainable parameters per tensor-parallel rank
    frozen: float
    weight_bytes: float  # bytes per element of the 16-bit (or fp32) working copy
    frozen_weight_bytes: float  # NF4 for QLoRA, else weight_bytes
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


def make_context(scenario: Scenario) -> Context:
    """Derive the scalars the vectorised functions need. Pure; raises nothing beyond the Scenario's validation."""
    m, c, t = scenario.model, scenario.cluster, scenario.training
    tp = c.tensor_parallel_size
    attn_share = attention_tp_share(m.kv_heads, tp)
    # the largest AutoTP rank's extra attention weights when the heads do not split evenly (0 when they do)
    uneven = m.n_attention_layers * m.attention_params * (attn_share - 1.0 / tp)
    params = scenario.parameters / tp + uneven
    trainable = scenario.trainable_parameters / tp + (uneven if scenario.trainable_parameters == scenario.parameters
                                                       else 0.0)
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
        frozen_weight_bytes=DTYPE_BYTES["nf4"] if t.qlora else w,
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
    )


def data_parallel_degree(ctx: Context, cand: Candidates) -> np.ndarray:
    """N_d = nodes * gpus_per_node / tensor_parallel_size (ZeRO shards over the data-parallel group only)."""
    return cand.nodes * ctx.gpus_per_node // ctx.tp


def overlap_comm(ctx: Context, cand: Candidates) -> np.ndarray:
    """Effective overlap_comm per candidate: the candidate's value, or DeepSpeed's default where it is -1 (True only
    at stage 3; DeepSpeedZeroConfig.overlap_comm validator in deepspeed/runtime/zero/config.py)."""
    return np.where(cand.overlap < 0, cand.stage == 3, cand.overlap > 0)
