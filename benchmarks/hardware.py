"""Suite ``hardware``: the numbers chapters 3 and 4 reason about, on the GPU at hand.

    python -m benchmarks hardware                  # record hardware of results/hardware_<gpu>.json
    python -m benchmarks hardware --part launch    # record launch_overhead: how much of a short call is the host

Three experiments, each timed with CUDA events (warm-up calls first, then the
median of repeats, with a buffer several times the L2 size zeroed before every
repeat so each one starts from HBM, not from cache):

* copy:      device-to-device copy of a multi-GiB buffer -> usable HBM bandwidth
             (bytes read + bytes written per second);
* matmul:    bf16 matmuls, square ones up to 8192^3 and decode-like ones
             (m = 1..64 rows against an 8192 x 8192 weight) -> points for a roofline;
* attention: materializing attention in eager PyTorch versus
             torch.nn.functional.scaled_dot_product_attention (default backend),
             time, TFLOP/s and peak memory across sequence lengths.

The device part needs only torch (triton is reported if present). It does not import minillm, so
it runs where NumPy is missing; its traffic formulas mirror
``minillm.hardware`` and the unit tests check that they agree.

``--part launch`` (chapter 6): for minillm's flash forward and SDPA's backends at bf16, B=4, H=32, D=64/128,
N=1024 and 4096: ``plain_ms`` is do_bench on ordinary calls (what the flash suite reports), ``graph_ms`` the same
call replayed from a CUDA graph (no Python, no launch cost), and ``host_us`` the wall time of one Python call
with the GPU idle (averaged over many calls, synchronizing once).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ._common import median_ms, median_ms_cudagraph, run_meta, sdpa_provider, write_results

MiB, GiB = 1024**2, 1024**3
SEQ_LENS = [512, 1024, 2048, 4096, 8192, 16384]
SQUARE_SIZES = [1024, 2048, 4096, 8192]
DECODE_ROWS = [1, 2, 4, 8, 16, 32, 64, 256, 1024]   # rows against an 8192 x 8192 weight


def RECORD(argv: list[str]) -> str:
    """The record a run writes: ``hardware``, or ``launch_overhead`` for ``--part launch``."""
    return "launch_overhead" if parse_args(argv).part == "launch" else "hardware"


# --------------------------------------------------------------------------- traffic formulas (no torch)

def standard_traffic_model(n: int, d: int, b: int = 2) -> int:
    """Textbook three-kernel attention, one head: Q, K, V, O once; S and P written and read once each."""
    return 4 * n * d * b + 4 * n * n * b


def standard_traffic_eager(n: int, d: int, b: int = 2) -> int:
    """What the eager code below moves per head: every op is its own kernel.

    q@k^T writes S (b); `* scale` reads and writes it (2b); .float() reads b, writes 4;
    softmax reads 4, writes 4; .to(bf16) reads 4, writes b; P@v reads P (b).
    """
    per_score = b + 2 * b + (b + 4) + (4 + 4) + (4 + b) + b
    return 4 * n * d * b + per_score * n * n


def flash_traffic_model(n: int, d: int, block_m: int = 128, b: int = 2) -> int:
    """FlashAttention-2 loop order, one head: Q and O once, K and V once per query tile."""
    q_tiles = -(-n // block_m)
    return 2 * n * d * b + 2 * q_tiles * n * d * b


# --------------------------------------------------------------------------- timing

class Bench:
    """CUDA-event timer: warm-up, L2 flush before every repeat, median of repeats."""

    def __init__(self, torch, flush_bytes: int, budget_s: float = 0.25):
        self.torch = torch
        self.flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")
        self.budget_ms = budget_s * 1e3

    def _timed(self, fn, reps: int) -> list[float]:
        ev = self.torch.cuda.Event
        pairs = [(ev(enable_timing=True), ev(enable_timing=True)) for _ in range(reps)]
        for start, end in pairs:
            self.flush.zero_()          # evict L2 so this repeat reads from HBM
            start.record()
            fn()
            end.record()
        self.torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in pairs]

    def median_ms(self, fn, warmup: int = 3, min_reps: int = 5, max_reps: int = 100) -> float:
        for _ in range(warmup):
            fn()
        self.torch.cuda.synchronize()
        first = self._timed(fn, 1)[0]
        reps = int(min(max_reps, max(min_reps, self.budget_ms // max(first, 1e-3))))
        return statistics.median(self._timed(fn, reps))


def peak_bytes(torch, fn):
    """(extra bytes allocated at the peak of one call of fn, its result); the result is included."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base, out


# --------------------------------------------------------------------------- experiments

def bench_copy(torch, bench: Bench, gib: float) -> dict:
    n = int(gib * GiB)
    src = torch.ones(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = bench.median_ms(lambda: dst.copy_(src))
    moved = 2 * n                      # every byte is read once and written once
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes_per_buffer": n, "bytes_moved": moved, "ms": ms, "gbps": moved / ms / 1e6}


def bench_matmul(torch, bench: Bench) -> list[dict]:
    shapes = [(s, s, s) for s in SQUARE_SIZES] + [(m, 8192, 8192) for m in DECODE_ROWS]
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        c = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        ms = bench.median_ms(lambda: torch.mm(a, w, out=c))
        flops, nbytes = 2 * m * n * k, (m * k + k * n + m * n) * 2
        rows.append({"m": m, "n": n, "k": k, "dtype": "bf16", "ms": ms, "tflops": flops / ms / 1e9,
                     "bytes_model": nbytes, "intensity": flops / nbytes, "gbps_model": nbytes / ms / 1e6})
        del a, w, c
    torch.cuda.empty_cache()
    return rows


def standard_attention(torch, q, k, v):
    """The textbook algorithm in eager PyTorch: S and P are whole tensors in HBM."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return p @ v


def bench_attention(torch, bench: Bench, seq_lens, batch: int, heads: int, d: int) -> list[dict]:
    import torch.nn.functional as F

    rows = []
    for n in seq_lens:
        q, k, v = (torch.randn(batch, heads, n, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        flops = 4 * batch * heads * n * n * d
        providers = {
            "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v), flash_traffic_model(n, d), None),
            "standard": (lambda: standard_attention(torch, q, k, v), standard_traffic_model(n, d),
                         standard_traffic_eager(n, d)),
        }
        reference = None
        for name, (fn, traffic, eager) in providers.items():
            row = {"N": n, "B": batch, "H": heads, "D": d, "provider": name, "ms": None, "tflops": None,
                   "peak_bytes": None, "traffic_bytes_model": traffic * batch * heads,
                   "traffic_bytes_eager": None if eager is None else eager * batch * heads,
                   "max_abs_diff_vs_sdpa": None, "oom": False}
            try:
                row["peak_bytes"], out = peak_bytes(torch, fn)
                if reference is None:
                    reference = out
                else:
                    row["max_abs_diff_vs_sdpa"] = (out.float() - reference.float()).abs().max().item()
                del out
                row["ms"] = bench.median_ms(fn, warmup=2, min_reps=3)
                row["tflops"] = flops / row["ms"] / 1e9
            except torch.cuda.OutOfMemoryError:   # the materialized S and P no longer fit
                row["oom"] = True
            rows.append(row)
            torch.cuda.empty_cache()
        del q, k, v, reference
        torch.cuda.empty_cache()
    return rows


def sdpa_kernels(torch, n: int = 4096, heads: int = 32, d: int = 128) -> list[str] | str:
    """Names of the CUDA kernels the default SDPA backend launches (to say which backend ran)."""
    try:
        import torch.nn.functional as F
        from torch.profiler import ProfilerActivity, profile

        q = torch.randn(1, heads, n, d, dtype=torch.bfloat16, device="cuda")
        F.scaled_dot_product_attention(q, q, q)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, q, q)
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")}
        return sorted(name[:160] for name in names)
    except Exception as exc:   # diagnostics only; never fail the run over it
        return f"could not profile: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- report

def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def print_report(result: dict) -> None:
    meta, copy = result["meta"], result["copy"]
    print(f"{meta['gpu']}  torch {meta['torch']}  triton {meta['triton']}  CUDA {meta['cuda']}  {meta['date']}")
    print(f"\ncopy: {copy['bytes_per_buffer'] / GiB:.1f} GiB buffer, {copy['ms']:.3f} ms, "
          f"{copy['gbps']:.0f} GB/s (read + write)")
    print(f"\n{'m':>6} {'n':>6} {'k':>6} {'ms':>9} {'TFLOP/s':>9} {'FLOP/B':>8} {'GB/s':>8}")
    for r in result["matmul"]:
        print(f"{r['m']:>6} {r['n']:>6} {r['k']:>6} {r['ms']:>9.4f} {r['tflops']:>9.1f} "
              f"{r['intensity']:>8.1f} {r['gbps_model']:>8.0f}")
    print(f"\n{'N':>6} {'provider':>9} {'ms':>9} {'TFLOP/s':>9} {'peak MiB':>10} {'model MiB':>10}")
    for r in result["attention"]:
        peak = None if r["peak_bytes"] is None else r["peak_bytes"] / MiB
        print(f"{r['N']:>6} {r['provider']:>9} {fmt(r['ms'], '9.3f'):>9} {fmt(r['tflops'], '9.1f'):>9} "
              f"{fmt(peak, '10.0f'):>10} {r['traffic_bytes_model'] / MiB:>10.0f}" + ("  OOM" if r["oom"] else ""))
    print(f"\nsdpa kernels: {meta['sdpa_kernels']}")


def parse_args(argv):
    p = argparse.ArgumentParser(description="Measure HBM bandwidth, bf16 matmul rates and attention on a CUDA GPU.")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    p.add_argument("--part", choices=["device", "launch"], default="device",
                   help="device: copy, matmul, attention (default); launch: host time of a short call")
    p.add_argument("--copy-gib", type=float, default=2.0, help="size of each copy buffer in GiB (default 2)")
    p.add_argument("--heads", type=int, default=32, help="B*H heads for attention, as B=1 (default 32)")
    p.add_argument("--seq-lens", type=int, nargs="+", default=SEQ_LENS, help="attention sequence lengths")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.part == "launch":
        return launch_overhead(args.out)
    try:
        import torch
    except ImportError:
        print("the hardware suite needs PyTorch with CUDA; torch is not installed.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("the hardware suite needs a CUDA GPU, and torch.cuda.is_available() is False here. "
              "Nothing was measured.", file=sys.stderr)
        return 2
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None

    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or 64 * MiB
    bench = Bench(torch, flush_bytes=max(256 * MiB, 4 * l2))
    meta = {
        **run_meta(triton=triton_version),
        "sm_count": props.multi_processor_count, "l2_bytes": l2, "total_memory_bytes": props.total_memory,
        "timing": f"CUDA events; warm-up, then median of repeats; {bench.flush.numel() * 4 // MiB} MiB "
                  "buffer zeroed before each repeat to flush L2",
        "notes": "peak_bytes: rise of torch.cuda.max_memory_allocated over one call, output included; "
                 "traffic_bytes_model: textbook (standard) or FlashAttention-2 with 128-row query tiles (sdpa) "
                 "HBM bytes for all heads; traffic_bytes_eager: bytes the eager standard code moves, one kernel "
                 "per op, fp32 softmax; matmul bytes_model: A, B read and C written once",
        "sdpa_backends_enabled": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                                  "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                                  "cudnn": getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: None)(),
                                  "math": torch.backends.cuda.math_sdp_enabled()},
    }
    result = {"meta": meta, "copy": bench_copy(torch, bench, args.copy_gib), "matmul": bench_matmul(torch, bench),
              "attention": bench_attention(torch, bench, args.seq_lens, 1, args.heads, 128)}
    meta["sdpa_kernels"] = sdpa_kernels(torch, heads=args.heads)
    print_report(result)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    return 0


def host_us(fn, calls=200):
    """Microseconds of host time per call: Python issuing ``calls`` calls, the GPU left to catch up after."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()  # before the sync: only the time Python spent issuing the calls
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def launch_overhead(out) -> int:
    import torch

    if not torch.cuda.is_available():
        sys.exit("the hardware suite's launch part needs a CUDA GPU")
    from minillm.kernels.flash_attention import flash_attention

    meta, rows = run_meta(dtype="bfloat16", B=4, H=32), []
    for d in (64, 128):
        for n in (1024, 4096):
            for causal in (False, True):
                q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                fns = {"minillm": lambda: flash_attention(q, k, v, causal=causal)}
                fns |= {name: sdpa_provider(name, q, k, v, causal) for name in ("sdpa_flash", "sdpa_cudnn")}
                for prov, fn in fns.items():
                    row = {"D": d, "N": n, "causal": causal, "provider": prov, "plain_ms": median_ms(fn),
                           "graph_ms": median_ms_cudagraph(fn), "host_us": host_us(fn)}
                    rows.append(row)
                    print(f"D={d:3d} N={n:5d} causal={causal!s:5s} {prov:11s} plain {row['plain_ms']:.3f} ms  "
                          f"graph {row['graph_ms']:.3f} ms  host {row['host_us']:.0f} us", flush=True)
                    write_results(out, meta, rows)
    return 0
