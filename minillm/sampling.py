"""Samplers: turn one row of logits into a token id (chapter 1)."""
from __future__ import annotations

import numpy as np


def greedy(logits: np.ndarray) -> int:
    """Pick the most likely token of one row of logits, shape (V,) (ties go to the lowest id).

    A batch of rows is refused: ``np.argmax`` would return an index into the flattened array, not a token
    id (``sample_batch`` with temperature 0 is the row-wise greedy)."""
    z = np.asarray(logits)
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"greedy takes one row of logits, shape (V,) with V >= 1, got shape {z.shape}")
    return int(np.argmax(z))


class TemperatureSampler:
    """Sample from softmax(logits / temperature), optionally restricted to the top-k ids.

    Carries its own seeded generator so a run is reproducible.
    """

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, seed: int = 0):
        if not np.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0 (use greedy for argmax), got {temperature}")
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
# hash runs in torch on the GPU (minillm.torch_sampling), with no host sync per row.

_M32 = 0xFFFFFFFF
SEED_LIMIT = _M32 + 1  # seeds (and steps) are hashed as 32-bit integers: they must lie in [0, SEED_LIMIT)


def mix32(x):
    """A 32-bit integer hash (the "lowbias32" finalizer) on uint64/int64 arrays holding values < 2**32."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seed: np.ndarray, step: np.ndarray, vocab_size: int) -> np.ndarray:
    """Uniforms in (0, 1), shape (S, V): a fixed function of (seed[s], step[s], token id).

    Seeds and steps are hashed as 32-bit integers, so both must lie in [0, 2**32): a larger seed would
    silently give the same draws as seed mod 2**32, and is refused instead."""
    seed, step = np.asarray(seed), np.asarray(step)
    for name, a in (("seed", seed), ("step", step)):
        if a.size and (a.min() < 0 or a.max() >= SEED_LIMIT):
            raise ValueError(f"counter_uniform hashes 32-bit integers: every {name} must lie in [0, 2**32), "
                             f"got values in [{a.min()}, {a.max()}]")
    seed = seed.astype(np.uint64)[:, None]
    step = step.astype(np.uint64)[:, None]
    ids = np.arange(vocab_size, dtype=np.uint64)[None, :]
    h = mix32(mix32(mix32(seed ^ np.uint64(0x9E3779B9)) ^ step) ^ ids)
    h = mix32(h ^ (seed * np.uint64(0x85EBCA6B) & np.uint64(_M32)))
    return (h.astype(np.float64) + 0.5) / 2.0**32


def _pick(a, n: int, rows):
    """``a`` (a scalar or one value per row of n) at ``rows``; None stays None (an option that is off)."""
    return None if a is None else np.broadcast_to(np.asarray(a), (n,))[rows]


def _check_temperature(t: np.ndarray, where: str) -> None:
    """Temperatures must be finite and >= 0 (0: greedy): NaN or a negative value would pass ``t > 0`` tests
    as greedy, silently."""
    bad = ~np.isfinite(t) | (t < 0)
    if bad.any():
        raise ValueError(f"{where} needs every temperature finite and >= 0 (0 is greedy), got {t[bad][0]!r}")


def shape_logits(logits: np.ndarray, temperature, top_k=None, top_p=None) -> np.ndarray:
    """Scaled logits with the tokens outside top-k / top-p set to -inf; rows are sequences.

    ``temperature``, ``top_k`` (0 or None: off) and ``top_p`` (1 or None: off) are scalars or one value per
    row. Top-p keeps the smallest set of most likely tokens whose probability reaches top_p (at least one).
    A temperature that is not finite and > 0, or a top_p outside (0, 1], raises ValueError.
    This is the one place where p is shaped: the engine and speculative decoding both call it.
    """
    z = np.atleast_2d(np.asarray(logits, np.float64))
    S, V = z.shape
    t = np.broadcast_to(np.asarray(temperature, np.float64), (S,))
    if not (np.isfinite(t) & (t > 0)).all():
        raise ValueError(f"shape_logits needs every temperature finite and > 0 (temperature 0 is greedy: take the "
                         f"argmax), got {t[~(np.isfinite(t) & (t > 0))][0]!r}")
    with np.errstate(over="ignore"):
        scaled = z / t[:, None]
    if np.isinf(scaled).sum() > np.isinf(z).sum():   # a finite logit overflowed: the argmax would be lost
        raise ValueError(f"shape_logits: a temperature of {t.min()!r} overflows logits / temperature; use "
                         f"temperature 0 for greedy decoding")
    z = scaled
    if top_k is not None:
        k = np.broadcast_to(np.asarray(top_k, np.int64), (S,))
        k = np.where((k <= 0) | (k >= V), V, k)
        kth = np.take_along_axis(-np.sort(-z, axis=1), (k - 1)[:, None], axis=1)
        z = np.where(z >= kth, z, -np.inf)
    if top_p is not None:
        p_cut = np.broadcast_to(np.asarray(top_p, np.float64), (S,))
        if not ((p_cut > 0) & (p_cut <= 1)).all():   # also NaN; top_p 0 would drop every token
            raise ValueError(f"shape_logits needs every top_p in (0, 1] (1 or None: off), "
                             f"got {p_cut[~((p_cut > 0) & (p_cut <= 1))][0]!r}")
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
    _check_temperature(t, "sample_batch")
    out = np.argmax(z, axis=1)
    hot = np.flatnonzero(t > 0)
    if hot.size:
        pick = lambda a: _pick(a, z.shape[0], hot)  # noqa: E731
        zh = shape_logits(z[hot], t[hot], pick(top_k), pick(top_p))
        u = counter_uniform(pick(seeds), pick(steps), z.shape[1])
        out[hot] = np.argmax(zh - np.log(-np.log(u)), axis=1)
    return out.astype(np.int64)


# --------------------------------------------------------------------------- speculative verification (engine)
#
# A speculating sequence's draft tokens are checked row by row: row i holds the target's logits after the
# first i drafts. Three independent random streams per request keep the test exact: the drafter samples
# d_i with stream DRAFT, the acceptance test draws its uniform from stream ACCEPT, and a rejected row
# resamples from the residual with stream RESIDUAL. The bonus row (no draft) samples like any other row,
# from the main stream, so a non-speculating engine and a speculating one share it.

DRAFT, ACCEPT, RESIDUAL = 1, 2, 3


def sub_seed(seeds, stream: int):
    """A seed for random stream ``stream`` of each request: a hash of (seed, stream), works on int64 arrays
    (NumPy or torch)."""
    return mix32((seeds & _M32) ^ mix32((0x632BE5AB * stream) & _M32))


def shaped_probs(logits: np.ndarray, temperature, top_k=None, top_p=None) -> np.ndarray:
    """softmax(shape_logits(...)) per row, in float64: the p (or q) that sampling and verification share."""
    z = shape_logits(logits, temperature, top_k, top_p)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def verify_probs(p, q, drafts, u_accept, resample, rows=None):
    """The rejection rule of speculative sampling on probability rows, its randomness supplied by the caller:
    the one implementation behind :func:`verify_batch` (the engine) and :func:`minillm.speculative.verify`
    (chapter 9's batch-1 loop), which differ only in where their uniforms come from.

    ``p`` (P, V) target distributions; ``q`` (P, V) the drafter's, or None for one-hot drafts (prompt
    lookup); ``drafts`` (R,) one draft token per trial, each checked against row ``rows[t]`` of p and q
    (default: trial t against row t); ``u_accept`` (R,) uniforms in [0, 1).

    Trial t keeps its draft d when ``u_accept[t] * q(d) < p(d)``: with probability min(1, p(d) / q(d)), and
    no division, so q(d) = 0 is safe. Otherwise its token is a draw from the residual normalize(max(p - q, 0))
    (for a one-hot draft: p with d removed), which never returns d. The residuals are computed once per
    distinct one (per row; per row and draft token for one-hot drafts), and ``resample(r, group, trials)``
    draws: ``r`` (G, V) the unnormalized residuals, ``group[i]`` the residual of rejected trial ``trials[i]``;
    it returns one token per rejected trial. Returns (accepted (R,) bool, tokens (R,) int64).
    """
    # BEGIN SOLUTION
    p = np.asarray(p, np.float64)
    V = p.shape[1]
    d = np.asarray(drafts, np.int64)
    rows = np.arange(d.size) if rows is None else np.asarray(rows, np.int64)
    if q is not None:
        q = np.asarray(q, np.float64)
    pd = p[rows, d]
    qd = np.ones_like(pd) if q is None else q[rows, d]
    accept = u_accept * qd < pd
    tokens = d.copy()
    trials = np.flatnonzero(~accept)
    if trials.size:
        key = rows[trials] if q is not None else rows[trials] * V + d[trials]
        uniq, group = np.unique(key, return_inverse=True)
        if q is not None:
            r = np.maximum(p[uniq] - q[uniq], 0.0)
        else:
            r = p[uniq // V].copy()
            r[np.arange(uniq.size), uniq % V] = 0.0
        tokens[trials] = resample(r, group.reshape(-1), trials)
    return accept, tokens
    # END SOLUTION


def verify_batch(logits: np.ndarray, drafts, q, temperature, top_k, top_p, seeds, steps) -> np.ndarray:
    """One token per row of target logits, for rows that carry a draft token (``drafts[r] >= 0``) or not.

    * A row without a draft samples as :func:`sample_batch` does.
    * A greedy row returns the target's argmax (the scheduler accepts a draft that equals it).
    * Otherwise the draft d is accepted (the row returns d) with probability min(1, p(d) / q(d)); if it is
      rejected the row returns a sample from normalize(max(p - q, 0)), which never equals d
      (:func:`verify_probs`, with the request's ACCEPT stream for the test and a Gumbel-max draw from its
      RESIDUAL stream). ``q`` holds the drafter's shaped probabilities per row.
    * ``q`` None: drafts without probabilities (prompt lookup), one-hot. Such a row returns its plain sample x
      (what :func:`sample_batch` draws at this (seed, step)), so d is accepted exactly when d == x: with
      probability p(d), as the rule above gives for a one-hot q, and a rejected row returns x, distributed as
      normalize(p without d) -- the same residual. The same distribution and acceptance rate, with one gain:
      a seeded request's token at a position does not depend on whether that position verified a draft (a
      preemption's recompute or a busy step may sample a position plainly that a quiet run verified), so its
      tokens stay the same whatever the batch (chapter 11).

    So the scheduler's rule -- keep the drafts equal to their row's token, then take the next row's token --
    emits exactly the target distribution (chapter 9's proof), and each row depends only on its own
    (seed, step): batch-invariant like :func:`sample_batch`.
    """
    z = np.atleast_2d(np.asarray(logits, np.float64))
    R, V = z.shape
    drafts = np.asarray(drafts, np.int64)
    out = sample_batch(z, temperature, top_k, top_p, seeds, steps)
    t = np.broadcast_to(np.asarray(temperature, np.float64), (R,))   # checked by sample_batch above
    rows = np.flatnonzero((drafts >= 0) & (t > 0))
    if rows.size == 0 or q is None:              # one-hot drafts: the plain sample (see above)
        return out
    pick = lambda a: _pick(a, R, rows)  # noqa: E731
    p = shaped_probs(z[rows], t[rows], pick(top_k), pick(top_p))
    seeds, steps = np.asarray(pick(seeds), np.int64), pick(steps)
    u = counter_uniform(sub_seed(seeds, ACCEPT), steps, 1)[:, 0]
    g = -np.log(-np.log(counter_uniform(sub_seed(seeds, RESIDUAL), steps, V)))

    def gumbel_max(r, group, trials):            # each rejected row draws from its residual, its own stream
        with np.errstate(divide="ignore"):
            return np.argmax(np.log(r[group]) + g[trials], axis=1)

    out[rows] = verify_probs(p, None if q is None else np.asarray(q, np.float64)[rows], drafts[rows], u,
                             gumbel_max)[1]
    return out


def draft_batch(logits: np.ndarray, temperature, top_k, top_p, seeds, steps, want_probs: bool = True):
    """A drafter's tokens, one per row, and their shaped probabilities q (None if every row is greedy).

    Greedy rows take the argmax; other rows draw from q with the request's DRAFT stream, independent of
    the streams :func:`verify_batch` uses."""
    z = np.atleast_2d(np.asarray(logits, np.float64))
    R = z.shape[0]
    t = np.broadcast_to(np.asarray(temperature, np.float64), (R,))
    _check_temperature(t, "draft_batch")
    tokens = np.argmax(z, axis=1).astype(np.int64)
    hot = np.flatnonzero(t > 0)
    if hot.size == 0:
        return tokens, None
    pick = lambda a: _pick(a, R, hot)  # noqa: E731
    zh = shape_logits(z[hot], t[hot], pick(top_k), pick(top_p))
    u = counter_uniform(sub_seed(np.asarray(pick(seeds), np.int64), DRAFT), pick(steps), z.shape[1])
    tokens[hot] = np.argmax(zh - np.log(-np.log(u)), axis=1)
    if not want_probs:
        return tokens, None
    q = np.zeros_like(z)
    e = np.exp(zh - zh.max(axis=1, keepdims=True))
    q[hot] = e / e.sum(axis=1, keepdims=True)
    return tokens, q
