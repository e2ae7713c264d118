"""Probe the machine this runs on: what its GPUs, host RAM and disk really are, and what they really do.

Three layers, each usable alone:

- :func:`inventory` -- CUDA availability, GPUs (name, total and free memory from ``torch.cuda.mem_get_info``,
  compute capability, catalog match), peer access and NVLink between local GPUs, host RAM (``/proc/meminfo``) and
  free disk for NVMe offload (``shutil.disk_usage``). Without CUDA it returns ``{"cuda_available": False,
  "message": "no CUDA device: ...", ...}``; it never raises because a GPU is missing.
- micro-benchmarks, each bounded in time: :func:`benchmark_matmul` (bf16 TFLOP/s), :func:`benchmark_host_transfer`
  (host<->device GB/s, pinned and pageable) and :func:`benchmark_collectives` (all-reduce / all-gather /
  reduce-scatter bus bandwidth over local ranks, NCCL on GPUs and gloo on CPU ranks, launched with torchrun), with a
  least-squares alpha-beta fit per collective (:func:`fit_alpha_beta`), and :func:`benchmark_cpu_adam` (DeepSpeed's
  CPU-Adam updates/s on this host's cores, the offload_optimizer step's rate).
- :func:`cluster_from_probe` turns a probe result (or its JSON file, :func:`load_probe`) into the planner's
  :class:`~zeroplanner.specs.ClusterSpec` (:mod:`.cluster`). Fitting MFU to measured step times lives in
  :mod:`zeroplanner.calibrate.fits`.

Modules: :mod:`.hardware` (the inventory), :mod:`.benchmarks` (and :func:`run_probe`), :mod:`.cluster`, :mod:`._worker` (the
torchrun collective worker), :mod:`.distributed` (the probe as one rank of the user's torchrun / DeepSpeed / srun
job across nodes: ``zeroplanner probe --distributed``); ``python -m zeroplanner.probe`` is :mod:`.__main__`.

torch is imported inside functions only: ``import zeroplanner.probe`` works without torch. Calling
:func:`inventory` or a benchmark creates a CUDA context in the calling process; a long-lived process (the Voila
kernel) should call :func:`probe_in_subprocess`, which runs ``python -m zeroplanner.probe --json`` in a short-lived
child and returns its JSON.

Bandwidth units: GB/s = 1e9 bytes/s (nccl-tests and vendors use this); memory in bytes.
"""

from ._worker import COLLECTIVES, busbw_factor
from .benchmarks import (
    benchmark_collectives,
    benchmark_cpu_adam,
    benchmark_host_transfer,
    benchmark_matmul,
    fit_alpha_beta,
    probe_in_subprocess,
    run_probe,
)
from .cluster import MAX_PROBE_FILE_BYTES, cluster_changes, cluster_from_probe, load_probe
from .hardware import PROBE_FORMAT, host_inventory, inventory, match_catalog, parse_nvlink_status

__all__ = [
    "COLLECTIVES",
    "MAX_PROBE_FILE_BYTES",
    "PROBE_FORMAT",
    "busbw_factor",
    "host_inventory",
    "match_catalog",
    "parse_nvlink_status",
    "inventory",
    "benchmark_matmul",
    "benchmark_host_transfer",
    "benchmark_collectives",
    "benchmark_cpu_adam",
    "fit_alpha_beta",
    "run_probe",
    "probe_in_subprocess",
    "load_probe",
    "cluster_changes",
    "cluster_from_probe",
]
