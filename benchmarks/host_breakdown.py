"""Where the host time of one training step of attention goes, part by part (issue 12, N=1K).

    python benchmarks/host_breakdown.py --out benchmarks/results/host_breakdown_h200.json

At N=1K the eager fwd+bwd step of minillm's FlashAttention runs at the host's pace
(results/attention_step_host_h200.json: issuing a step took longer than the GPU took to run it).
This times, in one process, the host cost of each part of that step: one Triton launch through
``kernel[grid]`` against the same launch through ``minillm.kernels.launch.fast_launch``; a CUDA
allocation; the forward and the backward issued without autograd; the whole autograd step with the
fast launch off, on, and on with plans (a later call of a seen shape replays the first one's decisions
and bound launches: ``fa.PLANS``), the forward through autograd alone, the backward through the engine alone (a
retained graph), and the step with the engine single-threaded (the backward on the calling thread, not
autograd's device thread); a do-nothing autograd.Function (the engine's own cost); and SDPA's FLASH backend forward and step, the
baseline of the targets. Each part is issued in chunks of ``--chunk`` calls, the clock stopped before
each chunk's synchronize, so the time is the host's even where the GPU is slower; medians over
``--repeats`` chunks, microseconds per call.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)
from minillm.kernels import launch  # noqa: E402

from _common import run_meta, step_inputs, step_point, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def issue_us(fn, chunk: int, repeats: int) -> float:
    """Median over ``repeats`` chunks of host microseconds per call, each chunk issued back to back."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(chunk):
            fn()
        times.append((time.perf_counter() - t) / chunk * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


class _Noop(torch.autograd.Function):
    """Allocates its outputs and launches nothing: what autograd alone costs a Python Function."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def parts(d: int, n: int, causal: bool) -> dict:
    q, k, v, do = step_inputs(d, n)
    scale = d ** -0.5
    o, lse = fa._forward(q, k, v, causal, scale)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    B, H, N, D = q.shape
    delta, lse2 = torch.empty((B, H, N), device="cuda"), torch.empty((B, H, N), device="cuda")
    pre = (o, do, lse, delta, lse2, N, H, *o.stride()[:3], *do.stride()[:3])
    pre_kw = dict(HEAD_DIM=D, BLOCK_D=D, BLOCK_M=64)
    grid = (N // 64, B * H)

    def sdpa_fwd(x, y, z):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(x, y, z, is_causal=causal)

    def with_fast(flag, fn, plans=True):
        def run():
            launch.FAST_LAUNCH, fa.PLANS = flag, plans
            try:
                fn()
            finally:
                launch.FAST_LAUNCH = fa.PLANS = True
        return run

    def single_threaded(fn):  # the backward on the calling thread instead of autograd's device thread
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                fn()
        return run

    out = fa.flash_attention(qg, kg, vg, causal=causal)  # a graph kept for the backward-alone case
    cases = {
        "one launch, kernel[grid]": lambda: fa._bwd_preprocess_v2[grid](*pre, **pre_kw),
        "one launch, fast_launch": lambda: launch.fast_launch(fa._bwd_preprocess_v2, grid, *pre, **pre_kw),
        "torch.empty_like (CUDA)": lambda: torch.empty_like(q),
        "forward, no autograd, plans": with_fast(True, lambda: fa._forward(q, k, v, causal, scale)),
        "forward, no autograd, fast": with_fast(True, lambda: fa._forward(q, k, v, causal, scale), plans=False),
        "forward, no autograd, jit": with_fast(False, lambda: fa._forward(q, k, v, causal, scale)),
        "backward, no autograd, plans": with_fast(True, lambda: fa._backward(q, k, v, o, lse, do, causal, scale)),
        "backward, no autograd, fast": with_fast(True, lambda: fa._backward(q, k, v, o, lse, do, causal, scale),
                                                 plans=False),
        "backward, no autograd, jit": with_fast(False, lambda: fa._backward(q, k, v, o, lse, do, causal, scale)),
        "step, autograd, plans": with_fast(True, lambda: torch.autograd.grad(
            fa.flash_attention(qg, kg, vg, causal=causal), (qg, kg, vg), do)),
        "step, autograd, fast": with_fast(True, lambda: torch.autograd.grad(
            fa.flash_attention(qg, kg, vg, causal=causal), (qg, kg, vg), do), plans=False),
        "step, autograd, jit": with_fast(False, lambda: torch.autograd.grad(
            fa.flash_attention(qg, kg, vg, causal=causal), (qg, kg, vg), do)),
        "forward, autograd apply, plans": lambda: fa.flash_attention(qg, kg, vg, causal=causal),
        "backward, autograd engine, plans": lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True),
        "step, autograd, fast, engine single-threaded": single_threaded(with_fast(True, lambda: torch.autograd.grad(
            fa.flash_attention(qg, kg, vg, causal=causal), (qg, kg, vg), do), plans=False)),
        "step, autograd, plans, engine single-threaded": single_threaded(lambda: torch.autograd.grad(
            fa.flash_attention(qg, kg, vg, causal=causal), (qg, kg, vg), do)),
        "step, no-op autograd.Function": lambda: torch.autograd.grad(_Noop.apply(qg, kg, vg), (qg, kg, vg), do),
        "sdpa_flash forward": lambda: sdpa_fwd(q, k, v),
        "sdpa_flash step": lambda: torch.autograd.grad(sdpa_fwd(qg, kg, vg), (qg, kg, vg), do),
        "sdpa_flash step, engine single-threaded": single_threaded(
            lambda: torch.autograd.grad(sdpa_fwd(qg, kg, vg), (qg, kg, vg), do)),
    }
    return cases


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["64:1024:causal", "128:1024"])
    ap.add_argument("--chunk", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("host_breakdown.py needs a CUDA GPU")
    meta = run_meta(dtype="bfloat16", batch=4, heads=32, chunk=args.chunk, repeats=args.repeats,
                    timing="host microseconds per call, median over chunks issued back to back")
    rows = []
    for point in args.points:
        d, n, causal = step_point(point)
        for name, fn in parts(d, n, causal).items():
            us = issue_us(fn, args.chunk, args.repeats)
            rows.append({"D": d, "N": n, "causal": causal, "part": name, "host_us": us})
            print(f"D={d} N={n} causal={causal!s:5s} {name:32s} {us:8.1f} us", flush=True)
            write_results(args.out, meta, rows)
    print(f"fast launches {launch.stats['fast']}, bound {launch.stats['bound']}, through the binder "
          f"{launch.stats['slow']}")


if __name__ == "__main__":
    main()
