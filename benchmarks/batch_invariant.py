"""Batch-invariant mode: what it costs and what it buys (chapter 11).

    python -m benchmarks batch_invariant                       # record batch_invariant in results/<gpu>
    python -m benchmarks batch_invariant --smoke --out /tmp/bi.json      # CPU, interpreter, seconds

Three sections, the record written after each one (a run cut short keeps what it measured):

* ``ops``: each operation alone, bf16, the default (cuBLAS matmul, torch RMSNorm, the paged decode and varlen
  kernels) against the batch-invariant kernel, at the 1B shape for a few batch sizes (median ms, CUDA graphs);
* ``cost``: the engine (``TorchRunner``, CUDA graphs) on the shipped tiny model and on a Llama-3.2-1B-shaped
  random model, bf16, mode off and on in the same process: batch-1 latency (time per output token of one
  request) and throughput (output tokens/s of a batch of requests all at once);
* ``payoff``: the same requests generated alone (one at a time) and all together, with the mode off and on:
  the share of requests whose tokens are identical, greedy and seeded sampling, and greedy speculative
  decoding (prompt lookup, k=4, batched) against plain decoding alone.

Finishes in about 3 minutes on an H100 (``--smoke``: the tiny model in fp32 on the CPU, a few tokens).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import minillm.kernels  # noqa: F401  (sets TRITON_INTERPRET on a CPU before triton is imported)
import torch

from minillm import load_model
from minillm.serving import LLMEngine, SamplingParams, SchedulerConfig
from minillm.serving.torch_runner import TorchRunner
from minillm.speculative import NgramDrafter
from minillm.tokenizer import ByteTokenizer
from minillm.torch_model import TorchModel

from ._common import run_meta
from .serving import LLAMA_1B, random_model

RECORD = "batch_invariant"  # the record a plain run writes
BLOCK = 16
TEXTS = ["import os\n", "def main(argv):\n", "class Foo(Bar):\n    def ", "#", "for i in range(",
         "x = [1, 2, 3]\n", "if __name__ == '__main__':\n", "return self.", "    def __init__(self",
         "with open(path) as f:\n", "# TODO: ", "print(", "from typing import ", "try:\n    import ",
         "async def ", "@property\n", "assert ", "while True:\n", "lambda x: ", "yield ", "raise ValueError(",
         "import numpy as np\n", "def test_", "self.assertEqual(", "class Config:\n", "return [x for x in ",
         "if not isinstance(", "logger = ", "parser.add_argument(", "for key, value in ", "@dataclass\n", "x = {"]


def meta(args, device) -> dict:
    return run_meta(smoke=args.smoke, device=str(device), block_size=BLOCK)


def engine(model: TorchModel, on: bool, *, batch: int, budget: int, device, dtype, graphs: bool, k: int = 0,
           num_blocks: int | None = None) -> LLMEngine:
    cfg = model.config
    num_blocks = num_blocks or batch * -(-cfg.max_seq_len // BLOCK)
    run = TorchRunner(model, num_blocks, BLOCK, device=device, dtype=dtype, cuda_graphs=graphs, batch_invariant=on)
    run.capture_graphs(batch, budget, k)
    sched = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=budget, num_speculative_tokens=k)
    return LLMEngine(run, num_blocks, BLOCK, cfg.max_seq_len, cfg.vocab_size, sched, enable_prefix_caching=False,
                     drafter=NgramDrafter() if k else None)


def generate(eng: LLMEngine, prompts, params) -> list:
    outs = eng.generate(prompts, params, progress=False)
    eng.requests.clear()
    return outs


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- ops ---------------------------------------------------------------------------------------------------
def ops_rows(device, smoke: bool) -> list[dict]:
    if smoke:
        return []
    import triton.testing

    from minillm.kernels.batch_invariant import attention_bi, matmul_bi, rmsnorm_bi
    from minillm.kernels.paged_attention import paged_attention
    from minillm.kernels.paged_prefill import paged_varlen_attention
    from minillm.torch_model import rms_norm

    def ms(fn):
        return triton.testing.do_bench_cudagraph(fn, return_mode="median")

    dt, rows = torch.bfloat16, []
    cfg = LLAMA_1B
    for (k, n), name in (((cfg.d_model, cfg.d_model + 2 * 512), "qkv"), ((cfg.d_model, 2 * cfg.d_ff), "gate_up"),
                         ((cfg.d_ff, cfg.d_model), "down")):
        w = torch.randn(k, n, device=device, dtype=dt) * k ** -0.5
        for m in (1, 16, 64, 256, 1024):
            x = torch.randn(m, k, device=device, dtype=dt)
            rows.append(dict(op=f"matmul_{name}", M=m, K=k, N=n, default_ms=ms(lambda: x @ w),
                             invariant_ms=ms(lambda: matmul_bi(x, w))))
    g = torch.ones(cfg.d_model, device=device, dtype=dt)
    for m in (1, 64, 1024):
        x = torch.randn(m, cfg.d_model, device=device, dtype=dt)
        rows.append(dict(op="rmsnorm", M=m, D=cfg.d_model, default_ms=ms(lambda: rms_norm(x, g, 1e-5)),
                         invariant_ms=ms(lambda: rmsnorm_bi(x, g, 1e-5))))
    hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    for b, ctx in ((1, 1024), (1, 2048), (32, 1024), (128, 512)):
        width = -(-cfg.max_seq_len // BLOCK)
        nb = b * width + 1
        kc = torch.randn(nb, BLOCK, hkv, d, device=device, dtype=dt)
        vc = torch.randn_like(kc)
        tables = torch.arange(b * width, dtype=torch.int32, device=device).reshape(b, width)
        lens = torch.full((b,), ctx, dtype=torch.int32, device=device)
        cu = torch.arange(b + 1, dtype=torch.int32, device=device)
        q = torch.randn(b, hq, d, device=device, dtype=dt)
        rows.append(dict(op="attention_decode", batch=b, context=ctx,
                         default_ms=ms(lambda: paged_attention(q, kc, vc, tables, lens, validate=False)),
                         invariant_ms=ms(lambda: attention_bi(q, kc, vc, tables, lens, cu, validate=False))))
    for T in (512,):
        kc = torch.randn(T // BLOCK + 1, BLOCK, hkv, d, device=device, dtype=dt)
        vc = torch.randn_like(kc)
        tables = torch.arange(T // BLOCK, dtype=torch.int32, device=device)[None]
        lens = torch.tensor([T], dtype=torch.int32, device=device)
        cu = torch.tensor([0, T], dtype=torch.int32, device=device)
        q = torch.randn(T, hq, d, device=device, dtype=dt)
        rows.append(dict(op="attention_prefill", batch=1, context=T,
                         default_ms=ms(lambda: paged_varlen_attention(q, kc, vc, tables, lens, cu, validate=False,
                                                                      max_seqlen_q=T)),
                         invariant_ms=ms(lambda: attention_bi(q, kc, vc, tables, lens, cu, validate=False,
                                                              max_seqlen_q=T))))
    for r in rows:
        r["slowdown"] = r["invariant_ms"] / r["default_ms"]
    return rows


# ---- cost --------------------------------------------------------------------------------------------------
def cost_rows(models, device, dtype, graphs: bool, smoke: bool) -> list[dict]:
    rows = []
    for name, model in models:
        vocab = min(model.config.vocab_size, 256)
        rng = np.random.default_rng(0)
        plen, out_n, n_req, batch = (8, 4, 2, 2) if smoke else (128, 128, 64, 64)
        prompts = [rng.integers(0, vocab, plen).tolist() for _ in range(n_req)]
        params = SamplingParams(max_tokens=out_n, ignore_eos=True)
        for on in (False, True):
            eng = engine(model, on, batch=batch, budget=512, device=device, dtype=dtype, graphs=graphs)
            generate(eng, [prompts[0][:plen // 2], prompts[1]], SamplingParams(max_tokens=3, ignore_eos=True))
            one = generate(eng, [prompts[0]], params)[0]                  # batch 1: time per output token
            sync(device)
            t0 = time.perf_counter()
            outs = generate(eng, prompts, params)
            sync(device)
            span = time.perf_counter() - t0
            n_out = sum(len(o.token_ids) for o in outs)
            rows.append(dict(model=name, batch_invariant=on, batch1_tpot_ms=one.tpot * 1e3,
                             batch1_tok_per_s=1.0 / one.tpot, requests=n_req, prompt_len=plen, output_len=out_n,
                             max_num_seqs=batch, throughput_tok_per_s=n_out / span))
            del eng
            print(rows[-1], flush=True)
    return rows


# ---- payoff ------------------------------------------------------------------------------------------------
def payoff_rows(models, device, dtype, graphs: bool, smoke: bool) -> list[dict]:
    tok = ByteTokenizer()
    rows = []
    for name, model in models:
        n = 4 if smoke else (32 if name == "tiny" else 16)
        out_n = 6 if smoke else 64
        prompts = [tok.encode(t) for t in TEXTS[:n]]
        kinds = {"greedy": [SamplingParams(max_tokens=out_n, ignore_eos=True)] * n,
                 "seeded": [SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i, max_tokens=out_n,
                                           ignore_eos=True) for i in range(n)]}
        for on in (False, True):
            eng = engine(model, on, batch=n, budget=512, device=device, dtype=dtype, graphs=graphs)
            spec = engine(model, on, batch=n, budget=512, device=device, dtype=dtype, graphs=graphs, k=4)
            for kind, params in kinds.items():
                alone = [generate(eng, [p], [sp])[0].token_ids for p, sp in zip(prompts, params)]
                batched = [o.token_ids for o in generate(eng, prompts, params)]
                same = sum(a == b for a, b in zip(alone, batched))
                rows.append(dict(model=name, batch_invariant=on, sampling=kind, compare="alone vs batched",
                                 requests=n, output_len=out_n, identical=same, share=same / n))
                print(rows[-1], flush=True)
                if kind == "greedy":
                    spec_out = [o.token_ids for o in generate(spec, prompts, params)]
                    same = sum(a == b for a, b in zip(alone, spec_out))
                    rows.append(dict(model=name, batch_invariant=on, sampling=kind,
                                     compare="plain alone vs speculative (k=4) batched", requests=n,
                                     output_len=out_n, identical=same, share=same / n,
                                     accepted=spec.scheduler.spec_accepted, proposed=spec.scheduler.spec_proposed))
                    print(rows[-1], flush=True)
            del eng, spec
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--smoke", action="store_true", help="CPU: the tiny model in fp32, a few tokens")
    ap.add_argument("--skip-1b", action="store_true", help="the tiny model only")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    dtype = torch.float32 if args.smoke else torch.bfloat16
    graphs = device.type == "cuda"
    t0 = time.perf_counter()
    tiny = load_model("tiny")
    models = [("tiny", TorchModel.from_numpy(tiny.config, tiny.params))]
    if not (args.smoke or args.skip_1b):
        models.append(("1b", random_model(LLAMA_1B, device, dtype)))
    result = {"meta": meta(args, device), "ops": [], "cost": [], "payoff": []}

    def save():
        result["meta"]["seconds"] = time.perf_counter() - t0
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))

    result["ops"] = ops_rows(device, args.smoke)
    save()
    result["payoff"] = payoff_rows(models, device, dtype, graphs, args.smoke)
    save()
    result["cost"] = cost_rows(models, device, dtype, graphs, args.smoke)
    save()
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
