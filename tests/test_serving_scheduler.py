"""Scheduler properties on random traces (hypothesis), run through the engine with the simulated runner,
plus the same with the NumPy model for token identity after preemption."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minillm.decode import cached_decode
from minillm.serving import LLMEngine, NumpyRunner, SamplingParams, SchedulerConfig, SimulatedRunner
from minillm.serving.batch import StepBatch
from minillm.serving.block_manager import BlockManager
from minillm.serving.scheduler import Scheduler
from minillm.serving.sequence import Sequence
from minillm.speculative import NgramDrafter

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
    outs = [eng.output(i) for i in ids]                 # handed over: the engine forgets them
    assert not eng.requests
    for o, (prompt, out, _) in zip(outs, reqs):
        assert o.finished and len(o.token_ids) == out and o.finish_reason == "length"   # finished once, fully
        assert o.num_cached_tokens % bs == 0 and o.num_cached_tokens < len(prompt)
        finished.append(o.finish_time)
    # FCFS: first admissions happen in arrival order (the ids are given in arrival order)
    assert admitted == sorted(admitted)
    assert eng.block_manager.num_free == num_blocks     # nothing leaked once all finished
    if not prefix:
        assert eng.block_manager.prefix_hit_tokens == 0
    assert sum(o.num_cached_tokens for o in outs) <= eng.block_manager.prefix_hit_tokens


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


# -- speculation: drafts take only what decodes and prefill chunks leave -----------------------------------

def target_answers_9(sched, batch):
    """Postprocess a step in which the target always answers token 9 (it rejects every draft but a 9)."""
    sched.postprocess(batch, np.full(len(batch.logits_rows), 9, np.int64), None, 0.0)


def test_schedule_speculation_gives_every_decode_its_token_before_drafts():
    """Budget 7, k = 4, three decoding sequences: each gets its decode token every step and the drafts get
    the 4 tokens left (before the fix, the first sequence's 4 drafts left another decode without a token)."""
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=7, num_speculative_tokens=4), bm, MAX_LEN,
                      NgramDrafter())
    seqs = [Sequence(i, [1, 2, 1, 2], SamplingParams(max_tokens=12)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    while sched.has_unfinished():
        decoding = [s for s in sched.running if s.is_decoding]
        batch = sched.schedule()
        assert batch.num_tokens <= 7
        assert all(s in batch.seqs for s in decoding)
        base = batch.num_tokens - batch.num_draft_tokens
        if len(decoding) == 3:
            assert base == 3 and batch.num_draft_tokens == 4
        target_answers_9(sched, batch)
    assert [len(s.output) for s in seqs] == [12, 12, 12] and sched.spec_proposed > 0
    assert bm.num_free == bm.num_blocks


def test_schedule_speculation_does_not_delay_a_newcomers_prefill():
    """Budget 6, k = 4: a request arriving while others decode with drafts is admitted in the step it arrives
    (before the fix, the first sequence's drafts kept it waiting for eight steps)."""
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=6, num_speculative_tokens=4), bm, MAX_LEN,
                      NgramDrafter())
    seqs = [Sequence(i, [1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=40)) for i in range(3)]
    for step in range(12):
        if step < 3:
            sched.add(seqs[step])
        batch = sched.schedule()
        if step < 3:
            assert seqs[step] in batch.seqs, f"request {step} was not admitted at its arrival step"
        assert batch.num_tokens <= 6
        target_answers_9(sched, batch)
    assert sched.spec_proposed > 0


def follow_the_cycle(sched, batch):
    """Postprocess a step whose target continues the pattern 1, 2, 1, 2, ... (token 1 at even positions):
    the n-gram drafts of a [1, 2, 1, 2] prompt are all accepted."""
    seq_idx, step = batch.row_params()
    pos = np.array([len(batch.seqs[i].prompt) for i in seq_idx]) + step
    sched.postprocess(batch, 1 + pos % 2, None, 0.0)


def test_schedule_drafts_never_preempt_a_sequence():
    """Two decodes that fit their blocks, one free block: the first sequence's drafts take it and the
    second decodes without drafts -- nobody is preempted for drafts (before the fix, the second sequence
    was preempted so that it could draft too). (Later the decodes themselves outgrow the pool, and preempt.)"""
    bm = BlockManager(num_blocks=3, block_size=4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, num_speculative_tokens=4), bm, MAX_LEN,
                      NgramDrafter())
    a, b = (Sequence(i, [1, 2, 1], SamplingParams(max_tokens=9)) for i in range(2))
    sched.add(a)
    sched.add(b)
    follow_the_cycle(sched, sched.schedule())           # both prefill into one block each and sample
    batch = sched.schedule()                            # both decode at position 3, the end of that block
    assert sched.num_preemptions == 0 and batch.seqs == [a, b]
    assert len(batch.drafts[0]) == 4 and batch.drafts[1] == [] and bm.num_free == 0
    while batch is not None:
        follow_the_cycle(sched, batch)
        batch = sched.schedule()
    assert a.output == b.output == [1 + p % 2 for p in range(3, 12)]
    assert sched.spec_accepted == sched.spec_proposed > 4
    assert bm.num_free == bm.num_blocks


@st.composite
def spec_traces(draw):
    reqs, bs, num_blocks, cfg, prefix = draw(traces())
    k = draw(st.integers(1, 4))
    return reqs, bs, num_blocks, SchedulerConfig(max_num_seqs=cfg.max_num_seqs,
                                                 max_num_batched_tokens=max(cfg.max_num_batched_tokens, k + 1),
                                                 max_prefill_chunk=cfg.max_prefill_chunk,
                                                 num_speculative_tokens=k), prefix


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_traces())
def test_scheduler_speculation_properties_on_random_traces(case):
    """With n-gram drafts: the budget holds; every running decode gets its token (when the decodes fit the
    budget); drafts run only on budget that no waiting request could use (the queue is empty, or blocked by
    max_num_seqs or memory); every request finishes with max_tokens tokens; no block leaks."""
    reqs, bs, num_blocks, cfg, prefix = case
    eng = LLMEngine(SimulatedRunner(), num_blocks, bs, MAX_LEN, 6, cfg, enable_prefix_caching=prefix,
                    drafter=NgramDrafter())
    sched = eng.scheduler

    def check(batch: StepBatch):
        assert batch.num_tokens <= cfg.max_num_batched_tokens
        decoding = [s for s in sched.running if s.is_decoding]
        if len(decoding) <= cfg.max_num_batched_tokens:
            assert all(s in batch.seqs for s in decoding)
        for s, d in zip(batch.seqs, batch.drafts):
            assert len(d) <= cfg.num_speculative_tokens and len(s.output) + len(d) < s.params.max_tokens
        if batch.num_draft_tokens and sched.waiting:
            assert len(sched.running) >= cfg.max_num_seqs or sched.memory_limited

    ids = serve(eng, reqs, check)
    for i, (prompt, out, _) in enumerate(reqs):
        o = eng.output(ids[i])
        assert o.finished and len(o.token_ids) == out and o.finish_reason == "length"
    assert eng.block_manager.num_free == num_blocks


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(spec_traces())
def test_scheduler_speculative_requests_keep_the_simple_decoders_tokens(small_model, case):
    reqs, bs, num_blocks, cfg, prefix = case
    eng = LLMEngine(NumpyRunner(small_model, num_blocks, bs), num_blocks, bs, MAX_LEN, 256, cfg,
                    enable_prefix_caching=prefix, drafter=NgramDrafter())
    ids = serve(eng, reqs, lambda b: None)
    for i, (prompt, out, _) in enumerate(reqs):
        assert eng.output(ids[i]).token_ids == cached_decode(small_model, prompt, out).new_tokens


def test_schedule_seeded_sampling_decode_takes_its_whole_draft_or_waits():
    """Budget 7, k = 4: two seeded sampling requests and a greedy one, all decoding. A seeded request's draft
    is always as long as its own tokens allow (what the n-gram drafter finds for k, max_tokens permitting),
    never trimmed by the budget the others leave: when it does not fit, the request waits a step. The greedy
    request's drafts take what is left (before the fix the second seeded request drafted 1 token, not 4)."""
    bm = BlockManager(num_blocks=64, block_size=4)
    k, budget = 4, 7
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, num_speculative_tokens=k), bm, MAX_LEN,
                      NgramDrafter())
    hot = SamplingParams(temperature=0.8, max_tokens=20, seed=7)
    seqs = [Sequence(0, [1, 2, 1, 2], hot), Sequence(1, [1, 2, 1, 2], hot),
            Sequence(2, [1, 2, 1, 2], SamplingParams(max_tokens=20))]
    for s in seqs:
        sched.add(s)
    waited = trimmed = 0
    while sched.has_unfinished():
        decoding = [s for s in sched.running if s.is_decoding]
        own = {s.seq_id: NgramDrafter().lookup(s.tokens, min(k, s.params.max_tokens - len(s.output) - 1))
               for s in decoding}
        batch = sched.schedule()
        assert batch.num_tokens <= budget
        for s, d in zip(batch.seqs, batch.drafts):
            if s.seq_id < 2 and s in decoding:
                assert d == own[s.seq_id], "a seeded sampling request's draft depends only on itself"
            elif s.seq_id == 2:
                trimmed += len(d) < len(own.get(2, []))
        waited += sum(1 for s in decoding if s not in batch.seqs)
        target_answers_9(sched, batch)
    assert waited > 0 and trimmed > 0
    assert [len(s.output) for s in seqs] == [20, 20, 20] and bm.num_free == bm.num_blocks


def test_scheduler_config_rejects_a_budget_smaller_than_one_speculative_decode():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(4\).*num_speculative_tokens \+ 1 \(5\)"):
        SchedulerConfig(max_num_batched_tokens=4, num_speculative_tokens=4)
    assert SchedulerConfig(max_num_batched_tokens=5, num_speculative_tokens=4).max_num_batched_tokens == 5
