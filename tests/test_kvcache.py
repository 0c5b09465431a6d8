import numpy as np
import pytest

from minillm.decode import cached_decode, decode_step, naive_decode, prefill
from minillm.sampling import TemperatureSampler
from minillm.kvcache import CacheFull, ConcatKVCache, KVCache
from minillm.model import load_model
from minillm.tokenizer import ByteTokenizer

from .conftest import SMALL

PROMPTS = ["import os\n", "def f(x):\n    return", "class A:\n    pass\n\n\nclass B(A):", "#"]
LOGIT_ATOL = 1e-4  # float32 against float32; only summation order differs


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("n_new", [1, 17, 60])
def test_cached_decode_matches_naive_tokens_and_logits(tiny_model, prompt, n_new):
    ids = ByteTokenizer().encode(prompt)
    naive, cached = naive_decode(tiny_model, ids, n_new), cached_decode(tiny_model, ids, n_new)
    assert cached.tokens == naive.tokens
    np.testing.assert_allclose(np.stack(cached.logits), np.stack(naive.logits), atol=LOGIT_ATOL, rtol=0)


def test_cached_decode_matches_naive_when_sampling(tiny_model):
    ids = ByteTokenizer().encode("for i in ")
    a = naive_decode(tiny_model, ids, 40, sampler=TemperatureSampler(0.8, seed=3))
    b = cached_decode(tiny_model, ids, 40, sampler=TemperatureSampler(0.8, seed=3))
    assert a.tokens == b.tokens


def test_cached_decode_attention_rows_100_vs_naive_5050(small_model):
    naive, cached = naive_decode(small_model, [65], 100), cached_decode(small_model, [65], 100)
    assert naive.total.attn_rows == 5050
    assert cached.total.attn_rows == 100
    assert [s.attn_rows for s in cached.steps] == [1] * 100


def test_cached_decode_projection_flops_linear_in_n(small_model):
    cached = cached_decode(small_model, [1, 2, 3, 4], 8)
    per_step = [s.proj_flops for s in cached.steps]
    assert per_step[0] == 4 * per_step[1] and len(set(per_step[1:])) == 1


def test_kvcache_preallocated_and_views(small_model):
    cache = small_model.new_cache(capacity=16)
    k0 = cache.k
    prefill(small_model, [1, 2, 3], cache)
    decode_step(small_model, 4, cache)
    assert cache.k is k0 and cache.length == 4  # same buffer, filled in place
    assert np.all(cache.k[:, :, :, 4:] == 0) and np.any(cache.k[:, :, :, :4] != 0)


def test_kvcache_raises_when_full_never_wraps(small_model):
    cache = small_model.new_cache(capacity=5)
    prefill(small_model, [1, 2, 3, 4], cache)
    decode_step(small_model, 5, cache)
    before = cache.k.copy()
    with pytest.raises(CacheFull, match="5 positions"):
        decode_step(small_model, 6, cache)
    np.testing.assert_array_equal(cache.k, before)
    assert cache.length == 5


def test_kvcache_bytes_per_token_from_arrays():
    cache = KVCache.allocate(SMALL, capacity=10)
    assert cache.bytes_per_token == 2 * SMALL.n_layers * SMALL.n_kv_heads * SMALL.d_head * 4
    assert cache.nbytes == cache.k.nbytes * 2


def test_kvcache_rejects_mismatched_arrays():
    with pytest.raises(ValueError, match="5-D"):
        KVCache(np.zeros((1, 1, 1, 4, 8)), np.zeros((1, 1, 1, 5, 8)))


def test_concatkvcache_same_tokens_and_quadratic_copies(small_model):
    prompt, n_new = [7, 8], 12
    cache = ConcatKVCache(SMALL.n_layers)
    res = cached_decode(small_model, prompt, n_new, cache=cache)
    assert res.tokens == cached_decode(small_model, prompt, n_new).tokens
    row = 2 * SMALL.n_layers * SMALL.n_kv_heads * SMALL.d_head * 4  # K+V bytes of one position, all layers
    # decode step t copies the t positions already cached
    assert cache.bytes_copied == row * sum(range(len(prompt), len(prompt) + n_new - 1))


@pytest.mark.parametrize("prompt", [[], [1.0], [999]])
def test_cached_decode_rejects_bad_input(small_model, prompt):
    with pytest.raises((ValueError, TypeError)):
        cached_decode(small_model, prompt, 2)


def test_cached_decode_rejects_prompt_longer_than_max_seq_len(small_model):
    with pytest.raises(ValueError, match="max_seq_len"):
        cached_decode(small_model, [1] * (SMALL.max_seq_len + 1), 1)


@pytest.mark.parametrize("cache_cls", ["KVCache", "ConcatKVCache"])
def test_truncate_rolls_back_and_decoding_continues_identically(cache_cls):
    """Decode 6 tokens, roll back 3, re-decode: the logits equal a run that never went past the cut."""
    model = load_model("tiny")
    prompt = [65, 66, 67, 10]
    cache = model.new_cache(capacity=32) if cache_cls == "KVCache" else ConcatKVCache(model.config.n_layers)
    prefill(model, prompt, cache)
    for t in [70, 71, 72, 73, 74, 75]:
        decode_step(model, t, cache)
    cache.truncate(len(prompt) + 3)
    assert cache.length == 7
    got = decode_step(model, 99, cache)
    ref_cache = model.new_cache(capacity=32)
    prefill(model, prompt + [70, 71, 72], ref_cache)
    np.testing.assert_allclose(got, decode_step(model, 99, ref_cache), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [-1, 5, 1.5, True])
def test_truncate_rejects_lengths_outside_the_cache(bad):
    cache = KVCache.allocate(load_model("tiny").config, capacity=8)
    cache.advance(4)
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate(bad)
    assert cache.length == 4


@pytest.mark.parametrize("bad", [-3, 5, 1.5, True, "2"])
def test_kvcache_advance_rejects_negative_or_past_capacity(bad):
    cache = KVCache.allocate(SMALL, capacity=8)
    cache.advance(4)
    with pytest.raises(ValueError, match="advance"):
        cache.advance(bad)
    assert cache.length == 4
    cache.advance(4)                                       # up to the capacity is fine
    assert cache.length == 8


def test_concatkvcache_advance_rejects_negative():
    cache = ConcatKVCache(SMALL.n_layers)
    with pytest.raises(ValueError, match="advance"):
        cache.advance(-3)
    assert cache.length == 0
