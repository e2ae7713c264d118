"""GPU memory a training process holds outside its tensors: CUDA context, cuBLAS workspace, NCCL buffers, and the
caching allocator's reserved-but-unallocated slack. Each constant names its source and the exact quoted text.

Units: bytes (``GIB`` = 2**30), fractions are unitless. Nothing here imports torch.

What is *not* here, for want of a source with a default: a cuDNN / attention workspace (cuDNN and
flash-attention workspaces are per-call allocations through the caching allocator, transient, so they belong to
the step's peak rather than to a fixed runtime part), and NVLink-SHARP (NVLS) / tree / all-to-all NCCL buffers.

Which existing constant these replace (zeroplanner/specs.py ``Assumptions``, priced in
``costmodel.memory.overhead_parts``): ``cuda_context_bytes`` (0.75 GiB, "CUDA context + cuBLAS/NCCL workspaces")
is the sum of the first three parts of :func:`gpu_runtime_parts`; ``allocator_fragmentation_fraction`` (0.05) is
:data:`ALLOCATOR_SLACK_FRACTION_MEDIAN` (a different number: see its docstring).
"""

from __future__ import annotations

import statistics

__all__ = [
    "ALLOCATOR_SLACK_FRACTION_MAX", "ALLOCATOR_SLACK_FRACTION_MEDIAN", "ALLOCATOR_SLACK_FRACTION_MIN",
    "ALLOCATOR_SLACK_SAMPLES", "CUBLAS_WORKSPACE_BYTES_DEFAULT", "CUBLAS_WORKSPACE_BYTES_HOPPER",
    "CUBLAS_WORKSPACES", "CUDA_CONTEXT_BYTES_EAGER", "CUDA_CONTEXT_BYTES_LAZY", "GPU_ARCH",
    "HIPBLAS_WORKSPACE_BYTES_GFX94",
    "NCCL_BYTES_PER_CHANNEL_PER_PEER", "NCCL_LL128_BUFFSIZE_BYTES", "NCCL_LL_BUFFSIZE_BYTES", "NCCL_MAXCHANNELS",
    "NCCL_RING_PEERS", "NCCL_SIMPLE_BUFFSIZE_BYTES", "TORCH_VERSIONS", "gpu_runtime_parts",
]

# ---------------------------------------------------------------------------------------------------------------
# GPU generation of each catalog GPU (zeroplanner/catalog/gpus.json names)
# ---------------------------------------------------------------------------------------------------------------
_CC_URL = "https://developer.nvidia.com/cuda-gpus"
GPU_ARCH: dict[str, tuple[str, str]] = {
    "V100-16GB": ("sm70", "NVIDIA, Legacy CUDA GPU Compute Capability (https://developer.nvidia.com/cuda-legacy-gpus):"
                          " '7.0 | NVIDIA V100'"),
    "V100-32GB": ("sm70", "NVIDIA, Legacy CUDA GPU Compute Capability (https://developer.nvidia.com/cuda-legacy-gpus):"
                          " '7.0 | NVIDIA V100'"),
    "A10": ("sm86", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): '8.6 | NVIDIA A40 NVIDIA A10'"),
    "RTX-3090": ("sm86", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): row 8.6 lists 'GeForce RTX 3090'"),
    "RTX-4090": ("sm89", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): row 8.9 lists 'GeForce RTX 4090'"),
    "L40S": ("sm89", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): '8.9 | NVIDIA L4 NVIDIA L40 NVIDIA L40S'"),
    "A100-40GB": ("sm80", "NVIDIA developer forum, 'Minimum required CUDA version by GPU' "
                          "(https://forums.developer.nvidia.com/t/minimum-required-cuda-version-by-gpu/276955/2): "
                          "'A100 - 8.0'"),
    "A100-80GB": ("sm80", "NVIDIA developer forum, 'Minimum required CUDA version by GPU' "
                          "(https://forums.developer.nvidia.com/t/minimum-required-cuda-version-by-gpu/276955/2): "
                          "'A100 - 8.0'"),
    "A800-80GB": ("sm80", "not in NVIDIA's table: the A800 is the A100 variant for China, assumed sm80 like the A100"),
    "H100-80GB": ("sm90", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): '9.0 | NVIDIA GH200 NVIDIA H200 "
                          "NVIDIA H100'"),
    "H200": ("sm90", f"NVIDIA, CUDA GPU Compute Capability ({_CC_URL}): '9.0 | NVIDIA GH200 NVIDIA H200 NVIDIA H100'"),
    "MI300X": ("gfx94", "AMD ROCm: the MI300X is gfx942 (AMD's ROCm hardware tables; not re-read for this module)"),
}
"""Catalog GPU name -> (architecture key, source of that key). Keys: sm70, sm80, sm86, sm89, sm90 (NVIDIA compute
capability), gfx94 (AMD CDNA3)."""

TORCH_VERSIONS = ("2.x", "1.12")
"""torch_version values :func:`gpu_runtime_parts` accepts: "2.x" (CUDA lazy module loading on by default, since
PyTorch 1.13) and "1.12" (eager module loading, the default before it)."""

# ---------------------------------------------------------------------------------------------------------------
# CUDA context
# ---------------------------------------------------------------------------------------------------------------
CUDA_CONTEXT_BYTES_LAZY = 287_047_680
"""GPU bytes used after the first CUDA tensor with lazy module loading (PyTorch >= 1.13 default). Source:
pytorch/pytorch#86509, "[1.13] Sets CUDA_MODULE_LOADING to LAZY when not set by the user"
(https://github.com/pytorch/pytorch/pull/86509): ``tensor=torch.randn(20, 16, 50, 100).cuda(); free, total =
torch.cuda.cudart().cudaMemGetInfo(0); print(total-free)`` "shows a memory usage of: 287,047,680 bytes". GPU not
stated there, and the figure includes the 6.4 MB test tensor's allocator segment (an upper bound on the bare
context). Independent: ptrblck (NVIDIA) in pytorch/pytorch#109888: "The first CUDA operation will create the CUDA
context which uses around 400MB if CUDA >= 11.7 is used and lazy module loading enabled (default in PyTorch)";
ptrblck in pytorch/pytorch#107667: "the currently used ~300MB are small compared to previous releases". No source
found that gives A100- or H100-specific figures: the same value is used for every GPU. The context grows as kernels
(NCCL, cuDNN, flash-attention) are loaded lazily during training; that growth is not sourced."""

CUDA_CONTEXT_BYTES_EAGER = 666_632_192
"""The same measurement with ``CUDA_MODULE_LOADING="DEFAULT"`` (eager loading, PyTorch < 1.13): "which shows
666,632,192 bytes" (pytorch/pytorch#86509). ptrblck, pytorch/pytorch#107667: "Before CUDA 11.7, *all* kernels
were loaded into the context once the library was loaded, which took >1000MB"."""

# ---------------------------------------------------------------------------------------------------------------
# cuBLAS workspace
# ---------------------------------------------------------------------------------------------------------------
_CUBLAS_SRC = ("PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize() "
               "(https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/cuda/CublasHandlePool.cpp): "
               "'/* :4096:2:16:8 default, 32MiB for Hopper */ ... const size_t default_size = sm90 ? 4096 * 8 * 1024 : "
               "4096 * 1024 * 2 + 16 * 1024 * 8;' (newer revisions: '32MiB for Hopper and Blackwell', major 9, 10 "
               "or 12); allocated from the caching allocator once per (handle or device, stream) by "
               "setWorkspaceForHandle / setCublasWorkspace; the cuBLASLt workspace is unified with it by default "
               "(TORCH_CUBLASLT_UNIFIED_WORKSPACE unset -> unified). CUBLAS_WORKSPACE_CONFIG=:SIZE:COUNT (KiB) "
               "overrides it: total_size += curr_size * 1024 * count")
CUBLAS_WORKSPACE_BYTES_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
"""8,519,680 bytes (:4096:2:16:8) per cuBLAS workspace on pre-Hopper NVIDIA GPUs. Source: ``_CUBLAS_SRC``."""
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 8 * 1024
"""33,554,432 bytes (32 MiB) per cuBLAS workspace on sm90 (H100, H200). Source: ``_CUBLAS_SRC``."""
HIPBLAS_WORKSPACE_BYTES_GFX94 = 1024 * 128 * 1024
"""134,217,728 bytes (128 MiB) on ROCm gfx94x/gfx95x: '/* 32MiB default, 128MiB for gfx94x/gfx95x */ ... const
size_t default_size = gfx94_95 ? 1024 * 128 * 1024 : 1024 * 32 * 1024;' (same file, USE_ROCM branch)."""
CUBLAS_WORKSPACES = 1
"""Workspaces counted: one, for the default compute stream. Each further stream that runs matmuls adds one (in
the revisions that key the map by (handle, stream), the autograd thread's own handle adds one too); the count a
DeepSpeed step reaches is not sourced."""

# ---------------------------------------------------------------------------------------------------------------
# NCCL
# ---------------------------------------------------------------------------------------------------------------
_NCCL_SRC = ("NVIDIA/nccl src/init.cc: '#define DEFAULT_LL_BUFFSIZE (NCCL_LL_LINES_PER_THREAD*NCCL_LL_MAX_NTHREADS*"
             "NCCL_STEPS*sizeof(union ncclLLFifoLine))', '#define DEFAULT_LL128_BUFFSIZE (NCCL_LL128_ELEMS_PER_THREAD*"
             "NCCL_LL128_MAX_NTHREADS*NCCL_STEPS*sizeof(uint64_t))', '#define DEFAULT_BUFFSIZE (1 << 22) /* 4MiB */' "
             "(NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE, NCCL_BUFFSIZE override them); with src/include/device.h "
             "NCCL_LL_LINES_PER_THREAD 8, NCCL_LL_MAX_NTHREADS 512, NCCL_STEPS 8, 16-byte ncclLLFifoLine -> 8 x 512 x "
             "8 x 16 B = 524,288 B; NCCL_LL128_ELEMS_PER_THREAD 120, NCCL_LL128_MAX_NTHREADS 640 -> 120 x 640 x 8 x "
             "8 B = 4,915,200 B")
NCCL_LL_BUFFSIZE_BYTES = 524_288
"""LL protocol buffer per channel per connection. Source: ``_NCCL_SRC``."""
NCCL_LL128_BUFFSIZE_BYTES = 4_915_200
"""LL128 protocol buffer per channel per connection. Source: ``_NCCL_SRC``."""
NCCL_SIMPLE_BUFFSIZE_BYTES = 1 << 22
"""Simple protocol buffer (NCCL_BUFFSIZE, 4 MiB; 1 MiB on ARM CPUs: '#define DEFAULT_BUFFSIZE_ARM (1 << 20)').
Source: ``_NCCL_SRC``."""
NCCL_BYTES_PER_CHANNEL_PER_PEER = NCCL_LL_BUFFSIZE_BYTES + NCCL_LL128_BUFFSIZE_BYTES + NCCL_SIMPLE_BUFFSIZE_BYTES
"""9,633,792 bytes: the three protocols' buffers of one connection on one channel."""
NCCL_MAXCHANNELS = 32
"""Channel cap: NVIDIA/nccl src/include/device.h '#define MAXCHANNELS 32' (the revision read; later NCCL releases
may raise it). The channel count NCCL actually opens depends on the topology (NVLink/NVSwitch count, NICs) and
NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS; no documented default exists, so the cap is used: an upper bound."""
NCCL_RING_PEERS = 2
"""Ring connections per rank per channel (previous and next rank). Counting both sides' buffers is an upper bound:
the P2P transport places most of a connection's buffers on one of the two GPUs."""

# ---------------------------------------------------------------------------------------------------------------
# Caching allocator: reserved but not allocated
# ---------------------------------------------------------------------------------------------------------------
ALLOCATOR_SLACK_SAMPLES: tuple[tuple[str, float, str], ...] = (
    ("DeepSpeed#522, first configuration of the comment (see_memory_usage)", 6.39 / 5.09 - 1,
     "deepspeedai/DeepSpeed#522 (https://github.com/deepspeedai/DeepSpeed/issues/522): "
     "'MA 4.96 GB         Max_MA 5.09 GB         CA 6.39 GB         Max_CA 6 GB'"),
    ("DeepSpeed#522, same run, before the optimizer step (see_memory_usage)", 6.39 / 5.55 - 1,
     "deepspeedai/DeepSpeed#522: 'before optimizer 1' ... 'MA 4.89 GB         Max_MA 5.55 GB         CA 6.39 GB'"),
    ("DeepSpeed#522, 'stage2 cpu_offload, gradient_checkpointing' run, before backward (see_memory_usage)",
     6.68 / 5.31 - 1,
     "deepspeedai/DeepSpeed#522: 'before backward 1' ... 'MA 5.19 GB         Max_MA 5.31 GB         CA 6.68 GB'"),
    ("DeepSpeed engine init (dolly), after fp32 partitions (see_memory_usage)", 35.85 / 32.1 - 1,
     "databrickslabs/dolly#28 (https://github.com/databrickslabs/dolly/issues/28): 'After creating fp32 partitions' "
     "... 'MA 31.16 GB         Max_MA 32.1 GB         CA 35.85 GB         Max_CA 36 GB'"),
    ("ORTModule training step 5 (PyTorch caching allocator)", 9382 / 9039 - 1,
     "microsoft/onnxruntime#19620 (https://github.com/microsoft/onnxruntime/pull/19620): 'rank-0 step 5 memory (MiB) "
     "| phase: post_forward | allocated: 8162 | max allocated: 9039 | cached: 9382 | max cached: 9382'"),
    ("CUDA OOM message inside DeepSpeed stage2.py, 15.78 GiB GPU", 12.97 / 12.80 - 1,
     "huggingface/transformers#10011 (https://github.com/huggingface/transformers/issues/10011): '12.80 GiB already "
     "allocated; 1.63 GiB free; 12.97 GiB reserved in total by PyTorch'"),
    ("CUDA OOM message, DeepSpeed-Chat step 1 (OPT-1.3B), 14.56 GiB GPU", 13.65 / 13.30 - 1,
     "deepspeedai/DeepSpeed#3208 (https://github.com/deepspeedai/DeepSpeed/issues/3208): '13.30 GiB already "
     "allocated; 230.50 MiB free; 13.65 GiB reserved in total by PyTorch'"),
)
"""(what, reserved / peak allocated - 1, source with the printed line). DeepSpeed's see_memory_usage prints MA =
memory_allocated, Max_MA = max_memory_allocated, CA = memory_reserved, each divided by 2**30 and labelled "GB";
the ratio takes the current reserved (CA) over the peak allocated so far (Max_MA): the allocator does not return
reserved memory unless emptied, so CA bounds the peak reserved from below. The two OOM messages are biased low: the
allocator frees its cached blocks and retries before raising."""
ALLOCATOR_SLACK_FRACTION_MEDIAN = statistics.median(v for _, v, _ in ALLOCATOR_SLACK_SAMPLES)
"""Median of :data:`ALLOCATOR_SLACK_SAMPLES`: 0.1168 (dolly#28's 35.85 / 32.1 - 1). Reserved-but-unallocated bytes
as a fraction of the peak allocated bytes; apply it to the step's peak allocated, not to every term."""
ALLOCATOR_SLACK_FRACTION_MIN = min(v for _, v, _ in ALLOCATOR_SLACK_SAMPLES)
"""Smallest sample: 0.0133 (transformers#10011's OOM message)."""
ALLOCATOR_SLACK_FRACTION_MAX = max(v for _, v, _ in ALLOCATOR_SLACK_SAMPLES)
"""Largest sample: 0.2580 (DeepSpeed#522, before backward)."""


def gpu_runtime_parts(gpu_name: str, *, world_size: int, nodes: int,
                      torch_version: str = "2.x") -> list[tuple[str, float, str]]:
    """The per-GPU runtime parts one training process holds outside its tensors: ``(label, bytes, source)`` for
    the CUDA context, the cuBLAS (hipBLAS) workspace and the NCCL buffers of one communicator.

    ``gpu_name`` is a catalog GPU name (:data:`GPU_ARCH`); ``world_size`` the ranks in the communicator (1: no NCCL
    buffers); ``nodes`` the nodes they span (recorded in the NCCL label: inter-node rings use the network
    transport, whose buffers may live in host memory without GPUDirect RDMA; not subtracted here);
    ``torch_version`` one of :data:`TORCH_VERSIONS`. The caching allocator's slack is a fraction, not bytes:
    :data:`ALLOCATOR_SLACK_FRACTION_MEDIAN`.

    Raises ValueError naming the field and the allowed values.

    >>> [(label.split(" (")[0], int(b)) for label, b, _ in gpu_runtime_parts("H100-80GB", world_size=8, nodes=1)]
    [('CUDA context', 287047680), ('cuBLAS workspace', 33554432), ('NCCL buffers', 616562688)]
    """
    if gpu_name not in GPU_ARCH:
        raise ValueError(f"gpu_name={gpu_name!r} is not a catalog GPU; allowed: {', '.join(GPU_ARCH)}")
    if torch_version not in TORCH_VERSIONS:
        raise ValueError(f"torch_version={torch_version!r}; allowed: {', '.join(TORCH_VERSIONS)}")
    for field, value in (("world_size", world_size), ("nodes", nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: must be an integer >= 1")
    if nodes > world_size:
        raise ValueError(f"nodes={nodes} exceeds world_size={world_size}")
    arch, arch_source = GPU_ARCH[gpu_name]

    lazy = torch_version != "1.12"
    context = CUDA_CONTEXT_BYTES_LAZY if lazy else CUDA_CONTEXT_BYTES_EAGER
    parts = [(f"CUDA context ({'lazy' if lazy else 'eager'} module loading; one measurement, GPU not stated, used "
              "for every GPU)", float(context),
              "pytorch/pytorch#86509 (https://github.com/pytorch/pytorch/pull/86509): " +
              ("'which shows a memory usage of: 287,047,680 bytes' (lazy)" if lazy else
               "'which shows 666,632,192 bytes' (CUDA_MODULE_LOADING=DEFAULT)"))]

    if arch == "gfx94":
        ws, ws_label = HIPBLAS_WORKSPACE_BYTES_GFX94, "hipBLAS workspace (gfx94x default, 128 MiB)"
    elif arch == "sm90":
        ws, ws_label = CUBLAS_WORKSPACE_BYTES_HOPPER, "cuBLAS workspace (Hopper default, 32 MiB)"
    else:
        ws, ws_label = CUBLAS_WORKSPACE_BYTES_DEFAULT, "cuBLAS workspace (default :4096:2:16:8)"
    parts.append((f"{ws_label} x {CUBLAS_WORKSPACES} stream; CUBLAS_WORKSPACE_CONFIG unset",
                  float(ws * CUBLAS_WORKSPACES),
                  f"{_CUBLAS_SRC}; {gpu_name} is {arch}: {arch_source}"))

    peers = NCCL_RING_PEERS if world_size > 1 else 0
    nccl = NCCL_MAXCHANNELS * peers * NCCL_BYTES_PER_CHANNEL_PER_PEER
    where = "intra-node" if nodes == 1 else f"{nodes} nodes (network transport for the inter-node hops)"
    parts.append((f"NCCL buffers (ring, {where}; channel count unknown: cap {NCCL_MAXCHANNELS} channels x {peers} "
                  "peers x (LL + LL128 + Simple), upper bound; tree/NVLS/all-to-all not counted; RCCL on ROCm "
                  "assumed equal)", float(nccl),
                  f"{_NCCL_SRC}; channels: NVIDIA/nccl src/include/device.h '#define MAXCHANNELS 32'"))
    return parts


def scenario_runtime_parts(gpu_name: str, *, world_size: int, nodes: int,
                           context_bytes: float) -> list[tuple[str, float, str]]:
    """:func:`gpu_runtime_parts` for a scenario: ``context_bytes`` (``Assumptions.cuda_context_bytes``) in place of
    the context measurement, and for a GPU outside :data:`GPU_ARCH` (a custom memory size) the default cuBLAS
    workspace (the pre-Hopper one). Returns (label, bytes, source) per part."""
    name = gpu_name if gpu_name in GPU_ARCH else "A100-80GB"
    parts = gpu_runtime_parts(name, world_size=max(1, world_size), nodes=max(1, min(nodes, world_size)))
    label, _, source = parts[0]
    if context_bytes != CUDA_CONTEXT_BYTES_LAZY:
        label, source = "CUDA context (Assumptions.cuda_context_bytes, as given)", "the user's input"
    out = [(label, float(context_bytes), source)] + parts[1:]
    if gpu_name not in GPU_ARCH:
        out[1] = (out[1][0] + f"; {gpu_name} is not in the catalog: the default workspace", out[1][1], out[1][2])
    return out
