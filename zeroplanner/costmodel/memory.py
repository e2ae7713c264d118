"""Per-GPU memory by term, host RAM and NVMe per node, for ZeRO stages 0-3 with offload.

Two accountings (``Assumptions.accounting``):

- ``"paper"``: the ZeRO paper's ideal model states (Rajbhandari et al., arXiv 1910.02054, Sec. 5, Fig. 1):
  baseline (2 + 2 + K)Ψ; P_os 4Ψ + KΨ/N_d; P_os+g 2Ψ + (2 + K)Ψ/N_d; P_os+g+p (4 + K)Ψ/N_d, with K = fp32 master
  weights + optimizer states.
- ``"deepspeed"`` (default): what DeepSpeed 0.19.8 allocates, as measured by ``zeroplanner.calibrate`` (a census
  of live tensor storages on 2 and 4 CPU ranks; table in docs/validation.md): mixed-precision ZeRO-1/2 keep
  ``2Ψ + 18Ψ/N_d`` at the gradient peak (the 16-bit and fp32 gradient partitions together, as DeepSpeed's own
  estimator says), ZeRO-3 ``20Ψ/N_d``, stage 0 ``20Ψ`` (its bf16/fp16 wrapper holds fp32 gradient copies), and
  fp32 training also keeps an fp32 master copy under ZeRO. Bucket buffers and the stage-3 working set are counted
  as ``buffers``.

Every function takes a :class:`~.context.Context` and :class:`~.context.Candidates` and returns float arrays of
bytes shaped like the candidates.
"""

from __future__ import annotations

import numpy as np

from .activations import activation_bytes
from .communication import STAGE0_ALLREDUCE_BUCKET
from .context import Candidates, Context, data_parallel_degree, overlap_comm

TERMS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")

OFFLOAD_PARAM_BUFFER_COUNT = 5
OFFLOAD_PARAM_BUFFER_SIZE = 100_000_000
"""DeepSpeedZeroOffloadParamConfig defaults (deepspeed/runtime/zero/offload_config.py): buffer_count=5,
buffer_size=1e8 elements of pinned host memory per rank for NVMe parameter swapping."""
OFFLOAD_OPTIMIZER_BUFFER_COUNT = 4
SUB_GROUP_SIZE = 1_000_000_000
"""DeepSpeedZeroOffloadOptimizerConfig buffer_count=4 and zero_optimization.sub_group_size=1e9 defaults: NVMe
optimizer swapping keeps buffer_count sub-groups of fp32 state in pinned host memory per rank."""


def model_state_bytes(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """GPU bytes for parameters, gradients and optimizer states (incl. fp32 master weights) per GPU.

    Returns dict with keys "parameters", "gradients", "optimizer_states" (float arrays, bytes).
    """
    n = data_parallel_degree(ctx, cand).astype(np.float64)
    st = cand.stage
    P, T, F = ctx.params, ctx.trainable, ctx.frozen
    w, fw = ctx.weight_bytes, ctx.frozen_weight_bytes
    K = ctx.master_bytes + ctx.optimizer_state_bytes
    qlora = ctx.scenario.training.qlora
    paper = ctx.scenario.assumptions.accounting == "paper"
    off_opt = cand.offload_optimizer > 0
    off_par = cand.offload_param > 0

    # --- parameters -----------------------------------------------------------------------------------------
    full = F * fw + T * w
    # QLoRA + ZeRO-3: bitsandbytes 4-bit weights are not partitioned by most DeepSpeed versions and fall back to
    # full copies (DeepSpeed #5819, peft #2016): keep the frozen base whole.
    frozen_part = F * fw if qlora else F * fw / n
    sharded = frozen_part + T * w / n
    persistent = ctx.persistent_params * w * (1.0 - 1.0 / n)
    hpz_secondary = np.where(cand.hpz > 1, P * w / np.maximum(cand.hpz, 1), 0.0)
    stage3_params = np.where(off_par, ctx.persistent_params * w + (F * fw if qlora else 0.0), sharded + persistent)
    if paper:
        stage3_params = P * w / n + 0.0 * n
        persistent = 0.0
    parameters = np.where(st == 3, stage3_params + hpz_secondary, full)

    # --- gradients ------------------------------------------------------------------------------------------
    # Measured on DeepSpeed 0.19.8 (docs/validation.md, census of live storages on 2 and 4 CPU ranks):
    # - stage 0 mixed precision: the 16-bit gradients (Ψ_t·w) and the fp32 copies the bf16/fp16 wrapper makes
    #   before the step (runtime/fp16/unfused_optimizer.py) are alive together: (w + 4)Ψ_t; fp32: 4Ψ_t.
    # - stages 1-3 without optimizer offload: at the gradient peak of the step the 16-bit partition (Ψ_t·w/N_d;
    #   stage 3: grad_partitions_flat_buffer) and the fp32 partition handed to the optimizer (4Ψ_t/N_d) are alive
    #   together, also in fp32 training (a flat fp32 copy): (w + 4)Ψ_t/N_d. ZeRO-1 measures the same as ZeRO-2:
    #   its in-flight 16-bit gradients sit in the reduction bucket (a buffer), not in a full-size copy.
    # - with optimizer offload nothing stays on the GPU (stage 3 allocates its partition on the host).
    g16 = ctx.weight_bytes
    if paper:
        grads_partitioned = np.where(st >= 2, T * g16 / n, T * g16)
        gradients = grads_partitioned
    else:
        stage0 = T * g16 + (4.0 * T if ctx.mixed else 0.0)
        zero = (g16 + 4.0) * T / n
        # ZeRO-1 does not partition gradients: with gradient accumulation the full 16-bit gradients accumulate
        # across micro-steps (not measured here; the calibration runs grad_accum = 1).
        zero = np.where((st == 1) & (cand.grad_accum > 1), g16 * T + 4.0 * T / n, zero)
        accumulating = (st == 1) & (cand.grad_accum > 1)
        offloaded = np.where(accumulating, g16 * T, 0.0)
        gradients = np.where(st == 0, stage0, np.where(off_opt, offloaded, zero))

    # --- optimizer states (+ fp32 master weights) -----------------------------------------------------------
    # DeepSpeed's ZeRO optimizers keep an fp32 master partition even when training in fp32
    # (single_partition_of_fp32_groups / fp32_partitioned_groups_flat are copies; measured 12Ψ/N_d for Adam in
    # fp32 at stages 1-3, docs/validation.md); without ZeRO a plain fp32 optimizer updates the weights in place.
    shard = np.where(st >= 1, n, 1.0)
    master_zero = 4.0 if not paper else ctx.master_bytes
    K_stage = np.where(st >= 1, master_zero + ctx.optimizer_state_bytes, K)
    optimizer_states = np.where(off_opt, 0.0, K_stage * T / shard)
    return {"parameters": parameters, "gradients": gradients, "optimizer_states": optimizer_states}


def buffer_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """Communication buffers and the stage-3 gathered working set, bytes per GPU.

    - stage 0: one flattened all-reduce bucket of min(5e8, Ψ_trainable) elements (engine.allreduce_gradients ->
      buffered_allreduce_fallback with MEMORY_OPT_ALLREDUCE_SIZE);
    - stages 1-2: the ipg bucket of reduce_bucket_size elements (all of it, however small Ψ_t), doubled with
      overlap_comm
      (stage_1_and_2.py ``ipg_buffer``; DeepSpeed #1302 measures less than the quoted 4.5x upper bound);
    - stage 3: gathered parameters min(stage3_max_live_parameters, max(largest module + prefetch bucket, the
      parameters kept resident from forward into backward)), the gradient of the module being computed, and one
      reduce bucket.
    """
    z = ctx.scenario.zero
    w = ctx.weight_bytes
    T = ctx.trainable
    paper = ctx.scenario.assumptions.accounting == "paper"
    overlap = np.where(overlap_comm(ctx, cand), 2.0, 1.0)
    bucket = cand.reduce_bucket.astype(np.float64)
    # DeepSpeed allocates the whole bucket, not min(bucket, Ψ): a reduce_bucket_size-element ipg buffer in the
    # working precision (measured 1e9 bytes for the 5e8 default in bf16, 2e9 in fp32, on a 165k-parameter model at
    # stages 1, 2 and 3; stage_1_and_2.py IPGBucket, stage3.py ``bucket.buffer = torch.empty(reduce_bucket_size)``).
    # The planner therefore proposes a smaller reduce_bucket_size when Ψ_t is smaller than the bucket (LoRA).
    reduce_bucket = (np.minimum(bucket, T) if paper else bucket) * w
    stage0_bucket = min(STAGE0_ALLREDUCE_BUCKET, T) * w
    # Stage 3 keeps up to stage3_max_live_parameters gathered (within stage3_max_reuse_distance) from the end of
    # forward into backward (stage3.py PartitionedParameterCoordinator), beside the module being computed plus
    # the prefetch bucket.
    gathered = ctx.params - ctx.persistent_params
    kept = min(z.stage3_max_live_parameters, z.stage3_max_reuse_distance, max(gathered, 0.0))
    working = ctx.largest_module + z.stage3_prefetch_bucket_size
    live = min(z.stage3_max_live_parameters, max(working, kept), ctx.params) * w
    # Stage 3 with overlap_comm (its default) measured one ipg buffer, not two.
    stage3 = live + ctx.largest_module * w + reduce_bucket * (overlap if paper else 1.0)
    # ZeRO-1/2 optimizer offload: a largest-parameter 16-bit staging buffer on the GPU
    # (stage_1_and_2.py temp_grad_buffer_for_gpu_offload; measured).
    staging = np.where((cand.offload_optimizer > 0) & (cand.stage <= 2) & (not paper), ctx.largest_module * w, 0.0)
    st = cand.stage
    return np.select([st == 0, st <= 2], [stage0_bucket + 0.0 * st, reduce_bucket * overlap + staging], stage3)


def host_and_nvme_bytes(ctx: Context, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """Host RAM per node and NVMe bytes per node for offloaded states, including pinned swap buffers.

    CPU optimizer offload keeps fp32 master, optimizer states and the fp32 gradient partition per rank in host
    memory (stage_1_and_2.py ``single_partition_of_fp32_groups`` on CPU; stage3.py); NVMe optimizer offload keeps
    master + states on NVMe, gradients and buffer_count sub-groups in pinned host memory; parameter offload keeps
    each rank's 16-bit parameter partition on the host (cpu) or on NVMe with pinned swap buffers.
    Returns (host_bytes_per_node, nvme_bytes_per_node), float arrays.
    """
    n = data_parallel_degree(ctx, cand).astype(np.float64)
    g = float(ctx.gpus_per_node)
    T, P = ctx.trainable, ctx.params
    K = ctx.master_bytes + ctx.optimizer_state_bytes
    fp32_grad = 4.0
    paper = ctx.scenario.assumptions.accounting == "paper"
    if not paper:
        K = 4.0 + ctx.optimizer_state_bytes  # fp32 master partition also in fp32 training (measured)
    per_rank_states = K * T / n
    per_rank_grads = fp32_grad * T / n
    # Measured host extras (docs/validation.md): ZeRO-1/2 keep a 16-bit copy of the partition
    # (param_buffer_of_bit16_for_cpu_offload_groups) and a largest-parameter 16-bit staging buffer
    # (temp_grad_buffer_for_cpu_offload); ZeRO-3 keeps its 16-bit gradient partition on the host
    # (grad_partitions_flat_buffer on self.device = cpu).
    w = ctx.weight_bytes
    extra = 0.0 if paper else np.where(cand.stage == 3, w * T / n, w * T / n + ctx.largest_module * w)
    opt_host = np.select(
        [cand.offload_optimizer == 1, cand.offload_optimizer == 2],
        [per_rank_states + per_rank_grads + extra,
         per_rank_grads + extra + OFFLOAD_OPTIMIZER_BUFFER_COUNT * np.minimum(SUB_GROUP_SIZE, T / n) * K],
        0.0,
    )
    opt_nvme = np.where(cand.offload_optimizer == 2, per_rank_states, 0.0)
    param_part = P * ctx.weight_bytes / n
    par_host = np.select(
        [cand.offload_param == 1, cand.offload_param == 2],
        [param_part, OFFLOAD_PARAM_BUFFER_COUNT * OFFLOAD_PARAM_BUFFER_SIZE * ctx.weight_bytes + 0.0 * n],
        0.0,
    )
    par_nvme = np.where(cand.offload_param == 2, param_part, 0.0)
    return g * (opt_host + par_host), g * (opt_nvme + par_nvme)


def memory_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """All per-GPU terms (keys :data:`TERMS` plus "total"), and "host_per_node", "nvme_per_node", bytes."""
    terms = model_state_bytes(ctx, cand)
    terms["activations"] = activation_bytes(ctx, cand)
    terms["buffers"] = buffer_bytes(ctx, cand)
    a = ctx.scenario.assumptions
    live = sum(terms[k] for k in ("parameters", "gradients", "optimizer_states", "activations", "buffers"))
    terms["overhead"] = a.cuda_context_bytes + a.allocator_fragmentation_fraction * live
    terms["total"] = live + terms["overhead"]
    terms["host_per_node"], terms["nvme_per_node"] = host_and_nvme_bytes(ctx, cand)
    return terms
