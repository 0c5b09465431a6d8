"""Assignment 2, public tests: the preallocated cache, prefill and the decode step."""
import numpy as np

from minillm.decode import decode_step, prefill
from minillm.kvcache import KVCache


def test_kvcache_write_fills_left_to_right(small_model, rng):
    cfg = small_model.config
    cache = KVCache.allocate(cfg, batch=1, capacity=8)
    k1 = rng.normal(size=(1, cfg.n_kv_heads, 3, cfg.d_head)).astype(np.float32)
    k_all, v_all = cache.write(0, k1, -k1)
    assert k_all.shape == (1, cfg.n_kv_heads, 3, cfg.d_head)
    np.testing.assert_array_equal(k_all, k1)
    np.testing.assert_array_equal(v_all, -k1)
    cache.advance(3)
    k2 = rng.normal(size=(1, cfg.n_kv_heads, 2, cfg.d_head)).astype(np.float32)
    k_all, _ = cache.write(0, k2, k2)
    np.testing.assert_array_equal(k_all, np.concatenate([k1, k2], axis=2))
    assert np.shares_memory(k_all, cache.k)  # a view of the preallocated array, not a copy


def test_prefill_then_decode_step_match_full_forward(small_model):
    prompt = [11, 22, 33, 44]
    cache = small_model.new_cache(capacity=8)
    logits = prefill(small_model, prompt, cache)
    np.testing.assert_allclose(logits, small_model.forward(np.asarray(prompt))[-1], rtol=1e-4, atol=1e-4)
    assert cache.length == 4
    tok = int(np.argmax(logits))
    logits2 = decode_step(small_model, tok, cache)
    np.testing.assert_allclose(logits2, small_model.forward(np.asarray(prompt + [tok]))[-1], rtol=1e-4, atol=1e-4)
    assert cache.length == 5
