"""Suite ``flash``: minillm's Triton FlashAttention against PyTorch's SDPA backends (and flex_attention).

    python -m benchmarks flash                 # the grid: record flash_attention of results/flash_<gpu>.json

All providers run in the same process on the same inputs: bf16, B=4, H=32, D in {64, 128},
N in {1024, ..., 16384}, causal and not, forward and forward+backward. TFLOP/s counts the
useful FLOPs (4*B*H*N^2*D for the forward, halved when causal; the backward is 2.5x the forward).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from minillm.kernels.flash_attention import flash_attention  # (first: it decides interpreter vs compiled)
from minillm.kernels.flash_dispatch import FlashConfig

import torch

from ._common import flex_provider, median_ms, run_meta, sdpa_provider, warm_up_gpu, write_results

RECORD = "flash_attention"  # the record a plain run writes


def provider_fn(name, q, k, v, causal):
    if name == "minillm":  # the defaults (fwd_plan's version, the tuned tiles)
        return lambda: flash_attention(q, k, v, causal=causal)
    if name == "minillm_headorder":  # the defaults with the causal grid one head at a time (the order before groups)
        return lambda: flash_attention(q, k, v, causal=causal, config=FlashConfig(causal_group_programs=1))
    if name.startswith("minillm_"):  # one forward version, e.g. minillm_v1
        return lambda: flash_attention(q, k, v, causal=causal, config=FlashConfig(fwd=name.split("_", 1)[1]))
    if name == "flex":
        return flex_provider(q, k, v, causal)
    return sdpa_provider(name, q, k, v, causal)


def standard_attention_torch(q, k, v, causal):
    """The materializing baseline: S and P are full (B, H, N, N) tensors."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def peak_memory_rows(args):
    """Extra memory one forward call allocates (output included): minillm vs the materializing baseline."""
    rows = []
    for n in args.seq_lens:
        q, k, v = (torch.randn(args.batch, args.heads, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for prov, fn in (("minillm", lambda: flash_attention(q, k, v)), ("standard", lambda: standard_attention_torch(q, k, v, False))):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                out = fn()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                del out
            except torch.cuda.OutOfMemoryError:
                peak = None
            torch.cuda.empty_cache()
            rows.append({"op": "memory", "D": 128, "N": n, "causal": False, "provider": prov, "peak_bytes": peak})
            print(f"memory   128 {n:6d}  False {prov:15s} {'OOM' if peak is None else f'{peak / 2**20:9.0f} MiB'}", flush=True)
    return rows


def time_ms(fn, mode, q, k, v):
    if mode == "fwd":
        return median_ms(fn, warmup=25, rep=100)
    out = fn()
    do = torch.randn_like(out)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fn().backward(do)
    return median_ms(fwd_bwd, warmup=10, rep=100)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--bwd-seq-lens", type=int, nargs="+", default=None, help="N for fwd+bwd (default: --seq-lens)")
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    ap.add_argument("--providers", nargs="+", default=["minillm", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex"])
    ap.add_argument("--bwd-providers", nargs="+", default=None, help="providers for fwd+bwd (default: --providers)")
    ap.add_argument("--append", action="store_true", help="add rows to an existing --out file (same meta)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory rows")
    ap.add_argument("--causal-only", action="store_true", help="time the causal points only")
    ap.add_argument("--warmup-s", type=float, default=3.0,
                    help="seconds of untimed matmuls before the first timing, so the first point is not timed "
                         "while the GPU clocks still ramp up (0: none)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("the flash suite needs a CUDA GPU")
    rows, earlier = [], None
    if args.append and args.out and Path(args.out).exists():
        earlier = json.load(open(args.out))
        rows = earlier["rows"]
    meta = run_meta(dtype="bfloat16", batch=args.batch, heads=args.heads,
                    timing="triton.testing.do_bench, return_mode=median (ms)",
                    flops="fwd 4*B*H*N^2*D (x0.5 causal); fwd+bwd 3.5x fwd")
    if earlier:  # one file, several invocations: keep every command that wrote rows into it
        meta["command"] = earlier["meta"]["command"] + " && " + meta["command"]
    print(f"{'op':8s} {'D':>4s} {'N':>6s} {'causal':>6s} {'provider':15s} {'ms':>9s} {'TFLOP/s':>8s}")
    if not args.no_memory:
        rows.extend(peak_memory_rows(args))
    warm_up_gpu(args.warmup_s)
    meta["warmup_s"] = args.warmup_s
    for mode in args.modes:
        for d in args.head_dims:
            for n in (args.bwd_seq_lens or args.seq_lens) if mode == "fwd+bwd" else args.seq_lens:
                for causal in (True,) if args.causal_only else (False, True):
                    shape = (args.batch, args.heads, n, d)
                    flops = 4 * args.batch * args.heads * n * n * d * (0.5 if causal else 1.0)
                    flops *= 3.5 if mode == "fwd+bwd" else 1.0
                    for prov in (args.bwd_providers or args.providers) if mode == "fwd+bwd" else args.providers:
                        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                                               requires_grad=mode != "fwd") for _ in range(3))
                        try:
                            ms = time_ms(provider_fn(prov, q, k, v, causal), mode, q, k, v)
                            tflops, err = flops / (ms * 1e-3) / 1e12, None
                        except Exception as e:  # a backend that does not support the shape: record, go on
                            ms, tflops, err = None, None, f"{type(e).__name__}: {str(e)[:160]}"
                        rows.append({"op": mode, "D": d, "N": n, "causal": causal, "provider": prov,
                                     "ms": ms, "tflops": tflops, "error": err})
                        shown = f"{ms:9.3f} {tflops:8.1f}" if ms else f"{'-':>9s} {'-':>8s}  {err[:60]}"
                        print(f"{mode:8s} {d:4d} {n:6d} {str(causal):>6s} {prov:15s} {shown}", flush=True)
                        write_results(args.out, meta, rows)

