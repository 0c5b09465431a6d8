"""Paged decode attention in Triton, flash-decoding style (chapter 7).

Same contract as ``minillm.paged_attention.paged_attention``: q (B, Hq, D); caches
(num_blocks, block_size, Hkv, D); block_table (B, max_blocks) int32; seq_lens (B,) int32.

Grid: (B, Hkv, num_splits). Each program owns one KV head of one sequence and a
contiguous slice of its tokens. It loads every key and value of that slice ONCE and
uses it for the whole group of query heads that share the KV head (GQA), walking
the slice in TILE-token steps: for each token the physical block comes from the
block table, so any block size works (TILE may span several small blocks). It keeps
a running (m, l, acc) and writes an unnormalized partial. A second step merges the
partials of all splits through their log-sum-exp -- the merge of chapter 5.

Splitting a long sequence across programs is what keeps the GPU busy at small
batch: with B * Hkv programs alone, a batch of one would use a handful of SMs.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..paged.attention import check_paged_inputs
from . import INTERPRETED, check_placement, check_tensors

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
last_decode_kernel = None  # the compiled decode kernel of the latest call: n_regs / n_spills / metadata.shared


@triton.jit
def _paged_decode_kernel(Q, KC, VC, TABLE, LENS, M_OUT, L_OUT, O_OUT, qk_scale, split_len,
                         sqb, sqh, skb, sks, skh, svb, svs, svh, stb, max_blocks, num_splits,
                         Hq, GROUP, BLOCK_SIZE, num_blocks, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         GROUP_PAD: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr):
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
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(pmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(VC + phys[:, None] * svb + slot[:, None] * svs + hk * svh + dims[None, :], mask=kmask, other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    row = (b * Hq + heads) * num_splits + split
    tl.store(M_OUT + row, m, mask=gmask)
    tl.store(L_OUT + row, l, mask=gmask)
    tl.store(O_OUT + row[:, None] * BLOCK_D + dims[None, :], acc, mask=gmask[:, None])
    # END SOLUTION


@triton.jit
def _merge_splits_kernel(M, L, O, OUT, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         SPLITS_PAD: tl.constexpr):
    """One program per (sequence, query head): o = sum_s 2^(m_s - m*) o_s / sum_s 2^(m_s - m*) l_s."""
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


def default_splits(batch: int, hkv: int, max_len: int, device) -> int:
    """As many splits as fit in one wave of ~4 programs per SM, never a slice under one 64-token tile.

    From the split sweeps on the H200 (benchmarks/results/paged_attention_h200.json, rows marked
    ``sweep``): at batch 1 the time falls until ~64 splits fill the SMs; at batch 16 (128 programs
    unsplit) 4 splits (512 programs, one wave) beat both 5 and 9, which spill into a second,
    mostly idle wave. Rounding down keeps the grid inside the first wave.
    """
    if INTERPRETED:
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min((4 * sms) // (batch * hkv), math.ceil(max_len / 64), 128))


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None,
                    validate: bool = True, num_splits: int | None = None, tile: int | None = None,
                    num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """Decode attention over a paged cache; same signature as the NumPy reference, plus tuning knobs:
    ``num_splits`` (programs per sequence and KV head), ``tile`` (tokens per loop step), and the
    decode kernel's ``num_warps`` / ``num_stages`` (None: 4 warps and Triton's default stages).

    ``validate=True`` checks every table entry that will be read against the pool on the host, which
    copies block_table and seq_lens off the GPU (a sync per call). A caller that builds its own tables
    (the batching engine, the benchmark) passes ``validate=False``; the kernel then still masks any
    entry outside the pool, so it never reads out of bounds, but a bad table gives wrong numbers
    instead of an error.
    """
    check_tensors(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    B, Hq, Hkv, D, block_size, num_blocks = check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens,
                                                               check_table=validate)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    if D > 256:
        raise ValueError(f"unsupported head dim {D}: at most 256")
    if not 1 <= block_size <= 1024:
        raise ValueError(f"unsupported block size {block_size}")
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    group = Hq // Hkv
    # Size the splits from what the block table can hold, not from seq_lens.max(): reading that
    # would stall the host on the GPU every call. Splits past a sequence's end do no work.
    max_len = block_table.shape[1] * block_size
    splits = num_splits or default_splits(B, Hkv, max_len, q.device)
    # the tile is independent of the block size (a tile may span several blocks): 16-token steps
    # for 16-token blocks left half the bandwidth unused on the H200
    tile = tile or (16 if INTERPRETED else 64)
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two >= 1, got {num_warps}")
    if num_stages is not None and num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    split_len = triton.cdiv(triton.cdiv(max_len, splits), tile) * tile
    splits = triton.cdiv(max_len, split_len)  # rounding split_len up can leave trailing splits empty
    block_d = max(16, triton.next_power_of_2(D))
    launch = {"num_warps": 1 if INTERPRETED else (num_warps or 4)}
    if num_stages is not None:
        launch["num_stages"] = num_stages
    m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    o = torch.empty((B, Hq, splits, block_d), device=q.device, dtype=torch.float32)
    qc = q if q.stride(-1) == 1 else q.contiguous()
    global last_decode_kernel
    last_decode_kernel = _paged_decode_kernel[(B, Hkv, splits)](
        qc, k_cache, v_cache, block_table, seq_lens, m, l, o, scale * 1.4426950408889634, split_len,
        qc.stride(0), qc.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0),
        block_table.shape[1], splits, Hq, group, block_size, num_blocks,
        HEAD_DIM=D, BLOCK_D=block_d, GROUP_PAD=max(16, triton.next_power_of_2(group)), TILE=tile,
        IEEE=q.dtype == torch.float32, **launch)
    # merge the splits through their log-sum-exp (m is in log2 units, as in the kernel): one launch
    out = torch.empty((B, Hq, D), device=q.device, dtype=out_dtype)
    _merge_splits_kernel[(B * Hq,)](m, l, o, out, splits, HEAD_DIM=D, BLOCK_D=block_d,
                                    SPLITS_PAD=max(2, triton.next_power_of_2(splits)),
                                    num_warps=1 if INTERPRETED else 4)
    return out
