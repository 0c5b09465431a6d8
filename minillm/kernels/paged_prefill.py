"""Causal attention for a ragged batch against a paged KV cache, in Triton (chapter 7).

Same contract as ``minillm.paged.attention.paged_varlen_attention``:

    q             (T, Hq, D)       the new tokens of all S sequences, sequence after sequence
    k_cache       (num_blocks, block_size, Hkv, D), v_cache likewise (the NHD page layout)
    block_tables  (S, max_blocks) int32
    context_lens  (S,) int32       cached tokens of each sequence, the new ones included
    cu_seqlens_q  (S+1,) int32     sequence s owns rows cu_seqlens_q[s] : cu_seqlens_q[s+1] of q

New token i of sequence s sits at position ``context_lens[s] - q_len[s] + i`` and sees positions
0..itself. One launch serves prefill chunks of any length and decode tokens (q_len = 1) mixed.

Grid: (query tiles, S, Hkv). A program owns one KV head of one sequence and a tile of that
sequence's new tokens; the grid is sized for the longest sequence (``max_seqlen_q``) and the
programs past a shorter sequence's end return at once. The tile's rows are (token, query head)
pairs: the GROUP query heads that share KV head hk sit side by side in the M dimension, so every
key and value is loaded once for the whole group (GQA), and a decode token alone still fills
GROUP rows of the MMA instead of one. The program then runs FlashAttention-2's loop over the
sequence's keys 0..(its last token's position):

    load Q tile (BLOCK_M rows = BLOCK_M // GROUP tokens x GROUP heads) once
    for each key tile of BLOCK_N positions:
        phys = block_table[pos // block_size] * block_size + pos % block_size   (per key row)
        S = Q K^T * scale;  online softmax with exp2 (m, l, acc);  acc += P V
    O = acc / l

A key tile is gathered row by row through the table, so it may span several small pages or be a
slice of a large one: any block size works, independent of BLOCK_N. Keys before the tile's first
token position are visible to every row and run without a mask; only the tiles that cross the
causal diagonal (one or two per program: the tile holds BLOCK_M / GROUP tokens) build one.

This kernel does not split one sequence's keys across programs (the decode kernel's split-K):
a batch of a few long decodes runs on S * Hkv programs only. The decode kernel
(``minillm.kernels.paged_attention``) remains the faster choice for a batch of pure decodes.
Measured once on the H200 (bf16, Hq=32, Hkv=8, D=128, 16-token blocks; a one-off sweep, no results
file): a 4096-token prefill 0.48 ms (286 TFLOP/s; the contiguous flash kernel 0.34 ms),
64 decodes at context 2048 0.18 ms (decode kernel 0.15 ms), 8 decodes at 8192 0.27 ms (decode
kernel 0.085 ms, thanks to split-K).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..paged.attention import check_varlen_inputs
from . import INTERPRETED, check_placement, check_tensors
from .common import LOG2E, cdiv, dot, last_dim_contiguous, load_tile, mma, next_power_of_2, softmax_step

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


@triton.jit
def _varlen_inner(acc, l, m, q, KC, VC, TABLE, table_row, row_pos, dims, lo, hi, qk_scale, skb, sks, svb, svs,
                  k_head, v_head, BLOCK_SIZE, num_blocks, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr):
    """Key positions [lo, hi) of one sequence against one query tile. MASKED=False: every key is valid
    for every row (no causal mask, no ragged end), so there is no mask to build and no -inf row max."""
    dmask = dims < HEAD_DIM
    for start in tl.range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        in_k = pos < hi
        if MASKED:
            phys = tl.load(TABLE + table_row + pos // BLOCK_SIZE, mask=in_k, other=0)
        else:
            phys = tl.load(TABLE + table_row + pos // BLOCK_SIZE)
        # an entry outside the pool is never dereferenced, even when the host check was skipped
        phys = tl.minimum(tl.maximum(phys, 0), num_blocks - 1).to(tl.int64)  # block * stride passes 2^31
        slot = pos % BLOCK_SIZE
        # K loads row-major, (BLOCK_N, BLOCK_D), one contiguous head vector per key, then transposes in
        # registers: on the H200 that beat loading K^T through transposed pointers (288 vs 258 TFLOP/s)
        k_ptrs = KC + k_head + phys[:, None] * skb + slot[:, None] * sks + dims[None, :]
        v_ptrs = VC + v_head + phys[:, None] * svb + slot[:, None] * svs + dims[None, :]
        # Past hi a slot may never have been written (a torch.empty pool holds NaNs), and a -inf score
        # does not cancel a NaN value (0 * NaN = NaN): the masked tiles mask their loads too.
        k = load_tile(k_ptrs, in_k[:, None], dmask[None, :], MASKED, PAD_D)
        s = dot(q, tl.trans(k), IEEE)
        if MASKED:
            valid = in_k[None, :] & (pos[None, :] <= row_pos[:, None])  # the causal diagonal
            s = tl.where(valid, s * qk_scale, float("-inf"))
        p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, MASKED, MASKED)  # (unmasked: scale in the FMA)
        v = load_tile(v_ptrs, in_k[:, None], dmask[None, :], MASKED, PAD_D)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m = m_new
    return acc, l, m


@triton.jit
def _varlen_kernel(Q, KC, VC, TABLE, LENS, CU, O, qk_scale, T,
                   sqt, sqh, skb, sks, skh, svb, svs, svh, sot, soh, stb, max_blocks, BLOCK_SIZE, num_blocks,
                   GROUP: tl.constexpr, TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr):
    # the last query tiles see the most keys: start them first so that no SM idles at the end
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    seq = tl.program_id(1)
    hk = tl.program_id(2)
    q_start = tl.maximum(tl.load(CU + seq), 0)
    q_end = tl.minimum(tl.load(CU + seq + 1), T)  # never past q, even unvalidated
    q_len = q_end - q_start
    t0 = tile * TOKENS
    if t0 >= q_len:  # the grid is sized for the longest sequence; this one is shorter
        return
    ctx = tl.load(LENS + seq)
    # rows are (token, head) pairs, token-major: row r is token t0 + r // GROUP, query head hk*GROUP + r % GROUP
    r = tl.arange(0, BLOCK_M)
    tok = t0 + r // GROUP
    head = hk * GROUP + r % GROUP
    row_ok = (r < TOKENS * GROUP) & (tok < q_len)
    row_pos = ctx - q_len + tok  # the key position of each row's token: it sees keys 0..row_pos
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    q_off = (q_start + tok).to(tl.int64) * sqt + head * sqh  # offsets pass 2^31 in large batches
    q = tl.load(Q + q_off[:, None] + dims[None, :], mask=row_ok[:, None] & dmask[None, :], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Keys [0, hi): up to the tile's last token, never past what the table can address.
    # Keys [0, full): seen by every row (all rows sit at or after the tile's first token) -> no mask.
    last_tok = tl.minimum(t0 + TOKENS, q_len) - 1
    hi = tl.minimum(ctx - q_len + last_tok + 1, max_blocks * BLOCK_SIZE)
    first_sees = tl.maximum(ctx - q_len + t0 + 1, 0)
    full = tl.minimum((first_sees // BLOCK_N) * BLOCK_N, tl.maximum(hi, 0))
    table_row = seq.to(tl.int64) * stb
    k_head = hk.to(tl.int64) * skh
    v_head = hk.to(tl.int64) * svh
    acc, l, m = _varlen_inner(acc, l, m, q, KC, VC, TABLE, table_row, row_pos, dims, 0, full, qk_scale,
                              skb, sks, svb, svs, k_head, v_head, BLOCK_SIZE, num_blocks,
                              HEAD_DIM, BLOCK_N, False, PAD_D, IEEE)
    acc, l, m = _varlen_inner(acc, l, m, q, KC, VC, TABLE, table_row, row_pos, dims, full, hi, qk_scale,
                              skb, sks, svb, svs, k_head, v_head, BLOCK_SIZE, num_blocks,
                              HEAD_DIM, BLOCK_N, True, PAD_D, IEEE)
    o = acc / tl.where(l > 0, l, 1.0)[:, None]  # a row that saw no key (only with bad input) gives zeros
    o_off = (q_start + tok).to(tl.int64) * sot + head * soh
    tl.store(O + o_off[:, None] + dims[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None] & dmask[None, :])


def _blocks(D: int, group: int, dtype, tokens_per_seq: float, interpreted: bool = INTERPRETED) -> tuple[int, ...]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); small tiles in the interpreter. BLOCK_M holds at least
    one token's whole group of query heads.

    16-bit, D <= 128, from a sweep on the H200 (bf16, Hq=32, Hkv=8, D=128, 16-token blocks): one
    4096-token prefill ran at 288 TFLOP/s with 128x128 tiles, 8 warps, 3 stages, against 255 with
    64x64 (the contiguous flash kernel: 407); but a batch mostly of decodes wastes most of a 128-row
    tile (a decode fills GROUP rows), and 64 decodes + one 512-token chunk took 0.24 ms with 64x64
    against 0.32 ms with 128x128. The choice uses the shapes only (no host read): large tiles when the
    batch averages at least 64 new tokens per sequence.
    """
    if interpreted:
        bm, bn, warps, stages = 16, 16, 1, 1
    elif dtype == torch.float32:
        bm, bn, warps, stages = (64, 32, 4, 2) if D <= 128 else (32, 32, 4, 1)
    elif D <= 128:
        bm, bn, warps, stages = (128, 128, 8, 3) if tokens_per_seq >= 64 else (64, 64, 4, 2)
    else:
        bm, bn, warps, stages = 64, 32, 8, 1
    return max(bm, next_power_of_2(group)), bn, warps, stages


def varlen_dims(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, validate: bool,
                max_seqlen_q: int | None) -> tuple[int, ...]:
    """The checks every varlen kernel's host code runs first (tensors, shapes, the table and cu_seqlens_q when
    ``validate``, dtype, one device, head dim) and the longest q_len, which sizes the grid: read from
    cu_seqlens_q when validated (``max_seqlen_q``, if given, must cover it), else T - S + 1 unless given.
    Returns (T, S, Hq, Hkv, D, block_size, num_blocks, max_seqlen_q)."""
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens,
                   cu_seqlens_q=cu_seqlens_q)
    check_tensors(**tensors)
    dims = check_varlen_inputs(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, check_table=validate)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(**tensors)
    if dims[4] > MAX_HEAD_DIM:
        raise ValueError(f"unsupported head dim {dims[4]}: at most {MAX_HEAD_DIM}")
    if validate:
        true_max = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())  # the check above has synced already
        if max_seqlen_q is not None and max_seqlen_q < true_max:
            raise ValueError(f"max_seqlen_q={max_seqlen_q} but a sequence has {true_max} new tokens")
        max_seqlen_q = max_seqlen_q or true_max
    max_seqlen_q = dims[0] - dims[1] + 1 if max_seqlen_q is None else max_seqlen_q
    if max_seqlen_q < 1:
        raise ValueError(f"max_seqlen_q must be >= 1, got {max_seqlen_q}")
    return (*dims, max_seqlen_q)


def paged_varlen_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale: float | None = None,
                           validate: bool = True, max_seqlen_q: int | None = None,
                           config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """Causal attention of a ragged batch of new tokens against a paged cache; the NumPy reference's
    signature, plus ``max_seqlen_q`` (the longest q_len, which sizes the grid) and ``config`` =
    (BLOCK_M, BLOCK_N, num_warps, num_stages) to override the tile table.

    ``validate=True`` checks cu_seqlens_q, context_lens and every table entry that will be read on the
    host (a copy off the GPU and a sync per call); it also checks ``max_seqlen_q`` when given, and
    computes it when not. ``validate=False`` checks shapes and dtypes only and reads nothing back:
    ``max_seqlen_q`` then defaults to T - S + 1, the most any sequence can have when each has at least
    one token (exact for one prefill chunk among decodes; otherwise extra programs exit at once). A
    ``max_seqlen_q`` below the true one leaves rows of the output unwritten. Unvalidated, the kernel
    still never reads outside q, the table or the pool, but a bad batch gives wrong numbers, not an error.
    """
    T, S, Hq, Hkv, D, block_size, num_blocks, max_seqlen_q = varlen_dims(
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, validate, max_seqlen_q)
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    group = Hq // Hkv
    bm, bn, warps, stages = config or _blocks(D, group, q.dtype, T / S)
    if bm < 16 or bn < 16 or bm & (bm - 1) or bn & (bn - 1) or bm < group:
        raise ValueError(f"BLOCK_M and BLOCK_N must be powers of two >= 16, BLOCK_M >= the group of {group} "
                         f"query heads; got {bm}, {bn}")
    tokens = bm // group  # new tokens per program
    block_d = max(16, next_power_of_2(D))
    q, k_cache, v_cache, block_tables = last_dim_contiguous(q, k_cache, v_cache, block_tables)
    out = torch.empty((T, Hq, D), device=q.device, dtype=out_dtype)
    grid = (cdiv(max_seqlen_q, tokens), S, Hkv)
    _varlen_kernel[grid](
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, out, scale * LOG2E, T,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], out.stride(0), out.stride(1),
        block_tables.stride(0), block_tables.shape[1], block_size, num_blocks,
        GROUP=group, TOKENS=tokens, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, PAD_D=block_d != D,
        IEEE=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return out
