"""Batch invariance in NumPy (chapter 11): why a row's result can depend on the rest of the batch, and
references whose per-row results cannot.

Floating-point addition is not associative: ``(a + b) + c`` and ``a + (b + c)`` round at different
places, so a sum's bits depend on the order of its additions. A kernel is deterministic (the same
inputs give the same bits), but the order it adds in can depend on the *shape* of the call: a matmul
library picks its tiles and whether to split the reduction by the number of rows M; a split-K
attention kernel picks how many pieces to cut a row's keys into by the batch size; a reduction picks
how many threads share a row by the number of rows. The same row then rounds differently alone and
inside a batch: the engine is deterministic but not **batch-invariant**.

A kernel is batch-invariant when each row's result is a function of that row's inputs alone. The
recipe: fix each row's reduction order whatever the batch --

* matmul: fixed tiles, the K dimension walked tile after tile in one order, never split across
  programs (:func:`matmul_reference`);
* RMSNorm: one row's sum of squares in a fixed order (:func:`rmsnorm_reference`);
* attention: cut a row's keys at a fixed split SIZE (multiples of ``split_size`` tokens), never a
  fixed split COUNT, and merge the pieces in order (:func:`attention_reference`); decode, verify and
  prefill rows all take this one path.

The references have the signatures and layouts of the Triton kernels in
``minillm.kernels.batch_invariant`` (weights (in, out), applied as ``x @ w``; the paged varlen layout of
``minillm.paged.attention``). They need NumPy only. bfloat16 has no NumPy dtype: :func:`to_bfloat16`
rounds float32 values to it (round to nearest even), which is what a GPU's conversion does.
"""
from __future__ import annotations

import math

import numpy as np

from .paged.attention import check_varlen_inputs, gather_kv

MATMUL_BLOCK_K = 64      # the reference's K tile (any fixed value gives a batch-invariant order)
RMSNORM_BLOCK = 256      # elements of a row summed per step
SPLIT_SIZE = 64          # keys per attention split


# ---- rounding and addition order -------------------------------------------------------------------------
def to_bfloat16(x) -> np.ndarray:
    """float32 values rounded to bfloat16 (8 significand bits, float32's exponent range), round to nearest
    even, returned as float32. NaN stays NaN."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


def round_to(x, dtype: str) -> np.ndarray:
    """``x`` rounded to "float16", "bfloat16", "float32" or "float64" (bfloat16 held in float32)."""
    if dtype == "bfloat16":
        return to_bfloat16(np.asarray(x, np.float64).astype(np.float32))
    return np.asarray(x).astype(dtype)


def add(a, b, dtype: str):
    """a + b rounded to ``dtype``: the exact sum (float64 holds it exactly for these formats), rounded once,
    as the hardware's adder does."""
    return round_to(np.float64(a) + np.float64(b), dtype)[()]


def sum_in_order(values, dtype: str = "float32", order=None):
    """Left-to-right sum of ``values`` (in ``order``, a permutation, if given), every partial sum rounded to
    ``dtype``: one addition order, made explicit."""
    v = np.asarray(values, np.float64).ravel()
    if order is not None:
        v = v[np.asarray(order)]
    acc = round_to(0.0, dtype)[()]
    for x in round_to(v, dtype):
        acc = add(acc, x, dtype)
    return acc


def split_sum(values, bounds, dtype: str = "float32"):
    """Sum each piece ``values[bounds[i]:bounds[i+1]]`` left to right, then the pieces' sums left to right:
    how a split-K reduction adds (every partial rounded to ``dtype``)."""
    parts = [sum_in_order(values[lo:hi], dtype) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return sum_in_order(parts, dtype)


def addition_order_examples() -> list[dict]:
    """Three computed cases where the order of the same additions changes the result.

    float16 (11 significand bits): 1 + 2^-11 is exactly halfway between 1 and the next float16, 1 + 2^-10,
    and rounds to even, back to 1; so (1 + 2^-11) + 2^-11 = 1, while 1 + (2^-11 + 2^-11) = 1 + 2^-10.
    bfloat16 (8 bits) does the same at 2^-8. float32: 2^24 + 1 rounds to 2^24 (24 bits)."""
    out = []
    for dtype, tiny in (("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8), ("float32", 1.0 / 2 ** 24)):
        a, b, c = 1.0, tiny, tiny
        if dtype == "float32":
            a, b, c = 2.0 ** 24, 1.0, 1.0
        left = add(add(a, b, dtype), c, dtype)
        right = add(a, add(b, c, dtype), dtype)
        out.append(dict(dtype=dtype, a=a, b=b, c=c, left=float(left), right=float(right)))
    return out


def bits_differ(a, b) -> int:
    """How many elements of a and b differ in their bits (NaNs with the same bits count as equal)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"compare arrays of one shape and dtype, got {a.shape} {a.dtype} and {b.shape} {b.dtype}")
    ua = a.view(f"u{a.dtype.itemsize}")
    return int((ua != b.view(f"u{b.dtype.itemsize}")).sum())


# ---- split plans: by count (depends on the batch) or by size (does not) ----------------------------------
def split_bounds_by_count(n: int, splits: int, tile: int = 1) -> list[int]:
    """Boundaries of ``n`` keys cut into ``splits`` pieces, each rounded up to whole tiles (the paged decode
    kernel's ``split_plan``): where the cuts fall depends on ``splits``."""
    size = -(-(-(-n // splits)) // tile) * tile
    return split_bounds_by_size(n, size)


def split_bounds_by_size(n: int, size: int) -> list[int]:
    """Boundaries of ``n`` keys cut every ``size`` keys: 0, size, 2*size, ..., n. The cuts of key position p
    are the same whatever else is in the batch."""
    # BEGIN SOLUTION
    if size < 1:
        raise ValueError(f"split size must be >= 1, got {size}")
    return list(range(0, n, size)) + [n] if n else [0, 0]
    # END SOLUTION


def gpu_split_count(batch: int, hkv: int, max_len: int, sms: int) -> int:
    """The paged decode kernel's default split count on a GPU with ``sms`` SMs (``default_splits`` of
    ``minillm.kernels.paged_attention``): as many splits as fill one wave of ~4 programs per SM. It falls as
    the batch grows, so a sequence's keys are cut at different places alone and in a batch."""
    return max(1, min((4 * sms) // (batch * hkv), math.ceil(max_len / 64), 128))


# ---- references ------------------------------------------------------------------------------------------
def matmul_reference(x, w, block_k: int = MATMUL_BLOCK_K) -> np.ndarray:
    """x @ w (x (M, K), w (K, N)) with a float32 accumulator that takes one K tile of ``block_k`` at a time,
    in order: acc = fl32(acc + fl32(x[:, tile] @ w[tile, :])). Each tile's product is computed in float64 and
    rounded once, so no library's choice of order (which may depend on M) reaches the result: row i's bits
    depend on row i of x and on w only (up to float64's own last bit, which survives the rounding to float32
    only in vanishingly rare ties). Returns x's dtype."""
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f"x must be (M, K) and w (K, N), got {x.shape} and {w.shape}")
    acc_t = np.result_type(np.float32, x.dtype)
    acc = np.zeros((x.shape[0], w.shape[1]), acc_t)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for k0 in range(0, x.shape[1], block_k):
        acc = (acc + (x64[:, k0:k0 + block_k] @ w64[k0:k0 + block_k]).astype(acc_t)).astype(acc_t)
    return acc.astype(x.dtype)


def rmsnorm_reference(x, w, eps: float = 1e-5, block: int = RMSNORM_BLOCK) -> np.ndarray:
    """RMSNorm of each row of x (R, D): the sum of squares in float32, ``block`` elements at a time in order
    (each block's sum in float64, rounded once), then (x / rms) rounded to x's dtype, times w -- the torch
    model's ``rms_norm``. Row r's bits depend on row r only."""
    # BEGIN SOLUTION
    x, w = np.asarray(x), np.asarray(w)
    acc_t = np.result_type(np.float32, x.dtype)
    xf = x.astype(acc_t)
    ss = np.zeros(x.shape[:-1], acc_t)
    for d0 in range(0, x.shape[-1], block):
        ss = (ss + (xf[..., d0:d0 + block].astype(np.float64) ** 2).sum(-1).astype(acc_t)).astype(acc_t)
    r = (1.0 / np.sqrt(ss.astype(np.float64) / x.shape[-1] + eps)).astype(acc_t)
    y = (xf * r[..., None]).astype(x.dtype)
    return (y.astype(acc_t) * w.astype(acc_t)).astype(x.dtype)
    # END SOLUTION


def attend_pieces(q, k, v, bounds, scale, acc_t):
    """One query row group (G, D) against keys (n, D) cut at ``bounds``: each piece's partial (m, l, o) in
    ``acc_t`` (computed in float64, rounded once), merged left to right through their maxima -- the merge of
    chapter 5. Pieces past the last visible key are empty and weigh nothing."""
    # BEGIN SOLUTION
    G = q.shape[0]
    m = np.full(G, -np.inf, acc_t)
    l = np.zeros(G, acc_t)
    o = np.zeros((G, v.shape[1]), acc_t)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi <= lo:
            continue
        s = (q.astype(np.float64) @ k[lo:hi].astype(np.float64).T) * scale
        m_p = s.max(-1)
        p = np.exp(s - m_p[:, None])
        l_p, o_p = p.sum(-1).astype(acc_t), (p @ v[lo:hi].astype(np.float64)).astype(acc_t)
        m_p = m_p.astype(acc_t)
        m_new = np.maximum(m, m_p)
        a = np.exp(m.astype(np.float64) - m_new).astype(acc_t)       # exp(-inf) = 0: nothing merged yet
        b = np.exp(m_p.astype(np.float64) - m_new).astype(acc_t)
        o = (o * a[:, None] + o_p * b[:, None]).astype(acc_t)
        l = (l * a + l_p * b).astype(acc_t)
        m = m_new
    return o / l[:, None]
    # END SOLUTION


def attention_reference(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q, scale: float | None = None,
                        validate: bool = True, split_size: int | None = SPLIT_SIZE,
                        num_splits: int | None = None, tile: int = 1) -> np.ndarray:
    """Causal attention of a ragged batch against a paged cache (``minillm.paged.attention``'s varlen layout:
    q (T, Hq, D), caches (num_blocks, block_size, Hkv, D), tables (S, max_blocks), context_lens (S,),
    cu_seqlens_q (S+1,)), each row's visible keys cut into pieces and merged in order.

    ``split_size`` (the default): cuts at multiples of ``split_size`` key positions, so a row's pieces are the
    same whether it is a decode, a verify row or a prefill row, alone or in any batch. ``num_splits`` (with
    ``split_size=None``): each sequence's context cut into that many pieces, as a split-K decode kernel does
    with a count it picks from the batch; a different count cuts the same row elsewhere. ``tile`` (with
    ``num_splits`` only): each piece rounded up to whole tiles of that many keys, as the decode kernel's
    ``split_plan`` does (:func:`split_bounds_by_count`); the default 1 cuts at ceil(n / num_splits)."""
    if (split_size is None) == (num_splits is None):
        raise ValueError("pass exactly one of split_size and num_splits")
    T, S, Hq, Hkv, D, _, _ = check_varlen_inputs(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q,
                                                 check_table=validate)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    acc_t = np.result_type(np.float32, q.dtype)
    group = Hq // Hkv
    out = np.empty((T, Hq, D), acc_t)
    cu = np.asarray(cu_seqlens_q)
    for s in range(S):
        lo, hi, n = int(cu[s]), int(cu[s + 1]), int(context_lens[s])
        k, v = gather_kv(k_cache, v_cache, block_tables, n, s)
        bounds = (split_bounds_by_size(n, split_size) if split_size
                  else split_bounds_by_count(n, num_splits, tile=tile))
        for t in range(lo, hi):
            pos = n - (hi - t)                                   # this row sees keys 0..pos
            cut = [min(b, pos + 1) for b in bounds]
            for h in range(Hkv):
                rows = slice(h * group, (h + 1) * group)
                out[t, rows] = attend_pieces(q[t, rows], k[:, h], v[:, h], cut, scale, acc_t)
    return out.astype(q.dtype, copy=False)


def row_alone_vs_batched(fn, rows, row: int, *args):
    """(alone, batched): ``fn`` on ``rows[row:row+1]`` and row ``row`` of ``fn`` on all ``rows`` (extra
    positional ``args`` passed after the rows): the two results a batch-invariant ``fn`` gives bit-identically."""
    rows = np.asarray(rows)
    return fn(rows[row:row + 1], *args)[0], fn(rows, *args)[row]
