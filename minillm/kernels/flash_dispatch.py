"""Which flash-attention kernel runs, on which tiles: the measured defaults as tables and rules.

Everything here is a pure function of the call's shapes, dtype and a :class:`FlashConfig` (the defaults, or a
caller's overrides, passed in explicitly): it launches nothing, so a test can compare the plans for any shape on
a machine without a GPU. The measurements behind each rule (H200, bf16, B=4, H=32 unless said) are in the
archive tag ``archive/kernel-experiments`` with their results files; the comments name them.

Forward versions kept (the names the results files use):

* ``v1``: pointer loads (the teaching kernel, ``flash_attention._fwd_kernel``): fp32, D > 128, the interpreter,
  and every shape no rule below takes;
* ``v2``: TMA tensor descriptors (``flash_hopper``): D <= 64 non-causal past 1K keys (descriptors built in the
  kernel), and D = 128 causal from ``host_desc_min_n`` (descriptors made on the host, the causal diagonal masked
  behind a branch inside the one key loop);
* ``v5``: v2 with a persistent grid and warp specialization: D = 128 non-causal, lengths multiples of 128;
* ``v6``: causal v2 warp-specialized in two launches (unmasked tiles, then the diagonal resumed from the partial
  O and LSE): D = 128 causal from ``split_min_n`` queries and keys (multiples of 128).

Backward versions kept: ``v2`` (pointer loads, one launch), ``v3`` (TMA, one launch), ``v4`` (TMA, the dK/dV and
dQ sides in two launches, each compiled alone).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import INTERPRETED
from .common import cdiv

FWD_VERSIONS = ("v1", "v2", "v5", "v6")
BWD_VERSIONS = ("v2", "v3", "v4")
WARP_SPECIALIZED = ("v5", "v6")


@dataclass(frozen=True)
class FlashConfig:
    """How flash attention picks its kernels. The defaults are the measured ones; a field overrides one decision.

    fwd / bwd: force a version (FWD_VERSIONS / BWD_VERSIONS) instead of the rules; fwd_tiles = (BLOCK_M, BLOCK_N,
    num_warps, num_stages), bwd_tiles = (M1, N1, M2, N2, num_warps, num_stages[, dQ warps, dQ stages]) replace the
    tables (and an explicit tile's errors propagate: no fallback). host_descriptors: True / False forces where v2
    makes its descriptors (None: on the host where ``host_descriptors_pay``).

    host_desc_min_n: from this many queries and keys the causal D=128 forward runs v2 with host descriptors (1K and
    2K: 5.2-6.8% ahead of v1, flash_attention_tune_oneloop_h200.json, _tune_hostdesc_short_e1/_e2_; the training
    step 1.1-3.2% faster, flash_attention_step_study*_h200.json; rechecked on an H100 with Triton's public launcher
    encoding the descriptors each call: v1 took 1.00-1.11x and v2 with in-kernel descriptors 1.04-1.29x its time,
    benchmarks/README.md). host_desc_small_tiles_below: below this many
    keys those calls take 64 x 64 tiles, 128 x 128 from it (flash_attention_diag_branch128_h200.json).
    causal_group_programs: the causal order takes heads in groups of about this many programs (two waves of two
    programs per SM on 132 SMs). split_min_n: v6 from this many queries and keys (v2 with the diagonal branch ran
    4.0-4.4% faster at 16K, flash_attention_diag_branch16k_h200.json; at 32K v6 ran 1.4% faster than the rule
    without it, H100 2026-12-07, CUDA-graph medians of 3, so v6 stays).
    resume_tiles: v6's second launch (flash_attention_split_study_h200.json). split_partial_fp32: v6's partial O
    in float32 (in bf16 it broke the tolerance rule at 1024 x 3072, kernel_tests_kernels22.txt).
    """
    fwd: str | None = None
    fwd_tiles: tuple | None = None
    bwd: str | None = None
    bwd_tiles: tuple | None = None
    host_descriptors: bool | None = None
    host_desc_min_n: int = 1024
    host_desc_small_tiles_below: int = 2048
    causal_group_programs: int = 512
    split_min_n: int = 32768
    resume_tiles: tuple = (64, 64, 4, 2)
    split_partial_fp32: bool = True

    def __post_init__(self):
        if self.fwd is not None and self.fwd not in FWD_VERSIONS:
            raise ValueError(f"unknown forward version {self.fwd!r}; choose one of {FWD_VERSIONS}")
        if self.bwd is not None and self.bwd not in BWD_VERSIONS:
            raise ValueError(f"unknown backward version {self.bwd!r}; choose one of {BWD_VERSIONS}")


DEFAULT = FlashConfig()


@dataclass(frozen=True)
class FwdPlan:
    """What one forward call runs. tiles = (BLOCK_M, BLOCK_N, num_warps, num_stages); grid of the (first) launch;
    group_heads: heads per group of the causal order (1 when not causal); resume: v6's second launch's tiles."""
    version: str
    tiles: tuple
    grid: tuple
    group_heads: int = 1
    host_descriptors: bool = False
    diag_branch: bool = False
    resume: tuple | None = None

    @property
    def tma(self) -> bool:
        return self.version != "v1"

    @property
    def warp_specialized(self) -> bool:
        return self.version in WARP_SPECIALIZED

    @property
    def persistent(self) -> bool:
        return self.version == "v5"

    @property
    def split(self) -> bool:
        return self.version == "v6"


@dataclass(frozen=True)
class BwdPlan:
    """What one backward call runs: version, tiles (see FlashConfig.bwd_tiles), the preprocess launch's query
    tile, and the grids (preprocess, then the main launch or the dK/dV and dQ launches)."""
    version: str
    tiles: tuple
    pre_block_m: int
    grids: tuple

    @property
    def tma(self) -> bool:
        return self.version in ("v3", "v4")

    @property
    def split(self) -> bool:
        return self.version == "v4"


def _interpreted(interpreted: bool | None) -> bool:
    return INTERPRETED if interpreted is None else interpreted


def fwd_tiles(D: int, dtype, version: str = "v1", causal: bool = False, n: int = 4096,
              config: FlashConfig = DEFAULT, interpreted: bool | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of a forward version at ``n`` keys; small tiles in the interpreter.

    From benchmarks/flash_attention_tune.py on the H200 (flash_attention_tune_h200.json): 64 x 64 up to N=1K and
    for causal D=64, where more, smaller programs fill the SMs; the TMA versions hold fewer registers and take
    128 x 128, except v2 at D=128 causal between host_desc_min_n and host_desc_small_tiles_below keys. The
    warp-specialized versions are correct only with the tiles they were checked with (128 x 64 with 4 warps gave
    NaNs). fp32 tiles are twice the bytes: smaller pipelines (only v1 runs fp32)."""
    if _interpreted(interpreted):
        return 16, 16, 1, 1
    if dtype == torch.float32:
        return (128, 64, 4, 3) if D <= 64 else (128, 64, 8, 1) if D <= 128 else (64, 32, 8, 1)
    if D > 128:
        return 64, 32, 8, 1
    if version in WARP_SPECIALIZED:
        return 128, 128, 4, 2
    if version == "v2":
        if D == 128 and causal and config.host_desc_min_n <= n < config.host_desc_small_tiles_below:
            return 64, 64, 4, 3
        return (128, 128, 4, 3) if D <= 64 else (128, 128, 8, 3)
    if n <= 1024 or (D <= 64 and causal):
        return 64, 64, 4, 3
    if D <= 64:
        return 128, 64, 4, 3
    return (128, 64, 8, 3) if causal else (128, 128, 8, 3)


def _causal_128_grid(D: int, causal: bool, nq: int, nk: int) -> bool:
    """Where the causal D=128 defaults past v1 were measured: both lengths multiples of 128."""
    return D == 128 and causal and nq % 128 == 0 and nk % 128 == 0


def host_descriptors_pay(D: int, causal: bool, nq: int, nk: int, config: FlashConfig = DEFAULT) -> bool:
    """Where v2 makes its descriptors on the host by default: causal D=128 from host_desc_min_n (measured with
    Nq = Nk only: a short query block over a long cache keeps v1)."""
    return _causal_128_grid(D, causal, nq, nk) and min(nq, nk) >= config.host_desc_min_n


def fwd_version(D: int, dtype, causal: bool, nq: int, nk: int, config: FlashConfig = DEFAULT,
                interpreted: bool | None = None) -> str:
    """The forward version the rules give a shape (see the module docstring)."""
    if _interpreted(interpreted) or dtype == torch.float32 or D > 128:
        return "v1"
    if D == 128 and not causal and nq % 128 == 0 and nk % 128 == 0:
        return "v5"
    if D <= 64 and not causal and nk > 1024:
        return "v2"
    if _causal_128_grid(D, causal, nq, nk) and min(nq, nk) >= config.split_min_n:
        return "v6"
    if host_descriptors_pay(D, causal, nq, nk, config):
        return "v2"
    return "v1"


def causal_group_heads(num_m: int, bh: int, config: FlashConfig = DEFAULT) -> int:
    """Heads per group of the causal order: about config.causal_group_programs programs, within [1, bh]."""
    return max(1, min(bh, -(-config.causal_group_programs // num_m)))


def fwd_plan(B: int, Hq: int, nq: int, nk: int, D: int, dtype, causal: bool, scale: float = 1.0,
             config: FlashConfig = DEFAULT, sms: int = 132, interpreted: bool | None = None,
             contiguous: bool = True, aligned: bool = True) -> FwdPlan:
    """The forward's plan for a call: ``contiguous`` whether q, k, v are, ``aligned`` whether TMA can address
    q, k, v, o (``common.tma_aligned``); anything TMA cannot read runs v1. ``sms``: the GPU's SM count (the
    persistent grid's size)."""
    interp = _interpreted(interpreted)
    forced = config.fwd is not None
    version = config.fwd or fwd_version(D, dtype, causal, nq, nk, config, interp)
    if forced and version in WARP_SPECIALIZED:
        if (version == "v6") != causal:
            raise ValueError(f"forward {version} is for {'causal' if version == 'v6' else 'non-causal'} calls")
        if nq % 4:  # the LSE is stored through a descriptor (16-byte rows): through pointers, warp specialization
            raise ValueError(f"forward {version} needs Nq % 4 == 0, got {nq}")  # drops the store (ws_lse_h200.json)
    if config.host_descriptors is None:
        host = not forced and version == "v2" and host_descriptors_pay(D, causal, nq, nk, config)
        if host and not contiguous:
            version = "v1"
    else:
        host = config.host_descriptors
    if version != "v1" and not aligned:
        version = "v1"
    tiles = tuple(config.fwd_tiles or fwd_tiles(D, dtype, version, causal, nk, config, interp))
    bm, bn = tiles[:2]
    n_m = cdiv(nq, bm)
    grid = (min(n_m * B * Hq, sms),) if version == "v5" else (n_m, B * Hq)
    resume = None
    if version == "v6":
        rm, rn, rw, rs = (min(bm, 16), min(bn, 16), 1, 1) if interp else config.resume_tiles
        resume = (bm if bm % rm else rm, rn, rw, rs)  # its query tiles must divide the first launch's
    return FwdPlan(version, tiles, grid, causal_group_heads(n_m, B * Hq, config) if causal else 1,
                   host_descriptors=(host and version == "v2" and contiguous and nq % bm == 0 and nk % bn == 0),
                   diag_branch=causal and version == "v2" and scale > 0,  # (-inf times a zero scale: NaN)
                   resume=resume)


def bwd_version(D: int, dtype, causal: bool = False, n: int = 4096, interpreted: bool | None = None) -> str:
    """The backward version by default: v4 at D <= 64 and v3 at D <= 128, where they won at N=4K; over at most 1K
    queries v2 (causal D=128 fwd+bwd 0.61 ms against v3's 0.75, flash_attention_n1k_recheck_h200.json; D <= 64
    0.20 / 0.30 ms against v4's 0.25 / 0.36, flash_attention_bwd_n1k_h200.json). fp32, D > 128 and the
    interpreter run v2. (v5, dQ by atomics, lost at every point, flash_attention_bwd_v5_h200.json.)"""
    if _interpreted(interpreted) or dtype == torch.float32 or D > 128 or n <= 1024:
        return "v2"
    return "v4" if D <= 64 else "v3"


def bwd_tiles(D: int, dtype, version: str = "v2", interpreted: bool | None = None) -> tuple[int, ...]:
    """(M1, N1, M2, N2, num_warps, num_stages), plus the dQ launch's (num_warps, num_stages) for v4 at D <= 64.

    M1 x N1 is the dK/dV side's (query, key) tile, M2 x N2 the dQ side's: flex_attention's sm90 defaults, then the
    winners of the H200 sweeps (flash_attention_bwd_h200.json, _bwd_sweep_, _bwd_n1k_): at D=64 small tiles with
    4 warps, 12-21% ahead of flex's 8-warp tile. fp32: smaller tiles, no pipelining."""
    if _interpreted(interpreted):
        return 16, 16, 16, 16, 1, 1
    if dtype == torch.float32:
        return (32, 64, 64, 32, 4, 1) if D <= 128 else (16, 32, 32, 16, 4, 1)
    if D <= 64 and version == "v4":
        return 32, 64, 64, 64, 4, 3, 4, 3
    if D <= 64:
        return 32, 64, 64, 32, 4, 3
    if D <= 128:
        return 64, 128, 128, 64, 8, 3
    return 32, 64, 64, 32, 8, 1


# Smaller tiles tried in order when the table's do not fit the GPU (OutOfResources: shared memory or registers).
BWD_FALLBACK_TILES = ((64, 64, 64, 64, 4, 2), (32, 64, 64, 32, 4, 1), (16, 32, 32, 16, 4, 1))


def bwd_plan(B: int, Hq: int, Hkv: int, nq: int, nk: int, D: int, dtype, causal: bool,
             config: FlashConfig = DEFAULT, interpreted: bool | None = None, aligned: bool = True,
             tiles: tuple | None = None) -> BwdPlan:
    """The backward's plan; ``aligned``: whether TMA can address q, k, v, dO (else the pointer loads, keeping
    v4's two launches); ``tiles`` overrides the table (the fallbacks)."""
    interp = _interpreted(interpreted)
    version = config.bwd or bwd_version(D, dtype, causal, nq, interp)
    if version in ("v3", "v4") and not aligned:
        version = "v2-split" if version == "v4" else "v2"
    split = version in ("v4", "v2-split")
    tiles = tuple(tiles or config.bwd_tiles or bwd_tiles(D, dtype, "v4" if split else version, interp))
    m1, n1, m2, n2 = tiles[:4]
    pre_m = 16 if interp else 64
    group = Hq // Hkv
    n_kv, n_q = cdiv(nk, n1), cdiv(nq, m2)
    mains = ((n_kv, B * Hkv), (n_q * group, B * Hkv)) if split else ((n_kv + n_q * group, B * Hkv),)
    return BwdPlan(version, tiles, pre_m, ((cdiv(nq, pre_m), B * Hq),) + mains)
