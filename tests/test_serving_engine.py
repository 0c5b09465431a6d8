"""The engine against the simple decoder: identical greedy tokens, seed-stable sampling, bad input isolated."""
import numpy as np
import pytest

from minillm.decode import cached_decode
from minillm.serving import LLM, BlockManager, LLMEngine, NumpyRunner, RequestRejected, SamplingParams, SchedulerConfig
from minillm.tokenizer import EOS


def make_engine(model, num_blocks=64, block_size=8, prefix=True, **sched):
    runner = NumpyRunner(model, num_blocks, block_size)
    cfg = model.config
    return LLMEngine(runner, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig(**sched),
                     enable_prefix_caching=prefix, eos_token_id=None)


def random_trace(seed, n=7, vocab=256, shared_prefix=True):
    """Prompts of odd lengths (some sharing a 20-token prefix), output lengths, and arrival steps."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, 20).tolist()
    prompts, outs = [], []
    for i in range(n):
        own = rng.integers(0, vocab, int(rng.integers(1, 30))).tolist()
        prompts.append(system + own if shared_prefix and i % 2 == 0 else own)
        outs.append(int(rng.integers(1, 14)))
    arrivals = np.sort(rng.integers(0, 12, n))
    return prompts, outs, arrivals


@pytest.fixture(scope="module")
def trace_and_reference(small_model):
    prompts, outs, arrivals = random_trace(5)
    ref = [cached_decode(small_model, p, o).new_tokens for p, o in zip(prompts, outs)]
    return prompts, outs, arrivals, ref


def run_with_arrivals(engine, prompts, params, arrivals):
    """Add request i at step arrivals[i]; step until all finish; return outputs in order."""
    ids, step, nxt = {}, 0, 0
    order = np.argsort(arrivals, kind="stable")
    while nxt < len(order) or engine.has_unfinished():
        while nxt < len(order) and arrivals[order[nxt]] <= step:
            i = int(order[nxt])
            ids[i] = engine.add_request(prompts[i], params[i])
            nxt += 1
        engine.step()
        engine.block_manager.check_invariants(engine.scheduler.running + list(engine.scheduler.waiting))
        step += 1
    return [engine.output(ids[i]) for i in range(len(prompts))]


@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("chunk,budget", [(1, 16), (7, 24), (64, 64)])
@pytest.mark.parametrize("num_blocks", [9, 64])     # 9 blocks forces preemption
def test_engine_greedy_tokens_equal_cached_decode_alone(small_model, trace_and_reference, block_size, chunk,
                                                         budget, num_blocks):
    prompts, outs, arrivals, ref = trace_and_reference
    num_blocks = num_blocks if block_size == 8 else (num_blocks + 1) // 2
    eng = make_engine(small_model, num_blocks, block_size, max_prefill_chunk=chunk, max_num_batched_tokens=budget,
                      max_num_seqs=5)
    got = run_with_arrivals(eng, prompts, [SamplingParams(max_tokens=o, ignore_eos=True) for o in outs], arrivals)
    for g, r in zip(got, ref):
        assert g.token_ids == r and g.finished and g.finish_reason == "length"
    assert eng.block_manager.num_free == eng.block_manager.num_blocks
    if num_blocks <= 9:
        assert eng.scheduler.num_preemptions > 0, "the small pool was meant to force preemption"


def test_engine_seeded_sampling_is_independent_of_the_batch(small_model, trace_and_reference):
    prompts, outs, arrivals, _ = trace_and_reference
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_tokens=o, seed=100 + i, ignore_eos=True)
              for i, o in enumerate(outs)]
    alone = []
    for p, sp in zip(prompts, params):
        eng = make_engine(small_model)
        alone.append(eng.generate([p], [sp], progress=False)[0].token_ids)
    eng = make_engine(small_model, num_blocks=9, max_prefill_chunk=7, max_num_batched_tokens=16)
    together = run_with_arrivals(eng, prompts, params, arrivals)
    assert [o.token_ids for o in together] == alone
    assert eng.scheduler.num_preemptions > 0
    # and the seed matters: other seeds give other tokens for at least one request
    other = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, max_tokens=o, seed=999 + i, ignore_eos=True)
             for i, o in enumerate(outs)]
    assert [o.token_ids for o in make_engine(small_model).generate(prompts, other, progress=False)] != alone


def test_engine_fully_cached_prompt_recomputes_its_last_token(small_model):
    prompt = list(range(1, 33))     # exactly 4 blocks of 8
    eng = make_engine(small_model)
    first = eng.generate([prompt], SamplingParams(max_tokens=5), progress=False)[0]
    second = eng.generate([prompt], SamplingParams(max_tokens=5), progress=False)[0]
    assert first.token_ids == second.token_ids == cached_decode(small_model, prompt, 5).new_tokens
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 24   # prompt[:-1] covers 3 full blocks
    assert eng.block_manager.prefix_hit_tokens == 24


def test_engine_two_sequences_sharing_a_prefix_in_one_step(small_model):
    base = list(range(40, 80))
    prompts = [base + [1, 2], base + [3]]
    eng = make_engine(small_model, max_num_batched_tokens=256)
    a = eng.generate(prompts[:1], SamplingParams(max_tokens=3), progress=False)      # fills the cache
    outs = eng.generate(prompts, SamplingParams(max_tokens=6), progress=False)       # both hit it at once
    for p, o in zip(prompts, outs):
        assert o.token_ids == cached_decode(small_model, p, 6).new_tokens
        assert o.num_cached_tokens == 40
    assert a[0].token_ids == outs[0].token_ids[:3]


def test_engine_self_preemption_with_one_sequence_left_still_finishes(small_model):
    """Two long requests in a pool that fits one: the scheduler preempts, never deadlocks or steps empty."""
    eng = make_engine(small_model, num_blocks=6, block_size=8, max_num_batched_tokens=64)
    prompts = [list(range(1, 20)), list(range(30, 50))]
    outs = eng.generate(prompts, SamplingParams(max_tokens=25, ignore_eos=True), progress=False)
    for p, o in zip(prompts, outs):
        assert o.token_ids == cached_decode(small_model, p, 25).new_tokens
    assert eng.scheduler.num_preemptions >= 1


def test_engine_stops_at_eos_and_stop_tokens(tiny_model):
    llm = LLM(tiny_model, num_blocks=64)
    ref = cached_decode(tiny_model, llm.engine.tokenizer.encode("import os\n"), 30).new_tokens
    stop = ref[7]
    out = llm.generate("import os\n", SamplingParams(max_tokens=30, stop_token_ids=[stop]), progress=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == ref[:ref.index(stop) + 1]
    assert llm.engine.eos_token_id == EOS


def test_engine_outputs_carry_text_and_ordered_timings(tiny_model):
    llm = LLM(tiny_model, num_blocks=64)
    outs = llm.generate(["def f(x):\n", "import sys\n"], SamplingParams(max_tokens=6, ignore_eos=True),
                        progress=False)
    for o in outs:
        assert o.text == llm.engine.tokenizer.decode(o.token_ids)
        assert o.arrival_time <= o.first_token_time <= o.token_times[-1] == o.finish_time
        assert len(o.token_times) == 6 and all(x >= 0 for x in o.itl) and o.ttft >= 0 and o.tpot >= 0


def test_engine_stream_yields_tokens_while_others_run(small_model):
    eng = make_engine(small_model)
    other = eng.add_request([5, 6, 7], SamplingParams(max_tokens=20, ignore_eos=True))
    streamed = list(eng.stream([9, 8, 7, 6], SamplingParams(max_tokens=8, ignore_eos=True)))
    assert streamed == cached_decode(small_model, [9, 8, 7, 6], 8).new_tokens
    assert len(eng.output(other).token_ids) >= 8     # it advanced in the same steps
    eng.run()
    assert eng.output(other).token_ids == cached_decode(small_model, [5, 6, 7], 20).new_tokens


@pytest.mark.parametrize("prompt,params,exc,match", [
    ([], SamplingParams(), ValueError, "empty"),
    (list(range(200)), SamplingParams(), RequestRejected, "max_seq_len"),
    ([1, 2, 3], SamplingParams(max_tokens=200), RequestRejected, "exceeds max_seq_len"),
    ([1, 2, 300], SamplingParams(), ValueError, r"\[0, 259\)"),
    ([1.5, 2.0], SamplingParams(), TypeError, "integers"),
    ([[1, 2]], SamplingParams(), ValueError, "1-D"),
    ([1, 2], "greedy", TypeError, "SamplingParams"),
    ([1, 2], SamplingParams(stop_token_ids=(7, 300)), ValueError, r"stop_token_ids \[300\].*vocabulary"),
])
def test_engine_rejects_bad_requests_and_keeps_the_others(small_model, prompt, params, exc, match):
    eng = make_engine(small_model)
    good = eng.add_request([1, 2, 3, 4], SamplingParams(max_tokens=10, ignore_eos=True))
    for _ in range(3):
        eng.step()
    with pytest.raises(exc, match=match):
        eng.add_request(prompt, params)
    eng.run()
    assert list(eng.requests) == [good]                 # the bad request was never queued
    assert eng.output(good).token_ids == cached_decode(small_model, [1, 2, 3, 4], 10).new_tokens


@pytest.mark.parametrize("kw,match", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.5), "temperature"), (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"), (dict(temperature=float("nan")), "temperature"),
    (dict(seed=-1), "seed"), (dict(seed=2**32), r"seed.*2\*\*32"), (dict(stop_token_ids=(3, -3)), "stop_token_ids"),
])
def test_sampling_params_reject_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


@pytest.mark.parametrize("stop", [5, "ab", b"ab", ("a",), (2.0,), (True,), None])
def test_sampling_params_reject_stop_token_ids_that_are_not_token_ids(stop):
    with pytest.raises(TypeError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=stop)


def test_sampling_params_keep_stop_token_ids_from_any_iterable_and_the_largest_seed():
    assert SamplingParams(stop_token_ids=[3, np.int64(4)]).stop_token_ids == (3, 4)
    assert SamplingParams(stop_token_ids=np.array([5])).stop_token_ids == (5,)
    assert SamplingParams(seed=2**32 - 1).seed == 2**32 - 1


def test_engine_rejects_a_bad_arrival_time_and_keeps_the_others(small_model):
    eng = make_engine(small_model)
    good = eng.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    for bad in (float("nan"), float("inf"), "now"):
        with pytest.raises(ValueError, match="arrival_time"):
            eng.add_request([1, 2], SamplingParams(), arrival_time=bad)
    eng.run()
    assert list(eng.requests) == [good]
    assert eng.output(good).token_ids == cached_decode(small_model, [1, 2, 3], 4).new_tokens


def test_generate_checks_stop_token_ids_before_queueing_any(small_model):
    eng = make_engine(small_model)
    with pytest.raises(ValueError, match="prompt 1: stop_token_ids"):
        eng.generate([[1, 2], [3]], [SamplingParams(), SamplingParams(stop_token_ids=(10**6,))], progress=False)
    assert not eng.requests


@pytest.mark.parametrize("kw,match", [(dict(block_size=0), "block_size"), (dict(block_size=-4), "block_size"),
                                      (dict(block_size=2.5), "block_size"), (dict(num_blocks=0), "num_blocks"),
                                      (dict(num_blocks=-1), "num_blocks"), (dict(max_num_seqs=0), "max_num_seqs")])
def test_llm_rejects_bad_pool_settings(small_model, kw, match):
    with pytest.raises(ValueError, match=match):
        LLM(small_model, **kw)


def test_numpy_runner_rejects_bad_pool_settings(small_model):
    with pytest.raises(ValueError, match="block_size"):
        NumpyRunner(small_model, 8, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        NumpyRunner(small_model, -2, 8)


def test_engine_rejects_a_request_larger_than_the_whole_pool(small_model):
    eng = make_engine(small_model, num_blocks=3, block_size=8)   # 24 slots
    ok = eng.add_request([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    with pytest.raises(RequestRejected, match="whole pool has 3"):
        eng.add_request(list(range(1, 20)), SamplingParams(max_tokens=10))
    eng.run()
    assert eng.output(ok).finished


def test_generate_validates_every_prompt_before_queueing_any(small_model):
    eng = make_engine(small_model)
    with pytest.raises(ValueError, match="prompt 1"):
        eng.generate([[1, 2], []], SamplingParams(max_tokens=2), progress=False)
    assert not eng.requests and not eng.has_unfinished()


def test_generate_takes_params_from_any_iterable(small_model):
    """``params`` is annotated Iterable[SamplingParams]: a generator works as a list does; a non-iterable is named."""
    eng = make_engine(small_model)
    prompts = [[1, 2], [3, 4, 5]]
    want = eng.generate(prompts, [SamplingParams(max_tokens=n) for n in (2, 3)], progress=False)
    got = eng.generate(prompts, (SamplingParams(max_tokens=n) for n in (2, 3)), progress=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want] and [len(o.token_ids) for o in got] == [2, 3]
    with pytest.raises(TypeError, match="params must be SamplingParams"):
        eng.generate(prompts, 5, progress=False)


def test_engine_abort_frees_blocks(small_model):
    eng = make_engine(small_model)
    a = eng.add_request(list(range(1, 30)), SamplingParams(max_tokens=20))
    eng.step()
    eng.abort_request(a)
    assert eng.output(a).finish_reason == "abort" and eng.block_manager.num_free == eng.block_manager.num_blocks


def test_engine_speculative_greedy_equals_plain_engine_with_preemption_and_prefix_caching(tiny_model):
    """Prompt-lookup speculation in the engine (k=4): the same greedy tokens as the plain engine and as
    cached_decode, with a pool small enough to preempt and shared prefixes in the prefix cache; and the
    drafts really were accepted (so the verify path ran)."""
    from minillm.speculative import NgramDrafter
    from minillm.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    head = "def add(a, b):\n    return a + b\n\n\n"
    texts = [head + "def sub(a, b):\n", head + "def mul(a, b):\n", "import os\nimport sys\nimport os\n",
             "for i in range(10):\n    print(i)\nfor i in range(10):\n", head + "class A:\n"]
    prompts = [tok.encode(t) for t in texts]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (40, 33, 25, 40, 30)]
    cfg = tiny_model.config

    def run(k):
        runner = NumpyRunner(tiny_model, 14, 16)
        eng = LLMEngine(runner, 14, 16, cfg.max_seq_len, cfg.vocab_size,
                        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, num_speculative_tokens=k),
                        enable_prefix_caching=True, drafter=NgramDrafter() if k else None)
        outs = run_with_arrivals(eng, prompts, params, np.array([0, 0, 1, 2, 6]))
        return eng, outs

    plain_eng, plain = run(0)
    spec_eng, spec = run(4)
    for p, sp, a, b in zip(prompts, params, plain, spec):
        assert a.token_ids == b.token_ids == cached_decode(tiny_model, p, sp.max_tokens).new_tokens
    s = spec_eng.scheduler
    assert s.spec_accepted > 0 and s.spec_proposed > s.spec_accepted
    assert s.num_preemptions > 0 and spec_eng.block_manager.prefix_hit_tokens > 0
    assert s.num_steps < plain_eng.scheduler.num_steps      # accepted drafts save steps
    assert spec_eng.block_manager.num_free == spec_eng.block_manager.num_blocks


def test_scheduler_rejects_speculation_without_a_drafter(small_model):
    with pytest.raises(ValueError, match="drafter"):
        make_engine(small_model, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=-1)


def test_engine_step_observers_see_every_step_before_it_runs(small_model):
    eng = make_engine(small_model, max_num_batched_tokens=16)
    seen, ran = [], []
    eng.add_step_observer(lambda b: seen.append((b.num_tokens, len(ran))))
    execute = eng.runner.execute
    eng.runner.execute = lambda b: ran.append(b) or execute(b)
    eng.generate([[1, 2, 3] * 9, [4, 5]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)
    assert len(seen) == len(ran) == eng.scheduler.num_steps
    assert [n for n, _ in seen] == [b.num_tokens for b in ran]
    assert [before for _, before in seen] == list(range(len(ran)))    # each observed before its step ran


# -- a stop or EOS token inside an accepted speculative run -------------------------------------------------

STOP_PROMPT = "for i in range(10):\n    print(i)\n" * 2 + "for i in range(10):\n"
GOOD_PROMPT = "def fib(n):\n"


@pytest.fixture(scope="module")
def draft_model():
    from minillm import load_model
    return load_model("draft")


def stop_engine(target, drafter, k, block_size, eos=None):
    """An engine over the tiny model with ``eos`` as its end-of-sequence id and an n-gram or draft-model
    drafter (k = 0: no speculation)."""
    from minillm.serving.draft import DraftModelProposer
    from minillm.speculative import NgramDrafter
    cfg = target.config
    num_blocks = -(-400 // block_size)
    d = None
    if k:
        d = NgramDrafter() if drafter == "ngram" else DraftModelProposer(NumpyRunner(drafter, num_blocks, block_size))
    return LLMEngine(NumpyRunner(target, num_blocks, block_size), num_blocks, block_size, cfg.max_seq_len,
                     cfg.vocab_size, SchedulerConfig(num_speculative_tokens=k), eos_token_id=eos, drafter=d)


def serve_pair(eng, bad_params, good_params):
    """Run the stop request and a good request together, checking the pool's invariants every step."""
    from minillm.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    bad = eng.add_request(tok.encode(STOP_PROMPT), bad_params)
    good = eng.add_request(tok.encode(GOOD_PROMPT), good_params)
    drafted = []                                  # (tokens the stop request had emitted, its draft) per step
    eng.add_step_observer(lambda b: drafted.extend(
        (len(s.output), list(d)) for s, d in zip(b.seqs, b.drafts) if s.seq_id == bad and d))
    steps = 0
    while eng.has_unfinished():
        eng.step()
        eng.block_manager.check_invariants(eng.scheduler.running + list(eng.scheduler.waiting))
        steps += 1
        assert steps < 500, "no progress"
    assert eng.block_manager.num_free == eng.block_manager.num_blocks          # nothing leaked
    assert eng.proposer is None or not eng.proposer._written                   # draft caches released
    return eng.output(bad), eng.output(good), drafted


def first_token_mid_accepted_run(out, drafted):
    """(token, index): a token whose first occurrence in ``out`` is an accepted draft followed by at least
    one more accepted draft of the same step -- where emitting stops early inside a verified run."""
    for before, d in drafted:
        a = 0
        while a < len(d) and before + a < len(out) and out[before + a] == d[a]:
            a += 1                                # the verifier never returns a rejected draft itself
        for m in range(a - 1):
            if out[before + m] not in out[:before + m]:
                return out[before + m], before + m
    return None


@pytest.mark.parametrize("block_size", [1, 8])
@pytest.mark.parametrize("kind", ["stop_token", "eos"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("drafter_name", ["ngram", "draft"])
def test_engine_speculative_stop_inside_accepted_drafts_equals_plain_engine(tiny_model, draft_model, kind,
                                                                           temperature, drafter_name, block_size):
    """A stop token (or EOS) that the verifier accepts with more accepted drafts after it: the request stops
    right there with the tokens the engine without the stop gives, cut after the stop token -- in greedy,
    the plain engine's tokens -- its K/V cache is cut back to the kept tokens (pool invariants every step,
    no block leaked), and the request beside it completes with its usual tokens."""
    drafter = "ngram" if drafter_name == "ngram" else draft_model
    k = 4
    sp = dict(temperature=temperature, max_tokens=40)
    free_run = SamplingParams(**sp, seed=1, ignore_eos=True)
    good = SamplingParams(temperature=temperature, max_tokens=30, seed=2, ignore_eos=True)
    ref_bad, ref_good, drafted = serve_pair(stop_engine(tiny_model, drafter, k, block_size), free_run, good)
    found = first_token_mid_accepted_run(ref_bad.token_ids, drafted)
    assert found is not None, "the scenario did not occur: no token first appears inside an accepted run"
    stop, at = found
    expect = ref_bad.token_ids[:at + 1]

    def stopped(k):
        if kind == "stop_token":
            return serve_pair(stop_engine(tiny_model, drafter, k, block_size), SamplingParams(**sp, seed=1, stop_token_ids=(stop,)),
                              good)
        return serve_pair(stop_engine(tiny_model, drafter, k, block_size, eos=stop), SamplingParams(**sp, seed=1), good)

    bad, good_out, _ = stopped(k)
    assert bad.finish_reason == "stop" and bad.token_ids == expect
    assert good_out.finished and good_out.finish_reason == "length" and good_out.token_ids == ref_good.token_ids
    if temperature == 0:
        plain_bad, plain_good, _ = stopped(0)
        assert bad.token_ids == plain_bad.token_ids and good_out.token_ids == plain_good.token_ids


# -- one failing request does not stop the engine ----------------------------------------------------------

class FaultyBlockManager(BlockManager):
    """A real BlockManager that raises while accounting for request ``bad_id`` once it has ``after`` tokens
    (fault injection: any internal error in one sequence's bookkeeping)."""

    def __init__(self, num_blocks, block_size, bad_id, after):
        super().__init__(num_blocks, block_size)
        self.bad_id, self.after = bad_id, after

    def register(self, seq):
        if seq.seq_id == self.bad_id and len(seq.output) >= self.after:
            raise IndexError("injected fault")
        super().register(seq)


def test_engine_internal_error_in_one_request_finishes_it_and_serves_the_rest(small_model):
    cfg = small_model.config
    bm = FaultyBlockManager(64, 8, bad_id=1, after=3)
    eng = LLMEngine(NumpyRunner(small_model, 64, 8), 64, 8, cfg.max_seq_len, cfg.vocab_size,
                    SchedulerConfig(max_num_batched_tokens=16), block_manager=bm)
    prompts = [[1, 2, 3, 4], [5, 6, 7], list(range(10, 40))]
    ids = [eng.add_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    with pytest.warns(RuntimeWarning, match="request 1 failed.*injected fault"):
        eng.run()
    bad = eng.output(ids[1])
    assert bad.finished and bad.finish_reason == "error" and "IndexError: injected fault" in bad.error
    assert bad.token_ids == cached_decode(small_model, prompts[1], 3).new_tokens      # what it had emitted
    for i in (0, 2):
        out = eng.output(ids[i])
        assert out.finish_reason == "length" and out.error is None
        assert out.token_ids == cached_decode(small_model, prompts[i], 12).new_tokens
    assert bm.num_free == bm.num_blocks
    # the engine keeps serving; a streamed request that fails raises once its tokens are out
    bm.bad_id = eng._next_id
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="failed: IndexError"):
        list(eng.stream([8, 9], SamplingParams(max_tokens=6, ignore_eos=True)))
    after = eng.generate([[8, 9]], SamplingParams(max_tokens=6, ignore_eos=True), progress=False)[0]
    assert after.token_ids == cached_decode(small_model, [8, 9], 6).new_tokens and bm.num_free == bm.num_blocks


class FreeFailsOnce(BlockManager):
    """A real BlockManager whose first free() of request ``bad_id`` raises (a fault while preempting it)."""

    def __init__(self, num_blocks, block_size, bad_id):
        super().__init__(num_blocks, block_size)
        self.bad_id, self.fired = bad_id, False

    def free(self, seq):
        if seq.seq_id == self.bad_id and not self.fired:
            self.fired = True
            raise IndexError("injected free fault")
        super().free(seq)


def test_engine_error_while_preempting_finishes_the_victim_not_the_requester(small_model):
    """When preempting a victim fails, the victim is finished with the error; the sequence that needed the
    block goes on and every other request completes with the simple decoder's tokens."""
    cfg = small_model.config
    bm = FreeFailsOnce(6, 4, bad_id=2)
    eng = LLMEngine(NumpyRunner(small_model, 6, 4), 6, 4, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig(),
                    block_manager=bm)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 12]]
    ids = [eng.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in prompts]
    with pytest.warns(RuntimeWarning, match="request 2 failed.*injected free fault"):
        eng.run()
    assert bm.fired and not eng.has_unfinished()
    assert eng.output(ids[2]).finish_reason == "error"
    for i in (0, 1):
        assert eng.output(ids[i]).token_ids == cached_decode(small_model, prompts[i], 10).new_tokens
    assert bm.num_free == bm.num_blocks


def test_engine_runner_returning_too_few_tokens_raises(small_model):
    """A runner fault is nobody's sequence: the step raises instead of failing every request one by one."""
    cfg = small_model.config

    class ShortRunner(NumpyRunner):
        def execute(self, batch):
            return super().execute(batch)[:-1]

    eng = LLMEngine(ShortRunner(small_model, 16, 8), 16, 8, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig())
    eng.add_request([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    with pytest.raises(ValueError, match="logits rows but the runner returned"):
        eng.step()


@pytest.mark.parametrize("k", [0, 3])
def test_engine_sequence_with_broken_accounting_is_finished_with_an_error(small_model, k):
    """The state the speculative stop bug left behind (num_computed past the sequence's end) no longer
    wedges the engine: that sequence is finished with an error, the others complete."""
    from minillm.speculative import NgramDrafter
    cfg = small_model.config
    eng = LLMEngine(NumpyRunner(small_model, 64, 8), 64, 8, cfg.max_seq_len, cfg.vocab_size,
                    SchedulerConfig(num_speculative_tokens=k), drafter=NgramDrafter() if k else None)
    prompts = [[1, 2, 3, 1, 2, 3], [4, 5, 6, 4, 5]]
    ids = [eng.add_request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in prompts]
    eng.step()
    eng.step()
    broken = eng.requests[ids[0]]
    broken.num_computed = len(broken) + 3
    with pytest.warns(RuntimeWarning, match="accounting is broken"):
        eng.run()
    assert eng.output(ids[0]).finish_reason == "error"
    assert eng.output(ids[1]).token_ids == cached_decode(small_model, prompts[1], 10).new_tokens
    assert eng.block_manager.num_free == eng.block_manager.num_blocks



def _sim_engine(runner=None):
    from minillm.serving import SimulatedRunner
    from minillm.tokenizer import ByteTokenizer
    return LLMEngine(runner or SimulatedRunner(), 64, 8, 128, 259, SchedulerConfig(), tokenizer=ByteTokenizer())


def _clean(eng) -> bool:
    return not eng.requests and not eng.has_unfinished() and eng.block_manager.num_free == eng.block_manager.num_blocks


def test_serve_trace_nan_arrival_raises_at_once_and_queues_nothing():
    """Was: the clock became nan and the call never returned, holding the engine's lock."""
    import threading
    eng, sp = _sim_engine(), SamplingParams(max_tokens=2, ignore_eos=True)
    got = []

    def call():
        try:
            eng.serve_trace(["a", "b"], sp, [0.0, float("nan")])
        except Exception as e:      # noqa: BLE001 - the test inspects it
            got.append(e)
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive(), "serve_trace hung on a nan arrival"
    assert isinstance(got[0], ValueError) and "arrivals[1]" in str(got[0]) and _clean(eng)
    for bad in ([0.0, -1.0], [0.0, float("inf")], [0.0, True], [0.0, "1"]):
        with pytest.raises(ValueError, match="arrivals\\[1\\]"):
            eng.serve_trace(["a", "b"], sp, bad)
    assert _clean(eng)


def test_serve_trace_length_mismatch_raises():
    """Was: three prompts and two arrivals silently returned two outputs."""
    eng, sp = _sim_engine(), SamplingParams(max_tokens=2, ignore_eos=True)
    with pytest.raises(ValueError, match="3 prompts but 2 arrival times"):
        eng.serve_trace(["a", "b", "c"], sp, [0.0, 0.1])
    with pytest.raises(ValueError, match="3 prompts but 2 SamplingParams"):
        eng.serve_trace(["a", "b", "c"], [sp, sp], [0.0, 0.1, 0.2])
    assert _clean(eng)


def test_serve_trace_bad_prompt_raises_before_queuing_anything():
    """Was: the empty third prompt raised after "a" was queued; "a" stayed in the engine, unfinished."""
    eng, sp = _sim_engine(), SamplingParams(max_tokens=2, ignore_eos=True)
    with pytest.raises(ValueError, match="prompt 1: "):
        eng.serve_trace(["a", "", "c"], sp, [0.0, 1.0, 2.0])
    assert _clean(eng)
    outs = eng.serve_trace(["a", "c"], sp, [1.0, 0.0])          # the engine still serves, in any arrival order
    assert [len(o.token_ids) for o in outs] == [2, 2] and outs[0].arrival_time > outs[1].arrival_time
    assert _clean(eng)


def test_serve_trace_step_error_aborts_and_forgets_its_requests():
    from minillm.serving import SimulatedRunner

    class ShortSim(SimulatedRunner):
        def execute(self, batch):
            return super().execute(batch)[:-1]
    eng = _sim_engine(ShortSim())
    with pytest.raises(ValueError, match="logits rows but the runner returned"):
        eng.serve_trace(["a", "b"], SamplingParams(max_tokens=2, ignore_eos=True), [0.0, 0.0])
    assert _clean(eng)


def test_engine_init_rejects_a_runner_built_for_other_settings(small_model):
    """Was: accepted, then the first step failed with "slot_mapping must lie in [-1, 64)"."""
    from minillm.serving import SimulatedRunner
    cfg = small_model.config
    with pytest.raises(ValueError, match="NumpyRunner was built for 4 blocks of 16 tokens.*told 64 blocks of 16"):
        LLMEngine(NumpyRunner(small_model, 4, 16), 64, 16, cfg.max_seq_len, cfg.vocab_size)
    with pytest.raises(ValueError, match="built for 64 blocks of 8 tokens.*told 64 blocks of 16"):
        LLMEngine(NumpyRunner(small_model, 64, 8), 64, 16, cfg.max_seq_len, cfg.vocab_size)
    with pytest.raises(ValueError, match="max_model_len=2048 exceeds the 128 positions of NumpyRunner's model"):
        LLMEngine(NumpyRunner(small_model, 64, 16), 64, 16, 2048, cfg.vocab_size)
    LLMEngine(NumpyRunner(small_model, 80, 16), 64, 16, cfg.max_seq_len, cfg.vocab_size)   # a larger pool serves
    LLMEngine(SimulatedRunner(), 10**6, 1, 1 << 20, 50)                 # nothing computed: any settings


def test_sampling_params_store_a_temperature_below_greedy_below_as_greedy():
    """Was: temperature 1e-308 passed and divided the logits into inf (all newlines from the tiny model); as vLLM
    does, a temperature under 1e-5 now decodes greedily."""
    from minillm.serving.sequence import GREEDY_BELOW

    for t in (1e-308, 1e-9, GREEDY_BELOW / 2):
        p = SamplingParams(temperature=t, seed=1)
        assert p.temperature == 0.0 and p.greedy
    assert SamplingParams(temperature=GREEDY_BELOW).temperature == GREEDY_BELOW
    llm = LLM("tiny")
    greedy = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=12), progress=False)[0].token_ids
    tiny_t = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=12, temperature=1e-308, seed=1),
                          progress=False)[0].token_ids
    assert tiny_t == greedy


def test_generate_with_a_top_k_past_int64_keeps_every_token():
    """Was: top_k=2**63 passed SamplingParams and raised OverflowError inside every step (its conversion to an
    int64 array), failing the requests that shared the step and, in the Python API, every later step. A top-k
    of at least the vocabulary keeps every token, so it samples as top_k=None does."""
    llm = LLM("tiny")
    prompts = ["def add(a, b):", "import os\n"]
    for k in (2**63, 2**70):
        huge = llm.generate(prompts, [SamplingParams(max_tokens=10, temperature=1.0, seed=3, top_k=k),
                                      SamplingParams(max_tokens=10)], progress=False)
        off = llm.generate(prompts, [SamplingParams(max_tokens=10, temperature=1.0, seed=3),
                                     SamplingParams(max_tokens=10)], progress=False)
        assert [o.token_ids for o in huge] == [o.token_ids for o in off]


def test_add_request_checks_a_prompts_length_before_its_ids():
    """A prompt longer than the model is refused by its length before each of its ids is checked (the ids of a
    30-million-token body took seconds under the engine's lock): the error names the length, not an id."""
    eng = LLM("tiny").engine
    n = eng.scheduler.max_model_len + 1
    with pytest.raises(RequestRejected, match=f"prompt has {n} tokens"):
        eng.add_request([-1] * n, SamplingParams(max_tokens=1))
    with pytest.raises(RequestRejected, match=f"prompt has {n} tokens"):
        eng.add_request("x" * n, SamplingParams(max_tokens=1))
    assert not eng.requests and not eng.has_unfinished()


def test_prepare_runs_while_another_thread_holds_the_engine_lock():
    """The work that grows with a prompt (tokenizing, checking its ids) is done by prepare(), outside the lock
    the stepping thread holds: a server adds a long prompt without stalling the others' steps."""
    import threading

    from minillm.serving.engine import PreparedRequest

    llm = LLM("tiny")
    eng = llm.engine
    held, release, got = threading.Event(), threading.Event(), {}

    def hold():
        with eng.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    worker = threading.Thread(target=lambda: got.setdefault("req", eng.prepare("def add(a, b):",
                                                                               SamplingParams(max_tokens=6))))
    worker.start()
    worker.join(5)
    done_while_held = "req" in got
    release.set()
    holder.join()
    assert done_while_held, "prepare() waited for the engine lock"
    assert isinstance(got["req"], PreparedRequest)
    rid = eng.add_prepared(got["req"])
    while eng.has_unfinished():
        eng.step()
    want = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=6), progress=False)[0].token_ids
    assert eng.output(rid).token_ids == want
    with pytest.raises(TypeError, match="prepare"):
        eng.add_prepared("def add(a, b):")


@pytest.mark.parametrize("bad", [None, 5, 2.5])
def test_generate_names_a_prompts_argument_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match="prompts must be"):
        LLM("tiny").generate(bad, progress=False)
