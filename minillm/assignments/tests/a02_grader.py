"""Assignment 2, grader-only tests: capacity, truncation, long runs, one pass per phase (the model's calls
recorded), bad input. Core: a long cached run equal to a full forward at every step, the prompt in one pass and each
new token alone through the cache."""
import numpy as np
import pytest

from minillm.decode import decode_step, prefill
from minillm.kvcache import CacheFull, KVCache


def _kv(rng, cfg, n, batch=1):
    return rng.normal(size=(batch, cfg.n_kv_heads, n, cfg.d_head)).astype(np.float32)


def test_kvcache_write_past_capacity_raises_cachefull(small_model, rng):
    cfg = small_model.config
    cache = KVCache.allocate(cfg, capacity=4)
    cache.write(1, _kv(rng, cfg, 3), _kv(rng, cfg, 3))
    cache.advance(3)
    with pytest.raises(CacheFull):
        cache.write(1, _kv(rng, cfg, 2), _kv(rng, cfg, 2))
    k, _ = cache.write(1, _kv(rng, cfg, 1), _kv(rng, cfg, 1))  # exactly full is fine
    assert k.shape[2] == 4


def test_kvcache_layers_and_batch_are_independent(small_model, rng):
    cfg = small_model.config
    cache = KVCache.allocate(cfg, batch=2, capacity=5)
    a, b = _kv(rng, cfg, 2, batch=2), _kv(rng, cfg, 2, batch=2)
    cache.write(0, a, a)
    cache.write(1, b, b)
    np.testing.assert_array_equal(cache.k[0, :, :, :2], a)
    np.testing.assert_array_equal(cache.k[1, :, :, :2], b)
    np.testing.assert_array_equal(cache.v[0, :, :, 2:], 0)


def test_kvcache_truncate_then_write_overwrites(small_model, rng):
    cfg = small_model.config
    cache = KVCache.allocate(cfg, capacity=6)
    old = _kv(rng, cfg, 5)
    cache.write(0, old, old)
    cache.advance(5)
    cache.truncate(2)
    assert cache.length == 2
    new = _kv(rng, cfg, 1)
    k, _ = cache.write(0, new, new)
    np.testing.assert_array_equal(k, np.concatenate([old[:, :, :2], new], axis=2))


@pytest.mark.parametrize("n", [-1, 4, 1.5, True, "2"])
def test_kvcache_truncate_bad_n_raises(small_model, n):
    cache = KVCache.allocate(small_model.config, capacity=6)
    cache.advance(3)
    with pytest.raises(ValueError):
        cache.truncate(n)
    assert cache.length == 3


@pytest.mark.core
@pytest.mark.points(2)
def test_prefill_is_one_pass_and_decode_step_one_token(small_model):
    """prefill runs model.forward once over the whole prompt (a batch of one) with the cache; decode_step once on
    the single new token with the cache: re-running the sequence, or the prompt token by token, gives the same
    logits but not the two phases."""
    import probes

    cache = small_model.new_cache(capacity=12)
    with probes.record_forward():
        prefill(small_model, [4, 5, 6, 7, 8], cache)
        for t in (9, 10, 11):
            decode_step(small_model, t, cache)
        calls = probes.forward_calls()
    # (a batch of one, or the same ids as one row: (1, N) or (N,))
    assert [(c["shape"][-1], c["shape"][:-1] in ([], [1]), c["cache"]) for c in calls] == \
        [(5, True, True)] + [(1, True, True)] * 3, \
        "prefill: one forward over the prompt with the cache; decode_step: one forward of the new token with it"
    assert cache.length == 8


@pytest.mark.core
@pytest.mark.points(2)
def test_long_cached_run_matches_full_forward_every_step(small_model):
    tokens = [3]
    cache = small_model.new_cache(capacity=20)
    logits = prefill(small_model, tokens, cache)  # a one-token prompt
    for _ in range(15):
        full = small_model.forward(np.asarray(tokens))[-1]
        np.testing.assert_allclose(logits, full, rtol=1e-4, atol=1e-4)
        tokens.append(int(np.argmax(logits)) % 200)
        logits = decode_step(small_model, tokens[-1], cache)
    assert cache.length == len(tokens)


def test_decode_step_on_full_cache_raises(small_model):
    cache = small_model.new_cache(capacity=3)
    prefill(small_model, [1, 2, 3], cache)
    with pytest.raises(CacheFull):
        decode_step(small_model, 4, cache)


def test_prefill_after_truncate_recomputes_suffix(small_model):
    cache = small_model.new_cache(capacity=10)
    prefill(small_model, [5, 6, 7, 8], cache)
    cache.truncate(2)
    logits = prefill(small_model, [9, 10], cache)
    np.testing.assert_allclose(logits, small_model.forward(np.asarray([5, 6, 9, 10]))[-1], rtol=1e-4, atol=1e-4)
