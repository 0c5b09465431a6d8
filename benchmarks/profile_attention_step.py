"""Where one forward+backward call of minillm's FlashAttention spends its GPU time, kernel by kernel.

    python benchmarks/profile_attention_step.py --points 64:1024:causal 64:1024 128:1024:causal \
        --out benchmarks/results/attention_step_profile_h200.json

For each point (D:N[:causal]; bf16, B=4, H=32) the default path that training takes (autograd, fwd_plan
and bwd_plan) runs under torch.profiler for --calls calls after a warm-up; each row lists every
device kernel with its calls and GPU microseconds per step, the sum of them, and the wall time per
step, so that a step slower than its work (at D=64, N=1024 the causal step took longer than the
non-causal one, which does twice the work: results/flash_attention_n1k_recheck_h200.json) shows
whether one kernel or the gaps between kernels take the time. SDPA's FLASH backend is profiled the
same way beside it.

Three more times per row separate the host from the GPU: ``issue_us_per_step``, how long the host takes to
issue one step (calls back to back, clock stopped before the final synchronize); ``eager_us_per_step``, the
same with the synchronize (what an eager training loop sees: the larger of host and GPU time); and
``graph_us_per_step``, the step replayed from a CUDA graph (GPU time alone; do_bench_cudagraph's median).
With ``--host-profile``, minillm's rows also carry cProfile's top host functions by cumulative time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minillm.kernels import flash_attention as fa  # noqa: E402
from minillm.kernels import launch  # noqa: E402

from _common import apply_settings, median_ms_cudagraph, run_meta, step_inputs, step_point, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def step_fn(provider: str, causal: bool):
    if provider.startswith("minillm"):  # "minillm_jit": launch.FAST_LAUNCH off, "minillm_noplans": fa.PLANS off
        # (profile_point sets them)
        return lambda q, k, v: fa.flash_attention(q, k, v, causal=causal)

    def run(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def host_times(step, calls: int) -> dict:
    """Microseconds per step: issued back to back (host), the same up to a final synchronize (eager), and
    replayed from a CUDA graph (GPU alone; None, with the error, when the step does not capture)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        step()
    issue = time.perf_counter() - t
    torch.cuda.synchronize()
    eager = time.perf_counter() - t
    out = {"issue_us_per_step": issue / calls * 1e6, "eager_us_per_step": eager / calls * 1e6}
    try:  # (do_bench_cudagraph warms the step up on a side stream before it captures)
        out["graph_us_per_step"] = median_ms_cudagraph(step) * 1e3
    except Exception as e:  # noqa: BLE001  (recorded: a step that cannot be captured has no GPU-only time)
        out["graph_us_per_step"], out["graph_error"] = None, f"{type(e).__name__}: {e}"[:300]
    return out


def cprofile_top(step, calls: int, top: int = 25) -> list:
    """cProfile's top host functions of ``calls`` steps by cumulative time: (function, calls/step, us/step)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        step()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = [(f"{Path(f).name}:{line}({fn})", nc / calls, ct / calls * 1e6)
            for (f, line, fn), (_, nc, _, ct, _) in stats.items()]
    rows.sort(key=lambda r: r[2], reverse=True)
    return [{"function": f, "calls_per_step": c, "cum_us_per_step": us} for f, c, us in rows[:top]]


def profile_point(provider: str, d: int, n: int, causal: bool, calls: int, host_profile: bool = False) -> dict:
    from torch.profiler import ProfilerActivity, profile

    q, k, v, do = step_inputs(d, n)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fn = step_fn(provider, causal)
    launch.FAST_LAUNCH, fa.PLANS = provider != "minillm_jit", provider != "minillm_noplans"

    def step():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / calls
    from torch.autograd import DeviceType

    kernels = []
    for e in prof.key_averages():  # device events only: a CPU op also carries the time of the kernels it launched
        dev = getattr(e, "self_device_time_total", 0)
        if dev > 0 and e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            kernels.append({"kernel": e.key[:120], "calls_per_step": e.count / calls, "us_per_step": dev / calls})
    kernels.sort(key=lambda r: r["us_per_step"], reverse=True)
    row = {"provider": provider, "D": d, "N": n, "causal": causal, "wall_us_per_step": wall * 1e6,
           "device_us_per_step": sum(r["us_per_step"] for r in kernels), "kernels": kernels[:12]}
    row.update(host_times(step, calls=200))
    if host_profile:
        row["host_profile"] = cprofile_top(step, calls=200)
    launch.FAST_LAUNCH = fa.PLANS = True
    if provider.startswith("minillm"):
        row.update(fwd_impl=fa.last_forward_impl, bwd_path=fa.last_backward_path, bwd_config=fa.last_backward_config)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["64:1024:causal", "64:1024", "128:1024:causal", "128:1024"])
    ap.add_argument("--providers", nargs="+", default=["minillm", "sdpa_flash"])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--host-profile", action="store_true", help="cProfile minillm's host functions too")
    ap.add_argument("--fa-set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="set minillm.kernels.flash_attention constants for the run (e.g. HOST_DESC_MIN_N=2048)")
    args = ap.parse_args(argv)
    settings = apply_settings(fa, args.fa_set)
    if not torch.cuda.is_available():
        sys.exit("profile_attention_step.py needs a CUDA GPU")
    rows = []
    meta = run_meta(dtype="bfloat16", batch=4, heads=32, calls=args.calls,
                    graph_timing="triton.testing.do_bench_cudagraph, median "
                                 "(runs before 2026-12-03's kernels6: the mean of 200 replays)", fa_set=settings)
    for point in args.points:
        d, n, causal = step_point(point)
        for provider in args.providers:
            mine = provider.startswith("minillm")
            row = profile_point(provider, d, n, causal, args.calls, args.host_profile and mine)
            rows.append(row)
            print(f"D={d} N={n} causal={causal} {provider}: wall {row['wall_us_per_step']:.0f} us, kernels "
                  f"{row['device_us_per_step']:.0f} us" + (f" (fwd {row['fwd_impl']}, bwd {row['bwd_path']} "
                                                            f"{row['bwd_config']})" if mine else ""))
            print(f"    host issue {row['issue_us_per_step']:.0f} us, eager {row['eager_us_per_step']:.0f} us, "
                  f"CUDA graph {row['graph_us_per_step'] or float('nan'):.0f} us {row.get('graph_error', '')}")
            for r in row["kernels"][:6]:
                print(f"    {r['us_per_step']:8.1f} us  x{r['calls_per_step']:.0f}  {r['kernel'][:90]}")
            for r in row.get("host_profile", [])[:25]:
                print(f"    host {r['cum_us_per_step']:8.1f} us  x{r['calls_per_step']:.1f}  {r['function'][:90]}")
            write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
