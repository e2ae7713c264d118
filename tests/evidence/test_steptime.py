"""Step time against measured public runs (shared/references/THROUGHPUT.md, as scenarios in
zeroplanner/costmodel/measured_runs.py) and the step-time behaviours issue 19 asks for.

References: the measured rows themselves (sources in THROUGHPUT.md); the fitted constants are checked to be what a
refit on those rows gives, so a change to the model that is not refitted fails here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from zeroplanner import build_scenario, estimate, plan
from zeroplanner.costmodel import Candidates, evaluate, make_context
from zeroplanner.costmodel import measured_runs as mr
from zeroplanner.costmodel.steptime_constants import FITTED


@pytest.fixture(scope="module")
def table():
    return mr.table()


def test_every_measured_row_within_1_5x(table):
    rows, _ = table
    assert len(rows) == 16  # every row of THROUGHPUT.md: 9 + 2 + 2 + 1 + 2
    for r in rows:
        assert 1 / 1.5 <= r["ratio"] <= 1.5, r


@pytest.mark.parametrize("name", [q[0] for q in mr.RATIOS])
def test_in_section_ratio_within_1_25x(table, name):
    """Every in-section ratio of THROUGHPUT.md within 1.25x (issue 19's acceptance). The two BLOOM ZeRO-3 / ZeRO-1
    misses of the FLOP-only model (len 1024: 1.37; 1.1B: 0.78) close once the memory-bound kernels are priced from
    their counted bytes (eager attention's s^2 scores carry len 1024) and the rows use BELLE's own DeepSpeed config
    (overlap_comm hides ZeRO-1's larger 1.1B all-reduce)."""
    _, ratios = table
    q = next(q for q in ratios if q["name"] == name)
    assert 1 / 1.25 <= q["error"] <= 1.25, q


def test_zero3_on_a_small_model_is_slower_than_zero1_as_measured(table):
    """BELLE #402: BLOOM-560M on 2 GPUs, ZeRO-3 3.27x slower than ZeRO-1 (the old model said 2.1x faster)."""
    _, ratios = table
    q = next(q for q in ratios if q["name"] == "s1-560m-512-z3/z1")
    assert q["predicted"] > 2.6


def test_four_times_the_network_is_not_four_times_the_throughput(table):
    """ZeRO++ blog Figs. 6-7: 1 x -> 4 x 100 Gb/s gives 1.8x ZeRO-3 throughput, not 4x."""
    _, ratios = table
    q = next(q for q in ratios if q["name"] == "s3-4x/1x")
    assert 1.8 / 1.25 <= q["predicted"] <= 1.8 * 1.25


def test_stored_constants_are_the_fit():
    """FITTED must be what measured_runs.fit gives on the rows (within 5%; Nelder-Mead tolerance)."""
    refit = mr.fit()
    for k in mr.FIT_NAMES:
        assert refit[k] == pytest.approx(FITTED[k], rel=0.05), k


def test_mfu_flag_overrides_the_efficiency_model():
    e = estimate(build_scenario(mfu=0.3))
    assert e.achieved_fraction == pytest.approx(0.3)
    assert estimate(build_scenario()).achieved_fraction != pytest.approx(0.3)


def test_efficiency_depends_on_generation_and_size():
    """MAMF table (stas00/ml-engineering): H100 80.3% vs A100 86.9% of peak for the GEMMs; small hidden sizes run
    slower; the step's effective fraction is below the GEMM fraction by the memory-bound kernels' time."""
    from zeroplanner.costmodel.compute import achieved_fraction

    def gemm(**kw):
        sc = build_scenario(**kw)
        return float(achieved_fraction(make_context(sc), Candidates.from_scenario(sc)).item())

    a100, h100, small = gemm(model="llama-2-7b"), gemm(model="llama-2-7b", gpu="H100-80GB"), gemm(model="qwen2.5-0.5b")
    assert h100 / a100 == pytest.approx(0.803 / 0.869, rel=0.02)
    assert small < 0.8 * a100
    assert a100 <= 0.72 + 1e-9  # FlashAttention-2's 72% on A100 is the ceiling
    effective = estimate(build_scenario(model="llama-2-7b")).achieved_fraction
    assert effective < a100


def _count_non_gemm_bytes(hf: dict, seq: int, attn: str | None, forward_only: bool = False) -> float:
    """Bytes read + written by every non-GEMM aten op of one forward+backward of a real transformers model (bf16,
    CPU), counted with a TorchDispatchMode: what compute.memory_bound_seconds_micro prices per token."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils._python_dispatch import TorchDispatchMode

    skip = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_flash_attention_for_cpu_backward", "view", "_unsafe_view", "t", "transpose",
            "expand", "slice", "select", "alias", "detach", "as_strided", "split", "split_with_sizes", "unbind",
            "unsqueeze", "squeeze", "permute", "_reshape_alias", "reshape", "lift_fresh", "empty", "empty_like",
            "empty_strided", "new_empty", "new_empty_strided", "view_as", "expand_as"}

    def nbytes(x):
        if isinstance(x, torch.Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, (list, tuple)):
            return sum(nbytes(y) for y in x)
        return 0

    class Count(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._overloadpacket.__name__ not in skip:
                Count.total += nbytes(list(args)) + nbytes(list((kwargs or {}).values())) + nbytes(out)
            return out

    cfg = dict(hf)
    mt = cfg.pop("model_type")
    conf = transformers.AutoConfig.for_model(mt, **cfg)
    torch.manual_seed(0)
    kw = {"attn_implementation": attn} if attn else {}
    model = transformers.AutoModelForCausalLM.from_config(conf, **kw).to(torch.bfloat16).train()
    ids = torch.randint(0, conf.vocab_size, (1, seq))
    model(input_ids=ids, labels=ids).loss.backward()  # warm-up (lazy buffers), then count a second pass
    for prm in model.parameters():
        prm.grad = None
    Count.total = 0
    with Count():
        loss = model(input_ids=ids, labels=ids).loss
        if forward_only:
            return Count.total
        loss.backward()
    return Count.total


@pytest.mark.parametrize("kind", ["gelu", "swiglu"])
def test_memory_bound_bytes_are_what_the_real_models_move(kind):
    """The per-token byte constants of compute.py, re-measured on the real models (bytes per step / tokens): two
    layers more add 2 x (hidden x ELEMENTWISE_BYTES_PER_HIDDEN + heads x s x SCORE_BYTES_PER_ELEMENT), twice the
    vocabulary adds vocab x LOGIT_BYTES_PER_ELEMENT (within 5%); the second difference over s, 2s, 3s (which
    cancels the per-step and per-token parts) is 2 x layers x heads x SCORE_BYTES_PER_ELEMENT x s^2."""
    from zeroplanner.costmodel import compute

    h, heads, s, vocab = 256, 4, 128, 2048

    def cfg(layers, v):
        if kind == "gelu":
            return {"model_type": "bloom", "vocab_size": v, "hidden_size": h, "n_layer": layers, "n_head": heads}
        return {"model_type": "llama", "vocab_size": v, "hidden_size": h, "intermediate_size": 680,
                "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
                "max_position_embeddings": 1024, "tie_word_embeddings": False}

    attn = None if kind == "gelu" else "eager"
    base = _count_non_gemm_bytes(cfg(2, vocab), s, attn)
    layers = (_count_non_gemm_bytes(cfg(4, vocab), s, attn) - base) / s
    vocab_d = (_count_non_gemm_bytes(cfg(2, 2 * vocab), s, attn) - base) / s
    second = (_count_non_gemm_bytes(cfg(2, vocab), 3 * s, attn) - 2 * _count_non_gemm_bytes(cfg(2, vocab), 2 * s, attn)
              + base)
    score = compute.SCORE_BYTES_PER_ELEMENT[kind]
    want_layers = 2 * (h * compute.ELEMENTWISE_BYTES_PER_HIDDEN[kind] + heads * s * score)
    assert layers == pytest.approx(want_layers, rel=0.05)
    assert vocab_d == pytest.approx(vocab * compute.LOGIT_BYTES_PER_ELEMENT[kind], rel=0.05)
    assert second == pytest.approx(2 * 2 * heads * score * s**2, rel=0.05)


@pytest.mark.parametrize("family,attn,share", [("bloom", None, 0.348), ("llama", "eager", 0.380),
                                               ("llama", "sdpa", 0.331)])
def test_forward_share_of_the_memory_bound_bytes(family, attn, share):
    """compute.FORWARD_BYTES_SHARE (0.35, what a recompute repeats) against the measured forward / total shares."""
    from zeroplanner.costmodel import compute

    if family == "bloom":
        hf = {"model_type": "bloom", "vocab_size": 2048, "hidden_size": 512, "n_layer": 4, "n_head": 8}
    else:
        hf = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1368,
              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8}
    fwd = _count_non_gemm_bytes(hf, 256, attn, forward_only=True)
    total = _count_non_gemm_bytes(hf, 256, attn)
    assert fwd / total == pytest.approx(share, abs=0.005)
    assert abs(compute.FORWARD_BYTES_SHARE - fwd / total) < 0.05


def test_eager_attention_costs_its_scores():
    """Without flash attention the s^2 scores are written and read through HBM: slower, and more so at 2x length."""
    def step(seq, flash):
        return estimate(build_scenario(model="llama-2-7b", seq_len=seq, flash_attention=flash)).step_seconds

    assert step(4096, False) > step(4096, True)
    assert step(4096, False) - step(4096, True) > 3.0 * (step(2048, False) - step(2048, True))


MISTRAL_LORA_4090 = dict(model="mistral-7b", gpu="RTX-4090", gpus_per_node=2, lora_rank=16, seq_len=2048,
                         cpu_memory_gib=128)
QWEN32_ETHERNET = dict(model="qwen2.5-32b", nodes=2, network="eth-25g", seq_len=4096)


@pytest.mark.parametrize("kw", [MISTRAL_LORA_4090, QWEN32_ETHERNET, dict(model="llama-2-13b")])
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_parameter_offload_costs_pcie_time(kw, device):
    """offload_param moves every parameter partition host -> GPU in every forward and backward (PCIe) and, for NVMe,
    through the drive: slower than the same configuration without it."""
    base = estimate(build_scenario(**kw, stage=3))
    off = estimate(build_scenario(**kw, stage=3, offload_param=device))
    assert off.offload_seconds_per_step > 0.0
    assert off.step_seconds > base.step_seconds


@pytest.mark.parametrize("kw", [MISTRAL_LORA_4090, QWEN32_ETHERNET])
def test_parameter_offload_only_when_nothing_fits_without_it(kw):
    p = plan(build_scenario(**kw))
    assert p.fits and p.choice.offload_param == "none"


def test_parameter_offload_is_picked_when_it_is_the_only_fit():
    # Llama-2-13B on one RTX 4090: 26 GB of 16-bit weights on a 24 GB card; nothing fits without offloading them
    sc = build_scenario(model="llama-2-13b", gpu="RTX-4090", gpus_per_node=1, cpu_memory_gib=512, seq_len=2048)
    from zeroplanner.planner import candidate_grid

    p = plan(sc)
    cand = candidate_grid(sc)
    v = evaluate(make_context(sc), cand)
    assert not (v.fits & (cand.offload_param == 0)).any()
    assert p.fits and p.choice.offload_param != "none"


def test_qlora_pays_dequantisation():
    """bitsandbytes dequantises every NF4 weight before each matmul (forward, backward, recompute)."""
    lora = estimate(build_scenario(model="llama-2-13b", gpus_per_node=2, lora_rank=64, seq_len=2048))
    qlora = estimate(build_scenario(model="llama-2-13b", gpus_per_node=2, lora_rank=64, qlora=True, seq_len=2048))
    assert qlora.compute_seconds_per_step > lora.compute_seconds_per_step
    frozen = make_context(build_scenario(model="llama-2-13b", gpus_per_node=2, lora_rank=64, qlora=True,
                                         seq_len=2048)).frozen
    # 3 passes (full checkpointing) x 4.5 bytes per frozen parameter over 2039 GB/s, 8 micro-steps
    expected = 8 * 3 * frozen * 4.5 / 2039e9
    assert qlora.compute_seconds_per_step - lora.compute_seconds_per_step == pytest.approx(expected, rel=1e-6)


def test_recommendation_prints_the_breakdown_and_why_not_for_faster_alternatives():
    p = plan(build_scenario(**MISTRAL_LORA_4090))
    line = next(r for r in p.reasons if r.startswith("Step "))
    for word in ("compute", "exposed communication", "ZeRO-3 fetch overhead", "offload", "optimizer"):
        assert word in line
    faster = [o for o in p.alternatives if o.estimate.step_seconds < p.estimate.step_seconds * 0.995]
    assert faster, "this case has alternatives predicted faster than the pick (ZeRO-0/1 vs the ZeRO-2 pick)"
    for o in faster:
        assert "not picked" in o.why_not


def test_breakdown_sums_to_the_step():
    sc = build_scenario(model="llama-2-13b", stage=3, nodes=2)
    v = evaluate(make_context(sc), Candidates.from_scenario(sc))
    total = (v.compute_seconds_per_step + v.communication.exposed_seconds_per_step + v.offload_seconds_per_step
             + v.optimizer_seconds_per_step)
    np.testing.assert_allclose(total, v.step_seconds, rtol=1e-12)
    host = v.fetch_overhead_seconds_per_step + v.hook_seconds_per_step
    np.testing.assert_allclose(v.communication.exposed_seconds_per_step - host,
                               v.communication.collectives_exposed_seconds_per_step, rtol=1e-12)


def test_leave_one_out_is_reported():
    """The refit without a row still predicts it within 2x (the worst case is printed in docs/validation.md)."""
    c = dict(FITTED)
    one = mr.leave_one_out(c, keys=["s2-z3"])  # one row here; the full table is in docs/validation.md
    assert math.isfinite(one[0]["ratio"]) and 0.5 < one[0]["ratio"] < 2.0


TINY_HF = {
    "llama": {"model_type": "llama", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "tie_word_embeddings": False},
    "gpt2": {"model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64},
    "qwen2": {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "tie_word_embeddings": True},
    "gpt_neox": {"model_type": "gpt_neox", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 256,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64},
}


@pytest.mark.parametrize("family", sorted(TINY_HF))
def test_module_parameter_shapes_match_the_hf_model(family):
    """The modules ZeRO-3 hooks and gathers (nn.Modules owning parameters directly) and their parameter sizes, as
    transformers builds them (a tied lm_head registers the shared embedding weight as its own, so it fetches it)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from zeroplanner.costmodel.context import module_parameter_shapes
    from zeroplanner.catalog.hfconfig import architecture_from_hf_config

    cfg = dict(TINY_HF[family])
    mt = cfg.pop("model_type")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(mt, **cfg))
    real = sorted(tuple(sorted(p.numel() for p in m.parameters(recurse=False)))
                  for m in model.modules() if any(True for _ in m.parameters(recurse=False)))
    arch = architecture_from_hf_config(TINY_HF[family], name=f"tiny-{family}")
    shapes = module_parameter_shapes(arch)
    ours = sorted(tuple(sorted(numels)) for count, numels in shapes for _ in range(count))
    assert ours == real


PREFETCH_RUNS = {
    # key: (tiny model of test_zero3_collective_count, persistence threshold, zero_optimization settings)
    "B0": ("llama", 0, {"stage3_prefetch_bucket_size": 0, "stage3_max_live_parameters": 1_000_000,
                        "stage3_max_reuse_distance": 0}),
    "B20000": ("llama", 0, {"stage3_prefetch_bucket_size": 20_000, "stage3_max_live_parameters": 1_000_000,
                            "stage3_max_reuse_distance": 0}),
    "B1000000": ("llama", 0, {"stage3_prefetch_bucket_size": 1_000_000, "stage3_max_live_parameters": 1_000_000,
                              "stage3_max_reuse_distance": 0}),
    # points not looked at while writing the replay's rules: a bucket smaller than most modules with max_live
    # capping the prefetch and a reuse distance keeping some modules; DeepSpeed's defaults; the second model
    # (GPT-2: fused c_attn with biases, LayerNorm, learned positions, tied lm_head) at the second threshold
    "B5000-live30000-reuse20000": ("llama", 0, {"stage3_prefetch_bucket_size": 5_000,
                                                "stage3_max_live_parameters": 30_000,
                                                "stage3_max_reuse_distance": 20_000}),
    "defaults": ("llama", 0, {"stage3_prefetch_bucket_size": 50_000_000,
                              "stage3_max_live_parameters": 1_000_000_000,
                              "stage3_max_reuse_distance": 1_000_000_000}),
    "gpt2-300-B20000": ("gpt2", 300, {"stage3_prefetch_bucket_size": 20_000,
                                      "stage3_max_live_parameters": 1_000_000, "stage3_max_reuse_distance": 0}),
}
PREFETCH_MEASURED = {"B0": 42, "B20000": 5, "B1000000": 1, "B5000-live30000-reuse20000": 23, "defaults": 1,
                     "gpt2-300-B20000": 24}
"""All-gathers per step (steps 2 and 3) counted by the comms logger on 2 CPU ranks, 2026-12-01 (DeepSpeed 0.19.8,
torch 2.13.0 CPU, gloo). gpt2-300-B20000: 6 from the fetch/prefetch schedule + 18 persistent tensors after the
step."""


@pytest.fixture(scope="module")
def prefetch_counts(tmp_path_factory):
    """All-gathers per step counted by DeepSpeed's comms logger on 2 CPU ranks (gloo) for the tiny models of
    tests/evidence/test_zero3_collective_count.py at the PREFETCH_RUNS settings (one launch, 3 steps each; the
    first records the module trace and is not counted)."""
    pytest.importorskip("deepspeed")
    import json
    import os
    import subprocess
    import sys

    from tests.evidence import test_zero3_collective_count as z3

    tmp = tmp_path_factory.mktemp("prefetch")
    runs = [{"key": k, "hf_config": z3.MODELS[name], "threshold": t, "zero": zero}
            for k, (name, t, zero) in PREFETCH_RUNS.items()]
    plan_path = tmp / "plan.json"
    plan_path.write_text(json.dumps({"runs": runs, "steps": 3, "seq_len": z3.SEQ_LEN, "out": str(tmp / "out")}))
    (tmp / "worker.py").write_text(z3.WORKER)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--no_local_rank",
           "--master_port", str(z3._free_port()), str(tmp / "worker.py"), str(plan_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    outs = [json.loads((tmp / f"out.rank{r}").read_text()) for r in range(2)]
    return {k: [s["all_gather_into_tensor"] for out in outs for s in out[k][1:]] for k in PREFETCH_RUNS}


def _predicted_all_gathers(key: str) -> int:
    from zeroplanner.costmodel.communication import stage3_collective_counts
    from zeroplanner.costmodel.context import make_context as mk

    from tests.evidence import test_zero3_collective_count as z3

    name, threshold, zero = PREFETCH_RUNS[key]
    sc = z3.scenario(name, threshold)
    sc = sc.model_copy(update={"zero": sc.zero.model_copy(update=zero)})
    c = stage3_collective_counts(mk(sc), Candidates.from_scenario(sc))
    return int((c["all_gather_forward"] + c["all_gather_backward"] + c["all_gather_step"]).item())


@pytest.mark.parametrize("key", sorted(PREFETCH_RUNS))
def test_zero3_all_gathers_match_the_stored_measurement(key):
    """The replay of DeepSpeed's prefetch schedule (context.stage3_fetch_schedule) gives the counts measured
    (PREFETCH_MEASURED) without launching DeepSpeed."""
    assert _predicted_all_gathers(key) == PREFETCH_MEASURED[key]


@pytest.mark.engine
@pytest.mark.timeout(660)
@pytest.mark.parametrize("key", sorted(PREFETCH_RUNS))
def test_zero3_all_gathers_with_prefetch(prefetch_counts, key):
    """With prefetching on (stage3_prefetch_bucket_size and stage3_max_live_parameters > 0) DeepSpeed coalesces the
    upcoming modules' parameters into one all-gather per prefetch and keeps what a later use needs; the model
    replays that schedule over the module trace and must count exactly what the comms logger counts, on both
    ranks, every step after the first."""
    want = _predicted_all_gathers(key)
    assert prefetch_counts[key] == [want] * 4


@pytest.mark.parametrize("name", ["llama-2-7b", "qwen2.5-0.5b", "gpt2", "mixtral-8x7b", "bloom-176b", "gemma-2-9b"])
def test_zero3_trace_fetches_the_modules_that_own_parameters(name):
    """The replayed trace's parameter-owning modules are module_parameter_shapes' (the modules checked against HF
    above), each once in forward; with prefetching off and nothing kept every one is gathered in forward and, but
    for frozen embeddings, again in backward."""
    from zeroplanner.costmodel.context import module_parameter_shapes, stage3_fetch_schedule, stage3_module_trace

    m = build_scenario(model=name).model
    trace, numels, n_fwd = stage3_module_trace(m)
    ours = sorted(tuple(sorted(numels[p] for p in ps)) for ps in trace[:n_fwd] if ps)
    want = sorted(tuple(sorted(n)) for count, n in module_parameter_shapes(m) for _ in range(count))
    assert ours == want
    f, f_elems, b, _ = stage3_fetch_schedule(m, 0, 0, 0, 0)
    assert f == len(want) and f_elems == sum(sum(n) for n in want)
    assert b == len(want)
    _, _, b_frozen, _ = stage3_fetch_schedule(m, 0, 0, 0, 0, True)
    assert b_frozen == len(want) - (2 if m.learned_position_embeddings else 1)  # the embedding(s) not fetched
