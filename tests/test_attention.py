import numpy as np
import pytest

from minillm.attention import TILE_FULL, TILE_MASKED, TILE_SKIPPED, causal_mask, standard_attention, tile_plan


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


from minillm.attention import flash_attention, flash_attention_backward  # noqa: E402


@pytest.mark.parametrize("nq,nk", [(1, 1), (7, 7), (63, 63), (65, 65), (1, 100), (5, 130), (70, 20)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 1)])
def test_flash_attention_matches_standard(nq, nk, causal, hq, hkv, rng):
    q = rng.normal(size=(2, hq, nq, 16))
    k, v = rng.normal(size=(2, 2, hkv, nk, 16))
    o, lse = flash_attention(q, k, v, causal=causal, block_m=16, block_n=32, return_lse=True)
    np.testing.assert_allclose(o, standard_attention(q, k, v, causal=causal), atol=1e-12)
    s = np.repeat(k, hq // hkv, 1)
    scores = (q @ s.swapaxes(-1, -2)) / 4.0
    if causal:
        scores = np.where(causal_mask(nq, nk), scores, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        ref_lse = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
    np.testing.assert_allclose(lse[np.isfinite(ref_lse)], ref_lse[np.isfinite(ref_lse)], atol=1e-12)


def test_flash_attention_large_logits_and_float16(rng):
    q = (rng.normal(size=(1, 2, 40, 32)) * 100).astype(np.float16)
    k, v = rng.normal(size=(2, 1, 2, 40, 32)).astype(np.float16)
    np.testing.assert_allclose(flash_attention(q, k, v, causal=True, block_m=8, block_n=8).astype(np.float64),
                               standard_attention(q, k, v, causal=True).astype(np.float64), atol=2e-3)


def dense_attention_grads(q, k, v, do, causal, scale):
    """Gradients of standard attention from the full P matrix (float64), GQA summed per KV head."""
    g = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, g, 1), np.repeat(v, g, 1)
    s = q @ kr.swapaxes(-1, -2) * scale
    if causal:
        s = np.where(causal_mask(q.shape[2], k.shape[2]), s, -np.inf)
    m = np.where(np.isfinite(s.max(-1, keepdims=True)), s.max(-1, keepdims=True), 0)
    p = np.exp(s - m)
    p = p / np.where(p.sum(-1, keepdims=True) > 0, p.sum(-1, keepdims=True), 1)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ vr.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kr * scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    fold = lambda t: t.reshape(t.shape[0], k.shape[1], g, *t.shape[2:]).sum(2)  # noqa: E731
    return dq, fold(dk), fold(dv)


@pytest.mark.parametrize("nq,nk,causal", [(9, 9, True), (33, 33, False), (4, 21, True), (17, 5, False)])
def test_flash_attention_backward_matches_dense_gradients(nq, nk, causal, rng):
    q = rng.normal(size=(1, 4, nq, 8))
    k, v = rng.normal(size=(2, 1, 2, nk, 8))
    do = rng.normal(size=q.shape)
    o, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    got = flash_attention_backward(q, k, v, o, lse, do, causal=causal, block_m=4, block_n=8)
    for g_, r_ in zip(got, dense_attention_grads(q, k, v, do, causal, 8**-0.5)):
        np.testing.assert_allclose(g_, r_, atol=1e-10)


def test_flash_attention_backward_matches_finite_differences(rng):
    q, k, v = rng.normal(size=(3, 1, 1, 5, 4))
    do = rng.normal(size=q.shape)
    o, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, causal=True)
    eps = 1e-6
    for arr, grad in ((q, dq), (k, dk), (v, dv)):
        idx = (0, 0, 2, 1)
        plus, minus = arr.copy(), arr.copy()
        plus[idx] += eps
        minus[idx] -= eps
        args_p = [plus if a is arr else a for a in (q, k, v)]
        args_m = [minus if a is arr else a for a in (q, k, v)]
        num = ((flash_attention(*args_p, causal=True) - flash_attention(*args_m, causal=True)) * do).sum() / (2 * eps)
        assert grad[idx] == pytest.approx(num, rel=1e-5, abs=1e-8)


def test_flash_attention_runs_at_4096_without_n_by_n(rng):
    q = rng.normal(size=(1, 2, 4096, 32)).astype(np.float32)
    k, v = rng.normal(size=(2, 1, 1, 4096, 32)).astype(np.float32)
    o = flash_attention(q, k, v, causal=True, block_m=256, block_n=256)
    np.testing.assert_allclose(o[:, :, -8:], standard_attention(q[:, :, -8:], k, v, causal=True), atol=1e-5)


def test_flash_attention_backward_rejects_wrong_shapes(rng):
    q, k, v = rng.normal(size=(3, 1, 2, 4, 8))
    with pytest.raises(ValueError, match="lse"):
        flash_attention_backward(q, k, v, q, np.zeros((1, 2)), q)


@pytest.mark.parametrize("nq,nk", [(64, 64), (100, 100), (37, 90), (90, 37), (1, 50), (128, 128)])
@pytest.mark.parametrize("bm,bn", [(16, 16), (32, 16), (16, 32), (64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_plan_agrees_with_the_mask(nq, nk, bm, bn, causal):
    plan = tile_plan(nq, nk, bm, bn, causal)
    visible = causal_mask(nq, nk) if causal else np.ones((nq, nk), bool)
    assert plan.shape == (-(-nq // bm), -(-nk // bn))
    for i in range(plan.shape[0]):
        for j in range(plan.shape[1]):
            tile = visible[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            full_width = tile.shape[1] == bn  # rows past nq are never stored, so they need no mask
            if plan[i, j] == TILE_FULL:      # no mask needed: every entry visible and no ragged edge
                assert tile.all() and full_width
            elif plan[i, j] == TILE_SKIPPED:  # never loaded: nothing in it is visible
                assert not tile.any()
            else:
                assert plan[i, j] == TILE_MASKED
            if tile.any():
                assert plan[i, j] != TILE_SKIPPED


def test_tile_plan_causal_skips_about_half():
    plan = tile_plan(4096, 4096, 128, 128, causal=True)
    assert (plan == TILE_SKIPPED).sum() == 32 * 31 // 2
    assert (plan == TILE_MASKED).sum() == 32  # only the diagonal tiles pay for the mask
    assert (tile_plan(4096, 4096, 128, 128, causal=False) == TILE_FULL).all()


@pytest.mark.parametrize("bad", [0, -1, 2.5, None])
def test_tile_plan_rejects_bad_sizes(bad):
    with pytest.raises(ValueError):
        tile_plan(64, 64, bad, 16, causal=True)


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_attention_references_reject_non_floating_dtypes(dtype, which):
    """Integer q/k/v used to give an integer (truncated) output, silently."""
    from minillm.attention import flash_attention, flash_attention_backward

    qkv = [np.ones((1, 2, 3, 4), np.float32) for _ in range(3)]
    qkv[which] = qkv[which].astype(dtype)
    name = "qkv"[which]
    for fn in (standard_attention, flash_attention):
        with pytest.raises(ValueError, match=f"{name} must have a floating-point dtype, got {np.dtype(dtype)}"):
            fn(*qkv)
    o, lse = np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="floating-point dtype"):
        flash_attention_backward(*qkv, o, lse, o)
