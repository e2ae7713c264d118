"""Speed of the cost model against its peers, measured in one run.

Prints: one full estimate, one full plan (every candidate of a scenario), sweep throughput (candidates/s), and the
same kind of estimate timed with DeepSpeed's own estimator functions and with llm-analysis (cli99/llm-analysis,
installed by this script into its own virtual environment because it pins an old transformers), as ratios.
``--profile`` adds where a plan's time goes (cProfile over repeated plans: the planner's stages, then the cost
model's functions by own time); ``--cli`` adds the whole-process command timings of benchmarks/bench_cli.py
(``zeroplanner estimate`` and ``recommend`` against a bare ``python -c "import numpy, pydantic"``, median of 5).

Targets: a full plan of all candidates in under 1 ms (earlier 2 ms, 5 ms), one full estimate no slower than
llm-analysis's one configuration, a sweep of at least 5 x 10^6 candidates/s; whole processes: ``estimate`` within
1.5x and ``recommend`` within 3x the bare import.

Usage: python benchmarks/bench_costmodel.py [--repeats N] [--sweep N] [--no-llm-analysis] [--profile] [--cli]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from zeroplanner import build_scenario, estimate, plan
from zeroplanner.planner import sweep

LLM_ANALYSIS_VERSION = "0.2.2"
VENV = Path(os.environ.get("ZEROPLANNER_BENCH_VENV", Path(tempfile.gettempdir()) / "zeroplanner-llm-analysis-venv"))

LLM_ANALYSIS_CHILD = r"""
import json, sys, time, logging
logging.disable(logging.CRITICAL)
from llm_analysis.analysis import LLMAnalysis, ActivationRecomputation, DSZeRO
from llm_analysis.config import ModelConfig, GPUConfig, DtypeConfig, ParallelismConfig
n = int(sys.argv[1])
# Llama-2-7B shapes (meta-llama/Llama-2-7b-hf config.json) on 8 x A100-80GB, ZeRO-2, the same as zeroplanner's run
model = ModelConfig(name="llama-2-7b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=32000,
                    max_seq_len=4096, ffn_embed_dim=11008, expansion_ratio=11008 / 4096, model_type="llama")
gpu = GPUConfig(name="a100-sxm-80gb", mem_per_GPU_in_GB=80, hbm_bandwidth_in_GB_per_sec=2039,
                intra_node_bandwidth_in_GB_per_sec=300, intra_node_min_message_latency=8e-06,
                peak_fp16_TFLOPS=312)
times = []
for _ in range(n):
    t0 = time.process_time()
    a = LLMAnalysis(model, gpu, DtypeConfig(), ParallelismConfig(dp_size=8), flops_efficiency=0.4,
                    hbm_memory_efficiency=0.9)
    a.training(batch_size_per_gpu=1, gradient_accumulation_steps=8, seq_len=4096,
               activation_recomputation=ActivationRecomputation.FULL, ds_zero=DSZeRO.STAGE_2,
               mlp_gated_linear_units=True, output_dir=None)
    times.append(time.process_time() - t0)
calls = {"call": 0, "c_call": 0}


def count(frame, event, arg):
    if event in calls:
        calls[event] += 1


a = LLMAnalysis(model, gpu, DtypeConfig(), ParallelismConfig(dp_size=8), flops_efficiency=0.4,
                hbm_memory_efficiency=0.9)
sys.setprofile(count)  # one more configuration, its calls counted (counted_calls in the parent: the same events)
a.training(batch_size_per_gpu=1, gradient_accumulation_steps=8, seq_len=4096,
           activation_recomputation=ActivationRecomputation.FULL, ds_zero=DSZeRO.STAGE_2,
           mlp_gated_linear_units=True, output_dir=None)
sys.setprofile(None)
print(json.dumps({"seconds": times, "python_calls": calls["call"], "c_calls": calls["c_call"]}))
"""


CLOCK = time.process_time
"""CPU time of this process: on a shared 2-core machine wall time mostly measures the neighbours; both sides of
every ratio are timed with the same clock (the llm-analysis child uses process_time too)."""


def timeit(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        out.append(CLOCK() - t0)
    return out


def sweep_page_faults(scenario, axes: dict) -> int:
    """Minor page faults of one sweep (after the timed ones): pages the process touches afresh because glibc's
    malloc gave the previous sweep's freed arrays back to the kernel. On this VM each costs microseconds, most of a
    large sweep's time (docs/performance.md); ``MALLOC_TOP_PAD_`` keeps them and shows the sweep without."""
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    sweep(scenario, **axes)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def counted_calls(fn) -> tuple[int, int]:
    """(Python function calls, C function calls) of one ``fn()``, counted with ``sys.setprofile`` ("call" and
    "c_call" events): the same count the llm-analysis child makes of its ``training()``. Neither event fires for
    numpy's ufuncs (``a * b``, ``np.maximum(a, b)``) or for making an instance of a class, so zeroplanner's count
    leaves those out. Structure, not time: how many calls the code makes, whatever each computes."""
    calls = {"call": 0, "c_call": 0}

    def count(frame, event, arg):
        if event in calls:
            calls[event] += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls["call"], calls["c_call"]


def ensure_llm_analysis() -> Path | None:
    py = VENV / "bin" / "python"
    if not py.exists():
        print(f"installing llm-analysis=={LLM_ANALYSIS_VERSION} into {VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = subprocess.run([str(py), "-c", "import llm_analysis"], capture_output=True)
    if probe.returncode != 0:
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", f"llm-analysis=={LLM_ANALYSIS_VERSION}"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("llm-analysis could not be installed:", r.stderr.strip().splitlines()[-1:], flush=True)
            return None
    return py


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--sweep", type=int, default=100_000, help="candidates in the sweep (default 1e5)")
    ap.add_argument("--no-llm-analysis", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print where a plan's time goes")
    ap.add_argument("--cli", action="store_true", help="also time whole `zeroplanner` processes (bench_cli.py)")
    args = ap.parse_args()

    s = build_scenario(model="llama-2-7b", gpus_per_node=8, stage=2, micro_batch=1, grad_accum=8, seq_len=4096)
    est_t = timeit(lambda: estimate(s), args.repeats)
    plan_t = timeit(lambda: plan(s), args.repeats)
    n_candidates = plan(s).candidates_evaluated

    # a sweep of ~1e5 candidates: stage x offload x checkpointing x micro-batch x grad-accum x nodes
    side = max(2, int(round((args.sweep / (4 * 3 * 3)) ** (1 / 3))))
    axes = dict(stage=[0, 1, 2, 3], offload_optimizer=[0, 1, 2], checkpointing=[0, 1, 2],
                micro_batch=np.arange(1, side + 1), grad_accum=np.arange(1, side + 1), nodes=np.arange(1, side + 1))
    total = int(np.prod([len(v) for v in axes.values()]))
    sweep_t = timeit(lambda: sweep(s, **axes), max(3, args.repeats // 10))
    per_candidate = statistics.median(sweep_t) / total
    faults = sweep_page_faults(s, axes)

    rows = [
        ("zeroplanner estimate (1 configuration, full)", statistics.median(est_t)),
        (f"zeroplanner plan ({n_candidates} candidates + variants)", statistics.median(plan_t)),
        (f"zeroplanner sweep, per candidate ({total} candidates)", per_candidate),
    ]

    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        p, lg = s.parameters, s.model.largest_module_params
        ds_t = timeit(lambda: (estimate_zero2_model_states_mem_needs(p, 8, 1, cpu_offload=False),
                               estimate_zero3_model_states_mem_needs(p, lg, 8, 1, False, False, True)), args.repeats)
        rows.append(("DeepSpeed estimators (model states only, zero2 + zero3 call)", statistics.median(ds_t)))
    except ImportError:
        ds_t = None
        print("deepspeed not installed: DeepSpeed estimator row skipped")

    llm = llm_calls = None
    if not args.no_llm_analysis:
        py = ensure_llm_analysis()
        if py is not None:
            r = subprocess.run([str(py), "-c", LLM_ANALYSIS_CHILD, str(max(5, args.repeats // 5))],
                               capture_output=True, text=True, timeout=600)
            if r.returncode == 0:
                out = json.loads(r.stdout.strip().splitlines()[-1])
                llm = statistics.median(out["seconds"])
                llm_py, llm_c = out["python_calls"], out["c_calls"]
                llm_calls = llm_py + llm_c
                rows.append(("llm-analysis training() (1 configuration)", llm))
            else:
                print("llm-analysis run failed:", r.stderr.strip().splitlines()[-1:])

    print(f"\nCPU time (time.process_time), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'measurement':<64} {'median':>12}")
    for name, sec in rows:
        print(f"{name:<64} {sec * 1e3:10.4f} ms")
    print("\nratios (same run):")
    plan_ms = statistics.median(plan_t) * 1e3
    print(f"  full plan time: {plan_ms:.2f} ms (target < 1 ms: {'met' if plan_ms < 1 else 'NOT met'})")
    print(f"  sweep throughput: {1 / per_candidate:,.0f} candidates/s (target >= 5,000,000: "
          f"{'met' if per_candidate <= 2e-7 else 'NOT met'}); {faults:,} page faults per sweep (memory the "
          "allocator took back from the kernel: see docs/performance.md)")
    if llm is not None:
        ratio = llm / per_candidate
        print(f"  llm-analysis s/config / zeroplanner s/candidate = {ratio:,.0f}x (target >= 100x: "
              f"{'met' if ratio >= 100 else 'NOT met'})")
        est_ratio = statistics.median(est_t) / llm
        print(f"  zeroplanner one full estimate / llm-analysis one config = {est_ratio:,.2f}x (target <= 1: "
              f"{'met' if est_ratio <= 1 else 'NOT met'})")
    est_calls, plan_calls = counted_calls(lambda: estimate(s)), counted_calls(lambda: plan(s))
    print(f"  calls per run (Python function + C function calls, sys.setprofile): estimate {est_calls[0]:,} + "
          f"{est_calls[1]:,}, plan {plan_calls[0]:,} + {plan_calls[1]:,}", end="")
    if llm_calls is not None:
        per_call = llm / llm_calls
        print(f", llm-analysis training() {llm_py:,} + {llm_c:,}\n"
              f"    priced at llm-analysis's average time per call ({per_call * 1e6:.2f} us, its arithmetic "
              f"included; an estimate, not a bound), zeroplanner's calls come to "
              f"{sum(est_calls) * per_call * 1e3:.2f} ms per estimate ({sum(est_calls) / llm_calls:.1f}x "
              f"llm-analysis) and {sum(plan_calls) * per_call * 1e3:.2f} ms per plan")
    else:
        print()
    if ds_t is not None:
        print(f"  zeroplanner one full estimate / DeepSpeed estimator calls = "
              f"{statistics.median(est_t) / statistics.median(ds_t):,.1f}x (DeepSpeed counts model states only)")
    if args.profile:
        profile_plan(s, max(20, args.repeats))
    if args.cli:
        print()
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_cli

        bench_cli.run(bench_cli.commands()[:4], repeats=5)
    return 0


PLAN_STAGES = (
    ("search: the grid and the chart variants, one evaluate", "zeroplanner/planner/search.py", "search"),
    ("  of it, the cost model's evaluate", "zeroplanner/costmodel/evaluate.py", "evaluate"),
    ("ranking", "zeroplanner/planner/rank.py", "rank_candidates"),
    ("the pick's Estimate", "zeroplanner/costmodel/evaluate.py", "estimate_from_values"),
    ("alternatives (why not; their Estimates wait until read)", "zeroplanner/planner/search.py", "_option"),
    ("chart variants (Options; Estimates wait until read)", "zeroplanner/planner/sweeps.py", "variant_options_from"),
    ("reasons", "zeroplanner/planner/reasons.py", "fit_reasons"),
    ("warnings", "zeroplanner/planner/reasons.py", "fit_warnings"),
    ("advice: fewer nodes", "zeroplanner/advice.py", "cluster_advice"),
    ("advice: cheaper methods", "zeroplanner/advice.py", "method_advice"),
)
"""(what, file, function) of the stages :func:`profile_plan` reports, in the order plan() runs them."""


def profile_plan(scenario, repeats: int) -> None:
    """Where a plan's time goes: ``repeats`` plans under cProfile, each planner stage's share of the profiled time
    (cumulative, so a stage includes what it calls), then the cost model's 12 functions with the most own time.
    cProfile slows Python calls more than numpy's, so shares, not milliseconds, are the figures to read."""
    import cProfile
    import pstats

    plan(scenario)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        plan(scenario)
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.items())
    print(f"\nwhere a plan's time goes ({repeats} plans under cProfile; share of the profiled time)")
    for what, path, func in PLAN_STAGES:
        cum = sum(ct for (file, _, name), (_, _, _, ct, _) in stats.items() if file.endswith(path) and name == func)
        print(f"  {what:<62} {cum / total:6.1%}")
    own = sorted(((tt, file, line, name) for (file, line, name), (_, _, tt, _, _) in stats.items()
                  if "/zeroplanner/" in file), reverse=True)[:12]
    print("  zeroplanner functions by own time:")
    for tt, file, line, name in own:
        where = f"{file.split('/zeroplanner/', 1)[1]}:{line} {name}"
        print(f"    {where:<60} {tt / total:6.1%}")


if __name__ == "__main__":
    sys.exit(main())
