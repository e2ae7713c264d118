"""Worker for the step-peak census: live tensor bytes over whole DeepSpeed training steps, per rank, by phase.

Run on every rank by :func:`zeroplanner.calibrate.peak.measure_step_peaks` through DeepSpeed's launcher::

    deepspeed --num_gpus N --no_local_rank zeroplanner/calibrate/_peak_worker.py --plan plan.json --out DIR

``plan.json`` is ``{"device": "cpu", "runs": [run, ...]}``; a run is ``{"name", "hf_config", "ds_config", "steps",
"micro_batch", "seq_len", "grad_accum", "checkpointing", "seed"}``.

How the bytes are measured (and why this way): torch's profiler with ``profile_memory=True`` records every
allocation and free of the c10 CPU allocator with the running total of the bytes allocated since the profiler
started and not yet freed (``_ExtraFields_Allocation.total_allocated``; c10/core/CPUAllocator.cpp
``ProfiledCPUMemoryReporter``). The profiler starts before the model is built, so that total is exactly the live
bytes of every tensor the run allocated: parameters, DeepSpeed's flat partitions and buckets, optimizer states,
activations, autograd temporaries, each counted from the moment the allocator hands it out to the moment it is
freed, including those that live only inside C++ (autograd's saved tensors and the intermediates of an op). A
census of Python-reachable tensors (the calibration worker's) cannot see the latter, and a ``TorchDispatchMode``
tracker sees storages but not the allocator's own timing. Phase boundaries are zero-length ``record_function``
markers in the same trace (same clock).

Every thread's allocations and frees are counted, not only the main thread's: c10's reporter keeps its running total
(and its table of block sizes) only while ``memoryProfilingEnabled()``, which is thread-local, or while the global
flag ``FLAGS_caffe2_report_cpu_memory_usage`` is set (c10/core/CPUAllocator.cpp ``ProfiledCPUMemoryReporter::New`` /
``Delete``). gloo runs collectives on its own worker threads, and a ZeRO-3 all-gather buffer whose last reference
the worker thread drops was freed unseen: the running total kept it, and the bytes at rest between steps drifted up
at random (qwen2-s3-short: 10.2-12.5 MB over six launches against 9.97 MB of Python-reachable tensors, all in the
same state). :func:`_count_every_thread` sets the flag (through ctypes: torch does not expose it) before anything is
allocated; with it the same run rests at 9,974,253 bytes and peaks at 17,376,021 on both ranks of every launch.
Allocations made on gloo's threads then count from the next main-thread event on (they are not events themselves).
Python's automatic garbage collection is off during the steps and
``gc.collect()`` runs at every phase boundary the worker controls (before forward, backward and the optimizer
step, and after it), so what a phase holds does not depend on when the collector happens to run: with the automatic
collector, two ranks of the same run differed by a whole fp32 gradient copy, a reference cycle of the previous
step's collected on one rank and not yet on the other:

- ``forward``: the engine's forward up to the LM head's forward pre-hook;
- ``loss forward``: the LM head and the loss, until the engine's forward returns;
- ``loss backward``: from ``engine.backward`` until the gradient reaches the LM head's input (a hook on that
  tensor): the loss, log-softmax and LM-head backward;
- ``backward``: the rest of ``engine.backward`` (decoder layers, embedding, ZeRO's reduction epilogue);
- ``optimizer step``: ``engine.step()``.

For every rank the worker writes ``DIR/<name>.rank<r>.json`` with ``after_init_bytes`` (live after
``deepspeed.initialize``), per step and micro-step the max and end bytes of each phase, and ``peak_bytes`` /
``peak_phase`` of the last step. Measurements only: nothing here is predicted.
"""

from __future__ import annotations

import gc
import json
import os

PHASES = ("forward", "loss forward", "loss backward", "backward", "optimizer step")
"""Phase names, in order within one micro-step (:mod:`zeroplanner.costmodel.timeline` uses the same names)."""

_MARK = "zp::"


def _mark(torch, label: str) -> None:
    with torch.profiler.record_function(_MARK + label):
        pass


def _allocation_series(prof):
    """(time_ns, live_bytes) after every CPU allocation or free of this run, and (time_ns, label) of every marker.

    live_bytes is c10's running total of the bytes allocated while a profiler ran and not yet freed
    (``total_allocated``, recorded with each event in the order the allocator saw them, so events with the same
    timestamp need no ordering), less its value before this run's first event. c10 keeps that total across profiler
    sessions; blocks an earlier run left and this one frees (a "foreign" free: a pointer this run never allocated)
    are added back, so the series holds this run's own tensors only. (Summing the sizes in timestamp order instead
    drifts: an allocation reusing an address freed in the same nanosecond can sort before the free, which also
    fools the foreign-free test; :func:`_allocator_order` restores the allocator's order from the totals. In that
    order the summed sizes and the total give the same maximum, to the byte, with no foreign free: checked on
    qwen2-s2 and gpt2-s0-short.)"""
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events, marks, stack = [], [], list(tree)
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        extra = node.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation":
            if str(extra.device).startswith("cpu"):
                events.append((node.start_time_ns, int(extra.alloc_size) < 0, int(extra.alloc_size),
                               int(extra.ptr), int(extra.total_allocated)))
        elif node.name.startswith(_MARK):
            marks.append((node.start_time_ns, node.name[len(_MARK):]))
    events = _allocator_order(events)
    marks.sort()
    if not events:
        return [], marks
    baseline = events[0][4] - events[0][2]
    mine, foreign, series = set(), 0, []
    for t, _is_free, size, ptr, total in events:
        if size > 0:
            mine.add(ptr)
        elif ptr in mine:
            mine.discard(ptr)
        else:
            foreign += -size
        series.append((t, total - baseline + foreign))
    return series, marks


def _allocator_order(events):
    """``events`` (time_ns, is_free, size, ptr, total_after) in the order the allocator saw them: by time, and within
    one nanosecond by chaining each event's total before it (total_after - size) to the previous total (an
    allocation and the free of the block it reuses often share a timestamp)."""
    events = sorted(events, key=lambda e: e[0])
    out, i, prev = [], 0, None
    while i < len(events):
        j = i
        while j < len(events) and events[j][0] == events[i][0]:
            j += 1
        group = events[i:j]
        while group:
            k = next((n for n, e in enumerate(group) if prev is None or e[4] - e[2] == prev), 0)
            e = group.pop(k)
            out.append(e)
            prev = e[4]
        i = j
    return out


def _phase_table(allocs, marks):
    """Split the allocation series at the markers: one row per (step, micro, phase) with the max live bytes in it
    and the live bytes at its end."""
    import bisect

    times = [t for t, _ in allocs]
    rows = []
    live = 0
    for i, (t0, label) in enumerate(marks):
        step, micro, phase = label.split("|")
        if phase == "end":
            continue
        t1 = marks[i + 1][0] if i + 1 < len(marks) else float("inf")
        lo, hi = bisect.bisect_left(times, t0), bisect.bisect_left(times, t1)
        before = allocs[lo - 1][1] if lo > 0 else 0
        inside = [b for _, b in allocs[lo:hi]]
        live = inside[-1] if inside else before
        rows.append({"step": int(step), "micro": int(micro), "phase": phase, "start_bytes": before,
                     "max_bytes": max([before, *inside]), "end_bytes": live})
    return rows


def _run_one(run, rank, world, out_dir):
    import deepspeed
    import torch
    from torch.profiler import ProfilerActivity, profile

    from zeroplanner.calibrate._worker import _build_model

    gc.unfreeze()
    gc.collect()
    # what is alive now (imports, earlier runs' leftovers) is frozen: the collections at the phase boundaries then
    # walk only this run's objects (0.37 s a collection otherwise: calibrate/_worker.py)
    gc.freeze()
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    prof.start()
    torch.manual_seed(run.get("seed", 1234))
    model = _build_model(run["hf_config"])
    if run.get("checkpointing") == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=run["ds_config"])
    _mark(torch, "-1|0|init")
    state = {"step": 0, "micro": 0}

    def label(phase):
        return f"{state['step']}|{state['micro']}|{phase}"

    head = model.get_output_embeddings()
    gc.disable()  # collected at the phase boundaries instead (module docstring)

    def head_pre(_module, args):
        _mark(torch, label("loss forward"))
        x = args[0]
        if x.requires_grad:
            x.register_hook(lambda g: _mark(torch, label("backward")))

    handle = head.register_forward_pre_hook(head_pre)
    vocab = run["hf_config"].get("vocab_size", 256)
    gen = torch.Generator().manual_seed(1000 + rank)
    ga = int(run.get("grad_accum", 1))
    for step in range(run["steps"]):
        state["step"] = step
        for micro in range(ga):
            state["micro"] = micro
            ids = torch.randint(0, vocab, (run["micro_batch"], run["seq_len"]), generator=gen)
            gc.collect()
            _mark(torch, label("forward"))
            loss = engine(input_ids=ids, labels=ids).loss
            gc.collect()
            _mark(torch, label("loss backward"))
            engine.backward(loss)
            gc.collect()
            _mark(torch, label("optimizer step"))
            engine.step()
            del loss, ids
            gc.collect()
    _mark(torch, "-1|0|end")
    gc.enable()
    prof.stop()
    handle.remove()
    allocs, marks = _allocation_series(prof)
    rows = _phase_table(allocs, marks)
    init = next(r for r in rows if r["phase"] == "init")
    steps = [r for r in rows if r["phase"] != "init"]
    last = [r for r in steps if r["step"] == run["steps"] - 1]
    top = max(last, key=lambda r: r["max_bytes"])
    result = {"name": run["name"], "rank": rank, "world_size": world, "device": "cpu",
              "parameters": sum(p.numel() if getattr(p, "ds_numel", None) is None else p.ds_numel
                                for p in model.parameters()),
              "optimizer_class": type(engine.optimizer).__name__,
              "basic_optimizer_class": type(getattr(engine, "basic_optimizer", None)).__name__,
              "after_init_bytes": init["end_bytes"], "phases": steps,
              "peak_bytes": top["max_bytes"], "peak_phase": top["phase"], "peak_micro": top["micro"],
              "allocation_events": len(allocs)}
    with open(os.path.join(out_dir, f"{run['name']}.rank{rank}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    if hasattr(engine, "destroy"):
        try:
            engine.destroy()
        except Exception:  # noqa: BLE001 - best effort; the next run's profiler starts from zero anyway
            pass
    del engine, model, prof
    gc.collect()
    import deepspeed.comm as dist

    dist.barrier()


def _count_every_thread() -> None:
    """Set c10's ``FLAGS_caffe2_report_cpu_memory_usage`` so that the allocator's running total counts the
    allocations and frees of every thread (module docstring). Raises ``RuntimeError`` when this torch build does not
    export the flag (the census would then miss frees on gloo's threads)."""
    import ctypes

    import torch

    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    try:
        flag = ctypes.c_bool.in_dll(ctypes.CDLL(lib), "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"cannot set FLAGS_caffe2_report_cpu_memory_usage in {lib}: {exc}") from exc
    flag.value = True


def main(argv=None):
    from zeroplanner.calibrate._worker import run_plan

    _count_every_thread()

    def run_one(run, _device, rank, world, out_dir):  # the plan's device is "cpu" (calibrate.peak.peak_plan)
        _run_one(run, rank, world, out_dir)

    return run_plan(argv, __doc__.splitlines()[0], run_one, "peak worker")


if __name__ == "__main__":
    from zeroplanner.calibrate._worker import end_rank

    end_rank(main())
