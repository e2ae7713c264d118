"""The step-time constants fitted on measured public runs (shared/references/THROUGHPUT.md), each fitted ONCE for
all rows by ``benchmarks/make_validation.py`` (``zeroplanner.costmodel.measured_runs.fit``), which also prints the
leave-one-out error. Everything else in the step-time model is taken from a cited source or measured here
(compute.py: the memory-bound bytes per token counted on real transformers models; communication.py; the catalog).

- gemm_hidden_half: hidden size at which the GEMM-size factor h / (h + h_half) is one half. Fitted on all rows
  (THROUGHPUT.md sections 1-5): it sets how much slower the GEMMs of small models (BLOOM-560M, hidden 1024) run
  than those of the reference runs of the generation fractions.
- zero3_fetch_seconds: host time per ZeRO-3 module hook (forward and backward pre-hooks, parameter-coordinator
  bookkeeping, all-gather launch, stream waits). The GPU waits for it only when it is longer than the GPU's own work
  (the host runs ahead otherwise). Carried by section 1 (BLOOM ZeRO-3 rows, where it dominates).
- grad_hook_seconds: host time per trainable parameter tensor that ZeRO-2/3 backward adds over ZeRO-1's (the
  partitioned-gradient bookkeeping of each gradient hook), serial with backward. Carried by section 1 (ZeRO-2 vs
  ZeRO-1, both with overlap_comm in BELLE's config); the per-parameter Python path is the maintainers' own reading
  of ZeRO-2 backward 5x DDP (TensorAuto/OpenTau#177, docs/network_sources.md section 4).
- overlap_loss: the fraction of the shorter of (communication, compute) that overlapping does not hide (NCCL
  kernels take SMs and HBM bandwidth from the concurrent GEMMs; prefetch is bounded). Carried by section 3
  (ZeRO-3 at 1 x vs 4 x 100 Gb/s) and the overlapped reductions of section 1.

- pageable_copy_gb_per_s: host<->device GB/s of DeepSpeed's offload copies without pin_memory (the CUDA driver
  stages pageable memory through its own pinned buffer, one CPU memcpy per chunk). Fitted on the fit half of the
  offload rows only (measured_runs.OFFLOAD_FIT: the RWKV ZeRO-2 pairs on 2 x A5000 and 2 x RTX 3090, Lightning's
  pin_memory=False); the other offload rows are held out.

The GEMM M-dimension constant (gemm_tokens_half) of the earlier model is gone: with the memory-bound kernels priced
from their measured bytes its fit ran to its lower bound (no effect), so the step-time model has four fitted
constants, and the pageable copy rate of the offload rows makes five.
"""

FITTED: dict[str, float] = {
    "gemm_hidden_half": 1201.9,
    "zero3_fetch_seconds": 0.001124,
    "grad_hook_seconds": 0.0001734,
    "overlap_loss": 0.1784,
    "pageable_copy_gb_per_s": 8.087,
}
