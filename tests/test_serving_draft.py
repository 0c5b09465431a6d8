"""A draft model inside the engine (DraftModelProposer): exact greedy tokens, exact sampling distribution."""
import numpy as np
import pytest

from minillm import load_model
from minillm.decode import cached_decode
from minillm.model import Model, ModelConfig, init_params
from minillm.serving import LLM, LLMEngine, NumpyRunner, SamplingParams, SchedulerConfig
from minillm.serving.draft import DraftModelProposer
from minillm.speculative import chi_square_two_sample

from .test_serving_engine import random_trace, run_with_arrivals


@pytest.fixture(scope="module")
def draft_model():
    return load_model("draft")


def spec_engine(target, draft, k, num_blocks=40, block_size=8, prefix=True, **sched):
    cfg = target.config
    proposer = DraftModelProposer(NumpyRunner(draft, num_blocks, block_size)) if k else None
    return LLMEngine(NumpyRunner(target, num_blocks, block_size), num_blocks, block_size, cfg.max_seq_len,
                     cfg.vocab_size, SchedulerConfig(num_speculative_tokens=k, **sched),
                     enable_prefix_caching=prefix, eos_token_id=None, drafter=proposer)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_propose_greedy_tokens_equal_cached_decode_with_preemption_and_prefix_caching(tiny_model, draft_model, k):
    """Prompts sharing a prefix, arrivals over time, chunked prefill and a pool small enough to preempt:
    every request's tokens equal cached_decode's, drafts were accepted and rejected, and no block leaks."""
    prompts, outs, arrivals = random_trace(21, n=8)
    outs = [o + 10 for o in outs]
    eng = spec_engine(tiny_model, draft_model, k, num_blocks=14, max_num_seqs=4, max_num_batched_tokens=32,
                      max_prefill_chunk=16)
    got = run_with_arrivals(eng, prompts, [SamplingParams(max_tokens=o, ignore_eos=True) for o in outs], arrivals)
    for p, o, g in zip(prompts, outs, got):
        assert g.token_ids == cached_decode(tiny_model, p, o).new_tokens
    s = eng.scheduler
    assert s.num_preemptions > 0 and eng.block_manager.prefix_hit_tokens > 0
    assert 0 < s.spec_accepted < s.spec_proposed
    assert eng.block_manager.num_free == eng.block_manager.num_blocks
    assert not eng.proposer._written                     # finished sequences were released


def test_abort_request_releases_the_draft_models_state(tiny_model, draft_model):
    """An aborted request's draft-model bookkeeping goes with it, as a finished one's does."""
    eng = spec_engine(tiny_model, draft_model, 3)
    rid = eng.add_request([1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
    eng.step()
    eng.step()
    assert rid in eng.proposer._written
    eng.abort_request(rid)
    assert eng.output(rid).finish_reason == "abort" and not eng.proposer._written


def test_propose_draft_equal_to_target_accepts_every_draft(tiny_model):
    """Draft == target: in greedy every draft is accepted, so every verify step emits k + 1 tokens."""
    k = 3
    eng = spec_engine(tiny_model, tiny_model, k, num_blocks=64)
    prompts, _, _ = random_trace(4, n=3, shared_prefix=False)
    out = [eng.add_request(p, SamplingParams(max_tokens=1 + 4 * (k + 1), ignore_eos=True)) for p in prompts]
    eng.run()
    s = eng.scheduler
    assert s.spec_accepted == s.spec_proposed == s.spec_steps * k
    for i, p in zip(out, prompts):
        assert eng.output(i).token_ids == cached_decode(tiny_model, p, 1 + 4 * (k + 1)).new_tokens


def test_propose_seeded_sampling_is_independent_of_the_batch(tiny_model, draft_model):
    """At temperature > 0 a seeded request gets the same tokens alone and in a batch with others."""
    prompts, _, _ = random_trace(8, n=4, shared_prefix=False)
    sp = [SamplingParams(temperature=0.9, top_k=40, max_tokens=12, seed=100 + i, ignore_eos=True) for i in range(4)]
    together = spec_engine(tiny_model, draft_model, 3, num_blocks=64).generate(prompts, sp, progress=False)
    for i in range(4):
        alone = spec_engine(tiny_model, draft_model, 3, num_blocks=64).generate([prompts[i]], [sp[i]], progress=False)
        assert alone[0].token_ids == together[i].token_ids


def test_propose_drafts_and_q_rows_are_the_draft_models_own_at_every_step(tiny_model, draft_model):
    """The wiring, checked deterministically at temperature > 0: at every verify step, each speculating
    sequence's draft tokens and the q rows handed to the verifier equal what the draft model computes alone
    over the same context (a full forward, no cache) with the request's DRAFT stream -- through catch-up,
    rollback after rejections, preemption and prefix caching."""
    from minillm.sampling import draft_batch, shaped_probs

    eng = spec_engine(tiny_model, draft_model, 3, num_blocks=12, max_num_seqs=3, max_num_batched_tokens=32)
    checked = []

    @eng.add_step_observer
    def spy(batch):
        for row, (seq, d) in enumerate(zip(batch.seqs, batch.drafts)):
            p = seq.params
            for i in range(len(d)):
                ctx = seq.tokens + d[:i]
                logits = draft_model.forward(np.asarray([ctx]))[0, -1:]
                tok, _ = draft_batch(logits, p.temperature, p.top_k or 0, p.top_p, [seq.seed], [len(seq.output) + i])
                assert d[i] == tok[0]
                np.testing.assert_allclose(batch.draft_probs[batch.row_offsets[row] + i],
                                           shaped_probs(logits, p.temperature, p.top_k or 0, p.top_p)[0], atol=2e-5)
                checked.append(1)

    prompts, outs, arrivals = random_trace(3, n=6)
    params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.95, max_tokens=o + 8, seed=i, ignore_eos=True)
              for i, o in enumerate(outs)]
    run_with_arrivals(eng, prompts, params, arrivals)
    assert len(checked) > 50 and eng.scheduler.num_preemptions > 0
    assert 0 < eng.scheduler.spec_accepted < eng.scheduler.spec_proposed


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_engine_speculative_sampling_matches_plain_engine_distribution(drafter):
    """Temperature 1: the tokens at output positions 1-3 (emitted by speculative rounds) of 1,500 seeded
    requests follow the same distribution with and without speculation. The two samples use disjoint seeds
    (0..1499 and 10**6 + 0..1499), so they are independent: with the same seeds, the shared main random
    stream makes most tokens identical and the test nearly powerless. Test statistic: two-sample Pearson
    chi-square per position; threshold p > 1e-3."""
    prompt = list(b"def add(a, b):\n    return a + b\n\ndef add(")
    n = 1500

    def run(seed0, **kw):
        llm = LLM("tiny", max_num_seqs=256, max_num_batched_tokens=2048, **kw)
        ps = [SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True, seed=seed0 + s) for s in range(n)]
        out = np.array([o.token_ids for o in llm.generate([prompt] * n, ps, progress=False)])
        return out, llm.engine.scheduler

    plain, _ = run(0)
    spec, sched = run(10**6, num_speculative_tokens=3, speculative_model=drafter)
    assert sched.spec_accepted > 0.1 * n
    for pos in (1, 2, 3):
        stat, dof, pval = chi_square_two_sample(plain[:, pos], spec[:, pos])
        assert pval > 1e-3, (pos, stat, dof, pval)


def test_propose_rejects_a_draft_model_that_does_not_fit_the_target(tiny_model):
    other_vocab = ModelConfig(vocab_size=300, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
                              max_seq_len=512)
    bad = Model(other_vocab, init_params(other_vocab, seed=0))
    with pytest.raises(ValueError, match="vocabulary"):
        spec_engine(tiny_model, bad, 2)
    short = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    with pytest.raises(ValueError, match="positions"):
        spec_engine(tiny_model, Model(short, init_params(short, seed=0)), 2)
    with pytest.raises(ValueError, match="mirror"):
        LLMEngine(NumpyRunner(tiny_model, 40, 8), 40, 8, 512, 259, SchedulerConfig(num_speculative_tokens=2),
                  drafter=DraftModelProposer(NumpyRunner(tiny_model, 40, 16)))
    with pytest.raises(TypeError, match="draft runner"):
        DraftModelProposer(object())
    with pytest.raises(ValueError, match="runner that computes"):
        LLM("tiny", runner="simulated", num_speculative_tokens=2, speculative_model="draft")
