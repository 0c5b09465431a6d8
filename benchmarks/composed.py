"""Composed-stack benchmark for chapter 10: one set of requests served by a ladder of configurations, each adding
one technique, every rung checked for identical greedy tokens, on the same weights.

    python -m benchmarks composed                     # record composed of results/composed_<gpu>.json
    python -m benchmarks composed --study             # the bf16 study: record composed_bf16
    python -m benchmarks composed --smoke --device cpu --out /tmp/composed_smoke.json   # CPU smoke test
    python -m benchmarks composed --study --smoke --device cpu --out /tmp/composed_study_smoke.json

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
shipped tiny checkpoint and the Llama-3.2-1B shape with random weights (``benchmarks.serving.random_model``). Prompts:
``--requests`` chunks of held-out Python source (byte ids, valid for both vocabularies). The results file is
rewritten after every rung, so a run cut short keeps what it measured.

``--study`` (chapter 10's headline, bf16, the 1B shape) runs the ladder in bfloat16 and, beside it:

* ``leave_one_out``: the full stack (the engine, CUDA graphs, every request at once) with one technique taken
  out at a time (CUDA graphs; batching; the engine, i.e. HF with its KV cache batched instead; the KV cache, HF
  batched without it), and with speculation added;
* ``sweep``: the engine with and without CUDA graphs, every request of a batch at once, at each batch size of
  ``--sweep``: aggregate tokens/s, per-request tokens/s, TTFT and time per output token (the latency-throughput
  frontier, and the request-count dependence of an aggregate speedup).

In bf16 the identity check compares every row with the engine at batch 1 (CUDA graphs): the share of requests
whose tokens are all equal, and the mean share of tokens before a request's first difference. The batch-1
rungs (HF, and the engine at batch 1) serve the first ``--one-at-a-time`` requests only: one at a time, a
request's speed does not depend on how many wait after it. ``--budget-s`` stops the study's optional parts
(the sweep's largest batches first) once that many seconds have passed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

import minillm.kernels  # noqa: F401  (first: it decides interpreter vs compiled before triton loads)
from minillm.decode import cached_decode
from minillm.model import load_model
from minillm.serving import LLMEngine, SamplingParams, SchedulerConfig
from minillm.serving.torch_runner import TorchRunner
from minillm.speculative import NgramDrafter
from minillm.studies.composition import hf_greedy, token_agreement
from minillm.studies.speculation import held_out_source
from minillm.torch_model import TorchModel
from ._common import keep_earlier, run_meta
from .serving import LLAMA_1B, hf_model, meta, random_model


def RECORD(argv: list[str]) -> str:
    """The record a run writes: ``composed`` (the float32 ladder), ``composed_bf16`` with ``--study``."""
    return "composed_bf16" if "--study" in argv else "composed"

BLOCK, BUDGET, K = 16, 2048, 4


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_serve(model, prompts, n_new: int, *, batch: int, graphs: bool, k: int, device, dtype,
                 attention: str = "triton"):
    """An engine with the torch runner over ``batch`` slots; returns a function that serves every prompt.
    ``attention="torch"`` (the study's CPU smoke test) swaps the Triton kernels for SDPA, fast on a CPU."""
    cfg = model.config
    per_seq = -(-(max(map(len, prompts)) + n_new + k + 1) // BLOCK)
    num_blocks = batch * per_seq + 8
    run = TorchRunner(model, num_blocks, BLOCK, device=device, dtype=dtype, cuda_graphs=graphs, attention=attention)
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


def gpu_tag(name: str) -> str:
    """``NVIDIA H200`` -> ``h200``, ``NVIDIA H100 80GB HBM3`` -> ``h100``: the GPU part of a results file's name."""
    for word in name.replace("-", " ").split():
        if word[:1].isalpha() and any(c.isdigit() for c in word):
            return word.lower()
    return "cpu"


def hf_batched(hf, prompts, n_new: int, use_cache: bool) -> list[list[int]]:
    """Greedy decoding of every prompt in one batch with HF (the prompts must share a length: no padding)."""
    if len({len(p) for p in prompts}) != 1:
        raise ValueError("hf_batched needs prompts of one length")
    device = next(hf.parameters()).device
    ids = torch.tensor([list(p) for p in prompts], device=device)
    feed, past, new = ids, None, []
    with torch.no_grad():
        for _ in range(n_new):
            out = hf(input_ids=feed, past_key_values=past, use_cache=use_cache)
            nxt = out.logits[:, -1].argmax(dim=-1, keepdim=True)
            new.append(nxt)
            ids = torch.cat([ids, nxt], dim=1)
            past, feed = (out.past_key_values, nxt) if use_cache else (None, ids)
    return torch.cat(new, dim=1).tolist()


class Study:
    """The bf16 study (``--study``): every row is timed once after a warm-up, checked against the reference
    (the engine at batch 1), appended to ``results[part]`` and saved."""

    def __init__(self, model, hf, device, dtype, n_new, save, results, deadline):
        self.model, self.hf, self.device, self.dtype, self.n_new = model, hf, device, dtype, n_new
        self.save, self.results, self.deadline, self.reference = save, results, deadline, None
        self.last_tokens = None

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def row(self, part: str, label: str, serve, n_req: int, extra: dict | None = None, outputs=None) -> dict:
        toks, dt = timed(serve, self.device)
        toks = self.last_tokens = [list(map(int, t)) for t in toks]
        n_out = sum(map(len, toks))
        r = {"rung": label, "requests": n_req, "new_tokens_per_request": self.n_new, "output_tokens": n_out,
             "seconds": dt, "output_tok_per_s": n_out / dt, "dtype": str(self.dtype).removeprefix("torch.")}
        if self.reference is not None:
            agree = token_agreement(toks[: len(self.reference)], self.reference)
            r |= {"identical_to_engine_b1": agree["identical"], "prefix_equal_to_engine_b1": agree["prefix"],
                  "compared_requests": min(len(toks), len(self.reference))}
        r |= extra or {}
        self.results[part].append(r)
        self.save()
        same = f"identical {r['identical_to_engine_b1']:.0%}" if "identical_to_engine_b1" in r else "reference"
        print(f"{part:12s} {label:52s} {n_out / dt:9.0f} tok/s  {same}  ({dt:.1f} s)", flush=True)
        return r


def engine_runner(model, n_slots: int, max_prompt: int, n_new: int, *, graphs: bool, k: int, device, dtype,
                  attention: str = "triton"):
    """A TorchRunner whose pool and CUDA graphs serve up to ``n_slots`` sequences at once."""
    per_seq = -(-(max_prompt + n_new + k + 1) // BLOCK)
    num_blocks = n_slots * per_seq + 8
    run = TorchRunner(model, num_blocks, BLOCK, device=device, dtype=dtype, cuda_graphs=graphs, attention=attention)
    run.capture_graphs(n_slots, BUDGET, k)
    return run, num_blocks


def engine_on(run, num_blocks: int, cfg, batch: int, k: int) -> LLMEngine:
    sched = SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=BUDGET, num_speculative_tokens=k)
    return LLMEngine(run, num_blocks, BLOCK, cfg.max_seq_len, cfg.vocab_size, sched, enable_prefix_caching=False,
                     drafter=NgramDrafter() if k else None)


def study(model, hf, prompts, sweep_prompts, n_new: int, one_at_a_time: int, sweep: list[int], device, dtype,
          save, results, deadline) -> None:
    """The bf16 study: reference, ladder, leave-one-out, sweep (see the module docstring)."""
    cfg, graphs = model.config, device.type == "cuda"
    st = Study(model, hf, device, dtype, n_new, save, results, deadline)
    few, n_all = prompts[:one_at_a_time], len(prompts)
    eng = dict(device=device, dtype=dtype, attention="triton" if graphs else "torch")
    # the reference, and the ladder's batch-1 engine rung: the engine at batch 1 with CUDA graphs
    ref = st.row("rungs", "+ CUDA graphs", engine_serve(model, few, n_new, batch=1, graphs=graphs, k=0, **eng),
                 len(few))
    st.reference = st.last_tokens
    ref |= {"identical_to_engine_b1": 1.0, "prefix_equal_to_engine_b1": 1.0, "compared_requests": len(few)}
    rungs = []
    if hf is not None:
        def hf_rung(use_cache):
            hf_greedy(hf, [few[0][:20]], 4, use_cache)       # warm-up
            return lambda: hf_greedy(hf, few, n_new, use_cache)
        rungs += [("HF, no KV cache (naive PyTorch)", lambda: hf_rung(False), len(few)),
                  ("HF, KV cache", lambda: hf_rung(True), len(few))]
    rungs += [("engine, batch 1, eager", lambda: engine_serve(model, few, n_new, batch=1, graphs=False, k=0, **eng),
               len(few))]
    for label, build, n in rungs:
        st.row("rungs", label, build(), n)
    rank = ["HF, no KV cache (naive PyTorch)", "HF, KV cache", "engine, batch 1, eager", "+ CUDA graphs"]
    results["rungs"].sort(key=lambda r: rank.index(r["rung"]))     # the ladder's order (the reference ran first)
    full = st.row("rungs", "+ continuous batching",
                  engine_serve(model, prompts, n_new, batch=n_all, graphs=graphs, k=0, **eng), n_all)
    st.row("rungs", f"+ speculation (prompt lookup, k={K})",
           engine_serve(model, prompts, n_new, batch=n_all, graphs=graphs, k=K, **eng), n_all)
    st.row("side", f"engine, batch 1, CUDA graphs, speculation k={K}",
           engine_serve(model, few, n_new, batch=1, graphs=graphs, k=K, **eng), len(few))
    # leave one out of the full stack (the engine, CUDA graphs, all requests at once)
    results["leave_one_out_full"] = full["rung"]
    loo = [("without CUDA graphs", lambda: engine_serve(model, prompts, n_new, batch=n_all, graphs=False, k=0,
                                                         **eng))]
    if hf is not None:
        def hf_all(use_cache):
            hf_batched(hf, [p[:20] for p in prompts[:2]], 4, use_cache)   # warm-up
            return lambda: hf_batched(hf, prompts, n_new, use_cache)
        loo += [("without the engine (HF, KV cache, all at once)", lambda: hf_all(True)),
                ("without the engine or the KV cache (HF, all at once)", lambda: hf_all(False))]
    for label, build in loo:
        if st.left() < 20:
            print(f"budget: skipping {label}", flush=True)
            continue
        st.row("leave_one_out", label, build(), n_all)
    # the sweep: one runner per configuration, captured for the largest batch, a fresh engine per batch size
    max_prompt = max(map(len, sweep_prompts))
    for use_graphs in ([True, False] if graphs else [False]):
        if st.left() < 30:
            print(f"budget: skipping the sweep with graphs={use_graphs}", flush=True)
            continue
        run, nb = engine_runner(model, max(sweep), max_prompt, n_new, graphs=use_graphs, k=0, **eng)
        for b in sweep:
            if st.left() < 10:
                print(f"budget: skipping batch {b} (graphs={use_graphs})", flush=True)
                continue
            e = engine_on(run, nb, cfg, b, 0)
            e.generate(sweep_prompts[:b], SamplingParams(max_tokens=4, ignore_eos=True), progress=False)  # warm-up
            params = [SamplingParams(max_tokens=n_new, ignore_eos=True) for _ in range(b)]
            outs = []

            steps0 = e.scheduler.num_steps          # the warm-up's steps are not the row's

            def serve(e=e, b=b, params=params, outs=outs):
                outs[:] = e.generate(sweep_prompts[:b], params, progress=False)
                return [o.token_ids for o in outs]
            r = st.row("sweep", f"engine, {'CUDA graphs' if use_graphs else 'eager'}, batch {b}", serve, b,
                       {"batch": b, "cuda_graphs": use_graphs})
            e2e = np.array([o.e2e for o in outs])
            r |= {"per_request_tok_per_s": float(np.mean([len(o.token_ids) / o.e2e for o in outs])),
                  "ttft_s_median": float(np.median([o.ttft for o in outs])),
                  "tpot_s_median": float(np.median([o.tpot for o in outs])),
                  "e2e_s_median": float(np.median(e2e)), "steps": e.scheduler.num_steps - steps0}
            save()
            del e
        del run
        if device.type == "cuda":
            torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "llama1b"], choices=["tiny", "llama1b"])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--new", type=int, default=128, help="new tokens per request")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 requests, 4 tokens (a CPU check of the script)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--append", action="store_true", help="keep the rungs already in --out (one model per process)")
    ap.add_argument("--study", action="store_true", help="the bf16 study: ladder, leave-one-out, batch sweep")
    ap.add_argument("--one-at-a-time", type=int, default=8, help="(--study) requests the batch-1 rungs serve")
    ap.add_argument("--sweep", default="1,2,4,8,16,32,64,128,256", help="(--study) batch sizes")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="(--study) stop optional parts after")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    n_req, n_new = (2, 4) if args.smoke else (args.requests, args.new)
    prompts = held_out_source(n_req, n_bytes=200, seed=0)
    if args.study:
        return main_study(args, device, n_req, n_new, prompts, t_start)
    info = meta(device)                 # versions, date and command (and transformers), on any device
    if device.type == "cuda":
        info = run_meta(**{k: v for k, v in info.items() if k in ("numpy", "transformers")})
    results = {"meta": info | {"dtype": args.dtype, "block_size": BLOCK, "budget": BUDGET, "k": K},
               "rungs": [], "side": []}
    out = Path(args.out)
    if args.append:
        keep_earlier(out, results, ("rungs", "side"))
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



def main_study(args, device, n_req, n_new, prompts, t_start) -> None:
    dtype = torch.bfloat16 if args.dtype == "float32" and "--dtype" not in sys.argv else getattr(torch, args.dtype)
    sweep = [1, 2, 3] if args.smoke else [int(b) for b in args.sweep.split(",")]
    one = 1 if args.smoke else min(args.one_at_a_time, n_req)
    # the sweep's requests: the ladder's, then more chunks of 200 bytes (one every 700 characters, seed 1), so
    # that its first requests are the reference's and every row can be checked against it
    more = [p for p in held_out_source(max(sweep), n_bytes=200, seed=1, stride=700) if p not in prompts]
    sweep_prompts = (prompts + more)[: max(sweep)]
    info = meta(device)
    if device.type == "cuda":
        info = run_meta(**{k: v for k, v in info.items() if k in ("numpy", "transformers")})
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    results = {"meta": info | {"dtype": str(dtype).removeprefix("torch."), "block_size": BLOCK, "budget": BUDGET,
                               "k": K, "model": "llama1b" if not args.smoke else "tiny",
                               "one_at_a_time_requests": one, "sweep_prompts": "the ladder's requests, then "
                               "held_out_source(n, 200, seed=1, stride=700) less those", "reference": "engine, batch 1, CUDA graphs (bf16)"},
               "rungs": [], "side": [], "leave_one_out": [], "sweep": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: out.write_text(json.dumps(results, indent=1))  # noqa: E731
    if args.smoke:      # the tiny checkpoint stands in for the 1B shape on a CPU
        model = load_model("tiny")
        tm = TorchModel.from_numpy(model.config, model.params).to(device=device, dtype=dtype)
    else:
        tm = random_model(LLAMA_1B, device, dtype)
    try:
        hf = hf_model(tm, dtype, device)
    except ImportError:
        hf = None
        results["meta"]["skipped"] = "transformers is not installed: no HF rows"
    save()
    study(tm, hf, prompts, sweep_prompts, n_new, one, sweep, device, dtype, save, results,
          t_start + args.budget_s)
    results["meta"]["seconds"] = time.perf_counter() - t_start
    save()

