import numpy as np
import pytest

from minillm.attention import causal_mask, standard_attention


def loop_attention(q, k, v, causal, scale):
    """Row-by-row float64 attention written with Python loops: the slowest, plainest truth."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = np.zeros((B, Hq, Nq, D))
    for b in range(B):
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            for i in range(Nq):
                visible = [j for j in range(Nk) if not causal or j <= i + Nk - Nq]
                if not visible:
                    continue
                s = np.array([q[b, h, i] @ k[b, kv, j] * scale for j in visible])
                p = np.exp(s - s.max())
                out[b, h, i] = (p / p.sum()) @ v[b, kv, visible]
    return out


@pytest.mark.parametrize("nq,nk", [(1, 1), (5, 5), (1, 9), (3, 8), (8, 3)])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_standard_attention_matches_loops(nq, nk, hq, hkv, causal, rng):
    q = rng.normal(size=(2, hq, nq, 8))
    k, v = rng.normal(size=(2, 2, hkv, nk, 8))
    got = standard_attention(q, k, v, causal=causal)
    np.testing.assert_allclose(got, loop_attention(q, k, v, causal, 8**-0.5), atol=1e-12)


def test_causal_mask_bottom_right_alignment():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_standard_attention_fully_masked_rows_are_zero(rng):
    q = rng.normal(size=(1, 1, 5, 4))
    k, v = rng.normal(size=(2, 1, 1, 2, 4))
    out = standard_attention(q, k, v, causal=True)  # rows 0..2 see no key
    assert np.all(out[0, 0, :3] == 0) and np.all(np.isfinite(out))


def test_standard_attention_gqa_equals_repeated_kv(rng):
    q = rng.normal(size=(1, 6, 4, 8)).astype(np.float32)
    k, v = rng.normal(size=(2, 1, 2, 4, 8)).astype(np.float32)
    rep = lambda t: np.repeat(t, 3, axis=1)  # noqa: E731
    np.testing.assert_array_equal(standard_attention(q, k, v, True), standard_attention(q, rep(k), rep(v), True))


def test_standard_attention_large_logits_stay_finite(rng):
    q = rng.normal(size=(1, 2, 16, 8)) * 100
    k, v = rng.normal(size=(2, 1, 2, 16, 8))
    out = standard_attention(q, k, v, causal=True)
    np.testing.assert_allclose(out, loop_attention(q, k, v, True, 8**-0.5), atol=1e-9)


def test_standard_attention_keeps_float16_dtype(rng):
    q, k, v = rng.normal(size=(3, 1, 2, 4, 8)).astype(np.float16)
    assert standard_attention(q, k, v).dtype == np.float16


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((1, 2, 3, 8), (1, 2, 3, 8), (1, 2, 4, 8)), "same shape"),
        (((1, 3, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "multiple"),
        (((1, 2, 3, 8), (1, 2, 3, 4), (1, 2, 3, 4)), "disagree"),
        (((2, 3, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "4-D"),
        (((1, 2, 0, 8), (1, 2, 3, 8), (1, 2, 3, 8)), "empty"),
    ],
)
def test_standard_attention_rejects_bad_shapes(shapes, match):
    q, k, v = (np.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        standard_attention(q, k, v)


def test_standard_attention_gqa_with_all_kv_heads_is_mha(rng):
    """MHA is the GQA setting n_kv_heads == n_heads: each head attends with its own K and V."""
    q, k, v = rng.normal(size=(3, 2, 4, 6, 8))
    mha = np.stack([[loop_attention(q[b:b + 1, h:h + 1], k[b:b + 1, h:h + 1], v[b:b + 1, h:h + 1], True, 8**-0.5)[0, 0]
                     for h in range(4)] for b in range(2)])
    np.testing.assert_allclose(standard_attention(q, k, v, causal=True), mha, atol=1e-12)
