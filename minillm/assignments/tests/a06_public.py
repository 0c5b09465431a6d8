"""Assignment 6, public tests: the FlashAttention forward in NumPy and in Triton."""
import numpy as np
import pytest

from minillm.attention import flash_attention
from oracles import standard_attention


def _qkv(rng, b, hq, hkv, nq, nk, d, dtype=np.float64):
    return (rng.normal(size=(b, hq, nq, d)).astype(dtype), rng.normal(size=(b, hkv, nk, d)).astype(dtype),
            rng.normal(size=(b, hkv, nk, d)).astype(dtype))


def test_numpy_flash_matches_standard(rng):
    q, k, v = _qkv(rng, 1, 2, 2, 20, 20, 8)
    np.testing.assert_allclose(flash_attention(q, k, v, block_m=8, block_n=8), standard_attention(q, k, v),
                               rtol=1e-10, atol=1e-12)


def test_numpy_flash_causal_matches_standard(rng):
    q, k, v = _qkv(rng, 2, 2, 2, 17, 17, 4)
    np.testing.assert_allclose(flash_attention(q, k, v, causal=True, block_m=4, block_n=4),
                               standard_attention(q, k, v, causal=True), rtol=1e-10, atol=1e-12)


def test_triton_flash_forward_matches_reference(rng):
    import torch

    from minillm.kernels.flash_attention import flash_attention as triton_flash

    q, k, v = _qkv(rng, 1, 2, 2, 20, 20, 16, np.float32)
    o = triton_flash(*(torch.from_numpy(x) for x in (q, k, v)), causal=True).numpy()
    np.testing.assert_allclose(o, standard_attention(q, k, v, causal=True), rtol=1e-4, atol=1e-5)


@pytest.mark.stretch
def test_numpy_flash_backward_matches_dense_gradients(rng):
    from minillm.attention import flash_attention_backward
    from oracles import safe_softmax

    q, k, v = _qkv(rng, 1, 2, 2, 7, 7, 4)
    scale = 1 / np.sqrt(4)
    s = q @ k.swapaxes(-1, -2) * scale
    p = safe_softmax(s)
    o = p @ v
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    do = rng.normal(size=o.shape)
    dp = do @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    want = (ds @ k * scale, ds.swapaxes(-1, -2) @ q * scale, p.swapaxes(-1, -2) @ do)
    got = flash_attention_backward(q, k, v, o, lse, do, block_m=3, block_n=2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11)
