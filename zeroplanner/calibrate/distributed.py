"""``zeroplanner calibrate --distributed``: the calibration as one rank of the user's own multi-node job.

Each rank of a job started by torchrun, the DeepSpeed launcher or ``srun`` (``zeroplanner launch-script`` prints
the command) joins the process group, measures the collectives per level (intra-node, inter-node, world:
:func:`zeroplanner.probe.distributed.start`), then runs real DeepSpeed steps of the scaled-down model of the
scenario's architecture on the same process group across all nodes (the engine worker's
:func:`zeroplanner.calibrate._worker._run_one`, in this process). The per-rank measurements are gathered on
rank 0, which sets them beside the cost model evaluated on the same tiny model over the measured layout
(``nodes`` x ranks per node: :func:`zeroplanner.calibrate.calibration_scenario`) and writes one report: the probe
report (:func:`zeroplanner.probe.distributed.build_report`; ``--cluster-from`` accepts it) plus ``calibration``
(the :class:`~zeroplanner.calibrate.CalibrationReport`), ``calibration_table`` and ``calibration_fit``
(:func:`zeroplanner.calibrate.fits.fit_from_calibration` with the measured fabric: predicted vs measured step time).

torch, DeepSpeed and transformers are imported inside functions only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Literal

from ..files import MAX_RESULT_FILE_BYTES, read_regular_file
from ..specs import Scenario

MAX_MESSAGE_BYTES = {"cuda": 2**30, "cpu": 2**24}
"""Largest collective the sweep times: 1 GiB on GPUs (DeepSpeed's default 5e8-element bucket in 16-bit is 1e9
bytes); on CPU ranks the largest of :data:`zeroplanner.probe.benchmarks.CPU_MESSAGE_BYTES`, to stay within
seconds."""


def zero_message_bytes(scenario: Scenario, device: str) -> list[int]:
    """The sweep's sizes: the probe's defaults plus the messages the scenario's ZeRO config sends (nccl-tests
    sizes): ``reduce_bucket_size`` and, for ZeRO-3, ``stage3_prefetch_bucket_size`` elements of the 16-bit (fp32
    with fp32 training) working dtype, and ``allgather_bucket_size`` for ZeRO-1/2, each capped at
    :data:`MAX_MESSAGE_BYTES` and at least 4 bytes."""
    from ..probe.benchmarks import CPU_MESSAGE_BYTES, GPU_MESSAGE_BYTES

    z = scenario.zero
    element = 4 if scenario.training.precision == "fp32" else 2
    elements = [z.reduce_bucket_size] + ([z.stage3_prefetch_bucket_size] if z.stage == 3 else
                                         [z.allgather_bucket_size])
    cap = MAX_MESSAGE_BYTES["cuda" if device == "cuda" else "cpu"]
    sizes = set(GPU_MESSAGE_BYTES if device == "cuda" else CPU_MESSAGE_BYTES)
    sizes |= {max(4, min(cap, int(e) * element)) for e in elements if e > 0}
    return sorted(sizes)


def run_distributed_calibration(
    scenario: Scenario,
    *,
    steps: int = 3,
    device: Literal["cpu", "cuda"] = "cpu",
    seq_len: int | None = None,
    micro_batch: int | None = None,
    budget_seconds: float = 20.0,
    node_id: str | None = None,
    rendezvous_timeout_seconds: float = 120.0,
    output: str | None = None,
    nvme_path: str = ".",
) -> dict[str, Any] | None:
    """Run on every rank of the launcher's job. Returns the report on rank 0 (also written to ``output`` and its
    ``.txt`` when given), None on the other ranks.

    Raises ``ValueError`` for steps outside 2-100 or an unknown device, :class:`CalibrationError` when torch,
    DeepSpeed or transformers is missing, :class:`zeroplanner.probe.distributed.DistributedError` when the
    rendezvous times out, the nodes hold different numbers of ranks, or a rank's engine run fails (every rank
    raises it, naming the failed ranks)."""
    from ..probe import distributed as pd
    from . import (
        CalibrationError,
        _require,
        calibration_scenario,
        compare,
        engine_config,
    )

    if not (2 <= steps <= 100):
        raise ValueError(f"steps={steps} must be between 2 and 100")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: allowed 'cpu' or 'cuda'")
    _require("torch", "deepspeed", "transformers")
    ctx = pd.start(backend="nccl" if device == "cuda" else "gloo", node_id=node_id, budget_seconds=budget_seconds,
                   rendezvous_timeout_seconds=rendezvous_timeout_seconds, nvme_path=nvme_path,
                   message_bytes=zero_message_bytes(scenario, device))
    import torch.distributed as dist

    ok = False
    try:
        info, topo, report = ctx["info"], ctx["topology"], ctx["report"]
        rank, world, nodes = info["rank"], info["world_size"], len(topo["nodes"])
        if not topo["uniform"]:
            counts = [len(n["ranks"]) for n in topo["nodes"]]
            raise pd.DistributedError(f"the nodes hold different numbers of ranks ({counts}): the cost model needs "
                                      "as many GPUs on every node")
        tiny, cfg = calibration_scenario(scenario, world, seq_len=seq_len, micro_batch=micro_batch, nodes=nodes)
        t = tiny.training
        run = {"name": "calibration", "hf_config": cfg, "ds_config": engine_config(tiny, device), "steps": steps,
               "micro_batch": t.micro_batch, "seq_len": t.seq_len,
               "checkpointing": "full" if t.checkpointing == "full" else "none"}
        import deepspeed

        from . import _worker

        deepspeed.init_distributed(dist_backend=ctx["backend"])  # wraps the process group start() created
        started = time.perf_counter()
        result, error = None, None
        with tempfile.TemporaryDirectory(prefix="zeroplanner-calibrate-") as tmp:
            try:
                _worker._run_one(run, device, rank, world, tmp)
                result = json.loads(read_regular_file(os.path.join(tmp, f"calibration.rank{rank}.json"),
                                                      MAX_RESULT_FILE_BYTES, "calibration result"))
            except Exception as exc:  # noqa: BLE001 - reported by rank 0 with the rank's number
                error = f"rank {rank}: {type(exc).__name__}: {pd.fail_message(exc)[:300]}"
        wall = time.perf_counter() - started
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, {"result": result, "error": error})
        errors = [g["error"] for g in gathered if g["error"]]
        if errors:
            raise pd.DistributedError(f"the DeepSpeed step failed on {len(errors)} of {world} ranks: "
                                      + "; ".join(errors[:3]))
        ok = True
        if rank != 0:
            return None
        per_rank = [g["result"] for g in gathered]
        calibration = compare("calibration", tiny, cfg, per_rank, steps, device, wall, None)
        report = dict(report)
        report["calibration"] = calibration.model_dump()
        report["calibration_table"] = (f"calibration across {nodes} nodes x {world // nodes} ranks:\n"
                                       + calibration.table())
        from .fits import fit_from_calibration

        try:
            fit = fit_from_calibration([calibration], probe=report)
            row = fit["runs"][0]
            report["calibration_table"] += (
                f"\nstep seconds: measured {row['measured_step_seconds']:.4g}, predicted "
                f"{row['predicted_step_seconds_before']:.4g} (catalog network, MFU {fit['mfu_default']:g}); MFU "
                f"fitted with the measured fabric {fit['mfu']:.3g} (a tiny model: not a production MFU)")
        except ValueError as exc:  # the measured fabric cannot be priced: keep the report, say why
            fit = {"error": str(exc)}
        report["calibration_fit"] = fit
        pd.write_report(report, output)
        return report
    except CalibrationError:
        raise
    except pd.DistributedError:
        raise
    except Exception as exc:  # noqa: BLE001 - a peer died or timed out inside a collective
        raise pd.DistributedError(f"rank {ctx['info']['rank']}: {type(exc).__name__}: {pd.fail_message(exc)}") \
            from None
    finally:
        pd.finish(barrier=ok)
