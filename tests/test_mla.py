import numpy as np
import pytest

from minillm.kvcache import CacheFull
from minillm.mla import (MLACache, MLAConfig, init_mla_params, mla_attention_absorbed,
                         mla_attention_decompress, mla_cache_bytes_per_token)
from minillm.model import apply_rope, rope_tables

# v_head_dim (12) differs from the q/k head dim (16 + 8): the decompressed path must pad V.
CFG = MLAConfig(d_model=64, n_heads=4, kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=12)
PATHS = [mla_attention_decompress, mla_attention_absorbed]
ATOL = 1e-4  # float32 on both paths; only the order of the matmuls differs


def expected_mla_kv_bytes(n_tokens, n_layers, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1):
    try:
        from minillm.sizing import mla_kv_bytes
    except ImportError:  # written concurrently; the formula it must agree with:
        return batch * n_tokens * n_layers * (kv_lora_rank + qk_rope_dim) * dtype_bytes
    return mla_kv_bytes(n_tokens, n_layers, kv_lora_rank, qk_rope_dim, dtype_bytes=dtype_bytes, batch=batch)


@pytest.fixture(scope="module")
def params():
    return init_mla_params(CFG, seed=1)


def _tokens(rng, batch, n):
    return rng.normal(size=(batch, n, CFG.d_model)).astype(np.float32)


def test_mla_attention_paths_agree_prefill_then_decode(params, rng):
    x = _tokens(rng, 2, 11)
    caches = [MLACache.allocate(CFG, batch=2, capacity=11) for _ in PATHS]
    outs = [f(params, CFG, x[:, :6], c, 0) for f, c in zip(PATHS, caches)]
    np.testing.assert_allclose(outs[0], outs[1], atol=ATOL, rtol=0)
    steps = [outs[0]]
    for t in range(6, 11):  # decode: one new token at a time against the cache
        a, b = (f(params, CFG, x[:, t:t + 1], c, t) for f, c in zip(PATHS, caches))
        assert a.shape == (2, 1, CFG.d_model)
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
        steps.append(a)
    np.testing.assert_array_equal(caches[0].latent, caches[1].latent)
    # Incremental decoding equals one prefill over the whole sequence.
    full = mla_attention_decompress(params, CFG, x, MLACache.allocate(CFG, batch=2, capacity=11))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=ATOL, rtol=0)


def test_mla_attention_absorbed_matches_decompress_with_float16_cache(params, rng):
    x = _tokens(rng, 2, 7)
    a, b = (f(params, CFG, x, MLACache.allocate(CFG, 2, 8, dtype=np.float16)) for f in PATHS)
    np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("path", PATHS)
def test_mla_attention_causal_future_tokens_do_not_change_earlier_outputs(params, rng, path):
    x = _tokens(rng, 2, 8)
    y = x.copy()
    y[:, 5:] = _tokens(rng, 2, 3)
    ox = path(params, CFG, x, MLACache.allocate(CFG, 2, 8))
    oy = path(params, CFG, y, MLACache.allocate(CFG, 2, 8))
    np.testing.assert_array_equal(ox[:, :5], oy[:, :5])
    assert not np.allclose(ox[:, 5:], oy[:, 5:])


def test_mla_attention_absorbed_caches_only_latent_and_rotated_shared_key(params, rng):
    x = _tokens(rng, 2, 3)
    cache = MLACache.allocate(CFG, 2, 4)
    mla_attention_absorbed(params, CFG, x, cache)
    assert cache.length == 3
    cos, sin = rope_tables(np.arange(3), CFG.qk_rope_dim, CFG.rope_theta)
    np.testing.assert_allclose(cache.latent[:, :3], x @ params["W_DKV"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(cache.k_rope[:, :3], apply_rope((x @ params["W_KR"])[:, None], cos, sin)[:, 0],
                               atol=1e-6, rtol=0)
    assert np.all(cache.latent[:, 3:] == 0) and np.all(cache.k_rope[:, 3:] == 0)


@pytest.mark.parametrize("dtype,dtype_bytes", [(np.float16, 2), (np.float32, 4)])
def test_mla_cache_nbytes_match_formula(dtype, dtype_bytes):
    batch, capacity = 2, 40
    cache = MLACache.allocate(CFG, batch=batch, capacity=capacity, dtype=dtype)
    expected = expected_mla_kv_bytes(capacity, 1, CFG.kv_lora_rank, CFG.qk_rope_dim, dtype_bytes, batch)
    assert expected == batch * capacity * 1 * (32 + 8) * dtype_bytes
    assert cache.nbytes == expected
    assert cache.bytes_per_token == mla_cache_bytes_per_token(CFG, dtype_bytes) == (32 + 8) * dtype_bytes


def test_mla_cache_raises_when_full_and_keeps_contents(params, rng):
    cache = MLACache.allocate(CFG, batch=2, capacity=5)
    mla_attention_absorbed(params, CFG, _tokens(rng, 2, 5), cache)
    before = cache.latent.copy(), cache.k_rope.copy()
    with pytest.raises(CacheFull, match="5 positions"):
        mla_attention_absorbed(params, CFG, _tokens(rng, 2, 1), cache, 5)
    assert cache.length == 5
    np.testing.assert_array_equal(cache.latent, before[0])
    np.testing.assert_array_equal(cache.k_rope, before[1])


def test_mla_cache_append_returns_views_of_preallocated_arrays():
    cache = MLACache.allocate(CFG, batch=1, capacity=4)
    latent, k_rope = cache.append(np.ones((1, 2, 32), np.float32), np.ones((1, 2, 8), np.float32))
    assert latent.shape == (1, 2, 32) and k_rope.shape == (1, 2, 8)
    assert np.shares_memory(latent, cache.latent) and np.shares_memory(k_rope, cache.k_rope)
    with pytest.raises(ValueError, match="expected c_kv"):
        cache.append(np.ones((1, 1, 31), np.float32), np.ones((1, 1, 8), np.float32))


def test_mla_attention_start_pos_must_match_cache_length(params, rng):
    cache = MLACache.allocate(CFG, 1, 8)
    mla_attention_decompress(params, CFG, _tokens(rng, 1, 3), cache, 0)
    with pytest.raises(ValueError, match="start_pos=2"):
        mla_attention_decompress(params, CFG, _tokens(rng, 1, 1), cache, 2)


def test_mla_attention_rejects_wrong_input_shape(params):
    with pytest.raises(ValueError, match="d_model=64"):
        mla_attention_absorbed(params, CFG, np.zeros((1, 2, 63), np.float32), MLACache.allocate(CFG, 1, 4))


@pytest.mark.parametrize("bad", [dict(qk_rope_dim=7), dict(n_heads=0), dict(kv_lora_rank=-1)])
def test_mla_config_rejects_invalid_sizes(bad):
    sizes = dict(d_model=64, n_heads=4, kv_lora_rank=32, qk_nope_dim=16, qk_rope_dim=8, v_head_dim=12) | bad
    with pytest.raises(ValueError):
        MLAConfig(**sizes)


def test_init_mla_params_shapes_and_dtype():
    p = init_mla_params(CFG, seed=0)
    assert {k: v.shape for k, v in p.items()} == {
        "W_DKV": (64, 32), "W_KR": (64, 8), "W_UK": (32, 64), "W_UV": (32, 48), "W_Q": (64, 96), "W_O": (48, 64)}
    assert all(v.dtype == np.float32 for v in p.values())
