"""DeepSpeed's own model-state estimators, reproduced exactly (DeepSpeed 0.19.8).

``estimate_zero2_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py) and
``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage3.py), without importing DeepSpeed, so they
can be shown beside zeroplanner's fuller estimate: they count model states only (no activations, buffers beyond
4x the largest layer, CUDA context or fragmentation).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

ADDITIONAL_BUFFER_FACTOR = 1.5
"""DeepSpeed's default ``additional_buffer_factor`` for host memory (both estimator functions)."""


class DeepSpeedEstimateRow(BaseModel):
    """One row of DeepSpeed's estimator table: bytes per CPU (host, per node) and per GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    stage: int
    offload_param: str
    offload_optimizer: str
    zero_init: int | None
    per_cpu_bytes: int
    per_gpu_bytes: int


def zero2_model_states_mem_needs(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                 cpu_offload: bool = True,
                                 additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR) -> tuple[int, int]:
    """(cpu_bytes, gpu_bytes) exactly as ``estimate_zero2_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3_model_states_mem_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                                 num_nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                                 zero_init: bool = True,
                                 additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR) -> tuple[int, int, int]:
    """(cpu_bytes, gpu_bytes, largest_layer_bytes) exactly as ``estimate_zero3_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def deepspeed_estimate_table(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                             num_nodes: int = 1) -> list[DeepSpeedEstimateRow]:
    """All rows DeepSpeed's ``*_all_cold`` / ``*_all_live`` helpers print: stage 3 (offload_param x
    offload_optimizer x zero_init) then stage 2 (offload_optimizer), in DeepSpeed's order.

    Raises ValueError for non-positive counts.
    """
    for name, value in (("total_params", total_params), ("largest_layer_params", largest_layer_params),
                        ("num_gpus_per_node", num_gpus_per_node), ("num_nodes", num_nodes)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1 (got {value})")
    rows = []
    for offload_param, offload_opt in (("cpu", "cpu"), ("none", "cpu"), ("none", "none")):
        for zero_init in (1, 0):
            cpu, gpu, _ = zero3_model_states_mem_needs(
                total_params, largest_layer_params, num_gpus_per_node, num_nodes,
                cpu_offload=offload_opt == "cpu", cpu_offload_params=offload_param == "cpu", zero_init=bool(zero_init))
            rows.append(DeepSpeedEstimateRow(stage=3, offload_param=offload_param, offload_optimizer=offload_opt,
                                             zero_init=zero_init, per_cpu_bytes=cpu, per_gpu_bytes=gpu))
    for offload_opt in ("cpu", "none"):
        cpu, gpu = zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes,
                                                cpu_offload=offload_opt == "cpu")
        rows.append(DeepSpeedEstimateRow(stage=2, offload_param="none", offload_optimizer=offload_opt,
                                         zero_init=None, per_cpu_bytes=cpu, per_gpu_bytes=gpu))
    return rows


def deepspeed_row_for(scenario) -> DeepSpeedEstimateRow | None:
    """DeepSpeed's own estimate for the scenario's stage and offload choice (zero_init=1 at stage 3), to show
    beside zeroplanner's fuller estimate; None where DeepSpeed has no estimator (stages 0 and 1, NVMe offload).

    Stage 2's estimator assumes offload to CPU or nothing; stage 3's counts the largest layer's working set.
    """
    z = scenario.zero
    c = scenario.cluster
    devices = {z.offload_optimizer.device, z.offload_param.device}
    if z.stage not in (2, 3) or "nvme" in devices:
        return None
    p = scenario.trainable_parameters if scenario.training.lora_rank else scenario.parameters
    if z.stage == 2:
        cpu, gpu = zero2_model_states_mem_needs(p, c.gpus_per_node, c.nodes,
                                                cpu_offload=z.offload_optimizer.device == "cpu")
        return DeepSpeedEstimateRow(stage=2, offload_param="none", offload_optimizer=z.offload_optimizer.device,
                                    zero_init=None, per_cpu_bytes=cpu, per_gpu_bytes=gpu)
    cpu, gpu, _ = zero3_model_states_mem_needs(
        p, scenario.model.largest_module_params, c.gpus_per_node, c.nodes,
        cpu_offload=z.offload_optimizer.device == "cpu", cpu_offload_params=z.offload_param.device == "cpu",
        zero_init=True)
    return DeepSpeedEstimateRow(stage=3, offload_param=z.offload_param.device,
                                offload_optimizer=z.offload_optimizer.device, zero_init=1, per_cpu_bytes=cpu,
                                per_gpu_bytes=gpu)
