"""Chapter 6: FlashAttention's versions, and which one to deploy where.

Every version computes the same exact attention (tiling + online softmax); each
rewrote the *schedule* for a GPU generation. Which GPUs each version supports is
taken from the flash-attention repository's README:

* FlashAttention-1: "Turing or Ampere" GPUs (sm75, sm80, sm86);
* FlashAttention-2: "Ampere, Ada, or Hopper GPUs" (sm80, sm86, sm89, sm90);
* FlashAttention-3: "optimized for Hopper GPUs (e.g. H100)" (sm90);
* FlashAttention-4: "optimized for Hopper and Blackwell GPUs (e.g. H100, B200)" (sm90, sm100); its first
  release (June 2025) was a Blackwell forward kernel, and the repository has had backward kernels for sm90
  and sm100 since the autumn of 2025 (``flash_attn/cute/flash_bwd_sm90.py``, ``flash_bwd_sm100.py``).

``pick_flash`` decides by compute capability, never by a GPU's marketing name alone; ``supports`` says
whether a given version runs on a GPU (in training, too), which is how a recommendation is checked.

Running on a GPU is not the same as being written for it. FlashAttention-4 runs on Hopper, but it was
written for Blackwell, and it ships only as pre-releases (``flash-attn-4`` 4.0.0b*, classified
"Development Status :: 3 - Alpha"). FlashAttention-3 is the kernel written for Hopper: its README section
is still headed "beta release", but it has shipped BF16/FP16 forward and backward for Hopper since 2024. ``pick_flash`` therefore prefers the newest version *designed for* the GPU's
architecture (``designed_for``), and falls back to the newest one that merely runs there.
"""
from __future__ import annotations

from dataclasses import dataclass

CC = tuple[int, int]  # compute capability (major, minor)


@dataclass(frozen=True)
class FlashVersion:
    name: str
    year: int
    target: str
    changed: str
    backward: bool  # has a backward pass (usable for training)
    compute_capabilities: frozenset  # the CC values the version's builds support
    designed_for: frozenset  # the CC values whose architecture the version's schedule was written for
    prerelease: bool = False  # released only as betas/alphas (a version number with a pre-release tag)


VERSIONS = [
    FlashVersion("FlashAttention-1", 2022, "Turing or Ampere (sm75, sm80, sm86)",
                 "first fused, tiled, IO-aware attention: S and P never reach HBM; parallel over batch x heads", True,
                 frozenset({(7, 5), (8, 0), (8, 6)}), frozenset({(7, 5), (8, 0), (8, 6)})),
    FlashVersion("FlashAttention-2", 2023, "Ampere, Ada or Hopper (sm80, sm86, sm89, sm90)",
                 "parallelizes over query blocks too, loops K/V inside (better occupancy, causal balance), "
                 "fewer non-matmul FLOPs, work split between warps without shared-memory round trips", True,
                 frozenset({(8, 0), (8, 6), (8, 9), (9, 0)}), frozenset({(8, 0), (8, 6), (8, 9)})),
    FlashVersion("FlashAttention-3", 2024, "Hopper only (sm90: H100, H200)",
                 "warp specialization (producer warps issue TMA copies, consumer warps run wgmma), "
                 "softmax overlapped with the matmuls, FP8 with per-block scaling", True,
                 frozenset({(9, 0)}), frozenset({(9, 0)})),
    FlashVersion("FlashAttention-4", 2026, "Hopper and Blackwell (sm90, sm100: H100, H200, B200, GB200)",
                 "written in CuTe-DSL; on Blackwell, asynchronous MMAs into tensor memory, a software exp2 "
                 "(polynomial) next to the hardware one, and softmax rescaling only when the max grows enough",
                 True, frozenset({(9, 0), (10, 0)}), frozenset({(10, 0)}), prerelease=True),
]

NO_FLASH = "no FlashAttention build; use SDPA's memory-efficient/cuDNN backend"

# Compute capability of the GPUs the chapter (and the page) name.
COMPUTE_CAPABILITY: dict[str, CC] = {
    "V100": (7, 0),
    "T4": (7, 5), "RTX 2080 Ti": (7, 5),
    "A100": (8, 0), "A100 40GB": (8, 0), "A100 80GB": (8, 0), "A30": (8, 0),
    "A10": (8, 6), "A10G": (8, 6), "A40": (8, 6), "A6000": (8, 6), "RTX 3090": (8, 6),
    "L4": (8, 9), "L40": (8, 9), "L40S": (8, 9), "RTX 4090": (8, 9),
    "H100": (9, 0), "H100 SXM": (9, 0), "H100 PCIe": (9, 0), "H200": (9, 0), "GH200": (9, 0),
    "B100": (10, 0), "B200": (10, 0), "GB200": (10, 0),
}


def compute_capability(gpu: str | CC) -> CC:
    """``gpu`` as a (major, minor) compute capability: a known name, or the tuple itself."""
    if isinstance(gpu, tuple):
        if len(gpu) != 2 or not all(isinstance(x, int) and x >= 0 for x in gpu):
            raise ValueError(f"compute capability must be (major, minor), got {gpu!r}")
        return gpu
    if not isinstance(gpu, str) or not gpu.strip():
        raise ValueError(f"gpu must be a non-empty name or a (major, minor) tuple, got {gpu!r}")
    name = gpu.strip()
    if name not in COMPUTE_CAPABILITY:
        raise ValueError(f"unknown GPU {name!r}: pass its compute capability as a (major, minor) tuple")
    return COMPUTE_CAPABILITY[name]


def supports(version: str, gpu: str | CC, training: bool) -> bool:
    """Whether FlashAttention ``version`` (a name in ``VERSIONS``) has builds for ``gpu`` (and a backward pass
    when ``training``)."""
    by_name = {v.name: v for v in VERSIONS}
    if version not in by_name:
        raise ValueError(f"unknown FlashAttention version {version!r}; known: {sorted(by_name)}")
    ver = by_name[version]
    return compute_capability(gpu) in ver.compute_capabilities and (ver.backward or not training)


def pick_flash(gpu: str | CC, training: bool) -> str:
    """The FlashAttention version to deploy on ``gpu`` (with a backward pass when ``training``): the newest
    one written for the GPU's architecture (``designed_for``), else the newest whose builds merely support
    its compute capability; ``NO_FLASH`` when none does. On Hopper that is FlashAttention-3, not the newer
    FlashAttention-4, which runs there but was written for Blackwell and is still a pre-release."""
    cc = compute_capability(gpu)
    usable = [v for v in VERSIONS if cc in v.compute_capabilities and (v.backward or not training)]
    designed = [v for v in usable if cc in v.designed_for]
    for group in (designed, usable):
        if group:
            return group[-1].name
    return NO_FLASH
