"""Composed-stack benchmark for chapter 10: one set of requests served by a ladder of configurations, each adding
one technique, every rung checked for identical greedy tokens, on the same weights.

    python benchmarks/composed_bench.py --out benchmarks/results/composed_h200.json           # the H200 run
    python benchmarks/composed_bench.py --smoke --device cpu --out /tmp/composed_smoke.json   # CPU smoke test

The ladder, per model (``minillm.studies.composition.composed_ladder`` reads it in this order):

1. HF ``LlamaForCausalLM``, no KV cache: every step runs the whole sequence (naive PyTorch), one request at a time
2. HF with its KV cache (``use_cache=True``), one request at a time
3. the minillm engine at batch 1, eager (the Triton paged kernels, no CUDA graphs)
4. + CUDA graphs
5. + continuous batching: every request at once
6. + speculative decoding (prompt lookup, k=4) in the same engine

``side`` rows add speculation at batch 1 (the latency view, where speculation pays). Both loops over HF are
``minillm.studies.composition.hf_greedy`` (greedy, no stopping at EOS); the engine runs ``ignore_eos``. Each rung
records the share of requests whose tokens equal rung 1's. Default dtype float32, so that the identity check means
something (in bf16, kernels that reduce in a different order flip near-tied argmaxes; chapter 9). Models: the
shipped tiny checkpoint and the Llama-3.2-1B shape with random weights (``serving_bench.random_model``). Prompts:
``--requests`` chunks of held-out Python source (byte ids, valid for both vocabularies). The results file is
rewritten after every rung, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))      # serving_bench's model builders

import minillm.kernels  # noqa: E402,F401  (first: it decides interpreter vs compiled before triton loads)
from minillm.decode import cached_decode  # noqa: E402
from minillm.model import load_model  # noqa: E402
from minillm.serving import LLMEngine, SamplingParams, SchedulerConfig  # noqa: E402
from minillm.serving.torch_runner import TorchRunner  # noqa: E402
from minillm.speculative import NgramDrafter  # noqa: E402
from minillm.studies.composition import hf_greedy  # noqa: E402
from minillm.studies.speculation import held_out_source  # noqa: E402
from minillm.torch_model import TorchModel  # noqa: E402
from _common import run_meta  # noqa: E402
from serving_bench import LLAMA_1B, hf_model, meta, random_model  # noqa: E402

BLOCK, BUDGET, K = 16, 2048, 4


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_serve(model, prompts, n_new: int, *, batch: int, graphs: bool, k: int, device, dtype):
    """An engine with the torch runner over ``batch`` slots; returns a function that serves every prompt."""
    cfg = model.config
    per_seq = -(-(max(map(len, prompts)) + n_new + k + 1) // BLOCK)
    num_blocks = batch * per_seq + 8
    run = TorchRunner(model, num_blocks, BLOCK, device=device, dtype=dtype, cuda_graphs=graphs, attention="triton")
    run.capture_graphs(batch, BUDGET, k)
    sched = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=BUDGET, num_speculative_tokens=k)
    eng = LLMEngine(run, num_blocks, BLOCK, cfg.max_seq_len, cfg.vocab_size, sched, enable_prefix_caching=False,
                    drafter=NgramDrafter() if k else None)
    eng.generate([prompts[0][:40], prompts[-1][:7]], SamplingParams(max_tokens=12, ignore_eos=True),
                 progress=False)   # warm-up: Triton compiles and the first replays, outside the timing
    params = [SamplingParams(max_tokens=n_new, ignore_eos=True) for _ in prompts]
    return lambda: [o.token_ids for o in eng.generate(prompts, params, progress=False)]


def timed(serve, device):
    sync(device)
    t = time.perf_counter()
    toks = serve()
    sync(device)
    return toks, time.perf_counter() - t


def ladder(name: str, model, hf, prompts, n_new: int, device, dtype, save, results, numpy_ref=None) -> None:
    """Run every rung for one model and append a row per rung (``results['rungs']``) and per side run; with
    ``numpy_ref`` (the NumPy ``cached_decode`` tokens), each row also records the share equal to it."""
    graphs = device.type == "cuda"
    rungs = []
    if hf is not None:
        rungs += [("HF, no KV cache (naive PyTorch)", "rungs", lambda: lambda: hf_greedy(hf, prompts, n_new, False)),
                  ("HF, KV cache", "rungs", lambda: lambda: hf_greedy(hf, prompts, n_new, True))]
    eng = dict(device=device, dtype=dtype)
    rungs += [("engine, batch 1, eager", "rungs",
               lambda: engine_serve(model, prompts, n_new, batch=1, graphs=False, k=0, **eng)),
              ("+ CUDA graphs", "rungs", lambda: engine_serve(model, prompts, n_new, batch=1, graphs=graphs, k=0, **eng)),
              ("+ continuous batching", "rungs",
               lambda: engine_serve(model, prompts, n_new, batch=len(prompts), graphs=graphs, k=0, **eng)),
              (f"+ speculation (prompt lookup, k={K})", "rungs",
               lambda: engine_serve(model, prompts, n_new, batch=len(prompts), graphs=graphs, k=K, **eng)),
              (f"engine, batch 1, CUDA graphs, speculation k={K}", "side",
               lambda: engine_serve(model, prompts, n_new, batch=1, graphs=graphs, k=K, **eng))]
    reference = None
    for rung, part, build in rungs:
        serve = build()
        if rung.startswith("HF"):
            hf_greedy(hf, [prompts[0][:20]], 4, rung.endswith("KV cache"))   # warm-up
        toks, dt = timed(serve, device)
        reference = toks if reference is None else reference
        same = sum(a == b for a, b in zip(toks, reference)) / len(prompts)
        n_out = sum(map(len, toks))
        if numpy_ref is not None:
            row_np = {"identical_to_numpy_cached_decode": sum(a == b for a, b in zip(toks, numpy_ref)) / len(prompts)}
        else:
            row_np = {}
        row = row_np | {"model": name, "rung": rung, "requests": len(prompts), "new_tokens_per_request": n_new,
               "output_tokens": n_out, "seconds": dt, "output_tok_per_s": n_out / dt,
               "identical_to_reference": same, "dtype": str(dtype).removeprefix("torch.")}
        results[part].append(row)
        save()
        print(f"{name:8s} {rung:44s} {n_out / dt:9.0f} tok/s  identical {same:.0%}", flush=True)
        del serve
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "llama1b"], choices=["tiny", "llama1b"])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new", type=int, default=128, help="new tokens per request")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 requests, 4 tokens (a CPU check of the script)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    n_req, n_new = (2, 4) if args.smoke else (args.requests, args.new)
    prompts = held_out_source(n_req, n_bytes=200, seed=0)
    info = meta(device)                 # versions, date and command (and transformers), on any device
    if device.type == "cuda":
        info = run_meta(**{k: v for k, v in info.items() if k in ("numpy", "transformers")})
    results = {"meta": info | {"dtype": args.dtype, "block_size": BLOCK, "budget": BUDGET, "k": K},
               "rungs": [], "side": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: out.write_text(json.dumps(results, indent=1))  # noqa: E731
    try:
        import transformers  # noqa: F401
        have_hf = True
    except ImportError:
        have_hf = False
        results["meta"]["skipped"] = "transformers is not installed: no HF rungs"
        print(results["meta"]["skipped"], flush=True)
    for name in args.models:
        if name == "tiny":
            model = load_model("tiny")
            torch_model = TorchModel.from_numpy(model.config, model.params).to(device=device, dtype=dtype)
        else:
            torch_model = model = random_model(LLAMA_1B, device, dtype)
        hf = hf_model(torch_model, dtype, device) if have_hf else None
        numpy_ref = [cached_decode(model, p, n_new).new_tokens for p in prompts] if name == "tiny" else None
        ladder(name, model, hf, prompts, n_new, device, dtype, save, results, numpy_ref)
        del hf, model, torch_model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
