"""The serving contracts (minillm.serving.interfaces): declared protocols, no probing of objects for members,
and the runners' startup preparation (CUDA graphs captured by LLM(runner="torch"), a no-op elsewhere)."""
import re
from pathlib import Path

import numpy as np
import pytest

import minillm.serving as serving
from minillm.decode import cached_decode
from minillm.serving import LLM, NumpyRunner, SamplingParams, SchedulerConfig, Sequence, SimulatedRunner
from minillm.serving.draft import DraftModelProposer
from minillm.serving.interfaces import DraftRunner, Drafter, LookupDrafter, MemoryManager, Runner, as_drafter
from minillm.speculative import NgramDrafter

SERVING = Path(serving.__file__).parent


def test_no_component_probes_another_with_hasattr():
    """Was: hasattr(drafter, "check_target"), hasattr(drafter, "lookup"), hasattr(runner, "clock"),
    hasattr(run, "decode_chain") and a hasattr loop over the draft runner's members. (sequence.py's
    hasattr calls check user values such as a token id's __index__, not components.)"""
    for path in sorted(SERVING.glob("*.py")):
        if path.name == "sequence.py":
            continue
        assert not re.search(r"\bhasattr\(", path.read_text()), f"{path.name} probes an object with hasattr"


def test_runners_declare_every_member_of_their_protocol(tiny_model):
    members = {n for n in dir(Runner) if not n.startswith("_")}
    assert members == {"execute", "now", "sleep", "prepare", "check_engine"}
    for runner in (NumpyRunner(tiny_model, 4, 4), SimulatedRunner()):
        for name in members:
            assert callable(getattr(type(runner), name)), (type(runner).__name__, name)
    assert isinstance(NumpyRunner(tiny_model, 4, 4), DraftRunner)
    assert NumpyRunner.decode_chain is None           # the explicit optional: one logits() per draft pass
    assert not isinstance(SimulatedRunner(), DraftRunner)
    with pytest.raises(TypeError, match="DraftRunner"):
        DraftModelProposer(SimulatedRunner())


def test_memory_managers_declare_the_protocol():
    from minillm.serving import BlockManager, ContiguousManager
    members = {n for n in dir(MemoryManager) if not n.startswith("_")}
    for cls in (BlockManager, ContiguousManager):
        missing = [n for n in members - {"num_blocks", "block_size"} if not callable(getattr(cls, n, None))]
        assert not missing, (cls.__name__, missing)


def test_simulated_runner_sleeps_on_its_clock_and_serve_trace_jumps_idle_time():
    run = SimulatedRunner()
    run.sleep(2.5)
    assert run.now() == 2.5
    llm = LLM("tiny", runner="simulated")
    outs = llm.engine.serve_trace([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=2, ignore_eos=True), [0.0, 100.0])
    assert outs[1].arrival_time - outs[0].arrival_time == 100.0
    assert outs[1].first_token_time >= 100.0           # the clock jumped to the second arrival


def test_a_prompt_lookup_becomes_a_drafter_that_drafts_when_scheduled():
    ngram = NgramDrafter()
    d = as_drafter(ngram)
    assert isinstance(d, LookupDrafter) and isinstance(d, Drafter)
    seq = Sequence(0, [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams())
    assert d.draft(seq, 3) == ngram.lookup(seq.tokens, 3)[:3]
    assert as_drafter(d) is d and as_drafter(None) is None
    with pytest.raises(TypeError, match="prompt lookup"):
        as_drafter(object())


def test_a_draft_model_reserves_placeholders(tiny_model):
    prop = DraftModelProposer(NumpyRunner(tiny_model, 8, 4))
    assert as_drafter(prop) is prop
    assert prop.draft(Sequence(0, [1, 2], SamplingParams()), 3) == [-1, -1, -1]


def test_llm_prepares_every_runner_it_builds(monkeypatch):
    """LLM calls prepare(config) on its runner and on a draft model's (whose steps have one logits row per
    sequence: no speculative rows)."""
    seen = []
    monkeypatch.setattr(NumpyRunner, "prepare", lambda self, config: seen.append(config))
    LLM("tiny", max_num_seqs=4, max_num_batched_tokens=32, num_speculative_tokens=3, speculative_model="draft")
    assert sorted(c.num_speculative_tokens for c in seen) == [0, 3]
    assert all(isinstance(c, SchedulerConfig) and c.max_num_seqs == 4 and c.max_num_batched_tokens == 32
               for c in seen)


def test_llm_torch_on_cpu_captures_nothing_and_enforce_eager_reaches_the_runner():
    torch = pytest.importorskip("torch")
    for eager in (False, True):
        llm = LLM("tiny", runner="torch", device="cpu", dtype=torch.float32, attention="torch", max_num_seqs=2,
                  max_num_batched_tokens=32, enforce_eager=eager)
        run = llm.engine.runner
        assert not run.use_graphs and not run._graphs and run.mixed_buckets == []
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)[0]
        assert out.token_ids == cached_decode(llm.model, [5, 6, 7], 4).new_tokens
    with pytest.raises(TypeError, match="unexpected keyword argument.*'cuda_graphs'.*enforce_eager"):
        LLM("tiny", runner="torch", device="cpu", cuda_graphs=False)


@pytest.mark.gpu
def test_llm_torch_captures_decode_and_mixed_graphs_at_startup_and_replays_them():
    """On the GPU: LLM(runner="torch") captures a decode graph per batch size up to max_num_seqs and a mixed
    graph per token bucket before the first request; every step of a greedy run then replays a graph (the
    eager forward never runs), and the fp32 tokens equal cached_decode's. enforce_eager=True captures none."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    prompts = [[int(t) for t in np.random.default_rng(i).integers(1, 255, n)] for i, n in enumerate((5, 17, 40))]
    llm = LLM("tiny", runner="torch", dtype=torch.float32, max_num_seqs=4, max_num_batched_tokens=64)
    run = llm.engine.runner
    assert {k for k in run._graphs if k[0] == "decode"} == {("decode", b) for b in (1, 2, 4)}
    assert {k for k in run._graphs if k[0] == "mixed"} == {("mixed", b) for b in run.mixed_buckets}
    assert run.mixed_buckets and run.mixed_buckets[-1] == 64 + 4
    captured = set(run._graphs)
    eager = []
    forward = run.model.forward_ragged
    run.model.forward_ragged = lambda *a, **kw: eager.append(1) or forward(*a, **kw)
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True), progress=False)
    for p, o in zip(prompts, outs):
        assert o.token_ids == cached_decode(llm.model, p, 24).new_tokens
    assert not eager, f"{len(eager)} steps ran eagerly"
    assert set(run._graphs) == captured                 # nothing captured lazily
    off = LLM("tiny", runner="torch", dtype=torch.float32, max_num_seqs=4, max_num_batched_tokens=64,
              enforce_eager=True)
    assert not off.engine.runner.use_graphs and not off.engine.runner._graphs
