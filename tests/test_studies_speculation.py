import numpy as np
import pytest

from minillm.model import ModelConfig
from minillm.serving import StepCost
from minillm.speculative import SpecResult
from minillm.studies.speculation import (alpha_from_tokens_per_call, batched_speedup_model, expected_tokens_per_call,
                                         held_out_source, pool_results, speedup_model, verify_step_seconds)


def test_expected_tokens_per_call_matches_the_geometric_sum_and_its_limits():
    for a in (0.0, 0.3, 0.67, 0.95):
        for k in (0, 1, 4, 8):
            assert expected_tokens_per_call(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert expected_tokens_per_call(1.0, 5) == 6.0
    assert expected_tokens_per_call(0.0, 5) == 1.0
    out = expected_tokens_per_call(np.array([0.5, 1.0]), 3)
    np.testing.assert_allclose(out, [1.875, 4.0])
    with pytest.raises(ValueError):
        expected_tokens_per_call(1.5, 2)
    with pytest.raises(ValueError):
        expected_tokens_per_call(0.5, -1)


def test_expected_tokens_per_call_agrees_with_a_simulation_of_iid_acceptance():
    rng = np.random.default_rng(0)
    a, k, n = 0.7, 5, 200_000
    accept = rng.random((n, k)) < a
    n_acc = np.where(accept.all(axis=1), k, np.argmin(accept, axis=1))
    assert np.mean(n_acc + 1) == pytest.approx(expected_tokens_per_call(a, k), rel=0.01)


def test_alpha_from_tokens_per_call_inverts_the_formula():
    for a in (0.0, 0.3, 0.69, 0.95, 1.0):
        for k in (1, 2, 8):
            assert alpha_from_tokens_per_call(expected_tokens_per_call(a, k), k) == pytest.approx(a, abs=1e-9)
    assert alpha_from_tokens_per_call(1.0, 4) == pytest.approx(0.0, abs=1e-9)
    assert alpha_from_tokens_per_call(2.0, 1) == pytest.approx(1.0, abs=1e-9)
    for bad_t, bad_k in ((0.9, 2), (3.5, 2), (2.0, 0), (2.0, 1.5), (2.0, True)):
        with pytest.raises(ValueError):
            alpha_from_tokens_per_call(bad_t, bad_k)


def test_speedup_model():
    assert speedup_model(0.8, 4, 0.0) == pytest.approx(expected_tokens_per_call(0.8, 4))
    assert speedup_model(0.8, 4, 0.25) == pytest.approx(expected_tokens_per_call(0.8, 4) / 2)
    np.testing.assert_allclose(speedup_model(0.5, 2, np.array([0.0, 0.5])), [1.75, 0.875])
    with pytest.raises(ValueError):
        speedup_model(0.5, 2, -0.1)


def _result(proposed, accepted, emitted, k):
    return SpecResult(tokens=[], prompt_len=0, k=k, proposed=proposed, accepted=accepted, emitted=emitted)


def test_pool_results_counts_alpha_over_tested_drafts():
    r1 = _result([3, 3], [3, 1], [4, 2], k=3)      # all accepted; accepted 1 then rejected
    r2 = _result([0, 3], [0, 0], [1, 1], k=3)      # no draft; first draft rejected
    st = pool_results([r1, r2])
    assert st.calls == 4 and st.tokens_per_call == pytest.approx(8 / 4)
    assert st.acceptance_rate == pytest.approx(4 / 9)
    assert st.alpha == pytest.approx(4 / (4 + 2))          # 4 accepted, 2 rejections
    np.testing.assert_allclose(st.alpha_per_position(), [2 / 3, 1 / 2, 1.0])
    assert st.empty_share == pytest.approx(1 / 4)
    assert st.target_rows_per_token == pytest.approx((4 + 4 + 1 + 4) / 8)
    with pytest.raises(ValueError):
        pool_results([])
    with pytest.raises(ValueError):
        pool_results([r1, _result([1], [1], [2], k=1)])


def test_pool_results_reconstructs_the_room_the_token_limit_left():
    # k = 4, a run of 10 tokens: before the calls 10, 5, 2, 1 tokens are left -> room 4, 4, 1, 0
    r = _result([4, 4, 1, 0], [4, 2, 1, 0], [5, 3, 1, 1], k=4)
    st = pool_results([r])
    np.testing.assert_array_equal(st.room, [4, 4, 1, 0])
    assert st.clipped_share == pytest.approx(2 / 4)
    full = st.with_k_drafts
    assert full.calls == 2 and full.tokens_per_call == pytest.approx(4.0)
    np.testing.assert_array_equal(full.room, [4, 4])
    # prompt lookup: no match in a call with room for all k drafts counts, one at the token limit does not
    r2 = _result([0, 4, 1, 0], [0, 2, 0, 0], [1, 3, 1, 1], k=4)     # left 6, 5, 2, 1 -> room 4, 4, 1, 0
    assert pool_results([r2]).no_match_share == pytest.approx(1 / 2)
    assert np.isnan(pool_results([_result([0, 0], [0, 0], [1, 1], k=4)]).no_match_share)   # no call had room for 4
    stopped = _result([4], [1], [2], k=4)
    stopped.finish_reason = "stop"
    assert pool_results([r, stopped]).room is None
    with pytest.raises(ValueError):
        pool_results([r, stopped]).clipped_share
    np.testing.assert_array_equal(pool_results([stopped], n_new=10).room, [4])
    with pytest.raises(ValueError):
        pool_results([r], n_new=5)                             # emitted more than the limit
    sub = st.subset(np.array([True, False, True, False]))
    assert sub.calls == 2 and sub.emitted.tolist() == [5, 1] and sub.room.tolist() == [4, 1]


def test_held_out_source_is_deterministic_and_sized():
    a, b = held_out_source(5, n_bytes=120, seed=1), held_out_source(5, n_bytes=120, seed=1)
    assert a == b and len(a) == 5 and all(len(c) >= 120 for c in a)   # one byte token per byte of UTF-8
    assert held_out_source(5, n_bytes=120, seed=2) != a
    with pytest.raises(ValueError):
        held_out_source(0)


def test_verify_step_cost_is_flat_while_memory_bound_then_grows():
    cfg = ModelConfig(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
                      max_seq_len=4096, rope_theta=500000.0)
    cost = StepCost.for_model(cfg)
    one, nine = verify_step_seconds(cost, 1, 1, 512), verify_step_seconds(cost, 1, 9, 512)
    assert nine == pytest.approx(one, rel=0.01)                      # batch 1: weight reads dominate
    assert verify_step_seconds(cost, 256, 9, 512) > 2 * verify_step_seconds(cost, 256, 1, 512)
    s1, s512 = batched_speedup_model(cost, 0.7, 8, 1, 512), batched_speedup_model(cost, 0.7, 8, 512, 512)
    assert s1 == pytest.approx(expected_tokens_per_call(0.7, 8), rel=0.01) and s512 < 1
    with pytest.raises(ValueError):
        verify_step_seconds(cost, 0, 1, 10)
