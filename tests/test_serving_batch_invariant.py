"""LLM(runner="torch", batch_invariant=True): a request's tokens are the same alone and inside a batch -- with
preemption, chunked prefill and speculation, greedy and seeded sampling. On CPU in the Triton interpreter (fp32,
fp16, a small random model); the same in bf16 on a GPU (marked gpu), where the default kernels are not."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")

from minillm.serving import LLM, SamplingParams  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


def _prompts(n, seed=0, vocab=256):
    """Prompts of different lengths, some with repeated phrases (so a prompt lookup drafts), some sharing a prefix."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, 12).tolist()
    out = []
    for i in range(n):
        own = rng.integers(0, vocab, int(rng.integers(2, 20))).tolist()
        if i % 3 == 1:
            own = own + own[:6] + own
        out.append(system + own if i % 2 == 0 else own)
    return out


def _params(n, sampled, max_tokens):
    if not sampled:
        return [SamplingParams(max_tokens=max_tokens, ignore_eos=True) for _ in range(n)]
    return [SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=max_tokens, ignore_eos=True)
            for i in range(n)]


def _alone_and_batched(model, prompts, params, dtype, batched_kw=None, **kw):
    """Token ids of each request generated alone (one request per engine step loop) and all together."""
    kw = dict(runner="torch", device=DEVICE, dtype=dtype, batch_invariant=True, max_num_seqs=8, **kw)
    alone_llm = LLM(model, **kw)
    alone = [alone_llm.generate([p], [sp], progress=False)[0].token_ids for p, sp in zip(prompts, params)]
    llm = LLM(model, **{**kw, **(batched_kw or {})})
    batched = [o.token_ids for o in llm.generate(prompts, params, progress=False)]
    return alone, batched, llm


CPU_DTYPES = [torch.float32, torch.float16]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("sampled", [False, True])
def test_batch_invariant_tokens_alone_equal_batched_with_preemption_and_chunked_prefill(small_model, dtype, sampled):
    prompts = _prompts(5)
    params = _params(5, sampled, 8)
    alone, batched, llm = _alone_and_batched(
        small_model, prompts, params, dtype, block_size=8,
        batched_kw=dict(num_blocks=12, max_prefill_chunk=7, max_num_batched_tokens=16))
    assert batched == alone
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("sampled", [False, True])
def test_batch_invariant_tokens_alone_equal_batched_with_speculation(small_model, dtype, sampled):
    prompts = _prompts(4, seed=1)
    params = _params(4, sampled, 10)
    alone, batched, llm = _alone_and_batched(small_model, prompts, params, dtype, block_size=8,
                                             num_speculative_tokens=3)
    assert batched == alone
    assert llm.engine.scheduler.spec_proposed > 0


def test_batch_invariant_greedy_speculation_equals_plain_decoding(small_model):
    """One path for decode and verify rows: in the mode, a verify row has a decode row's bits, so greedy
    speculative decoding gives plain decoding's tokens (here fp16, where the two need not agree otherwise)."""
    prompts = _prompts(3, seed=2)
    params = _params(3, False, 10)
    kw = dict(runner="torch", device=DEVICE, dtype=torch.float16, batch_invariant=True, block_size=8)
    plain = [o.token_ids for o in LLM(small_model, **kw).generate(prompts, params, progress=False)]
    spec_llm = LLM(small_model, num_speculative_tokens=3, **kw)
    spec = [o.token_ids for o in spec_llm.generate(prompts, params, progress=False)]
    assert spec == plain
    assert spec_llm.engine.scheduler.spec_accepted > 0


def test_batch_invariant_logits_rows_are_bitwise_the_same_alone_and_batched(small_model):
    """The model's ragged forward in the mode: one sequence's logits rows alone and beside other sequences
    (decodes and a prefill chunk), bit for bit, fp16."""
    from minillm.kernels.batch_invariant import attention_bi
    from minillm.torch_model import TorchModel

    cfg = small_model.config
    m = TorchModel.from_numpy(cfg, small_model.params).to(DEVICE, torch.float16).eval()
    m.fuse_projections()
    bs, nb = 8, 16
    pool = lambda: torch.zeros(cfg.n_layers, nb, bs, cfg.n_kv_heads, cfg.d_head, dtype=torch.float16,  # noqa: E731
                               device=DEVICE)
    rng = np.random.default_rng(3)

    def step(seqs):
        """seqs: (token ids, first block); each sequence a prefill of all its tokens."""
        ids = torch.tensor(np.concatenate([s for s, _ in seqs]), device=DEVICE)
        pos = torch.cat([torch.arange(len(s)) for s, _ in seqs]).to(DEVICE)
        slots = torch.cat([b * bs + torch.arange(len(s)) for s, b in seqs]).to(DEVICE)
        tables = torch.tensor([[b + i for i in range(4)] for _, b in seqs], dtype=torch.int32, device=DEVICE)
        lens = torch.tensor([len(s) for s, _ in seqs], dtype=torch.int32, device=DEVICE)
        cu = torch.tensor(np.concatenate([[0], np.cumsum([len(s) for s, _ in seqs])]), dtype=torch.int32,
                          device=DEVICE)
        with torch.no_grad():
            return m.forward_ragged(ids, pos, slots, tables, lens, cu, pool(), pool(), attention_bi,
                                    batch_invariant=True), cu.tolist()

    target = rng.integers(0, 256, 11)
    alone, _ = step([(target, 0)])
    others = [(rng.integers(0, 256, 1), 4), (rng.integers(0, 256, 20), 8)]
    batched, cu = step([others[0], (target, 0), others[1]])
    assert torch.equal(batched[cu[1]:cu[2]], alone)


def test_batch_invariant_needs_the_triton_attention(small_model):
    with pytest.raises(ValueError, match="batch_invariant"):
        LLM(small_model, runner="torch", device="cpu", attention="torch", batch_invariant=True)


# ---- bf16, compiled, CUDA graphs --------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("spec", [0, 4])
def test_gpu_bf16_batch_invariant_tokens_alone_equal_batched(tiny_model, sampled, spec):
    """bf16 on the tiny model with CUDA graphs: 21 requests alone and all together (preempting pool, chunked
    prefill), with and without speculation."""
    from minillm.tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    texts = ["import os\n", "def main(argv):\n", "class Foo(Bar):\n    def ", "#", "for i in range(",
             "x = [1, 2, 3]\nx = [1, 2, 3]\n", "if __name__ == '__main__':\n", "return self.", "    def __init__(self",
             "with open(path) as f:\n", "# TODO: ", "print(", "from typing import ", "try:\n    import ",
             "async def ", "@property\n", "assert ", "while True:\n", "lambda x: ", "yield ", "raise ValueError("]
    prompts = [tok.encode(t) for t in texts]
    params = _params(len(prompts), sampled, 48)
    alone, batched, llm = _alone_and_batched(
        tiny_model, prompts, params, torch.bfloat16, max_num_batched_tokens=128, num_speculative_tokens=spec,
        batched_kw=dict(max_num_seqs=32, num_blocks=48, max_prefill_chunk=24))
    same = sum(a == b for a, b in zip(alone, batched))
    assert same == len(prompts), f"{same} of {len(prompts)} identical"
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.gpu
def test_gpu_bf16_batch_invariant_greedy_speculation_equals_plain_decoding(tiny_model):
    """bf16, CUDA graphs, one TorchModel shared by both engines (as the chapter 11 benchmark does): greedy
    speculative decoding (prompt lookup, k=4, batched) gives plain decoding's tokens, each request alone."""
    from minillm.serving import LLMEngine, SchedulerConfig
    from minillm.serving.torch_runner import TorchRunner
    from minillm.speculative import NgramDrafter
    from minillm.tokenizer import ByteTokenizer
    from minillm.torch_model import TorchModel
    tok = ByteTokenizer()
    texts = ["import os\nimport sys\nimport ", "def f(x):\n    return x\n\ndef g(x):\n", "#", "for i in range(",
             "x = [1, 2, 3]\nx = [1, 2, 3]\n", "class Foo(Bar):\n    def "]
    prompts = [tok.encode(t) for t in texts]
    params = _params(len(prompts), False, 48)
    shared = TorchModel.from_numpy(tiny_model.config, tiny_model.params)
    cfg = tiny_model.config

    def engine(k):
        blocks = 8 * -(-cfg.max_seq_len // 16)
        run = TorchRunner(shared, blocks, 16, device=DEVICE, dtype=torch.bfloat16, batch_invariant=True)
        sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=128, num_speculative_tokens=k)
        return LLMEngine(run, blocks, 16, cfg.max_seq_len, cfg.vocab_size, sched, enable_prefix_caching=False,
                         drafter=NgramDrafter() if k else None)

    plain_eng = engine(0)
    plain_eng.runner.prepare(plain_eng.scheduler.config)
    spec_eng = engine(4)                                       # built after plain_eng captured its graphs
    spec_eng.runner.prepare(spec_eng.scheduler.config)
    plain = [plain_eng.generate([p], [sp], progress=False)[0].token_ids for p, sp in zip(prompts, params)]
    spec = [o.token_ids for o in spec_eng.generate(prompts, params, progress=False)]
    same = sum(a == b for a, b in zip(plain, spec))
    assert same == len(prompts), f"{same} of {len(prompts)} identical"
    assert spec_eng.scheduler.spec_accepted > 0
