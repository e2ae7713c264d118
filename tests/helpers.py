"""Helpers shared by the test folders: one scenario builder (the CLI runner is the ``cli_main`` fixture)."""

from __future__ import annotations

from zeroplanner import catalog
from zeroplanner.specs import Architecture, Assumptions, ClusterSpec, OffloadSpec, Scenario, TrainingSpec, ZeroSpec


def make_scenario(params: float = 7.5e9, *, dp: int = 8, stage: int = 0, accounting: str = "deepspeed",
                  precision: str = "bf16", offload_optimizer: str = "none", offload_param: str = "none",
                  micro_batch: int = 1, grad_accum: int = 1, seq_len: int = 1024, checkpointing: str = "full",
                  gpus_per_node: int | None = None, optimizer: str = "adamw", network: str = "ib-hdr",
                  arch: Architecture | None = None, **zero) -> Scenario:
    """A scenario with data-parallel degree ``dp`` (8 GPUs per node when dp >= 8)."""
    g = gpus_per_node or min(dp, 8)
    nodes = max(1, dp // g)
    return Scenario(
        model=arch or Architecture.from_parameter_count(int(params)),
        cluster=ClusterSpec(gpu=catalog.gpu("A100-80GB"), gpus_per_node=g, nodes=nodes,
                            network=catalog.network(network)),
        training=TrainingSpec(precision=precision, micro_batch=micro_batch, grad_accum=grad_accum, seq_len=seq_len,
                              checkpointing=checkpointing, optimizer=optimizer),
        zero=ZeroSpec(stage=stage, offload_optimizer=OffloadSpec(device=offload_optimizer),
                      offload_param=OffloadSpec(device=offload_param), **zero),
        assumptions=Assumptions(accounting=accounting),
    )
