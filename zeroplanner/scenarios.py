"""Building scenarios from names and plain values: the default scenario, and a keyword builder shared by the CLI,
the app and the Python API (its keywords are the inputs of :mod:`zeroplanner.inputs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import catalog
from .inputs import BY_KEY, DEFAULT_GPU, DEFAULT_MODEL, DEFAULT_NETWORK, scenario_data
from .specs import Architecture, Scenario

__all__ = ["DEFAULT_GPU", "DEFAULT_MODEL", "DEFAULT_NETWORK", "build_scenario", "default_scenario", "resolve_model"]


def resolve_model(model: str | None = None, hf_config: str | Path | dict | None = None,
                  params: int | None = None) -> Architecture:
    """One of: a catalog name, a HF config.json (path or dict), or a bare parameter count.

    Raises KeyError (unknown name) or ValueError (bad config / count, or more than one given).
    """
    given = [x is not None for x in (model, hf_config, params)]
    if sum(given) > 1:
        raise ValueError("give only one of --model, --hf-config, --params (model=, hf_config=, params=)")
    if hf_config is not None:
        from .catalog.hfconfig import architecture_from_hf_config

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
    zero_overrides: dict | None = None,
    **inputs: Any,
) -> Scenario:
    """A validated Scenario from plain values: the model (one of ``model``, ``hf_config``, ``params`` or an
    ``architecture``) and any input of :data:`zeroplanner.inputs.INPUTS` by key, in the input's unit (``gpu``,
    ``gpu_memory_gib``, ``gpus_per_node``, ``nodes``, ``network``, ``inter_node_gbps``, ``cpu_memory_gib``,
    ``stage``, ``offload_optimizer``, ``offload_param``, ``precision``, ``optimizer``, ``micro_batch``,
    ``grad_accum``, ``seq_len``, ``checkpointing``, ``flash_attention``, ``lora_rank``, ``qlora``, ``mfu``, the
    DeepSpeed ``zero_optimization`` keys, ``pin_memory``). ``zero_overrides`` (ZeroSpec field -> value) is the
    older spelling of the zero keys. A value of None means "not given".

    Defaults: Llama-2-7B on one node of 8 A100-80GB, InfiniBand HDR, ZeRO-2, bf16, AdamW, micro-batch 1 x 8
    accumulation steps, sequence 4096, full activation checkpointing.

    Raises pydantic.ValidationError naming the field, KeyError for unknown catalog names, TypeError for an
    unknown keyword.
    """
    values = {**(zero_overrides or {}), **inputs}
    unknown = [k for k in values if k not in BY_KEY or k in ("model", "params")]
    if unknown:
        raise TypeError(f"build_scenario() got unknown inputs {unknown}; known: {', '.join(BY_KEY)}")
    arch = architecture or resolve_model(model, hf_config, params)
    return Scenario.model_validate(scenario_data(arch, values))


def default_scenario() -> Scenario:
    """Llama-2-7B, 1 node x 8 A100-80GB, ZeRO-2, bf16 AdamW, micro-batch 1, sequence 4096, full checkpointing."""
    return build_scenario()
