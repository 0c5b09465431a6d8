"""Samplers: turn one row of logits into a token id (chapter 1)."""
from __future__ import annotations

import numpy as np


def greedy(logits: np.ndarray) -> int:
    """Pick the most likely token (ties go to the lowest id)."""
    return int(np.argmax(logits))


class TemperatureSampler:
    """Sample from softmax(logits / temperature), optionally restricted to the top-k ids.

    Carries its own seeded generator so a run is reproducible.
    """

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, seed: int = 0):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy for argmax), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.temperature, self.top_k = float(temperature), top_k
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        z = shape_logits(np.asarray(logits)[None], self.temperature, self.top_k)[0]   # the engine's shaping
        p = np.exp(z - z.max())
        return int(self.rng.choice(z.size, p=p / p.sum()))


# --------------------------------------------------------------------------- batched, seeded sampling (engine)
#
# The serving engine samples a whole batch at once, and a request with a seed must get the same tokens
# whatever else shares its batch. So the randomness is not drawn from a generator whose state depends on
# the batch: the uniform for (seed, step, token id) is a fixed hash of those three numbers, and the draw is
# Gumbel-max: argmax(z + g) with g = -log(-log u) picks token i with probability softmax(z)_i. The same
# hash runs in torch on the GPU (minillm.serving.torch_runner), with no host sync per row.

_M32 = 0xFFFFFFFF


def mix32(x):
    """A 32-bit integer hash (the "lowbias32" finalizer) on uint64/int64 arrays holding values < 2**32."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seed: np.ndarray, step: np.ndarray, vocab_size: int) -> np.ndarray:
    """Uniforms in (0, 1), shape (S, V): a fixed function of (seed[s], step[s], token id)."""
    seed = np.asarray(seed, np.uint64)[:, None] & np.uint64(_M32)
    step = np.asarray(step, np.uint64)[:, None] & np.uint64(_M32)
    ids = np.arange(vocab_size, dtype=np.uint64)[None, :]
    h = mix32(mix32(mix32(seed ^ np.uint64(0x9E3779B9)) ^ step) ^ ids)
    h = mix32(h ^ (seed * np.uint64(0x85EBCA6B) & np.uint64(_M32)))
    return (h.astype(np.float64) + 0.5) / 2.0**32


def shape_logits(logits: np.ndarray, temperature, top_k=None, top_p=None) -> np.ndarray:
    """Scaled logits with the tokens outside top-k / top-p set to -inf; rows are sequences.

    ``temperature``, ``top_k`` (0 or None: off) and ``top_p`` (1 or None: off) are scalars or one value per
    row. Top-p keeps the smallest set of most likely tokens whose probability reaches top_p (at least one).
    This is the one place where p is shaped: the engine and speculative decoding both call it.
    """
    z = np.atleast_2d(np.asarray(logits, np.float64))
    S, V = z.shape
    t = np.broadcast_to(np.asarray(temperature, np.float64), (S,))
    if (t <= 0).any():
        raise ValueError("shape_logits needs temperature > 0 (temperature 0 is greedy: take the argmax)")
    z = z / t[:, None]
    if top_k is not None:
        k = np.broadcast_to(np.asarray(top_k, np.int64), (S,))
        k = np.where((k <= 0) | (k >= V), V, k)
        kth = np.take_along_axis(-np.sort(-z, axis=1), (k - 1)[:, None], axis=1)
        z = np.where(z >= kth, z, -np.inf)
    if top_p is not None:
        p_cut = np.broadcast_to(np.asarray(top_p, np.float64), (S,))
        order = np.argsort(-z, axis=1, kind="stable")
        zs = np.take_along_axis(z, order, axis=1)
        ps = np.exp(zs - zs[:, :1])
        ps /= ps.sum(axis=1, keepdims=True)
        before = np.cumsum(ps, axis=1) - ps            # mass of the strictly more likely tokens
        drop_sorted = (before >= p_cut[:, None]) & (p_cut[:, None] < 1)
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=1)
        z = np.where(drop, -np.inf, z)
    return z


def sample_batch(logits: np.ndarray, temperature, top_k, top_p, seeds, steps) -> np.ndarray:
    """One token per row: argmax where temperature is 0, else a seeded Gumbel-max draw from shape_logits."""
    z = np.atleast_2d(np.asarray(logits, np.float64))
    t = np.broadcast_to(np.asarray(temperature, np.float64), (z.shape[0],))
    out = np.argmax(z, axis=1)
    hot = np.flatnonzero(t > 0)
    if hot.size:
        pick = lambda a: None if a is None else np.broadcast_to(np.asarray(a), (z.shape[0],))[hot]  # noqa: E731
        zh = shape_logits(z[hot], t[hot], pick(top_k), pick(top_p))
        u = counter_uniform(pick(seeds), pick(steps), z.shape[1])
        out[hot] = np.argmax(zh - np.log(-np.log(u)), axis=1)
    return out.astype(np.int64)
