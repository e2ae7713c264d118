"""Measure the host RAM DeepSpeed's ZeRO-3 keeps for CPU and NVMe offload, on CPU ranks with gloo.

Each run builds a small stack of Linear layers, runs ``deepspeed.initialize`` with ZeRO-3 and the given offload
blocks (real NVMe swapping through DeepSpeed's async-io op into a temporary folder), takes one training step and
then takes a census (also right after ``deepspeed.initialize``: ``per_rank_after_init``) of the live tensor storages the engine holds in host memory, by DeepSpeed attribute path:

- ``optimizer_swapper.swap_buffer_manager.all_buffers``: pinned optimizer swap buffers
  (swap_tensor/optimizer_utils.py ``OptimizerSwapper.__init__`` -> ``SwapBufferManager``);
- ``param_swapper.buffers``, ``partitioned_swap_buffer``: pinned parameter swap buffers and the fp16 swap-out
  buffer (swap_tensor/partitioned_param_swapper.py ``_configure_aio``, ``reserve_partitioned_swap_space``);
- ``param_groups_fp16_flat_cpu_memory``: the 16-bit parameters kept in host RAM (stage3.py
  ``_create_param_groups_fp16_flat_cpu_memory``, up to ``max_in_cpu`` elements);
- ``grad_partitions_flat_buffer``: the gradient partition on ``self.device`` (the CPU when offloading);
- ``fp32_partitioned_groups_flat[i].grad``: fp32 gradients (per sub-group with CPU offload, one shared
  largest-sub-group buffer for swapped sub-groups: stage3.py ``initialize_optimizer_states``);
- ``fp32_partitioned_groups_flat[i]`` and ``optimizer.state``: fp32 master weights and Adam states (empty
  placeholders when swapped to NVMe).

Every distinct storage is counted once (its largest view). The engine runs on the CPU accelerator, so the
"device" side (ZeRO-3's gathered parameters, the reduce bucket) is CPU memory too; it is not in these paths and
not counted. Writes one JSON object (per-rank bytes by part, the DeepSpeed config, the model shape) to ``--out``.

Usage (needs libaio: ``deepspeed.ops.op_builder.AsyncIOBuilder().is_compatible()``)::

    python benchmarks/measure_nvme_host.py --out benchmarks/results/nvme_host.json

The launcher runs 2 ranks as local processes (torch.multiprocessing, gloo on 127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile

HIDDEN = 1024
LAYERS = 4
RANKS = 2

RUNS = {
    "cpu_cpu": {"offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu", "pin_memory": True}},
    "nvme_nvme_default_limits": {"offload_optimizer": {"device": "nvme", "pin_memory": True},
                                 "offload_param": {"device": "nvme", "pin_memory": True, "buffer_size": 3_000_000}},
    "nvme_nvme_small": {"offload_optimizer": {"device": "nvme", "pin_memory": True, "buffer_count": 4},
                        "offload_param": {"device": "nvme", "pin_memory": True, "buffer_count": 5,
                                          "buffer_size": 3_000_000, "max_in_cpu": 1_000_000},
                        "sub_group_size": 2 * HIDDEN * HIDDEN},
}
"""The measured configurations. ``nvme_nvme_default_limits`` keeps DeepSpeed's defaults (sub_group_size 1e9,
max_in_cpu 1e9, buffer_count 4 / 5) except buffer_size (3e6 elements instead of 1e8, so that two ranks do not lock
2 GB of the shared build machine's RAM); ``nvme_nvme_small`` makes the per-rank partition larger than
sub_group_size and max_in_cpu, the regime of a large model, so every part of the NVMe path is exercised."""


def _model():
    import torch

    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, 2 * HIDDEN, bias=False), torch.nn.Linear(2 * HIDDEN, HIDDEN, bias=False)]
    return torch.nn.Sequential(*layers)


def _storage(t):
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except Exception:  # noqa: BLE001 - meta / undefined tensors
        return None, 0


def _census(engine) -> dict[str, int]:
    import torch

    opt = engine.optimizer
    found: dict[int, tuple[int, str]] = {}

    def add(t, part):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        ptr, nbytes = _storage(t)
        if ptr is None or nbytes == 0:
            return
        if ptr not in found or found[ptr][0] < nbytes:
            found[ptr] = (nbytes, part)

    sw = getattr(opt, "optimizer_swapper", None)
    if sw is not None:
        for b in sw.swap_buffer_manager.all_buffers:
            add(b, "optimizer swap buffers (pinned)")
    psw = None
    for group in opt.fp16_groups:
        for p in group:
            psw = getattr(p, "nvme_swapper", None) or psw
    if psw is not None:
        add(psw.buffers, "parameter swap buffers (pinned)")
        if psw.partitioned_swap_buffer is not None:
            add(psw.partitioned_swap_buffer, "16-bit swap-out buffer (pinned)")
    for b in getattr(opt, "param_groups_fp16_flat_cpu_memory", []):
        add(b, "16-bit parameters in host RAM")
    add(getattr(opt, "grad_partitions_flat_buffer", None), "gradient partition (grad_partitions_flat_buffer)")
    for f in opt.fp32_partitioned_groups_flat:
        add(f.grad, "fp32 gradients")
        add(f, "fp32 master weights")
    for state in opt.optimizer.state.values():
        for v in state.values():
            add(v, "optimizer states")
    out: dict[str, int] = {}
    for nbytes, part in found.values():
        out[part] = out.get(part, 0) + nbytes
    return out


def _worker(rank: int, port: int, run: str, nvme_dir: str, queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(RANKS), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    zero = {"stage": 3, **RUNS[run]}
    for block in ("offload_optimizer", "offload_param"):
        if zero[block]["device"] == "nvme":
            zero[block] = {**zero[block], "nvme_path": nvme_dir}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": zero,
              "steps_per_print": 10**9}
    model = _model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    after_init = _census(engine)
    x = torch.randn(2, HIDDEN, dtype=torch.bfloat16)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    queue.put({"rank": rank, "parts": _census(engine), "after_init": after_init, "config": config,
               "parameters": sum(p.ds_numel for p in model.parameters())})
    deepspeed.comm.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(run: str) -> dict:
    """Per-rank census of ``run`` (a key of :data:`RUNS`) on :data:`RANKS` CPU ranks."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="zp_nvme_") as nvme_dir:
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, port, run, nvme_dir, queue)) for r in range(RANKS)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=120)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"{run}: a rank exited with {[p.exitcode for p in procs]}")
        files: dict[str, int] = {}
        for root, _, names in os.walk(nvme_dir):
            kind = "optimizer" if f"{os.sep}optimizer{os.sep}" in root + os.sep else "parameters"
            for n in names:
                kind_n = "optimizer gradients" if kind == "optimizer" and "_gradient_" in n else kind
                files[kind_n] = files.get(kind_n, 0) + os.path.getsize(os.path.join(root, n))
    results.sort(key=lambda r: r["rank"])
    return {"run": run, "ranks": RANKS, "hidden": HIDDEN, "layers": LAYERS, "parameters": results[0]["parameters"],
            "ds_config": results[0]["config"], "per_rank": [r["parts"] for r in results],
            "per_rank_after_init": [r["after_init"] for r in results],
            "nvme_file_bytes_all_ranks": files}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--runs", nargs="*", default=list(RUNS), help=f"runs to measure (default all: {list(RUNS)})")
    args = ap.parse_args(argv)
    from deepspeed.ops.op_builder import AsyncIOBuilder
    import deepspeed

    if not AsyncIOBuilder().is_compatible():
        print("async_io is not compatible here (libaio missing): nothing measured", file=sys.stderr)
        return 2
    out = {"deepspeed_version": deepspeed.__version__, "runs": [measure(r) for r in args.runs]}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
