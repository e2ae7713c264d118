"""What an experienced engineer says before the ZeRO stage: change the cluster when the network is the bottleneck,
change the method when the model fits only with offload, and state the defaults the verdict rests on.

:func:`zeroplanner.planner.plan` calls these after it has picked (``advice=True``, the default); each re-plans a
changed scenario with ``advice=False`` (no recursion), so every figure quoted is the planner's own prediction for
that scenario, ranked by the same policy. Nothing here is picked silently: the advice sits beside the pick.

Core module: imports the core only (no ipywidgets, bqplot or torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from .pitfalls import COMMUNICATION_SHARE_LIMIT
from .specs import ClusterSpec, Scenario
from .units import GIB

if TYPE_CHECKING:  # planner imports this module lazily, inside plan()
    from .costmodel import Estimate
    from .planner import Plan

CROSSOVER_MAX_GBPS = 3200.0
"""Highest inter-node bandwidth per node (Gbit/s) the crossover search tries: eight 400 Gbit/s NICs, one per GPU,
as in an NVIDIA DGX H100 (8 x ConnectX-7 400 Gb/s; the ``ib-ndr-8x`` network preset), the fastest preset."""

CROSSOVER_STEPS = 14
"""Bisection steps on log(bandwidth) between the cluster's bandwidth and :data:`CROSSOVER_MAX_GBPS`: at most 3200x
apart, so the answer is within 3200 ** (2 ** -14) - 1 = 0.05% of the crossing (it is printed to 2 digits)."""

ADVICE_LORA_RANK = 8
"""LoRA rank the method advice prices for a full fine-tune: the default ``r`` of PEFT's ``LoraConfig``
(peft/tuners/lora/config.py, ``r: int = 8``) and the ``lora_rank`` default of LLaMA-Factory
(hparams/finetuning_args.py) and ms-swift."""

QLORA_PAPER = "the QLoRA paper (Dettmers et al., arXiv 2305.14314)"

STORAGE_FOR_PRECISION = {"bf16": "bfloat16", "fp16": "float16"}
"""Training precision -> the ``bnb_4bit_quant_storage`` that lets ZeRO-3 shard a 4-bit base
(:data:`zeroplanner.specs.QUANT_STORAGE_PRECISION` inverted)."""


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ClusterAdvice(_Out):
    """Fewer nodes, same GPUs per node and the same global batch (gradient accumulation scaled up), when exposed
    communication is above :data:`zeroplanner.pitfalls.COMMUNICATION_SHARE_LIMIT` of the step."""

    nodes: int
    """The scenario's node count."""
    exposed_fraction: float
    """Exposed communication / step time of the pick on ``nodes`` nodes."""
    tokens_per_second: float
    """The pick's predicted tokens/s on ``nodes`` nodes."""
    fewer_nodes: int
    """The node count whose pick is fastest (< ``nodes``)."""
    fewer_nodes_label: str
    """The planner's pick on ``fewer_nodes`` nodes (:attr:`zeroplanner.planner.Choice.label`)."""
    fewer_nodes_tokens_per_second: float
    speedup: float
    """``fewer_nodes_tokens_per_second / tokens_per_second`` (> 1)."""
    inter_node_gbps: float
    """The scenario's inter-node bandwidth per node, Gbit/s (link rate x NICs)."""
    crossover_inter_node_gbps: float | None
    """Inter-node bandwidth per node (Gbit/s, the preset's efficiency and latency kept) from which the pick on
    ``nodes`` nodes is at least as fast as the one on ``fewer_nodes``; None when not even at
    ``searched_up_to_gbps``."""
    searched_up_to_gbps: float
    text: str


class MethodAdvice(_Out):
    """A cheaper training method than the scenario's, priced by the planner and never picked for the user."""

    method: Literal["lora", "qlora", "qlora_storage"]
    """``lora``: LoRA instead of a full fine-tune; ``qlora``: a 4-bit base instead of a 16-bit one;
    ``qlora_storage``: the same QLoRA with ``bnb_4bit_quant_storage`` = the training dtype (ZeRO-3 shards it)."""
    changes: dict[str, object]
    """Input key -> value (:data:`zeroplanner.inputs.INPUTS`) that make the change."""
    flags: str
    """The same change as CLI options."""
    fits: bool
    label: str | None
    """The planner's pick with the change (None when nothing fits)."""
    tokens_per_second: float
    offloads: bool
    """Whether that pick still offloads to CPU or NVMe."""
    text: str


def _fmt_gbps(x: float) -> str:
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def _round_up_2(x: float) -> float:
    """``x`` rounded up to two significant digits (a crossover is quoted as 'above N')."""
    if x <= 0:
        return x
    q = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / q - 1e-9) * q


def with_nodes(scenario: Scenario, nodes: int) -> Scenario | None:
    """``scenario`` on ``nodes`` nodes at the same global batch: ``grad_accum`` x (old nodes / ``nodes``), the
    micro-batch unchanged (the planner then searches the split). None when the node count does not divide evenly or
    the result is not a valid scenario."""
    c, t = scenario.cluster, scenario.training
    if nodes < 1 or (t.grad_accum * c.nodes) % nodes:
        return None
    data = scenario.model_dump()
    data["cluster"]["nodes"] = nodes
    data["training"]["grad_accum"] = t.grad_accum * c.nodes // nodes
    try:
        return Scenario.model_validate(data)
    except ValidationError:
        return None


def with_inter_node_gbps(scenario: Scenario, gbps: float) -> Scenario:
    """``scenario`` with one NIC of ``gbps`` Gbit/s per node; the preset's kind, efficiency and latency stay: the
    ``inter_node_gbps`` input applied (:data:`zeroplanner.inputs.BY_KEY`, what ``--inter-node-gbps`` does)."""
    from .inputs import BY_KEY

    data = scenario.model_dump()
    BY_KEY["inter_node_gbps"].apply(data, float(gbps))
    return Scenario.model_validate(data)


def sentence(text: str) -> str:
    """An assumption or advice line as a sentence on a page (capitalised, full stop), for the app, tutorial and
    report; the CLI prints the lines as they are."""
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _pick_tps(scenario: Scenario, held, tolerance: float) -> tuple[float, Plan | None]:
    from .planner import plan

    try:
        p = plan(scenario, held=held, tolerance=tolerance, advice=False)
    except ValueError:
        return 0.0, None
    return (p.estimate.tokens_per_second if p.fits else 0.0), p


def cluster_advice(scenario: Scenario, p: Plan, held=(), tolerance: float = 0.1) -> ClusterAdvice | None:
    """Fewer nodes when the network is the bottleneck, or None.

    Applies when the plan fits on more than one node and its exposed communication is above
    :data:`~zeroplanner.pitfalls.COMMUNICATION_SHARE_LIMIT` of the step. Every proper divisor M of the node count is
    planned (:func:`with_nodes`: same GPUs per node, same global batch, the options in ``held`` still held); the
    fastest fitting one is advised when it beats the pick by more than 1%. The crossover is the inter-node bandwidth
    per node (Gbit/s, :func:`with_inter_node_gbps`) at which the planner's pick on the scenario's nodes becomes at
    least as fast as its pick on M nodes (both re-planned at each bandwidth), found by bisection on log(bandwidth)
    (:data:`CROSSOVER_STEPS`) between the scenario's bandwidth and :data:`CROSSOVER_MAX_GBPS`; it assumes the gap
    shrinks monotonically with bandwidth, which holds for the cost model's communication time (bandwidth enters as
    bytes / busbw).
    """
    c = scenario.cluster
    if c.nodes < 2 or not p.fits or p.estimate.step_seconds <= 0:
        return None
    est = p.estimate
    share = est.communication.exposed_seconds_per_step / est.step_seconds
    if share <= COMMUNICATION_SHARE_LIMIT:
        return None
    best: tuple[int, float, Plan, Scenario] | None = None
    for m in (d for d in range(1, c.nodes) if c.nodes % d == 0):
        sm = with_nodes(scenario, m)
        if sm is None:
            continue
        tps, pm = _pick_tps(sm, held, tolerance)
        if pm is not None and tps > 0 and (best is None or tps > best[1]):
            best = (m, tps, pm, sm)
    if best is None or best[1] <= est.tokens_per_second * 1.01:
        return None
    m, m_tps, pm, sm = best
    from .inputs import BY_KEY

    now_gbps = float(BY_KEY["inter_node_gbps"].read(scenario))

    def gap(gbps: float) -> float:  # > 0 while the fewer-node pick is faster
        n_tps = _pick_tps(with_inter_node_gbps(scenario, gbps), held, tolerance)[0]
        f_tps = m_tps if m == 1 else _pick_tps(with_inter_node_gbps(sm, gbps), held, tolerance)[0]
        return f_tps - n_tps

    top = max(CROSSOVER_MAX_GBPS, now_gbps)
    crossover = None
    if gap(top) <= 0:
        lo, hi = math.log(now_gbps), math.log(top)
        for _ in range(CROSSOVER_STEPS):
            mid = 0.5 * (lo + hi)
            if gap(math.exp(mid)) > 0:
                lo = mid
            else:
                hi = mid
        crossover = _round_up_2(math.exp(hi))
    speedup = m_tps / est.tokens_per_second
    where = "1 node" if m == 1 else f"{m} nodes"
    pays = (f"{c.nodes} nodes pay off only above {_fmt_gbps(crossover)} Gbit/s per node ({c.network.name}'s "
            f"efficiency and latency kept; now {_fmt_gbps(now_gbps)} Gbit/s)" if crossover is not None else
            f"{c.nodes} nodes are not faster even at {_fmt_gbps(top)} Gbit/s per node")
    text = (f"Train on {where}: {m_tps:,.0f} tokens/s, {faster_text(speedup)} than {c.nodes} nodes "
            f"({est.tokens_per_second:,.0f} tokens/s, {share:.0%} of the step exposed communication, above the "
            f"{COMMUNICATION_SHARE_LIMIT:.0%} rule of thumb) at the same global batch: on {m * c.gpus_per_node} "
            f"GPUs the planner picks {pm.choice.label}, rerun with --nodes {m} --micro-batch "
            f"{pm.choice.micro_batch} --grad-accum {pm.choice.grad_accum}; {pays}.")
    return ClusterAdvice(
        nodes=c.nodes, exposed_fraction=share, tokens_per_second=est.tokens_per_second, fewer_nodes=m,
        fewer_nodes_label=pm.choice.label, fewer_nodes_tokens_per_second=m_tps, speedup=speedup,
        inter_node_gbps=now_gbps, crossover_inter_node_gbps=crossover, searched_up_to_gbps=top, text=text)


def faster_text(speedup: float) -> str:
    """How much faster a ratio of tokens/s above 1 is, as people say it: "4% faster" below 1.5x (where "1.0x
    faster" would read as no gain), "2.3x faster" from 1.5x."""
    return f"{speedup - 1.0:.0%} faster" if speedup < 1.5 else f"{speedup:.1f}x faster"


def _method_options(scenario: Scenario) -> list[tuple[str, dict[str, object], str, str]]:
    """(method, input changes, CLI flags, what it is) of the cheaper methods for the scenario's training."""
    t = scenario.training
    storage = STORAGE_FOR_PRECISION.get(t.precision)
    out = []
    if not t.lora_rank:
        out.append(("lora", {"lora_rank": ADVICE_LORA_RANK}, f"--lora-rank {ADVICE_LORA_RANK}",
                    f"LoRA rank {ADVICE_LORA_RANK} on {', '.join(t.lora_targets)} (adapters train, the base is "
                    "frozen: no gradients or optimizer states for it)"))
    if storage is not None and not t.qlora:
        rank = t.lora_rank or ADVICE_LORA_RANK
        out.append(("qlora", {"lora_rank": rank, "qlora": True, "bnb_4bit_quant_storage": storage},
                    (f"--lora-rank {rank} " if not t.lora_rank else "") + f"--qlora --bnb-4bit-quant-storage "
                    f"{storage}", f"QLoRA (4-bit NF4 base stored as {storage}, so ZeRO-3 shards it)"))
    elif storage is not None and t.qlora and t.bnb_4bit_quant_storage == "uint8":
        out.append(("qlora_storage", {"bnb_4bit_quant_storage": storage}, f"--bnb-4bit-quant-storage {storage}",
                    f"the same QLoRA with bnb_4bit_quant_storage {storage} (ZeRO-3 then shards the 4-bit base; "
                    "with uint8 DeepSpeed leaves it whole on every GPU)"))
    return out


def _changed(scenario: Scenario, changes: dict[str, object]) -> Scenario | None:
    data = scenario.model_dump()
    data["training"].update(changes)
    try:
        return Scenario.model_validate(data)
    except ValidationError:
        return None


def method_advice(scenario: Scenario, p: Plan | None, held=(), tolerance: float = 0.1) -> list[MethodAdvice]:
    """Cheaper methods, priced, when the pick ``p`` offloads (whether or not a slower candidate fits without) or
    nothing fits (``p`` None, or a plan that does not fit); [] otherwise.

    A full fine-tune is offered LoRA (:data:`ADVICE_LORA_RANK`) and QLoRA; LoRA is offered QLoRA with
    ``bnb_4bit_quant_storage`` = the training dtype (DeepSpeed ZeRO-3 shards a 4-bit base only then: it casts
    floating-point parameters to the training dtype, runtime/engine.py ``_cast_module_mixed_precision``, and leaves
    uint8 ones whole); QLoRA with uint8 storage is offered that storage. Each is re-planned with the same held
    options; one is kept when it fits and either the scenario does not fit, or it is faster by more than 1%, or it
    needs no offload. Each text says it is a change of method, and the defaults its pick assumes that the plan's
    own assumptions do not already state (:func:`verdict_assumptions`)."""
    fits = p is not None and p.fits
    if fits and p.choice.offload_optimizer == "none" and p.choice.offload_param == "none":
        return []
    stated = p.assumptions if p is not None else []
    out = []
    for method, changes, flags, what in _method_options(scenario):
        sc = _changed(scenario, changes)
        if sc is None:
            continue
        tps, q = _pick_tps(sc, held, tolerance)
        if q is None or not q.fits:
            continue
        offloads = q.choice.offload_optimizer != "none" or q.choice.offload_param != "none"
        now = p.estimate.tokens_per_second if fits else 0.0
        if fits and tps <= now * 1.01 and offloads:
            continue
        if fits:
            versus = f"{tps / now:.1f}x the pick's {now:,.0f} tokens/s" if now > 0 else "the pick does not run"
        else:
            versus = "where the current method fits nothing"
        nvme = ", no NVMe" if (fits and "nvme" in (p.choice.offload_optimizer, p.choice.offload_param)
                               and "nvme" not in (q.choice.offload_optimizer, q.choice.offload_param)) else ""
        place = "without offload" if not offloads else "still with offload"
        caveat = (f" QLoRA trains adapters on a 4-bit base: {QLORA_PAPER} matches 16-bit LoRA on its benchmarks; "
                  "check your task." if method != "lora" else
                  " LoRA trains low-rank adapters only: quality can differ from a full fine-tune; check your task.")
        kind = "A QLoRA setting" if method == "qlora_storage" else "Change of method"
        assumed = [a for a in verdict_assumptions(sc, q.choice, priced=(q.scenario, q.estimate)) if a not in stated]
        also = f" It {'; '.join(assumed)}." if assumed else ""
        text = (f"{kind}, not picked for you: {what} ({flags}) fits as {q.choice.label} at {tps:,.0f} "
                f"tokens/s, {versus}, {place}{nvme}.{also}{caveat}")
        out.append(MethodAdvice(method=method, changes=changes, flags=flags, fits=True, label=q.choice.label,
                                tokens_per_second=tps, offloads=offloads, text=text))
    return out


_CLUSTER_DEFAULTS = {name: f.default for name, f in ClusterSpec.model_fields.items()}


def _assumed(key: str, field: str, value, given: Iterable[str] | None) -> bool:
    """Whether ``key`` (an input key) rests on the default: not in ``given`` (the CLI's typed options), or, without
    ``given`` (the Python API, the app), equal to ClusterSpec's default."""
    if given is not None:
        return key not in given
    return value == _CLUSTER_DEFAULTS[field]


ADVICE_CPU_ADAM_THREADS = 8
"""The thread count the CPU-Adam assumption prices as well: 8 per rank, one rank's share of a 64-core host with 8
GPUs (an example, not an input: the planner prices what --cpu-adam-threads-per-rank says)."""


def verdict_assumptions(scenario: Scenario, choice, given: Iterable[str] | None = None, *,
                        priced: tuple[Scenario, Estimate] | None = None) -> list[str]:
    """The defaults the verdict on ``choice`` (a :class:`zeroplanner.planner.Choice`, or None when nothing fits:
    then the scenario's own offload) rests on and the user did not give, one sentence each with the option that
    sets it: NVMe capacity (offload to NVMe), host RAM (any offload), the CPU-Adam rate (optimizer offload) and the
    network preset's numbers (more than one node, no ``--inter-node-gbps``). ``given``: input keys the user set
    (None: a value equal to ClusterSpec's default counts as not given). ``priced``: the scenario the verdict prices
    (``choice`` applied to ``scenario``; ``scenario`` itself when nothing fits) and its Estimate, when the caller
    has them (computed otherwise): the CPU-Adam sentence states the host's optimizer step as that Estimate's
    ``optimizer_seconds_per_step`` and, at more threads, as the Estimate of the same scenario with those threads,
    so the seconds it names are the step time's (AutoTP's smaller shard included)."""
    from .inputs import BY_KEY

    given = None if given is None else set(given)
    c = scenario.cluster
    if choice is not None:
        oo, op = choice.offload_optimizer, choice.offload_param
    else:
        oo, op = scenario.zero.offload_optimizer.device, scenario.zero.offload_param.device
    out = []
    if "nvme" in (oo, op) and _assumed("nvme_capacity_gib", "nvme_bytes", c.nvme_bytes, given):
        out.append(f"assumes {c.nvme_bytes / GIB:,.0f} GiB NVMe per node at {c.nvme_gb_per_s:g} GB/s (not given): "
                   f"set {BY_KEY['nvme_capacity_gib'].cli_flag}, or measure with `zeroplanner probe`")
    if (oo != "none" or op != "none") and _assumed("cpu_memory_gib", "cpu_memory_bytes", c.cpu_memory_bytes, given):
        out.append(f"assumes {c.cpu_memory_bytes / GIB:,.0f} GiB host RAM per node (not given): set "
                   f"{BY_KEY['cpu_memory_gib'].cli_flag}")
    if oo != "none" and _assumed("cpu_adam_params_per_second", "cpu_adam_params_per_second",
                                 c.cpu_adam_params_per_second, given):
        from .costmodel import estimate

        if priced is None:
            from .planner.grid import apply_choice

            sc = scenario if choice is None else apply_choice(scenario, choice, validate=False)
            priced = (sc, estimate(sc))
        sc, est = priced
        n = c.cpu_adam_threads_per_rank
        now = est.optimizer_seconds_per_step  # offloaded: DeepSpeedCPUAdam + the host's conversion (step_terms t_opt)
        more = ""
        if n < ADVICE_CPU_ADAM_THREADS:
            wider = sc.model_copy(update={"cluster": sc.cluster.model_copy(
                update={"cpu_adam_threads_per_rank": ADVICE_CPU_ADAM_THREADS})})
            more = (f"; at {ADVICE_CPU_ADAM_THREADS} threads per rank (OMP_NUM_THREADS={ADVICE_CPU_ADAM_THREADS}, "
                    f"or deepspeed --bind_cores_to_rank on {ADVICE_CPU_ADAM_THREADS * c.gpus_per_node} cores) "
                    f"{estimate(wider).optimizer_seconds_per_step:.2f} s")
        out.append(f"assumes DeepSpeedCPUAdam on {n} thread{'s' if n != 1 else ''} per rank (the rate per thread "
                   f"measured on one core here, not on your host; torchrun and accelerate launch set 1): the host's "
                   f"optimizer step takes {now:.2f} s{more}: set {BY_KEY['cpu_adam_threads_per_rank'].cli_flag} "
                   "to your launcher's OMP_NUM_THREADS, or measure with `zeroplanner probe --benchmarks` "
                   f"({BY_KEY['cpu_adam_params_per_second'].cli_flag})")
    if c.nodes > 1 and (given is None or "inter_node_gbps" not in given):
        n = c.network
        out.append(f"assumes the {n.name} preset between nodes: {n.nics_per_node} x {n.link_gbps:g} Gbit/s per node "
                   f"at {n.efficiency:.0%} of the link rate as bus bandwidth ({n.node_busbw_bytes_per_second / 1e9:.1f}"
                   f" GB/s), {n.latency_seconds * 1e6:g} us per ring step (preset numbers, not measured on your "
                   f"links): set {BY_KEY['inter_node_gbps'].cli_flag} or {BY_KEY['network'].cli_flag}")
    return out


__all__ = ["ClusterAdvice", "MethodAdvice", "cluster_advice", "method_advice", "sentence", "verdict_assumptions",
           "with_nodes", "with_inter_node_gbps", "CROSSOVER_MAX_GBPS", "ADVICE_LORA_RANK"]
