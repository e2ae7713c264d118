"""One statement per cost term: what each term is called, how it is drawn, and its formula, written once.

Two things live here, and everything that shows a term reads them (the estimate's ``terms``, explain mode, the
tutorial, the report, the app's charts and the compare view):

- :data:`TERM_INFO`: per term its key, on-screen label, explain-mode title, LaTeX symbol, unit, chart colour,
  words, formula in words and source; :data:`MEMORY_SEGMENTS` and :data:`TIME_SEGMENTS` are the stacked charts'
  segments, bottom to top.
- :class:`TermParts`: a term evaluated over the candidate arrays, as labelled parts. Each part is one arithmetic
  expression over named inputs (``"w*Psi_t/N_d"``) and a condition saying for which candidates it applies. The
  same expression string gives the number (evaluated with numpy, vectorised: this *is* the cost model, see
  ``memory.py``, and for the step time ``compute.py`` and ``evaluate.py`` ``step_terms``), the symbolic LaTeX
  (:func:`latex`, input symbols from :data:`SYMBOLS`) and the LaTeX with the scenario's numbers substituted
  (:func:`latex` with a formatter), so the formula shown can never differ from the formula computed. A quantity
  defined from others (:func:`define`: the exposed forward collectives per micro-step, the GPU's micro-step, ...)
  is an input of the expressions after it, and explain mode shows its formula as a "where" line. Expressions
  allow ``+ - * /``, parentheses, ``min``/``max`` (numpy's elementwise minimum / maximum, any number of
  arguments); a condition (``where``) is a part's: the part is 0 where it does not apply.

Pure Python + numpy; no UI imports.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Literal, NamedTuple

import numpy as np

from .evaluation import field_value

Unit = Literal["bytes", "seconds"]
Category = Literal["memory", "host", "communication", "time"]


# --------------------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TermInfo:
    """How one term is named, drawn and cited. ``label``: the charts' and tables' name; ``title``: explain mode's
    heading; ``symbol``: LaTeX left-hand side; ``colour``: its segment in the stacked charts (None when it is not
    a segment of its own); ``formula``: the formula in words (``Estimate.terms``); ``source``: where it comes from;
    ``field``: where its value is (:data:`TERM_FIELDS`); ``quantity``: a step-time term's expression."""

    key: str
    label: str
    title: str
    symbol: str
    category: Category
    unit: Unit
    colour: str | None
    words: str
    formula: str
    source: str
    field: str
    """Where its value lives: the dotted attribute path on :class:`~.evaluate.Estimate` and, the same path, on
    :class:`~.evaluation.Evaluation` (``"per_gpu_bytes.parameters"``, ``"communication.exposed_seconds_per_step"``)."""
    quantity: str | None = None
    """A step-time term's quantity in :func:`~.evaluate.step_terms` (a :data:`SYMBOLS` name, ``"t_comm"``); None
    for the others."""

    @cached_property
    def name(self) -> str:
        """The lower-case name of ``Estimate.terms`` ("optimizer states")."""
        return self.label.lower()


_INFO = (
    TermInfo("parameters", "Parameters", "Parameters", r"M_{params}", "memory", "bytes", "#4c78a8",
             "Working copy of the weights each GPU holds: all of them below ZeRO-3, its 1/N_d partition "
             "(+ small persistent tensors) at ZeRO-3.",
             "16-bit weights: Ψ·2 (stages 0-2), Ψ·2/N_d + persistent small tensors (stage 3); a QLoRA base: 0.5 B "
             "per 4-bit weight (/N_d at stage 3 only with bnb_4bit_quant_storage = the training dtype) + 0.016 B "
             "of constants", "ZeRO paper Sec. 5; deepspeed/runtime/zero/stage3.py; QLoRA arXiv 2305.14314 Sec. 3",
             field="per_gpu_bytes.parameters"),
    TermInfo("gradients", "Gradients", "Gradients", r"M_{grads}", "memory", "bytes", "#f58518",
             "Gradients each GPU holds at the step's gradient peak: working precision, plus the fp32 copy DeepSpeed "
             "hands to the optimizer; partitioned over N_d from ZeRO-2 (ZeRO-1 as measured).",
             "16-bit gradients Ψ_t·2 (stages 0-1) or Ψ_t·2/N_d (stages 2-3), plus DeepSpeed's fp32 gradient "
             "partition Ψ_t·4/N_d (stages 1-3, no optimizer offload)",
             "deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs (18 = 2+4+4+8)",
             field="per_gpu_bytes.gradients"),
    TermInfo("optimizer_states", "Optimizer states", "Optimizer states", r"M_{opt}", "memory", "bytes", "#e45756",
             "fp32 master weights and optimizer states (Adam: momentum + variance); partitioned over N_d from "
             "ZeRO-1; moved to the host with offload_optimizer.",
             "fp32 master 4·Ψ_t + optimizer states (Adam 8·Ψ_t, SGD 4, 8-bit Adam 2), divided by N_d from stage 1; "
             "0 on GPU with offload_optimizer", "ZeRO paper Sec. 3.1 (K = 12)",
             field="per_gpu_bytes.optimizer_states"),
    TermInfo("activations", "Activations", "Activations", r"M_{act}", "memory", "bytes", "#72b7b2",
             "Tensors saved for backward for one micro-batch, from the architecture; with full checkpointing only "
             "each layer's input plus one layer being recomputed.",
             "saved-for-backward tensors per layer s·b·h·(…) by block, times layers (or layer inputs only with full "
             "checkpointing), plus 16-bit logits and fp32 log-softmax 6·s·b·V, plus the vision tower's blocks "
             "over its images' patches (Qwen-VL, Gemma 3)",
             "Korthikanti et al. arXiv 2205.05198 Eq. 1-2, generalised (zeroplanner/costmodel/activations.py, "
             "vision.py)",
             field="per_gpu_bytes.activations"),
    TermInfo("buffers", "Buffers", "Buffers", r"M_{buf}", "memory", "bytes", "#54a24b",
             "Communication buckets and the ZeRO-3 working set of gathered parameters.",
             "reduce bucket (x2 with overlap_comm); stage 3: gathered live parameters min(max_live, largest module "
             "+ prefetch bucket) + largest module's gradient",
             "deepspeed/runtime/zero/stage_1_and_2.py ipg_buffer; stage3.py prefetch coordinator",
             field="per_gpu_bytes.buffers"),
    TermInfo("overhead", "Overhead", "Overhead", r"M_{ovh}", "memory", "bytes", "#b279a2",
             "CUDA context, cuBLAS workspace and NCCL buffers, plus the caching allocator's slack on the live bytes.",
             "CUDA context + cuBLAS workspace + NCCL buffers + allocator slack × live bytes",
             "pytorch/pytorch#86509 (context), CublasHandlePool.cpp (workspace), NCCL init.cc (buffers), 7 published "
             "reserved/allocated pairs (slack): zeroplanner/costmodel/gpu_runtime.py",
             field="per_gpu_bytes.overhead"),
    TermInfo("host_memory", "Host RAM per node", "Host RAM per node", r"M_{host}", "host", "bytes", None,
             "Host RAM each node needs for what is offloaded, summed over its GPUs (before the safety factor the "
             "fit multiplies it by). With NVMe offload: DeepSpeed's pinned swap buffers and what stays on the CPU.",
             "GPUs per node x per rank: CPU offload: optimizer states + fp32 master, fp32 gradients, 16-bit copies, "
             "the parameter partition; NVMe offload (ZeRO-3): buffer_count pinned fp32 buffers of the largest "
             "sub-group, the 16-bit gradient partition, parameters up to max_in_cpu, the parameter swap buffers",
             "zeroplanner/costmodel/memory.py host_parts; DeepSpeed 0.19.8 swap_tensor/optimizer_utils.py, "
             "partitioned_param_swapper.py, zero/stage3.py and offload_config.py defaults (buffer_count, "
             "buffer_size, max_in_cpu, sub_group_size); measured on CPU ranks (docs/validation.md sections 1, 7)",
             field="per_node_cpu_bytes"),
    TermInfo("communication_volume", "Bytes sent per GPU per step", "Bytes sent per GPU per step", r"V_{comm}",
             "communication", "bytes", None, "Bytes each GPU sends per optimizer step in ring collectives.",
             "all-reduce 2(N_d-1)/N_d x its size, reduce-scatter and all-gather (N_d-1)/N_d x theirs",
             "ZeRO paper (arXiv 1910.02054) Sec. 7: 2Ψ for DP and ZeRO-1/2, 3Ψ for ZeRO-3; what DeepSpeed 0.19.8 "
             "sends (zeroplanner/costmodel/communication.py)",
             field="communication.bytes_per_gpu_per_step"),
    TermInfo("compute", "Compute", "Compute time", r"t_{compute}", "time", "seconds", "#4c78a8",
             "Executed FLOPs of the step at the GEMM rate plus the memory-bound kernels (norms, activations, "
             "eager attention scores, logits) at HBM bandwidth; MFU is the effective rate of the two together.",
             "GA x (tokens per micro-step x executed FLOPs per token / (peak x GEMM fraction) + memory-bound "
             "kernels + QLoRA dequantisation)",
             "PaLM (arXiv 2204.02311) App. B: 6N + 12LHQT FLOPs per token; recompute: Korthikanti et al. "
             "(arXiv 2205.05198) Sec. 5; memory-bound bytes per token counted on real transformers models "
             "(compute.ELEMENTWISE_BYTES_PER_HIDDEN); MFU assumption (Assumptions.mfu); "
             "zeroplanner/costmodel/compute.py COMPUTE_DEFINITIONS",
             field="compute_seconds_per_step", quantity="t_compute"),
    TermInfo("communication", "Exposed communication", "Exposed communication time", r"t_{comm}", "time", "seconds",
             "#e45756",
             "Collective time that compute does not hide: step-boundary collectives, and with overlap_comm only "
             "what exceeds the forward/backward compute of each micro-step plus the fitted overlap_loss of the "
             "overlapped part; Ulysses' all-to-alls and AutoTP's all-reduces in full; and the ZeRO host overhead "
             "(ZeRO-3 module hooks the GPU waits for, ZeRO-2/3 gradient hooks).",
             "step-boundary collectives + GA x (exposed forward/backward collectives + Ulysses all-to-alls + AutoTP "
             "all-reduces) + GA x (ZeRO-3 module hooks beyond the GPU's micro-step + gradient hooks)",
             "alpha-beta ring model (Hockney 1994) with NCCL's latency model (src/graph/tuning.cc) and busbw "
             "(nccl-tests PERFORMANCE.md); overlap as in DeepSpeed stage_1_and_2.py / stage3.py; overlap_loss, "
             "hook costs fitted on measured runs (steptime_constants.FITTED); "
             "zeroplanner/costmodel/communication.py and evaluate.py step_terms",
             field="communication.exposed_seconds_per_step", quantity="t_comm"),
    TermInfo("offload", "Offload", "Exposed offload time", r"t_{offload}", "time", "seconds", None,
             "PCIe traffic to and from the host that compute does not hide (and the checkpoint offload's blocking "
             "copies), the boundary upload, NVMe swapping.",
             "GA x exposed PCIe (the gradient copies DeepSpeed makes, pinned ones behind compute, pageable ones "
             "not; + checkpoint offload) + parameter upload + NVMe",
             "PCIe and NVMe bandwidths from the GPU and cluster specs; the gradient copies of DeepSpeed "
             "stage_1_and_2.py copy_grads_in_partition / stage3.py partition_grads, counted in the engine "
             "(tests/evidence/test_offload_copies.py); the pageable rate fitted on 4 public rows "
             "(steptime_constants.FITTED); zeroplanner/costmodel/evaluate.py step_terms",
             field="offload_seconds_per_step", quantity="t_offload"),
    TermInfo("optimizer", "Optimizer step", "Optimizer step time", r"t_{optimizer}", "time", "seconds", None,
             "The optimizer step: memory-bound on the GPU (roofline), or DeepSpeed CPU-Adam on the host and the fp32 "
             "-> 16-bit copy DeepSpeed makes there after it.",
             "bytes touched / HBM bandwidth (GPU), or Ψ_t/N_d / the rank's CPU-Adam rate + Ψ_t/N_d / its host "
             "conversion rate (offloaded)",
             "GPU: roofline (Williams et al., CACM 2009) with OPTIMIZER_BYTES_TOUCHED; CPU: per-thread DeepSpeedCPUAdam "
             "and conversion rates measured here, one process's rate from DeepSpeed PR #735 (costmodel/offload.py), "
             "or ClusterSpec.cpu_adam_params_per_second measured on your host; zeroplanner/costmodel/evaluate.py "
             "step_terms",
             field="optimizer_seconds_per_step", quantity="t_opt"),
    TermInfo("step", "Step", "Step time", r"t_{step}", "time", "seconds", None,
             "Step time = compute + exposed communication (its collectives and the ZeRO host overhead) + exposed "
             "offload + optimizer step.",
             "compute + exposed collectives + ZeRO host overhead + exposed offload + optimizer step",
             "zeroplanner/costmodel/evaluate.py step_terms",
             field="step_seconds", quantity="t_step"),
)
TERM_INFO: dict[str, TermInfo] = {t.key: t for t in _INFO}
"""Every explained term, by key: the six per-GPU memory terms (``Estimate.per_gpu_bytes``), "host_memory" (bytes
per node), "communication_volume" (bytes each GPU sends per step), and the step-time terms (seconds)."""

MEMORY_TERM_KEYS: tuple[str, ...] = ("parameters", "gradients", "optimizer_states", "activations", "buffers",
                                     "overhead")
"""The per-GPU memory terms, bottom to top in the memory chart."""


@dataclass(frozen=True)
class Segment:
    """One segment of a stacked chart: key, label, colour, and the terms it stacks (their sum)."""

    key: str
    label: str
    colour: str
    terms: tuple[str, ...]


MEMORY_SEGMENTS: tuple[Segment, ...] = tuple(
    Segment(k, TERM_INFO[k].label, TERM_INFO[k].colour or "", (k,)) for k in MEMORY_TERM_KEYS)
"""The memory chart's segments (one per memory term), bottom to top."""
TIME_SEGMENTS: tuple[Segment, ...] = (
    Segment("compute", TERM_INFO["compute"].label, TERM_INFO["compute"].colour or "", ("compute",)),
    Segment("communication", TERM_INFO["communication"].label, TERM_INFO["communication"].colour or "",
            ("communication",)),
    Segment("offload", "Offload + CPU optimizer", "#eeca3b", ("offload", "optimizer")),
)
"""The step-time chart's segments, bottom to top; "offload" stacks the offload time and the optimizer step."""


TERM_FIELDS: dict[str, str] = {k: t.field for k, t in TERM_INFO.items()}
"""Term key -> where its value lives (:attr:`TermInfo.field`): the dotted attribute path on
:class:`~.evaluate.Estimate` and on :class:`~.evaluation.Evaluation` alike."""

TIME_TERM_QUANTITIES: dict[str, str] = {k: t.quantity for k, t in TERM_INFO.items() if t.quantity}
"""Step-time term key -> its quantity in :func:`~.evaluate.step_terms` (:attr:`TermInfo.quantity`)."""


def term_value(values: object, key: str):
    """The value of term ``key`` in an :class:`~.evaluate.Estimate` or an :class:`~.evaluation.Evaluation`
    (arrays over its candidates; scalars at one, :meth:`~.evaluation.Evaluation.at`), by :data:`TERM_FIELDS`."""
    return field_value(values, TERM_FIELDS[key])


def estimate_value(estimate: object, key: str) -> float:
    """The value of term ``key`` in an :class:`~.evaluate.Estimate` (bytes or seconds), or in one candidate's
    :class:`~.evaluation.Evaluation`, as a float."""
    return float(term_value(estimate, key))


def segment_value(estimate: object, segment: Segment) -> float:
    """A chart segment's value in an :class:`~.evaluate.Estimate`: the sum of its terms."""
    return sum(estimate_value(estimate, k) for k in segment.terms)


# --------------------------------------------------------------------------------------------------------------
# Input symbols
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Symbol:
    """An input of a formula: its LaTeX, unit and meaning."""

    latex: str
    unit: str
    meaning: str


SYMBOLS: dict[str, Symbol] = {
    "Psi": Symbol(r"\Psi", "parameters", "parameters of the model (per tensor-parallel rank)"),
    "Psi_t": Symbol(r"\Psi_t", "parameters", "trainable parameters"),
    "Psi_f": Symbol(r"\Psi_f", "parameters", "frozen parameters (LoRA base)"),
    "Psi_persist": Symbol(r"\Psi_{pers}", "parameters",
                          "stage-3 persistent parameters (below stage3_param_persistence_threshold)"),
    "Psi_max": Symbol(r"\Psi_{max}", "parameters", "parameters of the largest module"),
    "N_d": Symbol(r"N_d", "GPUs", "data-parallel degree (GPUs that share the ZeRO partitions)"),
    "w": Symbol(r"w", "bytes/parameter", "bytes per working-precision element"),
    "w_f": Symbol(r"w_f", "bytes/parameter", "bytes per frozen-base element (QLoRA: one 4-bit code, 0.5)"),
    "Psi_q": Symbol(r"\Psi_q", "parameters", "QLoRA base weights stored in 4 bits (the nn.Linear weights)"),
    "c_q": Symbol(r"c_q", "bytes/parameter",
                  "QLoRA quantisation constants per 4-bit weight (absmax per 64, double quantisation: 0.127 bits)"),
    "Psi_s": Symbol(r"\Psi_s", "elements",
                    "elements ZeRO-3 partitions, in working-dtype elements (QLoRA: LoRA weights, plus the packed "
                    "4-bit base when bnb_4bit_quant_storage is the training dtype)"),
    "Psi_dq": Symbol(r"\Psi_{dq}", "parameters", "largest 4-bit weight, dequantised to 16 bits for its matmul"),
    "m": Symbol(r"m", "bytes/parameter", "bytes per parameter of fp32 master weights"),
    "k": Symbol(r"k", "bytes/parameter", "bytes per parameter of optimizer states"),
    "K": Symbol(r"K", "bytes/parameter", "bytes per parameter of fp32 master weights + optimizer states"),
    "hpz": Symbol(r"h_{pz}", "GPUs", "zero_hpz_partition_size"),
    "L": Symbol(r"L", "layers", "layers"),
    "s": Symbol(r"s", "tokens", "sequence length (plus image tokens for vision-language models)"),
    "b": Symbol(r"b", "sequences", "micro-batch"),
    "h": Symbol(r"h", "elements", "hidden size"),
    "V": Symbol(r"V", "tokens", "vocabulary"),
    "a_b": Symbol(r"a", "bytes/element", "bytes per activation element"),
    "n_b": Symbol(r"a_n", "bytes/element", "bytes per element of the final norm's output (4: Gemma keeps it in fp32)"),
    "d_head": Symbol(r"d_{head}", "elements", "attention head dimension"),
    "d_rot": Symbol(r"d_{rot}", "elements",
                    "rotated width of the rotary tables (head dim x partial_rotary_factor; + Gemma 4's global "
                    "head dim)"),
    "r_b": Symbol(r"a_r", "bytes/element", "bytes per element of the rotary cos/sin tables (4: OLMo 2 keeps fp32)"),
    "layer": Symbol(r"A_{layer}", "bytes", "bytes one layer saves for backward (activations.layer_activation_bytes)"),
    "vision": Symbol(r"A_{vision}", "bytes", "bytes the vision tower saves for backward for the micro-batch's "
                     "images (costmodel/vision.py vision_activation_bytes)"),
    "t": Symbol(r"t", "GPUs", "tensor-parallel degree"),
    "p": Symbol(r"p", "GPUs", "Ulysses sequence-parallel degree (sequence_parallel_size; each GPU holds s/p tokens)"),
    "s_c": Symbol(r"s_c", "tokens", "tokens of one tiled-loss chunk (activations.loss_chunk_tokens)"),
    "A_tile": Symbol(r"A_{tile}", "bytes", "one TiledMLP tile's MLP intermediates (activations.tiled_mlp_tile_bytes)"),
    "t_V": Symbol(r"t_V", "GPUs", "vocabulary split of the logits per GPU: t with a tied (vocab-parallel) AutoTP "
                  "head, 1 with an untied one (AutoTP gathers its logits)"),
    "B": Symbol(r"B", "elements", "reduce bucket, elements (reduce_bucket_size)"),
    "B_ar": Symbol(r"B_{ar}", "elements", "stage-0 all-reduce bucket (DeepSpeed MEMORY_OPT_ALLREDUCE_SIZE)"),
    "o": Symbol(r"o", "x", "2 with overlap_comm (double buffering), else 1"),
    "B_live": Symbol(r"B_{live}", "elements", "stage3_max_live_parameters"),
    "B_pf": Symbol(r"B_{pf}", "elements", "stage3_prefetch_bucket_size"),
    "kept": Symbol(r"R", "parameters",
                   "parameters kept gathered from forward into backward: min(B_live, stage3_max_reuse_distance, Ψ)"),
    "C": Symbol(r"C", "bytes", "CUDA context (Assumptions.cuda_context_bytes)"),
    "W_cublas": Symbol(r"W_{cuBLAS}", "bytes", "cuBLAS workspace (PyTorch's default for the GPU generation)"),
    "B_nccl": Symbol(r"B_{NCCL}", "bytes", "NCCL buffers of one communicator (ring, upper bound)"),
    "f": Symbol(r"f", "fraction", "caching-allocator slack: reserved but unallocated, per live byte"),
    "M_live": Symbol(r"M_{live}", "bytes", "the other five terms together"),
    "g": Symbol(r"g", "GPUs", "GPUs per node"),
    "n_ob": Symbol(r"n_{ob}", "buffers", "offload_optimizer buffer_count (pinned fp32 NVMe swap buffers of the "
                   "largest sub-group)"),
    "S_sub": Symbol(r"S_{sub}", "parameters", "sub_group_size"),
    "n_pb": Symbol(r"n_{pb}", "buffers", "offload_param buffer_count"),
    "B_pb": Symbol(r"B_{pb}", "elements", "offload_param buffer_size"),
    "M_cpu": Symbol(r"M_{cpu}", "elements", "offload_param max_in_cpu (16-bit parameter elements kept in host RAM "
                    "per rank under NVMe parameter offload)"),
    "S_ar": Symbol(r"S_{ar}", "bytes", "data-parallel all-reduce message bytes per step"),
    "S_rs": Symbol(r"S_{rs}", "bytes", "data-parallel reduce-scatter message bytes per step"),
    "S_ag": Symbol(r"S_{ag}", "bytes", "data-parallel all-gather message bytes per step"),
    "S_a2a": Symbol(r"S_{a2a}", "bytes", "Ulysses all-to-all message bytes per step (communication.ulysses_terms)"),
    "S_pos": Symbol(r"S_{pos}", "bytes", "Ulysses position_ids bytes each rank contributes per micro-step (b s/p x 8)"),
    "S_tar": Symbol(r"S^{TP}_{ar}", "bytes", "AutoTP all-reduce message bytes per micro-step "
                    "(communication.autotp_terms)"),
    "S_tag": Symbol(r"S^{TP}_{ag}", "bytes", "AutoTP logits all-gather message bytes per micro-step"),
    # ---- step time (costmodel/compute.py compute_terms, costmodel/evaluate.py step_terms): seconds unless noted
    "GA": Symbol(r"GA", "micro-steps", "gradient accumulation steps (micro-steps per optimizer step)"),
    "n_tok": Symbol(r"n_{tok}", "tokens", "tokens each GPU computes per micro-step: b x s / p (s incl. image tokens)"),
    "F_model": Symbol(r"F_{model}", "FLOP/token",
                      "model FLOPs per token per GPU: 6N + 12 L H Q T (frozen LoRA/QLoRA weights 4N) + the vision "
                      "tower's (PaLM arXiv 2204.02311 App. B; compute.flops_per_token)"),
    "F_rec": Symbol(r"F_{rec}", "FLOP/token",
                    "recomputed FLOPs per token: full checkpointing one forward, selective the attention core, "
                    "TiledMLP the MLP forward (Korthikanti et al. arXiv 2205.05198 Sec. 5)"),
    "F_vrec": Symbol(r"F_{rec,vis}", "FLOP/token", "the vision tower's recomputed forward per token (full "
                     "checkpointing of a trained tower; compute.vision_flops_per_token)"),
    "F_x": Symbol(r"F_{exec}", "FLOP/token", "executed FLOPs per token per GPU (model + recompute)"),
    "F_fwd": Symbol(r"F_{fwd}", "FLOP/token", "forward FLOPs per token per GPU (2N + 4 L H Q T, + the vision tower's)"),
    "P_peak": Symbol(r"P_{peak}", "FLOP/s", "dense peak of the GPU in the training precision"),
    "eta": Symbol(r"\eta", "fraction", "fraction of the dense peak the GEMMs reach (compute.achieved_fraction; "
                  "Assumptions.mfu when fixed)"),
    "t_mem": Symbol(r"t_{mem}", "s", "memory-bound kernels (norms, activations, eager attention scores, logits) per "
                    "micro-step: bytes / HBM bandwidth (compute.memory_bound_seconds_micro; 0 with a fixed MFU)"),
    "t_memf": Symbol(r"t_{mem,fwd}", "s", "the forward's share of the memory-bound kernels per micro-step"),
    "t_dq": Symbol(r"t_{dq}", "s", "QLoRA dequantisation per micro-step: (2 + full recompute) x Psi_f x 4.5 B / HBM "
                   "bandwidth (compute.qlora_dequant_seconds_micro)"),
    "t_micro": Symbol(r"t_{micro}", "s", "compute of one micro-step (forward + backward + recompute + dequantisation)"),
    "t_cf": Symbol(r"t^{comp}_{fwd}", "s", "forward compute of one micro-step"),
    "t_cb": Symbol(r"t^{comp}_{bwd}", "s", "backward compute of one micro-step (incl. recompute and the backward's "
                   "share of dequantisation)"),
    "t_compute": Symbol(r"t_{compute}", "s", "compute time per optimizer step"),
    "lam": Symbol(r"\lambda", "fraction", "overlap_loss: fraction of the shorter of communication and compute that "
                  "overlapping does not hide (fitted once, steptime_constants.FITTED)"),
    "t_gf": Symbol(r"t^{comm}_{fwd}", "s", "ZeRO-3 forward all-gathers per micro-step (communication.py ring model)"),
    "t_gb": Symbol(r"t^{comm}_{bwd}", "s", "ZeRO-3 backward all-gathers + gradient reduce-scatters per micro-step"),
    "t_rd": Symbol(r"t^{comm}_{red}", "s", "ZeRO-1/2 gradient reduction inside backward per micro-step (ZeRO-2; "
                   "ZeRO-1 with overlap_comm)"),
    "t_bnd": Symbol(r"t_{boundary}", "s", "collectives at the step boundary: stage-0 all-reduce, ZeRO-1 reduction "
                    "without overlap_comm, ZeRO-1/2 parameter all-gather, ZeRO-3 persistent-parameter all-gathers"),
    "t_a2a": Symbol(r"t_{a2a}", "s", "Ulysses all-to-alls and position_ids all-gathers per micro-step, serial with "
                    "compute (communication.ulysses_terms)"),
    "t_tp": Symbol(r"t_{TP}", "s", "AutoTP's per-layer all-reduces per micro-step, serial with compute "
                   "(communication.autotp_terms)"),
    "e_f": Symbol(r"e_{fwd}", "s", "forward collectives per micro-step that compute does not hide"),
    "e_b": Symbol(r"e_{bwd}", "s", "backward collectives per micro-step that compute does not hide"),
    "t_c": Symbol(r"t^{comp}", "s", "GPU compute per micro-step that PCIe traffic overlaps: forward + backward + "
                  "QLoRA dequantisation (t_dq is also inside the backward)"),
    "w_g": Symbol(r"w_g", "bytes/parameter", "bytes per gradient element as sent to the host"),
    "BW_pcie": Symbol(r"BW_{PCIe}", "bytes/s", "PCIe bandwidth of one GPU"),
    "BW_nvme": Symbol(r"BW_{NVMe}", "bytes/s", "NVMe bandwidth of one node (ClusterSpec.nvme_gb_per_s)"),
    "BW_HBM": Symbol(r"BW_{HBM}", "bytes/s", "HBM bandwidth of one GPU"),
    "beta": Symbol(r"\beta", "bytes/parameter", "HBM bytes the optimizer step touches per parameter "
                   "(context.OPTIMIZER_BYTES_TOUCHED; 16 in pure fp32)"),
    "R_cpu": Symbol(r"R_{cpu}", "parameters/s", "DeepSpeed CPU-Adam parameter updates per second of one rank "
                    "(offload.cpu_adam_params_per_second_per_rank: its threads x the per-thread rate measured here, "
                    "up to one process's published rate; or ClusterSpec.cpu_adam_params_per_second / g)"),
    "R_cv": Symbol(r"R_{conv}", "parameters/s", "fp32 -> 16-bit host conversion per second of one rank after the "
                   "offloaded step (offload.host_conversion_per_second_per_rank: threads x the rate measured here)"),
    "BW_pg": Symbol(r"BW_{pageable}", "bytes/s", "host<->device rate of copies from pageable (not pinned) memory "
                    "(fitted once, steptime_constants.FITTED pageable_copy_gb_per_s)"),
    "t_gh": Symbol(r"t_{grad\to host}", "s", "optimizer offload's gradient copies made every micro-step (ZeRO-2 "
                   "with accumulation, ZeRO-3; tests/evidence/test_offload_copies.py counts them in the engine)"),
    "t_b32": Symbol(r"t_{fp32\,grad}", "s", "optimizer offload's copy of the fp32 gradient partition to the host, "
                    "once per step at the boundary"),
    "e_b32": Symbol(r"e_{fp32\,grad}", "s", "the boundary's fp32 gradient copy that the last backward does not "
                    "hide"),
    "t_pcie": Symbol(r"t_{PCIe}", "s", "pinned PCIe traffic per micro-step: the gradient copies (optimizer "
                     "offload), parameters from the host for forward and backward (parameter offload)"),
    "t_pg": Symbol(r"t_{pageable}", "s", "PCIe traffic per micro-step from pageable memory (pin_memory false): "
                   "synchronous with the host, not overlapped"),
    "e_p": Symbol(r"e_{PCIe}", "s", "PCIe traffic per micro-step that compute does not hide"),
    "A_ck": Symbol(r"A_{ckpt}", "bytes", "activation checkpoints copied to the host and back per micro-step "
                   "(ALST checkpoint offload; activations.checkpoint_offload_bytes_per_micro)"),
    "t_ck": Symbol(r"t_{ckpt}", "s", "blocking PCIe copies of the checkpoint offload per micro-step"),
    "t_gpu": Symbol(r"t_{GPU}", "s", "the GPU's own work per micro-step (compute + exposed traffic)"),
    "c_f": Symbol(r"c_{fetch}", "s", "host time per ZeRO-3 module hook (fitted once, steptime_constants.FITTED)"),
    "n_mod": Symbol(r"n_{mod}", "modules", "modules that own parameters (each runs ZeRO-3's hooks in forward and "
                    "in backward)"),
    "e_fe": Symbol(r"e_{fetch}", "s", "ZeRO-3 host time per micro-step the GPU waits for (beyond its own work)"),
    "c_h": Symbol(r"c_{hook}", "s", "host time per trainable tensor's ZeRO-2/3 gradient hook (fitted once, "
                  "steptime_constants.FITTED)"),
    "n_t": Symbol(r"n_{tensors}", "tensors", "trainable parameter tensors (one gradient hook each)"),
    "t_hk": Symbol(r"t_{hook}", "s", "ZeRO-2/3 gradient-hook host time per micro-step, serial with backward"),
    "t_coll": Symbol(r"t_{coll}", "s", "exposed collectives per optimizer step"),
    "t_host": Symbol(r"t_{host}", "s", "ZeRO host overhead per optimizer step (module hooks + gradient hooks)"),
    "t_comm": Symbol(r"t_{comm}", "s", "exposed communication per optimizer step (collectives + ZeRO host overhead)"),
    "t_nvme": Symbol(r"t_{NVMe}", "s", "NVMe swapping per optimizer step"),
    "t_offload": Symbol(r"t_{offload}", "s", "exposed offload traffic per optimizer step"),
    "t_opt": Symbol(r"t_{optimizer}", "s", "optimizer step"),
    "t_step": Symbol(r"t_{step}", "s", "step time"),
    "t_fetch": Symbol(r"t_{fetch}", "s", "ZeRO-3 module-hook host time per step the GPU waits for"),
    "t_hooks": Symbol(r"t_{hooks}", "s", "ZeRO-2/3 gradient-hook host time per step"),
    "t_sp": Symbol(r"t_{SP}", "s", "Ulysses all-to-alls per step"),
    "t_ckpt": Symbol(r"t_{ckpt,step}", "s", "checkpoint-offload PCIe time per step"),
}
"""Input name (as written in the part expressions) -> LaTeX, unit and meaning. Units: "s" is seconds; the step-time
quantities defined from others are listed too (a formula that uses one shows its value, and explain mode its own
formula)."""


# --------------------------------------------------------------------------------------------------------------
# Terms as labelled parts
# --------------------------------------------------------------------------------------------------------------
class PartValue(NamedTuple):
    """One labelled part of a term: its expression, where it applies (bool, an array or one for all candidates)
    and its value (float array, 0 where it does not apply); ``zero``: it applies to no candidate, so its value is
    all zeros (:func:`term` sets it; a sum may skip the part). A named tuple: built for every part of every term at
    every evaluate, it must be cheap."""

    label: str
    expr: str
    applies: np.ndarray
    value: np.ndarray
    zero: bool = False


def _sum(parts: Sequence[PartValue], labels: Sequence[str] | None = None) -> np.ndarray | None:
    """The values of ``parts`` (those with ``labels``, or all) added in order; a part that applies to no candidate
    (``zero``, all zeros) is added only where the sum does not already have its shape. Adding +0.0 changes no
    value but -0.0 (to +0.0), so the sum is the sum with every part added except where every other part is -0.0:
    there it stays -0.0 (no term of the cost model is: its parts are bytes, seconds and counts, and the evaluate
    golden stores the sign of every zero). None when no part is chosen. The result may be a part's own array."""
    total = None
    zeros = []
    for p in parts:
        if labels is not None and p.label not in labels:
            continue
        if p.zero:
            zeros.append(p.value)
        else:
            total = p.value if total is None else total + p.value
    if total is None:
        if not zeros:
            return None
        total, zeros = zeros[0], zeros[1:]
    for z in zeros:
        if z.shape != np.shape(total):
            total = total + z
    return total


@dataclass(frozen=True)
class TermParts:
    """A term over the candidate arrays: its inputs (name -> scalar or array) and its labelled parts; ``value`` is
    their sum (computed once, when the term is made: every term's value is read at least once per evaluate)."""

    key: str
    inputs: Mapping[str, object]
    parts: tuple[PartValue, ...]
    value: np.ndarray = field(init=False, repr=False, compare=False)
    """The parts' sum, in their order (:func:`_sum`: a part that applies to no candidate is not added). It may be
    the same array as a part's value, and that as an input's (an expression that is one name): never modified in
    place."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _sum(self.parts))

    def sum_of(self, labels: Sequence[str]) -> np.ndarray:
        """The sum of the parts with these labels (0 where none applies), shaped like :attr:`value`; as :func:`_sum`,
        it may be a part's own array (never modified in place)."""
        value = self.value
        total = _sum(self.parts, labels)
        if total is not None and np.shape(total) == value.shape:
            return total
        zeros = np.zeros(value.shape, dtype=value.dtype)  # np.zeros_like's result, a fifth of its call time
        return zeros if total is None else total + zeros


_FUNCTIONS = frozenset({"min", "max"})


@cache
def _parsed(expr: str):
    """The checked syntax tree of a term expression; raises ValueError for anything but ``+ - * /``, number
    constants, :data:`SYMBOLS` names and calls of ``min``/``max`` with arguments."""
    tree = ast.parse(expr, mode="eval")
    nodes = list(ast.walk(tree))  # walked once: the checks below read the same nodes in the same order
    called = set()
    for node in nodes:
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords):
                raise ValueError(f"only min() and max() may be called in a term expression: {expr!r}")
            called.add(id(node.func))
    for node in nodes:
        if isinstance(node, ast.Name) and node.id not in SYMBOLS and id(node) not in called:
            raise ValueError(f"unknown input {node.id!r} in term expression {expr!r}; add it to SYMBOLS")
    for node in nodes:
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"{type(node).__name__} is not allowed in a term expression: {expr!r}")
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool)
                                               or not isinstance(node.value, (int, float))):
            raise ValueError(f"only number constants are allowed in a term expression: {expr!r}")
        if isinstance(node, ast.Call) and not node.args:
            raise ValueError(f"min() and max() need arguments: {expr!r}")
    return tree


_ALLOWED = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Name, ast.Load, ast.Constant,
            ast.Call)


_FUNCTIONS = {"max": np.maximum, "min": np.minimum}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@cache
def _evaluator(expr: str) -> Callable[[Mapping[str, object]], object]:
    """``expr`` as one Python function of the inputs mapping, built once from its checked syntax tree
    (:func:`_parsed`: only ``+ - * /``, number constants, :data:`SYMBOLS` names and ``min``/``max`` get here) as
    nested closures: each name reads ``x["name"]``, each operator applies :mod:`operator`'s function,
    ``max(a, b, c)`` is ``np.maximum(np.maximum(a, b), c)`` (``min`` likewise). Nothing is compiled or evaluated
    from text (tests/server/test_security.py forbids ``eval``/``compile`` in the package). The same operators in
    the same order as the expression, so the result is what plain numpy arithmetic written the same way gives, bit
    for bit."""

    def build(node) -> Callable[[Mapping[str, object]], object]:
        if isinstance(node, ast.Name):
            name = node.id
            return lambda x: x[name]
        if isinstance(node, ast.Constant):
            value = node.value
            return lambda x: value
        if isinstance(node, ast.BinOp):
            op = _OPERATORS[type(node.op)]
            # a name or number operand is read in place rather than through a closure of its own (half the calls
            # of an evaluation); the same operation on the same operands in the same order either way
            ln, rn = node.left, node.right
            if isinstance(ln, ast.Name) and isinstance(rn, ast.Name):
                a, b = ln.id, rn.id
                return lambda x: op(x[a], x[b])
            if isinstance(ln, ast.Name) and isinstance(rn, ast.Constant):
                a, c = ln.id, rn.value
                return lambda x: op(x[a], c)
            if isinstance(ln, ast.Constant) and isinstance(rn, ast.Name):
                c, b = ln.value, rn.id
                return lambda x: op(c, x[b])
            left, right = build(ln), build(rn)
            if isinstance(rn, ast.Name):
                b = rn.id
                return lambda x: op(left(x), x[b])
            if isinstance(ln, ast.Name):
                a = ln.id
                return lambda x: op(x[a], right(x))
            return lambda x: op(left(x), right(x))
        f = _FUNCTIONS[node.func.id]  # ast.Call of min / max (checked)
        out = build(node.args[0])  # max(a) is a
        for arg in node.args[1:]:
            out = (lambda g, h: lambda x: f(g(x), h(x)))(out, build(arg))
        return out

    return build(_parsed(expr).body)


def evaluate_expr(expr: str, inputs: Mapping[str, object]) -> np.ndarray:
    """The value of ``expr`` (``+ - * /``, parentheses, ``min``/``max``, input names) for ``inputs``: each
    operator applied as Python applies it, so numpy arrays broadcast.

    >>> float(evaluate_expr("w*min(B_ar, Psi_t)", {"w": 2.0, "B_ar": 5e8, "Psi_t": 1e6}))
    2000000.0
    """
    return _evaluator(expr)(inputs)


_ALL = np.asarray(True)

_COPYTO_FROM = 4096
"""Elements of a part's condition from which :func:`term` zeroes the part with :func:`where_zero` instead of
np.where (np.where's per-element select cost 3-10x a masked copy on a sweep's arrays: 292 against 17 us on 79,092
elements with a random mask; on a plan's few hundred candidates the one call is cheaper than two:
benchmarks/bench_costmodel.py)."""


def where_zero(applies: np.ndarray, value) -> np.ndarray:
    """``np.where(applies, value, 0.0)``, the same array bit for bit (dtype: ``np.result_type(value, 0.0)``,
    np.where's; float64 for the cost model's int and float64 values): zeros with ``value`` copied in where
    ``applies`` holds (np.copyto). :func:`term` calls it from :data:`_COPYTO_FROM` elements and np.where below."""
    out = np.zeros(np.broadcast_shapes(applies.shape, np.shape(value)), dtype=np.result_type(value, 0.0))
    np.copyto(out, value, where=applies)
    return out


def term(key: str, inputs: Mapping[str, object], parts: Sequence[tuple[str, str, object]], *,
         shared: bool = False) -> TermParts:
    """Build a :class:`TermParts` from (label, expression, condition) rows; ``condition`` is a bool (array) or
    True. Each part is 0 where its condition is False. ``shared``: keep ``inputs`` itself (a dict the caller goes
    on adding to, :func:`define`) instead of a copy."""
    out = []
    for label, expr, when in parts:
        if when is True:  # applies to every candidate: np.where(True, x, 0.0) is x as float64, without the select
            out.append(PartValue(label, expr, _ALL, np.asarray(_evaluator(expr)(inputs), dtype=np.float64)))
            continue
        applies = np.asarray(when, dtype=bool)
        count = np.count_nonzero(applies) if applies.ndim else -1
        if not count:
            # applies to no candidate: np.where(applies, x, 0.0) is 0.0 everywhere whatever x is, so x is not
            # computed (half the parts of a one-candidate evaluate). The zeros have the condition's shape: the
            # candidates' (Candidates.build broadcasts them), or with sparse candidates the axes the condition
            # depends on, which the sum broadcasts like np.where's (tests/core/test_evaluation.py and
            # test_sparse_candidates.py compare every value with the expressions all computed)
            out.append(PartValue(label, expr, applies, np.zeros(applies.shape), True))
            continue
        value = _evaluator(expr)(inputs)
        if count == applies.size and type(value) is np.ndarray and value.dtype == np.float64 \
                and value.shape == applies.shape:
            # applies to every candidate: np.where would copy the value as it is (one estimate's every part)
            out.append(PartValue(label, expr, applies, value))
            continue
        out.append(PartValue(label, expr, applies, np.where(applies, value, 0.0) if applies.size < _COPYTO_FROM
                             else where_zero(applies, value)))
    return TermParts(key, inputs if shared else dict(inputs), tuple(out))


def define(env: dict[str, object], key: str, parts: Sequence[tuple[str, str, object]]) -> TermParts:
    """A quantity defined from others: :func:`term` over ``env`` (the inputs and every quantity defined before
    it), its value (the parts' sum) stored as ``env[key]`` so the definitions after it can use ``key`` as an input.
    ``key`` must be a :data:`SYMBOLS` name. Returns the quantity's :class:`TermParts` (its ``inputs`` is ``env``).

    >>> env = {"GA": 4.0, "t_cf": 0.5, "t_gf": 0.75, "lam": 0.2}
    >>> tp = define(env, "e_f", [("overlapped", "max(0, t_gf - t_cf) + lam*min(t_gf, t_cf)", True)])
    >>> float(env["e_f"]), float(define(env, "t_coll", [("micro-steps", "GA*e_f", True)]).value)
    (0.35, 1.4)
    """
    if key not in SYMBOLS:
        raise ValueError(f"unknown quantity {key!r}; add it to SYMBOLS")
    tp = term(key, env, parts, shared=True)
    env[key] = tp.value
    return tp


ZeroTest = Callable[[str], bool]
"""Says whether an input is exactly 0 at the candidate shown (see :func:`latex`'s ``zero``)."""


def _pruned(node, zero: ZeroTest):
    """``node`` without the addends that are exactly 0 (an input that is 0, or a product or quotient of one);
    None when all of ``node`` is such a 0. The value is unchanged (x + 0 = x); functions are kept (max(0, a - b)
    stays even where it is 0: that is the lesson of overlap), and so is a call argument that is 0."""
    if isinstance(node, ast.Name):
        return None if zero(node.id) else node
    if isinstance(node, ast.BinOp):
        lhs, rhs = _pruned(node.left, zero), _pruned(node.right, zero)
        if isinstance(node.op, ast.Add):
            if lhs is None or rhs is None:
                return rhs if lhs is None else lhs
        elif isinstance(node.op, ast.Sub):
            if rhs is None:
                return lhs
        elif isinstance(node.op, ast.Mult):
            if lhs is None or rhs is None:
                return None
        elif lhs is None:  # 0 / x
            return None
        return ast.BinOp(left=lhs or node.left, op=node.op, right=rhs or node.right)
    if isinstance(node, ast.Call):
        return ast.Call(func=node.func, args=[_pruned(a, zero) or a for a in node.args], keywords=[])
    return node


def _shown(expr: str, zero: ZeroTest | None):
    """The body of ``expr`` as displayed: pruned of its zero addends when ``zero`` is given (all of it when all of
    it is 0)."""
    body = _parsed(expr).body
    if zero is None:
        return body
    pruned = _pruned(body, zero)
    return body if pruned is None else pruned


def _names_in_order(node) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id] if node.id in SYMBOLS else []
    if isinstance(node, ast.BinOp):
        return _names_in_order(node.left) + _names_in_order(node.right)
    if isinstance(node, ast.Call):
        return [n for a in node.args for n in _names_in_order(a)]
    return []


def input_names(expr: str, zero: ZeroTest | None = None) -> list[str]:
    """The input names of ``expr`` (as displayed, with ``zero``: see :func:`latex`), in order of first appearance.

    >>> input_names("t_bnd + GA*(e_f + e_b + t_tp)", zero=lambda n: n in ("e_f", "t_tp"))
    ['t_bnd', 'GA', 'e_b']
    """
    return list(dict.fromkeys(_names_in_order(_shown(expr, zero))))


def is_sum(expr: str, zero: ZeroTest | None = None) -> bool:
    """Whether ``expr`` (as displayed, with ``zero``) is a sum or difference at its top level."""
    body = _shown(expr, zero)
    return isinstance(body, ast.BinOp) and isinstance(body.op, (ast.Add, ast.Sub))


_PREC = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2}


def latex(expr: str, value: Callable[[str], str] | None = None, zero: ZeroTest | None = None) -> str:
    r"""``expr`` in LaTeX: with the symbols of :data:`SYMBOLS` (``value`` None), or with ``value(name)`` for each
    input (the numbers substituted; products then use ``\times``). ``zero(name)``: whether an input is exactly 0
    at the candidate shown; its addends are then left out (:func:`_pruned`: the value is the same), so the formula
    shows what applies, as the parts' conditions do.

    >>> print(latex("w*Psi_persist*(1-1/N_d)"))
    w\Psi_{pers}(1-1/N_d)
    >>> print(latex("w*Psi_t/N_d", {"w": "2", "Psi_t": "7", "N_d": "8"}.get))
    2\times7/8
    >>> print(latex("max(0, t_gb + t_rd - t_cb) + lam*min(t_gb + t_rd, t_cb)", zero=lambda n: n == "t_gb"))
    \max(0,t^{comm}_{red}-t^{comp}_{bwd}) + \lambda\min(t^{comm}_{red},t^{comp}_{bwd})
    """
    numbers = value is not None

    def name(n: str) -> str:
        return value(n) if numbers else SYMBOLS[n].latex

    def go(node, parent: ast.operator | None = None, right: bool = False, spaced: bool = True) -> str:
        """``node`` as LaTeX; ``parent``: the operator of the enclosing product/sum, ``right``: whether ``node`` is
        its right operand, ``spaced``: whether a sum here is written with spaces (top level)."""
        if isinstance(node, ast.Expression):
            return go(node.body)
        if isinstance(node, ast.Name):
            text = name(node.id)
            # a substituted a x 10^k divides as one number: 1/(2.04\times10^{12}), not 1/2.04\times10^{12}
            if numbers and right and isinstance(parent, ast.Div) and r"\times" in text:
                return f"({text})"
            return text
        if isinstance(node, ast.Constant):
            x = node.value
            return str(int(x)) if float(x).is_integer() else f"{x:g}"
        if isinstance(node, ast.Call):
            return rf"\{node.func.id}(" + ",".join(go(a, spaced=False) for a in node.args) + ")"
        if isinstance(node, ast.BinOp):
            prec = _PREC[type(node.op)]
            outer = _PREC[type(parent)] if parent is not None else 0
            wrap = prec < outer or (right and prec == outer and isinstance(parent, (ast.Sub, ast.Div)))
            spaced = spaced and not wrap and outer <= 1
            lhs = go(node.left, node.op, False, spaced)
            rhs = go(node.right, node.op, True, spaced)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                sign = "+" if isinstance(node.op, ast.Add) else "-"
                text = f"{lhs} {sign} {rhs}" if spaced else f"{lhs}{sign}{rhs}"
            elif isinstance(node.op, ast.Div):
                text = f"{lhs}/{rhs}"
            elif numbers:
                text = rf"{lhs}\times{rhs}"
            else:
                text = lhs + ("" if rhs[0] in "\\(" else r"\,") + rhs
            return f"({text})" if wrap else text
        raise ValueError(f"unsupported expression node {type(node).__name__}")

    return go(_shown(expr, zero))
