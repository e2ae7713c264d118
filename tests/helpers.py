"""Helpers shared by the test folders: one scenario builder (the CLI runner is the ``cli_main`` fixture)."""

from __future__ import annotations

import pathlib

from zeroplanner import catalog
from zeroplanner.specs import Architecture, Assumptions, ClusterSpec, OffloadSpec, Scenario, TrainingSpec, ZeroSpec


DATA = pathlib.Path(__file__).resolve().parent / "data"
"""tests/data: the public files tests read (sources in tests/data/*/README.md), so a fresh clone needs nothing else."""
HF_CONFIGS = DATA / "hf-configs"
"""Published config.json files of released models and their transformers parameter counts (param_counts.json)."""
DS_CONFIGS = DATA / "ds-configs"
"""The DeepSpeed configs LLaMA-Factory and ms-swift ship."""


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


def hf_args(s: Scenario):
    """A TrainingArguments stand-in with transformers' own defaults for everything the DeepSpeed glue
    (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig) reads, and the scenario's values where
    zeroplanner.deepspeed.hf_training_arguments sets them; ``world_size`` is the data-parallel degree."""
    import dataclasses
    import types

    from transformers import TrainingArguments

    from zeroplanner.deepspeed import hf_training_arguments

    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    kwargs = hf_training_arguments(s)
    ns = types.SimpleNamespace(**{k: defaults[k] for k in (
        "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm",
        "save_on_each_node", "fp16_full_eval", "bf16_full_eval")})
    ns.world_size = s.cluster.data_parallel_degree
    ns.per_device_train_batch_size = kwargs["per_device_train_batch_size"]
    ns.gradient_accumulation_steps = kwargs["gradient_accumulation_steps"]
    ns.bf16, ns.fp16 = kwargs["bf16"], kwargs["fp16"]
    ns.get_warmup_steps = lambda n: 0
    return ns
