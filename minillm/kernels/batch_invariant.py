"""Batch-invariant kernels in Triton (chapter 11): each row's result depends on that row's inputs only.

Same signatures and layouts as the NumPy references in :mod:`minillm.batch_invariant`:

* :func:`matmul_bi` (x (M, K) @ w (K, N)): one tile configuration for every M (BLOCK_M, BLOCK_N, BLOCK_K
  depend on the dtype only), K walked tile after tile by one program, never split across programs. A
  library matmul (cuBLAS) picks its kernel, tiles and split-K by M, so a row's bits change with the batch.
* :func:`rmsnorm_bi` (x (R, D), w (D,)): one program per row, the row's sum of squares in one fixed
  reduction, whatever R is; the arithmetic of the torch model's ``rms_norm``.
* :func:`attention_bi` (the paged varlen layout of ``minillm.kernels.paged_prefill``): decode rows, verify
  rows and prefill chunks through one path. Every key tile runs the same arithmetic (the default varlen
  kernel scales unmasked tiles inside the exp2 FMA and masked tiles before it, so a row's bits depend on
  which tiles its query tile masks, i.e. on where the row sits in its chunk). A row's keys are cut at
  multiples of ``SPLIT`` positions, a fixed split SIZE (the default decode kernel picks a split COUNT from
  the batch, and a TMA loop by the batch), and the pieces are merged in order. Key tiles past a row's own
  position are fully masked: they add exact zeros and rescale by exactly 1, so a row computes the same
  bits as a decode, as a verify row or inside a prefill chunk, at any place in any batch. (The rescale is set
  to exactly 1 where a row's maximum does not move, not computed as 2^0: the invariance does not rest on the
  accuracy of the hardware's exp2.)

In Triton's interpreter (no GPU) the products run as broadcast multiplies summed over K (``ROWWISE``), not as
``tl.dot``: the interpreter's ``tl.dot`` is NumPy's matmul, and OpenBLAS on some CPUs computes a row differently
by its place in the tile (on an AVX-512 AMD EPYC, rows 6 to 15 of a 16-row tile round differently from rows 0 to
5), which no GPU's matrix unit does. The sum over K then runs in one order for every row, as on the GPU.

The configuration is fixed per dtype (no autotuning, no shape-dependent choice). The row count is not a
specialization key (``do_not_specialize``): Triton compiles a separate kernel for an integer argument equal
to 1, which would give a batch of one its own code.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import INTERPRETED, check_placement, check_tensors
from .common import LOG2E, cdiv, dot, last_dim_contiguous, mma, next_power_of_2
from .fused import rms_norm
from .paged_prefill import varlen_dims

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def matmul_config(dtype, interpreted: bool = INTERPRETED) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): one per dtype, never per shape (``interpreted``: the
    interpreter's small tiles; pass False for a GPU's on any machine)."""
    if interpreted:
        return 16, 64, 64, 1, 1
    if dtype == torch.float32:
        return 32, 32, 32, 4, 2
    return 64, 64, 64, 4, 3


def attention_config(dtype, group: int, interpreted: bool = INTERPRETED) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, SPLIT, num_warps, num_stages); BLOCK_M holds at least one token's group of query heads.
    SPLIT (keys per split) is a multiple of BLOCK_N. ``interpreted`` as in :func:`matmul_config`."""
    if interpreted:
        bm, bn, split, warps, stages = 16, 16, 32, 1, 1
    elif dtype == torch.float32:
        bm, bn, split, warps, stages = 32, 32, 1024, 4, 1
    else:
        bm, bn, split, warps, stages = 64, 64, 1024, 4, 2
    return max(bm, next_power_of_2(group)), bn, split, warps, stages


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr, ROWWISE: tl.constexpr):
    """acc + a @ b; ROWWISE (the interpreter only): each row's sum over K in one order, whatever its place."""
    if ROWWISE:
        return acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        return mma(a, b, acc, IEEE)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, ROWWISE: tl.constexpr):
    """a @ b into a fresh fp32 accumulator; ROWWISE as in :func:`_mma`."""
    if ROWWISE:
        return tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    else:
        return dot(a, b, IEEE)


# ---- matmul -----------------------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(X, W, Y, M, N, K, sxm, sxk, swk, swn, sym, syn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, IEEE: tl.constexpr, ROWWISE: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xp = X + rm.to(tl.int64)[:, None] * sxm + rk[None, :] * sxk
    wp = W + rk[:, None] * swk + rn[None, :] * swn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):   # one K tile after another, in order: the only reduction order
        k_ok = (k0 + rk) < K
        x = tl.load(xp, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(wp, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = _mma(x, w, acc, IEEE, ROWWISE)
        xp += BLOCK_K * sxk
        wp += BLOCK_K * swk
    yp = Y + rm.to(tl.int64)[:, None] * sym + rn[None, :] * syn
    tl.store(yp, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def matmul_bi(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w for x (M, K) and w (K, N) of one dtype, in x's dtype, accumulated in float32; row i of the result
    depends on row i of x and on w only (bit for bit, whatever M)."""
    check_tensors(x=x, w=w)
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x must be (M, K) and w (K, N), got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or w.dtype != x.dtype:
        raise ValueError(f"x and w must share one dtype of {SUPPORTED_DTYPES}, got {x.dtype} and {w.dtype}")
    check_placement(x=x, w=w)
    M, K = x.shape
    N = w.shape[1]
    out = torch.empty((M, N), device=x.device, dtype=x.dtype)
    if M == 0:
        return out
    xs, ws = x, w
    if INTERPRETED and x.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        xs, ws = x.float(), w.float()
    bm, bn, bk, warps, stages = matmul_config(x.dtype)
    _matmul_kernel[(cdiv(M, bm), cdiv(N, bn))](
        xs, ws, out, M, N, K, xs.stride(0), xs.stride(1), ws.stride(0), ws.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, IEEE=xs.dtype == torch.float32, ROWWISE=INTERPRETED, num_warps=warps,
        num_stages=stages)
    return out


# ---- RMSNorm ----------------------------------------------------------------------------------------------
def rmsnorm_bi(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of x (..., D) with weight w (D,): ``(x / rms(x)).to(x.dtype) * w``, the sum of
    squares in float32. The default step's fused kernel (:func:`minillm.kernels.fused.rms_norm`) is already
    batch-invariant: one program per row, the whole row in one reduction of a fixed shape, whatever the row
    count."""
    return rms_norm(x, w, eps)


# ---- attention --------------------------------------------------------------------------------------------
@triton.jit
def _step(s, m, l):
    """The online-softmax step on scaled, masked scores s (log2 units). Where a row's maximum does not move (every
    tile past the row's own position) the rescale is exactly 1, set rather than computed as 2^0, so such a tile
    leaves (m, l, acc) bit for bit as they were whatever the hardware's exp2 gives for 0; its p is 2^-inf = 0."""
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row that has seen no key yet: p = 0, not NaN
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.where(m_new == m, 1.0, tl.exp2(m - m_shift))
    return p, alpha, m_new, l * alpha + tl.sum(p, axis=1)


@triton.jit(do_not_specialize=["T", "num_splits", "max_blocks"])
def _attention_kernel(Q, KC, VC, TABLE, LENS, CU, O, MP, LP, OP, qk_scale, T, num_splits,
                      sqt, sqh, skb, sks, skh, svb, svs, svh, sot, soh, stb, max_blocks, BLOCK_SIZE, num_blocks,
                      GROUP: tl.constexpr, TOKENS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
                      DIRECT: tl.constexpr, ROWWISE: tl.constexpr):
    """Program (query tile, sequence, KV head x split): keys [split*SPLIT, (split+1)*SPLIT) of one sequence
    against one tile of its new tokens (rows = (token, query head) pairs, as in paged_prefill)."""
    tile = tl.program_id(0)
    seq = tl.program_id(1)
    hk = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    q_start = tl.maximum(tl.load(CU + seq), 0)
    q_end = tl.minimum(tl.load(CU + seq + 1), T)
    q_len = q_end - q_start
    t0 = tile * TOKENS
    if t0 >= q_len:
        return
    ctx = tl.load(LENS + seq)
    r = tl.arange(0, BLOCK_M)
    tok = t0 + r // GROUP
    head = hk * GROUP + r % GROUP
    row_ok = (r < TOKENS * GROUP) & (tok < q_len)
    row_pos = ctx - q_len + tok                       # each row sees keys 0..row_pos
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    q_row = (q_start + tok).to(tl.int64)
    q = tl.load(Q + q_row[:, None] * sqt + head[:, None] * sqh + dims[None, :],
                mask=row_ok[:, None] & dmask[None, :], other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    last_tok = tl.minimum(t0 + TOKENS, q_len) - 1
    hi = tl.minimum(ctx - q_len + last_tok + 1, max_blocks * BLOCK_SIZE)   # keys any row of the tile sees
    lo = split * SPLIT
    end = tl.minimum(lo + SPLIT, hi)
    table_row = seq.to(tl.int64) * stb
    for start in tl.range(lo, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        in_k = pos < end
        phys = tl.load(TABLE + table_row + pos // BLOCK_SIZE, mask=in_k, other=0)
        phys = tl.minimum(tl.maximum(phys, 0), num_blocks - 1).to(tl.int64)
        slot = pos % BLOCK_SIZE
        kv_mask = in_k[:, None] & dmask[None, :]
        k = tl.load(KC + phys[:, None] * skb + slot[:, None] * sks + hk * skh + dims[None, :], mask=kv_mask, other=0.0)
        s = _dot(q, tl.trans(k), IEEE, ROWWISE)
        # one arithmetic for every tile: scale, then mask (a fully masked tile adds exact zeros, rescales by 1)
        s = tl.where(in_k[None, :] & (pos[None, :] <= row_pos[:, None]), s * qk_scale, float("-inf"))
        p, alpha, m_new, l = _step(s, m, l)
        v = tl.load(VC + phys[:, None] * svb + slot[:, None] * svs + hk * svh + dims[None, :], mask=kv_mask, other=0.0)
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE, ROWWISE)
        m = m_new
    if DIRECT:   # one split: normalize here (what the merge of one piece gives, bit for bit)
        o = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(O + q_row[:, None] * sot + head[:, None] * soh + dims[None, :], o.to(O.dtype.element_ty),
                 mask=row_ok[:, None] & dmask[None, :])
    else:        # partials (T, Hq, num_splits) and (T, Hq, num_splits, BLOCK_D); an empty split stores -inf, 0, 0
        part = (q_row * (GROUP * (tl.num_programs(2) // num_splits)) + head) * num_splits + split
        tl.store(MP + part, m, mask=row_ok)
        tl.store(LP + part, l, mask=row_ok)
        tl.store(OP + part[:, None] * BLOCK_D + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _merge_kernel(MP, LP, OP, O, num_splits, sot, soh, Hq, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (row, query head): the splits merged one after another, in order; a split past the row's
    keys (m = -inf) is an exact no-op (weight 0, rescale 1)."""
    row = tl.program_id(0).to(tl.int64)
    t = row // Hq
    h = row % Hq
    dims = tl.arange(0, BLOCK_D)
    m = tl.load(MP + row * num_splits)       # split 0 as it is (what merging it into nothing gives, exactly)
    l = tl.load(LP + row * num_splits)
    acc = tl.load(OP + row * num_splits * BLOCK_D + dims)
    for s in range(1, num_splits):
        m_s = tl.load(MP + row * num_splits + s)
        l_s = tl.load(LP + row * num_splits + s)
        o_s = tl.load(OP + (row * num_splits + s) * BLOCK_D + dims)
        m_new = tl.maximum(m, m_s)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.where(m_new == m, 1.0, tl.exp2(m - shift))          # exactly 1 where the maximum stays
        b = tl.where(m_s == float("-inf"), 0.0, tl.exp2(m_s - shift))
        acc = acc * a + o_s * b
        l = l * a + l_s * b
        m = m_new
    o = acc / tl.where(l > 0, l, 1.0)
    tl.store(O + t * sot + h * soh + dims, o.to(O.dtype.element_ty), mask=dims < HEAD_DIM)


def attention_bi(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale: float | None = None,
                 validate: bool = True, max_seqlen_q: int | None = None) -> torch.Tensor:
    """Causal attention of a ragged batch against a paged cache, batch-invariant; the signature and layout of
    ``minillm.kernels.paged_prefill.paged_varlen_attention`` (without its ``config``): q (T, Hq, D), caches
    (num_blocks, block_size, Hkv, D), block_tables (S, max_blocks) int32, context_lens (S,) int32,
    cu_seqlens_q (S+1,) int32. Decodes are sequences with one new token. ``validate=False`` reads nothing back
    to the host (CUDA graphs); ``max_seqlen_q`` then defaults to T - S + 1."""
    T, S, Hq, Hkv, D, block_size, num_blocks, max_seqlen_q = varlen_dims(
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, validate, max_seqlen_q)
    out = torch.empty((T, Hq, D), device=q.device, dtype=q.dtype)
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    group = Hq // Hkv
    bm, bn, split, warps, stages = attention_config(q.dtype, group)
    block_d = max(16, next_power_of_2(D))
    splits = cdiv(block_tables.shape[1] * block_size, split)   # from the table's capacity: no host read
    q, k_cache, v_cache, block_tables = last_dim_contiguous(q, k_cache, v_cache, block_tables)
    direct = splits == 1
    if direct:
        mp = lp = op = out
    else:
        mp = torch.empty((T, Hq, splits), device=q.device, dtype=torch.float32)
        lp = torch.empty_like(mp)
        op = torch.empty((T, Hq, splits, block_d), device=q.device, dtype=torch.float32)
    tokens = bm // group
    _attention_kernel[(cdiv(max_seqlen_q, tokens), S, Hkv * splits)](
        q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, out, mp, lp, op, scale * LOG2E, T, splits,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], out.stride(0), out.stride(1),
        block_tables.stride(0), block_tables.shape[1], block_size, num_blocks,
        GROUP=group, TOKENS=tokens, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, SPLIT=split,
        IEEE=q.dtype == torch.float32, DIRECT=direct, ROWWISE=INTERPRETED, num_warps=warps, num_stages=stages)
    if not direct:
        _merge_kernel[(T * Hq,)](mp, lp, op, out, splits, out.stride(0), out.stride(1), Hq, HEAD_DIM=D,
                                 BLOCK_D=block_d, num_warps=1 if INTERPRETED else 4)
    return out
