"""Chapter 5: three softmaxes and the merge that makes attention streamable.

* ``softmax``       the definition, exp(x) / sum(exp(x)); overflows for large inputs.
* ``safe_softmax``  three passes: find the max m, sum exp(x - m), then divide exp(x - m) by that sum.
* ``online_softmax`` finds m and the normalizer l in ONE pass over tiles, rescaling
  the running sum whenever the running max grows: l <- l * exp(m_old - m_new) + sum(exp(tile - m_new));
  a second pass then writes exp(x - m) / l.

The same rescaling merges any two partial results of attention computed over
disjoint sets of keys. A partial is (m, l, o): the max score, the sum of
exp(score - m), and the *unnormalized* output sum(exp(score - m) * v). Merging is
associative and commutative up to rounding, so keys can be split any way, processed in any
order (or on different GPUs, as split-K decoding does), and combined into the same result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .numerics import exp, log  # exp/log rounded once to the input's precision: the same on every CPU


def _as_float(x) -> np.ndarray:
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"softmax needs a floating-point array, got dtype {x.dtype}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"softmax needs a non-empty last axis, got shape {x.shape}")
    return x


def softmax(x) -> np.ndarray:
    """The textbook formula. exp overflows to inf beyond ~88 in float32 (and ~11 in float16)."""
    x = _as_float(x)
    e = exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def safe_softmax(x) -> np.ndarray:
    """Three passes over the row: the max, the sum of the shifted exponentials, the division. Never overflows."""
    x = _as_float(x)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # an all -inf row stays all zeros instead of NaN
    e = exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def online_max_and_normalizer(x, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """One pass over tiles of the last axis: the running (m, l) of the online algorithm."""
    # BEGIN SOLUTION
    x = _as_float(x)
    if int(tile) < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    acc = np.result_type(x.dtype, np.float32)  # accumulate in at least fp32, as kernels do
    m = np.full(x.shape[:-1], -np.inf, acc)
    l = np.zeros(x.shape[:-1], acc)
    for start in range(0, x.shape[-1], tile):
        block = x[..., start:start + tile].astype(acc)
        m_new = np.maximum(m, block.max(axis=-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        # exp(m_old - m_new) rescales everything summed so far to the new reference point
        l = l * exp(np.where(np.isfinite(m), m - safe, -np.inf)) + exp(block - safe[..., None]).sum(axis=-1)
        m = m_new
    return m, l
    # END SOLUTION


def online_softmax(x, tile: int = 4) -> np.ndarray:
    """Softmax whose statistics come from one streaming pass over ``tile``-wide blocks."""
    x = _as_float(x)
    m, l = online_max_and_normalizer(x, tile)
    safe = np.where(np.isfinite(m), m, 0.0)[..., None]
    p = exp(x.astype(l.dtype) - safe) / np.where(l > 0, l, 1.0)[..., None]
    return p.astype(x.dtype, copy=False)


def logsumexp_online(x, tile: int = 4) -> np.ndarray:
    """log(sum(exp(x))) in one pass: m + log(l). The same trick, applied to a reduction."""
    m, l = online_max_and_normalizer(x, tile)
    with np.errstate(divide="ignore"):
        return np.where(l > 0, m + log(l), -np.inf)


@dataclass(frozen=True)
class Partial:
    """Attention over a subset of keys, before normalization.

    m: (...,) max score; l: (...,) sum of exp(score - m); o: (..., D) sum of exp(score - m) * v.
    """

    m: np.ndarray
    l: np.ndarray
    o: np.ndarray

    def finalize(self) -> np.ndarray:
        """The attention output: o / l (rows that saw no key give zeros)."""
        return self.o / np.where(self.l > 0, self.l, 1.0)[..., None]

    def lse(self) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.where(self.l > 0, self.m + log(np.where(self.l > 0, self.l, 1.0)), -np.inf)


def partial_attention(scores, v) -> Partial:
    """The (m, l, o) partial of one block: scores (..., Nk), v (Nk, D) or (..., Nk, D)."""
    s = np.asarray(scores)
    s = s.astype(np.float64 if s.dtype == np.float64 else np.float32, copy=False)  # fp64 stays fp64, else fp32
    m = s.max(axis=-1)
    safe = np.where(np.isfinite(m), m, 0.0)
    p = exp(s - safe[..., None])
    return Partial(m, p.sum(axis=-1), (p[..., None, :] @ np.asarray(v, s.dtype))[..., 0, :])


def merge(a: Partial, b: Partial) -> Partial:
    """Combine two partials over disjoint key sets. Associative and commutative up to rounding: another order
    can change the result's last bits."""
    # BEGIN SOLUTION
    m = np.maximum(a.m, b.m)
    safe = np.where(np.isfinite(m), m, 0.0)
    wa = np.where(np.isfinite(a.m), exp(a.m - safe), 0.0)
    wb = np.where(np.isfinite(b.m), exp(b.m - safe), 0.0)
    return Partial(m, a.l * wa + b.l * wb, a.o * wa[..., None] + b.o * wb[..., None])
    # END SOLUTION
