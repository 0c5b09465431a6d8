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
    """Validate shapes for the shared layout; return (B, Hq, Hkv, Nq, Nk, D)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 4:
            raise ValueError(f"{name} must be 4-D (B, H, N, D), got shape {getattr(x, 'shape', None)}")
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
