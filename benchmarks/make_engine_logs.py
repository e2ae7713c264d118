"""Produce real DeepSpeed launch logs on 2 CPU ranks, with the engine's own counters as ground truth.

    python benchmarks/make_engine_logs.py                 # every run in RUNS
    python benchmarks/make_engine_logs.py --only z2_offload

For each run it launches ``python -m deepspeed.launcher.runner --num_gpus 2 --no_local_rank --master_port P
benchmarks/make_engine_logs.py --worker ...`` (gloo, CPU accelerator, OMP_NUM_THREADS=1), captures the whole
stdout+stderr of the launch into ``tests/data/run_logs/engine/<run>.log``, and rank 0 of the worker writes
``<run>.counters.json``: the comms logger's dict, every wall-clock timer line's values as the engine held them
when it printed, the flops profiler's totals for the profiled step, the numbers behind each
``see_memory_usage`` print, the per-step lr/loss, and the run's shape (world size, stage, micro-batch,
accumulation, config).

The model is a tiny transformers LlamaForCausalLM built from a config (hidden 64, intermediate 128, 2 layers,
4 heads, 2 kv heads, vocab 256), bf16, AdamW, micro-batch 2, sequence 32, gradient accumulation 2, 4 optimizer
steps. About a minute a run on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "run_logs" / "engine"
WORLD = 2
MICRO_BATCH = 2
SEQ = 32
GAS = 2
STEPS = 4
PROFILE_STEP = 2
MODULE_DEPTH = -1
DS_LOG_LEVEL = "info"

# name -> (stage, offload_optimizer, offload_param)
RUNS = {
    "z1": (1, False, False),
    "z2": (2, False, False),
    "z3": (3, False, False),
    "z2_offload": (2, True, False),
    "z3_offload": (3, True, True),
}

MODEL_CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=SEQ)


def ds_config(stage: int, offload_optimizer: bool, offload_param: bool, module_depth: int = MODULE_DEPTH) -> dict:
    zero: dict = {"stage": stage}
    if stage == 3:
        # The whole tiny model is under the default persistence threshold (1e5 elements per tensor), which would
        # keep every parameter resident and gather nothing; 0 makes stage 3 partition and all-gather each one.
        zero["stage3_param_persistence_threshold"] = 0
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GAS,
        "steps_per_print": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "wall_clock_breakdown": True,
        "comms_logger": {"enabled": True, "verbose": False, "prof_all": True},
        "flops_profiler": {"enabled": True, "profile_step": PROFILE_STEP, "module_depth": module_depth,
                           "top_modules": 1, "detailed": False},
    }


# ----------------------------------------------------------------------------------------------------------------
# worker (runs once per rank under the DeepSpeed launcher)
# ----------------------------------------------------------------------------------------------------------------


def _comms_records(comms_dict: dict) -> list:
    rows = []
    for op, by_size in comms_dict.items():
        for size, vals in sorted(by_size.items()):
            rows.append({"op": op, "msg_size_bytes": int(size), "count": int(vals[0]),
                         "latencies_ms": [float(v) for v in vals[1]],
                         "algbw_gbps": [float(v) for v in vals[2]],
                         "busbw_gbps": [float(v) for v in vals[3]],
                         "total_latency_ms": float(sum(vals[1]))})
    return rows


def _summary_records(summary: dict) -> list:
    rows = []
    for op, by_size in (summary or {}).items():
        for size, d in sorted(by_size.items()):
            rows.append({"op": op, **{k: (float(v) if isinstance(v, float) else v) for k, v in d.items()}})
    return rows


def _tput(engine):
    try:  # ThroughputTimer divides by (global steps - start_step), zero at its start step
        return float(engine.tput_timer.avg_samples_per_sec())
    except ZeroDivisionError:
        return None


def worker(args) -> int:
    import torch
    import deepspeed
    import deepspeed.comm as dist
    import deepspeed.runtime.utils as ds_rt_utils
    import psutil
    import transformers
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.utils import see_memory_usage
    from deepspeed.utils.timer import (BACKWARD_GLOBAL_TIMER, FORWARD_GLOBAL_TIMER, STEP_GLOBAL_TIMER,
                                       SynchronizedWallClockTimer)

    if args.ds_log_level:
        # 0.19.8's DeepSpeed logger defaults to WARNING in the ranks, which hides the INFO lines
        # steps_per_print drives (step=..., lr=..., RunningAvgSamplesPerSec=...) and the config dump.
        from deepspeed.utils.logging import set_log_level_from_string
        set_log_level_from_string(args.ds_log_level)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()

    torch.manual_seed(1234)
    config = transformers.LlamaConfig(**MODEL_CONFIG)
    model = transformers.LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    cfg = ds_config(args.stage, args.offload_optimizer, args.offload_param, args.module_depth)

    # --- wrap the timers' printer (class-wide, before initialize, so the ZeRO optimizers' own lines such as
    # stage 3's init_optimizer_state are caught too) to record the numbers exactly as they are printed ---
    timer_lines: list = []
    holder: dict = {}
    orig_log = SynchronizedWallClockTimer.log

    def recording_log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None):
        eng = holder.get("engine")
        values = {n: self.timers[n].elapsed(reset=False) / normalizer for n in names if n in self.timers}
        timer_lines.append({"global_steps": getattr(eng, "global_steps", None),
                            "micro_steps": getattr(eng, "micro_steps", None),
                            "during_initialize": eng is None, "names": list(names), "values_ms": values,
                            "printed_on_this_rank": rank in (ranks or [0])})
        return orig_log(self, names, normalizer=normalizer, reset=reset, memory_breakdown=memory_breakdown,
                        ranks=ranks)

    SynchronizedWallClockTimer.log = recording_log
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    holder["engine"] = engine

    # The engine prints the profile at every engine.step() whose global_steps equals profile_step on rank 0;
    # with gradient accumulation that is the non-boundary micro-step too, so there can be several prints.
    flops: dict = {"enabled": engine.flops_profiler_enabled(), "profile_step": PROFILE_STEP, "prints": []}
    prof = getattr(engine, "flops_profiler", None)
    if prof is not None:
        orig_print = prof.print_model_profile

        def recording_print(*a, **kw):
            rec: dict = {"profile_step_arg": kw.get("profile_step"), "global_steps": engine.global_steps,
                         "micro_steps": engine.micro_steps}
            try:
                rec.update({
                    "total_flops": prof.get_total_flops(),
                    "total_macs": prof.get_total_macs(),
                    "total_duration_s": prof.get_total_duration(),
                    "total_params": prof.get_total_params(),
                    "total_flops_str": prof.get_total_flops(as_string=True),
                    "total_macs_str": prof.get_total_macs(as_string=True),
                    "total_duration_str": prof.get_total_duration(as_string=True),
                    "total_params_str": prof.get_total_params(as_string=True),
                    # what print_model_profile uses for latency when wall_clock_breakdown is on
                    "fwd_latency_s": engine.timers(FORWARD_GLOBAL_TIMER).elapsed(False) / 1000.0,
                    "bwd_latency_s": engine.timers(BACKWARD_GLOBAL_TIMER).elapsed(False) / 1000.0,
                    "step_latency_s": engine.timers(STEP_GLOBAL_TIMER).elapsed(False) / 1000.0,
                    "micro_batch_per_gpu": engine.train_micro_batch_size_per_gpu(),
                    "world_size": engine.world_size,
                    "dp_world_size": engine.dp_world_size,
                    "mp_world_size": engine.mp_world_size,
                })
            except Exception as exc:  # keep the run going; say what failed
                rec["capture_error"] = repr(exc)
            flops["prints"].append(rec)
            return orig_print(*a, **kw)

        prof.print_model_profile = recording_print

    acc = get_accelerator()
    memory_calls: list = []

    def recorded_see_memory_usage(message):
        got: dict = {}

        def wrap(name, fn):
            def inner(*a, **kw):
                v = fn(*a, **kw)
                got.setdefault(name, v)
                return v
            return inner

        saved = (acc.__dict__.get("memory_allocated"), acc.__dict__.get("max_memory_allocated"),
                 ds_rt_utils.torch_memory_reserved, ds_rt_utils.torch_max_memory_reserved, psutil.virtual_memory)
        acc.memory_allocated = wrap("memory_allocated_bytes", type(acc).memory_allocated.__get__(acc))
        acc.max_memory_allocated = wrap("max_memory_allocated_bytes", type(acc).max_memory_allocated.__get__(acc))
        ds_rt_utils.torch_memory_reserved = wrap("memory_reserved_bytes", saved[2])
        ds_rt_utils.torch_max_memory_reserved = wrap("max_memory_reserved_bytes", saved[3])
        psutil.virtual_memory = wrap("virtual_memory", saved[4])
        try:
            see_memory_usage(message, force=True)
        finally:
            for attr in ("memory_allocated", "max_memory_allocated"):
                acc.__dict__.pop(attr, None)
            ds_rt_utils.torch_memory_reserved, ds_rt_utils.torch_max_memory_reserved = saved[2], saved[3]
            psutil.virtual_memory = saved[4]
        if rank == 0:
            vm = got.pop("virtual_memory", None)
            if vm is not None:
                got["vm_total_bytes"], got["vm_available_bytes"], got["vm_percent"] = vm.total, vm.available, vm.percent
                got["vm_used_gb_printed"] = round((vm.total - vm.available) / 1024**3, 2)
            gb = 1024**3
            got["printed"] = {"MA_GB": round(got["memory_allocated_bytes"] / gb, 2),
                              "Max_MA_GB": round(got["max_memory_allocated_bytes"] / gb, 2),
                              "CA_GB": round(got["memory_reserved_bytes"] / gb, 2),
                              "Max_CA_GB": round(got["max_memory_reserved_bytes"] / gb)}
            memory_calls.append({"message": message, **got})

    # --- training ---
    gen = torch.Generator().manual_seed(100 + rank)
    steps: list = []
    wall_clock_cache: list = []
    t0 = time.time()
    for step in range(STEPS):
        losses = []
        for _micro in range(GAS):
            ids = torch.randint(0, MODEL_CONFIG["vocab_size"], (MICRO_BATCH, SEQ), generator=gen)
            ids = ids.to(engine.device)
            out = engine(input_ids=ids, labels=ids)
            engine.backward(out.loss)
            engine.step()
            losses.append(float(out.loss.detach().float().item()))
            wall_clock_cache.append({"global_steps": engine.global_steps, "micro_steps": engine.micro_steps,
                                     "values_ms": dict(engine.get_wall_clock_timers() or {})})
        steps.append({"optimizer_step": step + 1, "global_steps": engine.global_steps,
                      "global_samples": engine.global_samples, "skipped_steps": engine.skipped_steps,
                      "lr": [float(x) for x in engine.get_lr()], "micro_losses": losses,
                      "tput_avg_samples_per_sec": _tput(engine)})
        recorded_see_memory_usage(f"after step {step + 1}")
    train_s = time.time() - t0

    raw_before_summary = _comms_records(dist.comms_logger.comms_dict)
    summary = dist.log_summary(return_dict=True)
    raw_after_summary = _comms_records(dist.comms_logger.comms_dict)

    if rank == 0:
        counters = {
            "run": args.run,
            "how": "rank 0 of benchmarks/make_engine_logs.py --worker; values read from the DeepSpeed engine "
                   "objects at the moment each line was printed",
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "deepspeed": deepspeed.__version__, "transformers": transformers.__version__},
            "shape": {"world_size": world, "zero_stage": engine.zero_optimization_stage(),
                      "offload_optimizer": args.offload_optimizer, "offload_param": args.offload_param,
                      "micro_batch_per_gpu": engine.train_micro_batch_size_per_gpu(),
                      "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
                      "train_batch_size": engine.train_batch_size(), "seq_len": SEQ,
                      "optimizer_steps": STEPS, "model_params": n_params, "model_config": MODEL_CONFIG,
                      "bf16": engine.bfloat16_enabled(),
                      "optimizer_class": type(engine.optimizer).__name__,
                      "basic_optimizer_class": type(getattr(engine, "basic_optimizer", None)).__name__,
                      "accelerator": acc.device_name(), "dist_backend": dist.get_backend() if hasattr(
                          dist, "get_backend") else "gloo"},
            "ds_config": cfg,
            "ds_log_level": args.ds_log_level or "default (warning)",
            "steps": steps,
            "timers": {
                "note": "one entry per 'time (ms) | ...' line the engine printed, in order; values_ms is each "
                        "timer's elapsed(reset=False) just before timers.log printed (and reset) it",
                "lines": timer_lines,
                "engine_wall_clock_timers_after_each_engine_step": wall_clock_cache,
            },
            "comms": {
                "note": "deepspeed.comm.comms_logger.comms_dict {op: {msg_size: [count, [lat_ms], [algbw], "
                        "[busbw]]}} flattened; rank 0's view. log_summary_printed is what log_summary() "
                        "printed (its snapshot is taken after its first barrier, so it includes one "
                        "log_summary_barrier)",
                "raw_before_log_summary": raw_before_summary,
                "log_summary_printed": _summary_records((summary or {}).get("summary")),
                "raw_after_log_summary": raw_after_summary,
            },
            "flops_profiler": flops,
            "memory": {"note": "values see_memory_usage read (RSS on the CPU accelerator), one per call, rank 0",
                       "calls": memory_calls},
            "train_wall_s": train_s,
        }
        Path(args.counters).write_text(json.dumps(counters, indent=1, default=str) + "\n")
    dist.barrier()
    return 0


# ----------------------------------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(name: str, out_dir: Path, timeout: float, module_depth: int, ds_log_level: str) -> dict:
    stage, off_opt, off_par = RUNS[name]
    log_path = out_dir / f"{name}.log"
    counters_path = out_dir / f"{name}.counters.json"
    if counters_path.exists():
        counters_path.unlink()
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(WORLD), "--no_local_rank",
           "--master_port", str(free_port()), str(Path(__file__).resolve()), "--worker", "--run", name,
           "--stage", str(stage), "--counters", str(counters_path), "--module-depth", str(module_depth),
           "--ds-log-level", ds_log_level]
    if off_opt:
        cmd.append("--offload-optimizer")
    if off_par:
        cmd.append("--offload-param")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    with open(log_path, "w") as fh:
        try:
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return {"run": name, "rc": rc, "seconds": round(time.time() - t0, 1), "log_bytes": log_path.stat().st_size,
            "counters": counters_path.exists(), "cmd": cmd}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run", default="")
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--offload-optimizer", action="store_true")
    p.add_argument("--offload-param", action="store_true")
    p.add_argument("--counters", default="")
    p.add_argument("--module-depth", type=int, default=MODULE_DEPTH)
    p.add_argument("--ds-log-level", default=DS_LOG_LEVEL,
                   help="DeepSpeed logger level in the ranks ('' keeps DeepSpeed's default, WARNING)")
    p.add_argument("--only", nargs="*", choices=list(RUNS), help="runs to make (default: all)")
    p.add_argument("--out", default=str(OUT_DIR))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.only or list(RUNS):
        r = launch(name, out_dir, args.timeout, args.module_depth, args.ds_log_level)
        print(json.dumps({k: v for k, v in r.items() if k != "cmd"}), flush=True)
        results.append(r)
    return 0 if all(r["rc"] == 0 and r["counters"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
