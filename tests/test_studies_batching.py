"""The chapter 8 replay study on the engine's own scheduler and the counting runner."""
import numpy as np
import pytest

from minillm.studies.batching import poisson_arrivals, random_prompts, replay


@pytest.fixture(scope="module")
def trace():
    rng = np.random.default_rng(0)
    prompt_lens, out_lens = rng.integers(4, 40, 60), rng.integers(1, 60, 60)
    return random_prompts(prompt_lens, seed=1), out_lens.tolist(), poisson_arrivals(60, rate=2.0, seed=2)


def test_replay_continuous_beats_static_with_every_token_served(trace):
    prompts, outs, arrivals = trace
    cont = replay(prompts, outs, arrivals, max_num_seqs=8, record_timeline=True)
    stat = replay(prompts, outs, arrivals, max_num_seqs=8, static=True, record_timeline=True)
    for run in (cont, stat):
        assert run.output_tokens == sum(outs)
        assert 0 < run.slot_utilization <= 1 and run.steps == len(run.timeline)
        assert all(len(ids) <= 8 for ids in run.timeline)
        assert all(len(t) == o for t, o in zip(run.token_times, outs))
    assert cont.throughput > stat.throughput and cont.slot_utilization > stat.slot_utilization


def test_replay_static_batches_do_not_mix(trace):
    """All requests arrive at once, so static batching serves ids 0-3, then 4-7, ...: no step mixes two batches."""
    prompts, outs, _ = trace
    run = replay(prompts, outs, np.zeros(len(prompts)), max_num_seqs=4, static=True, record_timeline=True)
    assert all(len({i // 4 for i in ids}) == 1 for ids in run.timeline)
    cont = replay(prompts, outs, np.zeros(len(prompts)), max_num_seqs=4, record_timeline=True)
    assert any(len({i // 4 for i in ids}) > 1 for ids in cont.timeline)     # continuous batching refills


def test_poisson_arrivals_rejects_a_bad_rate():
    with pytest.raises(ValueError, match="rate"):
        poisson_arrivals(5, rate=0)
