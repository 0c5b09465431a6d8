"""Assignment 8, grader-only tests: random traces with arrivals over time against the simple decoder, the
step's invariants checked at every step (budget, sequence cap, FCFS admission, no leaks), prefix caching,
static batching, prefill without chunking, speculative reservations, preemption of the asking sequence, and the
queue order after a preemption (preempted sequences ahead of new requests), continuous admission. Core: the random
traces (with their prefill chunks), the queue order and a request admitted as soon as a slot frees."""
import numpy as np
import pytest

from minillm.decode import cached_decode
from minillm.serving import LLMEngine, NumpyRunner, SamplingParams, SchedulerConfig
from minillm.speculative import NgramDrafter


def engine(model, num_blocks=32, block_size=4, prefix=True, drafter=None, **sched):
    cfg = model.config
    return LLMEngine(NumpyRunner(model, num_blocks, block_size), num_blocks, block_size, cfg.max_seq_len,
                     cfg.vocab_size, SchedulerConfig(**sched), enable_prefix_caching=prefix, eos_token_id=None,
                     drafter=drafter)


def trace(seed, n=7, vocab=256):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, 9).tolist()
    prompts = [(system if i % 2 == 0 else []) + rng.integers(0, vocab, int(rng.integers(1, 14))).tolist()
               for i in range(n)]
    return prompts, [int(rng.integers(1, 9)) for _ in range(n)], np.sort(rng.integers(0, 8, n))


def run_checked(eng, prompts, outs, arrivals, budget, cap, chunk=None):
    """Step with arrivals; check the step's invariants every step (the token budget, the sequence cap, first come
    first served, a prefill chunk of at most ``chunk`` tokens, no leaked block); return outputs in prompt order."""
    ids, step, nxt, sched = {}, 0, 0, eng.scheduler
    order = np.argsort(arrivals, kind="stable")
    while nxt < len(order) or eng.has_unfinished():
        while nxt < len(order) and arrivals[order[nxt]] <= step:
            i = int(order[nxt])
            ids[i] = eng.add_request(prompts[i], SamplingParams(max_tokens=outs[i], ignore_eos=True))
            nxt += 1
        waiting_before = [s.seq_id for s in sched.waiting]
        batch = sched.schedule()
        if batch is not None:
            assert batch.num_tokens <= budget and len(batch.seqs) <= cap
            if chunk is not None:   # (num_computed moves in postprocess: is_decoding is still this step's)
                prefills = [int(n) for s, n in zip(batch.seqs, batch.num_new) if not s.is_decoding]
                assert all(n <= chunk for n in prefills), f"prefill chunks {prefills} past max_prefill_chunk={chunk}"
            admitted = [s.seq_id for s in batch.seqs if s.seq_id in waiting_before]
            assert admitted == waiting_before[:len(admitted)]           # first come, first served
            sched.postprocess(batch, eng.runner.execute(batch), None)
        eng.block_manager.check_invariants(sched.running + list(sched.waiting))
        step += 1
    assert eng.block_manager.num_free == eng.block_manager.num_blocks
    return [eng.output(ids[i]) for i in range(len(prompts))]


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.parametrize("seed,blocks,budget,chunk,cap", [(0, 40, 12, 5, 4), (1, 9, 16, None, 3),
                                                          (2, 7, 6, 2, 8), (3, 64, 64, None, 2)])
def test_random_traces_match_the_simple_decoder_with_invariants(small_model, seed, blocks, budget, chunk, cap):
    prompts, outs, arrivals = trace(seed)
    eng = engine(small_model, num_blocks=blocks, max_num_batched_tokens=budget, max_prefill_chunk=chunk,
                 max_num_seqs=cap)
    for p, o, g in zip(prompts, outs, run_checked(eng, prompts, outs, arrivals, budget, cap, chunk)):
        assert g.token_ids == cached_decode(small_model, p, o).new_tokens


@pytest.mark.core
@pytest.mark.points(2)
def test_preempted_sequences_wait_ahead_of_every_new_request(small_model):
    """After each step, the sequences preempted in it wait at the front of the queue, ahead of requests that never
    ran, with their K/V forgotten (num_computed 0); the tokens stay exact."""
    prompts, outs, _ = trace(4, n=6)
    eng = engine(small_model, num_blocks=10, max_num_batched_tokens=32, max_num_seqs=3)
    ids = [eng.add_request(p, SamplingParams(max_tokens=o + 4, ignore_eos=True)) for p, o in zip(prompts, outs)]
    sched, seen = eng.scheduler, 0
    while eng.has_unfinished():
        counts = {s.seq_id: s.num_preemptions for s in sched.running}
        batch = sched.schedule()
        preempted = [s for s in sched.waiting if s.num_preemptions > counts.get(s.seq_id, s.num_preemptions)]
        if preempted:
            seen += len(preempted)
            front = list(sched.waiting)[:len(preempted)]
            assert {s.seq_id for s in front} == {s.seq_id for s in preempted}, "preempted sequences not in front"
            assert all(s.num_computed == 0 for s in preempted)
        if batch is not None:
            sched.postprocess(batch, eng.runner.execute(batch), None)
    assert seen > 0
    for i, p, o in zip(ids, prompts, outs):
        assert eng.output(i).token_ids == cached_decode(small_model, p, o + 4).new_tokens


def test_preempted_sequence_goes_to_the_front_and_recomputes(small_model):
    prompts, outs, _ = trace(4, n=5)
    eng = engine(small_model, num_blocks=10, max_num_batched_tokens=32, max_num_seqs=5)
    got = eng.generate(prompts, [SamplingParams(max_tokens=o + 4, ignore_eos=True) for o in outs], progress=False)
    assert eng.scheduler.num_preemptions > 0
    assert any(g.num_preemptions for g in got)
    for p, o, g in zip(prompts, outs, got):
        assert g.token_ids == cached_decode(small_model, p, o + 4).new_tokens


def test_memory_limited_flag_reports_a_full_pool(small_model):
    eng = engine(small_model, num_blocks=5, max_num_batched_tokens=64, max_num_seqs=8)
    for p in trace(5, n=6)[0]:
        eng.add_request(p, SamplingParams(max_tokens=6, ignore_eos=True))
    flags = []
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        flags.append(eng.scheduler.memory_limited)
        eng.scheduler.postprocess(batch, eng.runner.execute(batch), None)
    assert any(flags) and not flags[-1]


def test_prefix_caching_hits_and_keeps_tokens(small_model):
    prompts, outs, arrivals = trace(6)
    eng = engine(small_model, num_blocks=48, max_num_batched_tokens=32, max_num_seqs=4)
    got = run_checked(eng, prompts, outs, arrivals + np.arange(len(arrivals)) * 3, 32, 4)
    assert eng.block_manager.prefix_hit_tokens > 0
    for p, o, g in zip(prompts, outs, got):
        assert g.token_ids == cached_decode(small_model, p, o).new_tokens


@pytest.mark.core
@pytest.mark.points(2)
def test_continuous_batching_admits_a_request_as_soon_as_a_slot_frees(small_model):
    """Continuous batching (the default): when a sequence finishes, the next waiting request joins the running
    ones at the next step, while they are still unfinished; a scheduler that holds new requests until the whole
    batch is done (static batching) gives the same tokens in more steps."""
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    outs = [2, 12, 2]
    eng = engine(small_model, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=2)
    ids = [eng.add_request(p, SamplingParams(max_tokens=o, ignore_eos=True)) for p, o in zip(prompts, outs)]
    joined_early = False
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        if ids[2] in {s.seq_id for s in batch.seqs} and not eng.requests[ids[1]].finished:
            joined_early = True
        eng.scheduler.postprocess(batch, eng.runner.execute(batch), None)
    assert joined_early, "the third request waited for the whole batch to finish: continuous batching admits it " \
                         "as soon as the first one frees its slot"
    for i, p, o in zip(ids, prompts, outs):
        assert eng.output(i).token_ids == cached_decode(small_model, p, o).new_tokens


def test_static_batching_admits_only_when_the_batch_is_done(small_model):
    prompts, outs, _ = trace(7, n=6)
    eng = engine(small_model, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=3, static_batching=True)
    ids = [eng.add_request(p, SamplingParams(max_tokens=o, ignore_eos=True)) for p, o in zip(prompts, outs)]
    first, later_seen = ids[:3], False
    while eng.has_unfinished():
        batch = eng.scheduler.schedule()
        chosen = {s.seq_id for s in batch.seqs}
        if any(not eng.requests[i].finished for i in first):
            assert chosen <= set(first), "a request of the next batch ran while the first batch was unfinished"
        else:
            later_seen = later_seen or bool(chosen - set(first))
        eng.scheduler.postprocess(batch, eng.runner.execute(batch), None)
    assert later_seen
    for i, p, o in zip(ids, prompts, outs):
        assert eng.output(i).token_ids == cached_decode(small_model, p, o).new_tokens


def test_without_chunked_prefill_a_prompt_runs_in_one_step(small_model):
    prompt = np.random.default_rng(8).integers(0, 256, 20).tolist()
    eng = engine(small_model, max_num_batched_tokens=24, enable_chunked_prefill=False)
    eng.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    batch = eng.scheduler.schedule()
    assert batch.num_tokens == 20


def test_speculative_reservations_keep_greedy_tokens(small_model):
    rng = np.random.default_rng(9)
    unit = rng.integers(0, 256, 5).tolist()
    prompts = [unit * 4, unit[:3] * 5]
    eng = engine(small_model, num_blocks=40, max_num_batched_tokens=24, num_speculative_tokens=3,
                 drafter=NgramDrafter())
    got = eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True), progress=False)
    for p, g in zip(prompts, got):
        assert g.token_ids == cached_decode(small_model, p, 12).new_tokens
    assert eng.scheduler.spec_proposed > 0


def test_idle_scheduler_returns_none(small_model):
    assert engine(small_model).scheduler.schedule() is None
