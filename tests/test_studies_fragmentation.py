import numpy as np
import pytest

from minillm.studies.fragmentation import (FirstFitAllocator, chat_trace, compare_strategies, simulate_contiguous,
                                           simulate_paged)


# -- fragmentation study ---------------------------------------------------------------------------------

CTX = 2048
POOL = 16 * CTX


@pytest.fixture(scope="module")
def trace():
    return chat_trace(300, seed=1, max_context=CTX)


@pytest.fixture(scope="module")
def results(trace):
    return compare_strategies(trace, POOL, block_size=16, max_context=CTX)


def test_chat_trace_deterministic_bounded_and_near_its_medians():
    a, b = chat_trace(2000, seed=3), chat_trace(2000, seed=3)
    assert a == b and a != chat_trace(2000, seed=4)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= 4096 for r in a)
    assert 250 < np.median([r.prompt_len for r in a]) < 350
    assert 170 < np.median([r.output_len for r in a]) < 230
    assert [r.rid for r in a] == list(range(2000))


def test_first_fit_allocator_leaves_and_merges_holes():
    mem = FirstFitAllocator(100)
    x, y, z = mem.allocate(30), mem.allocate(30), mem.allocate(30)
    assert (x, y, z) == (0, 30, 60)
    mem.free(y, 30)
    assert mem.allocate(40) is None and mem.free_slots == 40   # 40 free, but in holes of 30 and 10
    assert mem.try_extend(x, 30, 5) and mem.holes == [[35, 25], [90, 10]]   # grows into the hole after it
    assert not mem.try_extend(z, 30, 11) and mem.try_extend(z, 30, 10) and mem.free_slots == 25
    mem.free(x, 35)
    mem.free(z, 40)
    assert mem.holes == [[0, 100]] and mem.free_slots == 100


def test_simulate_all_strategies_generate_every_token(trace, results):
    want = sum(r.output_len for r in trace)
    assert set(results) == {"reserve_max", "grow_copy", "guess", "paged"}
    for name, r in results.items():
        assert r.tokens_generated == want, name
        assert r.steps >= max(x.output_len for x in trace)
        assert 0 <= r.idle_fraction <= 1 and r.mean_concurrent <= r.max_concurrent


def test_simulate_paged_wastes_under_one_block_per_sequence(results):
    paged = results["paged"]
    assert paged.max_reserved_unused_per_seq <= 16 - 1    # a sequence's last block is never empty
    assert paged.reserved_unused_per_seq < 16 - 1
    assert paged.free_fraction < 0.05                     # no external fragmentation, just the last partial fit


def test_simulate_reserve_max_idles_more_than_paged(results):
    assert results["reserve_max"].idle_fraction > results["paged"].idle_fraction
    assert results["reserve_max"].max_concurrent == POOL // CTX
    assert results["paged"].mean_concurrent > results["reserve_max"].mean_concurrent


def test_simulate_grow_copy_copies_paged_does_not(results):
    assert results["grow_copy"].tokens_copied > 0
    assert results["guess"].tokens_copied > 0
    assert results["paged"].tokens_copied == 0 and results["reserve_max"].tokens_copied == 0


def test_simulate_max_running_caps_concurrency(trace):
    capped = simulate_paged(trace, POOL, max_running=8)
    assert capped.max_concurrent == 8 and capped.preemptions == 0


def test_simulate_contiguous_rejects_unknown_strategy_and_oversized_pool_needs(trace):
    with pytest.raises(ValueError, match="strategy"):
        simulate_contiguous(trace, POOL, "best_fit", max_context=CTX)
    with pytest.raises(ValueError, match="cannot fit"):
        simulate_contiguous(trace, CTX - 1, "reserve_max", max_context=CTX)


@pytest.mark.parametrize("strategy", ["grow_copy", "paged"])
def test_study_runs_on_the_serving_scheduler(trace, results, strategy):
    """The study's numbers are the engine's: a direct LLMEngine + SimulatedRunner run of the same trace, with
    the same memory manager, takes as many steps and preempts as often (and copies as much)."""
    from minillm.serving import (BlockManager, ContiguousManager, LLMEngine, SamplingParams, SchedulerConfig,
                                 SimulatedRunner)

    if strategy == "paged":
        mgr = BlockManager(POOL // 16, 16, enable_prefix_caching=False)
    else:
        mgr = ContiguousManager(POOL, strategy, max_context=CTX)
    runner = SimulatedRunner()
    cfg = SchedulerConfig(max_num_seqs=len(trace), max_num_batched_tokens=POOL + len(trace))
    eng = LLMEngine(runner, mgr.num_blocks, mgr.block_size, CTX, 100, cfg, block_manager=mgr)
    rng = np.random.default_rng(0)
    for r in trace:
        eng.add_request(rng.integers(0, 100, r.prompt_len), SamplingParams(max_tokens=r.output_len, ignore_eos=True))
    eng.run()
    got = results[strategy]
    assert got.steps == runner.steps == eng.scheduler.num_steps
    assert got.preemptions == eng.scheduler.num_preemptions > 0
    assert got.tokens_copied == getattr(mgr, "tokens_copied", 0)
    # a readmission prefills what was thrown away plus the token it would have decoded next
    extra_prefill = runner.prefill_tokens - sum(r.prompt_len for r in trace)
    assert got.recomputed_tokens == extra_prefill - got.preemptions > 0
    assert got.max_concurrent == max(runner.batch_sizes)


def test_measuring_runner_is_a_runner_and_sleeps_on_the_inner_clock():
    from minillm.serving.interfaces import Runner
    from minillm.studies.fragmentation import _MeasuringRunner

    missing = [name for name in ("now", "sleep", "prepare", "execute") if not callable(getattr(_MeasuringRunner, name, None))]
    assert not missing, f"_MeasuringRunner lacks Runner members: {missing}"
    r = _MeasuringRunner(manager=None, pool_tokens=16)
    t0 = r.now()
    r.sleep(2.5)
    r.prepare(None)
    assert r.now() == t0 + 2.5 and Runner is not None
