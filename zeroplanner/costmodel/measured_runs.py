"""Measured public training runs (shared/references/THROUGHPUT.md) as scenarios, and the fit of the step-time
constants (:data:`~.steptime_constants.FITTED`) on them.

Each :class:`Run` is one row: the scenario as its source states it (fields the source does not state take the
value named in ``assumed``), and the measured quantity: seconds per optimizer step, or TFLOP/s per GPU where the
source reports that (then converted with the source's own FLOP count, ``flops_per_gpu_step``). Ratios inside a
section (same hardware, one setting changed) are listed in :data:`RATIOS`.

:func:`fit` fits the handful of constants once for all rows (least squares on log(predicted/measured) of every
row and every ratio) and :func:`leave_one_out` refits without each row and predicts it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .. import catalog
from ..specs import Architecture, ClusterSpec, GPUSpec, NetworkSpec, Scenario, TrainingSpec, ZeroSpec
from ..units import GIB

TITAN_RTX = GPUSpec(
    name="TITAN-RTX", memory_bytes=24220 * 2**20, peak_bf16_tflops=0, peak_fp16_tflops=130.5,
    peak_fp32_tflops=16.3, hbm_bandwidth_gb_per_s=672, intra_node_busbw_gb_per_s=40.0,
    intra_node_latency_seconds=3.4e-6, pcie_gb_per_s=12,
    source="NVIDIA Turing GPU architecture whitepaper (TITAN RTX): 130.5 TFLOPS fp16 tensor with fp32 accumulate, "
    "16.3 fp32, GDDR6 672 GB/s, 24 GB, two NVLink links (2-way bridge); PCIe Gen3 x16 (NCCL topo.h PCI_BW 12). "
    "Interconnect inferred, not stated: the measured ZeRO-1 step (0.118 s) is shorter than its 1.68 GB of fp16 "
    "gradient all-reduce + parameter all-gather would take on PCIe Gen3 (>= 0.14 s), so the two cards must be "
    "bridged: busbw 2 links x 20 GB/s (NCCL topo.h NVLink bandwidth per link)",
)


def _bloom(name: str, hidden: int) -> Architecture:
    # bigscience/bloom-560m and bloom-1b1 config.json: n_layer 24, n_head 16, vocab 250880, 4h GELU MLP, tied
    # embeddings, LayerNorm with biases, word_embeddings_layernorm, fused query_key_value with biases, ALiBi
    return Architecture(
        name=name, family="bloom", n_layers=24, hidden_size=hidden, n_heads=16, ffn_size=4 * hidden,
        ffn_kind="gelu", vocab_size=250880, tied_embeddings=True, norm_kind="layernorm", embedding_norm=True,
        qkv_bias=True, out_bias=True, mlp_bias=True, fused_qkv=True,
        source=f"HF bigscience/{name} config.json",
    )


def _ib100(nics: int) -> NetworkSpec:
    return NetworkSpec(name=f"ib-100g-{nics}x", kind="infiniband", link_gbps=100, nics_per_node=nics,
                       efficiency=0.96, latency_seconds=1.4e-5,
                       source="catalog roce-100g/ib values: 12 GB/s per 100G NIC (NVIDIA/nccl-tests#119), NCCL "
                       "interLat 14 us")


@dataclass(frozen=True)
class Run:
    """One measured row. measured: seconds per step (kind "step") or TFLOP/s per GPU (kind "tflops")."""

    key: str
    section: int
    label: str
    scenario: Scenario
    measured: float
    kind: str = "step"
    flops_per_gpu_step: float | None = None  # the source's FLOP count per GPU per step (kind "tflops")
    assumed: str = ""
    extra: dict = field(default_factory=dict)


def _scenario(model, gpu, *, gpus, nodes=1, network=None, precision, mb, ga, seq, ckpt, zero, lora=0,
              cpu_gib=1024.0, flash=True, host: dict | None = None) -> Scenario:
    """``host``: ClusterSpec's host fields a source implies (CPU-Adam threads per rank, host cores)."""
    return Scenario(
        model=model,
        cluster=ClusterSpec(gpu=gpu, gpus_per_node=gpus, nodes=nodes,
                            network=network or catalog.network("ib-hdr"), cpu_memory_bytes=int(cpu_gib * GIB),
                            **(host or {})),
        training=TrainingSpec(precision=precision, micro_batch=mb, grad_accum=ga, seq_len=seq, checkpointing=ckpt,
                              lora_rank=lora, flash_attention=flash),
        zero=ZeroSpec(**zero),
    )


def source_flops_llama(model: Architecture, seq: int) -> float:
    """THROUGHPUT.md section 5's FLOP count per sequence: 6 x N_dense x s + 6 x s^2 x head_dim x heads x layers
    (N_dense = per-layer linear weights + LM head, embedding excluded; causal attention; recompute excluded)."""
    h, f = model.hidden_size, model.ffn_size
    per_layer = h * (model.q_size + 2 * model.kv_size) + model.q_size * h + 3 * h * f
    n_dense = model.n_layers * per_layer + model.vocab_size * h
    return 6.0 * n_dense * seq + 6.0 * seq**2 * model.dim_head * model.n_heads * model.n_layers


def runs() -> list[Run]:
    """Every row of THROUGHPUT.md as a :class:`Run`."""
    out: list[Run] = []
    # -- 1. BELLE #402: BLOOM on 2 x TITAN RTX ---------------------------------------------------------------
    belle = {"ZeRO-1": (8.5, 4.0, 6.0), "ZeRO-2": (6.8, 3.0, 4.0), "ZeRO-3": (2.6, 2.6, 2.37)}
    cols = [("560m-512", _bloom("bloom-560m", 1024), 512), ("560m-1024", _bloom("bloom-560m", 1024), 1024),
            ("1b1-512", _bloom("bloom-1b1", 1536), 512)]
    for stage_label, speeds in belle.items():
        stage = int(stage_label[-1])
        for (col, arch, seq), its in zip(cols, speeds):
            # BELLE's own train/configs/deepspeed_config.json (fp16 version, LianjiaTech/BELLE commit 11e6294) with
            # the stage changed: overlap_comm true, reduce_bucket_size "auto" = hidden^2 (transformers'
            # HfTrainerDeepSpeedConfig.trainer_config_finalize), the rest at DeepSpeed's defaults
            zero = {"stage": stage, "overlap_comm": True, "reduce_bucket_size": arch.hidden_size**2}
            sc = _scenario(arch, TITAN_RTX, gpus=2, precision="fp16", mb=1, ga=1, seq=seq, ckpt="none",
                           zero=zero, flash=False)
            out.append(Run(f"s1-{col}-z{stage}", 1, f"BLOOM {col}, {stage_label}", sc, 1.0 / its,
                           assumed="fp16, no checkpointing, accumulation 1, BELLE's train/configs/"
                           "deepspeed_config.json with the stage changed (overlap_comm, reduce bucket hidden^2), "
                           "eager attention (transformers' BLOOM has no flash/sdpa path), NVLink bridge "
                           "(see TITAN_RTX)"))
    # -- 2. ms-swift: Qwen2.5-14B on 8 x A800 -------------------------------------------------------------
    for stage, t in ((2, 10.32), (3, 10.56)):
        zero = {"stage": stage, "overlap_comm": False}
        if stage == 2:
            zero["reduce_bucket_size"] = 200_000_000
        sc = _scenario(catalog.model("qwen2.5-14b"), catalog.gpu("A800-80GB"), gpus=8, precision="bf16", mb=1,
                       ga=2, seq=8192, ckpt="full", zero=zero)
        out.append(Run(f"s2-z{stage}", 2, f"Qwen2.5-14B 8K, ZeRO-{stage}", sc, t,
                       assumed="ms-swift presets' other options at DeepSpeed's defaults"))
    # -- 3. ZeRO++ blog: 138B on 384 V100, 1 x and 4 x 100 Gb/s ---------------------------------------------
    arch138 = Architecture.from_parameter_count(138_000_000_000, name="gpt-138b")
    for nics, tf in ((1, 20.0), (4, 36.0)):
        sc = _scenario(arch138, catalog.gpu("V100-32GB"), gpus=16, nodes=24, network=_ib100(nics),
                       precision="fp16", mb=1, ga=1, seq=2048, ckpt="full", zero={"stage": 3})
        out.append(Run(f"s3-{nics}x100", 3, f"138B ZeRO-3, {nics} x 100 Gb/s", sc, tf, kind="tflops",
                       assumed="Llama-shaped 138B (layers/hidden not stated), full checkpointing, accumulation 1, "
                       "TFLOP/s as the planner counts model FLOPs"))
    # -- 4. ZeRO-Offload tutorial: GPT-2 10B on 1 V100 ----------------------------------------------------
    gpt10 = Architecture(name="megatron-gpt2-10b", family="gpt2", n_layers=50, hidden_size=4096, n_heads=32,
                         ffn_size=16384, ffn_kind="gelu", vocab_size=50304, tied_embeddings=True,
                         learned_position_embeddings=1024, norm_kind="layernorm", qkv_bias=True, out_bias=True,
                         mlp_bias=True, fused_qkv=True, source="DeepSpeed docs/_tutorials/zero-offload.md")
    sc = _scenario(gpt10, catalog.gpu("V100-32GB"), gpus=1, precision="fp16", mb=10, ga=1, seq=1024, ckpt="full",
                   zero={"stage": 2, "offload_optimizer": {"device": "cpu"}}, flash=False,
                   # one process under the deepspeed launcher: OpenMP's default, every core (capped at one
                   # process's rate)
                   host={"cpu_adam_threads_per_rank": 64})
    # the tutorial's log also splits the step: forward 6,383 ms + backward 11,770 ms, optimizer 7,613 ms
    out.append(Run("s4-10b", 4, "GPT-2 10B ZeRO-2 + CPU optimizer, 1 V100", sc, 25.765,
                   extra={"forward_backward_seconds": 6.383 + 11.770, "optimizer_seconds": 7.613},
                   assumed="vocabulary 50304 (Megatron's padded GPT-2); eager "
                   "attention (Megatron-LM's GPT-2 of the tutorial predates flash attention); CPU-Adam on every core of one "
                   "process (the tutorial's deepspeed launcher sets no OMP_NUM_THREADS)"))
    # -- 5. ml-engineering: Llama-3.1-8B on 8 x H200, ZeRO-3 + CPU optimizer -------------------------------
    llama8 = catalog.model("llama-3.1-8b")
    for seq, tf in ((8192, 141.0), (32768, 324.0)):
        sc = _scenario(llama8, catalog.gpu("H200"), gpus=8, precision="bf16", mb=1, ga=1, seq=seq, ckpt="full",
                       zero={"stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True})
        out.append(Run(f"s5-{seq // 1024}k", 5, f"Llama-3.1-8B {seq // 1024}K, ZeRO-3 + CPU optimizer", sc, tf,
                       kind="tflops", flops_per_gpu_step=source_flops_llama(llama8, seq),
                       assumed="launcher not stated: CPU-Adam and the host conversion on one thread per rank "
                       "(ClusterSpec.cpu_adam_threads_per_rank's default, torchrun's and accelerate's OMP_NUM_THREADS; with "
                       "torch's default of every core, as under the deepspeed launcher, the 8K row predicts 1.52x)"))
    return out


A5000 = GPUSpec(
    name="RTX-A5000", memory_bytes=24 * 10**9, peak_bf16_tflops=111.1, peak_fp16_tflops=111.1,
    peak_fp32_tflops=27.8, hbm_bandwidth_gb_per_s=768, intra_node_busbw_gb_per_s=48.0,
    intra_node_latency_seconds=3.4e-6, pcie_gb_per_s=24,
    source="NVIDIA RTX A5000 datasheet: 24 GB GDDR6 768 GB/s, 27.8 TFLOPS fp32, 222.2 tensor TFLOPS with sparsity "
    "(111.1 dense), NVLink 112.5 GB/s bidirectional, PCIe Gen4 x16 (24 GB/s as the catalog's other Gen4 cards); "
    "NVLink busbw: NCCL topo.h SM86_NVLINK_BW 12 GB/s per link x 4 links (inferred, not measured)",
)


def _rwkv_1b5() -> Architecture:
    """RWKV v4/v5 "L24 D2048" (RWKV-infctx-trainer's 1.5B): no softmax attention; each layer's time-mix holds four
    D x D projections (receptance, key, value, output: counted as another mixer) and its channel-mix a 4D MLP
    (key D -> 4D, value 4D -> D) plus a D x D receptance; GPT-NeoX vocabulary 50277, untied."""
    d, layers = 2048, 24
    return Architecture(
        name="rwkv-1b5", family="generic", n_layers=layers, hidden_size=d, n_heads=32, ffn_size=4 * d,
        ffn_kind="gelu", vocab_size=50277, tied_embeddings=False, norm_kind="layernorm", attention_layers=0,
        other_mixer_params=layers * 4 * d * d, other_mixer_largest_module=d * d, layer_extra_params=d * d,
        source="RWKV-infctx-trainer config/baseline-*.yaml: n_layer 24, n_embd 2048; 1.515e9 parameters from the "
        "logs' ZeRO partition sizes (8 x 189,388,288)",
    )


def _offload(stage: int, opt: bool, par: bool = False, pin: bool = True, **extra) -> dict:
    z = {"stage": stage, **extra}
    if opt:
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if par:
        z["offload_param"] = {"device": "cpu", "pin_memory": pin}
    return z


# Lightning 2.0's DeepSpeedStrategy defaults (src/pytorch_lightning/strategies/deepspeed.py): overlap_comm True,
# allgather/reduce buckets 2e8, pin_memory False; its "deepspeed_stage_3_offload" preset offloads the optimizer and
# the parameters
_LIGHTNING = {"overlap_comm": True, "allgather_bucket_size": 200_000_000, "reduce_bucket_size": 200_000_000}
_RWKV_ASSUMED = ("bf16, activation checkpointing (grad_cp), micro-batch 1, Lightning 2.0's DeepSpeed defaults "
                 "(overlap_comm, buckets 2e8, pin_memory false); an RWKV stand-in with softmax attention's FLOPs "
                 "removed; Lightning sets no OMP_NUM_THREADS, so every rank runs torch's default of the host's physical "
                 "cores (cores not stated: 32 assumed): the node's cores oversubscribed by the ranks")


def offload_runs() -> list[Run]:
    """Public measured runs with and without CPU offload, and small models on ZeRO-3 vs ZeRO-1/2, gathered from
    public sources (docs/offload_sources.md A1-A3, A5, B1-B3). Seconds per optimizer step. Only :data:`OFFLOAD_FIT` is
    fitted on (pageable_copy_gb_per_s); the rest is held out."""
    out: list[Run] = []
    rwkv = _rwkv_1b5()
    # Lightning sets no OMP_NUM_THREADS: torch's default, the host's physical cores, in every rank (cores not
    # stated: 32 assumed, _RWKV_ASSUMED says so; the oversubscription, ranks x cores / cores, does not depend on
    # it, the per-rank share does: 8 cores would give s7's host step 0.61 s instead of 0.55 s)
    threads = {"cpu_adam_threads_per_rank": 32, "host_cpu_cores_per_node": 32}
    # -- 6. RWKV-infctx-trainer simple-deepspeed-benchmarks.ipynb: 8 x RTX 3090, ctx 4096, accumulation 2 ------
    for key, zero, s_per_it in (("z1", _offload(1, False, **_LIGHTNING), 4.97), ("z2", _offload(2, False, **_LIGHTNING), 4.97),
                                ("z2off", _offload(2, True, pin=False, **_LIGHTNING), 5.50),
                                ("z3", _offload(3, False, **_LIGHTNING), 5.23),
                                ("z3off", _offload(3, True, True, pin=False, **_LIGHTNING), 6.38)):
        sc = _scenario(rwkv, catalog.gpu("RTX-3090"), gpus=8, precision="bf16", mb=1, ga=2, seq=4096, ckpt="full",
                       zero=zero, host=threads)
        out.append(Run(f"s6-{key}", 6, f"RWKV 1.5B 8 x 3090, {key}", sc, 2 * s_per_it, assumed=_RWKV_ASSUMED))
    # -- 7, 8. RWKV-infctx-trainer deepspeed-2-and-3.ipynb: 2 GPUs, ctx 1024, accumulation 10 ------------------
    gpu3090_gen3 = catalog.gpu("RTX-3090").model_copy(update={"pcie_gb_per_s": 12.0})
    for section, gpu, times in ((7, A5000, (0.568, 0.983, 0.666, 2.340)), (8, gpu3090_gen3, (0.793, 1.335, 1.132, 2.018))):
        zeros = (_offload(2, False, **_LIGHTNING), _offload(2, True, pin=False, **_LIGHTNING),
                 _offload(3, False, **_LIGHTNING), _offload(3, True, True, pin=False, **_LIGHTNING))
        for key, zero, t in zip(("z2", "z2off", "z3", "z3off"), zeros, times):
            sc = _scenario(rwkv, gpu, gpus=2, precision="bf16", mb=1, ga=10, seq=1024, ckpt="full", zero=zero,
                           host=threads)
            name = "2 x A5000 (NVLink)" if section == 7 else "2 x 3090 (PCIe Gen3)"
            out.append(Run(f"s{section}-{key}", section, f"RWKV 1.5B {name}, {key}", sc, 10 * t,
                           assumed=_RWKV_ASSUMED + ("; NVLink busbw inferred (see A5000)" if section == 7 else
                                                    "; PCIe Gen3 x16 as the notebook states (12 GB/s)")))
    # -- 9. chenyaofo's gist: LLaMA-7B on 8 x A800, seq 4096, global batch 64 ---------------------------------
    for key, mb, zero, thput in (("z2", 1, _offload(2, False), 4.19), ("z2off", 1, _offload(2, True), 1.81),
                                 ("z3", 2, _offload(3, False), 4.45), ("z3off", 2, _offload(3, True), 2.05)):
        sc = _scenario(catalog.model("llama-2-7b"), catalog.gpu("A800-80GB"), gpus=8, precision="bf16", mb=mb,
                       ga=64 // (8 * mb), seq=4096, ckpt="full", zero=zero,
                       # launcher not stated: the deepspeed launcher's default leaves torch's threads (the 64
                       # physical cores of 2 x Intel Xeon 8358) in each of the 8 ranks
                       host={"cpu_adam_threads_per_rank": 64, "host_cpu_cores_per_node": 64})
        out.append(Run(f"s9-{key}", 9, f"LLaMA-7B 8 x A800, {key}", sc, 64 / thput,
                       assumed="Th.put read as global samples/s (the gist does not state its unit); bf16; LLaMA-7B "
                       "as Llama-2-7B's shapes; HF-style offload blocks with pin_memory true; the deepspeed launcher "
                       "without core binding: 64 threads in each of 8 ranks on 64 cores (2 x Intel 8358)"))
    # -- 10. DeepSpeed blogs/zenflow-corebinding: Qwen2.5-1.5B on 2 x A100-40GB, ZeRO-2 -----------------------
    for key, zero, t in (("z2", _offload(2, False), 0.240), ("z2off", _offload(2, True), 1.365)):
        sc = _scenario(catalog.model("qwen2.5-1.5b"), catalog.gpu("A100-40GB"), gpus=2, precision="bf16", mb=4,
                       ga=1, seq=512, ckpt="none", zero=zero,
                       host={"cpu_adam_threads_per_rank": 64, "host_cpu_cores_per_node": 128})
        out.append(Run(f"s10-{key}", 10, f"Qwen2.5-1.5B 2 x A100-40GB, {key}", sc, t,
                       assumed="sequence 512 (the fork's finetune_llama.py pads Alpaca to 512); no checkpointing; "
                       "--bind_cores_to_rank: 64 threads per rank (2 x EPYC 7742)"))
    return out


OFFLOAD_RATIOS: list[tuple[str, str, str]] = [
    *[(f"s{sec}-{z}off/{z}", f"s{sec}-{z}off", f"s{sec}-{z}") for sec in (6, 7, 8, 9) for z in ("z2", "z3")],
    ("s10-z2off/z2", "s10-z2off", "s10-z2"),
    ("s6-z3/z1", "s6-z3", "s6-z1"), ("s6-z3/z2", "s6-z3", "s6-z2"), ("s7-z3/z2", "s7-z3", "s7-z2"),
    ("s8-z3/z2", "s8-z3", "s8-z2"),
]
"""Offload on / off (same stage) and ZeRO-3 / ZeRO-1-2 (small model) step-time ratios of :func:`offload_runs`."""

OFFLOAD_FIT = ("s7-z2off", "s7-z2", "s8-z2off", "s8-z2")
"""The rows pageable_copy_gb_per_s is fitted on (4 of the 19; their ratios s7- and s8-z2off/z2): ZeRO-2 offload
without pin_memory on two machines. Every other row and ratio of :func:`offload_runs` is held out."""


RATIOS: list[tuple[str, str, str]] = [
    *[(f"s1-{c}-z3/z1", f"s1-{c}-z3", f"s1-{c}-z1") for c in ("560m-512", "560m-1024", "1b1-512")],
    *[(f"s1-{c}-z2/z1", f"s1-{c}-z2", f"s1-{c}-z1") for c in ("560m-512", "560m-1024", "1b1-512")],
    ("s2-z3/z2", "s2-z3", "s2-z2"),
    ("s3-4x/1x", "s3-4x100", "s3-1x100"),
    ("s5-32k/8k", "s5-32k", "s5-8k"),
]
"""(name, numerator row, denominator row): step-time ratios for "step" rows, throughput ratios for "tflops" rows."""


def predict(run: Run, constants: dict[str, float] | None = None) -> float:
    """The model's value for ``run`` in the run's unit, with ``constants`` replacing the fitted ones."""
    from . import steptime_constants
    from .evaluate import estimate

    saved = dict(steptime_constants.FITTED)
    try:
        if constants:
            steptime_constants.FITTED.update(constants)
        est = estimate(run.scenario)
    finally:
        steptime_constants.FITTED.clear()
        steptime_constants.FITTED.update(saved)
    if run.kind == "step":
        return est.step_seconds
    if run.flops_per_gpu_step is not None:
        return run.flops_per_gpu_step / est.step_seconds / 1e12
    return est.tflops_per_gpu


def _table(rs: list[Run], ratio_list: list[tuple[str, str, str]], constants: dict[str, float] | None,
           fitted: tuple[str, ...] = ()) -> tuple[list[dict], list[dict]]:
    """(rows, ratios) of ``rs`` and ``ratio_list``: predicted vs measured; each ratio also gives the seconds its
    numerator adds per step, predicted and measured, and ``fitted`` marks rows (and ratios of two rows) in it."""
    pred = {r.key: predict(r, constants) for r in rs}
    rows = [{"key": r.key, "section": r.section, "label": r.label, "kind": r.kind, "measured": r.measured,
             "predicted": pred[r.key], "ratio": pred[r.key] / r.measured, "assumed": r.assumed,
             "fitted": r.key in fitted} for r in rs]
    by = {r.key: r for r in rs}
    ratios = []
    for name, a, b in ratio_list:
        meas = by[a].measured / by[b].measured
        p = pred[a] / pred[b]
        ratios.append({"name": name, "section": by[a].section, "measured": meas, "predicted": p, "error": p / meas,
                       "added_measured": by[a].measured - by[b].measured, "added_predicted": pred[a] - pred[b],
                       "fitted": a in fitted and b in fitted})
    return rows, ratios


def table(constants: dict[str, float] | None = None) -> tuple[list[dict], list[dict]]:
    """(rows, ratios): predicted vs measured for every row and every in-section ratio."""
    return _table(runs(), RATIOS, constants)


FIT_NAMES = ("gemm_hidden_half", "zero3_fetch_seconds", "grad_hook_seconds", "overlap_loss")
_BOUNDS = {"gemm_hidden_half": (16.0, 8192.0),
           "zero3_fetch_seconds": (1e-5, 1e-2), "grad_hook_seconds": (1e-6, 1e-3), "overlap_loss": (0.0, 1.0)}


def _loss(constants: dict[str, float], exclude: str | None = None) -> float:
    rows, ratios = table(constants)
    err = [math.log(r["ratio"]) for r in rows if r["key"] != exclude]
    err += [math.log(r["error"]) for r in ratios if exclude is None or exclude not in _RATIO_KEYS[r["name"]]]
    return float(np.sum(np.square(err)))


_RATIO_KEYS = {name: (a, b) for name, a, b in RATIOS}


def fit(exclude: str | None = None, start: dict[str, float] | None = None) -> dict[str, float]:
    """Least-squares fit of :data:`FIT_NAMES` on log errors of all rows and ratios (without row ``exclude`` and
    the ratios that use it). Nelder-Mead on transformed parameters (log for the positive ones), within bounds."""
    from scipy.optimize import minimize

    from .steptime_constants import FITTED

    x0 = {k: (start or FITTED)[k] for k in FIT_NAMES}

    def unpack(x):
        out = {}
        for k, v in zip(FIT_NAMES, x):
            lo, hi = _BOUNDS[k]
            val = 1.0 / (1.0 + math.exp(-v)) if k == "overlap_loss" else math.exp(v)
            out[k] = min(max(val, lo), hi)
        return out

    def pack(c):
        return [math.log(c[k] / (1 - c[k])) if k == "overlap_loss" else math.log(c[k])
                for k in FIT_NAMES]

    x0c = {k: min(max(v, _BOUNDS[k][0] * 1.01), _BOUNDS[k][1] * 0.99) for k, v in x0.items()}
    res = minimize(lambda x: _loss(unpack(x), exclude), pack(x0c), method="Nelder-Mead",
                   options={"maxiter": 600, "xatol": 1e-3, "fatol": 1e-5})
    return unpack(res.x)


def leave_one_out(constants: dict[str, float], keys: list[str] | None = None) -> list[dict]:
    """For every row (or those in ``keys``): refit without it (starting from ``constants``), predict it;
    predicted/measured."""
    out = []
    for r in runs():
        if keys is not None and r.key not in keys:
            continue
        c = fit(exclude=r.key, start=constants)
        p = predict(r, c)
        out.append({"key": r.key, "predicted": p, "measured": r.measured, "ratio": p / r.measured})
    return out


def offload_table(constants: dict[str, float] | None = None) -> tuple[list[dict], list[dict]]:
    """(rows, ratios) of :func:`offload_runs` like :func:`table`, the rows and ratios fitted on (OFFLOAD_FIT)
    marked."""
    return _table(offload_runs(), OFFLOAD_RATIOS, constants, OFFLOAD_FIT)


def fit_pageable(exclude: str | None = None) -> float:
    """pageable_copy_gb_per_s fitted on the offload's added seconds of the OFFLOAD_FIT pairs (least squares on
    log(predicted / measured) added time; ``exclude``: a ratio name left out, for the leave-one-out)."""
    from scipy.optimize import minimize_scalar

    pairs = [(a, b) for name, a, b in OFFLOAD_RATIOS
             if a in OFFLOAD_FIT and b in OFFLOAD_FIT and name != exclude]
    by = {r.key: r for r in offload_runs()}

    def loss(log_gbps: float) -> float:
        c = {"pageable_copy_gb_per_s": math.exp(log_gbps)}
        err = [math.log((predict(by[a], c) - predict(by[b], c)) / (by[a].measured - by[b].measured))
               for a, b in pairs]
        return float(np.sum(np.square(err)))

    res = minimize_scalar(loss, bounds=(math.log(0.5), math.log(64.0)), method="bounded",
                          options={"xatol": 1e-4})
    return math.exp(res.x)
