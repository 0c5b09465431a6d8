"""Assignment 6, grader-only tests: a length under a memory cap that dense attention (even by row blocks) cannot
meet, odd lengths, GQA ratios, causal masks with Nq != Nk, tiny blocks, huge logits, the log-sum-exp, bad input;
the Triton forward on the same cases; the backward (stretch). Core: the memory cap, the hard shapes (causal
alignment included) in NumPy and in Triton (several key tiles: the accumulator's rescale)."""
import numpy as np
import pytest

from minillm.attention import flash_attention, flash_attention_backward
from oracles import causal_mask, standard_attention


def _qkv(rng, b, hq, hkv, nq, nk, d, dtype=np.float64):
    return (rng.normal(size=(b, hq, nq, d)).astype(dtype), rng.normal(size=(b, hkv, nk, d)).astype(dtype),
            rng.normal(size=(b, hkv, nk, d)).astype(dtype))


def _scores(q, k, causal, scale=None):
    g = q.shape[1] // k.shape[1]
    kk = np.repeat(k, g, axis=1)
    s = q @ kk.swapaxes(-1, -2) * (scale if scale is not None else 1 / np.sqrt(q.shape[-1]))
    return np.where(causal_mask(q.shape[2], k.shape[2]), s, -np.inf) if causal else s


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal, block_m, block_n)
    (1, 4, 1, 13, 13, 8, False, 5, 3),     # GQA 4:1, odd length, ragged tiles
    (2, 6, 2, 7, 19, 4, True, 3, 4),       # causal, fewer queries than keys
    (1, 2, 2, 9, 5, 4, True, 2, 2),        # causal, more queries than keys: first rows see nothing
    (1, 2, 1, 6, 6, 3, True, 1, 1),        # tiny blocks, odd head dim
    (1, 1, 1, 5, 40, 8, False, 64, 64),    # blocks larger than the sequence
]


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_flash_fits_a_memory_cap_dense_attention_cannot(rng, causal):
    """N = 4096 under 1.5 MB of temporaries: the (N, N) scores take 128 MB, and even one row block of them
    (128 x 4096) 4 MB, so only key tiles streamed through a running softmax fit."""
    import tracemalloc

    q, k, v = _qkv(rng, 1, 1, 1, 4096, 4096, 4)
    tracemalloc.start()
    try:
        o = flash_attention(q, k, v, causal=causal, block_m=128, block_n=32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_500_000, f"{peak / 1e6:.1f} MB of temporaries"
    rows = slice(0, 4096, 257)   # a sample of rows against the oracle (all of them would need the dense matrix)
    want = standard_attention(q[:, :, rows], k, v) if not causal else None
    if causal:
        s = q[0, 0, rows] @ k[0, 0].T / 2.0
        s = np.where(np.arange(4096)[None, :] <= np.arange(4096)[rows][:, None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = ((p / p.sum(-1, keepdims=True)) @ v[0, 0])[None, None]
    np.testing.assert_allclose(o[:, :, rows], want, rtol=1e-9, atol=1e-12)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("case", CASES)
def test_numpy_flash_hard_shapes(rng, case):
    *shape, causal, bm, bn = case
    q, k, v = _qkv(rng, *shape)
    o, lse = flash_attention(q, k, v, causal=causal, block_m=bm, block_n=bn, return_lse=True)
    np.testing.assert_allclose(o, standard_attention(q, k, v, causal=causal), rtol=1e-10, atol=1e-12)
    s = _scores(q, k, causal)
    m = s.max(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(np.isfinite(m), np.log(np.exp(s - np.where(np.isfinite(m), m, 0)[..., None]).sum(-1)) + m,
                        -np.inf)
    np.testing.assert_allclose(lse, want, rtol=1e-10)


def test_numpy_flash_huge_logits_and_scale(rng):
    q, k, v = _qkv(rng, 1, 2, 1, 11, 11, 4)
    q *= 300.0
    o = flash_attention(q, k, v, causal=True, scale=0.7, block_m=4, block_n=3)
    assert np.all(np.isfinite(o))
    np.testing.assert_allclose(o, standard_attention(q, k, v, causal=True, scale=0.7), rtol=1e-9, atol=1e-12)


def test_numpy_flash_keeps_fp32(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 10, 10, 8, np.float32)
    o = flash_attention(q, k, v, block_m=4, block_n=4)
    assert o.dtype == np.float32
    np.testing.assert_allclose(o, standard_attention(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["block", "heads", "rank", "kv"])
def test_numpy_flash_bad_input_raises(rng, case):
    q, k, v = _qkv(rng, 1, 4, 2, 6, 6, 4)
    kw = {}
    if case == "block":
        kw = {"block_m": 0}
    elif case == "heads":
        q = q[:, :3]
    elif case == "rank":
        q = q[0]
    else:
        v = v[:, :, :5]
    with pytest.raises(ValueError):
        flash_attention(q, k, v, **kw)


def _triton(q, k, v, **kw):
    import torch

    from minillm.kernels.flash_attention import flash_attention as triton_flash

    out = triton_flash(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v)), **kw)
    return tuple(t.numpy() for t in out) if isinstance(out, tuple) else out.numpy()


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("case", [(1, 4, 2, 19, 19, 16, True), (1, 2, 1, 5, 21, 24, True),
                                  (2, 2, 2, 17, 9, 16, False)])
def test_triton_flash_hard_shapes(rng, case):
    *shape, causal = case
    q, k, v = _qkv(rng, *shape, dtype=np.float32)
    o, lse = _triton(q, k, v, causal=causal, return_lse=True)
    np.testing.assert_allclose(o, standard_attention(q, k, v, causal=causal), rtol=1e-4, atol=1e-5)
    s = _scores(q.astype(np.float64), k.astype(np.float64), causal)
    m = s.max(-1)
    np.testing.assert_allclose(lse, np.log(np.exp(s - m[..., None]).sum(-1)) + m, rtol=1e-4, atol=1e-4)


def test_triton_flash_huge_logits(rng):
    q, k, v = _qkv(rng, 1, 1, 1, 18, 18, 16, np.float32)
    q *= 100.0
    o = _triton(q, k, v, causal=False)
    assert np.all(np.isfinite(o))
    np.testing.assert_allclose(o, standard_attention(q.astype(np.float64), k, v), rtol=1e-3, atol=1e-4)


def _dense_backward(q, k, v, do, causal):
    """Gradients of standard attention, from the dense P (the oracle for the tiled backward)."""
    g = q.shape[1] // k.shape[1]
    scale = 1 / np.sqrt(q.shape[-1])
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = _scores(q, k, causal)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dv = p.swapaxes(-1, -2) @ do
    dp = do @ vv.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ kk * scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    fold = lambda x: x.reshape(k.shape[0], k.shape[1], g, *x.shape[2:]).sum(2)
    return dq, fold(dk), fold(dv)


@pytest.mark.stretch
@pytest.mark.points(3)
@pytest.mark.parametrize("case", [(1, 2, 2, 9, 9, 4, False, 4, 3), (2, 4, 2, 7, 12, 8, True, 3, 5)])
def test_numpy_flash_backward_matches_dense_gradients(rng, case):
    *shape, causal, bm, bn = case
    q, k, v = _qkv(rng, *shape)
    o = standard_attention(q, k, v, causal=causal)
    s = _scores(q, k, causal)
    m = s.max(-1)
    lse = np.log(np.exp(s - m[..., None]).sum(-1)) + m
    do = rng.normal(size=o.shape)
    got = flash_attention_backward(q, k, v, o, lse, do, causal=causal, block_m=bm, block_n=bn)
    for g, w in zip(got, _dense_backward(q, k, v, do, causal)):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11)


@pytest.mark.stretch
def test_numpy_flash_backward_bad_shapes_raise(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 4, 4, 4)
    with pytest.raises(ValueError):
        flash_attention_backward(q, k, v, q, np.zeros((1, 2, 3)), q)
