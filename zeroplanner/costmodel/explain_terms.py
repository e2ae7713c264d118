"""The cost model's intermediate values for one scenario, term by term, for explanations (tutorial, explain mode).

Each function returns a :class:`TermValues`: the term's value (bytes per GPU, bytes per node, or seconds per
step), which branch of the model applies (``case``), the inputs that went into it and the parts that add up to it.
Nothing is recomputed here: the memory terms and host RAM are the labelled parts of the vectorised functions
(``memory.memory_term_parts``: each part one expression, the same one explain mode prints) evaluated at the
scenario's one candidate, and every term's value is :func:`~.evaluate.evaluate`'s output for that candidate, the
number the charts draw (``tests/core/test_explain.py`` checks both, term by term, across many scenarios).

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
from .compute import compute_terms, flops_per_token, optimizer_and_offload_terms
from .context import (
    OPTIMIZER_BYTES_TOUCHED,
    Candidates,
    Context,
    data_parallel_degree,
    make_context,
    overlap_comm,
)
from .evaluate import evaluate
from .evaluate import step_parts as _step_parts
from .memory import memory_term_parts, nvme_parts
from .terms import SYMBOLS, TERM_INFO, TermParts, term


@dataclass(frozen=True)
class TermValues:
    """One term of the cost model, evaluated at one candidate.

    key: "parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead" (bytes per GPU),
    "host_memory" (bytes per node), "communication_volume" (bytes each GPU sends per step), "compute",
    "communication", "offload", "optimizer", "step" (seconds per step).
    value: the number (bytes or seconds), as :func:`~.evaluate.evaluate` gives it. case: the branch that applies
    (e.g. "stage3", "offload"). inputs: symbol -> number (units in :data:`INPUT_UNITS`). parts: label -> number;
    they sum to ``value``. formulas: label -> the part's expression (:mod:`.terms`), where the part is one.
    """

    key: str
    value: float
    unit: str
    case: str
    inputs: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)


INPUT_UNITS = {
    **{k: v.unit for k, v in SYMBOLS.items()},
    "ga": "micro-steps", "tokens_micro": "tokens", "flops_token": "FLOP/token", "model_flops_token": "FLOP/token",
    "peak": "FLOP/s", "mfu": "fraction", "fwd_comm": "s", "bwd_comm": "s", "fwd_compute": "s",
    "bwd_compute": "s", "boundary": "s", "pcie_micro": "s", "micro_compute": "s", "pcie_boundary": "s",
    "nvme": "s", "touched": "bytes/parameter", "hbm": "bytes/s", "gpn": "GPUs", "cpu_rate": "parameters/s",
    "shard": "parameters", "frac": "fraction", "total": "s", "overlap": "x",
}
"""Unit of each input symbol."""

EVALUATE_KEYS = {
    "parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer_states",
    "activations": "activations", "buffers": "buffers", "overhead": "overhead", "host_memory": "host_per_node",
    "communication_volume": "comm_wire_bytes", "compute": "compute_seconds", "communication": "comm_exposed_seconds",
    "offload": "offload_seconds", "optimizer": "optimizer_seconds", "step": "step_seconds",
}
"""Term key -> the key of :func:`~.evaluate.evaluate`'s output that holds its value (the chart's number)."""


def _one(x) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


@dataclass(frozen=True)
class _Point:
    """One scenario's context, candidate, :func:`evaluate` output and memory terms' parts (read-only)."""

    ctx: Context
    cand: Candidates
    n: float
    values: Mapping[str, float]
    memory: Mapping[str, TermParts]


@lru_cache(maxsize=64)
def _setup(scenario: Scenario) -> _Point:
    """Evaluated once per scenario (frozen, hashable), however many of its terms are explained."""
    ctx = make_context(scenario)
    cand = Candidates.from_scenario(scenario)
    values = {k: _one(v) for k, v in evaluate(ctx, cand).items()}
    return _Point(ctx, cand, _one(data_parallel_degree(ctx, cand)), MappingProxyType(values),
                  MappingProxyType(memory_term_parts(ctx, cand)))


def _case(scenario: Scenario, key: str) -> str:
    z, t = scenario.zero, scenario.training
    if key == "activations":
        return t.checkpointing
    if key == "host_memory":
        return f"optimizer_{z.offload_optimizer.device}+param_{z.offload_param.device}"
    off = "+offload" if z.offload_optimizer.device != "none" or z.offload_param.device != "none" else ""
    return f"stage{z.stage}{off}" + ("_paper" if scenario.assumptions.accounting == "paper" else "")


def from_parts(scenario: Scenario, tp: TermParts, value: float) -> TermValues:
    """``tp`` at the scenario's one candidate: the parts that apply, their inputs and expressions."""
    applying = [p for p in tp.parts if bool(np.asarray(p.applies).reshape(-1)[0])]
    parts = {p.label: _one(p.value) for p in applying}
    formulas = {p.label: p.expr for p in applying}
    inputs = {k: _one(v) for k, v in tp.inputs.items()}
    return TermValues(tp.key, value, TERM_INFO[tp.key].unit, _case(scenario, tp.key), inputs, parts, formulas)


def _memory(scenario: Scenario, key: str) -> TermValues:
    point = _setup(scenario)
    tp = point.memory[key]
    return from_parts(scenario, tp, point.values[EVALUATE_KEYS[key]])


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
                        "available_bytes": c.cpu_memory_bytes, "fits": bool(point.values["fits_cpu"])},
        "nvme": {"parts_bytes": {label: v for label, _, v in nvme},
                 "formulas": {label: expr for label, expr, _ in nvme},
                 "required_bytes": sum(v for _, _, v in nvme), "capacity_bytes": c.nvme_bytes,
                 "fits": bool(point.values["fits_nvme"])},
    }


def communication_volume(scenario: Scenario) -> TermValues:
    """Bytes each GPU sends per step over the rings: all-reduce 2(N_d-1)/N_d x its size, reduce-scatter and
    all-gather (N_d-1)/N_d x theirs, of communication.communication_terms' message sizes. The value is its
    "wire_bytes" (evaluate's ``comm_wire_bytes``); the parts restate communication.py's ring-volume line as
    expressions (the test checks they add up to it)."""
    point = _setup(scenario)
    comm = communication_terms(point.ctx, point.cand)
    x = {"N_d": point.n, "S_ar": _one(comm["all_reduce"]), "S_rs": _one(comm["reduce_scatter"]),
         "S_ag": _one(comm["all_gather"])}
    tp = term("communication_volume", x, [("all-reduce", "2*(N_d-1)/N_d*S_ar", True),
                                          ("reduce-scatter", "(N_d-1)/N_d*S_rs", True),
                                          ("all-gather", "(N_d-1)/N_d*S_ag", True)])
    return from_parts(scenario, tp, point.values["comm_wire_bytes"])


def compute(scenario: Scenario) -> TermValues:
    """Compute seconds per step (evaluate's ``compute_seconds``): GA x tokens per micro-batch x executed FLOPs per
    token / (peak x MFU), MFU the effective rate of the GEMMs and the memory-bound kernels together
    (compute.compute_terms' ``achieved_fraction``); parts: forward and backward (+ recompute), from
    compute.compute_terms."""
    point = _setup(scenario)
    ctx, cand = point.ctx, point.cand
    model, executed, _ = (_one(x) for x in flops_per_token(ctx, cand))
    comp = compute_terms(ctx, cand)
    t = scenario.training
    tokens = float(t.micro_batch * t.seq_len)
    inputs = {"ga": float(t.grad_accum), "tokens_micro": tokens, "flops_token": executed,
              "model_flops_token": model, "peak": ctx.peak_flops,
              "mfu": _one(comp["achieved_fraction"])}
    parts = {"forward": float(t.grad_accum) * _one(comp["fwd_seconds_micro"]),
             "backward (+ recompute)": float(t.grad_accum) * _one(comp["bwd_seconds_micro"])}
    if t.qlora:
        parts["QLoRA dequantisation"] = float(t.grad_accum) * _one(comp["dequant_seconds_micro"])
    return TermValues("compute", point.values["compute_seconds"], "seconds", t.checkpointing, inputs, parts)


def communication(scenario: Scenario) -> TermValues:
    """Exposed communication seconds per step (evaluate's ``comm_exposed_seconds``). Parts: the collectives at
    the step boundary + per micro-step the part of the forward / backward collectives that compute does not hide
    (overlap_comm), from communication_terms and compute_terms, split by evaluate's own ``step_parts`` (the
    function evaluate composes the step with, so nothing is re-derived here); a test checks the parts add up to
    evaluate's value."""
    point = _setup(scenario)
    ctx, cand = point.ctx, point.cand
    comm = communication_terms(ctx, cand)
    comp = compute_terms(ctx, cand)
    ga = float(scenario.training.grad_accum)
    overlap = bool(_one(overlap_comm(ctx, cand)))
    fwd_comm = _one(comm["fwd_seconds_micro"])
    bwd_comm = _one(comm["bwd_seconds_micro"]) + _one(comm["reduce_seconds_micro"])
    fwd_comp, bwd_comp = _one(comp["fwd_seconds_micro"]), _one(comp["bwd_seconds_micro"])
    sp = _step_parts(ctx, cand, comm, comp, optimizer_and_offload_terms(ctx, cand))
    fwd_exp, bwd_exp = _one(sp["fwd_exposed_micro"]), _one(sp["bwd_exposed_micro"])
    boundary = _one(comm["boundary_seconds"])
    parts = {"step boundary": boundary, "forward (exposed)": ga * fwd_exp, "backward (exposed)": ga * bwd_exp,
             "ZeRO host overhead (fetch hooks, gradient hooks)": _one(sp["fetch_overhead_seconds"])
             + _one(sp["hook_seconds"])}
    inputs = {"ga": ga, "boundary": boundary, "fwd_comm": fwd_comm, "bwd_comm": bwd_comm, "fwd_compute": fwd_comp,
              "bwd_compute": bwd_comp, "overlap": 1.0 if overlap else 0.0, "N_d": point.n,
              "total": _one(comm["seconds"])}
    return TermValues("communication", point.values["comm_exposed_seconds"], "seconds",
                      "overlap" if overlap else "no_overlap", inputs, parts)


def offload(scenario: Scenario) -> TermValues:
    """Exposed offload seconds per step (evaluate's ``offload_seconds``). Parts: PCIe traffic compute does not
    hide, the boundary upload, NVMe swapping (compute.optimizer_and_offload_terms; the exposure from
    evaluate's own ``step_parts``, checked by the test)."""
    point = _setup(scenario)
    ctx, cand = point.ctx, point.cand
    opt = optimizer_and_offload_terms(ctx, cand)
    comp = compute_terms(ctx, cand)
    ga = float(scenario.training.grad_accum)
    pcie_micro = _one(opt["pcie_seconds_micro"])
    micro_compute = _one(comp["fwd_seconds_micro"]) + _one(comp["bwd_seconds_micro"])
    sp = _step_parts(ctx, cand, communication_terms(ctx, cand), comp, opt)
    parts = {"PCIe (exposed)": ga * _one(sp["pcie_exposed_micro"]),
             "parameter upload": _one(opt["pcie_seconds_boundary"]), "NVMe": _one(opt["nvme_seconds"])}
    inputs = {"ga": ga, "pcie_micro": pcie_micro, "micro_compute": micro_compute,
              "pcie_boundary": parts["parameter upload"], "nvme": parts["NVMe"]}
    z = scenario.zero
    case = "none" if z.offload_optimizer.device == "none" and z.offload_param.device == "none" else "offload"
    return TermValues("offload", point.values["offload_seconds"], "seconds", case, inputs, parts)


def optimizer(scenario: Scenario) -> TermValues:
    """Optimizer-step seconds (evaluate's ``optimizer_seconds``): on GPU, bytes touched per parameter of the shard
    / HBM bandwidth; offloaded, GPUs per node x Ψ_t/N_d updates at DeepSpeed CPU-Adam's rate. ``inputs`` are the
    numbers compute.optimizer_and_offload_terms uses."""
    point = _setup(scenario)
    ctx, n = point.ctx, point.n
    T = ctx.trainable
    value = point.values["optimizer_seconds"]
    if scenario.zero.offload_optimizer.device != "none":
        inputs = {"gpn": float(ctx.gpus_per_node), "Psi_t": T, "N_d": n,
                  "cpu_rate": scenario.cluster.cpu_adam_params_per_second}
        case = "cpu"
    else:
        touched = OPTIMIZER_BYTES_TOUCHED[scenario.training.optimizer] if ctx.mixed else 16.0
        shard = T / n if scenario.zero.stage >= 1 else T
        inputs = {"shard": shard, "touched": touched, "hbm": ctx.hbm_bytes_per_second, "Psi_t": T, "N_d": n}
        case = "gpu"
    return TermValues("optimizer", value, "seconds", case, inputs, {"optimizer step": value})


def step(scenario: Scenario) -> TermValues:
    """Step seconds (evaluate's ``step_seconds``) = compute + exposed communication + exposed offload + optimizer
    step, each evaluate's own value."""
    v = _setup(scenario).values
    parts = {k: v[EVALUATE_KEYS[k]] for k in ("compute", "communication", "offload", "optimizer")}
    return TermValues("step", v["step_seconds"], "seconds", "sum", dict(parts), parts)


TIME_FUNCTIONS = {"compute": compute, "communication": communication, "offload": offload, "optimizer": optimizer}
"""Step-time component -> the function explaining it (the app's chart shows offload + optimizer together)."""

ALL_FUNCTIONS = {**MEMORY_FUNCTIONS, "host_memory": host_memory, "communication_volume": communication_volume,
                 **TIME_FUNCTIONS, "step": step}

EXPRESSION_TERMS: tuple[str, ...] = (*MEMORY_FUNCTIONS, "host_memory", "communication_volume")
"""The terms whose parts are expressions (``TermValues.formulas``); explain mode prints those expressions. The
step-time terms' numbers come from evaluate (``step_parts``); their LaTeX formulas are written in
:mod:`zeroplanner.explain`."""
