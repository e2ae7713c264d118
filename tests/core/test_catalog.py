"""The catalog: every entry validates and cites a source; lookups; the reference numbers it must reproduce."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from zeroplanner import catalog
from zeroplanner.specs import Architecture, GPUSpec, NetworkSpec

KINDS = {
    "models": (catalog.model, catalog.model_names, Architecture),
    "gpus": (catalog.gpu, catalog.gpu_names, GPUSpec),
    "networks": (catalog.network, catalog.network_names, NetworkSpec),
}

# The names other parts of zeroplanner (CLI defaults, UI presets, tests) and issue 2 rely on.
REQUIRED = {
    "models": [
        "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b",
        "llama-3.1-405b", "mistral-7b", "mixtral-8x7b", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b",
        "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bloom-176b",
        "gpt-3-175b",
    ],
    "gpus": [
        "V100-16GB", "V100-32GB", "A10", "RTX-3090", "RTX-4090", "L40S", "A100-40GB", "A100-80GB", "A800-80GB",
        "H100-80GB", "H200", "MI300X",
    ],
    "networks": [
        "eth-1g", "eth-10g", "eth-25g", "eth-100g", "roce-100g", "roce-200g", "roce-400g", "ib-hdr", "ib-hdr-8x",
        "ib-ndr", "ib-ndr-8x",
    ],
}


def _raw_entries(kind: str) -> list[dict]:
    text = resources.files("zeroplanner.catalog").joinpath(f"{kind}.json").read_text(encoding="utf-8")
    return json.loads(text)["entries"]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_entry_validates_and_cites_a_source(kind):
    lookup, names, cls = KINDS[kind]
    entries = _raw_entries(kind)
    assert entries
    for raw in entries:
        obj = lookup(raw["name"])
        assert isinstance(obj, cls)
        assert obj.source.strip(), raw["name"]
        # extra="forbid" in specs: a misspelt key in the JSON fails validation instead of being ignored
        assert set(raw) <= set(cls.model_fields), raw["name"]
    assert sorted(names()) == sorted(e["name"] for e in entries)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_names_are_unique_ignoring_case(kind):
    lowered = [e["name"].lower() for e in _raw_entries(kind)]
    assert len(lowered) == len(set(lowered))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_required_names_present(kind):
    _, names, _ = KINDS[kind]
    assert set(REQUIRED[kind]) <= set(names())


# docs/references.md section 3: exact parameter counts of the released models.
@pytest.mark.parametrize(
    "name,count",
    [("llama-2-7b", 6_738_415_616), ("qwen2.5-7b", 7_615_616_512), ("gpt2", 124_439_808),
     ("gpt2-medium", 354_823_168)],
)
def test_reference_parameter_counts(name, count):
    assert catalog.model(name).parameter_count == count


def test_gpt3_shapes_follow_the_paper():
    # Brown et al., arXiv 2005.14165, Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048; ~175B parameters
    m = catalog.model("gpt-3-175b")
    assert (m.n_layers, m.hidden_size, m.n_heads, m.dim_head, m.learned_position_embeddings) == (96, 12288, 96, 128,
                                                                                               2048)
    assert 174e9 < m.parameter_count < 176e9


def test_mixtral_counts_every_expert():
    m = catalog.model("mixtral-8x7b")
    dense_equivalent = m.model_copy(update={"n_experts": 1, "experts_per_token": 1, "fused_experts": False})
    assert m.parameter_count - dense_equivalent.parameter_count == m.n_layers * (7 * m.mlp_params + m.router_params)


def test_reference_bandwidths():
    # docs/references.md section 6: A100 NVLink ~230 GB/s, H100 ~370 GB/s busbw; HDR ~24 GB/s, NDR ~46-48 GB/s per NIC
    assert catalog.gpu("A100-80GB").intra_node_busbw_gb_per_s == 230
    assert catalog.gpu("H100-80GB").intra_node_busbw_gb_per_s == 370
    assert catalog.network("ib-hdr").node_busbw_bytes_per_second == pytest.approx(24e9, rel=0.01)
    assert 46e9 <= catalog.network("ib-ndr").node_busbw_bytes_per_second <= 48e9
    eight = catalog.network("ib-ndr-8x")
    assert eight.node_busbw_bytes_per_second == pytest.approx(8 * catalog.network("ib-ndr").node_busbw_bytes_per_second)


def test_lookups_are_case_insensitive_and_trim_spaces():
    assert catalog.model("LLAMA-2-7B") == catalog.model("llama-2-7b")
    assert catalog.gpu("a100-80gb") == catalog.gpu("A100-80GB")
    assert catalog.network(" IB-NDR ") == catalog.network("ib-ndr")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_unknown_name_raises_key_error_listing_known_names(kind):
    lookup, names, _ = KINDS[kind]
    with pytest.raises(KeyError) as info:
        lookup("no-such-entry")
    message = str(info.value)
    assert "no-such-entry" in message
    for name in names():
        assert name in message
