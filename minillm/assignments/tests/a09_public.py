"""Assignment 9, public tests: the rejection sampler. Test statistic for the sampling test: Pearson's
chi-square goodness of fit of the first emitted token against p (bins with expected count < 5 pooled),
threshold p-value > 1e-3."""
import numpy as np

from minillm.speculative import residual, verify
from oracles import chi_square_gof

V = 8


def dists(seed):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, 0.7)), rng.dirichlet(np.full(V, 0.7))


def test_residual_normalizes_and_has_no_mass_when_p_equals_q():
    p, q = dists(0)
    r = residual(p, q)
    np.testing.assert_allclose(r, np.maximum(p - q, 0) / np.maximum(p - q, 0).sum())
    assert residual(p, p) is None


def test_greedy_rows_accept_only_the_argmax():
    p = np.eye(V)[[2, 5]]                       # one-hot target rows: greedy
    q = np.eye(V)[[2]]
    n_acc, nxt = verify(p, q, np.array([2]), np.random.default_rng(0))
    assert (n_acc, nxt) == (1, 5)
    n_acc, nxt = verify(p, np.eye(V)[[4]], np.array([4]), np.random.default_rng(0))
    assert (n_acc, nxt) == (0, 2)


def test_first_emitted_token_follows_the_target():
    p, q = dists(1)
    rng = np.random.default_rng(1)
    n = 100_000
    drafts = rng.choice(V, size=(n, 1), p=q)
    n_acc, nxt = verify(np.stack([p, p]), q[None], drafts, rng)
    first = np.where(n_acc >= 1, drafts[:, 0], nxt)
    assert chi_square_gof(np.bincount(first, minlength=V), p)[2] > 1e-3
