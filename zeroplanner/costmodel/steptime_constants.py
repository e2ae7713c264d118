"""The step-time constants fitted on measured public runs (shared/references/THROUGHPUT.md), each fitted ONCE for
all rows by ``benchmarks/make_validation.py`` (``zeroplanner.costmodel.measured_runs.fit``), which also prints the
leave-one-out error. Everything else in the step-time model is taken from a cited source (compute.py,
communication.py, the catalog).

- gemm_hidden_half: hidden size at which the GEMM-size factor h / (h + h_half) is one half. Fitted on all rows
  (THROUGHPUT.md sections 1-5): it sets how much slower small models (BLOOM-560M, hidden 1024) run than the
  reference runs of the generation fractions.
- gemm_tokens_half: tokens per micro-batch (b x s) at which the M-dimension factor is one half. Fitted on all rows;
  the 512 vs 1024 BLOOM rows (section 1) and 8K vs 32K (section 5) carry it.
- zero3_fetch_seconds: host time per ZeRO-3 module fetch (forward and backward pre-hooks, parameter-coordinator
  bookkeeping, all-gather launch, stream waits). The GPU waits for it only when it is longer than the GPU's own work
  (the host runs ahead otherwise). Carried by section 1 (BLOOM ZeRO-3 rows, where it dominates).
- grad_hook_seconds: host time per trainable parameter tensor's gradient hook in ZeRO-2/3 backward (bucketing
  into the ipg buffer, reduce bookkeeping), serial with backward. Carried by section 1 (ZeRO-2 vs ZeRO-1); the
  per-parameter Python path is the maintainers' own reading of ZeRO-2 backward 5x DDP (TensorAuto/OpenTau#177,
  docs/network_sources.md section 4).
- overlap_loss: the fraction of the shorter of (communication, compute) that overlapping does not hide (NCCL
  kernels take SMs and HBM bandwidth from the concurrent GEMMs; prefetch is bounded). Carried by section 3
  (ZeRO-3 at 1 x vs 4 x 100 Gb/s).
"""

FITTED: dict[str, float] = {
    "gemm_hidden_half": 1773.0,
    "gemm_tokens_half": 59.6,
    "zero3_fetch_seconds": 1.069e-3,
    "grad_hook_seconds": 1.894e-4,
    "overlap_loss": 0.679,
}
