"""Compute time, optimizer time and offload traffic per optimizer step.

FLOPs per token (PaLM, Chowdhery et al., arXiv 2204.02311, Appendix B): 6N + 12·L·H·Q·T for training, where N
counts matmul weights (active experts only) and the second term is attention (T = sequence length, H·Q the query
width). LoRA/QLoRA: frozen weights need no weight gradient, so 4N instead of 6N for them (forward 2N + input
gradients 2N; Hu et al., arXiv 2106.09685). Recomputation adds a forward: full checkpointing 2N + 4·L·H·Q·T,
selective only the attention core 4·L·H·Q·T (Korthikanti et al., arXiv 2205.05198, Sec. 5). MFU counts model FLOPs
only; the time uses executed FLOPs at ``Assumptions.mfu`` of the dense peak.
"""

from __future__ import annotations

import numpy as np

from .context import OPTIMIZER_BYTES_TOUCHED, Candidates, Context, data_parallel_degree


def flops_per_token(ctx: Context, cand: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(model FLOPs per token, executed FLOPs per token, forward FLOPs per token), per tensor-parallel rank."""
    sc = ctx.scenario
    m, t = sc.model, sc.training
    tp = float(ctx.tp)
    matmul = m.matmul_params_per_token / tp
    attention = 12.0 * m.n_layers * m.q_size * t.seq_len / tp
    if t.lora_rank:
        lora = sc.trainable_parameters / tp
        model = 4.0 * matmul + 6.0 * lora + attention
    else:
        lora = 0.0
        model = 6.0 * matmul + attention
    fwd = 2.0 * (matmul + lora) + attention / 3.0
    recompute = np.select(
        [cand.checkpointing == 2, cand.checkpointing == 1], [fwd + 0.0, attention / 3.0 + 0.0 * fwd], 0.0
    )
    model_arr = model + 0.0 * recompute
    return model_arr, model_arr + recompute, fwd + 0.0 * recompute


def compute_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """Compute seconds per step and per micro-step (forward / backward), model FLOPs per GPU per step.

    Returns dict of float arrays: "seconds", "fwd_seconds_micro", "bwd_seconds_micro", "model_flops".
    """
    model, executed, fwd = flops_per_token(ctx, cand)
    tokens_micro = cand.micro_batch.astype(np.float64) * ctx.scenario.training.seq_len
    rate = ctx.peak_flops * ctx.scenario.assumptions.mfu
    micro = tokens_micro * executed / rate
    fwd_micro = tokens_micro * fwd / rate
    ga = cand.grad_accum.astype(np.float64)
    return {
        "seconds": ga * micro,
        "fwd_seconds_micro": fwd_micro,
        "bwd_seconds_micro": micro - fwd_micro,
        "model_flops": ga * tokens_micro * model,
    }


def optimizer_and_offload_terms(ctx: Context, cand: Candidates) -> dict[str, np.ndarray]:
    """Optimizer-step seconds (GPU roofline, DeepSpeed CPU-Adam, NVMe swapping) and PCIe offload seconds.

    - GPU optimizer: OPTIMIZER_BYTES_TOUCHED per parameter of the local shard / HBM bandwidth.
    - CPU optimizer: the node's ranks share the host: gpus_per_node * Ψ_t/N_d updates at
      ``ClusterSpec.cpu_adam_params_per_second``.
    - NVMe optimizer: states read and written once per step at the node's NVMe bandwidth.
    - PCIe: gradients to the host every micro-step and updated parameters back once (optimizer offload);
      parameters fetched for forward and backward every micro-step (parameter offload; NVMe adds the same bytes
      through NVMe).
    Returns dict: "optimizer_seconds", "pcie_seconds_micro", "pcie_seconds_boundary", "nvme_seconds".
    """
    c = ctx.scenario.cluster
    n = data_parallel_degree(ctx, cand).astype(np.float64)
    T, P = ctx.trainable, ctx.params
    st = cand.stage
    ga = cand.grad_accum.astype(np.float64)
    shard = np.where(st >= 1, T / n, T)
    touched = OPTIMIZER_BYTES_TOUCHED[ctx.scenario.training.optimizer] if ctx.mixed else 16.0
    gpu_opt = shard * touched / ctx.hbm_bytes_per_second
    cpu_opt = ctx.gpus_per_node * T / n / c.cpu_adam_params_per_second
    off_opt = cand.offload_optimizer
    optimizer_seconds = np.where(off_opt > 0, cpu_opt, gpu_opt)

    K = ctx.master_bytes + ctx.optimizer_state_bytes
    nvme_bps = c.nvme_gb_per_s * 1e9
    nvme_opt = np.where(off_opt == 2, 2.0 * ctx.gpus_per_node * K * T / n / nvme_bps, 0.0)
    param_part = P * ctx.weight_bytes / n
    nvme_par = np.where(cand.offload_param == 2, 2.0 * ga * ctx.gpus_per_node * param_part / nvme_bps, 0.0)

    pcie = ctx.pcie_bytes_per_second
    grads_micro = np.where(off_opt > 0, T * ctx.grad_bytes / n / pcie, 0.0)
    params_micro = np.where(cand.offload_param > 0, 2.0 * param_part / pcie, 0.0)
    upload = np.where((off_opt > 0) & (cand.offload_param == 0), T * ctx.weight_bytes / n / pcie, 0.0)
    return {
        "optimizer_seconds": optimizer_seconds,
        "pcie_seconds_micro": grads_micro + params_micro,
        "pcie_seconds_boundary": upload,
        "nvme_seconds": nvme_opt + nvme_par,
    }
