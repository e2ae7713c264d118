"""Byte sizes, unit conversions and named constants.

Everything inside zeroplanner is in bytes, seconds, FLOPs and bytes/second; conversions to GiB, Gbit/s or TFLOP/s
happen only at the edges (CLI text, app labels). "GiB" is 2**30 bytes. Network catalog values are given in Gbit/s
(link rate, as vendors quote them) and converted here.
"""

from __future__ import annotations

GIB = 2**30
"""Bytes in one GiB (IEC). DeepSpeed prints "GB" but divides by 2**30 (deepspeed/runtime/zero/stage3.py)."""
GB = 10**9
"""Bytes in one GB (SI). The ZeRO paper's Table 1 uses this unit (arXiv 1910.02054)."""
TERA = 10**12

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "int8": 1.0,
    # bitsandbytes NF4 with double quantization: 4 bits + 0.127 bits/param of quantization constants
    # (Dettmers et al., QLoRA, arXiv 2305.14314, Sec. 3 "Double Quantization").
    "nf4": (4 + 0.127) / 8,
}
"""Bytes per element for each storage dtype."""


def gib(num_bytes: float) -> float:
    """Bytes -> GiB (2**30)."""
    return float(num_bytes) / GIB


def gbps_to_bytes_per_second(gbps: float) -> float:
    """Gbit/s (link rate, 10**9 bits/s) -> bytes/s."""
    return float(gbps) * 1e9 / 8.0


def bytes_per_second_to_gbps(bytes_per_second: float) -> float:
    """bytes/s -> Gbit/s."""
    return float(bytes_per_second) * 8.0 / 1e9
