"""The LLM / engine API under real use (issue 31): seeded speculative sampling gives the same tokens whatever
the batch, one LLM serves several threads, a failed request raises, finished requests are forgotten, dropped
streams abort, and bad arguments are refused clearly."""
import numpy as np
import pytest

from minillm.decode import cached_decode
from minillm.serving import LLM, LLMEngine, NumpyRunner, SamplingParams, SchedulerConfig

from .test_serving_engine import FaultyBlockManager, draft_model, make_engine, run_with_arrivals  # noqa: F401


# -- seeded speculative sampling: the same tokens whatever the batch ------------------------------------------

HELD_OUT = '''import os
import sys


def read_lines(path, encoding="utf-8"):
    """Return the lines of a text file without their newlines."""
    with open(path, encoding=encoding) as f:
        return [line.rstrip("\\n") for line in f]


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, n=1):
        self.counts[key] = self.counts.get(key, 0) + n
        return self.counts[key]

    def most_common(self, n=None):
        items = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return items if n is None else items[:n]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    c = Counter()
    for path in argv:
        for line in read_lines(path):
            for word in line.split():
                c.add(word.lower())
    for word, n in c.most_common(10):
        print(f"{n:6d} {word}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''


def held_out_prompts(n=20, seed=0):
    """``n`` prompts of 3-300 bytes cut from a piece of source code the models were not trained on."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, 301, n)
    return [HELD_OUT[s:s + m] for m in lens for s in [int(rng.integers(0, len(HELD_OUT) - m + 1))]]


def alone_and_batched(make_llm, prompts, params):
    """Each request's tokens served alone (one request per generate) and all of them in one batch."""
    llm = make_llm()
    alone = [llm.generate([p], [sp], progress=False)[0].token_ids for p, sp in zip(prompts, params)]
    batched = make_llm()
    together = [o.token_ids for o in batched.generate(prompts, params, progress=False)]
    return alone, together, batched.engine.scheduler


@pytest.mark.parametrize("runner", ["numpy", "torch"])
@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_llm_seeded_speculative_sampling_is_independent_of_the_batch_default_budget(runner, drafter):
    """Issue 31: k = 4, T = 0.8, top-p 0.95, 20 held-out prompts of 3-300 bytes, 32 new tokens, the default
    token budget: every seeded request gets the same tokens alone as in the batch (before the fix the budget
    trimmed a request's drafts depending on the others, and 8-9 of 20 differed), and the drafts were used."""
    kw = {}
    if runner == "torch":
        torch = pytest.importorskip("torch")
        kw = dict(dtype=torch.float32, attention="torch")
    prompts = held_out_prompts()
    params = [SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    alone, together, sched = alone_and_batched(
        lambda: LLM("tiny", runner=runner, num_speculative_tokens=4, speculative_model=drafter, **kw),
        prompts, params)
    differ = [i for i, (a, b) in enumerate(zip(alone, together)) if a != b]
    assert not differ, f"requests {differ} got other tokens in the batch than alone"
    assert sched.spec_accepted > 0


@pytest.mark.parametrize("drafter", ["ngram", "draft"])
def test_engine_seeded_speculative_sampling_is_independent_of_a_tight_budget_and_pool(tiny_model, draft_model,
                                                                                    drafter):
    """The same promise under a budget of 8 tokens (k = 4, so at most one full decode with its draft beside a
    decode), staggered arrivals and a pool small enough to preempt; greedy requests in the same batch keep
    their own tokens too."""
    from minillm.serving.draft import DraftModelProposer
    from minillm.speculative import NgramDrafter
    from minillm.tokenizer import ByteTokenizer
    cfg = tiny_model.config
    prompts = [ByteTokenizer().encode(p) for p in held_out_prompts(8, seed=1)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True) if i % 4 == 3 else
              SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, ignore_eos=True, seed=50 + i)
              for i in range(len(prompts))]

    def engine(num_blocks, budget, max_num_seqs):
        d = NgramDrafter() if drafter == "ngram" else DraftModelProposer(NumpyRunner(draft_model, num_blocks, 8))
        return LLMEngine(NumpyRunner(tiny_model, num_blocks, 8), num_blocks, 8, cfg.max_seq_len, cfg.vocab_size,
                         SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                         num_speculative_tokens=4), drafter=d)
    alone = [engine(64, 512, 1).generate([p], [sp], progress=False)[0].token_ids for p, sp in zip(prompts, params)]
    eng = engine(max(-(-(len(p) + 23) // 8) for p in prompts) + 3, 8, 4)
    together = run_with_arrivals(eng, prompts, params, np.array([0, 0, 0, 1, 2, 3, 5, 8]))
    assert [o.token_ids for o in together] == alone
    assert eng.scheduler.num_preemptions > 0 and eng.scheduler.spec_accepted > 0


# -- one engine, several threads; failures; releasing finished requests -------------------------------------

def thread_prompts(offset):
    """Six prompts for one caller: greedy and seeded-sampling requests of different lengths."""
    texts = held_out_prompts(6, seed=10 + offset)
    params = [SamplingParams(max_tokens=12 + 3 * i, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.8, top_p=0.95, max_tokens=12 + 3 * i, seed=offset * 100 + i,
                             ignore_eos=True) for i in range(len(texts))]
    return texts, params


def test_llm_generate_from_two_threads_gives_each_caller_its_own_outputs():
    """Issue 31: two threads calling generate() on one LLM at once. Before the fix every request finished
    with an error (IndexError, 'accounting is broken') and generate() returned them as if it had succeeded;
    now each thread gets exactly what it gets alone, in three rounds that start together."""
    import threading
    llm = LLM("tiny")
    work = [thread_prompts(0), thread_prompts(1)]
    alone = [[o.token_ids for o in llm.generate(p, sp, progress=False)] for p, sp in work]
    for _ in range(3):
        start = threading.Barrier(2)
        got, errors = [None, None], []

        def call(t):
            try:
                start.wait()
                got[t] = llm.generate(*work[t], progress=False)
            except BaseException as e:          # noqa: BLE001 (reported below)
                errors.append(e)
        threads = [threading.Thread(target=call, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        assert not errors, errors
        for t in range(2):
            assert [o.finish_reason for o in got[t]] == ["length"] * 6
            assert [o.token_ids for o in got[t]] == alone[t]
    assert not llm.engine.requests and not llm.engine.has_unfinished()
    assert llm.engine.block_manager.num_free == llm.engine.block_manager.num_blocks


def test_generate_raises_request_failed_with_every_output_of_the_call(small_model):
    """A request of the call hits an internal error: generate raises RequestFailed (it returned the errored
    output as if it had succeeded before) carrying every output of the call; the engine serves on."""
    from minillm.serving import RequestFailed
    cfg = small_model.config
    bm = FaultyBlockManager(64, 8, bad_id=1, after=3)
    eng = LLMEngine(NumpyRunner(small_model, 64, 8), 64, 8, cfg.max_seq_len, cfg.vocab_size,
                    SchedulerConfig(max_num_batched_tokens=16), block_manager=bm)
    prompts = [[1, 2, 3, 4], [5, 6, 7], list(range(10, 40))]
    with pytest.warns(RuntimeWarning), pytest.raises(RequestFailed, match=r"1 of 3 requests failed: prompt 1 "
                                                                            r"\(request 1\): IndexError") as info:
        eng.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True), progress=False)
    e = info.value
    assert isinstance(e, RuntimeError) and e.failed == [1]
    assert [o.finish_reason for o in e.outputs] == ["length", "error", "length"]
    for i in (0, 2):
        assert e.outputs[i].token_ids == cached_decode(small_model, prompts[i], 12).new_tokens
    assert not eng.requests and bm.num_free == bm.num_blocks
    again = eng.generate([[8, 9]], SamplingParams(max_tokens=6, ignore_eos=True), progress=False)[0]
    assert again.token_ids == cached_decode(small_model, [8, 9], 6).new_tokens


def test_generate_refuses_a_prompt_utf8_cannot_encode():
    """A lone surrogate: a ValueError naming the prompt and the character's position (it was a TypeError,
    'function takes exactly 5 arguments', from re-raising a UnicodeEncodeError)."""
    llm = LLM("tiny")
    with pytest.raises(ValueError, match=r"prompt 0: prompt 'x\\udcff' cannot be encoded as UTF-8: character "
                                         r"'\\udcff' at position 1"):
        llm.generate("x\udcff")
    with pytest.raises(ValueError, match="position 3"):
        llm.engine.add_request("abc\ud800def")
    assert not llm.engine.requests


@pytest.mark.parametrize("how", ["close", "drop", "break", "with"])
def test_stream_closed_or_dropped_early_aborts_its_request(small_model, how):
    """A stream left after 3 tokens: its request is aborted (before the fix it ran on to max_tokens inside
    the next generate, 150 more steps); the next generate takes only its own steps."""
    eng = make_engine(small_model)
    sp = SamplingParams(max_tokens=100, ignore_eos=True)
    if how == "break":
        for i, _ in enumerate(eng.stream([1, 2, 3], sp)):
            if i == 2:
                break
    elif how == "with":
        with eng.stream([1, 2, 3], sp) as s:
            [next(s) for _ in range(3)]
    else:
        s = eng.stream([1, 2, 3], sp)
        assert [next(s) for _ in range(3)] == cached_decode(small_model, [1, 2, 3], 3).new_tokens
        if how == "close":
            s.close()
            assert list(s) == []
        else:
            del s
            import gc
            gc.collect()
    steps = eng.scheduler.num_steps
    out = eng.generate([[4, 5]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)[0]
    assert out.token_ids == cached_decode(small_model, [4, 5], 4).new_tokens
    assert eng.scheduler.num_steps - steps == 4          # its prefill and three decodes, nothing else
    assert not eng.requests and not eng.has_unfinished()
    assert eng.block_manager.num_free == eng.block_manager.num_blocks


def test_stream_checks_its_request_at_once_and_releases_it_at_the_end(small_model):
    eng = make_engine(small_model)
    with pytest.raises(ValueError, match="empty"):
        eng.stream([], SamplingParams())            # raised by the call, not at the first next()
    assert list(eng.stream([1, 2], SamplingParams(max_tokens=5, ignore_eos=True))) == \
        cached_decode(small_model, [1, 2], 5).new_tokens
    assert not eng.requests


def test_engine_forgets_finished_requests_once_their_output_is_handed_over():
    """2,000 requests through generate leave nothing behind (before the fix all 2,000 stayed in
    engine.requests); a request added by hand stays until output() hands it over finished."""
    llm = LLM("tiny", runner="simulated", max_num_seqs=256, max_num_batched_tokens=4096)
    eng = llm.engine
    outs = llm.generate([[1, 2, 3]] * 2000, SamplingParams(max_tokens=3, ignore_eos=True), progress=False)
    assert len(outs) == 2000 and not eng.requests
    rid = eng.add_request([1, 2], SamplingParams(max_tokens=2, ignore_eos=True))
    eng.step()
    assert not eng.output(rid).finished and rid in eng.requests      # unfinished: still there
    eng.run()
    assert eng.output(rid).finished and not eng.requests
    with pytest.raises(KeyError, match=f"no request {rid}.*already handed over"):
        eng.output(rid)


@pytest.mark.parametrize("kw", [dict(top_p=np.float32(0.9)), dict(top_p=np.float64(0.9)), dict(top_p=np.int64(1)),
                                dict(temperature=np.float32(0.7)), dict(temperature=np.float16(1.5)),
                                dict(temperature=np.int32(0)), dict(top_k=np.int64(5), max_tokens=np.uint8(9),
                                                                    seed=np.uint32(7))])
def test_sampling_params_accept_numpy_numbers_and_store_python_ones(kw):
    """NumPy scalars are numbers like any other (np.float32 top_p was refused while np.float64 passed)."""
    sp = SamplingParams(**kw)
    for name, v in kw.items():
        got = getattr(sp, name)
        assert got == v and type(got) is (float if name in ("temperature", "top_p") else int)
    assert SamplingParams(**kw) == SamplingParams(**{k: v.item() for k, v in kw.items()})


@pytest.mark.parametrize("kw,match", [
    (dict(top_p=np.True_), "top_p"), (dict(top_p=True), "top_p"), (dict(top_p=np.float32("nan")), "top_p"),
    (dict(top_p=np.float32(1.5)), "top_p"), (dict(top_p="0.9"), "top_p"), (dict(temperature=np.float32("nan")),
                                                                             "temperature"),
    (dict(temperature=np.float64("inf")), "temperature"), (dict(temperature=np.False_), "temperature"),
    (dict(temperature=np.float32(-1)), "temperature"), (dict(top_k=np.True_), "top_k"),
    (dict(max_tokens=np.int64(0)), "max_tokens"),
])
def test_sampling_params_reject_numpy_bools_nan_and_out_of_range(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_llm_refuses_unknown_keyword_arguments():
    """They were silently ignored (gpu_memory_utilization=0.9 did nothing)."""
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) 'gpu_memory_utilization': it takes "
                                        r"model, runner, .*max_num_batched_tokens.*, and for runner='numpy' dtype"):
        LLM("tiny", gpu_memory_utilization=0.9)
    with pytest.raises(TypeError, match=r"'steps'.*for runner='simulated' cost, clock"):
        LLM("tiny", runner="simulated", steps=3)
    assert LLM("tiny", dtype=np.float64).engine.runner.k_pool.dtype == np.float64   # a runner option reaches it


def test_llm_torch_runner_without_torch_says_to_install_the_gpu_extra():
    """Torch made unimportable in a fresh interpreter (sys.modules['torch'] = None, as if not installed)."""
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None\n"
            "from minillm.serving import LLM\n"
            "try:\n    LLM('tiny', runner='torch')\n"
            "except ImportError as e:\n    print('ImportError:', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ImportError: runner='torch' needs PyTorch" in proc.stdout
    assert "pip install 'minillm[gpu]'" in proc.stdout


def test_llm_refuses_medusa_heads_as_a_model():
    """medusa_tiny is Medusa heads for the tiny model, not a model: LLM says so (it raised KeyError
    '__config__'), and the list of shipped models no longer offers it."""
    with pytest.raises(ValueError, match=r"medusa_tiny.npz .*Medusa heads for the 'tiny' model.*load_medusa"):
        LLM("medusa_tiny")
    with pytest.raises(FileNotFoundError, match=r"shipped models: \['draft', 'tiny'\]$"):
        LLM("no_such_model")
