"""One statement per cost term: what each term is called, how it is drawn, and its formula, written once.

Two things live here, and everything that shows a term reads them (the estimate's ``terms``, explain mode, the
tutorial, the report, the app's charts and the compare view):

- :data:`TERM_INFO`: per term its key, on-screen label, explain-mode title, LaTeX symbol, unit, chart colour,
  words, formula in words and source; :data:`MEMORY_SEGMENTS` and :data:`TIME_SEGMENTS` are the stacked charts'
  segments, bottom to top.
- :class:`TermParts`: a term evaluated over the candidate arrays, as labelled parts. Each part is one arithmetic
  expression over named inputs (``"w*Psi_t/N_d"``) and a condition saying for which candidates it applies. The
  same expression string gives the number (evaluated with numpy, vectorised: this *is* the cost model, see
  ``memory.py``), the symbolic LaTeX (:func:`latex`, input symbols from :data:`SYMBOLS`) and the LaTeX with the
  scenario's numbers substituted (:func:`latex` with a formatter), so the formula shown can never differ from the
  formula computed.

Pure Python + numpy; no UI imports.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, cached_property, reduce
from typing import Literal

import numpy as np

Unit = Literal["bytes", "seconds"]
Category = Literal["memory", "host", "communication", "time"]


# --------------------------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TermInfo:
    """How one term is named, drawn and cited. ``label``: the charts' and tables' name; ``title``: explain mode's
    heading; ``symbol``: LaTeX left-hand side; ``colour``: its segment in the stacked charts (None when it is not
    a segment of its own); ``formula``: the formula in words (``Estimate.terms``); ``source``: where it comes from."""

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
             "of constants", "ZeRO paper Sec. 5; deepspeed/runtime/zero/stage3.py; QLoRA arXiv 2305.14314 Sec. 3"),
    TermInfo("gradients", "Gradients", "Gradients", r"M_{grads}", "memory", "bytes", "#f58518",
             "Gradients each GPU holds at the step's gradient peak: working precision, plus the fp32 copy DeepSpeed "
             "hands to the optimizer; partitioned over N_d from ZeRO-2 (ZeRO-1 as measured).",
             "16-bit gradients Ψ_t·2 (stages 0-1) or Ψ_t·2/N_d (stages 2-3), plus DeepSpeed's fp32 gradient "
             "partition Ψ_t·4/N_d (stages 1-3, no optimizer offload)",
             "deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs (18 = 2+4+4+8)"),
    TermInfo("optimizer_states", "Optimizer states", "Optimizer states", r"M_{opt}", "memory", "bytes", "#e45756",
             "fp32 master weights and optimizer states (Adam: momentum + variance); partitioned over N_d from "
             "ZeRO-1; moved to the host with offload_optimizer.",
             "fp32 master 4·Ψ_t + optimizer states (Adam 8·Ψ_t, SGD 4, 8-bit Adam 2), divided by N_d from stage 1; "
             "0 on GPU with offload_optimizer", "ZeRO paper Sec. 3.1 (K = 12)"),
    TermInfo("activations", "Activations", "Activations", r"M_{act}", "memory", "bytes", "#72b7b2",
             "Tensors saved for backward for one micro-batch, from the architecture; with full checkpointing only "
             "each layer's input plus one layer being recomputed.",
             "saved-for-backward tensors per layer s·b·h·(…) by block, times layers (or layer inputs only with full "
             "checkpointing), plus 16-bit logits and fp32 log-softmax 6·s·b·V, plus the vision tower's blocks "
             "over its images' patches (Qwen-VL, Gemma 3)",
             "Korthikanti et al. arXiv 2205.05198 Eq. 1-2, generalised (zeroplanner/costmodel/activations.py, "
             "vision.py)"),
    TermInfo("buffers", "Buffers", "Buffers", r"M_{buf}", "memory", "bytes", "#54a24b",
             "Communication buckets and the ZeRO-3 working set of gathered parameters.",
             "reduce bucket (x2 with overlap_comm); stage 3: gathered live parameters min(max_live, largest module "
             "+ prefetch bucket) + largest module's gradient",
             "deepspeed/runtime/zero/stage_1_and_2.py ipg_buffer; stage3.py prefetch coordinator"),
    TermInfo("overhead", "Overhead", "Overhead", r"M_{ovh}", "memory", "bytes", "#b279a2",
             "CUDA context, cuBLAS workspace and NCCL buffers, plus the caching allocator's slack on the live bytes.",
             "CUDA context + cuBLAS workspace + NCCL buffers + allocator slack × live bytes",
             "pytorch/pytorch#86509 (context), CublasHandlePool.cpp (workspace), NCCL init.cc (buffers), 7 published "
             "reserved/allocated pairs (slack): zeroplanner/costmodel/gpu_runtime.py"),
    TermInfo("host_memory", "Host RAM per node", "Host RAM per node", r"M_{host}", "host", "bytes", None,
             "Host RAM each node needs for what is offloaded, summed over its GPUs (before the safety factor the "
             "fit multiplies it by). With NVMe offload: DeepSpeed's pinned swap buffers and what stays on the CPU.",
             "GPUs per node x per rank: CPU offload: optimizer states + fp32 master, fp32 gradients, 16-bit copies, "
             "the parameter partition; NVMe offload (ZeRO-3): buffer_count pinned fp32 buffers of the largest "
             "sub-group, the 16-bit gradient partition, parameters up to max_in_cpu, the parameter swap buffers",
             "zeroplanner/costmodel/memory.py host_parts; DeepSpeed 0.19.8 swap_tensor/optimizer_utils.py, "
             "partitioned_param_swapper.py, zero/stage3.py and offload_config.py defaults (buffer_count, "
             "buffer_size, max_in_cpu, sub_group_size); measured on CPU ranks (docs/validation.md sections 1, 7)"),
    TermInfo("communication_volume", "Bytes sent per GPU per step", "Bytes sent per GPU per step", r"V_{comm}",
             "communication", "bytes", None, "Bytes each GPU sends per optimizer step in ring collectives.",
             "all-reduce 2(N_d-1)/N_d x its size, reduce-scatter and all-gather (N_d-1)/N_d x theirs",
             "ZeRO paper (arXiv 1910.02054) Sec. 7: 2Ψ for DP and ZeRO-1/2, 3Ψ for ZeRO-3; what DeepSpeed 0.19.8 "
             "sends (zeroplanner/costmodel/communication.py)"),
    TermInfo("compute", "Compute", "Compute time", r"t_{compute}", "time", "seconds", "#4c78a8",
             "Executed FLOPs of the step at the GEMM rate plus the memory-bound kernels (norms, activations, "
             "eager attention scores, logits) at HBM bandwidth; MFU is the effective rate of the two together.",
             "GA x tokens per micro-batch x executed FLOPs per token / (peak x MFU)",
             "PaLM (arXiv 2204.02311) App. B: 6N + 12LHQT FLOPs per token; recompute: Korthikanti et al. "
             "(arXiv 2205.05198) Sec. 5; memory-bound bytes per token counted on real transformers models "
             "(compute.ELEMENTWISE_BYTES_PER_HIDDEN); MFU assumption (Assumptions.mfu); "
             "zeroplanner/costmodel/compute.py"),
    TermInfo("communication", "Exposed communication", "Exposed communication time", r"t_{comm}", "time", "seconds",
             "#e45756",
             "Collective time that compute does not hide: step-boundary collectives, and with overlap_comm only "
             "what exceeds the forward/backward compute of each micro-step.",
             "step-boundary collectives + GA x exposed forward/backward collectives",
             "alpha-beta ring model (Hockney 1994) with NCCL's latency model (src/graph/tuning.cc) and busbw "
             "(nccl-tests PERFORMANCE.md); overlap as in DeepSpeed stage_1_and_2.py / stage3.py; "
             "zeroplanner/costmodel/communication.py and evaluate.py"),
    TermInfo("offload", "Offload", "Exposed offload time", r"t_{offload}", "time", "seconds", None,
             "PCIe traffic to and from the host that compute does not hide, the boundary upload, NVMe swapping.",
             "exposed PCIe + parameter upload + NVMe",
             "PCIe and NVMe bandwidths from the GPU and cluster specs; zeroplanner/costmodel/compute.py "
             "optimizer_and_offload_terms"),
    TermInfo("optimizer", "Optimizer step", "Optimizer step time", r"t_{optimizer}", "time", "seconds", None,
             "The optimizer step: memory-bound on the GPU (roofline), or DeepSpeed CPU-Adam on the host.",
             "bytes touched / HBM bandwidth (GPU), or GPUs per node x Ψ_t/N_d / CPU-Adam rate (offloaded)",
             "GPU: roofline (Williams et al., CACM 2009) with OPTIMIZER_BYTES_TOUCHED; CPU: DeepSpeed CPU-Adam rate "
             "ClusterSpec.cpu_adam_params_per_second (calibration); zeroplanner/costmodel/compute.py"),
    TermInfo("step", "Step", "Step time", r"t_{step}", "time", "seconds", None,
             "Step time = compute + exposed communication + exposed offload + optimizer step.",
             "compute + exposed communication + exposed offload + optimizer step",
             "zeroplanner/costmodel/evaluate.py evaluate"),
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


ESTIMATE_FIELDS: dict[str, str] = {
    **{k: f"per_gpu_bytes.{k}" for k in MEMORY_TERM_KEYS},
    "host_memory": "per_node_cpu_bytes",
    "communication_volume": "communication.bytes_per_gpu_per_step",
    "compute": "compute_seconds_per_step",
    "communication": "communication.exposed_seconds_per_step",
    "offload": "offload_seconds_per_step",
    "optimizer": "optimizer_seconds_per_step",
    "step": "step_seconds",
}
"""Term key -> where :class:`~.evaluate.Estimate` holds its value (dotted attribute path)."""


def estimate_value(estimate: object, key: str) -> float:
    """The value of term ``key`` in an :class:`~.evaluate.Estimate` (bytes or seconds)."""
    obj = estimate
    for name in ESTIMATE_FIELDS[key].split("."):
        obj = getattr(obj, name)
    return float(obj)


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
    "S_ar": Symbol(r"S_{ar}", "bytes", "all-reduce message bytes per step"),
    "S_rs": Symbol(r"S_{rs}", "bytes", "reduce-scatter message bytes per step"),
    "S_ag": Symbol(r"S_{ag}", "bytes", "all-gather message bytes per step"),
}
"""Input name (as written in the part expressions) -> LaTeX, unit and meaning."""


# --------------------------------------------------------------------------------------------------------------
# Terms as labelled parts
# --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartValue:
    """One labelled part of a term: its expression, where it applies (bool, an array or one for all candidates)
    and its value (float array, 0 where it does not apply)."""

    label: str
    expr: str
    applies: np.ndarray
    value: np.ndarray


@dataclass(frozen=True)
class TermParts:
    """A term over the candidate arrays: its inputs (name -> scalar or array) and its labelled parts; ``value`` is
    their sum."""

    key: str
    inputs: Mapping[str, object]
    parts: tuple[PartValue, ...]

    @property
    def value(self) -> np.ndarray:
        total = self.parts[0].value
        for p in self.parts[1:]:
            total = total + p.value
        return total

    def sum_of(self, labels: Sequence[str]) -> np.ndarray:
        """The sum of the parts with these labels (0 where none applies)."""
        return sum((p.value for p in self.parts if p.label in labels), start=np.zeros_like(self.value))


def _fold(f: Callable) -> Callable:
    return lambda *args: reduce(f, args)


_FUNCTIONS = {"min": _fold(np.minimum), "max": _fold(np.maximum)}


@cache
def _parsed(expr: str):
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                                               and not node.keywords):
            raise ValueError(f"only min() and max() may be called in a term expression: {expr!r}")
        if isinstance(node, ast.Name) and node.id not in SYMBOLS and node.id not in _FUNCTIONS:
            raise ValueError(f"unknown input {node.id!r} in term expression {expr!r}; add it to SYMBOLS")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"{type(node).__name__} is not allowed in a term expression: {expr!r}")
    return tree


_ALLOWED = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Name, ast.Load, ast.Constant,
            ast.Call)
_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
        ast.Div: lambda a, b: a / b}


@cache
def _evaluator(expr: str) -> Callable[[Mapping[str, object]], object]:
    """``expr`` as nested closures, built once from its syntax tree (no ``eval``)."""

    def build(node) -> Callable[[Mapping[str, object]], object]:
        if isinstance(node, ast.Expression):
            return build(node.body)
        if isinstance(node, ast.Name):
            name = node.id
            return lambda x: x[name]
        if isinstance(node, ast.Constant):
            const = node.value
            return lambda x: const
        if isinstance(node, ast.BinOp):
            op, lhs, rhs = _OPS[type(node.op)], build(node.left), build(node.right)
            return lambda x: op(lhs(x), rhs(x))
        f, args = _FUNCTIONS[node.func.id], [build(a) for a in node.args]  # ast.Call of min / max (checked)
        return lambda x: f(*(a(x) for a in args))

    return build(_parsed(expr))


def evaluate_expr(expr: str, inputs: Mapping[str, object]) -> np.ndarray:
    """The value of ``expr`` (``+ - * /``, parentheses, ``min``/``max``, input names) for ``inputs``: each
    operator applied as Python applies it, so numpy arrays broadcast.

    >>> float(evaluate_expr("w*min(B_ar, Psi_t)", {"w": 2.0, "B_ar": 5e8, "Psi_t": 1e6}))
    2000000.0
    """
    return _evaluator(expr)(inputs)


_ALL = np.asarray(True)


def term(key: str, inputs: Mapping[str, object], parts: Sequence[tuple[str, str, object]]) -> TermParts:
    """Build a :class:`TermParts` from (label, expression, condition) rows; ``condition`` is a bool (array) or
    True. Each part is 0 where its condition is False."""
    out = []
    for label, expr, when in parts:
        if when is True:  # applies to every candidate: np.where(True, x, 0.0) is x as float64, without the select
            out.append(PartValue(label, expr, _ALL, np.asarray(evaluate_expr(expr, inputs), dtype=np.float64)))
            continue
        applies = np.asarray(when, dtype=bool)
        out.append(PartValue(label, expr, applies, np.where(applies, evaluate_expr(expr, inputs), 0.0)))
    return TermParts(key, dict(inputs), tuple(out))


def input_names(expr: str) -> list[str]:
    """The input names of ``expr``, in order of first appearance."""
    names = [n for n in ast.walk(_parsed(expr)) if isinstance(n, ast.Name) and n.id in SYMBOLS]
    return list(dict.fromkeys(n.id for n in sorted(names, key=lambda n: n.col_offset)))


def is_sum(expr: str) -> bool:
    """Whether ``expr`` is a sum or difference at its top level."""
    body = _parsed(expr).body
    return isinstance(body, ast.BinOp) and isinstance(body.op, (ast.Add, ast.Sub))


_PREC = {ast.Add: 1, ast.Sub: 1, ast.Mult: 2, ast.Div: 2}


def latex(expr: str, value: Callable[[str], str] | None = None) -> str:
    r"""``expr`` in LaTeX: with the symbols of :data:`SYMBOLS` (``value`` None), or with ``value(name)`` for each
    input (the numbers substituted; products then use ``\times``).

    >>> print(latex("w*Psi_persist*(1-1/N_d)"))
    w\Psi_{pers}(1-1/N_d)
    >>> print(latex("w*Psi_t/N_d", {"w": "2", "Psi_t": "7", "N_d": "8"}.get))
    2\times7/8
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
            return name(node.id)
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

    return go(_parsed(expr))
