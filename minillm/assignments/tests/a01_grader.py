"""Assignment 1, grader-only tests: closed forms for every counter, the whole sequence re-run at every step
(the model's calls recorded), the sampler, bad input. Core: the counters through forward, and the decoder that
re-runs the whole sequence with no cache, recording what forward counted."""
import numpy as np
import pytest

from minillm.decode import naive_decode
from minillm.model import StepOps


def _flops_per_row(cfg):
    d, hd = cfg.d_model, cfg.d_head
    per_layer = d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd + cfg.n_heads * hd * d + 3 * d * cfg.d_ff
    return 2 * (cfg.n_layers * per_layer + d * cfg.vocab_size)


@pytest.mark.core
def test_count_matmul_through_forward_batched(small_model):
    ops = StepOps()
    small_model.forward(np.zeros((2, 5), np.int64), ops=ops)
    assert ops.proj_flops == 10 * _flops_per_row(small_model.config)


@pytest.mark.core
def test_count_attention_through_forward(small_model):
    ops = StepOps()
    small_model.forward(np.zeros((3, 4), np.int64), ops=ops)
    cfg = small_model.config
    assert ops.score_elements == cfg.n_layers * 3 * cfg.n_heads * 4 * 4


@pytest.mark.core
@pytest.mark.points(2)
def test_naive_decode_reruns_the_whole_sequence_every_step(small_model):
    """One model.forward per new token over every token so far, with no cache, and each step's StepOps the ones
    that forward counted: a decoder that feeds only the new token through a cache and fills its counters from the
    closed forms gives the right tokens and numbers, but calls the model otherwise."""
    import probes

    with probes.record_forward():
        run = naive_decode(small_model, [5, 6, 7], 4)
        calls = probes.forward_calls()
    assert [(c["shape"][-1], c["cache"]) for c in calls] == [(3 + i, False) for i in range(4)], \
        "each step must run model.forward once on every token so far, with no cache"
    assert all(len(c["shape"]) == 1 or c["shape"][0] == 1 for c in calls)
    assert [c["ops"] for c in calls] == [[s.attn_rows, s.score_elements, s.proj_flops] for s in run.steps], \
        "each step's StepOps must be the one model.forward counted into"


@pytest.mark.points(2)
def test_naive_decode_score_elements_and_flops_closed_form(small_model):
    cfg = small_model.config
    run = naive_decode(small_model, [7], 9)
    lengths = range(1, 10)
    assert [s.score_elements for s in run.steps] == [cfg.n_layers * cfg.n_heads * t * t for t in lengths]
    assert run.total.proj_flops == sum(lengths) * _flops_per_row(cfg)
    assert run.total.attn_rows == 9 * 10 // 2


def test_naive_decode_uses_the_sampler(small_model):
    seen = []

    def sampler(logits):
        seen.append(np.asarray(logits).shape)
        return 42

    run = naive_decode(small_model, [3, 4, 5], 3, sampler=sampler)
    assert run.new_tokens == [42, 42, 42]
    assert seen == [(small_model.config.vocab_size,)] * 3


def test_naive_decode_records_one_step_per_token(small_model):
    run = naive_decode(small_model, np.array([9, 8, 7, 6, 5]), 1)
    assert len(run.steps) == len(run.logits) == len(run.step_seconds) == 1
    assert all(s >= 0 for s in run.step_seconds)


def test_naive_decode_fills_max_seq_len_exactly(small_model):
    n = small_model.config.max_seq_len
    run = naive_decode(small_model, [1] * (n - 2), 3)  # positions up to n - 1 are processed
    assert len(run.tokens) == n + 1


@pytest.mark.parametrize("prompt, n_new, error", [
    ([1, 2], 0, ValueError), ([1, 2], -1, ValueError), ([1, 2], 1.5, ValueError), ([], 3, ValueError),
    ("hello", 2, TypeError), ([1, 10**6], 2, ValueError), ([1] * 60, 10, ValueError)])
def test_naive_decode_bad_input_raises(small_model, prompt, n_new, error):
    with pytest.raises(error):
        naive_decode(small_model, prompt, n_new)
