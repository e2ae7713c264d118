"""Worker the calibration launcher runs on every rank: real DeepSpeed, real HF model, measured per rank.

The package imports only :func:`end_rank` from it (the other engine workers end with it too); ``python -m`` / the ``deepspeed`` launcher run it as a script::

    deepspeed --num_gpus N --no_local_rank zeroplanner/calibrate/_worker.py --plan plan.json --out DIR

``plan.json`` holds ``{"device": "cpu"|"cuda", "runs": [run, ...]}``; each run is
``{"name", "hf_config": {...model_type...}, "ds_config": {...}, "steps", "micro_batch", "seq_len", "seed"}``.
Runs execute one after another in the same process group (a fresh model and engine each; the previous engine is
deleted and garbage-collected first), so one launch pays the interpreter/import start-up once for many configs.

For every run each rank writes ``DIR/<name>.rank<r>.json`` with

* ``census``: live tensor storages after ``deepspeed.initialize`` (``after_init``) and after the last optimizer step
  (``after_step``), bytes per category (see :func:`_census`), deduplicated by ``untyped_storage().data_ptr()``;
  ``gc_total_bytes`` is every storage reachable from a Python tensor that the run created (``gc.get_objects``),
  so ``unattributed_bytes`` shows what the category walk missed;
* ``comms``: per step, ``{op_name: {"count", "bytes"}}`` from DeepSpeed's comms logger (``deepspeed.comm``'s
  ``comms_logger.comms_dict``: ``{op: {msg_size: [count, latencies, algbw, busbw]}}``, msg_size = bytes of the
  op's ``tensor`` argument, see deepspeed/comm/utils.py ``get_msg_size_from_args``);
* ``timings``: per step forward / backward / step seconds (``time.perf_counter``; CUDA synchronised);
* ``cuda``: ``torch.cuda.max_memory_allocated`` per phase, on CUDA only.

Measurements only: nothing here is predicted. Torch, DeepSpeed and transformers are imported inside ``main``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import sys
import time
import traceback
import warnings

# Category of a storage, decided by the first rule that claims it (order = priority).
CATEGORIES = ("parameters", "gradients", "master_parameters", "optimizer_states", "buffers", "other")


def _storage_key(t):
    """(data_ptr, nbytes, device) of the storage under tensor ``t``; None for empty/meta tensors."""
    import torch

    if not isinstance(t, torch.Tensor) or t.device.type == "meta":
        return None
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    ptr = s.data_ptr()
    if ptr == 0 or s.nbytes() == 0:
        return None
    return ptr, int(s.nbytes()), t.device.type


def _walk(obj, path, out, seen, depth=0, max_depth=7):
    """Collect (path, tensor) for every tensor reachable from ``obj`` through attributes, lists, tuples and dicts.

    Modules are not descended into (their parameters/buffers are claimed explicitly); ``seen`` holds ids of
    visited containers so cycles end.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        if getattr(obj, "ds_tensor", None) is not None:  # ZeRO-3 partition of a parameter
            out.append((path + ".ds_tensor", obj.ds_tensor))
        if obj.grad is not None:
            out.append((path + ".grad", obj.grad))
        return
    if depth >= max_depth or obj is None or isinstance(obj, (str, bytes, int, float, bool, torch.nn.Module)):
        return
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            if isinstance(k, torch.Tensor):  # optimizer.state is keyed by parameter tensors
                _walk(v, f"{path}[state]", out, seen, depth + 1, max_depth)
            else:
                _walk(v, f"{path}[{k!r}]" if not isinstance(k, int) else f"{path}[i]", out, seen, depth + 1, max_depth)
    elif isinstance(obj, (list, tuple, set)):
        for v in list(obj):
            _walk(v, f"{path}[i]", out, seen, depth + 1, max_depth)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("deepspeed", "torch", "transformers"):
        for k, v in list(vars(obj).items()):
            _walk(v, f"{path}.{k}", out, seen, depth + 1, max_depth)


def _classify(path: str) -> str:
    """Category of a tensor found at ``path`` in the optimizer walk (names from DeepSpeed 0.19.8:
    runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/bf16_optimizer.py, runtime/fp16/*.py)."""
    p = path.lower()
    if "[state]" in p:
        return "optimizer_states"
    if "ipg" in p or "temp_grad_buffer" in p:  # reduction buckets and offload staging buffers
        return "buffers"
    if "grad" in p:
        return "gradients"
    if "fp32" in p:
        return "master_parameters"
    if any(k in p for k in ("bit16", "fp16", "bf16", "lp_param")):
        return "parameters"
    if ".param_groups" in p:  # the inner optimizer's parameters that are not module parameters: fp32 masters
        return "master_parameters"
    return "other"


_RANK = {c: i for i, c in enumerate(CATEGORIES)}


def _census(engine, baseline_ptrs, with_gc=False):
    """Bytes of live storages per category on this rank.

    Every tensor reachable from the module (parameters; ZeRO-3: their ``ds_tensor`` partitions; buffers;
    ``param.grad``) and from the engine and its optimizer (walked by attribute, classified by attribute path,
    :func:`_classify`) is a claim on its storage; a storage takes the highest-priority category among its claims
    (order of ``CATEGORIES``), so a flat buffer that parameters view into is "parameters" and an fp32 partition the
    inner optimizer also lists is "master_parameters". ``gc_total_bytes``: every storage of a live Python tensor
    created after ``baseline_ptrs`` was taken; ``unattributed_bytes`` = gc total - attributed storages among them.
    """
    import torch

    claims = {}  # ptr -> [category, path, nbytes, device, dtype]

    def claim(t, category, path):
        key = _storage_key(t)
        if key is None or key[0] in baseline_ptrs:
            return
        old = claims.get(key[0])
        if old is not None and old[1].lower().find("ipg") >= 0:
            return  # a reduction bucket stays "buffers" even though parameters' .grad view into it
        if old is None or _RANK[category] < _RANK[old[0]] or (category == "buffers" and "ipg" in path.lower()):
            claims[key[0]] = [category, path, key[1], key[2], str(t.dtype)]

    module = engine.module
    for name, p in module.named_parameters():
        ds = getattr(p, "ds_tensor", None)
        if ds is not None:
            claim(ds, "parameters", f"module.{name}.ds_tensor")
        claim(p, "parameters", f"module.{name}")
        if p.grad is not None:
            claim(p.grad, "gradients", f"module.{name}.grad")
    for name, b in module.named_buffers():
        claim(b, "buffers", f"module.{name}")

    found = []
    _walk(engine.optimizer, "optimizer", found, set())
    for path, t in found:
        claim(t, _classify(path), path)
    found = []
    seen = {id(engine.optimizer)}
    for k, v in vars(engine).items():
        if k not in ("_modules", "_parameters", "_buffers", "optimizer"):
            _walk(v, f"engine.{k}", found, seen)
    for path, t in found:
        claim(t, "other", path)

    by_cat = {c: 0 for c in CATEGORIES}
    by_path = {}
    for cat, path, nbytes, device, dtype in claims.values():
        by_cat[cat] += nbytes
        short = re.sub(r"_DeepSpeedZeroOptimizer(_Stage3)?__", "__", path)
        short = re.sub(r"\.layers\.\d+\.", ".layers.N.", short)
        k = f"{cat}|{short}|{dtype}|{device}"
        by_path[k] = by_path.get(k, 0) + nbytes

    gc_total, gc_ptrs = 0, set()
    for obj in (_gc_tensors() if with_gc else ()):
        key = _storage_key(obj)
        if key is None or key[0] in gc_ptrs or key[0] in baseline_ptrs:
            continue
        gc_ptrs.add(key[0])
        gc_total += key[1]
    attributed_in_gc = sum(c[2] for ptr, c in claims.items() if ptr in gc_ptrs)
    if not with_gc:
        gc_total = attributed_in_gc = -1  # not measured at this point (the gc walk is slow)
    return {
        "bytes": by_cat,
        "attributed_bytes": sum(by_cat.values()),
        "gc_total_bytes": gc_total,
        "unattributed_bytes": gc_total - attributed_in_gc,
        "by_path": dict(sorted(by_path.items(), key=lambda kv: -kv[1])[:300]),
    }


def _gc_tensors():
    """Every live Python tensor object the garbage collector tracks."""
    import torch

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch.distributed shims warns
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor):
                    out.append(obj)
            except ReferenceError:
                continue
    return out


def _live_ptrs():
    ptrs = set()
    for obj in _gc_tensors():
        key = _storage_key(obj)
        if key is not None:
            ptrs.add(key[0])
    return ptrs


def _inner_optimizer(engine):
    """The torch optimizer that updates the fp32 (or working) parameters: DeepSpeed's ZeRO, BF16 and FP16
    wrappers keep it as ``.optimizer``; without a wrapper it is ``engine.optimizer`` itself."""
    import torch

    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else opt


def _comms_snapshot(comms_logger):
    """{op: {"count": n, "bytes": total message bytes}} from the comms logger's raw dict, then cleared."""
    out = {}
    for op, sizes in comms_logger.comms_dict.items():
        count = sum(v[0] for v in sizes.values())
        nbytes = sum(int(size) * v[0] for size, v in sizes.items())
        out[op] = {"count": int(count), "bytes": int(nbytes), "sizes": {str(k): int(v[0]) for k, v in sizes.items()}}
    comms_logger.comms_dict.clear()
    # deepspeed/comm/comm.py's log_wrapper logs each op's latency as timers(name).elapsed(reset=False): the sum over
    # every earlier op of that name, so each op cost more than the last (cProfile, rank 0 of the 2-rank validation
    # launch: 5.8 s of 66 s in that sum). Only counts and bytes are kept here; reset the timers with the dict.
    from deepspeed.comm.comm import timers

    for timer in timers.get_timers().values():
        timer.reset()
    return out


def _build_model(hf_config: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(hf_config)
    model_type = cfg.pop("model_type")
    attn = cfg.pop("attn_implementation", "sdpa")
    config = AutoConfig.for_model(model_type, **cfg)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def _census_before(owner, method, state, flag, take, seconds_key, *, disarm):
    """Wrap ``owner.<method>`` so that while ``state[flag]`` is true it first runs ``take()`` (a census), clearing the
    flag first when ``disarm``; the seconds ``take`` spends are added to ``state[seconds_key]`` for the caller to
    subtract from the phase it times. Returns a function that puts the original method back, or None (nothing
    wrapped) when ``owner`` has no such method."""
    original = getattr(owner, method, None)
    if original is None:
        return None
    own = method in vars(owner)

    def census_then_call(*args, **kwargs):
        if state.get(flag):
            if disarm:
                state[flag] = False
            c0 = time.perf_counter()
            take()
            state[seconds_key] = state.get(seconds_key, 0.0) + time.perf_counter() - c0
        return original(*args, **kwargs)

    setattr(owner, method, census_then_call)

    def restore():
        if own:
            setattr(owner, method, original)
        else:
            delattr(owner, method)

    return restore


def _run_one(run, device, rank, world, out_dir):
    import deepspeed
    import deepspeed.comm as dist
    import torch
    from deepspeed.comm.comm import comms_logger

    cuda = device == "cuda"
    # The baseline must see every live tensor (gc.get_objects() leaves frozen objects out), and cycles a previous
    # run left are collected here. Then what is alive is frozen, so the run's later collections (and DeepSpeed's own
    # in zero.utils.defragment) walk only its own objects: they walked everything the imports of torch, transformers
    # and DeepSpeed left, 0.37 s a collection (cProfile of rank 0 in the 2-rank validation launch: 15 s in its 40
    # collections before, 5.0 s after). Measurements are unchanged: the census's categories come from walking the
    # engine, and the baseline is taken before the freeze.
    gc.unfreeze()
    gc.collect()
    baseline = _live_ptrs()
    gc.freeze()
    torch.manual_seed(run.get("seed", 1234))
    model = _build_model(run["hf_config"])
    n_params = sum(p.numel() for p in model.parameters())
    if run.get("checkpointing") == "full":
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = {"name": run["name"], "rank": rank, "world_size": world, "device": device, "parameters": n_params}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=run["ds_config"])
    result["optimizer_class"] = type(engine.optimizer).__name__
    result["basic_optimizer_class"] = type(getattr(engine, "basic_optimizer", None)).__name__
    if cuda:
        torch.cuda.synchronize()
        result.setdefault("cuda", {})["after_init_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        result["cuda"]["after_init_allocated_bytes"] = torch.cuda.memory_allocated()
    result["census"] = {"after_init": _census(engine, baseline)}
    dist.barrier()
    _comms_snapshot(comms_logger)  # drop what initialisation sent (and reset the timers)

    # Census inside the inner optimizer's step on the last step: gradients (16-bit and the fp32 copy the wrapper
    # hands to the optimizer), fp32 master weights and optimizer states are all alive there -- the model-state peak.
    def during_step():
        result["census"]["during_step"] = _census(engine, baseline, with_gc=True)

    # Census where ZeRO-1/2 frees the 16-bit gradients of its partition (stage_1_and_2.py step(): called right after
    # the fp32 gradient partition is assigned, while the 16-bit averaged gradients still exist): the gradient peak.
    def step_peak():
        snap = _census(engine, baseline)
        old = result["census"].get("step_peak")
        if old is None or snap["bytes"]["gradients"] > old["bytes"]["gradients"]:
            result["census"]["step_peak"] = snap

    # Census at the end of backward, before ZeRO's epilogue frees the 16-bit gradients and reduction buckets.
    def end_of_backward():
        result["census"]["end_of_backward"] = _census(engine, baseline)

    step_state = {"armed": False}
    restores = [
        _census_before(_inner_optimizer(engine), "step", step_state, "armed", during_step, "census_seconds",
                       disarm=True),
        _census_before(engine.optimizer, "free_grad_in_param_list", step_state, "armed_free", step_peak,
                       "census_seconds", disarm=False),
        _census_before(engine.optimizer, "independent_gradient_partition_epilogue", step_state, "armed_backward",
                       end_of_backward, "backward_census_seconds", disarm=True),
    ]

    vocab = run["hf_config"].get("vocab_size", 256)
    gen = torch.Generator().manual_seed(1000 + rank)
    timings, comms, phases = [], [], []
    dev = engine.device
    for step in range(run["steps"]):
        ids = torch.randint(0, vocab, (run["micro_batch"], run["seq_len"]), generator=gen).to(dev)
        step_state["armed_backward"] = step == run["steps"] - 1

        def sync():
            if cuda:
                torch.cuda.synchronize()

        phase = {}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        sync()
        t1 = time.perf_counter()
        if cuda:
            phase["forward_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        engine.backward(loss)
        sync()
        t2 = time.perf_counter()
        backward_seconds = t2 - t1 - step_state.pop("backward_census_seconds", 0.0)
        if cuda:
            phase["backward_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        last = step == run["steps"] - 1
        if last:
            result["census"]["after_backward"] = _census(engine, baseline)
            step_state["armed"] = True
            step_state["armed_free"] = True
        t2 = time.perf_counter()
        engine.step()
        sync()
        t3 = time.perf_counter()
        if cuda:
            phase["step_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
            phase["after_step_allocated_bytes"] = torch.cuda.memory_allocated()
            phases.append(phase)
        step_state["armed_free"] = False
        step_seconds = t3 - t2 - step_state.pop("census_seconds", 0.0)
        timings.append({"forward_seconds": t1 - t0, "backward_seconds": backward_seconds, "step_seconds": step_seconds,
                        "loss": float(loss.detach().float().item())})
        comms.append(_comms_snapshot(comms_logger))
        del loss, ids
    for restore in restores:
        if restore is not None:
            restore()
    gc.collect()
    result["census"]["after_step"] = _census(engine, baseline)
    result["timings"] = timings
    result["comms"] = comms
    if cuda:
        result["cuda"]["phases"] = phases
    with open(os.path.join(out_dir, f"{run['name']}.rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)

    # Tear down so the next run's census starts clean.
    if hasattr(engine, "destroy"):
        try:
            engine.destroy()
        except Exception:  # noqa: BLE001 - best effort; the census baseline excludes leftovers anyway
            pass
    del engine, model
    gc.collect()
    dist.barrier()


def cache_cpu_info() -> None:
    """Keep py-cpuinfo's answer for this process. DeepSpeed's op builder asks for the CPU's description every time an
    op loads (``OpBuilder.cpu_arch`` and ``simd_width`` in deepspeed/ops/op_builder/builder.py call
    ``cpuinfo.get_cpu_info``, which runs a subprocess: 1.15-1.25 s per call measured here, 5 calls per rank in the
    2-rank validation launch). The CPU does not change within a process; no measurement depends on the call. Without
    py-cpuinfo DeepSpeed reads lscpu instead (``OpBuilder._backup_cpuinfo``) and nothing is cached."""
    try:
        import cpuinfo
    except ImportError:
        return
    cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(cpuinfo.get_cpu_info)


def main(argv=None):
    return run_plan(argv, __doc__.splitlines()[0], _run_one, "worker")


def run_plan(argv, description: str, run_one, who: str) -> int:
    """The body of an engine worker rank: read ``--plan`` / ``--out``, start the process group (NCCL for device
    "cuda", else gloo) and run each of the plan's runs with ``run_one(run, device, rank, world, out_dir)``; a run
    that raises is recorded in ``<out>/<name>.rank<r>.error.json`` and the next one runs. Returns 1 if any failed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True)
    args, _ = parser.parse_known_args(argv)
    with open(args.plan) as f:
        plan = json.load(f)
    device = plan.get("device", "cpu")

    import deepspeed
    import deepspeed.comm as dist
    import torch

    torch.set_num_threads(max(1, int(plan.get("threads_per_rank", 1))))
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    cache_cpu_info()
    rank, world = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    for run in plan["runs"]:
        try:
            run_one(run, device, rank, world, args.out)
        except Exception as exc:  # noqa: BLE001 - record and move on to the next config
            failures += 1
            with open(os.path.join(args.out, f"{run['name']}.rank{rank}.error.json"), "w") as f:
                json.dump({"name": run["name"], "rank": rank, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()}, f, indent=1)
            print(f"[zeroplanner {who} rank {rank}] run {run['name']} failed: {exc}", file=sys.stderr, flush=True)
    return 1 if failures else 0


def end_rank(status: int = 0) -> None:
    """End an engine worker rank: flush stdout/stderr, wait for the other ranks when ``status`` is 0 (a
    ``torch.distributed`` barrier, when a process group is up), then ``os._exit(status)``.

    Skipping the interpreter's teardown is the point: a ZeRO-3 rank on gloo once aborted after its last step with
    "terminate called without an active exception" (exit -6, SIGABRT; one of 4 launches in a CI run, tests/evidence/
    test_ds_real_run.py), the message libstdc++ prints when a joinable ``std::thread`` is destroyed, which happens
    when process-group threads meet the C++ static destructors at exit. A failed rank skips the barrier (its peers
    may never reach one; the launcher's timeout ends them). After the barrier the rank also removes its DeepSpeed
    CPU shared-memory all-reduce buffer (:func:`_unlink_shm_buffer`). Never returns.
    """
    try:
        if status == 0:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.barrier()
                _unlink_shm_buffer()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)



SHM_BUFFER_PREFIX = "/dev/shm/deepspeed_allreduce_buffer_"
"""DeepSpeed's CPU all-reduce segments: ``<prefix><uid>_<addr>_<port>_<rank>`` (ops/csrc/cpu/comm/shm.cpp
``SHM_BUFFER_NAME``, ``shm_initialize``)."""


def _unlink_shm_buffer() -> None:
    """Remove this rank's ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>``: DeepSpeed's CPU
    all-reduce (deepspeed/ops/csrc/cpu/comm/shm.cpp ``shm_initialize``) creates one ~66 MiB segment per rank and
    never calls its ``shared_close`` (the only ``shm_unlink``), so each CPU-rank launch left them in RAM (14 GiB of
    them on the build machine after a day of test runs). Called after the final barrier: every rank mapped every
    segment at initialisation, and a mapping outlives the unlinked name."""
    import glob

    port, rank = os.environ.get("MASTER_PORT"), os.environ.get("RANK")
    if not (port and rank):
        return
    for path in glob.glob(f"{SHM_BUFFER_PREFIX}{os.getuid()}_*_{port}_{rank}"):
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    end_rank(main())
