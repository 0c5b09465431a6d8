import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.softmax import (
    logsumexp_online, merge, online_max_and_normalizer, online_softmax, partial_attention, safe_softmax, softmax,
)


@pytest.mark.parametrize("tile", [1, 3, 4, 64, 1000])
@pytest.mark.parametrize("dtype,atol", [(np.float32, 1e-6), (np.float16, 1e-3), (np.float64, 1e-15)])
def test_online_softmax_matches_safe_softmax(tile, dtype, atol, rng):
    x = (rng.normal(size=(5, 300)) * 4).astype(dtype)
    np.testing.assert_allclose(online_softmax(x, tile).astype(np.float64), safe_softmax(x).astype(np.float64), atol=atol)


def test_softmax_overflows_where_safe_softmax_does_not():
    x = np.array([1000.0, 999.0], dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.isnan(softmax(x)).any()
    np.testing.assert_allclose(safe_softmax(x), [1 / (1 + np.e**-1), 1 / (1 + np.e)], rtol=1e-6)


def test_online_max_and_normalizer_equal_two_pass(rng):
    x = rng.normal(size=(3, 97)) * 10
    m, l = online_max_and_normalizer(x, tile=8)
    np.testing.assert_array_equal(m, x.max(-1))
    np.testing.assert_allclose(l, np.exp(x - x.max(-1, keepdims=True)).sum(-1), rtol=1e-12)


def test_logsumexp_online_matches_direct(rng):
    x = rng.normal(size=(4, 50)) * 30
    direct = x.max(-1) + np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1))
    np.testing.assert_allclose(logsumexp_online(x, tile=7), direct, rtol=1e-12)


def test_safe_softmax_all_masked_row_is_zero():
    out = online_softmax(np.full((2, 5), -np.inf), tile=2)
    assert np.all(out == 0)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 40), cuts=st.lists(st.integers(1, 39), max_size=6), seed=st.integers(0, 2**31 - 1),
       order_seed=st.integers(0, 1000), scale=st.sampled_from([1.0, 30.0]))
def test_merge_any_split_any_order_gives_full_attention(n, cuts, seed, order_seed, scale):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(3, n)) * scale
    v = rng.normal(size=(n, 4))
    bounds = sorted({0, n, *[c for c in cuts if c < n]})
    parts = [partial_attention(scores[:, a:b], v[a:b]) for a, b in zip(bounds, bounds[1:])]
    np.random.default_rng(order_seed).shuffle(parts)
    acc = parts[0]
    for p in parts[1:]:
        acc = merge(acc, p) if order_seed % 2 else merge(p, acc)
    np.testing.assert_allclose(acc.finalize(), safe_softmax(scores) @ v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(acc.lse(), logsumexp_online(scores, tile=n), rtol=1e-12)


def test_merge_is_associative(rng):
    s, v = rng.normal(size=(2, 12)) * 5, rng.normal(size=(12, 3))
    a, b, c = (partial_attention(s[:, i:i + 4], v[i:i + 4]) for i in (0, 4, 8))
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    np.testing.assert_allclose(left.finalize(), right.finalize(), rtol=1e-12)


@pytest.mark.parametrize("bad,exc", [(np.array([1, 2, 3]), TypeError), (np.zeros((2, 0)), ValueError)])
def test_online_softmax_rejects_bad_input(bad, exc):
    with pytest.raises(exc):
        online_softmax(bad)


def test_online_softmax_rejects_bad_tile():
    with pytest.raises(ValueError, match="tile"):
        online_softmax(np.zeros(3), tile=0)
