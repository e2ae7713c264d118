"""Catalog of released model architectures, GPUs and networks.

Data lives in JSON files beside this module (``models.json``, ``gpus.json``, ``networks.json``); every entry has a
``source`` naming where its numbers come from. Lookups are case-insensitive and raise ``KeyError`` listing the
known names. A model is also found by the Hugging Face hub id its ``source`` names (``meta-llama/Llama-3.1-8B`` for
``llama-3.1-8b``, whose source is that repository's config.json): :func:`model_hub_ids`.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

from ..specs import Architecture, GPUSpec, NetworkSpec


@lru_cache(maxsize=None)
def _load(kind: str) -> dict:
    text = resources.files(__package__).joinpath(f"{kind}.json").read_text(encoding="utf-8")
    entries = json.loads(text)["entries"]
    return {e["name"].lower(): e for e in entries}


_HUB_ID = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+)(?=\s|$)")
"""A hub repository id (``owner/name``) at the start of a catalog entry's source: the repository whose config.json
the entry's numbers were read from."""


@lru_cache(maxsize=None)
def model_hub_ids() -> dict[str, str]:
    """Hugging Face hub id -> catalog model name, for every entry whose ``source`` starts with the hub repository
    it was read from (``"meta-llama/Llama-3.1-8B config.json"``). Entries cited from a paper or a shared file have
    none. Hub ids are matched case-insensitively by :func:`model`."""
    out = {}
    for e in _load("models").values():
        m = _HUB_ID.match(e["source"])
        if m:
            out[m.group(1)] = e["name"]
    return out


def _get(kind: str, cls, name: str):
    table = _load(kind)
    key = str(name).strip().lower()
    if kind == "models" and key not in table:
        key = {h.lower(): n.lower() for h, n in model_hub_ids().items()}.get(key, key)
    if key not in table:
        raise KeyError(f"unknown {kind[:-1]} {name!r}; known: {', '.join(sorted(e['name'] for e in table.values()))}")
    return cls.model_validate(table[key])


def model(name: str) -> Architecture:
    """A released model's architecture by catalog name (e.g. ``"llama-2-7b"``) or by the hub id of a catalog entry
    (``"meta-llama/Llama-2-7b-hf"``, :func:`model_hub_ids`). Raises KeyError naming the known names."""
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
