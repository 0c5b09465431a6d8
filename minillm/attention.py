"""Attention references in NumPy.

Layout (shared by every attention function and kernel in minillm, and equal to
torch's scaled_dot_product_attention):

    q: (B, Hq, Nq, D)      k, v: (B, Hkv, Nk, D)      Hq % Hkv == 0   (GQA)

With ``causal=True`` the mask is aligned to the *bottom right*: query row i may
see key j when ``j <= i + Nk - Nq``. That is the rule that makes one function
serve both prefill (Nq == Nk) and decoding against a cache (Nq == 1 sees every
cached key). Rows that can see no key at all return zeros.
"""
from __future__ import annotations

import numpy as np


def check_attention_inputs(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Validate shapes and dtypes for the shared layout; return (B, Hq, Hkv, Nq, Nk, D).

    q, k, v must be floating point (NumPy or torch): integer inputs would be cast back to an integer output.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {getattr(x, 'shape', None)}")
        dt = x.dtype
        floating = getattr(dt, "is_floating_point", None)     # torch dtypes say so themselves
        if floating is None:
            floating = np.issubdtype(np.dtype(dt), np.floating)
        if not floating:
            raise ValueError(f"{name} must have a floating-point dtype, got {dt}")
    B, Hq, Nq, D = q.shape
    Bk, Hkv, Nk, Dk = k.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B or Dk != D:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head dim")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if min(B, Hq, Nq, Nk, D) < 1:
        raise ValueError(f"empty dimension in q {tuple(q.shape)} / k {tuple(k.shape)}")
    return B, Hq, Hkv, Nq, Nk, D


def causal_mask(nq: int, nk: int) -> np.ndarray:
    """Boolean (nq, nk) array, True where query i may attend to key j (bottom-right aligned)."""
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    return j <= i + (nk - nq)


def _compute_dtype(*arrays) -> np.dtype:
    # fp16/bf16-like inputs are computed in fp32; fp64 stays fp64 (the gold reference).
    return np.result_type(np.float32, *[a.dtype for a in arrays])


def standard_attention(q, k, v, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """softmax(q k^T * scale) v, materializing the full (Nq, Nk) score matrix.

    This is the textbook algorithm: S and P are whole arrays in memory. Later
    chapters replace it with tiled versions that never build S.
    """
    B, Hq, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    ct = _compute_dtype(q, k, v)
    group = Hq // Hkv
    # GQA without copying K/V: view the query heads as (Hkv, group) and broadcast.
    qg = q.astype(ct, copy=False).reshape(B, Hkv, group, Nq, D)
    kt = k.astype(ct, copy=False)[:, :, None].swapaxes(-1, -2)  # (B, Hkv, 1, D, Nk)
    s = (qg @ kt) * ct.type(scale)                                 # (B, Hkv, group, Nq, Nk)
    if causal:
        s = np.where(causal_mask(Nq, Nk), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)          # fully masked rows: avoid inf - inf
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    o = (p @ v.astype(ct, copy=False)[:, :, None]) / np.where(l > 0, l, 1.0)
    return o.reshape(B, Hq, Nq, D).astype(q.dtype, copy=False)


def _tile_mask(i0: int, i1: int, j0: int, j1: int, nq: int, nk: int) -> np.ndarray:
    """Bottom-right causal mask for the tile of query rows [i0, i1) and key columns [j0, j1)."""
    return (np.arange(j0, j1)[None, :] <= np.arange(i0, i1)[:, None] + (nk - nq))


TILE_SKIPPED, TILE_FULL, TILE_MASKED = 0, 1, 2


def tile_plan(nq: int, nk: int, block_m: int, block_n: int, causal: bool) -> np.ndarray:
    """What the Triton forward kernel does with each (query tile, key tile) pair: an int array of shape
    (ceil(nq / block_m), ceil(nk / block_n)) holding ``TILE_FULL`` (computed with no mask),
    ``TILE_MASKED`` (computed with the causal / ragged-edge mask) or ``TILE_SKIPPED`` (never loaded).

    The bounds are the kernel's: key tiles left of ``full`` are valid for every row of the query tile, the
    loop stops at ``hi`` (the causal diagonal, bottom-right aligned), and the tiles in between are masked.
    """
    for name, val in (("nq", nq), ("nk", nk), ("block_m", block_m), ("block_n", block_n)):
        if not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val!r}")
    n_m, n_n = -(-nq // block_m), -(-nk // block_n)
    plan = np.full((n_m, n_n), TILE_SKIPPED, dtype=np.int8)
    offset = nk - nq
    for pid_m in range(n_m):
        full, hi = (nk // block_n) * block_n, nk
        if causal:
            hi = min(nk, (pid_m + 1) * block_m + offset)
            first_row_sees = max(pid_m * block_m + offset + 1, 0)
            full = min(full, (first_row_sees // block_n) * block_n)
        for j in range(n_n):
            start = j * block_n
            if start < full:
                plan[pid_m, j] = TILE_FULL
            elif start < hi:
                plan[pid_m, j] = TILE_MASKED
    return plan


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, block_m: int = 64,
                    block_n: int = 64, return_lse: bool = False):
    """Tiled attention with a running (m, l): the FlashAttention forward, in NumPy.

    Never builds an (Nq, Nk) array: the largest temporary is one (block_m, block_n)
    score tile per (batch, head). Vectorized over batch and heads, so N = 4096 runs
    on a laptop. Returns o (and the log-sum-exp per row, for the backward pass).
    """
    # BEGIN SOLUTION
    B, Hq, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    if int(block_m) < 1 or int(block_n) < 1:
        raise ValueError(f"block sizes must be >= 1, got {block_m}, {block_n}")
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    ct = _compute_dtype(q, k, v)
    g = Hq // Hkv
    qg = q.astype(ct, copy=False).reshape(B, Hkv, g, Nq, D)
    kc, vc = k.astype(ct, copy=False)[:, :, None], v.astype(ct, copy=False)[:, :, None]  # (B, Hkv, 1, Nk, D)
    o = np.empty((B, Hkv, g, Nq, D), ct)
    lse = np.empty((B, Hkv, g, Nq), ct)
    for i0 in range(0, Nq, block_m):
        i1 = min(i0 + block_m, Nq)
        qi = qg[:, :, :, i0:i1] * ct.type(scale)
        m = np.full(qi.shape[:-1], -np.inf, ct)
        l = np.zeros(qi.shape[:-1], ct)
        acc = np.zeros(qi.shape, ct)
        # with a causal mask, key tiles to the right of the last visible key are skipped entirely
        j_end = min(Nk, i1 + Nk - Nq) if causal else Nk
        for j0 in range(0, max(j_end, 0), block_n):
            j1 = min(j0 + block_n, Nk)
            s = qi @ kc[:, :, :, j0:j1].swapaxes(-1, -2)  # (B, Hkv, g, bm, bn): one tile, on "chip"
            if causal:
                s = np.where(_tile_mask(i0, i1, j0, j1, Nq, Nk), s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            safe = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha = np.where(np.isfinite(m), np.exp(m - safe), 0.0)  # rescale what was accumulated
            p = np.exp(s - safe[..., None])
            l = l * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ vc[:, :, :, j0:j1]
            m = m_new
        o[:, :, :, i0:i1] = acc / np.where(l > 0, l, 1.0)[..., None]
        with np.errstate(divide="ignore"):
            lse[:, :, :, i0:i1] = np.where(l > 0, m + np.log(np.where(l > 0, l, 1.0)), -np.inf)
    o = o.reshape(B, Hq, Nq, D).astype(q.dtype, copy=False)
    return (o, lse.reshape(B, Hq, Nq)) if return_lse else o
    # END SOLUTION


def flash_attention_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                             block_m: int = 64, block_n: int = 64):
    """dQ, dK, dV by recomputing each probability tile from q, k and the saved log-sum-exp.

    P is never stored: p = exp(q k^T * scale - lse) is rebuilt tile by tile. With
    delta = rowsum(dO * O): dV = P^T dO, dP = dO V^T, dS = P * (dP - delta),
    dQ = dS K * scale, dK = dS^T Q * scale. GQA heads sum into their shared K/V head.
    """
    # BEGIN SOLUTION
    B, Hq, Hkv, Nq, Nk, D = check_attention_inputs(q, k, v)
    for name, x, shape in (("o", o, q.shape), ("do", do, q.shape), ("lse", lse, q.shape[:3])):
        if tuple(np.shape(x)) != tuple(shape):
            raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(np.shape(x))}")
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    ct = _compute_dtype(q, k, v)
    g = Hq // Hkv
    qg = q.astype(ct).reshape(B, Hkv, g, Nq, D)
    dog = do.astype(ct).reshape(B, Hkv, g, Nq, D)
    lseg = lse.astype(ct).reshape(B, Hkv, g, Nq)
    delta = (dog * o.astype(ct).reshape(B, Hkv, g, Nq, D)).sum(-1)
    kc, vc = k.astype(ct)[:, :, None], v.astype(ct)[:, :, None]
    dq = np.zeros_like(qg)
    dk = np.zeros((B, Hkv, g, Nk, D), ct)
    dv = np.zeros((B, Hkv, g, Nk, D), ct)
    for i0 in range(0, Nq, block_m):
        i1 = min(i0 + block_m, Nq)
        finite = np.isfinite(lseg[:, :, :, i0:i1])[..., None]
        lse_i = np.where(finite, lseg[:, :, :, i0:i1, None], 0.0)
        for j0 in range(0, Nk, block_n):
            j1 = min(j0 + block_n, Nk)
            s = (qg[:, :, :, i0:i1] @ kc[:, :, :, j0:j1].swapaxes(-1, -2)) * scale
            p = np.where(finite, np.exp(s - lse_i), 0.0)
            if causal:
                p = np.where(_tile_mask(i0, i1, j0, j1, Nq, Nk), p, 0.0)
            dv[:, :, :, j0:j1] += p.swapaxes(-1, -2) @ dog[:, :, :, i0:i1]
            dp = dog[:, :, :, i0:i1] @ vc[:, :, :, j0:j1].swapaxes(-1, -2)
            ds = p * (dp - delta[:, :, :, i0:i1, None])
            dq[:, :, :, i0:i1] += (ds @ kc[:, :, :, j0:j1]) * scale
            dk[:, :, :, j0:j1] += (ds.swapaxes(-1, -2) @ qg[:, :, :, i0:i1]) * scale
    return (dq.reshape(q.shape).astype(q.dtype), dk.sum(2).astype(k.dtype), dv.sum(2).astype(v.dtype))
    # END SOLUTION
