import numpy as np
import pytest

from minillm.decode import naive_decode
from minillm.sampling import TemperatureSampler, greedy


def test_naive_decode_attention_rows_are_triangular(small_model):
    res = naive_decode(small_model, [65], 100)
    assert [s.attn_rows for s in res.steps] == list(range(1, 101))
    assert res.total.attn_rows == 100 * 101 // 2 == 5050


def test_naive_decode_score_elements_grow_quadratically(small_model):
    res = naive_decode(small_model, [1, 2, 3], 5)
    per_layer_head = [s.score_elements // (small_model.config.n_layers * small_model.config.n_heads) for s in res.steps]
    assert per_layer_head == [n * n for n in range(3, 8)]


def test_naive_decode_uses_only_last_row(small_model):
    res = naive_decode(small_model, [10, 20, 30], 3)
    for step, logits in enumerate(res.logits):
        full = small_model.forward(np.array(res.tokens[: 3 + step]))
        np.testing.assert_array_equal(logits, full[-1])
        assert res.tokens[3 + step] == greedy(full[-1])


def test_naive_decode_returns_prompt_plus_new(small_model):
    res = naive_decode(small_model, [5, 6], 4)
    assert res.tokens[:2] == [5, 6] and len(res.new_tokens) == 4 and len(res.step_seconds) == 4


def test_temperature_sampler_is_seeded_and_respects_top_k():
    logits = np.array([0.0, 5.0, 4.0, -3.0])
    a = [TemperatureSampler(1.0, seed=1)(logits) for _ in range(20)]
    s1, s2 = TemperatureSampler(1.0, seed=7), TemperatureSampler(1.0, seed=7)
    assert [s1(logits) for _ in range(30)] == [s2(logits) for _ in range(30)]
    top2 = TemperatureSampler(1.0, top_k=2, seed=0)
    assert set(top2(logits) for _ in range(200)) <= {1, 2}
    assert len(set(a)) >= 1


def test_temperature_sampler_rejects_bad_settings():
    with pytest.raises(ValueError):
        TemperatureSampler(0.0)
    with pytest.raises(ValueError):
        TemperatureSampler(1.0, top_k=0)


@pytest.mark.parametrize(
    "prompt,n_new,exc,match",
    [
        ([], 3, ValueError, "empty"),
        ([1.5, 2.0], 3, TypeError, "integers"),
        ([True, False], 3, TypeError, "integers"),
        ([1, 300], 3, ValueError, "vocabulary|range"),
        ([-1], 3, ValueError, "range"),
        ("hello", 3, TypeError, "token ids"),
        ([1], 0, ValueError, "n_new"),
        ([[1, 2]], 3, ValueError, "1-D"),
    ],
)
def test_naive_decode_rejects_bad_input(small_model, prompt, n_new, exc, match):
    with pytest.raises(exc, match=match):
        naive_decode(small_model, prompt, n_new)


def test_naive_decode_rejects_prompt_longer_than_max_seq_len(small_model):
    n = small_model.config.max_seq_len
    with pytest.raises(ValueError, match="longer than max_seq_len"):
        naive_decode(small_model, [1] * (n + 1), 1)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        naive_decode(small_model, [1] * n, 2)


def test_cached_decode_rejects_a_cache_already_used(small_model):
    """A second call with the same cache used to prefill after the first run's positions: other tokens, no error."""
    from minillm.decode import cached_decode

    cache = small_model.new_cache(capacity=32)
    first = cached_decode(small_model, [65, 66], 6, cache=cache)
    with pytest.raises(ValueError, match="empty cache.*already holds 7 positions"):
        cached_decode(small_model, [65, 66], 6, cache=cache)
    cache.reset()                                          # emptied, it serves again, and gives the same tokens
    assert cached_decode(small_model, [65, 66], 6, cache=cache).tokens == first.tokens


def test_cached_decode_rejects_a_cache_with_batch_or_capacity_that_does_not_fit(small_model):
    from minillm.decode import cached_decode

    with pytest.raises(ValueError, match="batch 2"):
        cached_decode(small_model, [65, 66], 3, cache=small_model.new_cache(batch=2, capacity=16))
    with pytest.raises(ValueError, match="holds 5 positions.*6"):
        cached_decode(small_model, [65, 66, 67], 4, cache=small_model.new_cache(capacity=5))
    ok = cached_decode(small_model, [65, 66, 67], 4, cache=small_model.new_cache(capacity=6))   # exactly enough
    assert ok.tokens == cached_decode(small_model, [65, 66, 67], 4).tokens
