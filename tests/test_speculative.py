"""Speculative decoding (chapter 9): the output is exactly the target's, greedy and sampled.

1. greedy identity with cached_decode; 2. draft = target accepts everything; 3a. exact distributions by
enumerating the accept/resample branches; 3b. chi-square on 10^5 draws, and a broken sampler that fails it;
4. edges; 5. bad input.
"""
import math
from dataclasses import replace

import numpy as np
import pytest

from minillm import ByteTokenizer, Model, ModelConfig, cached_decode, load_model
from minillm.model import init_params
from minillm.speculative import (
    ModelDrafter, NgramDrafter, SpecParams, chi2_sf, chi_square_gof, chi_square_two_sample, emitted_distribution,
    first_token_distribution, residual, sample_probs, speculative_decode, to_probs, verify,
)

TOK = ByteTokenizer()
PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        ",
    "for i in range(10):\n    print(i",
    "    return self._",
    "    if value is None:\n        raise ValueError(",
]
N_NEW = 40
GREEDY = SpecParams()
T1 = SpecParams(temperature=1.0)
T07K = SpecParams(temperature=0.7, top_k=20)


@pytest.fixture(scope="module")
def target():
    return load_model("tiny")


@pytest.fixture(scope="module")
def draft():
    return load_model("draft")


@pytest.fixture(scope="module")
def greedy_refs(target):
    return {p: cached_decode(target, TOK.encode(p), N_NEW).tokens for p in PROMPTS}


def _drafter(kind, draft):
    return ModelDrafter(draft) if kind == "model" else NgramDrafter(n=3)


def _with_max_len(model, max_seq_len):
    return Model(replace(model.config, max_seq_len=max_seq_len), model.params)


# --------------------------------------------------------------------------- 1. greedy identity


@pytest.mark.parametrize("kind", ["model", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_speculative_decode_greedy_matches_cached_decode(target, draft, greedy_refs, kind, k):
    for prompt in PROMPTS:
        res = speculative_decode(target, _drafter(kind, draft), TOK.encode(prompt), N_NEW, k)
        assert res.tokens == greedy_refs[prompt], (kind, k, prompt)
        assert len(res.new_tokens) == N_NEW and sum(res.emitted) == N_NEW
        assert all(a <= p <= k for a, p in zip(res.accepted, res.proposed))


# --------------------------------------------------------------------------- 2. draft = target


@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_speculative_decode_draft_equal_target_accepts_all(target, greedy_refs, k):
    prompt = PROMPTS[0]
    res = speculative_decode(target, ModelDrafter(target), TOK.encode(prompt), N_NEW, k)
    assert res.tokens == greedy_refs[prompt]
    assert res.accepted == res.proposed and res.acceptance_rate == 1.0
    assert all(e == p + 1 for e, p in zip(res.emitted, res.proposed))
    assert all(p == k for p in res.proposed[:-1])              # only the final call is clipped
    assert res.target_calls == math.ceil(N_NEW / (k + 1))
    assert np.all(res.acceptance_per_position()[: min(k, N_NEW - 1)] == 1.0)


def test_speculative_decode_draft_equal_target_sampled_accepts_nearly_all(target):
    """At T=1 p and q come from the same model but different batch shapes (ulp-level differences), so
    min(1, p/q) is 1 up to rounding: acceptance must be ~100% -- and it would collapse if q rows were paired
    with the wrong draft positions."""
    res = speculative_decode(target, ModelDrafter(target), TOK.encode(PROMPTS[1]), N_NEW, 4, params=T1, seed=5)
    assert res.acceptance_rate > 0.99
    assert res.tokens_per_call > 4.5


# --------------------------------------------------------------------------- 3a. exact, by enumeration


def _toy_dist(rng, V, zero_frac=0.3):
    p = rng.random(V) ** 2
    p[rng.random(V) < zero_frac] = 0.0
    if p.sum() == 0:
        p[rng.integers(V)] = 1.0
    return p / p.sum()


def _toy_model(seed, V, zero_frac=0.3):
    """A toy "model": a fixed random next-token distribution (with zeros) for every context tuple."""
    def fn(ctx):
        return _toy_dist(np.random.default_rng([seed, V, len(ctx), *ctx]), V, zero_frac)
    return fn


@pytest.mark.parametrize("V", [3, 4, 5, 6, 7, 8])
def test_first_token_distribution_equals_target_on_toy_vocab(V):
    rng = np.random.default_rng(V)
    for _ in range(50):
        p, q = _toy_dist(rng, V), _toy_dist(rng, V)
        np.testing.assert_allclose(first_token_distribution(p, q), p, rtol=0, atol=1e-12)
        one_hot = np.eye(V)[rng.integers(V)]                   # an n-gram draft
        np.testing.assert_allclose(first_token_distribution(p, one_hot), p, rtol=0, atol=1e-12)


@pytest.mark.parametrize("V", [3, 5, 8])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_emitted_distribution_first_pair_equals_target_chain_rule(V, k):
    p_fn, q_fn = _toy_model(1, V), _toy_model(2, V)
    got = emitted_distribution(p_fn, q_fn, k, n=2)
    for x1 in range(V):
        for x2 in range(V):
            want = p_fn(())[x1] * p_fn((x1,))[x2]
            assert abs(got.get((x1, x2), 0.0) - want) < 1e-12, (x1, x2)
    assert abs(sum(got.values()) - 1) < 1e-12


def test_emitted_distribution_first_triple_equals_target_greedy_and_sampled():
    V, k = 4, 2
    p_fn, q_fn = _toy_model(3, V), _toy_model(4, V)
    got = emitted_distribution(p_fn, q_fn, k, n=3)
    for seq, pr in got.items():
        want = p_fn(())[seq[0]] * p_fn(seq[:1])[seq[1]] * p_fn(seq[:2])[seq[2]]
        assert abs(pr - want) < 1e-12
    one_hot = lambda f: (lambda ctx: np.eye(V)[np.argmax(f(ctx))])  # noqa: E731  temperature 0
    got = emitted_distribution(one_hot(p_fn), one_hot(q_fn), k, n=3)
    assert len(got) == 1 and abs(next(iter(got.values())) - 1) < 1e-12


def _rows(model, ids, params):
    return to_probs(model.forward(np.asarray(ids))[-1], params)[0]


@pytest.mark.parametrize("params", [T1, T07K], ids=["T1", "T0.7-top20"])
def test_first_token_distribution_equals_target_on_real_models(target, draft, params):
    for prompt in ("import ", "    def __init__(self, ", "x = "):
        ids = TOK.encode(prompt)
        p, q = _rows(target, ids, params), _rows(draft, ids, params)
        np.testing.assert_allclose(first_token_distribution(p, q), p, rtol=0, atol=1e-12)


def test_emitted_distribution_first_pair_equals_target_on_real_models(target, draft):
    """k = 2 at T=0.7, top-k 8: enumerate every draft pair and branch; compare with p(x1) p(x2|x1)."""
    params = SpecParams(temperature=0.7, top_k=8)
    prefix = TOK.encode("import ")
    memo = {}

    def fn(model):
        def f(ctx):
            key = (id(model), ctx)
            if key not in memo:
                memo[key] = _rows(model, prefix + list(ctx), params)
            return memo[key]
        return f

    p_fn, q_fn = fn(target), fn(draft)
    got = emitted_distribution(p_fn, q_fn, k=2, n=2)
    p0 = p_fn(())
    for x1 in np.flatnonzero(p0 > 0):
        p1 = p_fn((int(x1),))
        for x2 in np.flatnonzero(p1 > 0):
            assert abs(got.pop((int(x1), int(x2))) - p0[x1] * p1[x2]) < 1e-12
    assert sum(got.values()) < 1e-12                            # nothing left over outside p's support


# --------------------------------------------------------------------------- 3b. exact, by sampling

N_DRAWS = 100_000


def _first_tokens(p, q, seed, verify_fn=verify):
    """N_DRAWS first emitted tokens at one prefix (k = 1), through the real draft draw and verify():
    d ~ q, then verify against rows [p, p] (the bonus row does not affect the first token)."""
    rng = np.random.default_rng(seed)
    d = sample_probs(q, rng.random(N_DRAWS))
    n_acc, nxt = verify_fn(np.stack([p, p]), q[None], d[:, None], rng)
    return np.where(n_acc >= 1, d, nxt)


def _broken_verify(p_rows, q_rows, draft_tokens, rng):
    """Greedy acceptance at T > 0 (accept only when the draft is the target's argmax), residual otherwise."""
    d = draft_tokens[:, 0]
    n_acc = (d == np.argmax(p_rows[0])).astype(np.int64)
    res = residual(p_rows[0], q_rows[0])
    nxt = sample_probs(p_rows[0] if res is None else res, rng.random(d.size))
    return n_acc, nxt


def _resample_from_target_verify(p_rows, q_rows, draft_tokens, rng):
    """A subtler classic bug: the right acceptance test, but a rejection resamples from p, not max(p - q, 0)."""
    d = draft_tokens[:, 0]
    n_acc = (rng.random(d.size) * q_rows[0, d] < p_rows[0, d]).astype(np.int64)
    return n_acc, sample_probs(p_rows[0], rng.random(d.size))


def _real_pq(target, draft, params, prompt="import "):
    ids = TOK.encode(prompt)
    return _rows(target, ids, params), _rows(draft, ids, params)


@pytest.mark.parametrize("params", [T1, T07K], ids=["T1", "T0.7-top20"])
def test_verify_first_token_chi_square_matches_target(target, draft, params):
    """10^5 draws of the first emitted token at the prefix "import " (target tiny, drafter draft, k = 1).

    Statistic: Pearson's X^2 = sum (O - E)^2 / E over the target's tokens, pooling bins with E < 5; dof =
    bins - 1; p-value = chi-square survival function (regularized upper incomplete gamma). Pass: p > 1e-3
    for each of 4 seeds (a correct sampler fails one seed with probability ~4e-3).
    """
    p, q = _real_pq(target, draft, params)
    for seed in range(4):
        counts = np.bincount(_first_tokens(p, q, seed), minlength=p.size)
        stat, dof, pval = chi_square_gof(counts, p)
        assert dof >= 10 and pval > 1e-3, (seed, stat, dof, pval)


@pytest.mark.parametrize("broken", [_broken_verify, _resample_from_target_verify], ids=["argmax-accept", "resample-p"])
@pytest.mark.parametrize("params", [T1, T07K], ids=["T1", "T0.7-top20"])
def test_verify_first_token_chi_square_rejects_broken_sampler(target, draft, params, broken):
    """The same test on two broken samplers -- greedy acceptance at T > 0 (accept only on an argmax match), and
    resampling a rejection from p instead of the residual -- must fail it: p < 1e-3 for every seed."""
    p, q = _real_pq(target, draft, params)
    for seed in range(2):
        counts = np.bincount(_first_tokens(p, q, seed, broken), minlength=p.size)
        stat, dof, pval = chi_square_gof(counts, p)
        assert pval < 1e-3, (seed, stat, dof, pval)


def test_chi2_sf_matches_known_values():
    assert abs(chi2_sf(3.841458820694124, 1) - 0.05) < 1e-12          # the textbook 5% critical values
    assert abs(chi2_sf(18.307038053275146, 10) - 0.05) < 1e-12
    for x in (0.1, 1.0, 4.0, 10.0, 40.0):
        assert abs(chi2_sf(x, 1) - math.erfc(math.sqrt(x / 2))) < 1e-12   # closed forms for dof 1, 2, 4
        assert abs(chi2_sf(x, 2) - math.exp(-x / 2)) < 1e-12
        assert abs(chi2_sf(x, 4) - math.exp(-x / 2) * (1 + x / 2)) < 1e-12
    assert abs(chi2_sf(100.0, 100) - 0.48119168452796) < 1e-9
    assert chi2_sf(0.0, 5) == 1.0 and chi2_sf(math.inf, 5) == 0.0


def test_chi_square_gof_pools_small_bins_and_fails_on_impossible_tokens():
    probs = np.array([0.5, 0.4999, 0.0001, 0.0])
    stat, dof, pval = chi_square_gof(np.array([500, 499, 1, 0]), probs)   # E = [500, 499.9, 0.1, 0]
    assert dof == 1 and pval > 0.5                                        # the 0.1 bin is pooled
    assert chi_square_gof(np.array([500, 499, 0, 1]), probs)[2] == 0.0    # a token with p = 0 was drawn


# --------------------------------------------------------------------------- 4. edges


def test_verify_q_zero_on_target_likely_tokens():
    p = np.array([0.5, 0.3, 0.2, 0.0, 0.0])
    q = np.array([0.0, 0.0, 0.5, 0.25, 0.25])                   # q misses p's two likeliest tokens
    np.testing.assert_allclose(first_token_distribution(p, q), p, rtol=0, atol=1e-15)
    counts = np.bincount(_first_tokens(p, q, seed=0), minlength=p.size)
    assert counts[3] == counts[4] == 0
    assert chi_square_gof(counts, p)[2] > 1e-3


def test_verify_p_equal_q_never_rejects_and_never_divides():
    rng = np.random.default_rng(0)
    p = _toy_dist(rng, 8)
    assert residual(p, p) is None
    np.testing.assert_allclose(first_token_distribution(p, p), p, rtol=0, atol=1e-15)
    k = 3
    d = np.stack([sample_probs(p, rng.random(5000)) for _ in range(k)], axis=1)
    with np.errstate(all="raise"):
        n_acc, nxt = verify(np.tile(p, (k + 1, 1)), np.tile(p, (k, 1)), d, rng)
    assert np.all(n_acc == k)
    assert set(np.unique(nxt)) <= set(np.flatnonzero(p > 0))


def test_verify_k_zero_is_a_plain_target_step():
    p = np.array([[0.0, 0.0, 1.0]])
    assert verify(p, None, [], np.random.default_rng(0)) == (0, 2)


def test_speculative_decode_last_token_before_max_seq_len(target, draft):
    """prompt + n_new - 1 == max_seq_len: the last round is clipped to the positions left, and the draft's own
    shorter max_seq_len clips its proposals too; output is still the target's greedy output."""
    small_t = _with_max_len(target, 40)
    prompt = TOK.encode(PROMPTS[2])[:30]
    n_new = 40 - 30 + 1
    ref = cached_decode(small_t, prompt, n_new).tokens
    for drafter in (ModelDrafter(_with_max_len(draft, 36)), ModelDrafter(draft), NgramDrafter()):
        res = speculative_decode(small_t, drafter, prompt, n_new, k=8)
        assert res.tokens == ref and len(res.tokens) == 41
    with pytest.raises(ValueError, match="max_seq_len"):
        speculative_decode(small_t, NgramDrafter(), prompt, n_new + 1, k=8)


def test_speculative_decode_k_larger_than_tokens_left(target, draft, greedy_refs):
    prompt = TOK.encode(PROMPTS[0])
    ref = cached_decode(target, prompt, 3).tokens
    assert ref == greedy_refs[PROMPTS[0]][: len(prompt) + 3]
    for drafter in (ModelDrafter(draft), ModelDrafter(target)):
        res = speculative_decode(target, drafter, prompt, 3, k=8)
        assert res.tokens == ref and res.proposed[0] == 2          # clipped to n_new - 1 drafts
    res = speculative_decode(target, ModelDrafter(draft), prompt, 1, k=8)
    assert res.tokens == ref[:-2] and res.proposed == [0]         # one token: a plain target step


def test_speculative_decode_stops_at_eos_inside_accepted_run(target, greedy_refs):
    """Draft = target with k = 8 accepts whole runs; a stop token inside a run ends the output right there."""
    prompt = TOK.encode(PROMPTS[3])
    new = greedy_refs[PROMPTS[3]][len(prompt):]
    stop = new[5]                                                  # the 6th new token, mid-way through run 1
    cut = new.index(stop) + 1
    res = speculative_decode(target, ModelDrafter(target), prompt, N_NEW, k=8,
                             params=SpecParams(stop_token_ids=(stop,)))
    assert res.new_tokens == new[:cut] and res.finish_reason == "stop"
    assert res.accepted[-1] >= cut and res.emitted[-1] < res.accepted[-1] + 1   # the run was cut short
    assert speculative_decode(target, ModelDrafter(target), prompt, N_NEW, 8).finish_reason == "length"


def test_sample_probs_vocab_boundary():
    V = 259
    last, first = np.eye(V)[V - 1], np.eye(V)[0]
    u = np.array([0.0, 0.5, np.nextafter(1.0, 0.0)])
    assert list(sample_probs(last, u)) == [V - 1] * 3
    assert list(sample_probs(first, u)) == [0] * 3
    edges = np.zeros(V)
    edges[[0, V - 1]] = 0.5
    assert set(sample_probs(edges, np.random.default_rng(0).random(1000))) == {0, V - 1}
    # a residual whose only mass is on the last id, reached by rejecting a draft of id 0
    p = np.zeros((2, V))
    p[:, V - 1] = 1.0
    assert verify(p, first[None], [0], np.random.default_rng(0)) == (0, V - 1)


def test_ngram_drafter_proposes_latest_match_and_handles_vocab_edges(target):
    dr = NgramDrafter(n=2)
    assert dr.lookup([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 3) == [4, 5, 1]       # latest "1 2" wins
    assert dr.lookup([7, 7, 7], 4) == [7, 7, 7, 7]                        # copies through its own proposal
    assert dr.lookup([1, 2, 3], 4) == []                                  # no earlier match at n = 2 or 1
    assert dr.lookup([5, 1, 6, 1], 2) == [6, 1]                           # falls back to n = 1
    prompt = [0, 258, 0, 258, 0, 258, 0]                                  # the vocabulary's two ends
    res = speculative_decode(target, NgramDrafter(n=2), prompt, 12, k=4)
    assert res.tokens == cached_decode(target, prompt, 12).tokens and res.proposed[0] == 4


def test_speculative_decode_sampled_run_is_seeded_and_reports_stats(target, draft):
    prompt = TOK.encode(PROMPTS[4])
    a = speculative_decode(target, ModelDrafter(draft), prompt, 20, 4, params=T07K, seed=3)
    b = speculative_decode(target, ModelDrafter(draft), prompt, 20, 4, params=T07K, seed=3)
    assert a.tokens == b.tokens and len(a.new_tokens) == 20
    assert a.target_calls == len(a.accepted) == len(a.emitted) and sum(a.emitted) == 20
    alpha = a.acceptance_per_position()
    assert alpha.shape == (4,) and np.all((alpha[~np.isnan(alpha)] >= 0) & (alpha[~np.isnan(alpha)] <= 1))


# --------------------------------------------------------------------------- 5. bad input


@pytest.mark.parametrize("k", [0, -1, 1.5, True, None])
def test_speculative_decode_rejects_bad_k(target, k):
    with pytest.raises(ValueError, match="k"):
        speculative_decode(target, NgramDrafter(), [1, 2, 3], 4, k)


def test_speculative_decode_rejects_drafter_with_other_vocab(target):
    cfg = ModelConfig(vocab_size=100, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=64)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_decode(target, ModelDrafter(Model(cfg, init_params(cfg))), [1, 2, 3], 4, 2)


def test_speculative_decode_bad_settings_raise_clear_errors(target):
    with pytest.raises(ValueError, match="n"):
        NgramDrafter(n=0)
    with pytest.raises(ValueError, match="temperature"):
        SpecParams(temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        SpecParams(temperature=1.0, top_k=0)
    with pytest.raises(ValueError, match="empty"):
        speculative_decode(target, NgramDrafter(), [], 4, 2)
    with pytest.raises(ValueError, match="p_rows"):
        verify(np.ones((2, 3)) / 3, None, [0, 1], np.random.default_rng(0))


def test_chi_square_two_sample_accepts_one_distribution_and_rejects_two():
    rng = np.random.default_rng(0)
    p, q = np.array([0.5, 0.3, 0.15, 0.05]), np.array([0.3, 0.3, 0.3, 0.1])
    same = chi_square_two_sample(rng.choice(4, 5000, p=p), rng.choice(4, 5000, p=p))
    diff = chi_square_two_sample(rng.choice(4, 5000, p=p), rng.choice(4, 5000, p=q))
    assert same[1] == 3 and same[2] > 1e-3 and diff[2] < 1e-12
    rare = chi_square_two_sample(np.array([0] * 50 + [7]), np.array([0] * 50 + [8]))   # 7 and 8 pooled
    assert rare[1] == 1 and rare[2] > 0.5
    with pytest.raises(ValueError):
        chi_square_two_sample([], [1])
