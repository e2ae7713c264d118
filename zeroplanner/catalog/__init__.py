"""Catalog of released model architectures, GPUs and networks.

Data lives in JSON files beside this module (``models.json``, ``gpus.json``, ``networks.json``); every entry has a
``source`` naming where its numbers come from. Lookups are case-insensitive and raise ``KeyError`` listing the
known names.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from ..specs import Architecture, GPUSpec, NetworkSpec


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    text = resources.files(__package__).joinpath(f"{kind}.json").read_text(encoding="utf-8")
    entries = json.loads(text)["entries"]
    return {e["name"].lower(): e for e in entries}


def _get(kind: str, cls, name: str):
    table = _load(kind)
    key = str(name).strip().lower()
    if key not in table:
        raise KeyError(f"unknown {kind[:-1]} {name!r}; known: {', '.join(sorted(e['name'] for e in table.values()))}")
    return cls.model_validate(table[key])


def model(name: str) -> Architecture:
    """A released model's architecture by catalog name (e.g. ``"llama-2-7b"``)."""
    return _get("models", Architecture, name)


def gpu(name: str) -> GPUSpec:
    """A GPU by catalog name (e.g. ``"A100-80GB"``)."""
    return _get("gpus", GPUSpec, name)


def network(name: str) -> NetworkSpec:
    """An inter-node network preset by catalog name (e.g. ``"ib-ndr"``)."""
    return _get("networks", NetworkSpec, name)


def model_names() -> list[str]:
    return [e["name"] for e in _load("models").values()]


def gpu_names() -> list[str]:
    return [e["name"] for e in _load("gpus").values()]


def network_names() -> list[str]:
    return [e["name"] for e in _load("networks").values()]
