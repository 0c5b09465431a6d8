"""Assignment 9, grader-only tests: exactness by chi-square (statistic: Pearson's goodness of fit of the
emitted tokens against the target rows, bins with expected count < 5 pooled; threshold p > 1e-3) for
several (p, q), q with zeros where p has mass, one-hot drafts, the second token after an acceptance, the
bonus token, k = 0, the vocabulary's last id; bad input raises; the residual each rejected trial is resampled from,
recorded with a planted draft distribution. The acceptance rule itself: the first draft kept in a fraction sum min(p, q) of trials (statistic: z of that fraction against
its binomial standard error; threshold |z| < 5). Core: the residual, the first token's distribution and the
acceptance rate. (That this test statistic rejects a biased
sampler is checked in the book's own tests, tests/test_speculative.py; it grades nothing here.)"""
import numpy as np
import pytest

from minillm.sampling import verify_probs
from minillm.speculative import verify
from oracles import chi_square_gof

V = 8
N = 100_000


def dists(seed, zero_q=False):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.full(V, 0.7)), rng.dirichlet(np.full(V, 0.7))
    if zero_q:
        q[np.argsort(p)[-2:]] = 0.0             # the drafter never proposes the target's two likeliest tokens
        q /= q.sum()
    return p, q


def first_tokens(p_rows, q, seed):
    rng = np.random.default_rng(seed)
    drafts = rng.choice(V, size=(N, 1), p=q)
    n_acc, nxt = verify(p_rows, q[None], drafts, rng)
    return np.where(n_acc >= 1, drafts[:, 0], nxt)


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.parametrize("one_hot", [False, True])
def test_rejected_trials_draw_from_the_residual(one_hot):
    """A planted draft distribution q far from p: every rejected trial is resampled from max(p - q, 0) of its own
    row (for one-hot drafts: p with the draft removed), never from p itself; accepted ones keep their draft."""
    rng = np.random.default_rng(21)
    p = rng.dirichlet(np.full(V, 0.7), size=3)
    q = None if one_hot else np.roll(p, 3, axis=1)
    drafts = np.array([0, 1, 2, 3, 4, 5, 6, 7, 1, 2])
    rows = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    u = np.linspace(0.05, 0.999, drafts.size)
    seen = []

    def resample(r, group, trials):
        seen.append((np.array(r), np.array(group), np.array(trials)))
        return np.full(len(trials), V - 1)

    accept, tokens = verify_probs(p, q, drafts, u, resample, rows=rows)
    qd = np.ones(drafts.size) if one_hot else q[rows, drafts]
    want_accept = u * qd < p[rows, drafts]
    assert (np.asarray(accept) == want_accept).all() and (~want_accept).any()
    assert (np.asarray(tokens)[want_accept] == drafts[want_accept]).all()
    assert len(seen) == 1
    r, group, trials = seen[0]
    assert sorted(trials.tolist()) == np.flatnonzero(~want_accept).tolist()
    for g, t in zip(group, trials):
        if one_hot:
            want = p[rows[t]].copy()
            want[drafts[t]] = 0.0
        else:
            want = np.maximum(p[rows[t]] - q[rows[t]], 0.0)
        np.testing.assert_allclose(r[g] / r[g].sum(), want / want.sum(), rtol=1e-12, atol=1e-15)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("seed,zero_q", [(2, False), (3, False), (4, True), (5, True)])
def test_first_token_exact_for_random_drafters(seed, zero_q):
    p, q = dists(seed, zero_q)
    assert chi_square_gof(np.bincount(first_tokens(np.stack([p, p]), q, seed), minlength=V), p)[2] > 1e-3


def test_one_hot_drafts_are_exact():
    p, _ = dists(7)
    rng = np.random.default_rng(7)
    drafts = np.full((N, 1), int(np.argsort(p)[-3]))
    n_acc, nxt = verify(np.stack([p, p]), None, drafts, rng)
    first = np.where(n_acc >= 1, drafts[:, 0], nxt)
    assert chi_square_gof(np.bincount(first, minlength=V), p)[2] > 1e-3


def test_second_token_after_an_acceptance_follows_the_second_row():
    (p0, q0), (p1, q1) = dists(8), dists(9)
    rng = np.random.default_rng(8)
    drafts = np.stack([rng.choice(V, size=N, p=q0), rng.choice(V, size=N, p=q1)], axis=1)
    n_acc, nxt = verify(np.stack([p0, p1, p1]), np.stack([q0, q1]), drafts, rng)
    ok = n_acc >= 1
    second = np.where(n_acc[ok] >= 2, drafts[ok, 1], nxt[ok])
    assert chi_square_gof(np.bincount(second, minlength=V), p1)[2] > 1e-3


def test_p_equal_q_accepts_every_draft_and_the_bonus_follows_the_last_row():
    p, _ = dists(10)
    bonus_row = dists(11)[0]
    rng = np.random.default_rng(10)
    drafts = rng.choice(V, size=(N, 2), p=p)
    n_acc, nxt = verify(np.stack([p, p, bonus_row]), np.stack([p, p]), drafts, rng)
    assert (n_acc == 2).all()
    assert chi_square_gof(np.bincount(nxt, minlength=V), bonus_row)[2] > 1e-3


def test_k_zero_is_a_plain_sample_and_single_trials_return_ints():
    p, q = dists(12)
    rng = np.random.default_rng(12)
    n_acc, nxt = verify(p[None], None, np.zeros((N, 0), np.int64), rng)
    assert (n_acc == 0).all() and chi_square_gof(np.bincount(nxt, minlength=V), p)[2] > 1e-3
    a, t = verify(np.stack([p, p]), q[None], np.array([3]), rng)
    assert isinstance(a, int) and isinstance(t, int)


def test_last_vocabulary_id_can_be_accepted():
    p = np.zeros(V)
    p[-1] = 1.0
    assert verify(np.stack([p, p]), p[None], np.array([V - 1]), np.random.default_rng(0)) == (1, V - 1)


@pytest.mark.core
@pytest.mark.points(2)
def test_first_draft_is_kept_with_probability_sum_min_p_q():
    """The rule, not only what it emits: with drafts drawn from q, the first draft is kept in a fraction
    sum_v min(p_v, q_v) of 10^5 trials (statistic: z = (fraction - that) / its binomial standard error;
    threshold |z| < 5). Drawing x ~ p and keeping d only when d == x emits the right distribution too, but keeps
    sum_v p_v q_v: planted far from sum min(p, q)."""
    rng = np.random.default_rng(11)
    V, k, N = 8, 2, 100_000
    p = rng.dirichlet(np.ones(V), size=k + 1)
    q = rng.dirichlet(np.ones(V), size=k)
    alpha = np.minimum(p[0], q[0]).sum()
    assert abs((p[0] * q[0]).sum() - alpha) > 0.1          # the plant: the other way keeps far fewer
    drafts = np.stack([rng.choice(V, size=N, p=q[i]) for i in range(k)], axis=1)
    n_acc, _ = verify(p, q, drafts, rng)
    kept = float(np.mean(np.asarray(n_acc) >= 1))
    z = (kept - alpha) / np.sqrt(alpha * (1 - alpha) / N)
    assert abs(z) < 5, f"the first draft was kept in {kept:.4f} of trials; the rule keeps {alpha:.4f} (z = {z:.1f})"


@pytest.mark.parametrize("p_rows,q_rows,drafts", [
    (np.ones((3, V)) / V, None, np.array([1])),              # p needs k + 1 rows
    (np.ones((2, V)) / V, np.ones((2, V)) / V, np.array([1])),   # q needs k rows
    (np.ones((2, V)) / V, None, np.array([V])),              # a draft outside the vocabulary
    (np.ones((2, V)) / V, None, np.array([-1])),
])
def test_bad_input_raises(p_rows, q_rows, drafts):
    with pytest.raises(ValueError):
        verify(p_rows, q_rows, drafts, np.random.default_rng(0))
