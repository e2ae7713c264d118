"""The cost model's intermediate values for one scenario, term by term, for explanations (tutorial, explain mode).

Each function returns a :class:`TermValues`: the term's value (bytes per GPU, bytes per node, or seconds per
step), which branch of the model applies (``case``), the inputs that went into it and the parts that add up to it,
each part one expression of :mod:`.terms`. Nothing is recomputed here: every term is the labelled parts the cost
model computed it with (``memory.memory_term_parts``, ``communication.wire_parts``, ``compute.compute_terms``,
``evaluate.step_terms``: the same expressions explain mode prints) evaluated at the scenario's one candidate, and
every term's value is :func:`~.evaluate.evaluate`'s output for that candidate, the number the charts draw
(``tests/core/test_explain.py`` checks both, term by term, across many scenarios). A step-time term also carries
its ``definitions``: the quantities its formula uses that are themselves defined by an expression (exposed
forward collectives, the GPU's micro-step, ...), each a :class:`TermValues` of its own.

Pure numpy; no UI imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from types import MappingProxyType

import numpy as np

from ..specs import Scenario
from .communication import communication_terms
from .compute import compute_terms
from .context import Candidates, Context, data_parallel_degree, make_context, overlap_comm
from .evaluate import STEP_OWNERS, TIME_TERM_SYMBOLS, StepTerms, evaluate, step_terms
from .evaluation import Evaluation
from .memory import memory_term_parts, nvme_parts
from .terms import SYMBOLS, TERM_INFO, TermParts, input_names, term_value


@dataclass(frozen=True)
class TermValues:
    """One term of the cost model, evaluated at one candidate.

    key: "parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead" (bytes per GPU),
    "host_memory" (bytes per node), "communication_volume" (bytes each GPU sends per step), "compute",
    "communication", "offload", "optimizer", "step" (seconds per step); for a definition, the quantity's
    :data:`~.terms.SYMBOLS` name ("e_f", "t_gpu", ...).
    value: the number (bytes, seconds, or the quantity's unit), as :func:`~.evaluate.evaluate` gives it. unit:
    "bytes", "seconds", or a definition's :data:`~.terms.SYMBOLS` unit. case: the branch that applies (e.g.
    "stage3", "offload"). inputs: symbol -> number (units in :data:`INPUT_UNITS`), every input of the expressions
    (for the step-time terms also every quantity defined before). parts: label -> number of the parts that apply;
    they sum to ``value``. formulas: label -> the part's expression (:mod:`.terms`). definitions: the quantities the
    shown formulas use that this term's explanation defines, in the order a reader meets them.
    """

    key: str
    value: float
    unit: str
    case: str
    inputs: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    definitions: tuple[TermValues, ...] = ()


INPUT_UNITS = {k: v.unit for k, v in SYMBOLS.items()}
"""Unit of each input symbol."""

def _one(x) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def _value(point: _Point, key: str) -> float:
    """Term ``key``'s value at the scenario's candidate: its field of the evaluation (:attr:`~.terms.TermInfo.field`,
    the number the chart draws)."""
    return float(term_value(point.values, key))


@dataclass(frozen=True)
class _Point:
    """One scenario's context, candidate, :func:`evaluate` output at it (:meth:`Evaluation.at`), memory terms'
    parts, the communication volume's parts and the step-time quantities (read-only)."""

    ctx: Context
    cand: Candidates
    n: float
    values: Evaluation
    memory: Mapping[str, TermParts]
    volume: TermParts
    steps: StepTerms


@lru_cache(maxsize=64)
def _setup(scenario: Scenario) -> _Point:
    """Evaluated once per scenario (frozen, hashable), however many of its terms are explained."""
    ctx = make_context(scenario)
    cand = Candidates.from_scenario(scenario)
    values = evaluate(ctx, cand).at(0)
    comm = communication_terms(ctx, cand)
    steps = step_terms(ctx, cand, comm, compute_terms(ctx, cand))
    return _Point(ctx, cand, _one(data_parallel_degree(ctx, cand)), values,
                  MappingProxyType(memory_term_parts(ctx, cand)), comm["wire_parts"], steps)


def _case(scenario: Scenario, key: str) -> str:
    z, t = scenario.zero, scenario.training
    if key == "activations":
        return t.checkpointing
    if key == "host_memory":
        return f"optimizer_{z.offload_optimizer.device}+param_{z.offload_param.device}"
    off = "+offload" if z.offload_optimizer.device != "none" or z.offload_param.device != "none" else ""
    return f"stage{z.stage}{off}" + ("_paper" if scenario.assumptions.accounting == "paper" else "")


def from_parts(scenario: Scenario, tp: TermParts, value: float, *, case: str | None = None,
               inputs: dict[str, float] | None = None) -> TermValues:
    """``tp`` at the scenario's one candidate: the parts that apply, their inputs and expressions. ``tp.key`` is a
    :data:`~.terms.TERM_INFO` key or, for a definition, a :data:`~.terms.SYMBOLS` name (its unit is the
    symbol's; ``case`` then defaults to "definition"). ``inputs``: the inputs already read at the candidate."""
    applying = [p for p in tp.parts if bool(np.asarray(p.applies).reshape(-1)[0])]
    parts = {p.label: _one(p.value) for p in applying}
    formulas = {p.label: p.expr for p in applying}
    if inputs is None:
        inputs = {k: _one(v) for k, v in tp.inputs.items()}
    if tp.key in TERM_INFO:
        unit, case = TERM_INFO[tp.key].unit, case or _case(scenario, tp.key)
    else:
        unit, case = SYMBOLS[tp.key].unit, case or "definition"
    return TermValues(tp.key, value, unit, case, inputs, parts, formulas)


def _memory(scenario: Scenario, key: str) -> TermValues:
    point = _setup(scenario)
    tp = point.memory[key]
    return from_parts(scenario, tp, _value(point, key))


def parameters(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of the working parameters (memory.parameter_parts)."""
    return _memory(scenario, "parameters")


def gradients(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of gradients (memory.gradient_parts)."""
    return _memory(scenario, "gradients")


def optimizer_states(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of fp32 master weights + optimizer states (memory.optimizer_state_parts)."""
    return _memory(scenario, "optimizer_states")


def activations(scenario: Scenario) -> TermValues:
    """Per-GPU activation bytes (activations.activation_term)."""
    return _memory(scenario, "activations")


def buffers(scenario: Scenario) -> TermValues:
    """Per-GPU communication buffers and the stage-3 gathered working set (memory.buffer_parts)."""
    return _memory(scenario, "buffers")


def overhead(scenario: Scenario) -> TermValues:
    """CUDA context + workspaces, plus allocator fragmentation x the live bytes of the other five terms
    (memory.overhead_parts)."""
    return _memory(scenario, "overhead")


MEMORY_FUNCTIONS = {
    "parameters": parameters, "gradients": gradients, "optimizer_states": optimizer_states,
    "activations": activations, "buffers": buffers, "overhead": overhead,
}
"""Estimate.per_gpu_bytes key -> the function explaining it."""


def host_memory(scenario: Scenario) -> TermValues:
    """Host RAM per node for offloaded states, bytes (memory.host_parts)."""
    return _memory(scenario, "host_memory")


def _applying(tp: TermParts) -> list[tuple[str, str, int]]:
    """(label, expression, bytes rounded to an integer) of the parts of ``tp`` that apply and are not 0."""
    out = []
    for p in tp.parts:
        value = int(round(_one(p.value)))
        if bool(np.asarray(p.applies).reshape(-1)[0]) and value:
            out.append((p.label, p.expr, value))
    return out


def offload_storage(scenario: Scenario) -> dict[str, dict]:
    """Host RAM and NVMe per node for ``scenario``, each one figure with the parts that make it up.

    Returns ``{"host_memory": {...}, "nvme": {...}}``. ``host_memory``: ``parts_bytes`` (label -> bytes per node:
    the offloaded states and pinned buffers of memory.host_parts, then ``safety headroom (x f)`` =
    (f - 1) x their sum, f = ``Assumptions.host_buffer_factor``, DeepSpeed's additional_buffer_factor),
    ``formulas`` (label -> expression; the headroom ``(f-1)*M_host``), ``offloaded_bytes`` (the parts before the
    headroom; ``Estimate.per_node_cpu_bytes``), ``safety_factor``, ``required_bytes`` (the sum of
    ``parts_bytes``: what the fit compares), ``available_bytes`` (``ClusterSpec.cpu_memory_bytes``), ``fits``
    (evaluate's ``fits_cpu``). ``nvme``: ``parts_bytes`` and ``formulas`` of memory.nvme_parts,
    ``required_bytes`` (their sum; ``Estimate.nvme_bytes``), ``capacity_bytes`` (``ClusterSpec.nvme_bytes``),
    ``fits`` (evaluate's ``fits_nvme``). Bytes are integers; each ``required_bytes`` is exactly the sum of its
    ``parts_bytes``. A scenario without offload has no parts and needs 0 bytes.
    """
    point = _setup(scenario)
    c, a = scenario.cluster, scenario.assumptions
    host = _applying(point.memory["host_memory"])
    offloaded = sum(v for _, _, v in host)
    f = a.host_buffer_factor
    headroom = int(round(offloaded * (f - 1.0)))
    host_parts = {label: v for label, _, v in host}
    formulas = {label: expr for label, expr, _ in host}
    if headroom:
        label = f"safety headroom (x{f:g} host_buffer_factor)"
        host_parts[label] = headroom
        formulas[label] = f"({f:g}-1)*M_host"
    nvme = _applying(nvme_parts(point.ctx, point.cand))
    return {
        "host_memory": {"parts_bytes": host_parts, "formulas": formulas, "offloaded_bytes": offloaded,
                        "safety_factor": f, "required_bytes": sum(host_parts.values()),
                        "available_bytes": c.cpu_memory_bytes, "fits": bool(point.values.fits_cpu)},
        "nvme": {"parts_bytes": {label: v for label, _, v in nvme},
                 "formulas": {label: expr for label, expr, _ in nvme},
                 "required_bytes": sum(v for _, _, v in nvme), "capacity_bytes": c.nvme_bytes,
                 "fits": bool(point.values.fits_nvme)},
    }


def communication_volume(scenario: Scenario) -> TermValues:
    """Bytes each GPU sends per step over the rings (evaluate's ``communication.bytes_per_gpu_per_step``): the
    parts communication.communication_terms computes it with (communication.wire_parts: all-reduce 2(N_d-1)/N_d x its
    message, reduce-scatter and all-gather (N_d-1)/N_d x theirs, Ulysses' all-to-alls (p-1)/p, AutoTP's
    collectives (t-1)/t every micro-step)."""
    point = _setup(scenario)
    return from_parts(scenario, point.volume, _value(point, "communication_volume"))


def _zero(inputs: Mapping[str, float]):
    return lambda name: inputs.get(name, 1.0) == 0.0


def _shown_names(tv: TermValues) -> list[str]:
    """The inputs of ``tv``'s formulas as explain mode shows them: the parts that are not 0, each without its
    addends that are 0 (:func:`~.terms.latex`'s ``zero``)."""
    zero = _zero(tv.inputs)
    names = [n for label, expr in tv.formulas.items() if tv.parts[label] != 0.0 for n in input_names(expr, zero)]
    return list(dict.fromkeys(names))


SHOWN_WITH: dict[str, tuple[str, ...]] = {"compute": ("t_cf", "t_cb")}
"""Quantities a term's explanation defines although its own formula does not use them: the compute term shows the
forward / backward split the overlap of communication is computed with."""


def _time(scenario: Scenario, key: str) -> TermValues:
    """Step-time term ``key`` (seconds per step) from :func:`~.evaluate.step_terms`: its parts, and the
    definitions its formula uses that :data:`~.evaluate.STEP_OWNERS` assigns to it, each with the definitions it
    uses in turn (the order a reader meets them), leaving out what is 0."""
    point = _setup(scenario)
    steps = point.steps
    inputs = {k: _one(v) for k, v in steps.values.items()}
    tv = from_parts(scenario, steps.terms[TIME_TERM_SYMBOLS[key]], _value(point, key),
                    case=_time_case(scenario, point, key), inputs=inputs)
    queue = [*_shown_names(tv), *SHOWN_WITH.get(key, ())]
    seen, definitions = set(), []
    while queue:
        name = queue.pop(0)
        if name in seen or STEP_OWNERS.get(name) != key or name not in steps.terms or inputs[name] == 0.0:
            continue
        seen.add(name)
        d = from_parts(scenario, steps.terms[name], inputs[name], inputs=inputs)
        definitions.append(d)
        queue[0:0] = _shown_names(d)  # depth first: a quantity's own definitions right after it
    return TermValues(tv.key, tv.value, tv.unit, tv.case, tv.inputs, tv.parts, tv.formulas, tuple(definitions))


def _time_case(scenario: Scenario, point: _Point, key: str) -> str:
    z = scenario.zero
    if key == "compute":
        return scenario.training.checkpointing
    if key == "communication":
        return "overlap" if bool(_one(overlap_comm(point.ctx, point.cand))) else "no_overlap"
    if key == "offload":
        return "none" if z.offload_optimizer.device == "none" and z.offload_param.device == "none" else "offload"
    if key == "optimizer":
        return "cpu" if z.offload_optimizer.device != "none" else "gpu"
    return "sum"


def compute(scenario: Scenario) -> TermValues:
    """Compute seconds per step (evaluate's ``compute_seconds_per_step``): GA x one micro-step's compute, the tokens x
    executed FLOPs per token at ``eta`` of the dense peak, the memory-bound kernels and QLoRA dequantisation
    (compute.COMPUTE_DEFINITIONS); definitions: the micro-step, the executed FLOPs (model + recompute), and the
    forward / backward split."""
    return _time(scenario, "compute")


def communication(scenario: Scenario) -> TermValues:
    """Exposed communication seconds per step (evaluate's ``communication.exposed_seconds_per_step``) = exposed
    collectives (the step boundary's, plus per micro-step the forward / backward collectives that compute does not
    hide with overlap_comm, Ulysses' all-to-alls and AutoTP's all-reduces) + the ZeRO host overhead (ZeRO-3 module hooks
    beyond the GPU's micro-step, ZeRO-2/3 gradient hooks), each a quantity of evaluate.step_terms."""
    return _time(scenario, "communication")


def offload(scenario: Scenario) -> TermValues:
    """Exposed offload seconds per step (evaluate's ``offload_seconds_per_step``): PCIe traffic compute does not
    hide (and the checkpoint offload's blocking copies), the boundary upload, NVMe swapping (evaluate.step_terms)."""
    return _time(scenario, "offload")


def optimizer(scenario: Scenario) -> TermValues:
    """Optimizer-step seconds (evaluate's ``optimizer_seconds_per_step``): on GPU, bytes touched per parameter of the
    shard / HBM bandwidth; offloaded, GPUs per node x Ψ_t/N_d updates at DeepSpeed CPU-Adam's rate
    (evaluate.step_terms)."""
    return _time(scenario, "optimizer")


def step(scenario: Scenario) -> TermValues:
    """Step seconds (evaluate's ``step_seconds``) = compute + exposed collectives + ZeRO host overhead + exposed
    offload + optimizer step (evaluate.step_terms; the collectives and the host overhead are the communication
    term's two parts)."""
    return _time(scenario, "step")


TIME_FUNCTIONS = {"compute": compute, "communication": communication, "offload": offload, "optimizer": optimizer}
"""Step-time component -> the function explaining it (the app's chart shows offload + optimizer together)."""

ALL_FUNCTIONS = {**MEMORY_FUNCTIONS, "host_memory": host_memory, "communication_volume": communication_volume,
                 **TIME_FUNCTIONS, "step": step}
"""Every explained term -> the function explaining it; every one's parts are expressions (``formulas``)."""
