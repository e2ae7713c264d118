"""The cost model's intermediate values for one scenario, term by term, for explanations (tutorial, explain mode).

Each function returns a :class:`TermValues`: the term's value (bytes per GPU, bytes per node, or seconds per
step), which branch of the model applies (``case``), the inputs that went into it and the parts that add up to it.
The inputs come from the same :class:`~.context.Context` (``make_context``) and the parts from the same functions
the estimate uses (``layer_activation_bytes``, ``flops_per_token``, ``compute_terms``, ``communication_terms``,
``optimizer_and_offload_terms``); where a term is a short closed formula (model states,
buffers, overhead) it is restated here from the context's scalars, and ``tests/test_explain.py`` checks that every
value equals the estimate's number for many scenarios, so an explanation can never drift from the model.

Pure numpy; no UI imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..specs import Scenario
from .activations import activation_parts, layer_activation_bytes
from .communication import STAGE0_ALLREDUCE_BUCKET, communication_terms
from .compute import compute_terms, flops_per_token, optimizer_and_offload_terms
from .context import Candidates, Context, data_parallel_degree, make_context, overlap_comm
from .evaluate import step_parts as _step_parts
from .memory import (
    OFFLOAD_OPTIMIZER_BUFFER_COUNT,
    OFFLOAD_PARAM_BUFFER_COUNT,
    OFFLOAD_PARAM_BUFFER_SIZE,
    SUB_GROUP_SIZE,
)


@dataclass(frozen=True)
class TermValues:
    """One term of the cost model, evaluated.

    key: "parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead" (bytes per GPU),
    "host_memory" (bytes per node), "communication_volume" (bytes each GPU sends per step), "compute",
    "communication", "offload", "optimizer", "step" (seconds per step).
    value: the number (bytes or seconds). case: the branch that applies (e.g. "stage3", "offload").
    inputs: symbol -> number (units in :data:`INPUT_UNITS`). parts: label -> number; they sum to ``value``.
    """

    key: str
    value: float
    unit: str
    case: str
    inputs: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)


INPUT_UNITS = {
    "Psi": "parameters", "Psi_t": "parameters", "Psi_f": "parameters", "Psi_persist": "parameters",
    "N_d": "GPUs", "w": "bytes/parameter", "w_f": "bytes/parameter", "g32": "bytes/parameter",
    "K": "bytes/parameter", "master": "bytes/parameter", "opt_state": "bytes/parameter", "hpz": "GPUs",
    "L": "layers", "s": "tokens", "b": "sequences", "h": "elements", "V": "tokens", "a_b": "bytes/element",
    "layer": "bytes", "t": "GPUs", "bucket": "elements", "overlap": "x", "live": "elements",
    "largest": "elements", "prefetch": "elements", "context": "bytes", "frag": "fraction", "live_bytes": "bytes",
    "ga": "micro-steps", "tokens_micro": "tokens", "flops_token": "FLOP/token", "model_flops_token": "FLOP/token",
    "peak": "FLOP/s", "mfu": "fraction", "fwd_comm": "s", "bwd_comm": "s", "fwd_compute": "s",
    "bwd_compute": "s", "boundary": "s", "pcie_micro": "s", "micro_compute": "s", "pcie_boundary": "s",
    "nvme": "s", "touched": "bytes/parameter", "hbm": "bytes/s", "gpn": "GPUs", "cpu_rate": "parameters/s",
    "shard": "parameters", "frac": "fraction",
}
"""Unit of each input symbol."""


def _one(x) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def _setup(scenario: Scenario) -> tuple[Context, Candidates, float]:
    ctx = make_context(scenario)
    cand = Candidates.from_scenario(scenario)
    n = _one(data_parallel_degree(ctx, cand))
    return ctx, cand, n


def parameters(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of the working parameters (memory.model_state_bytes, "parameters")."""
    ctx, cand, n = _setup(scenario)
    z, t = scenario.zero, scenario.training
    P, T, F = ctx.params, ctx.trainable, ctx.frozen
    w, fw = ctx.weight_bytes, ctx.frozen_weight_bytes
    hpz = z.zero_hpz_partition_size
    paper = scenario.assumptions.accounting == "paper"
    inputs = {"Psi": P, "Psi_t": T, "Psi_f": F, "w": w, "w_f": fw, "N_d": n, "Psi_persist": ctx.persistent_params,
              "hpz": float(hpz)}
    hpz_part = P * w / hpz if hpz > 1 else 0.0
    if z.stage < 3:
        parts = {"frozen base": F * fw, "trainable": T * w}
        case = "replicated"
    elif paper:
        parts = {"partition": P * w / n}
        case = "stage3_paper"
    elif z.offload_param.device != "none":
        parts = {"persistent": ctx.persistent_params * w, "frozen base": F * fw if t.qlora else 0.0}
        case = "stage3_offload"
    else:
        parts = {"frozen base": F * fw if t.qlora else F * fw / n, "trainable": T * w / n,
                 "persistent": ctx.persistent_params * w * (1.0 - 1.0 / n)}
        case = "stage3_qlora" if t.qlora else "stage3"
    if z.stage == 3:
        parts["hpZ secondary copy"] = hpz_part
    return TermValues("parameters", sum(parts.values()), "bytes", case, inputs, parts)


def gradients(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of gradients (memory.model_state_bytes, "gradients"): the working-precision gradients and the
    fp32 gradient copies DeepSpeed keeps beside them (measured census, docs/validation.md)."""
    ctx, cand, n = _setup(scenario)
    z, t = scenario.zero, scenario.training
    T, w = ctx.trainable, ctx.weight_bytes
    paper = scenario.assumptions.accounting == "paper"
    off_opt = z.offload_optimizer.device != "none"
    accumulating = z.stage == 1 and t.grad_accum > 1
    inputs = {"Psi_t": T, "w": w, "N_d": n, "ga": float(t.grad_accum)}
    if paper:
        parts = {"working-precision gradients": T * w / n if z.stage >= 2 else T * w}
        case = "paper_partitioned" if z.stage >= 2 else "paper_replicated"
    elif z.stage == 0:
        parts = {"working-precision gradients": T * w,
                 "fp32 copies (mixed-precision wrapper)": 4.0 * T if ctx.mixed else 0.0}
        case = "stage0"
    elif off_opt:
        parts = {"accumulated working-precision gradients": T * w if accumulating else 0.0}
        case = "offload_accumulating" if accumulating else "offload"
    elif accumulating:
        parts = {"accumulated working-precision gradients": T * w, "fp32 gradient partition": 4.0 * T / n}
        case = "stage1_accumulating"
    else:
        parts = {"working-precision gradient partition": T * w / n, "fp32 gradient partition": 4.0 * T / n}
        case = "partitioned"
    return TermValues("gradients", sum(parts.values()), "bytes", case, inputs, parts)


def optimizer_states(scenario: Scenario) -> TermValues:
    """Per-GPU bytes of fp32 master weights + optimizer states: K·Ψ_t, divided by N_d from stage 1; 0 offloaded.
    DeepSpeed's ZeRO optimizers keep a 4-byte fp32 master partition even in fp32 training (measured)."""
    ctx, cand, n = _setup(scenario)
    z = scenario.zero
    T = ctx.trainable
    paper = scenario.assumptions.accounting == "paper"
    off = z.offload_optimizer.device != "none"
    shard = n if z.stage >= 1 else 1.0
    master_bytes = 4.0 if (z.stage >= 1 and not paper) else ctx.master_bytes
    master = 0.0 if off else master_bytes * T / shard
    states = 0.0 if off else ctx.optimizer_state_bytes * T / shard
    case = "offload" if off else ("partitioned" if z.stage >= 1 else "replicated")
    inputs = {"Psi_t": T, "K": master_bytes + ctx.optimizer_state_bytes, "master": master_bytes,
              "opt_state": ctx.optimizer_state_bytes, "N_d": n, "shard": shard}
    return TermValues("optimizer_states", master + states, "bytes", case, inputs,
                      {"fp32 master weights": master, "optimizer states": states})


def activations(scenario: Scenario) -> TermValues:
    """Per-GPU activation bytes, as activations.activation_parts splits them: stored layer activations (or with
    full checkpointing the layer inputs + one layer recomputed), final norm and lm_head inputs, token ids / labels
    / rotary tables, and the logits. ``inputs`` carries what the formulas shown for them need."""
    ctx, cand, n = _setup(scenario)
    m, t = scenario.model, scenario.training
    s, b, h, V = float(t.seq_len), float(t.micro_batch), float(m.hidden_size), float(m.vocab_size)
    ab = 4.0 if t.precision == "fp32" else 2.0
    L = float(m.n_layers)
    layer = _one(layer_activation_bytes(ctx, cand.micro_batch, cand.checkpointing))
    got = {k: _one(v) for k, v in activation_parts(ctx, cand).items()}
    labels = {"layers": "layer inputs + one layer recomputed" if t.checkpointing == "full"
              else "saved layer activations", "final": "final norm + lm_head inputs",
              "inputs": "token ids, labels, rotary tables", "logits": "logits + fp32 log-softmax"}
    parts = {labels[k]: got[k] for k in ("layers", "final", "inputs", "logits")}
    shared = 0.0 if m.norm_kind == "rmsnorm" else ab * s * b * h
    rotary = 0.0 if m.learned_position_embeddings > 0 else 2.0 * ab * s * b * m.dim_head
    inputs = {"L": L, "s": s, "b": b, "h": h, "V": V, "a_b": ab, "layer": layer, "t": float(ctx.tp),
              "shared": shared, "d_head": float(m.dim_head), "rotary": 1.0 if rotary else 0.0}
    return TermValues("activations", sum(parts.values()), "bytes", t.checkpointing, inputs, parts)


def activation_formula_parts(tv: TermValues) -> dict[str, float]:
    """The closed formulas :mod:`zeroplanner.explain` prints for the activation parts, evaluated from ``tv.inputs``
    (tests check they equal the cost model's parts, so the printed formulas cannot drift from it)."""
    i = tv.inputs
    sb = i["s"] * i["b"]
    layers = (i["L"] * i["a_b"] * sb * i["h"] + i["layer"] - i["shared"] if tv.case == "full"
              else i["L"] * i["layer"])
    return {"layers": layers, "inputs": 16.0 * sb + i["rotary"] * 2.0 * i["a_b"] * sb * i["d_head"],
            "logits": (i["a_b"] + 4.0) * sb * i["V"] / i["t"]}


def buffers(scenario: Scenario) -> TermValues:
    """Per-GPU communication buffers and the stage-3 gathered working set (memory.buffer_bytes): the whole
    reduce_bucket_size bucket as DeepSpeed allocates it (x2 with overlap_comm at stages 1-2; the paper accounting
    min(bucket, Ψ_t)); stage 3 also the parameters kept gathered from forward into backward."""
    ctx, cand, n = _setup(scenario)
    z = scenario.zero
    w, T = ctx.weight_bytes, ctx.trainable
    paper = scenario.assumptions.accounting == "paper"
    overlap = 2.0 if bool(_one(overlap_comm(ctx, cand))) else 1.0
    # DeepSpeed allocates the whole reduce bucket (measured; memory.buffer_bytes), the paper accounting min(B, Ψ_t)
    bucket = float(min(z.reduce_bucket_size, T)) if paper else float(z.reduce_bucket_size)
    bucket3 = bucket
    inputs = {"w": w, "Psi_t": T, "overlap": overlap}
    if z.stage == 0:
        inputs["bucket"] = float(min(STAGE0_ALLREDUCE_BUCKET, T))
        parts = {"all-reduce bucket": min(STAGE0_ALLREDUCE_BUCKET, T) * w}
        case = "stage0"
    elif z.stage <= 2:
        inputs["bucket"] = bucket
        parts = {"reduce bucket": bucket * w * overlap}
        if z.offload_optimizer.device != "none" and not paper:
            inputs["largest"] = ctx.largest_module
            parts["offload staging buffer"] = ctx.largest_module * w
        case = "stage12"
    else:
        kept = min(z.stage3_max_live_parameters, z.stage3_max_reuse_distance,
                   max(ctx.params - ctx.persistent_params, 0.0))
        live = min(z.stage3_max_live_parameters, max(ctx.largest_module + z.stage3_prefetch_bucket_size, kept),
                   ctx.params)
        copies = overlap if paper else 1.0
        inputs.update(bucket=bucket3, live=float(z.stage3_max_live_parameters), largest=ctx.largest_module,
                      prefetch=float(z.stage3_prefetch_bucket_size), kept=float(kept), Psi=ctx.params, copies=copies)
        parts = {"gathered live parameters": live * w, "largest module's gradient": ctx.largest_module * w,
                 "reduce bucket": bucket3 * w * copies}
        case = "stage3"
    return TermValues("buffers", sum(parts.values()), "bytes", case, inputs, parts)


def overhead(scenario: Scenario) -> TermValues:
    """CUDA context + workspaces, plus allocator fragmentation x the live bytes of the other five terms."""
    a = scenario.assumptions
    live = sum(f(scenario).value for f in (parameters, gradients, optimizer_states, activations, buffers))
    parts = {"CUDA context": float(a.cuda_context_bytes),
             "allocator fragmentation": a.allocator_fragmentation_fraction * live}
    inputs = {"context": float(a.cuda_context_bytes), "frag": a.allocator_fragmentation_fraction,
              "live_bytes": live}
    return TermValues("overhead", sum(parts.values()), "bytes", "always", inputs, parts)


MEMORY_FUNCTIONS = {
    "parameters": parameters, "gradients": gradients, "optimizer_states": optimizer_states,
    "activations": activations, "buffers": buffers, "overhead": overhead,
}
"""Estimate.per_gpu_bytes key -> the function explaining it."""


def host_memory(scenario: Scenario) -> TermValues:
    """Host RAM per node for offloaded states, bytes (memory.host_and_nvme_bytes): GPUs per node x (per-rank
    optimizer states + fp32 master, fp32 gradients, DeepSpeed's 16-bit host copies, parameter partition or
    pinned swap buffers)."""
    ctx, cand, n = _setup(scenario)
    z = scenario.zero
    g = float(ctx.gpus_per_node)
    T, P, w = ctx.trainable, ctx.params, ctx.weight_bytes
    paper = scenario.assumptions.accounting == "paper"
    K = (ctx.master_bytes if paper else 4.0) + ctx.optimizer_state_bytes
    parts: dict[str, float] = {}
    if z.offload_optimizer.device != "none":
        if z.offload_optimizer.device == "cpu":
            parts["optimizer states + fp32 master"] = g * K * T / n
        else:
            parts["pinned NVMe swap buffers (optimizer)"] = (
                g * OFFLOAD_OPTIMIZER_BUFFER_COUNT * min(SUB_GROUP_SIZE, T / n) * K)
        parts["fp32 gradients"] = g * 4.0 * T / n
        if not paper:
            parts["16-bit host copies"] = g * w * T / n
            if z.stage <= 2:
                parts["16-bit staging buffer"] = g * ctx.largest_module * w
    if z.offload_param.device == "cpu":
        parts["parameter partition"] = g * P * w / n
    elif z.offload_param.device == "nvme":
        parts["pinned NVMe swap buffers (parameters)"] = (
            g * OFFLOAD_PARAM_BUFFER_COUNT * OFFLOAD_PARAM_BUFFER_SIZE * w)
    case = f"optimizer_{z.offload_optimizer.device}+param_{z.offload_param.device}"
    inputs = {"gpn": g, "Psi_t": T, "Psi": P, "K": K, "N_d": n, "w": w, "largest": ctx.largest_module}
    return TermValues("host_memory", sum(parts.values()), "bytes", case, inputs, parts)


def communication_volume(scenario: Scenario) -> TermValues:
    """Bytes each GPU sends per step over the rings: all-reduce 2(N_d-1)/N_d x its size, reduce-scatter and
    all-gather (N_d-1)/N_d x theirs (communication.communication_terms, "wire_bytes")."""
    ctx, cand, n = _setup(scenario)
    comm = communication_terms(ctx, cand)
    frac = (n - 1.0) / n if n > 1 else 0.0
    parts = {"all-reduce": 2.0 * frac * _one(comm["all_reduce"]),
             "reduce-scatter": frac * _one(comm["reduce_scatter"]),
             "all-gather": frac * _one(comm["all_gather"])}
    inputs = {"N_d": n, "frac": frac, "Psi_t": ctx.trainable, "Psi": ctx.params, "w": ctx.weight_bytes,
              "ga": float(scenario.training.grad_accum)}
    sizes = {f"size {k}": _one(comm[k]) for k in ("all_reduce", "reduce_scatter", "all_gather")}
    inputs.update(sizes)
    return TermValues("communication_volume", _one(comm["wire_bytes"]), "bytes", f"stage{scenario.zero.stage}",
                      inputs, parts)


def compute(scenario: Scenario) -> TermValues:
    """Compute seconds per step: GA x tokens per micro-batch x executed FLOPs per token / (peak x MFU)."""
    ctx, cand, n = _setup(scenario)
    model, executed, fwd = (_one(x) for x in flops_per_token(ctx, cand))
    comp = compute_terms(ctx, cand)
    t = scenario.training
    tokens = float(t.micro_batch * t.seq_len)
    inputs = {"ga": float(t.grad_accum), "tokens_micro": tokens, "flops_token": executed,
              "model_flops_token": model, "peak": ctx.peak_flops,
              "mfu": _one(comp["achieved_fraction"])}
    seconds = _one(comp["seconds"])
    parts = {"forward": float(t.grad_accum) * _one(comp["fwd_seconds_micro"]),
             "backward (+ recompute)": float(t.grad_accum) * _one(comp["bwd_seconds_micro"])}
    if t.qlora:
        parts["QLoRA dequantisation"] = float(t.grad_accum) * _one(comp["dequant_seconds_micro"])
    return TermValues("compute", seconds, "seconds", t.checkpointing, inputs, parts)


def communication(scenario: Scenario) -> TermValues:
    """Exposed communication seconds per step: collectives at the step boundary + per micro-step the part of the
    forward / backward collectives that compute does not hide (overlap_comm), as in evaluate.evaluate."""
    ctx, cand, n = _setup(scenario)
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
              "bwd_compute": bwd_comp, "overlap": 1.0 if overlap else 0.0, "N_d": n,
              "total": _one(comm["seconds"])}
    return TermValues("communication", sum(parts.values()), "seconds", "overlap" if overlap else "no_overlap",
                      inputs, parts)


def offload(scenario: Scenario) -> TermValues:
    """Exposed offload seconds per step: PCIe traffic compute does not hide, the boundary upload, NVMe swapping."""
    ctx, cand, n = _setup(scenario)
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
    return TermValues("offload", sum(parts.values()), "seconds", case, inputs, parts)


def optimizer(scenario: Scenario) -> TermValues:
    """Optimizer-step seconds: on GPU, bytes touched per parameter of the shard / HBM bandwidth; offloaded,
    GPUs per node x Ψ_t/N_d updates at DeepSpeed CPU-Adam's rate."""
    ctx, cand, n = _setup(scenario)
    opt = optimizer_and_offload_terms(ctx, cand)
    from .context import OPTIMIZER_BYTES_TOUCHED

    T = ctx.trainable
    value = _one(opt["optimizer_seconds"])
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
    """Step seconds = compute + exposed communication + exposed offload + optimizer step (evaluate.evaluate)."""
    parts = {k: f(scenario).value for k, f in (("compute", compute), ("communication", communication),
                                                ("offload", offload), ("optimizer", optimizer))}
    return TermValues("step", sum(parts.values()), "seconds", "sum", dict(parts), parts)


TIME_FUNCTIONS = {"compute": compute, "communication": communication, "offload": offload, "optimizer": optimizer}
"""Step-time component -> the function explaining it (the app's chart shows offload + optimizer together)."""

ALL_FUNCTIONS = {**MEMORY_FUNCTIONS, "host_memory": host_memory, "communication_volume": communication_volume,
                 **TIME_FUNCTIONS, "step": step}
