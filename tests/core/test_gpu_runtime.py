"""GPU-only runtime parts (zeroplanner.costmodel.gpu_runtime): each equals its sourced constant."""

from __future__ import annotations

import pytest

from zeroplanner import catalog
from zeroplanner.costmodel import gpu_runtime as g


def _bytes(parts):
    return {label.split(" (")[0]: int(b) for label, b, _ in parts}


def test_every_catalog_gpu_has_an_architecture():
    assert set(g.GPU_ARCH) == set(catalog.gpu_names())


def test_a100_one_node_of_eight():
    got = _bytes(g.gpu_runtime_parts("A100-80GB", world_size=8, nodes=1))
    assert got == {
        # pytorch/pytorch#86509: lazy module loading "shows a memory usage of: 287,047,680 bytes"
        "CUDA context": 287_047_680,
        # aten/src/ATen/cuda/CublasHandlePool.cpp: pre-Hopper default ":4096:2:16:8" = 4096*1024*2 + 16*1024*8
        "cuBLAS workspace": 8_519_680,
        # NCCL src/init.cc DEFAULT_LL_BUFFSIZE 524,288 + DEFAULT_LL128_BUFFSIZE 4,915,200 + DEFAULT_BUFFSIZE 1<<22,
        # x MAXCHANNELS 32 (src/include/device.h) x 2 ring peers
        "NCCL buffers": 32 * 2 * (524_288 + 4_915_200 + 4_194_304),
    }


def test_h100_two_nodes():
    got = _bytes(g.gpu_runtime_parts("H100-80GB", world_size=16, nodes=2))
    assert got["CUDA context"] == 287_047_680  # pytorch/pytorch#86509
    # CublasHandlePool.cpp: "32MiB for Hopper": sm90 ? 4096 * 8 * 1024
    assert got["cuBLAS workspace"] == 33_554_432
    assert got["NCCL buffers"] == 616_562_688  # 32 channels x 2 peers x 9,633,792 B (NCCL src/init.cc)


def test_single_rank_has_no_nccl_buffers_and_eager_loading_is_larger():
    got = _bytes(g.gpu_runtime_parts("H200", world_size=1, nodes=1, torch_version="1.12"))
    assert got["NCCL buffers"] == 0
    assert got["CUDA context"] == 666_632_192  # pytorch/pytorch#86509, CUDA_MODULE_LOADING=DEFAULT


def test_mi300x_uses_the_rocm_workspace():
    got = _bytes(g.gpu_runtime_parts("MI300X", world_size=8, nodes=1))
    assert got["hipBLAS workspace"] == 128 * 1024 * 1024  # CublasHandlePool.cpp: "128MiB for gfx94x/gfx95x"


def test_every_part_names_a_source():
    for name in catalog.gpu_names():
        for label, value, source in g.gpu_runtime_parts(name, world_size=8, nodes=1):
            assert label and source and value >= 0


def test_allocator_slack_is_the_median_of_its_samples():
    values = sorted(v for _, v, _ in g.ALLOCATOR_SLACK_SAMPLES)
    assert len(values) >= 5
    assert g.ALLOCATOR_SLACK_FRACTION_MEDIAN == pytest.approx(35.85 / 32.1 - 1)  # dolly#28, the middle sample
    assert g.ALLOCATOR_SLACK_FRACTION_MIN == pytest.approx(12.97 / 12.80 - 1) == values[0]  # transformers#10011
    assert g.ALLOCATOR_SLACK_FRACTION_MAX == pytest.approx(6.68 / 5.31 - 1) == values[-1]  # DeepSpeed#522


def test_unknown_gpu_names_the_field_and_allowed_values():
    with pytest.raises(ValueError) as err:
        g.gpu_runtime_parts("B200", world_size=8, nodes=1)
    assert "gpu_name" in str(err.value) and "B200" in str(err.value)
    assert all(name in str(err.value) for name in catalog.gpu_names())


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"world_size": 0, "nodes": 1}, "world_size"),
    ({"world_size": 8, "nodes": 0}, "nodes"),
    ({"world_size": 8, "nodes": 1, "torch_version": "3.0"}, "torch_version"),
])
def test_bad_inputs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        g.gpu_runtime_parts("A100-80GB", **kwargs)
