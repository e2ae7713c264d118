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

Host RAM (:func:`host_parts`) and NVMe (:func:`nvme_parts`) per node follow DeepSpeed's offload code: with NVMe
offload host RAM holds the swappers' pinned buffers and what stays on the CPU (derived line by line and measured
with real NVMe swapping on CPU ranks: docs/validation.md section 7, benchmarks/measure_nvme_host.py).

Every function takes a :class:`~.context.Context` and :class:`~.context.Candidates`; the ``*_parts`` functions
return the term as labelled parts (:class:`~.terms.TermParts`: each part one expression, evaluated here over the
candidate arrays, and shown as is by explain mode), the others float arrays of bytes shaped like the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .activations import activation_term
from .communication import STAGE0_ALLREDUCE_BUCKET
from .context import Candidates, Context, data_parallel_degree, overlap_comm
from .terms import MEMORY_TERM_KEYS, TermParts, term

if TYPE_CHECKING:
    from ..specs import Scenario

TERMS = MEMORY_TERM_KEYS

OFFLOAD_PARAM_BUFFER_COUNT = 5
OFFLOAD_PARAM_BUFFER_SIZE = 100_000_000
OFFLOAD_PARAM_MAX_IN_CPU = 1_000_000_000
"""DeepSpeedZeroOffloadParamConfig defaults (deepspeed/runtime/zero/offload_config.py): buffer_count=5,
buffer_size=1e8 elements (the pinned swap buffers of partitioned_param_swapper.py
``AsyncPartitionedParameterSwapper._configure_aio``: ``buffer_count x io_aligned(buffer_size)`` elements of the
16-bit dtype, ``new_cpu_locked_tensor``), max_in_cpu=1e9 elements (stage3.py
``_create_param_groups_fp16_flat_cpu_memory`` keeps up to that many 16-bit parameter elements per rank in pinned
host RAM and swaps only the rest)."""
OFFLOAD_OPTIMIZER_BUFFER_COUNT = 4
SUB_GROUP_SIZE = 1_000_000_000
"""DeepSpeedZeroOffloadOptimizerConfig buffer_count=4 and zero_optimization.sub_group_size=1e9 defaults
(offload_config.py, zero/config.py): the NVMe optimizer swapper pins buffer_count fp32 buffers of the largest
sub-group partition (swap_tensor/optimizer_utils.py ``OptimizerSwapper.__init__``:
``SwapBufferManager(num_elems=largest_numel, count=buffer_count, dtype=fp32)``; stage3.py
``_configure_tensor_swapping``: ``largest_numel=max(fp16_partitioned_groups_flat_numel)``). Adam swaps in the
master partition, exp_avg, exp_avg_sq and the gradient of one sub-group at a time: 4 buffers
(partitioned_optimizer_swapper.py ``swap_in_optimizer_state``: ``num_tensors() + 1``)."""


@dataclass(frozen=True)
class OffloadBuffers:
    """DeepSpeed's offload buffer settings the host-RAM and NVMe parts depend on, in elements / buffers; the
    defaults are DeepSpeed 0.19.8's (:data:`OFFLOAD_OPTIMIZER_BUFFER_COUNT`, :data:`SUB_GROUP_SIZE`,
    :data:`OFFLOAD_PARAM_BUFFER_COUNT`, :data:`OFFLOAD_PARAM_BUFFER_SIZE`, :data:`OFFLOAD_PARAM_MAX_IN_CPU`). The
    planner always prices the defaults (they are not scenario inputs); benchmarks/make_validation.py passes the
    settings of a measured run."""

    optimizer_buffer_count: int = OFFLOAD_OPTIMIZER_BUFFER_COUNT
    sub_group_size: int = SUB_GROUP_SIZE
    param_buffer_count: int = OFFLOAD_PARAM_BUFFER_COUNT
    param_buffer_size: int = OFFLOAD_PARAM_BUFFER_SIZE
    max_in_cpu: int = OFFLOAD_PARAM_MAX_IN_CPU


DEEPSPEED_OFFLOAD_BUFFERS = OffloadBuffers()


def _n(ctx: Context, cand: Candidates) -> np.ndarray:
    return data_parallel_degree(ctx, cand).astype(np.float64)


def parameter_parts(ctx: Context, cand: Candidates) -> TermParts:
    """GPU bytes of the working parameters per GPU, by part.

    Stages 0-2 keep every weight; stage 3 its 1/N_d partition plus the persistent small tensors (kept whole, of
    which its own 1/N_d share is already in the partition), or with offload_param only those; the paper accounting
    ``wΨ/N_d``. zero_hpz_partition_size > 1 adds ZeRO++'s secondary partition ``wΨ/hpz``.

    QLoRA: the frozen base is Ψ_q 4-bit weights (w_f = 0.5 B each, :data:`~.context.NF4_CODE_BYTES`) plus what
    bitsandbytes leaves in the load dtype (Ψ_f - Ψ_q: embeddings, lm_head, norms, biases, MoE routers and fused
    experts;
    :func:`~.context.qlora_quantized_params`), and the quantisation constants c_q Ψ_q
    (:data:`~.context.NF4_CONSTANT_BYTES`, whole on every GPU: they are not Parameters). At stage 3 the base is
    partitioned over N_d (and moved to the host by offload_param) only when ``bnb_4bit_quant_storage`` is the
    training dtype (:func:`~.context.qlora_base_shardable`); with uint8 storage it stays whole on every GPU
    (DeepSpeed #5819, peft #2016), is not offloaded, and only the LoRA weights are partitioned; the hpZ secondary
    copy then holds what ZeRO-3 partitions (Ψ_s, :attr:`~.context.Context.stage3_partitioned_elements`).
    """
    st = cand.stage
    paper = ctx.scenario.assumptions.accounting == "paper"
    qlora = ctx.scenario.training.qlora
    off_par = cand.offload_param > 0
    stage3 = (st == 3) & (not paper)
    sharded = stage3 & ctx.quantized_shardable
    whole_base = (st < 3) | (stage3 & ~sharded)  # QLoRA: the base is on every GPU in full
    x = {"Psi": ctx.params, "Psi_t": ctx.trainable, "Psi_f": ctx.frozen, "w": ctx.weight_bytes,
         "w_f": ctx.frozen_weight_bytes, "N_d": _n(ctx, cand), "Psi_persist": ctx.persistent_params,
         "hpz": np.maximum(cand.hpz, 1).astype(np.float64)}
    if qlora:
        x.update({"Psi_q": ctx.quantized_params, "c_q": ctx.quant_constant_bytes})
        frozen = [
            ("4-bit base weights", "w_f*Psi_q", whole_base),
            ("4-bit base weights", "w_f*Psi_q/N_d", sharded & ~off_par),
            ("16-bit frozen weights (embeddings, lm_head, norms)", "w*(Psi_f-Psi_q)", whole_base),
            ("16-bit frozen weights (embeddings, lm_head, norms)", "w*(Psi_f-Psi_q)/N_d", sharded & ~off_par),
            ("4-bit quantisation constants", "c_q*Psi_q", True),
        ]
        # the persistent norms belong to the base, already counted whole when it is not partitioned
        persist3 = sharded
        x["Psi_s"] = ctx.stage3_partitioned_elements
    else:
        frozen = [("frozen base", "w_f*Psi_f", st < 3), ("frozen base", "w_f*Psi_f/N_d", stage3 & ~off_par)]
        persist3 = stage3
    return term("parameters", x, [
        *frozen,
        ("trainable", "w*Psi_t", st < 3),
        ("trainable", "w*Psi_t/N_d", stage3 & ~off_par),
        ("persistent", "w*Psi_persist", persist3 & off_par),
        ("persistent", "w*Psi_persist*(1-1/N_d)", persist3 & ~off_par),
        ("partition", "w*Psi/N_d", (st == 3) & paper),
        ("hpZ secondary copy", "w*Psi_s/hpz" if qlora else "w*Psi/hpz", (st == 3) & (cand.hpz > 1)),
    ])


def gradient_parts(ctx: Context, cand: Candidates) -> TermParts:
    """GPU bytes of gradients per GPU, by part.

    Measured on DeepSpeed 0.19.8 (docs/validation.md, census of live storages on 2 and 4 CPU ranks):
    - stage 0 mixed precision: the 16-bit gradients (Ψ_t·w) and the fp32 copies the bf16/fp16 wrapper makes
      before the step (runtime/fp16/unfused_optimizer.py) are alive together: (w + 4)Ψ_t; fp32: 4Ψ_t.
    - stages 1-3 without optimizer offload: at the gradient peak of the step the 16-bit partition (Ψ_t·w/N_d;
      stage 3: grad_partitions_flat_buffer) and the fp32 partition handed to the optimizer (4Ψ_t/N_d) are alive
      together, also in fp32 training (a flat fp32 copy): (w + 4)Ψ_t/N_d. ZeRO-1 measures the same as ZeRO-2:
      its in-flight 16-bit gradients sit in the reduction bucket (a buffer), not in a full-size copy.
    - ZeRO-1 does not partition gradients: with gradient accumulation the full 16-bit gradients accumulate
      across micro-steps (not measured here; the calibration runs grad_accum = 1).
    - with optimizer offload nothing else stays on the GPU (stage 3 allocates its partition on the host).
    The paper accounting: 16-bit gradients, partitioned from stage 2.
    """
    st = cand.stage
    paper = ctx.scenario.assumptions.accounting == "paper"
    off_opt = cand.offload_optimizer > 0
    zero = (st >= 1) & (not paper)
    accumulating = (st == 1) & (cand.grad_accum > 1)
    x = {"Psi_t": ctx.trainable, "w": ctx.weight_bytes, "N_d": _n(ctx, cand)}
    return term("gradients", x, [
        ("working-precision gradients", "w*Psi_t", (st == 0) | (paper & (st < 2))),
        ("working-precision gradients", "w*Psi_t/N_d", paper & (st >= 2)),
        ("fp32 copies (mixed-precision wrapper)", "4*Psi_t", (st == 0) & (not paper) & ctx.mixed),
        ("accumulated working-precision gradients", "w*Psi_t", zero & accumulating),
        ("working-precision gradient partition", "w*Psi_t/N_d", zero & ~off_opt & ~accumulating),
        ("fp32 gradient partition", "4*Psi_t/N_d", zero & ~off_opt),
    ])


def optimizer_state_parts(ctx: Context, cand: Candidates) -> TermParts:
    """GPU bytes of fp32 master weights + optimizer states per GPU, by part: divided by N_d from stage 1, 0 with
    offload_optimizer.

    DeepSpeed's ZeRO optimizers keep an fp32 master partition even when training in fp32
    (single_partition_of_fp32_groups / fp32_partitioned_groups_flat are copies; measured 12Ψ/N_d for Adam in fp32
    at stages 1-3, docs/validation.md); without ZeRO a plain fp32 optimizer updates the weights in place.
    """
    st = cand.stage
    paper = ctx.scenario.assumptions.accounting == "paper"
    on_gpu = cand.offload_optimizer == 0
    master = np.where((st >= 1) & (not paper), 4.0, ctx.master_bytes)
    x = {"Psi_t": ctx.trainable, "m": master, "k": ctx.optimizer_state_bytes, "N_d": _n(ctx, cand)}
    return term("optimizer_states", x, [
        ("fp32 master weights", "m*Psi_t", on_gpu & (st == 0)),
        ("fp32 master weights", "m*Psi_t/N_d", on_gpu & (st >= 1)),
        ("optimizer states", "k*Psi_t", on_gpu & (st == 0)),
        ("optimizer states", "k*Psi_t/N_d", on_gpu & (st >= 1)),
    ])


def model_state_bytes(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """GPU bytes for parameters, gradients and optimizer states (incl. fp32 master weights) per GPU.

    Returns dict with keys "parameters", "gradients", "optimizer_states" (float arrays, bytes).
    """
    return {"parameters": parameter_parts(ctx, cand).value, "gradients": gradient_parts(ctx, cand).value,
            "optimizer_states": optimizer_state_parts(ctx, cand).value}


def buffer_parts(ctx: Context, cand: Candidates) -> TermParts:
    """Communication buffers and the stage-3 gathered working set, bytes per GPU, by part.

    - stage 0: one flattened all-reduce bucket of min(5e8, Ψ_trainable) elements (engine.allreduce_gradients ->
      buffered_allreduce_fallback with MEMORY_OPT_ALLREDUCE_SIZE);
    - stages 1-2: the ipg bucket of reduce_bucket_size elements (all of it, however small Ψ_t), doubled with
      overlap_comm (stage_1_and_2.py ``ipg_buffer``; DeepSpeed #1302 measures less than the quoted 4.5x upper
      bound); with ZeRO-1/2 optimizer offload also a largest-parameter 16-bit staging buffer on the GPU
      (stage_1_and_2.py temp_grad_buffer_for_gpu_offload; measured);
    - stage 3: gathered parameters min(stage3_max_live_parameters, max(largest module + prefetch bucket, the
      parameters kept resident from forward into backward)), the gradient of the module being computed, and one
      reduce bucket (stage 3 with overlap_comm, its default, measured one ipg buffer, not two; the paper
      accounting doubles it like stages 1-2).
    - QLoRA: bitsandbytes dequantises each 4-bit weight whole to the compute dtype before its matmul and frees it
      after (``dequantize_4bit`` in ``MatMul4Bit``, forward and backward): one largest 4-bit weight Ψ_dq
      (:func:`~.context.largest_quantized_linear`) at a time; the stage-3 gathered set is capped by the elements
      ZeRO-3 partitions (:attr:`~.context.Context.stage3_partitioned_elements`, Ψ_s).
    """
    z = ctx.scenario.zero
    st = cand.stage
    paper = ctx.scenario.assumptions.accounting == "paper"
    bucket = cand.reduce_bucket.astype(np.float64)
    # DeepSpeed allocates the whole bucket, not min(bucket, Ψ): a reduce_bucket_size-element ipg buffer in the
    # working precision (measured 1e9 bytes for the 5e8 default in bf16, 2e9 in fp32, on a 165k-parameter model at
    # stages 1, 2 and 3; stage_1_and_2.py IPGBucket, stage3.py ``bucket.buffer = torch.empty(reduce_bucket_size)``).
    # The planner therefore proposes a smaller reduce_bucket_size when Ψ_t is smaller than the bucket (LoRA).
    # Stage 3 keeps up to stage3_max_live_parameters gathered (within stage3_max_reuse_distance) from the end of
    # forward into backward (stage3.py PartitionedParameterCoordinator), beside the module being computed plus
    # the prefetch bucket.
    qlora = ctx.scenario.training.qlora
    # QLoRA: ZeRO-3 gathers its partitioned elements only (the LoRA weights, plus the packed 4-bit base when it
    # is shardable: Context.stage3_partitioned_elements)
    gatherable = ctx.stage3_partitioned_elements if qlora else ctx.params
    kept = min(z.stage3_max_live_parameters, z.stage3_max_reuse_distance,
               max(gatherable - ctx.persistent_params, 0.0))
    P = "Psi_s" if qlora else "Psi"
    x = {"w": ctx.weight_bytes, "Psi_t": ctx.trainable, "Psi": ctx.params, "Psi_s": gatherable,
         "Psi_dq": ctx.largest_quantized,
         "B": np.minimum(bucket, ctx.trainable) if paper else bucket, "B_ar": float(STAGE0_ALLREDUCE_BUCKET),
         "o": np.where(overlap_comm(ctx, cand), 2.0, 1.0), "B_live": float(z.stage3_max_live_parameters),
         "Psi_max": ctx.largest_module, "B_pf": float(z.stage3_prefetch_bucket_size), "kept": float(kept)}
    stage12 = (st >= 1) & (st <= 2)
    return term("buffers", x, [
        ("all-reduce bucket", "min(B_ar, Psi_t)*w", st == 0),
        ("reduce bucket", "B*w*o", stage12),
        ("offload staging buffer", "Psi_max*w", stage12 & (cand.offload_optimizer > 0) & (not paper)),
        ("gathered live parameters", f"min(B_live, max(Psi_max+B_pf, kept), {P})*w", st == 3),
        ("largest module's gradient", "Psi_max*w", st == 3),
        ("reduce bucket", "B*w*o" if paper else "B*w", st == 3),
        ("dequantised 4-bit weight", "Psi_dq*w", qlora),
    ])


def buffer_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """Communication buffers and the stage-3 gathered working set, bytes per GPU (:func:`buffer_parts` summed)."""
    return buffer_parts(ctx, cand).value


def _optimizer_on_nvme(cand: Candidates) -> np.ndarray:
    """Where the optimizer states really go to NVMe: offload_optimizer nvme at ZeRO-3 only. ZeRO-1/2 read any
    offload_optimizer device as CPU offload (stage_1_and_2.py ``__init__``: ``if offload_optimizer_config.device !=
    OffloadDeviceEnum.none: self.cpu_offload = True``; no swapper exists there)."""
    return (cand.offload_optimizer == 2) & (cand.stage == 3)


def _optimizer_on_cpu(cand: Candidates) -> np.ndarray:
    """offload_optimizer cpu at any stage, and nvme at ZeRO-1/2 (see :func:`_optimizer_on_nvme`)."""
    return (cand.offload_optimizer == 1) | ((cand.offload_optimizer == 2) & (cand.stage <= 2))


MEASURED_HOST_TENSORS: dict[str, str] = {
    "optimizer swap buffers (pinned)": "pinned NVMe swap buffers (optimizer)",
    "parameter swap buffers (pinned)": "pinned NVMe swap buffers (parameters)",
    "16-bit swap-out buffer (pinned)": "pinned NVMe swap-out buffer (parameters)",
    "gradient partition (grad_partitions_flat_buffer)": "16-bit host copies",
    "fp32 gradients": "fp32 gradients",
    "fp32 master weights": "optimizer states + fp32 master",
    "optimizer states": "optimizer states + fp32 master",
}
"""The host tensors benchmarks/measure_nvme_host.py counts in a DeepSpeed run -> the :func:`host_parts` label they
are priced by ("16-bit parameters in host RAM" is "parameter partition" under CPU and "parameters kept in host RAM
(max_in_cpu)" under NVMe parameter offload). Used by docs/validation.md section 7 and its test."""

MEASURED_NVME_FILES: dict[str, str] = {"optimizer": "optimizer states + fp32 master",
                                       "optimizer gradients": "fp32 gradients", "parameters": "parameter partition"}
"""The swap files DeepSpeed writes (by kind) -> the :func:`nvme_parts` label they are priced by."""


def host_parts(ctx: Context, cand: Candidates, buffers: OffloadBuffers = DEEPSPEED_OFFLOAD_BUFFERS) -> TermParts:
    """Host RAM per node for offloaded states, bytes, by part: GPUs per node x what each rank keeps there (the
    safety factor ``Assumptions.host_buffer_factor`` is applied by the fit, not here).

    CPU optimizer offload (measured, docs/validation.md): fp32 master + optimizer states (K Ψ_t/N_d), the fp32
    gradient partition (4Ψ_t/N_d) and a 16-bit copy (stage_1_and_2.py param_buffer_of_bit16_for_cpu_offload_groups;
    stage 3: grad_partitions_flat_buffer on self.device = cpu) per rank; ZeRO-1/2 also a largest-parameter 16-bit
    staging buffer (temp_grad_buffer_for_cpu_offload).

    NVMe optimizer offload at ZeRO-1/2 is CPU offload (:func:`_optimizer_on_nvme`). At ZeRO-3 (derived from DeepSpeed 0.19.8 and measured on CPU ranks, docs/validation.md
    section "NVMe offload: host RAM"): master + states + fp32 gradients live on NVMe; host RAM keeps
    ``n_ob`` pinned fp32 swap buffers of the largest sub-group partition, ``min(S_sub, Ψ_t/N_d)`` elements
    (optimizer_utils.py ``OptimizerSwapper.__init__`` -> utils.py ``SwapBufferManager``; a sub-group closes at
    the first parameter that takes it to S_sub, so it can exceed S_sub by one parameter's partition, not counted)
    and the 16-bit gradient partition (``grad_partitions_flat_buffer``, as with CPU offload). Not counted: the
    fp32 gradient buffer of the largest sub-group that ``initialize_optimizer_states`` holds only during
    initialisation (``gradient_buffer = torch.zeros(largest_numel)``, dropped by
    ``_optimizer_states_and_gradient_swap_out``: ``.grad = None``; absent in the census after initialisation),
    an init-time peak of at most (4 - w) min(S_sub, Ψ_t/N_d) bytes per rank over the figure, inside the safety
    factor. Below Ψ_t/N_d = S_sub (the default 1e9) the swap buffers are as large as the states and fp32
    gradients they replace (16 B per parameter for Adam): NVMe optimizer offload saves host RAM only beyond it.

    Parameter offload: cpu keeps the rank's 16-bit partition in host RAM; nvme keeps ``min(Ψ/N_d, max_in_cpu)``
    elements of it there (stage3.py ``_create_param_groups_fp16_flat_cpu_memory``), ``n_pb`` pinned swap buffers
    of ``buffer_size`` elements (partitioned_param_swapper.py ``_configure_aio``) and, when some parameters do
    not fit ``max_in_cpu``, a pinned swap-out buffer sized by the full (unpartitioned) parameters of the largest
    sub-group (stage3.py ``reserve_partitioned_swap_space([t.ds_numel ...])``: ``N_d min(S_sub, Ψ/N_d)``
    elements). The paper accounting counts no extras. ``buffers``: DeepSpeed's offload settings (its defaults).
    Activation-checkpoint offload (``TrainingSpec.checkpoint_offload`` with full checkpointing; ALST, Bekman et al.
    arXiv 2506.13996 Sec. 3.3, ArcticTraining ``CheckpointFunctionWithCPUOffload``): each rank's L checkpointed
    layer inputs, L·a_b·(s/p)·b·h bytes (the figure ArcticTraining's own comment gives: "llama 8b at 800k (100k
    effective per gpu) will save 24GB per gpu: ((100_000*4096)*2*32/2**30)").
    """
    paper = ctx.scenario.assumptions.accounting == "paper"
    # fp32 master partition also in fp32 training (measured), except in the paper accounting
    K = (ctx.master_bytes if paper else 4.0) + ctx.optimizer_state_bytes
    x = {"g": float(ctx.gpus_per_node), "Psi_t": ctx.trainable, "Psi": ctx.params, "K": K, "N_d": _n(ctx, cand),
         "w": ctx.weight_bytes, "Psi_max": ctx.largest_module, "n_ob": float(buffers.optimizer_buffer_count),
         "S_sub": float(buffers.sub_group_size), "n_pb": float(buffers.param_buffer_count),
         "B_pb": float(buffers.param_buffer_size), "M_cpu": float(buffers.max_in_cpu)}
    par = cand.offload_param
    opt_cpu, opt_nvme = _optimizer_on_cpu(cand), _optimizer_on_nvme(cand)
    opt = cand.offload_optimizer
    # QLoRA: offload_param moves what ZeRO-3 partitions (Psi_s: the packed 4-bit base only when it is shardable,
    # else the LoRA weights alone; the unpartitioned base stays on the GPU and is not counted here again)
    P = "Psi_s" if ctx.scenario.training.qlora else "Psi"
    x["Psi_s"] = ctx.stage3_partitioned_elements
    spills = x[P] / x["N_d"] > x["M_cpu"]
    t, m = ctx.scenario.training, ctx.scenario.model
    ckpt = []
    if t.checkpoint_offload:
        x.update({"L": float(m.n_layers), "a_b": 4.0 if t.precision == "fp32" else 2.0,
                  "s": float(ctx.scenario.sequence_tokens), "p": cand.sp.astype(np.float64),
                  "b": cand.micro_batch.astype(np.float64), "h": float(m.hidden_size)})
        ckpt.append(("offloaded activation checkpoints", "g*L*a_b*s/p*b*h", cand.checkpointing == 2))
    return term("host_memory", x, [
        ("optimizer states + fp32 master", "g*K*Psi_t/N_d", opt_cpu),
        ("pinned NVMe swap buffers (optimizer)", "g*n_ob*4*min(S_sub, Psi_t/N_d)", opt_nvme),
        ("fp32 gradients", "4*g*Psi_t/N_d", opt_cpu),
        ("16-bit host copies", "g*w*Psi_t/N_d", (opt > 0) & (not paper)),
        ("16-bit staging buffer", "g*Psi_max*w", (opt > 0) & (not paper) & (cand.stage <= 2)),
        ("parameter partition", f"g*{P}*w/N_d", par == 1),
        ("parameters kept in host RAM (max_in_cpu)", f"g*w*min({P}/N_d, M_cpu)", (par == 2) & (not paper)),
        ("pinned NVMe swap buffers (parameters)", "g*n_pb*B_pb*w", par == 2),
        ("pinned NVMe swap-out buffer (parameters)", f"g*w*N_d*min(S_sub, {P}/N_d)",
         (par == 2) & spills & (not paper)),
    ] + ckpt)


def host_and_nvme_bytes(ctx: Context, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """Host RAM per node (:func:`host_parts` summed) and NVMe bytes per node (:func:`nvme_parts` summed).
    Returns (host_bytes_per_node, nvme_bytes_per_node), float arrays."""
    return host_parts(ctx, cand).value, nvme_parts(ctx, cand).value


def nvme_parts(ctx: Context, cand: Candidates) -> TermParts:
    """NVMe bytes per node for offloaded states, by part: GPUs per node x what each rank swaps to its files.

    Optimizer offload to NVMe (ZeRO-3 only; ZeRO-1/2 keep the states in host RAM) writes the fp32 master partition and the optimizer states (K Ψ_t/N_d; swap files
    ``<id>.tensor.swp`` of optimizer_utils.py ``OptimizerStateSwapInfo``) and the fp32 gradient partition
    (4Ψ_t/N_d; ``<id>_gradient_<offset>_<length>.tensor.swp``, ``_swap_out_gradients``). Parameter offload to
    NVMe writes each rank's 16-bit partition (wΨ/N_d) when parameters are partitioned (partition_parameters.py
    ``_partition_param``: ``final_location = nvme``); those later kept in host RAM (max_in_cpu) keep their file.
    The paper accounting counts master + states and the parameter partition only.
    """
    paper = ctx.scenario.assumptions.accounting == "paper"
    K = (ctx.master_bytes if paper else 4.0) + ctx.optimizer_state_bytes
    x = {"g": float(ctx.gpus_per_node), "Psi_t": ctx.trainable, "Psi": ctx.params, "K": K, "N_d": _n(ctx, cand),
         "w": ctx.weight_bytes, "Psi_s": ctx.stage3_partitioned_elements}
    P = "Psi_s" if ctx.scenario.training.qlora else "Psi"  # QLoRA: what ZeRO-3 partitions (host_parts)
    opt_nvme = _optimizer_on_nvme(cand)
    return term("nvme", x, [
        ("optimizer states + fp32 master", "g*K*Psi_t/N_d", opt_nvme),
        ("fp32 gradients", "4*g*Psi_t/N_d", opt_nvme & (not paper)),
        ("parameter partition", f"g*w*{P}/N_d", cand.offload_param == 2),
    ])


def nvme_bytes(ctx: Context, cand: Candidates) -> np.ndarray:
    """NVMe bytes per node for offloaded states (:func:`nvme_parts` summed), float array."""
    return nvme_parts(ctx, cand).value


def overhead_parts(ctx: Context, cand: Candidates, live: np.ndarray) -> TermParts:
    """The GPU runtime outside the tensors, bytes per GPU: the CUDA context, the cuBLAS workspace and the NCCL
    buffers (:func:`zeroplanner.costmodel.gpu_runtime.scenario_runtime_parts`, each with its source), plus the
    caching allocator's slack, ``allocator_fragmentation_fraction`` x ``live`` (the other five terms' bytes). None
    on the engine's CPU ranks (``Assumptions.device = "cpu"``)."""
    a = ctx.scenario.assumptions
    if a.device == "cpu":
        return term("overhead", {"M_live": live}, [("none on CPU ranks", "0*M_live", True)])
    x = {"f": a.allocator_fragmentation_fraction, "M_live": live}
    rows = []
    for (label, value, _source), sym in zip(runtime_parts(ctx), ("C", "W_cublas", "B_nccl")):
        x[sym] = value
        rows.append((label.split(" (")[0], sym, True))
    return term("overhead", x, rows + [("allocator slack", "f*M_live", True)])


def runtime_parts(ctx: Context) -> list[tuple[str, float, str]]:
    """(label, bytes, source) of the CUDA context, cuBLAS workspace and NCCL buffers per GPU of ``ctx``'s cluster."""
    return scenario_runtime(ctx.scenario)


def scenario_runtime(scenario: Scenario) -> list[tuple[str, float, str]]:
    """:func:`runtime_parts` from the scenario alone (no context needed)."""
    from .gpu_runtime import scenario_runtime_parts

    c = scenario.cluster
    return scenario_runtime_parts(c.gpu.name, world_size=c.world_size, nodes=c.nodes,
                                  context_bytes=float(scenario.assumptions.cuda_context_bytes))


def memory_term_parts(ctx: Context, cand: Candidates) -> dict[str, TermParts]:
    """Every per-GPU memory term (keys :data:`TERMS`) and "host_memory", as labelled parts."""
    out = {"parameters": parameter_parts(ctx, cand), "gradients": gradient_parts(ctx, cand),
           "optimizer_states": optimizer_state_parts(ctx, cand), "activations": activation_term(ctx, cand),
           "buffers": buffer_parts(ctx, cand)}
    live = sum(out[k].value for k in ("parameters", "gradients", "optimizer_states", "activations", "buffers"))
    out["overhead"] = overhead_parts(ctx, cand, live)
    out["host_memory"] = host_parts(ctx, cand)
    return out


def memory_terms(ctx: Context, cand: Candidates,
                 parts: dict[str, TermParts] | None = None) -> dict[str, np.ndarray]:
    """All per-GPU terms (keys :data:`TERMS` plus "total"), and "host_per_node", "nvme_per_node", bytes. "total"
    is the sum of every term at its own maximum; the step's peak is :func:`zeroplanner.costmodel.timeline.peak`.
    ``parts``: :func:`memory_term_parts` if already computed."""
    parts = parts if parts is not None else memory_term_parts(ctx, cand)
    terms = {k: parts[k].value for k in TERMS}
    live = sum(terms[k] for k in ("parameters", "gradients", "optimizer_states", "activations", "buffers"))
    terms["total"] = live + terms["overhead"]
    terms["host_per_node"], terms["nvme_per_node"] = parts["host_memory"].value, nvme_bytes(ctx, cand)
    return terms
