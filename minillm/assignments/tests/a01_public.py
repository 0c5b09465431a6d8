"""Assignment 1, public tests: the op counter and naive decode."""
import numpy as np

from minillm.decode import naive_decode
from minillm.model import StepOps


def test_count_matmul_adds_two_m_k_n():
    ops = StepOps()
    ops.count_matmul(3, 4, 5)
    ops.count_matmul(1, 2, 7)
    assert ops.proj_flops == 2 * 3 * 4 * 5 + 2 * 1 * 2 * 7
    assert (ops.attn_rows, ops.score_elements) == (0, 0)


def test_count_attention_adds_score_entries():
    ops = StepOps()
    ops.count_attention(batch=2, n_heads=4, n_queries=3, n_keys=7)
    assert ops.score_elements == 2 * 4 * 3 * 7
    assert (ops.attn_rows, ops.proj_flops) == (0, 0)


def test_naive_decode_tokens_are_greedy_over_full_forward(small_model):
    prompt = [5, 17, 99]
    run = naive_decode(small_model, prompt, 4)
    assert run.tokens[:3] == prompt and len(run.tokens) == 7 and run.prompt_len == 3
    for t in range(3, 7):
        logits = small_model.forward(np.asarray(run.tokens[:t]))[-1]
        assert run.tokens[t] == int(np.argmax(logits))
        np.testing.assert_allclose(run.logits[t - 3], logits, rtol=1e-5, atol=1e-5)


def test_naive_decode_attention_rows_are_quadratic(small_model):
    run = naive_decode(small_model, [1, 2], 6)
    assert [s.attn_rows for s in run.steps] == list(range(2, 8))
    assert run.total.attn_rows == sum(range(2, 8))
