"""How much of a short forward call is the host? Kernel time (CUDA-graph replay) vs a plain call.

    python benchmarks/launch_overhead.py --out benchmarks/results/launch_overhead_h200.json

For minillm's flash forward and SDPA's backends at bf16, B=4, H=32, D=64/128, N=1024 (and 4096 for
contrast): ``plain_ms`` is do_bench on ordinary calls (what flash_attention_bench.py reports),
``graph_ms`` the same call replayed from a CUDA graph (no Python, no launch cost), and ``host_us`` the
wall time of one Python call with the GPU idle (averaged over many calls, synchronizing once).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels.flash_attention import flash_attention  # noqa: E402  (first: interpreter vs compiled)

from _common import median_ms, median_ms_cudagraph, run_meta, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402


def host_us(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()  # before the sync: only the time Python spent issuing the calls
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("launch_overhead.py needs a CUDA GPU")
    meta, rows = run_meta(dtype="bfloat16", B=4, H=32), []
    for d in (64, 128):
        for n in (1024, 4096):
            for causal in (False, True):
                q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                fns = {"minillm": lambda: flash_attention(q, k, v, causal=causal)}
                for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                    def run(be=be):
                        with sdpa_kernel(be):
                            return sdpa(q, k, v, is_causal=causal)
                    fns[name] = run
                for prov, fn in fns.items():
                    row = {"D": d, "N": n, "causal": causal, "provider": prov, "plain_ms": median_ms(fn),
                           "graph_ms": median_ms_cudagraph(fn), "host_us": host_us(fn)}
                    rows.append(row)
                    print(f"D={d:3d} N={n:5d} causal={causal!s:5s} {prov:11s} plain {row['plain_ms']:.3f} ms  "
                          f"graph {row['graph_ms']:.3f} ms  host {row['host_us']:.0f} us", flush=True)
                    write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
