"""Chapter 9: speculative decoding -- a cheap drafter guesses k tokens, the target checks them in one pass.

One round, for a single sequence (batch 1, on the KV cache):

1. The drafter proposes k tokens d_1..d_k, each sampled from its distribution q (shaped by the same
   temperature / top-k / top-p as the target's p, through :func:`minillm.sampling.shape_logits`).
2. The target runs ONE forward pass over [last token, d_1, ..., d_k] against its cache: k+1 rows of p.
3. :func:`verify` walks the proposals: d_i is accepted with probability min(1, p_i(d_i) / q_i(d_i)).
   At the first rejection it samples from normalize(max(p_i - q_i, 0)) and stops; if all k are
   accepted it samples a bonus token from p_{k+1}. So a round emits between 1 and k+1 tokens.
4. Both caches are truncated back to the accepted length (:meth:`KVCache.truncate`).

Why it is exact: the first emitted token is d with probability q(d) min(1, p(d)/q(d)) = min(p(d), q(d)),
or comes from the residual with probability 1 - sum min(p, q) = sum max(p - q, 0); the two add up to
min(p, q) + max(p - q, 0) = p. :func:`first_token_distribution` and :func:`emitted_distribution` compute
these branch probabilities by enumeration, so the tests can check the algorithm against p to 1e-12.

Temperature 0 is greedy: p and q become one-hot at their argmax, and the same rule accepts d exactly when
it is the target's argmax (and the "residual" is the target's argmax). The n-gram drafter has no q: its
draft is treated as one-hot (q(d) = 1), as vLLM does, so d is accepted with probability p(d).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .decode import check_decode_args
from .sampling import shape_logits


# --------------------------------------------------------------------------- sampling settings


@dataclass(frozen=True)
class SpecParams:
    """How the tokens are sampled. Any object with these attributes works too (e.g. the engine's SamplingParams).

    temperature     0 is greedy (argmax); > 0 samples from softmax(shape_logits(logits))
    top_k, top_p    as in :func:`minillm.sampling.shape_logits` (None: off)
    stop_token_ids  generation stops after emitting one of these (kept in the output); default: no stop
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer))
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1] or be None, got {self.top_p!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(s) for s in self.stop_token_ids))


def to_probs(logits, params=None) -> np.ndarray:
    """Rows of logits -> rows of the sampling distribution (float64). Greedy (temperature 0) gives one-hot rows.

    The same function shapes the target's p and the drafter's q, so both see exactly what normal sampling sees.
    """
    params = SpecParams() if params is None else params
    z = np.atleast_2d(np.asarray(logits, np.float64))
    if params.temperature == 0:
        out = np.zeros_like(z)
        out[np.arange(z.shape[0]), np.argmax(z, axis=1)] = 1.0   # ties go to the lowest id, like greedy()
        return out
    z = shape_logits(z, params.temperature, getattr(params, "top_k", None), getattr(params, "top_p", None))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def sample_probs(probs, u):
    """Inverse-CDF draw from one distribution: the token whose CDF interval holds u * total.

    ``u`` is a uniform in [0, 1), or an array of them (one draw each). A zero-probability token has an
    empty interval, so it is never returned -- not even at the vocabulary's ends.
    """
    probs = np.asarray(probs, np.float64)
    c = np.cumsum(probs)
    if not c[-1] > 0:
        raise ValueError("cannot sample from a distribution with no mass")
    idx = np.searchsorted(c, np.asarray(u, np.float64) * c[-1], side="right")
    last = int(np.flatnonzero(probs > 0)[-1])           # u * total can round up to total: stay in the support
    idx = np.minimum(idx, last)
    return int(idx) if np.ndim(idx) == 0 else idx.astype(np.int64)


def residual(p, q) -> np.ndarray | None:
    """normalize(max(p - q, 0)), the distribution to resample from after a rejection; None when it has no mass.

    When p == q there is no residual mass, and then the rejection branch has probability 0 (every draft is
    accepted), so nobody samples from it: no division by zero is ever needed.
    """
    # BEGIN SOLUTION
    r = np.maximum(np.asarray(p, np.float64) - np.asarray(q, np.float64), 0.0)
    s = r.sum()
    return r / s if s > 0 else None
    # END SOLUTION


# --------------------------------------------------------------------------- the acceptance test


def verify(p_rows, q_rows, draft_tokens, rng):
    """Accept/reject k draft tokens against the target; return (n_accepted, next_token).

    p_rows        (k+1, V) the target's distributions at the k draft positions and one past them
    q_rows        (k, V)   the drafter's distributions the drafts were sampled from; None = one-hot drafts
    draft_tokens  (k,)     the proposals -- or (N, k): N independent trials against the SAME rows (the
                           first-token sampling test uses this to draw 10^5 times without a loop; in decoding
                           N = 1 and this is the same code path)

    Token i is accepted when u_i * q_i(d_i) < p_i(d_i), i.e. with probability min(1, p/q) (no division, so a
    zero q is safe). After the first rejection at position i, the next token comes from residual(p_i, q_i);
    with every draft accepted, it is a bonus draw from p_k. k = 0 is allowed: a plain target sampling step.
    The rule itself is :func:`minillm.sampling.verify_probs`, the engine's too (:func:`~minillm.sampling.
    verify_batch`); here its uniforms come from ``rng`` and its draws are inverse-CDF (:func:`sample_probs`).
    Returns ints for 1-D drafts, arrays of shape (N,) for 2-D drafts.
    """
    from .sampling import verify_probs

    # BEGIN SOLUTION
    p_rows = np.asarray(p_rows, np.float64)
    d = np.asarray(draft_tokens, np.int64)
    single = d.ndim == 1
    d = np.atleast_2d(d) if d.size else d.reshape(1 if single else d.shape[0], 0)
    N, k = d.shape
    if p_rows.ndim != 2 or p_rows.shape[0] != k + 1:
        raise ValueError(f"p_rows must be (k+1, V) = ({k + 1}, V), got {p_rows.shape}")
    V = p_rows.shape[1]
    if q_rows is not None:
        q_rows = np.asarray(q_rows, np.float64)
        if q_rows.shape != (k, V):
            raise ValueError(f"q_rows must be (k, V) = ({k}, {V}), got {q_rows.shape}")
    if d.size and (d.min() < 0 or d.max() >= V):
        raise ValueError(f"draft tokens must lie in [0, {V})")

    u = rng.random((N, k))
    u_next = rng.random(N)
    pos = np.tile(np.arange(k), N)                             # trial n, position i -> row i

    def inverse_cdf(r, group, trials):                         # the trial's one uniform, from its residual
        out = np.empty(trials.size, np.int64)
        order = np.argsort(group, kind="stable")
        bounds = np.searchsorted(group[order], np.arange(r.shape[0] + 1))
        for g in range(r.shape[0]):
            mine = order[bounds[g]:bounds[g + 1]]
            s = r[g].sum()
            # s == 0 only when p == q up to rounding; the rejection branch then has measure ~0 (it needs
            # u * q(d) >= p(d) with p(d) == q(d)), so falling back to p leaves the distribution unchanged.
            dist = r[g] / s if s > 0 else p_rows[pos[trials[mine[0]]]]
            out[mine] = sample_probs(dist, u_next[trials[mine] // k])
        return out

    accept, tok = verify_probs(p_rows[:k], q_rows, d.reshape(-1), u.reshape(-1), inverse_cdf, rows=pos)
    accept, tok = accept.reshape(N, k), tok.reshape(N, k)
    n_acc = np.where(accept.all(axis=1), k, np.argmin(accept, axis=1)) if k else np.zeros(N, np.int64)
    nxt = np.empty(N, np.int64)
    done = n_acc == k                                           # every draft accepted: bonus token from p_k
    if done.any():
        nxt[done] = sample_probs(p_rows[k], u_next[done])
    nxt[~done] = tok[~done, n_acc[~done]]                       # the residual draw at the first rejection
    if single:
        return int(n_acc[0]), int(nxt[0])
    return n_acc.astype(np.int64), nxt
    # END SOLUTION


# --------------------------------------------------------------------------- exact distributions by enumeration


def first_token_distribution(p, q) -> np.ndarray:
    """P(first emitted token = x), by summing the algorithm's branches over every draft d with q(d) > 0.

    Branch "draft d, accepted":   q(d) * min(1, p(d)/q(d))                  -> emits d
    Branch "draft d, rejected":   q(d) * (1 - min(1, p(d)/q(d))) * res(x)   -> emits x ~ residual(p, q)
    (``q=None`` is not accepted here: pass the one-hot row of the n-gram draft.)
    """
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    out = np.zeros_like(p)
    res = residual(p, q)
    for dtok in np.flatnonzero(q > 0):
        a = min(1.0, p[dtok] / q[dtok])
        out[dtok] += q[dtok] * a
        if a < 1 and res is not None:
            out += q[dtok] * (1 - a) * res
    return out


def emitted_distribution(p_fn, q_fn, k: int, n: int, prefix=()) -> dict[tuple[int, ...], float]:
    """Exact P(the first n emitted tokens = x_1..x_n) for speculative decoding with k drafts per round.

    ``p_fn(context)`` / ``q_fn(context)`` give the target's / drafter's next-token distribution after a tuple
    of tokens (a toy table, or a memoized real model). Every round is enumerated: each draft sequence the
    drafter can sample, each accept/reject outcome, each residual or bonus token; when a round ends with
    fewer than n tokens emitted, the next round is enumerated from the longer context. Returns a dict from
    token tuples to probabilities (zero-probability tuples are absent).
    """
    out: dict[tuple[int, ...], float] = defaultdict(float)
    if n <= 0:
        return {(): 1.0}
    prefix = tuple(prefix)

    def finish(seq, prob):                       # a round ended, having emitted seq
        if len(seq) >= n:
            out[seq[:n]] += prob
        else:
            for rest, pr in emitted_distribution(p_fn, q_fn, k, n - len(seq), prefix + seq).items():
                out[seq + rest] += prob * pr

    def walk(i, prob, emitted):                  # drafts 0..i-1 accepted, now at draft position i
        if len(emitted) >= n:                    # whatever the round does next comes after token n
            out[emitted[:n]] += prob
            return
        ctx = prefix + emitted
        p = np.asarray(p_fn(ctx), np.float64)
        if i == k:                               # all accepted: bonus token
            for x in np.flatnonzero(p > 0):
                finish(emitted + (int(x),), prob * p[x])
            return
        q = np.asarray(q_fn(ctx), np.float64)
        res = residual(p, q)
        for dtok in np.flatnonzero(q > 0):
            a = min(1.0, p[dtok] / q[dtok])
            if a > 0:
                walk(i + 1, prob * q[dtok] * a, emitted + (int(dtok),))
            if a < 1 and res is not None:
                for x in np.flatnonzero(res > 0):
                    finish(emitted + (int(x),), prob * q[dtok] * (1 - a) * res[x])

    walk(0, 1.0, ())
    return dict(out)


# --------------------------------------------------------------------------- drafters


class ModelDrafter:
    """Drafts with a small model on its own KV cache.

    Invariant between rounds: the cache holds K/V for a prefix of the context; ``propose`` first feeds the
    tokens it is missing (the last emitted token, and after a fully accepted round also the last draft, which
    was sampled but never fed), then samples k tokens from q, feeding each back except the last.
    """

    def __init__(self, model):
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.cache = None
        self.calls = 0                          # draft forward passes

    def start(self, prompt) -> None:
        self.cache = self.model.new_cache(batch=1, capacity=self.model.config.max_seq_len)

    def max_proposal(self, context_len: int) -> int:
        """Drafts that fit: the last one is never fed, so positions up to context_len + k - 2 are written."""
        return max(0, self.model.config.max_seq_len - context_len + 1)

    def propose(self, context, k: int, rng, params):
        k = min(k, self.max_proposal(len(context)))
        if k <= 0:
            return [], None
        feed = list(context[self.cache.length:])
        tokens, qs = [], []
        for _ in range(k):
            logits = self.model.forward(np.asarray([feed]), cache=self.cache)[0, -1]
            self.calls += 1
            q = to_probs(logits, params)[0]
            t = sample_probs(q, rng.random())
            tokens.append(t)
            qs.append(q)
            feed = [t]                          # fed at the next step; the last draft is fed next round
        return tokens, np.stack(qs)

    def rollback(self, n_valid: int) -> None:
        """The first ``n_valid`` tokens of the new context are what this drafter saw; drop the rest."""
        self.cache.truncate(min(self.cache.length, n_valid))


class NgramDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the context's last n tokens.

    Tries n, n-1, ..., min_n; the first size with a match wins. The continuation is copied LZ77-style, so
    it may run into the proposal itself (a repeating pattern yields k tokens). No match: no proposal, and
    the round is a plain target step. There is no q: the drafts are one-hot (accepted with probability p(d)).
    """

    vocab_size = None                           # proposes only tokens already in the context

    def __init__(self, n: int = 3, min_n: int = 1):
        for name, v in (("n", n), ("min_n", min_n)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"NgramDrafter {name} must be an integer >= 1, got {v!r}")
        if min_n > n:
            raise ValueError(f"min_n ({min_n}) must be <= n ({n})")
        self.n, self.min_n = int(n), int(min_n)
        self.calls = 0

    def start(self, prompt) -> None:
        pass

    def max_proposal(self, context_len: int) -> int:
        return 1 << 30

    def lookup(self, context, k: int) -> list[int]:
        ctx = np.asarray(context, np.int64)
        L = ctx.size
        for n in range(min(self.n, L - 1), self.min_n - 1, -1):
            # windows starting at 0..L-n-1: every occurrence except the suffix itself
            win = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((win == ctx[L - n:]).all(axis=1))
            if hits.size:
                src = int(hits[-1]) + n              # <= L - 1: the token after the latest earlier occurrence
                ext = [int(t) for t in ctx]
                for j in range(k):
                    ext.append(ext[src + j])
                return ext[L:]
        return []

    def propose(self, context, k: int, rng, params):
        self.calls += 1
        return self.lookup(context, k), None

    def rollback(self, n_valid: int) -> None:
        pass


# --------------------------------------------------------------------------- the decode loop


@dataclass
class SpecResult:
    """Tokens (prompt + new, like DecodeResult) and what each target call did.

    Per target call (one verify forward each): ``proposed`` drafts (k clipped to the tokens and positions
    left; 0 when the n-gram drafter found nothing), ``accepted`` drafts, ``emitted`` tokens appended to the
    output (accepted + 1, less any cut by n_new or a stop token).
    """

    tokens: list[int]
    prompt_len: int
    k: int
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    draft_calls: int = 0

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def target_calls(self) -> int:
        return len(self.proposed)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts, over the whole run."""
        return sum(self.accepted) / max(1, sum(self.proposed))

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target (verify) call -- the number that becomes the speedup."""
        return sum(self.emitted) / max(1, self.target_calls)

    def acceptance_per_position(self) -> np.ndarray:
        """alpha_i: among calls that proposed a draft at position i with drafts 0..i-1 accepted, the share
        that accepted it. NaN where no call reached position i."""
        prop, acc = np.asarray(self.proposed), np.asarray(self.accepted)
        out = np.full(self.k, np.nan)
        for i in range(self.k):
            reached = (prop > i) & (acc >= i)
            if reached.any():
                out[i] = np.mean(acc[reached] > i)
        return out


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (drafts per round) must be an integer >= 1, got {k!r}")
    return int(k)


def speculative_decode(target, drafter, prompt_ids, n_new: int, k: int, params=None, seed: int = 0) -> SpecResult:
    """Generate ``n_new`` tokens with the target's exact distribution, k drafts per target call.

    ``drafter`` is a :class:`ModelDrafter` or :class:`NgramDrafter` (anything with start / propose /
    rollback / max_proposal). ``params``: :class:`SpecParams` or any object with temperature / top_k / top_p
    (and optionally stop_token_ids); default greedy. ``seed`` seeds the one generator used for the draft
    draws and the acceptance tests.
    """
    prompt = check_decode_args(target, prompt_ids, n_new)
    k = _check_k(k)
    if drafter.vocab_size is not None and drafter.vocab_size != target.config.vocab_size:
        raise ValueError(f"drafter vocabulary ({drafter.vocab_size}) differs from the target's "
                         f"({target.config.vocab_size}): the acceptance test compares p and q token by token")
    params = SpecParams() if params is None else params
    stops = set(getattr(params, "stop_token_ids", ()) or ())
    rng = np.random.default_rng(seed)

    ctx = list(prompt)
    res = SpecResult(tokens=ctx, prompt_len=len(prompt), k=k)
    cache = target.new_cache(batch=1, capacity=len(prompt) + n_new - 1)
    drafter.start(prompt)
    calls0 = drafter.calls
    t0 = time.perf_counter()
    if len(prompt) > 1:                          # invariant: the target cache holds every token but the last
        target.forward(np.asarray([prompt[:-1]]), cache=cache)
    res.target_seconds += time.perf_counter() - t0

    while len(ctx) - len(prompt) < n_new:
        left = n_new - (len(ctx) - len(prompt))
        # a round emits at most k+1 tokens and writes positions up to len(ctx)+k-1 < len(prompt)+n_new-1
        k_eff = min(k, left - 1, drafter.max_proposal(len(ctx)))
        t0 = time.perf_counter()
        drafts, q_rows = drafter.propose(ctx, k_eff, rng, params) if k_eff > 0 else ([], None)
        drafts = [int(t) for t in drafts[:k_eff]]
        if q_rows is not None:
            q_rows = q_rows[:len(drafts)]
        t1 = time.perf_counter()
        logits = target.forward(np.asarray([[ctx[-1], *drafts]]), cache=cache)[0]     # ONE pass, k+1 rows
        p_rows = to_probs(logits, params)
        n_acc, nxt = verify(p_rows, q_rows, drafts, rng)
        # roll back: both caches keep ctx + the accepted drafts
        cache.truncate(len(ctx) + n_acc)
        drafter.rollback(len(ctx) + n_acc)
        res.target_seconds += time.perf_counter() - t1
        res.draft_seconds += t1 - t0

        new = drafts[:n_acc] + [nxt]
        new = new[:left]
        hit = next((j for j, t in enumerate(new) if t in stops), None)
        if hit is not None:
            new = new[:hit + 1]
        ctx.extend(new)
        res.proposed.append(len(drafts))
        res.accepted.append(n_acc)
        res.emitted.append(len(new))
        if hit is not None:
            res.finish_reason = "stop"
            break
    res.draft_calls = drafter.calls - calls0
    return res


# --------------------------------------------------------------------------- goodness of fit (no scipy)


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X ~ chi-square(dof): the regularized upper incomplete gamma Q(dof/2, x/2).

    Series for x/2 < dof/2 + 1, Lentz's continued fraction otherwise (Numerical Recipes' gammq).
    """
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if x <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    a, z = dof / 2.0, x / 2.0
    log_front = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= z / n
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-16:
            break
    return min(1.0, math.exp(log_front) * h)


def chi_square_gof(counts, probs, min_expected: float = 5.0) -> tuple[float, int, float]:
    """Pearson's goodness of fit of observed counts to a distribution: (statistic, dof, p-value).

    Bins with expected count < min_expected are pooled into one bin (merged into the smallest regular bin if
    the pool itself stays under min_expected). A count on a zero-probability token is an outright failure:
    the statistic is inf and the p-value 0.
    """
    counts = np.asarray(counts, np.float64)
    probs = np.asarray(probs, np.float64)
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ in shape")
    probs = probs / probs.sum()
    if (counts[probs == 0] > 0).any():
        return math.inf, 0, 0.0
    expected = counts.sum() * probs
    big = expected >= min_expected
    obs, exp = list(counts[big]), list(expected[big])
    pool_o, pool_e = counts[~big].sum(), expected[~big].sum()
    if pool_e > 0:
        if pool_e >= min_expected or not exp:
            obs.append(pool_o)
            exp.append(pool_e)
        else:
            j = int(np.argmin(exp))
            obs[j] += pool_o
            exp[j] += pool_e
    obs, exp = np.asarray(obs), np.asarray(exp)
    dof = len(exp) - 1
    stat = float(np.sum((obs - exp) ** 2 / exp))
    return stat, dof, (chi2_sf(stat, dof) if dof >= 1 else 1.0)


def chi_square_two_sample(a, b, min_count: int = 10) -> tuple[float, int, float]:
    """Pearson's two-sample test that two samples of token ids come from one distribution:
    (statistic, dof, p-value). Categories drawn fewer than ``min_count`` times in both samples together are
    pooled into one bin, so every expected count stays away from zero."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("both samples need at least one draw")
    cats = np.unique(np.concatenate([a, b]))
    ca = np.array([(a == c).sum() for c in cats], np.float64)
    cb = np.array([(b == c).sum() for c in cats], np.float64)
    small = (ca + cb) < min_count
    if small.any():
        ca, cb = np.append(ca[~small], ca[small].sum()), np.append(cb[~small], cb[small].sum())
    tot = ca + cb
    ea, eb = tot * a.size / tot.sum(), tot * b.size / tot.sum()
    stat = float(((ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb).sum())
    dof = len(tot) - 1
    return stat, dof, (chi2_sf(stat, dof) if dof >= 1 else 1.0)
