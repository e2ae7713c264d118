"""The candidate grid: every configuration the planner evaluates, and the way back from a grid row to a
:class:`~.models.Choice` and a scenario.

Candidates: ZeRO stage x offload_optimizer x offload_param (stage 3) x activation checkpointing x micro-batch
(the samples per GPU per step, micro_batch x gradient_accumulation_steps, stay fixed, so the global batch is the
user's) x ZeRO++ (stage 3 on more than one node) x overlap_comm (stages 1-2) x reduce bucket (LoRA) x, for long
sequences (:data:`SP_MIN_SEQUENCE_TOKENS`) or when nothing fits without it, the Ulysses degree
(:func:`sequence_parallel_options`: divisors of the GPUs per node that the heads allow). All are evaluated in one
vectorised call. ``held`` (input keys of :data:`SEARCH_INPUTS`) fixes an axis at the scenario's
value: ``plan(s, held={"stage"})`` searches only ``s.zero.stage`` (the CLI holds every option the user gave).
DeepSpeed AutoTP degrees 2, 4, 8 (:func:`autotp_degrees`) join as one more grid per degree only on one node, in a
full fine-tune without a Ulysses search, with the scenario at tp 1 and no tp-1 candidate at ZeRO-0/1/2 fitting
without offload (so tp 1 needs ZeRO-3 or offload): AutoTP's per-layer all-reduces need the node's NVLink (across
nodes they would run at NIC speed, so it is never a multi-node candidate), and the rule keeps plan time unchanged
whenever ZeRO-0/1/2 fit at tp 1 (measured: 1.7 ms for benchmarks/bench_costmodel.py's scenario before and after;
1.7 -> 5.0 ms for llama-3.1-8b on 8 x A100-40GB, where it applies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..costmodel import Candidates, Evaluation, evaluate, make_context
from ..costmodel.context import CHECKPOINT_CODES, OFFLOAD_CODES
from ..specs import Scenario, hardware_precision
from .models import Choice

OFFLOAD_NAMES = {v: k for k, v in OFFLOAD_CODES.items()}
CKPT_NAMES = {v: k for k, v in CHECKPOINT_CODES.items()}

SEARCH_INPUTS: dict[str, str] = {
    "stage": "ZeRO stage",
    "offload_optimizer": "optimizer offload",
    "offload_param": "parameter offload",
    "checkpointing": "activation checkpointing",
    "micro_batch": "micro-batch split",
    "grad_accum": "micro-batch split",
    "overlap_comm": "overlap_comm",
    "reduce_bucket_size": "reduce bucket",
    "zero_hpz_partition_size": "ZeRO++",
    "zero_quantized_weights": "ZeRO++",
    "zero_quantized_gradients": "ZeRO++",
    "sequence_parallel_size": "sequence parallelism",
    "autotp_size": "AutoTP degree",
}
"""Input keys (:data:`zeroplanner.inputs.INPUTS`) the planner varies, and the search axis each one fixes when held.
micro_batch and grad_accum are one axis (their product, the samples per GPU per step, is always kept); the three
ZeRO++ keys are one axis."""

SP_MIN_SEQUENCE_TOKENS = 16_384
"""From this sequence length on the planner also searches Ulysses sequence parallelism even when sp = 1 fits: the
length where activations, not model states, start to decide the fit of an 8B model on an 80 GB GPU (ALST,
Bekman et al. arXiv 2506.13996 Sec. 1: Llama-8B "with sequence over 32K runs out of memory on a basic Hugging
Face model" on one H100; half of it, so that the search starts before the wall). Below it sp > 1 is searched only
when nothing fits at sp = 1 (:func:`zeroplanner.planner.plan`)."""

AUTOTP_DEGREES = (2, 4, 8)
"""AutoTP degrees the planner tries (powers of two up to one 8-GPU node: DeepSpeed's AutoTP training tutorial and
the LLaMA-Factory / ms-swift presets use 2-8; more than a node is never tried, see :func:`autotp_degrees`)."""


def check_held(held) -> frozenset[str]:
    """``held`` as a frozenset of :data:`SEARCH_INPUTS` keys. Raises ValueError for a key the planner does not
    vary."""
    held = frozenset(held)
    unknown = held - set(SEARCH_INPUTS)
    if unknown:
        raise ValueError(f"held={sorted(unknown)}: the planner varies only {', '.join(SEARCH_INPUTS)}")
    return held


def held_value(scenario: Scenario, key: str):
    """The scenario's value of the :data:`SEARCH_INPUTS` key ``key`` (``offload_optimizer`` -> its device)."""
    z, t = scenario.zero, scenario.training
    return {"offload_optimizer": z.offload_optimizer.device, "offload_param": z.offload_param.device,
            "checkpointing": t.checkpointing, "micro_batch": t.micro_batch, "grad_accum": t.grad_accum,
            "sequence_parallel_size": scenario.cluster.sequence_parallel_size,
            "autotp_size": scenario.cluster.tensor_parallel_size}.get(key, getattr(z, key, None))


def held_values(scenario: Scenario, held: frozenset[str]) -> dict:
    """{held key: the scenario's value}, in :data:`SEARCH_INPUTS` order (:attr:`~.models.Plan.held`)."""
    return {k: held_value(scenario, k) for k in SEARCH_INPUTS if k in held}


def at_hardware_precision(scenario: Scenario) -> Scenario:
    """The scenario priced in the precision its GPU runs (:func:`~zeroplanner.specs.hardware_precision`: fp16 on a
    GPU without bf16); the scenario itself when that is its own."""
    if hardware_precision(scenario) == scenario.training.precision:
        return scenario
    return scenario.model_copy(update={
        "training": scenario.training.model_copy(update={"precision": hardware_precision(scenario)})})


def axis_values(cand: Candidates, tp: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Search axis name -> its column in the candidate grid (ZeRO++ as one code per (hpz, qwz, qgz); the AutoTP
    degree ``tp``, or one value when not given)."""
    cols = {"AutoTP degree": np.ones(cand.shape, dtype=np.int64) if tp is None else tp,
            "ZeRO stage": cand.stage, "optimizer offload": cand.offload_optimizer,
            "parameter offload": cand.offload_param, "activation checkpointing": cand.checkpointing,
            "micro-batch split": cand.micro_batch, "overlap_comm": cand.overlap, "reduce bucket": cand.reduce_bucket,
            "ZeRO++": cand.hpz * 4 + cand.qwz * 2 + cand.qgz, "sequence parallelism": cand.sp}
    return {a: np.asarray(cols[a]) for a in dict.fromkeys(SEARCH_INPUTS.values())}


def varied_axes(cand: Candidates, tp: np.ndarray | None = None) -> list[str]:
    """The search axes (:data:`SEARCH_INPUTS` names) on which the candidate grid holds more than one value (``tp``:
    the AutoTP degree of each candidate, when the plan varied it)."""
    return [a for a, col in axis_values(cand, tp).items() if col.size and col.min() != col.max()]


def quantized_zeropp_allowed(scenario: Scenario) -> tuple[bool, bool]:
    """(zero_quantized_weights, zero_quantized_gradients) the planner may pick: both when the scenario's
    ``training.allow_lossy_communication`` is on, else only what the scenario sets itself (a user who sets a flag
    keeps it). Lossy because qwZ all-gathers weights in int8 and qgZ reduce-scatters gradients in int4
    (:data:`~.reasons.ZERO_PP_PAPER`)."""
    z = scenario.zero
    allowed = scenario.training.allow_lossy_communication
    return allowed or z.zero_quantized_weights, allowed or z.zero_quantized_gradients


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def sequence_parallel_options(scenario: Scenario, held=(), *, within_node: bool = True) -> list[int]:
    """Ulysses degrees the planner may try: the scenario's own when ``sequence_parallel_size`` is held; else 1 and
    every divisor P > 1 of the GPUs per node (``within_node``: the all-to-alls stay on NVLink; else of the world
    size) that DeepSpeed accepts for the model (:func:`~zeroplanner.costmodel.ulysses.check_ulysses`: heads and KV
    heads), that divides the sequence and, with tensor parallelism, the world size / tp; none without a flash/sdpa
    attention (Ulysses refuses eager). Ascending ints."""
    from ..costmodel.ulysses import check_ulysses

    held = check_held(held)
    c, m, t = scenario.cluster, scenario.model, scenario.training
    if "sequence_parallel_size" in held:
        return [c.sequence_parallel_size]
    out = [1]
    if not t.flash_attention:
        return out
    for d in _divisors(c.gpus_per_node if within_node else c.world_size)[1:]:
        try:
            check_ulysses(n_heads=m.n_heads, kv_heads=m.kv_heads, sp_size=d, linear_mixer=m.linear_mixer)
        except ValueError:
            continue
        if scenario.sequence_tokens % d == 0 and c.world_size % (c.tensor_parallel_size * d) == 0:
            out.append(d)
    return out


def candidate_grid(scenario: Scenario, held=(), sp_values: Sequence[int] | None = None) -> Candidates:
    """Every candidate for the scenario (see module docstring); the axes of the ``held`` input keys
    (:data:`SEARCH_INPUTS`) take the scenario's value only. ``sp_values``: the Ulysses degrees to grid over
    (default: the scenario's ``sequence_parallel_size``; :func:`~zeroplanner.planner.plan` passes
    :func:`sequence_parallel_options` for long sequences). With ``checkpoint_offload`` only full checkpointing is a
    candidate (it offloads the checkpointed inputs). Returns 1-D Candidates (empty when the held values leave no
    valid combination, e.g. offload_optimizer held at ``cpu`` with stage held at 0). Raises ValueError for a held
    key the planner does not vary."""
    held = check_held(held)
    t, c, z = scenario.training, scenario.cluster, scenario.zero
    samples = t.micro_batch * t.grad_accum
    micros = [m for m in _divisors(samples) if m <= 64] or [1]
    if "micro_batch" in held or "grad_accum" in held:
        micros = [t.micro_batch]
    zpp = [(1, 0, 0)]
    if c.nodes > 1:
        # hpZ (a secondary weight copy per node) is lossless; the quantized collectives (qwZ int8 weights, qgZ int4
        # gradients) change the numerics, so they are candidates only when allowed or set by the user
        qw, qg = quantized_zeropp_allowed(scenario)
        zpp.append((c.gpus_per_node, int(qw), int(qg)))
    zpp_held_on = False
    if held & {"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"}:
        zpp = [(z.zero_hpz_partition_size, int(z.zero_quantized_weights), int(z.zero_quantized_gradients))]
        zpp_held_on = zpp[0] != (1, 0, 0)  # ZeRO++ is stage 3 only: a held ZeRO++ setting rules out stages 0-2
    stages = (z.stage,) if "stage" in held else range(4)
    oos = (OFFLOAD_CODES[z.offload_optimizer.device],) if "offload_optimizer" in held else (0, 1, 2)
    ops = (OFFLOAD_CODES[z.offload_param.device],) if "offload_param" in held else (0, 1, 2)
    cks = (CHECKPOINT_CODES[t.checkpointing],) if "checkpointing" in held or t.checkpoint_offload else (0, 1, 2)
    sps = tuple(sp_values) if sp_values is not None else (c.sequence_parallel_size,)
    ov_held = None if "overlap_comm" not in held or z.overlap_comm is None else int(z.overlap_comm)
    # DeepSpeed allocates the whole reduce bucket however few parameters train (memory.buffer_bytes), so with
    # Ψ_t below the bucket (LoRA/QLoRA) a bucket of Ψ_t (rounded up to 1e6 elements) is also a candidate: same
    # number of collectives, less memory.
    rb = scenario.zero.reduce_bucket_size
    small = int(max(1, math.ceil(scenario.trainable_parameters / c.tensor_parallel_size / 1e6)) * 1e6)
    buckets = (rb, small) if small < rb and "reduce_bucket_size" not in held else (rb,)
    rows = []
    for stage in stages:
        if zpp_held_on and stage < 3:
            continue
        # below stage 3 DeepSpeed offloads any offload_optimizer device to host RAM (stage_1_and_2.py: cpu_offload =
        # device != none; lint's nvme_optimizer_below_stage3): an NVMe optimizer there is a candidate only when held
        for oo in ((0,) if stage == 0 else (0, 1, 2) if stage == 3 or "offload_optimizer" in held else (0, 1)):
            if oo not in oos:
                continue
            for op in ((0, 1, 2) if stage == 3 else (0,)):
                if op not in ops:
                    continue
                for hpz, qw, qg in (zpp if stage == 3 else [(1, 0, 0)]):
                    ovs = (0, 1) if stage in (1, 2) else (1,) if stage == 3 else (0,)
                    for ov in (ovs if ov_held is None or stage == 0 else (ov_held,)):
                        for b in (buckets if stage > 0 else (rb,)):
                            rows.append((stage, oo, op, hpz, qw, qg, ov, b))
    # each configuration row at every (checkpointing, micro-batch) pair, checkpointing the slower axis: built with
    # numpy rather than one Python tuple per candidate (the grid was a tenth of a plan's time)
    per_row = len(cks) * len(micros)
    cfg = np.repeat(np.array(rows, dtype=np.int64).reshape(-1, 8), per_row, axis=0)
    ck_col = np.tile(np.repeat(np.asarray(cks, dtype=np.int64), len(micros)), len(rows))
    m_col = np.tile(np.asarray(micros, dtype=np.int64), len(rows) * len(cks))
    ga_col = samples // m_col
    sp_col = sps[0]
    if len(sps) > 1:  # every configuration at every Ulysses degree
        sp_col = np.tile(np.asarray(sps, dtype=np.int64), cfg.shape[0])
        cfg, ck_col, m_col, ga_col = (np.repeat(x, len(sps), axis=0) for x in (cfg, ck_col, m_col, ga_col))
    return Candidates.build(
        stage=cfg[:, 0], offload_optimizer=cfg[:, 1], offload_param=cfg[:, 2], checkpointing=ck_col,
        micro_batch=m_col, grad_accum=ga_col, nodes=c.nodes, hpz=cfg[:, 3], qwz=cfg[:, 4], qgz=cfg[:, 5],
        overlap=cfg[:, 6], reduce_bucket=cfg[:, 7], sp=sp_col,
    )


def choice_at(cand: Candidates, i: int, tp: np.ndarray | None = None) -> Choice:
    """Candidate ``i`` of the grid as a :class:`~.models.Choice` (``tp``: each candidate's AutoTP degree, when the
    plan varied it; else the Choice leaves the scenario's)."""
    return Choice(
        autotp_size=None if tp is None else int(tp[i]),
        stage=int(cand.stage[i]),
        offload_optimizer=OFFLOAD_NAMES[int(cand.offload_optimizer[i])],
        offload_param=OFFLOAD_NAMES[int(cand.offload_param[i])],
        checkpointing=CKPT_NAMES[int(cand.checkpointing[i])],
        micro_batch=int(cand.micro_batch[i]),
        grad_accum=int(cand.grad_accum[i]),
        overlap_comm=None if cand.overlap[i] < 0 else bool(cand.overlap[i]),
        reduce_bucket_size=int(cand.reduce_bucket[i]),
        zero_hpz_partition_size=int(cand.hpz[i]),
        zero_quantized_weights=bool(cand.qwz[i]),
        zero_quantized_gradients=bool(cand.qgz[i]),
        sequence_parallel_size=int(cand.sp[i]),
    )


def apply_choice(scenario: Scenario, choice: Choice, *, validate: bool = True) -> Scenario:
    """The scenario with the choice's settings. ``validate=False`` skips re-validation for choices the planner
    built itself from valid candidate codes (fast path: only changed sub-models are copied)."""
    z0, t0 = scenario.zero, scenario.training

    def offload(spec, device):
        return spec if spec.device == device else spec.model_copy(update={"device": device})

    z = z0.model_copy(update={
        "stage": choice.stage,
        "offload_optimizer": offload(z0.offload_optimizer, choice.offload_optimizer),
        "offload_param": offload(z0.offload_param, choice.offload_param),
        "zero_hpz_partition_size": choice.zero_hpz_partition_size,
        "zero_quantized_weights": choice.zero_quantized_weights,
        "zero_quantized_gradients": choice.zero_quantized_gradients,
        "overlap_comm": choice.overlap_comm,
        "reduce_bucket_size": choice.reduce_bucket_size or z0.reduce_bucket_size,
    })
    t = t0
    if (t0.checkpointing, t0.micro_batch, t0.grad_accum) != (choice.checkpointing, choice.micro_batch,
                                                              choice.grad_accum):
        t = t0.model_copy(update={
            "checkpointing": choice.checkpointing, "micro_batch": choice.micro_batch,
            "grad_accum": choice.grad_accum,
        })
    c = scenario.cluster
    if c.sequence_parallel_size != choice.sequence_parallel_size:
        c = c.model_copy(update={"sequence_parallel_size": choice.sequence_parallel_size})
    if choice.autotp_size is not None and choice.autotp_size != c.tensor_parallel_size:
        c = c.model_copy(update={"tensor_parallel_size": choice.autotp_size})
    if validate:
        return Scenario.model_validate({**scenario.model_dump(), "zero": z.model_dump(), "training": t.model_dump(),
                                        "cluster": c.model_dump()})
    return scenario.model_copy(update={"zero": z, "training": t, "cluster": c})


def autotp_degrees(scenario: Scenario, held, values: Evaluation, cand: Candidates) -> tuple[int, ...]:
    """The AutoTP degrees to add to the search, by the rule of the module docstring: one node, ``autotp_size`` not
    held, the scenario at tp 1, a full fine-tune (AutoTP with LoRA adapters is not priced), and no tp-1 candidate
    at ZeRO stage 0-2 that fits without offload with a headroom of at least the model's error of the peak
    (a fit below it is not proven; costmodel/timeline.py memory_error_fraction) (AutoTP shards the 16-bit weights
    and gradients that ZeRO-1/2 keep whole; next to ZeRO-3, which shards them over the same GPUs, it changes little
    memory). Each degree divides the GPUs per node, the attention and KV heads (uneven head splits are priced, but
    even ones do not waste the largest rank's memory) and, with Ulysses, world / sp."""
    c, m, t = scenario.cluster, scenario.model, scenario.training
    if (c.nodes != 1 or "autotp_size" in held or c.tensor_parallel_size != 1 or t.lora_rank or t.qlora
            or (values.fits & ~values.step_peak.risky & (cand.stage < 3) & (cand.offload_optimizer == 0)).any()):
        return ()
    world = c.world_size // c.sequence_parallel_size
    return tuple(d for d in AUTOTP_DEGREES
                 if c.gpus_per_node % d == 0 and m.kv_heads % d == 0 and m.n_heads % d == 0 and world % d == 0)


def with_autotp(scenario: Scenario, held, cand: Candidates, values: Evaluation, tp: np.ndarray, degrees):
    """The candidate grid, its values and AutoTP column with one more grid per degree appended (each evaluated with
    its own context: the shards, the data-parallel degree and AutoTP's all-reduces change)."""
    cands, vals, tps = [cand], [values], [tp]
    for d in degrees:
        sd = scenario.model_copy(update={"cluster": scenario.cluster.model_copy(update={"tensor_parallel_size": d})})
        cd = candidate_grid(sd, held)
        cands.append(cd)
        vals.append(evaluate(make_context(sd), cd))
        tps.append(np.full(cd.shape, d, dtype=np.int64))
    return Candidates.concat(*cands), Evaluation.concat(*vals), np.concatenate(tps)


def split_values(values: Evaluation, *shapes: tuple[int, ...]) -> list[Evaluation]:
    """Cut the :func:`~zeroplanner.costmodel.evaluate` result of ``Candidates.concat`` of candidate sets back into
    one result per set (shapes in concatenation order): :meth:`~zeroplanner.costmodel.Evaluation.split`."""
    return values.split(*shapes)


def activation_parts_at(ctx, cand: Candidates, i: int, tp: np.ndarray | None = None) -> dict[str, float]:
    """Candidate ``i``'s activation bytes by group (:data:`~zeroplanner.costmodel.activations.ACTIVATION_GROUPS`),
    with the context of its AutoTP degree ``tp[i]`` when that is not ``ctx``'s (the AutoTP grids of
    :func:`with_autotp`)."""
    from ..costmodel.activations import activation_parts

    if tp is not None and int(tp[i]) != ctx.tp:
        sc = ctx.scenario
        ctx = make_context(sc.model_copy(update={"cluster": sc.cluster.model_copy(
            update={"tensor_parallel_size": int(tp[i])})}))
    return {k: float(v[0]) for k, v in activation_parts(ctx, cand.take(np.array([i]))).items()}


def sequence_parallel_fit(scenario: Scenario, held: frozenset[str], ctx) -> tuple[int, float] | None:
    """With ``sequence_parallel_size`` held and nothing fitting: the smallest Ulysses degree at which something
    would fit with the other options as held, and that candidate's step peak (bytes per GPU); None when none does
    (or the degree is not held)."""
    if "sequence_parallel_size" not in held:
        return None
    free_sp = sequence_parallel_options(scenario)
    if len(free_sp) <= 1:
        return None
    c2 = candidate_grid(scenario, held - {"sequence_parallel_size"}, free_sp)
    v2 = evaluate(ctx, c2)
    ok = np.flatnonzero(v2.fits)
    if not ok.size:
        return None
    j = int(ok[np.argmin(c2.sp[ok])])
    return int(c2.sp[j]), float(v2.step_peak.bytes[j])
