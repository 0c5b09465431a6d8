"""The engine's batched samplers: seeded draws, the draft sampler and the speculative verifier.

The verifier's exactness is checked by sampling: many rows with the same logits and different seeds, so
each row is an independent draw of "the first token a speculative round emits". Test statistic: Pearson's
chi-square goodness of fit against the target distribution p (bins with expected count < 5 pooled);
threshold: p-value > 1e-3 for every seed offset. A verifier that forgets the draft probabilities must fail
the same test.
"""
import numpy as np
import pytest

from minillm.sampling import (ACCEPT, DRAFT, RESIDUAL, counter_uniform, draft_batch, sample_batch, shaped_probs,
                              sub_seed, verify_batch)
from minillm.speculative import chi_square_gof

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
