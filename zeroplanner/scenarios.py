"""Building scenarios from names and plain values: the default scenario, and a keyword builder shared by the CLI,
the app and the Python API."""

from __future__ import annotations

from pathlib import Path

from . import catalog
from .specs import Architecture, Assumptions, ClusterSpec, OffloadSpec, Scenario, TrainingSpec, ZeroSpec
from .units import GIB

DEFAULT_MODEL = "llama-2-7b"
DEFAULT_GPU = "A100-80GB"
DEFAULT_NETWORK = "ib-hdr"


def resolve_model(model: str | None = None, hf_config: str | Path | dict | None = None,
                  params: int | None = None) -> Architecture:
    """One of: a catalog name, a HF config.json (path or dict), or a bare parameter count.

    Raises KeyError (unknown name) or ValueError (bad config / count, or more than one given).
    """
    given = [x is not None for x in (model, hf_config, params)]
    if sum(given) > 1:
        raise ValueError("give only one of model, hf_config, params")
    if hf_config is not None:
        from .hfconfig import architecture_from_hf_config

        return architecture_from_hf_config(hf_config)
    if params is not None:
        return Architecture.from_parameter_count(int(params))
    return catalog.model(model or DEFAULT_MODEL)


def build_scenario(
    *,
    model: str | None = None,
    hf_config: str | Path | dict | None = None,
    params: int | None = None,
    architecture: Architecture | None = None,
    gpu: str = DEFAULT_GPU,
    gpu_memory_gib: float | None = None,
    gpus_per_node: int = 8,
    nodes: int = 1,
    network: str = DEFAULT_NETWORK,
    inter_node_gbps: float | None = None,
    cpu_memory_gib: float = 1024.0,
    stage: int = 2,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    precision: str = "bf16",
    optimizer: str = "adamw",
    micro_batch: int = 1,
    grad_accum: int = 8,
    seq_len: int = 4096,
    checkpointing: str = "full",
    flash_attention: bool = True,
    lora_rank: int = 0,
    qlora: bool = False,
    mfu: float | None = None,
    zero_overrides: dict | None = None,
) -> Scenario:
    """A validated Scenario from plain values. Defaults: Llama-2-7B on one node of 8 A100-80GB, InfiniBand HDR,
    ZeRO-2, bf16, AdamW, micro-batch 1 x 8 accumulation steps, sequence 4096, full activation checkpointing.

    Raises pydantic.ValidationError naming the field, KeyError for unknown catalog names.
    """
    arch = architecture or resolve_model(model, hf_config, params)
    gpu_spec = catalog.gpu(gpu)
    net = catalog.network(network)
    if inter_node_gbps is not None:
        net = net.model_copy(update={"link_gbps": float(inter_node_gbps), "nics_per_node": 1})
        net = type(net).model_validate(net.model_dump())
    cluster = ClusterSpec(
        gpu=gpu_spec,
        gpu_memory_bytes=None if gpu_memory_gib is None else int(gpu_memory_gib * GIB),
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        network=net,
        cpu_memory_bytes=int(cpu_memory_gib * GIB),
    )
    training = TrainingSpec(
        precision=precision, optimizer=optimizer, micro_batch=micro_batch, grad_accum=grad_accum, seq_len=seq_len,
        checkpointing=checkpointing, flash_attention=flash_attention, lora_rank=lora_rank, qlora=qlora,
        lora_targets=("q", "k", "v", "o") if lora_rank else ("q", "k", "v", "o"),
    )
    zero = ZeroSpec(stage=stage, offload_optimizer=OffloadSpec(device=offload_optimizer),
                    offload_param=OffloadSpec(device=offload_param), **(zero_overrides or {}))
    # --mfu fixes the compute efficiency; the default value itself (what share links and the app carry today,
    # they do not carry mfu_fixed yet) keeps the work-dependent model
    default_mfu = Assumptions.model_fields["mfu"].default
    assumptions = (Assumptions() if mfu is None or mfu == default_mfu
                   else Assumptions(mfu=mfu, mfu_fixed=True))
    return Scenario(model=arch, cluster=cluster, training=training, zero=zero, assumptions=assumptions)


def default_scenario() -> Scenario:
    """Llama-2-7B, 1 node x 8 A100-80GB, ZeRO-2, bf16 AdamW, micro-batch 1, sequence 4096, full checkpointing."""
    return build_scenario()
