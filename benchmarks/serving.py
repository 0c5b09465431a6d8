"""Serving benchmark for chapter 8: continuous vs static batching on one engine, HF ``generate`` on the
same weights, batch-1 decode against the weight-read roofline, and a profile of the decode step.

    python -m benchmarks serving                      # record serving of results/serving_<gpu>.json
    python -m benchmarks serving --smoke --device cpu --out /tmp/serving_smoke.json    # CPU smoke test

Workload: a chat-like trace (log-normal prompt and output lengths, ``minillm.studies.chat_trace``) of
``--requests`` requests with Poisson arrivals at ``--rate`` requests/s, random prompt tokens, fixed output
lengths (``ignore_eos``). Metrics as vLLM's ``benchmark_serving`` reports them: TTFT, TPOT, ITL and
end-to-end latency (mean, p50, p99, in ms) and output tokens per second over the whole run.

Models: the shipped tiny checkpoint, and a Llama-3.2-1B-shaped model (16 layers, d_model 2048, 32/8
heads, d_ff 8192, vocab 128256; untied LM head) with random bf16 weights. Every baseline runs in this
process, on the same weights: minillm with static batching (the same engine, admission only when a
batch is done), and HF transformers' ``LlamaForCausalLM.generate`` in static batches of 64.
The results file is rewritten after every measurement, so a run cut short keeps what it measured.
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
from minillm.model import LLAMA_1B, ModelConfig, load_model
from minillm.serving import LLMEngine, SamplingParams, SchedulerConfig
from minillm.serving.torch_runner import TorchRunner
from minillm.studies.fragmentation import chat_trace
from minillm.torch_model import TorchModel

from ._common import command, keep_earlier

RECORD = "serving"  # the record a plain run writes

H200_HBM_TBPS = 4.8          # datasheet peak, TB/s
ISSUE_ROOFLINE_TBPS = 4.3    # the issue's "achievable" bandwidth for its 1,430 tok/s target


def meta(device) -> dict:
    import datetime

    import triton
    info = {"torch": torch.__version__, "triton": triton.__version__, "numpy": np.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "command": command()}
    if device.type == "cuda":
        info |= {"gpu": torch.cuda.get_device_name(device), "cuda": torch.version.cuda}
    try:
        import transformers
        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def random_model(cfg: ModelConfig, device, dtype, seed: int = 0) -> TorchModel:
    """A TorchModel with init_params-style random weights, made on the device (no 6 GB host copy)."""
    torch.manual_seed(seed)
    m = TorchModel(cfg).to(device)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm"):
                p.fill_(1.0)
            else:
                std = 0.02 / np.sqrt(2 * cfg.n_layers) if name.endswith(("wo", "w_down")) else 0.02
                p.normal_(0.0, std)
    return m.to(dtype)


def trace(n: int, cfg: ModelConfig, rate: float, seed: int, prompt_median: float, output_median: float):
    reqs = chat_trace(n, seed=seed, max_context=cfg.max_seq_len, prompt_median=prompt_median,
                      output_median=output_median)
    rng = np.random.default_rng(seed + 1)
    vocab = min(cfg.vocab_size, 256)  # byte-like ids: valid for both models
    prompts = [rng.integers(0, vocab, r.prompt_len).tolist() for r in reqs]
    outs = [r.output_len for r in reqs]
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n)) if np.isfinite(rate) else np.zeros(n)
    return prompts, outs, arrivals - arrivals[0]


def pct(xs, q):
    return float(np.percentile(xs, q)) * 1e3 if len(xs) else float("nan")


def summarize(outs, t_start: float) -> dict:
    ttft = [o.ttft for o in outs]
    tpot = [o.tpot for o in outs if len(o.token_ids) > 1]
    itl = [x for o in outs for x in o.itl]
    e2e = [o.e2e for o in outs]
    n_out = sum(len(o.token_ids) for o in outs)
    span = max(o.finish_time for o in outs) - t_start
    res = {"requests": len(outs), "output_tokens": n_out, "seconds": span, "output_tok_per_s": n_out / span,
           "preempted_requests": sum(o.num_preemptions > 0 for o in outs)}
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        res[f"{name}_ms"] = {"mean": float(np.mean(xs)) * 1e3, "p50": pct(xs, 50), "p99": pct(xs, 99)}
    return res


ATTENTION = "triton"


def run_engine(model: TorchModel, prompts, outs, arrivals, *, static: bool, max_num_seqs: int, budget: int,
               num_blocks: int, block_size: int, device, dtype, graphs: bool = True) -> dict:
    cfg = model.config
    runner = TorchRunner(model, num_blocks, block_size, device=device, dtype=dtype, cuda_graphs=graphs,
                         attention=ATTENTION)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, static_batching=static)
    eng = LLMEngine(runner, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, sched,
                    enable_prefix_caching=False)
    t_cap = time.perf_counter()
    runner.capture_graphs(max_num_seqs, budget)   # decode sizes and mixed-step token buckets, before timing
    t_cap = time.perf_counter() - t_cap
    # warm up the prefill path (Triton compiles on first call) outside the measurement
    eng.generate([prompts[0][:50], prompts[1][:7]], SamplingParams(max_tokens=3, ignore_eos=True), progress=False)
    eng.requests.clear()
    steps0 = eng.scheduler.num_steps
    occupancy: list[int] = []
    occupancy_mixed: list[bool] = []

    @eng.add_step_observer
    def spy(b):
        occupancy.append(sum(s.is_decoding for s in b.seqs))
        occupancy_mixed.append(b.num_tokens > len(b.seqs))

    params = [SamplingParams(max_tokens=o, ignore_eos=True) for o in outs]
    t0 = runner.now()
    res = eng.serve_trace(prompts, params, arrivals)
    out = summarize(res, t0)
    steps = eng.scheduler.num_steps - steps0
    out |= {"policy": "static" if static else "continuous", "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": budget, "steps": steps, "cuda_graphs": runner.use_graphs,
            "graph_capture_s": t_cap, "mixed_steps": int(sum(1 for o in occupancy_mixed if o)),
            # slot utilization: decoding sequences per step over the slots the batch could hold
            "slot_utilization": float(np.mean(occupancy)) / max_num_seqs if occupancy else float("nan"),
            "preemptions": eng.scheduler.num_preemptions}
    del eng, runner
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


def hf_model(model: TorchModel, dtype, device):
    """LlamaForCausalLM holding ``model``'s weights (copied on the device through minillm.hf's name map)."""
    import transformers

    from minillm.hf import name_map, to_hf_config
    hcfg = to_hf_config(model.config)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(hcfg).to(dtype)
    sd = hf.state_dict()
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, (key, transposed) in name_map(model.config).items():
            src = ours[name].detach()
            sd[key].copy_(src.T if transposed else src)
    return hf.eval()


def run_hf(model: TorchModel, prompts, outs, batch: int, device, dtype) -> dict:
    """HF generate in static batches (left-padded), greedy; throughput counts each request's own tokens."""
    hf = hf_model(model, dtype, device)
    pad = 0
    useful, t_total = 0, 0.0
    batches = []
    for i in range(0, len(prompts), batch):
        ps, os_ = prompts[i:i + batch], outs[i:i + batch]
        width = max(map(len, ps))
        ids = torch.full((len(ps), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(ps):
            ids[r, width - len(p):] = torch.tensor(p)
            mask[r, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        n_new = max(os_)
        if i == 0:   # warm-up call, not timed
            hf.generate(input_ids=ids[:2, -8:], attention_mask=mask[:2, -8:], max_new_tokens=4, do_sample=False,
                        pad_token_id=pad)
        torch.cuda.synchronize() if device.type == "cuda" else None
        t = time.perf_counter()
        hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                    do_sample=False, pad_token_id=pad, eos_token_id=None)
        torch.cuda.synchronize() if device.type == "cuda" else None
        dt = time.perf_counter() - t
        t_total += dt
        useful += sum(os_)
        batches.append({"size": len(ps), "new_tokens": n_new, "seconds": dt})
    del hf
    return {"policy": "hf_generate_static", "batch": batch, "requests": len(prompts), "output_tokens": useful,
            "seconds": t_total, "output_tok_per_s": useful / t_total, "batches": batches,
            "generated_tokens_incl_padding": sum(b["size"] * b["new_tokens"] for b in batches)}


def decode_roofline(model: TorchModel, device, dtype, n_tokens: int, graphs: bool = True) -> dict:
    """Batch-1 decode: median step time from the engine's inter-token latencies, against reading the weights."""
    cfg = model.config
    runner = TorchRunner(model, 64, 16, device=device, dtype=dtype, cuda_graphs=graphs, attention=ATTENTION)
    eng = LLMEngine(runner, 64, 16, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig(max_num_seqs=1),
                    enable_prefix_caching=False)
    eng.generate([list(range(1, 129))], SamplingParams(max_tokens=16, ignore_eos=True), progress=False)  # warm
    out = eng.generate([list(range(1, 129))], SamplingParams(max_tokens=n_tokens, ignore_eos=True),
                       progress=False)[0]
    step = float(np.median(out.itl))
    bpp = torch.finfo(dtype).bits // 8
    read = (cfg.n_params() - cfg.vocab_size * cfg.d_model) * bpp   # the embedding table is gathered, not read
    res = {"cuda_graphs": runner.use_graphs, "median_step_ms": step * 1e3, "tok_per_s": 1 / step,
           "weight_bytes_read_per_step": read, "n_params": cfg.n_params()}
    for name, tbps in (("hbm_peak", H200_HBM_TBPS), ("issue", ISSUE_ROOFLINE_TBPS)):
        ceiling = tbps * 1e12 / read
        res[f"roofline_tok_per_s_{name}"] = ceiling
        res[f"fraction_of_roofline_{name}"] = (1 / step) / ceiling
    # the issue states its target as 1.5 B parameters read at 4.3 TB/s
    res["issue_target_tok_per_s"] = 0.5 * ISSUE_ROOFLINE_TBPS * 1e12 / (cfg.n_params() * bpp)
    return res


def copy_bandwidth_gbps(device) -> float:
    """The GPU's usable memory bandwidth, measured here: a 2 GiB device-to-device copy (read + write), as the
    hardware suite measures it (``benchmarks/hardware.py``)."""
    from .hardware import Bench, bench_copy
    return bench_copy(torch, Bench(torch, 256 << 20), 2.0)["gbps"]


def decode_vs_static(model: TorchModel, device, dtype, batches=(1, 8, 64), prompt_len: int = 128,
                     n_tokens: int = 256, repeats: int = 3):
    """Issue 36's small-batch target, one process, the same weights: seconds per decode step of the engine (CUDA
    graphs; ``batch`` requests of one prompt length decoding together, the median inter-token latency) against
    gpt-fast's static-cache loop eager and compiled (``benchmarks/_static_decode.py``), and the weight-read
    roofline at the copy bandwidth measured in this process (and at the issue's 4.3 TB/s), of the weights alone
    (the issue's definition) and of the weights with the K/V cache. The engine and the
    compiled loop run ``repeats`` times each, interleaved, every run kept (the medians are the headline). Yields
    one row per batch size (the caller saves each as it comes)."""
    from ._static_decode import StaticLoop
    cfg = model.config
    bpp = torch.finfo(dtype).bits // 8
    read = (cfg.n_params() - cfg.vocab_size * cfg.d_model) * bpp
    gbps = copy_bandwidth_gbps(device) if device.type == "cuda" else None
    for b in batches:
        prompts = [[(7 * i + j) % (cfg.vocab_size - 1) + 1 for j in range(prompt_len)] for i in range(b)]
        runner = TorchRunner(model, b * (-(-(prompt_len + n_tokens) // 16)) + 1, 16, device=device, dtype=dtype,
                             cuda_graphs=True, attention=ATTENTION)
        eng = LLMEngine(runner, runner.num_blocks, 16, cfg.max_seq_len, cfg.vocab_size,
                        SchedulerConfig(max_num_seqs=b, max_num_batched_tokens=max(2048, b * prompt_len)),
                        enable_prefix_caching=False)
        runner.prepare(eng.scheduler.config)
        sp = SamplingParams(max_tokens=n_tokens, ignore_eos=True)
        eng.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True), progress=False)  # warm
        compiled = StaticLoop(model, prompts[0], n_tokens, batch=b, compile=True)
        compiled.run()                                                                         # warm
        engine_ms, compiled_ms = [], []
        for _ in range(repeats):
            outs = eng.generate(prompts, sp, progress=False)
            engine_ms.append(float(np.median([t for o in outs for t in o.itl])) * 1e3)
            compiled_ms.append(compiled.run()[1] * 1e3)
        del eng, runner, compiled
        row = {"policy": "decode_vs_static", "batch": b, "prompt_len": prompt_len, "new_tokens": n_tokens,
               "engine_step_ms": float(np.median(engine_ms)), "engine_step_ms_runs": engine_ms,
               "static_compiled_step_ms": float(np.median(compiled_ms)), "static_compiled_step_ms_runs": compiled_ms,
               "static_eager_step_ms": StaticLoop(model, prompts[0], n_tokens, batch=b).run()[1] * 1e3,
               "weight_bytes_read_per_step": read,
               # the K/V cache read per step at the mean context of the decode (prompt + half the new tokens)
               "kv_bytes_read_per_step": int(b * (prompt_len + n_tokens / 2) * cfg.n_layers * 2 * cfg.n_kv_heads
                                             * cfg.d_head * bpp)}
        row["engine_vs_compiled"] = row["static_compiled_step_ms"] / row["engine_step_ms"]
        row["roofline_step_ms_issue_bw"] = read / (ISSUE_ROOFLINE_TBPS * 1e12) * 1e3
        if gbps is not None:
            row["copy_gbps"] = gbps
            row["roofline_step_ms_measured_bw"] = read / (gbps * 1e9) * 1e3
            row["engine_fraction_of_roofline"] = row["roofline_step_ms_measured_bw"] / row["engine_step_ms"]
            row["engine_fraction_of_roofline_runs"] = [row["roofline_step_ms_measured_bw"] / t for t in engine_ms]
            row["roofline_with_kv_step_ms_measured_bw"] = ((read + row["kv_bytes_read_per_step"]) / (gbps * 1e9)
                                                           * 1e3)
        print(row, flush=True)
        yield row


def profile_decode(model: TorchModel, device, dtype, graphs: bool, batch: int = 1) -> dict:
    """Where a decode step's time goes at ``batch`` sequences: top ops by device time and by host time
    (torch.profiler over 20 steps)."""
    from torch.profiler import ProfilerActivity, profile
    cfg = model.config
    runner = TorchRunner(model, 8 * batch + 1, 16, device=device, dtype=dtype, cuda_graphs=graphs, attention=ATTENTION)
    eng = LLMEngine(runner, runner.num_blocks, 16, cfg.max_seq_len, cfg.vocab_size,
                    SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=max(2048, 64 * batch)),
                    enable_prefix_caching=False)
    runner.prepare(eng.scheduler.config)
    rids = [eng.add_request([(i + j) % (cfg.vocab_size - 1) + 1 for j in range(64)],
                            SamplingParams(max_tokens=64, ignore_eos=True)) for i in range(batch)]
    for _ in range(8):
        eng.step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    n = 20
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        for _ in range(n):
            eng.step()
    wall = (time.perf_counter() - t) / n
    for rid in rids:
        eng.abort_request(rid)
    from torch.autograd import DeviceType
    rows = []
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    for e in sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:15]:
        rows.append({"op": e.key, "count": e.count, "self_device_us_per_step": getattr(e, "self_device_time_total", 0) / n,
                     "self_cpu_us_per_step": e.self_cpu_time_total / n, "kernel": e.device_type != DeviceType.CPU})
    # the GPU's busy time: the device events (kernels, copies) only. A CPU op such as aten::mm carries the device
    # time of the kernels it launched as well, so summing every row would count an eager step's kernels twice.
    dev_total = sum(getattr(e, "self_device_time_total", 0) for e in events if e.device_type != DeviceType.CPU) / n
    return {"cuda_graphs": runner.use_graphs, "batch": batch, "steps": n, "wall_ms_per_step": wall * 1e3,
            "device_busy_ms_per_step": dev_total / 1e3, "busy_counts": "device events only", "top_ops": rows}


def held_out_prompts(n: int, n_bytes: int = 256) -> list[list[int]]:
    """Python source the tiny model never saw (the frozen snapshot chapter 9 uses too)."""
    from minillm.studies.speculation import held_out_source
    return held_out_source(n, n_bytes)


def run_speculative(model: TorchModel, device, dtype, batches=(1, 8, 64), ks=(0, 2, 4, 8), n_tokens: int = 128):
    """Engine throughput with prompt-lookup speculation (greedy) against none, at several batch sizes."""
    from minillm.speculative import NgramDrafter
    cfg = model.config
    rows = []
    for b in batches:
        prompts = held_out_prompts(max(b, 8))
        ref = None
        for k in ks:
            runner = TorchRunner(model, 64 * 32, 16, device=device, dtype=dtype, attention=ATTENTION)
            sched = SchedulerConfig(max_num_seqs=b, max_num_batched_tokens=1024, num_speculative_tokens=k)
            eng = LLMEngine(runner, 64 * 32, 16, cfg.max_seq_len, cfg.vocab_size, sched, enable_prefix_caching=False,
                            drafter=NgramDrafter() if k else None)
            runner.capture_graphs(b, 1024, k)
            eng.generate([prompts[0][:40]], SamplingParams(max_tokens=8, ignore_eos=True), progress=False)  # warm
            s0, p0, a0 = eng.scheduler.num_steps, eng.scheduler.spec_proposed, eng.scheduler.spec_accepted
            t = time.perf_counter()
            outs = eng.generate(prompts, SamplingParams(max_tokens=n_tokens, ignore_eos=True), progress=False)
            dt = time.perf_counter() - t
            toks = [o.token_ids for o in outs]
            ref = toks if k == 0 else ref
            prop, acc = eng.scheduler.spec_proposed - p0, eng.scheduler.spec_accepted - a0
            rows.append({"policy": "speculative_ngram" if k else "no_speculation", "batch": b, "k": k,
                         "requests": len(prompts), "output_tok_per_s": sum(map(len, toks)) / dt,
                         "steps": eng.scheduler.num_steps - s0, "proposed": prop, "accepted": acc,
                         "acceptance": acc / prop if prop else float("nan"),
                         "identical_to_k0": sum(a == r for a, r in zip(toks, ref)) / len(toks)})
            print("spec", b, k, round(rows[-1]["output_tok_per_s"]), "tok/s, acceptance",
                  round(rows[-1]["acceptance"], 3) if prop else "-", flush=True)
            del eng, runner
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", default=["tiny", "llama1b"])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--hf-requests", type=int, default=128, help="HF generate is slow: the first N requests")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for a CPU check of the script")
    ap.add_argument("--parts", nargs="+", default=["continuous", "static", "hf", "roofline", "profile"],
                    help="also: spec (engine with prompt-lookup speculation at batch 1/8/64), gptfast (the engine "
                         "against gpt-fast's compiled static-cache loop at batch 1/8/64)")
    ap.add_argument("--attention", default="triton", choices=["triton", "torch"])
    ap.add_argument("--gptfast-batches", type=int, nargs="+", default=[1, 8, 64], help="batch sizes of --parts gptfast")
    ap.add_argument("--profile-batches", type=int, nargs="*", default=[], help="--parts profile: also profile a graphed "
                    "decode step at these batch sizes (policy profile_decode)")
    ap.add_argument("--gptfast-repeats", type=int, default=3, help="interleaved runs of the engine and the compiled loop")
    ap.add_argument("--append", action="store_true", help="keep the runs already in --out (one model per process)")
    args = ap.parse_args(argv)
    global ATTENTION
    ATTENTION = args.attention
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results = {"meta": meta(device), "runs": []}
    out_path = Path(args.out)
    if args.append:
        keep_earlier(out_path, results, ("runs",))

    def save():
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1))

    for name in args.models:
        if name == "tiny":
            model = TorchModel.from_numpy(*(lambda m: (m.config, m.params))(load_model("tiny"))).to(device)
            pm, om, rate = 100, 100, 1000.0
        else:
            model = random_model(LLAMA_1B, device, dtype)
            pm, om, rate = 300, 200, 200.0
        cfg = model.config
        n = 12 if args.smoke else args.requests
        if args.smoke:
            pm, om = 20, 12
        prompts, outs, arrivals = trace(n, cfg, rate, seed=0, prompt_median=pm, output_median=om)
        block_size = 16
        per_seq = -(-cfg.max_seq_len // block_size)
        common = dict(num_blocks=(4 if args.smoke else 256) * per_seq, block_size=block_size, device=device,
                      dtype=dtype, budget=512 if args.smoke else 2048)
        seqs = 4 if args.smoke else 64
        tag = {"model": name, "n_params": cfg.n_params(), "trace": {"requests": n, "rate_per_s": rate,
               "prompt_median": pm, "output_median": om, "mean_prompt": float(np.mean(list(map(len, prompts)))),
               "mean_output": float(np.mean(outs))}}
        if "continuous" in args.parts:
            for s in ([seqs] if args.smoke else [64, 256]):
                r = run_engine(model, prompts, outs, arrivals, static=False, max_num_seqs=s, **common)
                results["runs"].append(tag | r)
                print(name, "continuous", s, round(r["output_tok_per_s"]), "tok/s", flush=True)
                save()
        if "static" in args.parts:
            r = run_engine(model, prompts, outs, arrivals, static=True, max_num_seqs=seqs, **common)
            results["runs"].append(tag | r)
            print(name, "static", seqs, round(r["output_tok_per_s"]), "tok/s", flush=True)
            save()
        if "spec" in args.parts:
            for r in run_speculative(model, device, dtype, batches=(1, 2) if args.smoke else (1, 8, 64),
                                     ks=(0, 2) if args.smoke else (0, 2, 4, 8), n_tokens=16 if args.smoke else 128):
                results["runs"].append(tag | r)
            save()
        if "roofline" in args.parts:
            r = decode_roofline(model, device, dtype, 8 if args.smoke else 256)
            results["runs"].append(tag | {"policy": "batch1_decode"} | r)
            print(name, "b=1 decode", round(r["tok_per_s"]), "tok/s", flush=True)
            save()
        if "gptfast" in args.parts:
            for r in decode_vs_static(model, device, dtype, batches=(1, 2) if args.smoke else args.gptfast_batches,
                                      prompt_len=8 if args.smoke else 128, n_tokens=8 if args.smoke else 256,
                                      repeats=args.gptfast_repeats):
                results["runs"].append(tag | r)
                save()
        if "profile" in args.parts:
            for graphs in (False, True):
                r = profile_decode(model, device, dtype, graphs)
                results["runs"].append(tag | {"policy": "profile_b1_decode"} | r)
                save()
            for b in args.profile_batches:   # graphed only: where a bigger batch's extra time goes
                r = profile_decode(model, device, dtype, True, batch=b)
                results["runs"].append(tag | {"policy": "profile_decode"} | r)
                save()
        if "hf" in args.parts:
            try:
                k = 8 if args.smoke else args.hf_requests
                r = run_hf(model, prompts[:k], outs[:k], 4 if args.smoke else 64, device, dtype)
                results["runs"].append(tag | r)
                print(name, "hf", round(r["output_tok_per_s"]), "tok/s", flush=True)
                # the engine on the same subset, for a like-for-like number
                sub = run_engine(model, prompts[:k], outs[:k], np.zeros(k), static=False, max_num_seqs=seqs,
                                 **common)
                results["runs"].append(tag | sub | {"policy": "continuous_hf_subset"})
                save()
            except ImportError as e:
                results["runs"].append(tag | {"policy": "hf_generate_static", "skipped": str(e)})
        del model
    save()

