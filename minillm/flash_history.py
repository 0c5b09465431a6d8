"""Chapter 6: FlashAttention's versions, and which one to deploy where.

Every version computes the same exact attention (tiling + online softmax); each
rewrote the *schedule* for a GPU generation.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlashVersion:
    name: str
    year: int
    target: str
    changed: str
    backward: bool  # has a backward pass (usable for training)


VERSIONS = [
    FlashVersion("FlashAttention-1", 2022, "A100 (Ampere)",
                 "first fused, tiled, IO-aware attention: S and P never reach HBM; parallel over batch x heads", True),
    FlashVersion("FlashAttention-2", 2023, "A100 / general",
                 "parallelizes over query blocks too, loops K/V inside (better occupancy, causal balance), "
                 "fewer non-matmul FLOPs, work split between warps without shared-memory round trips", True),
    FlashVersion("FlashAttention-3", 2024, "H100 / H200 (Hopper)",
                 "warp specialization (producer warps issue TMA copies, consumer warps run wgmma), "
                 "softmax overlapped with the matmuls, FP8 with per-block scaling", True),
    FlashVersion("FlashAttention-4", 2026, "B200 / GB200 (Blackwell)",
                 "a five-stage copy/compute pipeline over Blackwell's tensor memory, and a software exp2 "
                 "(polynomial) next to the hardware one; forward only at launch", False),
]

_BLACKWELL = {"B200", "GB200", "B100"}
_HOPPER = {"H100", "H100 SXM", "H100 PCIe", "H200", "GH200"}
_AMPERE_ADA = {"A100", "A100 40GB", "A100 80GB", "A10", "A6000", "L4", "L40", "L40S", "RTX 4090", "RTX 3090"}


def pick_flash(gpu: str, training: bool) -> str:
    """The FlashAttention generation to deploy on ``gpu`` (forward-only inference or training)."""
    if not isinstance(gpu, str) or not gpu.strip():
        raise ValueError(f"gpu must be a non-empty name, got {gpu!r}")
    name = gpu.strip()
    if name in _BLACKWELL:
        return "FlashAttention-3" if training else "FlashAttention-4"  # FA4 launched without a backward
    if name in _HOPPER:
        return "FlashAttention-3"
    if name in _AMPERE_ADA:
        return "FlashAttention-2"
    return "FlashAttention-2 (safe default)"
