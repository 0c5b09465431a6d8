"""Scheduler properties on random traces (hypothesis), run through the engine with the simulated runner,
plus the same with the NumPy model for token identity after preemption."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.decode import cached_decode
from minillm.serving import LLMEngine, NumpyRunner, SamplingParams, SchedulerConfig, SimulatedRunner
from minillm.serving.batch import StepBatch
from minillm.serving.block_manager import BlockManager
from minillm.serving.scheduler import Scheduler
from minillm.serving.sequence import Sequence

MAX_LEN = 128


@st.composite
def traces(draw):
    n = draw(st.integers(1, 8))
    shared = draw(st.lists(st.integers(0, 5), min_size=draw(st.integers(0, 24)), max_size=24))
    reqs = []
    for _ in range(n):
        own = draw(st.lists(st.integers(0, 5), min_size=1, max_size=30))
        prompt = (shared if draw(st.booleans()) else []) + own
        reqs.append((prompt, draw(st.integers(1, 15)), draw(st.integers(0, 10))))
    bs = draw(st.sampled_from([4, 8, 16]))
    longest = max(len(p) + o - 1 for p, o, _ in reqs)
    num_blocks = draw(st.integers(-(-longest // bs), -(-longest // bs) + 12))
    cfg = SchedulerConfig(max_num_seqs=draw(st.integers(1, 6)), max_num_batched_tokens=draw(st.integers(1, 64)),
                          max_prefill_chunk=draw(st.none() | st.integers(1, 64)))
    return reqs, bs, num_blocks, cfg, draw(st.booleans())


def serve(engine, reqs, check):
    """Add requests at their arrival steps; call check(batch) on every step; return request ids in order."""
    step, pending = 0, sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    sched = engine.scheduler
    engine.add_step_observer(check)
    by_index = {}
    while pending or engine.has_unfinished():
        while pending and reqs[pending[0]][2] <= step:
            i = pending.pop(0)
            prompt, out, _ = reqs[i]
            by_index[i] = engine.add_request(prompt, SamplingParams(max_tokens=out, ignore_eos=True))
        engine.step()
        engine.block_manager.check_invariants(sched.running + list(sched.waiting))
        step += 1
        assert step < 10_000, "no progress"
    return [by_index[i] for i in range(len(reqs))]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_scheduler_properties_on_random_traces(case):
    reqs, bs, num_blocks, cfg, prefix = case
    runner = SimulatedRunner()
    eng = LLMEngine(runner, num_blocks, bs, MAX_LEN, 6, cfg, enable_prefix_caching=prefix)
    admitted, finished = [], []

    def check(batch: StepBatch):
        # the budget and the sequence cap are never exceeded
        assert batch.num_tokens <= cfg.max_num_batched_tokens
        assert len(batch.seqs) <= cfg.max_num_seqs and len(eng.scheduler.running) <= cfg.max_num_seqs
        assert len({s.seq_id for s in batch.seqs}) == len(batch.seqs)
        for s, n in zip(batch.seqs, batch.num_new):
            if cfg.max_prefill_chunk is not None and not s.is_decoding:
                assert n <= cfg.max_prefill_chunk
            if s.seq_id not in admitted:
                admitted.append(s.seq_id)
        # decodes are scheduled before any prefill chunk of a newly admitted request
        new = [s.seq_id not in seen for s in batch.seqs]
        assert new == sorted(new)
        seen.update(s.seq_id for s in batch.seqs)

    seen: set[int] = set()
    ids = serve(eng, reqs, check)
    for i, (prompt, out, _) in enumerate(reqs):
        o = eng.output(ids[i])
        assert o.finished and len(o.token_ids) == out and o.finish_reason == "length"   # finished once, fully
        assert o.num_cached_tokens % bs == 0 and o.num_cached_tokens < len(prompt)
        finished.append(o.finish_time)
    # FCFS: first admissions happen in arrival order (the ids are given in arrival order)
    assert admitted == sorted(admitted)
    assert eng.block_manager.num_free == num_blocks     # nothing leaked once all finished
    if not prefix:
        assert eng.block_manager.prefix_hit_tokens == 0
    assert sum(eng.output(i).num_cached_tokens for i in ids) <= eng.block_manager.prefix_hit_tokens


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(traces())
def test_scheduler_preempted_requests_resume_with_the_same_tokens(small_model, case):
    reqs, bs, num_blocks, cfg, prefix = case
    eng = LLMEngine(NumpyRunner(small_model, num_blocks, bs), num_blocks, bs, MAX_LEN, 256, cfg,
                    enable_prefix_caching=prefix)
    ids = serve(eng, reqs, lambda b: None)
    for i, (prompt, out, _) in enumerate(reqs):
        assert eng.output(ids[i]).token_ids == cached_decode(small_model, prompt, out).new_tokens


def test_scheduler_prefix_hits_are_counted_per_block():
    bm = BlockManager(num_blocks=20, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), bm, MAX_LEN)
    a = Sequence(0, list(range(10)), SamplingParams(max_tokens=2))
    sched.add(a)
    batch = sched.schedule()
    sched.postprocess(batch, np.zeros(1, np.int64), None, 0.0)
    b = Sequence(1, list(range(9)) + [99], SamplingParams(max_tokens=2))
    sched.add(b)
    batch = sched.schedule()
    # a decodes; b finds the two full blocks [0..3], [4..7] of a's prompt: 8 tokens
    assert [s.seq_id for s in batch.seqs] == [0, 1] and b.num_cached_prompt == 8 and bm.prefix_hit_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and list(batch.num_new) == [1, 2]


def test_scheduler_decodes_first_then_chunked_prefill_fills_the_budget():
    bm = BlockManager(num_blocks=50, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=10), bm, MAX_LEN)
    a = Sequence(0, [1, 2, 3], SamplingParams(max_tokens=5))
    sched.add(a)
    sched.postprocess(sched.schedule(), np.zeros(1, np.int64), None, 0.0)
    sched.add(Sequence(1, list(range(30)), SamplingParams(max_tokens=5)))
    batch = sched.schedule()
    assert list(batch.num_new) == [1, 9] and list(batch.sample) == [True, False]
    assert list(batch.positions) == [3] + list(range(9)) and list(batch.cu_seqlens_q) == [0, 1, 10]


def test_scheduler_static_batching_admits_only_after_the_whole_batch_finished():
    runner = SimulatedRunner()
    eng = LLMEngine(runner, 64, 4, MAX_LEN, 6, SchedulerConfig(max_num_seqs=2, static_batching=True))
    ids = [eng.add_request([1, 2, 3], SamplingParams(max_tokens=n, ignore_eos=True)) for n in (2, 9, 3, 3)]
    eng.run()
    out = [eng.output(i) for i in ids]
    # requests 2 and 3 start only once both of the first batch are done (the short one's slot idles)
    assert out[2].first_token_time > out[1].finish_time and out[3].first_token_time > out[1].finish_time
    assert runner.batch_sizes[:9] == [2, 2, 1, 1, 1, 1, 1, 1, 1]
    cont = LLMEngine(SimulatedRunner(), 64, 4, MAX_LEN, 6, SchedulerConfig(max_num_seqs=2))
    ids = [cont.add_request([1, 2, 3], SamplingParams(max_tokens=n, ignore_eos=True)) for n in (2, 9, 3, 3)]
    cont.run()
    assert cont.output(ids[2]).first_token_time < cont.output(ids[1]).finish_time   # continuous refills the slot
