"""The engine's batched samplers: seeded draws, the draft sampler and the speculative verifier.

The verifier's exactness is checked by sampling: many rows with the same logits and different seeds, so
each row is an independent draw of "the first token a speculative round emits". Test statistic: Pearson's
chi-square goodness of fit against the target distribution p (bins with expected count < 5 pooled);
threshold: p-value > 1e-3 for every seed offset. A verifier that forgets the draft probabilities must fail
the same test.
"""
import numpy as np
import pytest

from minillm.sampling import (ACCEPT, DRAFT, RESIDUAL, counter_uniform, draft_batch, sample_batch,
                              shaped_probs, sub_seed, verify_batch, verify_probs)
from minillm.speculative import chi_square_gof, residual, sample_probs, verify

N = 100_000
V = 8


def target_and_draft(seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=V) * 1.5, rng.normal(size=V) * 1.5


def first_tokens(p_logits, q_logits, temperature, top_k, offset, one_hot_draft=None, drop_q=False):
    """N independent first emitted tokens: draft d ~ q (or a fixed draft), then verify against p."""
    seeds = np.arange(N, dtype=np.int64) + offset * N
    steps = np.full(N, 5, np.int64)
    t, k, p = np.full(N, temperature), np.full(N, top_k), np.ones(N)
    lp, lq = np.tile(p_logits, (N, 1)), np.tile(q_logits, (N, 1))
    if one_hot_draft is None:
        d, q = draft_batch(lq, t, k, p, seeds, steps)
    else:
        d, q = np.full(N, one_hot_draft), None
    return verify_batch(lp, d, None if drop_q else q, t, k, p, seeds, steps)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 5)])
@pytest.mark.parametrize("offset", [0, 1, 2])
def test_verify_batch_first_token_follows_the_target_chi_square(temperature, top_k, offset):
    lp, lq = target_and_draft(offset)
    want = shaped_probs(lp[None], temperature, top_k)[0]
    toks = first_tokens(lp, lq, temperature, top_k, offset)
    _, _, pval = chi_square_gof(np.bincount(toks, minlength=V), want)
    assert pval > 1e-3


@pytest.mark.parametrize("offset", [0, 1])
def test_verify_batch_one_hot_draft_follows_the_target_chi_square(offset):
    """A prompt-lookup draft has no q: accepted with probability p(d), else resampled from p without d."""
    lp, _ = target_and_draft(offset + 10)
    want = shaped_probs(lp[None], 1.0)[0]
    toks = first_tokens(lp, None, 1.0, 0, offset, one_hot_draft=int(np.argsort(want)[-2]))
    _, _, pval = chi_square_gof(np.bincount(toks, minlength=V), want)
    assert pval > 1e-3


def test_verify_batch_one_hot_rule_is_exact_for_drafts_from_any_source():
    """Treating a sampled draft as one-hot (accept with p(d), else p without d) is still exact -- just a
    lower acceptance than min(1, p/q): conditioned on any draft d, the emitted token follows p."""
    lp, lq = target_and_draft(3)
    want = shaped_probs(lp[None], 1.0)[0]
    toks = first_tokens(lp, lq, 1.0, 0, 3, drop_q=True)
    _, _, pval = chi_square_gof(np.bincount(toks, minlength=V), want)
    assert pval > 1e-3


@pytest.mark.parametrize("offset", [0, 1])
def test_verify_batch_resampling_from_p_fails_the_same_test(offset):
    """The test can fail: the right acceptance test, but a rejection resampled from p instead of
    max(p - q, 0) (a classic bug), gives p < 1e-3."""
    lp, lq = target_and_draft(offset)
    want = shaped_probs(lp[None], 1.0)[0]
    seeds, steps = np.arange(N, dtype=np.int64) + offset * N, np.full(N, 5, np.int64)
    lps = np.tile(lp, (N, 1))
    d, q = draft_batch(np.tile(lq, (N, 1)), 1.0, 0, 1.0, seeds, steps)
    accepted = verify_batch(lps, d, q, 1.0, 0, 1.0, seeds, steps) == d     # a rejection never returns d
    broken = np.where(accepted, d, sample_batch(lps, 1.0, 0, 1.0, sub_seed(seeds, RESIDUAL), steps))
    _, _, pval = chi_square_gof(np.bincount(broken, minlength=V), want)
    assert pval < 1e-3


def test_verify_batch_greedy_rows_return_the_argmax(rng):
    logits = rng.normal(size=(5, 20))
    drafts = np.array([3, -1, int(np.argmax(logits[2])), 7, 0])
    out = verify_batch(logits, drafts, None, 0.0, 0, 1.0, np.arange(5), np.zeros(5, np.int64))
    np.testing.assert_array_equal(out, np.argmax(logits, axis=1))


def test_verify_batch_p_equal_q_accepts_every_draft(rng):
    """p == q: the ratio is 1 and the residual is all zero, so every draft is accepted."""
    logits = np.tile(rng.normal(size=V), (2000, 1))
    seeds, steps = np.arange(2000), np.zeros(2000, np.int64)
    d, q = draft_batch(logits, 1.0, 0, 1.0, seeds, steps)
    np.testing.assert_array_equal(verify_batch(logits, d, q, 1.0, 0, 1.0, seeds, steps), d)


def test_verify_batch_rejected_row_never_returns_its_draft(rng):
    """q puts its mass where p has none: every draft is rejected and the residual is p itself."""
    lp = np.array([5.0, 5.0, -np.inf, -np.inf])
    lq = np.array([-np.inf, -np.inf, 0.0, 0.0])
    R = 500
    seeds, steps = np.arange(R), np.zeros(R, np.int64)
    d, q = draft_batch(np.tile(lq, (R, 1)), 1.0, 0, 1.0, seeds, steps)
    out = verify_batch(np.tile(lp, (R, 1)), d, q, 1.0, 0, 1.0, seeds, steps)
    assert set(out.tolist()) == {0, 1} and not (out == d).any()


def test_verify_batch_rows_without_a_draft_sample_like_sample_batch(rng):
    logits = rng.normal(size=(6, 30))
    t, seeds, steps = np.full(6, 0.8), np.arange(6) + 3, np.arange(6)
    np.testing.assert_array_equal(verify_batch(logits, np.full(6, -1), None, t, 0, 1.0, seeds, steps),
                                  sample_batch(logits, t, 0, 1.0, seeds, steps))


def test_draft_batch_greedy_gives_no_probabilities(rng):
    logits = rng.normal(size=(4, 9))
    tok, q = draft_batch(logits, 0.0, 0, 1.0, np.arange(4), np.zeros(4, np.int64))
    np.testing.assert_array_equal(tok, np.argmax(logits, axis=1))
    assert q is None


def test_sub_seed_streams_are_uncorrelated():
    """Pearson correlation of the uniforms two streams give the same (seed, step): |r| < 4 / sqrt(n)."""
    n = 50_000
    seeds, steps = np.arange(n, dtype=np.int64), np.full(n, 3)
    us = [counter_uniform(sub_seed(seeds, s), steps, 1)[:, 0] for s in (0, DRAFT, ACCEPT, RESIDUAL)]
    for i in range(4):
        for j in range(i + 1, 4):
            assert abs(np.corrcoef(us[i], us[j])[0, 1]) < 4 / np.sqrt(n)


def test_counter_uniform_rejects_seeds_and_steps_outside_32_bits():
    """The hash reads 32 bits: seed 7 + 2**32 would alias seed 7, so it is refused; 2**32 - 1 is the largest."""
    u = counter_uniform(np.array([0, 2**32 - 1]), np.array([0, 2**32 - 1]), 4)
    assert u.shape == (2, 4) and ((u > 0) & (u < 1)).all()
    for seed, step in ((2**32 + 7, 0), (-1, 0), (7, 2**32), (7, -1)):
        with pytest.raises(ValueError, match="2\\*\\*32"):
            counter_uniform(np.array([seed]), np.array([step]), 4)
    with pytest.raises(ValueError, match="seed"):
        sample_batch(np.zeros((1, 4)), 1.0, 0, 1.0, np.array([2**32 + 7]), np.array([0]))


# --------------------------------------------------------------------------- one verifier, the same draws
# verify_batch and speculative.verify now share sampling.verify_probs (the rejection rule). The two functions
# below are their implementations before that change, kept to prove every token is unchanged (the engine's
# seeded outputs, and chapter 9's 200,000 draws through speculative.verify).


def _pick(a, n: int, rows):
    return None if a is None else np.broadcast_to(np.asarray(a), (n,))[rows]


def _verify_batch_before(logits: np.ndarray, drafts, q, temperature, top_k, top_p, seeds, steps) -> np.ndarray:
    z = np.atleast_2d(np.asarray(logits, np.float64))
    R, V = z.shape
    drafts = np.asarray(drafts, np.int64)
    out = sample_batch(z, temperature, top_k, top_p, seeds, steps)
    t = np.broadcast_to(np.asarray(temperature, np.float64), (R,))
    rows = np.flatnonzero((drafts >= 0) & (t > 0))
    if rows.size == 0:
        return out
    pick = lambda a: _pick(a, R, rows)  # noqa: E731
    p = shaped_probs(z[rows], t[rows], pick(top_k), pick(top_p))
    d = drafts[rows]
    idx = np.arange(rows.size)
    if q is None:
        qd = np.ones(rows.size)
        r = p.copy()
        r[idx, d] = 0.0
    else:
        qr = np.asarray(q, np.float64)[rows]
        qd = qr[idx, d]
        r = np.maximum(p - qr, 0.0)
    seeds, steps = pick(seeds), pick(steps)
    u = counter_uniform(sub_seed(np.asarray(seeds, np.int64), ACCEPT), steps, 1)[:, 0]
    accept = u * qd < p[idx, d]
    g = -np.log(-np.log(counter_uniform(sub_seed(np.asarray(seeds, np.int64), RESIDUAL), steps, V)))
    with np.errstate(divide="ignore"):
        resid = np.argmax(np.log(r) + g, axis=1)
    out[rows] = np.where(accept, d, resid)
    return out


def _verify_before(p_rows, q_rows, draft_tokens, rng):
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
    pos = np.arange(k)
    pd = p_rows[pos, d]                                        # (N, k) p_i(d_i)
    qd = np.ones_like(pd) if q_rows is None else q_rows[pos, d]
    accept = u * qd < pd
    n_acc = np.where(accept.all(axis=1), k, np.argmin(accept, axis=1)) if k else np.zeros(N, np.int64)

    nxt = np.empty(N, np.int64)
    for i in range(k + 1):
        rows = np.flatnonzero(n_acc == i)
        if rows.size == 0:
            continue
        if i == k:                                            # every draft accepted: bonus token from p_k
            nxt[rows] = sample_probs(p_rows[k], u_next[rows])
            continue
        # rejected at position i: resample from max(p_i - q_i, 0). One-hot drafts have a residual that depends
        # on the draft itself (p_i with d_i removed), so group the trials by their draft token.
        groups = [(rows, q_rows[i])] if q_rows is not None else [
            (rows[d[rows, i] == t], np.eye(1, V, t)[0]) for t in np.unique(d[rows, i])]
        for r_idx, q in groups:
            res = residual(p_rows[i], q)
            # res is None only when p == q up to rounding; the rejection branch then has measure ~0 (it needs
            # u * q(d) >= p(d) with p(d) == q(d)), so falling back to p leaves the distribution unchanged.
            nxt[r_idx] = sample_probs(p_rows[i] if res is None else res, u_next[r_idx])
    if single:
        return int(n_acc[0]), int(nxt[0])
    return n_acc.astype(np.int64), nxt


def test_verify_batch_one_hot_drafts_return_the_plain_sample_whether_drafted_or_not():
    """Drafts without probabilities (prompt lookup): each row returns what sample_batch draws at its (seed, step),
    so a seeded request's token at a position does not depend on whether the position verified a draft (the
    batch-invariance chapter 11 needs under preemption); d is accepted exactly when it equals that sample,
    i.e. with probability p(d), and a rejection returns the sample, distributed as p without d (the residual)."""
    rng = np.random.default_rng(12)
    R, V = 400, 30
    logits = rng.normal(size=(R, V)) * 2
    t = np.where(rng.random(R) < 0.2, 0.0, rng.uniform(0.5, 1.5, R))
    k, p = np.zeros(R, np.int64), np.ones(R)
    seeds, steps = rng.integers(0, 2**31, R), rng.integers(0, 500, R)
    plain = sample_batch(logits, t, k, p, seeds, steps)
    drafts = np.where(rng.random(R) < 0.5, plain, rng.integers(0, V, R))   # half of them the token it will draw
    got = verify_batch(logits, drafts, None, t, k, p, seeds, steps)
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_array_equal(verify_batch(logits, np.full(R, -1), None, t, k, p, seeds, steps), plain)
    assert (got == drafts).any() and (got != drafts).any()


@pytest.mark.parametrize("with_q", [True])
def test_verify_batch_draws_the_tokens_it_drew_before_sharing_verify_probs(with_q):
    rng = np.random.default_rng(11)
    R, V = 300, 40
    logits = rng.normal(size=(R, V)) * 3
    drafts = np.where(rng.random(R) < 0.8, rng.integers(0, V, R), -1)
    q = rng.dirichlet(np.full(V, 0.5), R) if with_q else None
    t = np.where(rng.random(R) < 0.2, 0.0, rng.uniform(0.5, 1.5, R))
    k = np.where(rng.random(R) < 0.5, rng.integers(0, 10, R), 0)
    p = np.where(rng.random(R) < 0.5, rng.uniform(0.3, 1.0, R), 1.0)
    seeds, steps = rng.integers(0, 2**31, R), rng.integers(0, 500, R)
    got = verify_batch(logits, drafts, q, t, k, p, seeds, steps)
    np.testing.assert_array_equal(got, _verify_batch_before(logits, drafts, q, t, k, p, seeds, steps))
    assert (got != np.where(drafts >= 0, drafts, -2)).any() and (got == drafts).any()   # both branches ran


@pytest.mark.parametrize("k, with_q, V", [(0, False, 7), (1, True, 259), (1, False, 7), (3, True, 11),
                                         (3, False, 5), (2, True, 3)])
def test_speculative_verify_draws_what_it_drew_before_it_wrapped_verify_probs(k, with_q, V):
    """Same Generator, same uniforms consumed, same inverse-CDF draws: identical (n_accepted, next) for every
    trial, batched (chapter 9's first-token test) and single (speculative_decode)."""
    rng = np.random.default_rng(k * 100 + V)
    p_rows = rng.dirichlet(np.full(V, 0.6), k + 1)
    q_rows = rng.dirichlet(np.full(V, 0.6), k) if with_q else None
    if with_q and k >= 2:
        q_rows[1] = p_rows[1]                          # p == q: no residual mass at that position
    drafts = rng.integers(0, V, (20_000, k))
    new, old = verify(p_rows, q_rows, drafts, np.random.default_rng(5)), \
        _verify_before(p_rows, q_rows, drafts, np.random.default_rng(5))
    np.testing.assert_array_equal(new[0], old[0])
    np.testing.assert_array_equal(new[1], old[1])
    for seed in range(20):
        assert verify(p_rows, q_rows, drafts[seed], np.random.default_rng(seed)) == \
            _verify_before(p_rows, q_rows, drafts[seed], np.random.default_rng(seed))


def test_verify_probs_groups_residuals_and_never_returns_a_rejected_draft():
    p = np.array([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]])
    calls = []

    def first(r, group, trials):
        calls.append((r.copy(), group.copy(), trials.copy()))
        return np.argmax(r[group], axis=1)
    acc, tok = verify_probs(p, None, np.array([0, 0, 2, 1]), np.array([0.9, 0.1, 0.99, 0.5]), first,
                            rows=np.array([0, 0, 1, 1]))
    assert acc.tolist() == [False, True, False, False]
    r, group, trials = calls[0]
    assert trials.tolist() == [0, 2, 3] and r.shape == (3, 3)        # one residual per (row, draft)
    assert tok.tolist() == [1, 0, 1, 2] and all(tok[t] != d for t, d in zip(trials, [0, 2, 1]))


# --------------------------------------------------------------------------- bad settings are refused, not guessed

def test_shape_logits_rejects_top_p_outside_0_1():
    """top_p 0 used to mask every logit to -inf (the docstring promises at least one token kept), and a draw then
    returned token 0 whatever the logits."""
    from minillm.sampling import shape_logits

    z = np.array([[1.0, 2.0, 3.0]])
    for bad in (0.0, -0.5, 1.5, np.nan):
        with pytest.raises(ValueError, match="top_p"):
            shape_logits(z, 1.0, top_p=bad)
    with pytest.raises(ValueError, match="top_p"):
        sample_batch(z, 1.0, 0, 0.0, np.array([1]), np.array([0]))
    assert np.isfinite(shape_logits(z, 1.0, top_p=1e-9)).sum() == 1        # the smallest valid top_p keeps one
    np.testing.assert_array_equal(shape_logits(z, 1.0, top_p=1.0), z)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, -1.0])
def test_sample_batch_rejects_non_finite_or_negative_temperature(bad):
    """NaN (or a negative temperature) failed ``t > 0`` and was served as greedy; shape_logits returned NaN rows."""
    from minillm.sampling import TemperatureSampler, shape_logits

    z = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]])
    seeds, steps = np.array([1, 2]), np.array([0, 0])
    with pytest.raises(ValueError, match="temperature"):
        sample_batch(z, np.array([1.0, bad]), 0, 1.0, seeds, steps)
    with pytest.raises(ValueError, match="temperature"):
        draft_batch(z, np.array([bad, 0.0]), 0, 1.0, seeds, steps)
    with pytest.raises(ValueError, match="temperature"):
        verify_batch(z, np.array([0, 1]), None, bad, 0, 1.0, seeds, steps)
    with pytest.raises(ValueError, match="temperature"):
        shape_logits(z, bad)
    with pytest.raises(ValueError, match="temperature"):
        TemperatureSampler(bad)
    assert sample_batch(z, np.array([0.0, 0.0]), 0, 1.0, seeds, steps).tolist() == [2, 2]   # 0 is still greedy


def test_greedy_rejects_anything_but_one_row():
    """A (B, V) batch used to return an index into the flattened array (2 here), not a token id."""
    from minillm.sampling import greedy

    with pytest.raises(ValueError, match=r"one row of logits.*\(2, 2\)"):
        greedy(np.array([[0.0, 1.0], [5.0, 0.0]]))
    for bad in (np.float64(3.0), np.zeros(0)):
        with pytest.raises(ValueError, match="one row"):
            greedy(bad)
    assert greedy(np.array([0.0, 4.0, 4.0])) == 1 and greedy([1.0, 0.0]) == 0


def test_shape_logits_rejects_a_temperature_that_overflows_the_logits():
    """Was: logits / 1e-308 overflowed to +-inf with a warning, and the argmax became the first token at +inf, not
    the most likely one: the greedy limit silently lost."""
    from minillm.sampling import shape_logits

    z = np.array([[1.0, 30.0, 2.0], [-5.0, 0.5, 0.25]])
    with pytest.raises(ValueError, match="overflows"):
        shape_logits(z, 1e-308)
    np.testing.assert_array_equal(shape_logits(z, 1e-300).argmax(axis=1), [1, 1])   # still finite: the argmax kept
    masked = np.array([[-np.inf, 1.0, 2.0]])                 # a logit already -inf is not an overflow
    assert np.isneginf(shape_logits(masked, 0.5)[0, 0])
