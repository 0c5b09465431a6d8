"""Paged decode attention in Triton, flash-decoding style (chapter 7).

Same contract as ``minillm.paged_attention.paged_attention``: q (B, Hq, D); caches
(num_blocks, block_size, Hkv, D); block_table (B, max_blocks) int32; seq_lens (B,) int32.

Grid: (B, Hkv, num_splits). Each program owns one KV head of one sequence and a
contiguous slice of its tokens. It loads every key and value of that slice ONCE and
uses it for the whole group of query heads that share the KV head (GQA). Two loops:

* v1 walks the slice in TILE-token steps: for each token the physical block comes from the
  block table, so any block size works (TILE may span several small blocks);
* v3 takes one whole cache block per step, its K and V copied by the tensor-memory accelerator
  (TMA) through two descriptors made on the host (:func:`prefers_tma` says where it runs).

Each keeps a running (m, l, acc) and writes an unnormalized partial; a second launch merges the
partials of all splits through their log-sum-exp -- the merge of chapter 5. With a single split
the one program normalizes and writes the output itself.

Splitting a long sequence across programs is what keeps the GPU busy at small
batch: with B * Hkv programs alone, a batch of one would use a handful of SMs.
The variants the H200 studies rejected (a hand-written prefetch loop, the merge by the last
split through an atomic ticket, programmatic dependent launch of the merge, descriptors built
in the kernel, several blocks per TMA step) are in the git tag ``archive/kernel-experiments``, with the
results of the studies the docstrings below summarize.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..paged.attention import check_paged_inputs
from . import INTERPRETED, check_placement, check_tensors
from .common import LOG2E, CachedLaunch, cdiv, dot, last_dim_contiguous, mma, next_power_of_2, num_sms, softmax_step

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TMA_MIN_BLOCK = 64  # prefers_tma: v3 by default only with blocks of at least this many tokens
TMA_CONFIG = (4, 3)  # v3's (num_warps, num_stages); tma_config may take fewer stages
DEFAULT_TILE = 64  # tokens per v1 step on a GPU (16-token steps left half the bandwidth unused)


@dataclass(frozen=True)
class PagedConfig:
    """Overrides of the decode kernel's measured defaults (None: the default). num_splits: programs per sequence and
    KV head; tile: tokens per v1 step (a power of two >= 16); num_warps / num_stages of the decode kernel; tma:
    True runs v3 (raises where the caches cannot be read by TMA, :func:`tma_unsupported`), False v1, None the rule
    (:func:`prefers_tma`; an explicit tile asks for v1)."""
    num_splits: int | None = None
    tile: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tma: bool | None = None

    def __post_init__(self):
        if self.tile is not None and (self.tile < 16 or self.tile & (self.tile - 1)):
            raise ValueError(f"tile must be a power of two >= 16, got {self.tile}")
        if self.num_warps is not None and (self.num_warps < 1 or self.num_warps & (self.num_warps - 1)):
            raise ValueError(f"num_warps must be a power of two >= 1, got {self.num_warps}")
        if self.num_stages is not None and self.num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {self.num_stages}")
        if self.tma not in (None, False, True):
            raise ValueError(f"tma must be None, False or True, got {self.tma!r}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {self.num_splits}")


DEFAULT_CONFIG = PagedConfig()


@dataclass(frozen=True)
class DecodeInfo:
    """What a decode call ran: the loop ("v1" or "v3"), tokens per step, splits, warps and stages, and the
    compiled decode kernel (None in the interpreter)."""
    loop: str
    tile: int
    splits: int
    num_warps: int
    num_stages: int | None
    kernel: object = None


@triton.jit
def _paged_decode_kernel(Q, KC, VC, TABLE, LENS, M_OUT, L_OUT, O_OUT, OUT, qk_scale, split_len,
                         sqb, sqh, skb, sks, skh, svb, svs, svh, stb, max_blocks, num_splits,
                         Hq, Hkv, GROUP, num_blocks, K_DESC, V_DESC, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, GROUP_PAD: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr,
                         DIRECT: tl.constexpr, TMA: tl.constexpr):
    # BEGIN SOLUTION
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(LENS + b)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    g = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + g                       # the query heads that share KV head hk
    gmask = g < GROUP
    dmask = dims < HEAD_DIM
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    if TMA:  # v3: one whole block per step, copied by the tensor-memory accelerator
        m, l, acc = _decode_loop_tma(q, m, l, acc, K_DESC, V_DESC, TABLE, b, hk, start, end, qk_scale,
                                     skb, sks, skh, stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE, IEEE=IEEE)
    else:  # v1: Triton's pipeliner places the loads
        for t0 in tl.range(start, end, TILE):
            pos = t0 + tl.arange(0, TILE)
            pmask = pos < end
            blk = pos // BLOCK_SIZE
            phys = tl.load(TABLE + b * stb + blk, mask=pmask & (blk < max_blocks), other=-1)  # padding is never read
            # an entry outside the pool is never dereferenced, even when the host check was skipped
            pmask = pmask & (phys >= 0) & (phys < num_blocks)
            phys = phys.to(tl.int64)  # block * stride passes 2^31 in pools over 4 GiB
            slot = pos % BLOCK_SIZE
            kmask = pmask[:, None] & dmask[None, :]
            k = tl.load(KC + phys[:, None] * skb + slot[:, None] * sks + hk * skh + dims[None, :], mask=kmask, other=0.0)
            s = dot(q, tl.trans(k), IEEE) * qk_scale
            s = tl.where(pmask[None, :], s, float("-inf"))
            p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, True, True)
            v = tl.load(VC + phys[:, None] * svb + slot[:, None] * svs + hk * svh + dims[None, :], mask=kmask, other=0.0)
            acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
            m = m_new
    # END SOLUTION
    _finish_split(m, l, acc, M_OUT, L_OUT, O_OUT, OUT, Hq, GROUP, num_splits, HEAD_DIM=HEAD_DIM,
                  BLOCK_D=BLOCK_D, GROUP_PAD=GROUP_PAD, DIRECT=DIRECT)


@triton.jit
def _decode_loop_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, start, end, qk_scale, skb, sks, skh, stb,
                     max_blocks, num_blocks, BLOCK_SIZE: tl.constexpr, IEEE: tl.constexpr):
    """v3 of the decode loop: one whole cache block per step, its K and V copied by TMA.

    v1 gathers each tile row by row with per-thread addresses. Here each block's keys and values are one box of a
    tensor descriptor (made on the host, :func:`_host_descriptors`): a single thread issues each copy, the data
    lands in shared memory, and Triton's pipeliner keeps the next block's copies in flight while this one computes
    (at 3 stages). The full blocks of the split run unmasked; the last,
    which may run past the sequence's end, masked (``start`` is block-aligned: a split is whole blocks).
    """
    # BEGIN SOLUTION
    full_end = start + tl.maximum(end - start, 0) // BLOCK_SIZE * BLOCK_SIZE
    for t0 in tl.range(start, full_end, BLOCK_SIZE):
        m, l, acc = _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, t0, end, qk_scale, skb, sks, skh,
                                     stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE, MASKED=False, IEEE=IEEE)
    if full_end < end:  # the last block, masked past end
        m, l, acc = _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, full_end, end, qk_scale, skb, sks,
                                     skh, stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE, MASKED=True, IEEE=IEEE)
    # END SOLUTION
    return m, l, acc


@triton.jit
def _finish_split(m, l, acc, M_OUT, L_OUT, O_OUT, OUT, Hq, GROUP, num_splits, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr, GROUP_PAD: tl.constexpr, DIRECT: tl.constexpr):
    """What a program does with its (m, l, acc) (m in log2 units, GROUP_PAD rows, the padding rows masked).
    DIRECT (one split): normalize and write the output. Otherwise store the unnormalized partial."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + g
    gmask = g < GROUP
    if DIRECT:
        # as the merge of a single split: o / l (0 / 0 = NaN for an empty sequence, as the merge gives)
        out = acc / tl.where(gmask, l, 1.0)[:, None]
        tl.store(OUT + (b * Hq + heads)[:, None] * HEAD_DIM + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask[:, None] & (dims < HEAD_DIM)[None, :])
    else:
        row = (b * Hq + heads) * num_splits + split
        tl.store(M_OUT + row, m, mask=gmask)
        tl.store(L_OUT + row, l, mask=gmask)
        tl.store(O_OUT + row[:, None] * BLOCK_D + dims[None, :], acc, mask=gmask[:, None])


@triton.jit
def _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, t0, end, qk_scale, sb, ss, sh, stb,
                     max_blocks, num_blocks, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One block of the v3 loop: its table entry, its K and V boxes by TMA, the online-softmax step. An entry
    outside the pool is never dereferenced: its box is placed past the descriptor's last row, so K and V read
    as zeros, and its scores are masked. MASKED: the block may run past ``end`` (the last of a split), so its scores
    past ``end`` are masked and its value rows there zeroed (a slot past a sequence's end may hold anything)."""
    # BEGIN SOLUTION
    blk = t0 // BLOCK_SIZE
    phys = tl.load(TABLE + b * stb + blk, mask=blk < max_blocks, other=-1)
    ok = (phys >= 0) & (phys < num_blocks)
    # the box's first element in the pool; an entry outside the pool points one block past its end, where
    # every row of the box lies outside the descriptor and TMA reads zeros (never another block's data)
    off = tl.where(ok, phys, num_blocks).to(tl.int64) * sb + hk * sh
    row = (off // ss).to(tl.int32)
    col = (off % ss).to(tl.int32)
    k = k_desc.load([row, col])
    s = dot(q, tl.trans(k), IEEE) * qk_scale
    if MASKED:
        valid = ((t0 + tl.arange(0, BLOCK_SIZE)) < end) & ok
        s = tl.where(valid[None, :], s, float("-inf"))
    else:
        s = tl.where(ok, s, float("-inf"))
    p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, True, True)
    v = v_desc.load([row, col])
    if MASKED:
        v = tl.where(valid[:, None], v, 0.0)
    acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
    # END SOLUTION
    return m_new, l, acc


@triton.jit
def _merge_splits_kernel(M, L, O, OUT, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         SPLITS_PAD: tl.constexpr):
    """One program per (sequence, query head) merges its splits' partials:
    o = sum_s 2^(m_s - m*) o_s / sum_s 2^(m_s - m*) l_s."""
    row = tl.program_id(0)
    sp = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, BLOCK_D)
    smask = sp < num_splits
    m = tl.load(M + row * num_splits + sp, mask=smask, other=float("-inf"))
    l = tl.load(L + row * num_splits + sp, mask=smask, other=0.0)
    o = tl.load(O + (row * num_splits + sp)[:, None] * BLOCK_D + dims[None, :], mask=smask[:, None], other=0.0)
    m_star = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_star))  # empty splits weigh nothing
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(OUT + row * HEAD_DIM + dims, out.to(OUT.dtype.element_ty), mask=dims < HEAD_DIM)


_launch_decode, _launch_merge = CachedLaunch(_paged_decode_kernel), CachedLaunch(_merge_splits_kernel)


def default_splits(batch: int, hkv: int, max_len: int, device) -> int:
    """As many splits as fit in one wave of ~4 programs per SM, never a slice under one 64-token tile. (H200
    split sweeps: at batch 1 the time falls until ~64 splits fill the SMs; at batch 16, 4 splits -- one wave of
    512 programs -- beat 5 and 9, which spill into a second, mostly idle wave.)"""
    if INTERPRETED:
        return 1
    return max(1, min((4 * num_sms(device)) // (batch * hkv), math.ceil(max_len / 64), 128))


def decode_config(batch: int, hkv: int, max_len: int) -> tuple[int, int | None]:
    """The decode kernel's default (num_warps, num_stages) for a batch (``max_len``: the block table's token
    capacity). From H200 sweeps (bf16, Hq=32, Hkv=8, D=128, 16-token blocks): at B=1, 4 warps, 1 stage up to 4K
    tokens and 2 stages at 16K; at B >= 16, 2 stages, with 2 warps from B * L = 256K tokens and 4 below. Batches
    of 2-15, not swept, take the B=1 rule; ``hkv`` is unused (the sweeps had Hkv=8 only)."""
    if batch < 16:
        return 4, (1 if max_len <= 4096 else 2)
    return (2 if batch * max_len >= 16 * 16384 else 4), 2


def prefers_tma(batch: int, hkv: int, block_size: int, device) -> bool:
    """Whether a call with tma=None runs v3 (never in the interpreter; :func:`tma_rule` is the rule). v3 keeps a
    whole block in flight while it computes the one before, so one program per (sequence, KV head) streams fast
    enough alone and one or two splits need no or one small merge. In the H200 studies (bf16, Hq=32, Hkv=8,
    D=128) that won where batch * Hkv fills the SMs once or twice, with blocks of 64 tokens or more (1.01-1.46x
    v1 at B=12-32); at B=64 v1 won or tied, and with 16-token blocks a step is too small (0.54-0.71x v1)."""
    return not INTERPRETED and tma_rule(batch, hkv, block_size, num_sms(device))


def tma_splits(tile: int, max_len: int) -> int:
    """v3's split count where batch * Hkv passes half the SMs (same studies): one with 128-token steps at every
    length (a program per (sequence, KV head) streams at cuDNN's rate); with 64-token steps, two from 4K tokens."""
    return 1 if tile >= 128 or max_len < 4096 else 2


def tma_shared_bytes(stages: int, tile: int, head_dim: int, element_size: int) -> int:
    """Shared memory one v3 program holds as Triton compiles it for sm_90: (stages - 1) buffers of a step's K and
    V plus about 8 KiB (72 / 136 KiB at 2 / 3 stages with 128-token steps, D=128, bf16)."""
    return max(stages - 1, 1) * 2 * tile * head_dim * element_size + 8192


def tma_config(batch: int, hkv: int, sms: int, tile: int, head_dim: int, element_size: int,
               shared_per_sm: int) -> tuple[int, int]:
    """v3's (num_warps, num_stages): ``TMA_CONFIG``, with fewer stages only where that lets all batch * Hkv
    programs be resident at once (at B=32, 128-token blocks at 2 stages ran 1.09x faster than at 3, which left
    a second wave). Raises ValueError for a step too large for an SM even at 2 stages (one buffer)."""
    warps, stages = TMA_CONFIG
    if tma_shared_bytes(2, tile, head_dim, element_size) > shared_per_sm:
        raise ValueError(f"a v3 step of {tile} tokens needs {tma_shared_bytes(2, tile, head_dim, element_size)} "
                         f"bytes of shared memory; an SM has {shared_per_sm}: pass a smaller tile")
    per_sm = -(-batch * hkv // sms)  # programs each SM must hold for one wave
    while stages > 2 and per_sm * tma_shared_bytes(stages, tile, head_dim, element_size) > shared_per_sm:
        stages -= 1
    return warps, stages


@functools.cache
def _shared_per_sm(device: torch.device) -> int:
    """Shared memory per SM in bytes; 228 KiB (sm_90) where torch does not say."""
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))


def tma_rule(batch: int, hkv: int, block_size: int, sms: int) -> bool:
    """:func:`prefers_tma`'s rule on a GPU with ``sms`` SMs (the switch and the interpreter aside)."""
    return block_size >= TMA_MIN_BLOCK and sms // 2 < batch * hkv <= 2 * sms


def split_plan(max_len: int, splits: int, tile: int) -> tuple[int, int]:
    """(tokens per split, splits that run) for ``splits`` asked over ``max_len`` tokens: each split is
    rounded up to whole tiles, which can leave fewer splits than asked (the trailing ones empty)."""
    split_len = cdiv(cdiv(max_len, splits), tile) * tile
    return split_len, cdiv(max_len, split_len)


def tma_unsupported(k_cache, v_cache, block_size: int) -> str | None:
    """Why the v3 loop (TMA) cannot read these caches, or None if it can.

    Each block of one KV head must be one (block_size, D) box of a 2-D view of the pool whose rows are one
    slot apart: true of the contiguous (num_blocks, block_size, Hkv, D) pool and of a head-major
    (num_blocks, Hkv, block_size, D) pool passed as its permuted view. TMA also wants 16-byte aligned bases
    and row strides, and Triton's boxes powers of two (the box is the whole head dim: no padding).
    """
    nb, bs, hkv, d = k_cache.shape
    if k_cache.stride() != v_cache.stride():
        return "k_cache and v_cache have different strides"
    sb, ss, sh, sd = k_cache.stride()
    size = k_cache.element_size()
    if sd != 1:
        return "the head dim is not contiguous"
    if not (16 <= bs <= 256 and bs & (bs - 1) == 0):
        return f"block size {bs} is not a power of two in [16, 256]"
    if not (16 <= d <= 256 and d & (d - 1) == 0):
        return f"head dim {d} is not a power of two in [16, 256]"
    if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16 or ss * size % 16:
        return "a base pointer or the slot stride is not 16-byte aligned"
    if ss <= 0 or sb % ss or any((h * sh) % ss + d > ss or (h * sh) // ss + bs > sb // ss for h in range(hkv)):
        return "a block of one head is not one box of rows one slot apart inside its block"
    if (nb + 1) * (sb // ss) >= 2**31:
        return "the pool has more rows than TMA coordinates address"
    return None


def _host_descriptors(k_cache, v_cache, num_blocks: int, block_size: int, head_dim: int):
    """v3's two descriptors made on the host, as ``_block_descriptor`` builds them in the kernel: 2-D views of the
    pools with rows one slot apart (stride ``ss``), as many rows as the pool holds, (block_size, head_dim) boxes."""
    # BEGIN SOLUTION
    sb, ss = k_cache.stride(0), k_cache.stride(1)
    rows = num_blocks * (sb // ss)
    descs = tuple(TensorDescriptor(c, [rows, ss], [ss, 1], [block_size, head_dim]) for c in (k_cache, v_cache))
    # END SOLUTION
    return descs


def decode_dims(q, k_cache, v_cache, block_table, seq_lens, validate: bool) -> tuple[int, ...]:
    """The checks every paged decode kernel's host code runs first (tensors, shapes, the table when ``validate``,
    dtype, one device); returns (B, Hq, Hkv, D, block_size, num_blocks)."""
    check_tensors(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    dims = check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, check_table=validate)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    return dims


@dataclass(frozen=True)
class _Plan:
    tma: bool
    tile: int
    split_len: int
    splits: int
    block_d: int
    warps: int
    stages: int | None


@functools.lru_cache(maxsize=256)
def _decode_plan(B: int, Hkv: int, D: int, block_size: int, max_len: int, element_size: int, device,
                 config: PagedConfig, use_tma: bool) -> _Plan:
    """Everything a decode call decides from its shapes alone, cached (an eager call at batch 1 is mostly host
    time). ``use_tma``: v3 runs (the rule or the config wants it, and :func:`tma_unsupported` said yes)."""
    tile = config.tile
    if use_tma:
        if tile is not None and tile != block_size:
            raise ValueError(f"with tma=True a step is one block: tile must be the block size {block_size}, got {tile}")
        tile = block_size
    tile = tile or (16 if INTERPRETED else DEFAULT_TILE)
    sms = num_sms(device) if use_tma and not INTERPRETED else None  # v3's split count and stages read it
    if config.num_splits:
        splits = config.num_splits
    elif sms is not None and B * Hkv > sms // 2:
        # about a program per SM already: one or two splits; past the SMs, one
        splits = tma_splits(tile, max_len) if B * Hkv <= sms else 1
    else:
        splits = default_splits(B, Hkv, max_len, device)
    split_len, splits = split_plan(max_len, splits, tile)
    if sms is not None:
        warps, stages = tma_config(B, Hkv, sms, tile, D, element_size, _shared_per_sm(device))
    else:
        warps, stages = TMA_CONFIG if use_tma else decode_config(B, Hkv, max_len)
    warps = 1 if INTERPRETED else (config.num_warps or warps)
    stages = config.num_stages if config.num_stages is not None else stages
    return _Plan(use_tma, tile, split_len, splits, max(16, next_power_of_2(D)), warps, stages)


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None, validate: bool = True,
                 config: PagedConfig | None = None) -> tuple[torch.Tensor, DecodeInfo]:
    """:func:`paged_attention`, returning (out, DecodeInfo): which loop ran, on how many splits, with what."""
    config = config or DEFAULT_CONFIG
    B, Hq, Hkv, D, block_size, num_blocks = decode_dims(q, k_cache, v_cache, block_table, seq_lens, validate)
    if D > 256:
        raise ValueError(f"unsupported head dim {D}: at most 256")
    if not 1 <= block_size <= 1024:
        raise ValueError(f"unsupported block size {block_size}")
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    # Size the splits from what the block table can hold, not from seq_lens.max(): reading that
    # would stall the host on the GPU every call. Splits past a sequence's end do no work.
    max_len = block_table.shape[1] * block_size
    # the kernel takes the caches' block, slot and head strides as they are (a head-major pool passed as a
    # permuted view runs without a copy) and assumes the head dim is contiguous
    k_cache, v_cache = last_dim_contiguous(k_cache, v_cache)
    want_tma = config.tma if config.tma is not None else (
        config.tile is None and prefers_tma(B, Hkv, block_size, q.device))
    tma_allowed = False
    if want_tma:
        why = tma_unsupported(k_cache, v_cache, block_size)
        if why and config.tma:
            raise ValueError(f"tma=True cannot read these caches: {why}")
        tma_allowed = why is None
    plan = _decode_plan(B, Hkv, D, block_size, max_len, k_cache.element_size(), q.device, config, tma_allowed)
    launch = {"num_warps": plan.warps} if plan.stages is None else {"num_warps": plan.warps,
                                                                      "num_stages": plan.stages}
    direct = plan.splits == 1  # nothing to merge: the one program writes the output
    out = torch.empty((B, Hq, D), device=q.device, dtype=out_dtype)
    if direct:  # no partials to keep (the kernel never touches them)
        m = l = o = out
    else:
        m = torch.empty((B, Hq, plan.splits), device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        o = torch.empty((B, Hq, plan.splits, plan.block_d), device=q.device, dtype=torch.float32)
    (qc,) = last_dim_contiguous(q)
    k_desc, v_desc = (_host_descriptors(k_cache, v_cache, num_blocks, block_size, D) if plan.tma
                      else (None, None))
    kernel = _launch_decode(
        (B, Hkv, plan.splits), qc, k_cache, v_cache, block_table, seq_lens, m, l, o, out, scale * LOG2E,
        plan.split_len, qc.stride(0), qc.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0),
        block_table.shape[1], plan.splits, Hq, Hkv, Hq // Hkv, num_blocks, k_desc, v_desc, BLOCK_SIZE=block_size,
        HEAD_DIM=D, BLOCK_D=plan.block_d, GROUP_PAD=max(16, next_power_of_2(Hq // Hkv)), TILE=plan.tile,
        IEEE=q.dtype == torch.float32, DIRECT=direct, TMA=plan.tma, **launch)
    if not direct:  # merge the splits through their log-sum-exp (m is in log2 units, as in the kernel)
        _launch_merge((B * Hq,), m, l, o, out, plan.splits, HEAD_DIM=D, BLOCK_D=plan.block_d,
                      SPLITS_PAD=max(2, next_power_of_2(plan.splits)), num_warps=1 if INTERPRETED else 4)
    return out, DecodeInfo("v3" if plan.tma else "v1", plan.tile, plan.splits, plan.warps, plan.stages, kernel)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None, validate: bool = True,
                    config: PagedConfig | None = None, num_splits: int | None = None) -> torch.Tensor:
    """Decode attention over a paged cache; same signature as the NumPy reference, plus ``config``
    (:class:`PagedConfig`: splits, tile, warps, stages, the loop) over the measured defaults. ``num_splits`` is
    ``config.num_splits`` (kept for chapter 7 and assignment 7's grader until they pass a config).

    A sequence of length 0 (possible only with ``validate=False``) gives NaN rows (0 / 0), as the
    merge always has; the NumPy reference rejects it.

    ``validate=True`` checks every table entry that will be read against the pool on the host, which
    copies block_table and seq_lens off the GPU (a sync per call). A caller that builds its own tables
    (the batching engine, the benchmark) passes ``validate=False``; the kernel then still masks any
    entry outside the pool, so it never reads out of bounds, but a bad table gives wrong numbers
    instead of an error.
    """
    if num_splits is not None:
        config = PagedConfig(**{**(config or PagedConfig()).__dict__, "num_splits": num_splits})
    return paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale, validate, config)[0]
