import pytest

from minillm.studies.prefix_sharing import agent_workload, simulate_prefix_sharing


def test_simulate_prefix_sharing_counts_blocks_and_prefill_exactly():
    reqs = agent_workload(16, system_prompt_len=320, user_len=32, seed=0, output_len=64)
    assert all(r.tokens[:320] == reqs[0].tokens[:320] for r in reqs)
    stats = simulate_prefix_sharing(reqs, block_size=16)
    # The first request computes all 352 prompt tokens; the rest find the system prompt's 20 full blocks.
    assert stats.prefill_tokens_unshared == 16 * 352 and stats.prefill_tokens_shared == 352 + 15 * 32
    # Unshared: 16 x ceil(416 / 16) blocks; shared: 20 system-prompt blocks + 16 x ceil(96 / 16).
    assert stats.peak_blocks_unshared == 16 * 26 and stats.peak_blocks_shared == 20 + 16 * 6
    assert stats.memory_ratio == pytest.approx(416 / 116) and stats.prefill_ratio == pytest.approx(5632 / 832)


def test_simulate_prefix_sharing_one_at_a_time_still_saves_prefill_via_cached_free_blocks():
    reqs = agent_workload(8, system_prompt_len=100, user_len=20, seed=1)
    stats = simulate_prefix_sharing(reqs, concurrent=False)
    assert stats.peak_blocks_shared == stats.peak_blocks_unshared   # one request resident at a time
    assert stats.prefill_tokens_shared == 120 + 7 * (120 - 96)      # 6 full blocks (96 tokens) reused
