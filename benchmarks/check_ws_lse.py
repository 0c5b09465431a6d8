"""Does a warp-specialized forward write its log-sum-exp when it stores it another way?

    python benchmarks/check_ws_lse.py --out benchmarks/results/ws_lse_h200.json

Compiled with warp specialization, Triton 3.6 leaves the LSE of forward v3 and v5 unwritten
(results/forward_repeats_lse_h200.json). For each store variant of ``_fwd_tile_tma`` (0: pointers from
the row offsets computed before the key loop, as shipped; 1: offsets recomputed after the loop; 2: a
1-D tensor descriptor) and each TMA version, the LSE buffer is filled with NaN, the forward runs
``--calls`` times on fresh inputs, and each call's LSE and output are compared with float64. bf16, B=1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minillm.kernels import flash_attention as fa  # noqa: E402

from _common import poison, run_meta, worse, write_results  # noqa: E402


def reference(q, k, v, scale):
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--impls", nargs="+", default=["v2", "v3", "v4", "v5"])
    args = ap.parse_args(argv)
    meta = run_meta(dtype="bfloat16", batch=1, heads=args.heads, head_dim=128, calls=args.calls)
    rows = []
    for n in args.seq_lens:
        for variant in (0, 1, 2):
            for impl in args.impls:
                row = {"N": n, "lse_store": variant, "impl": impl, "calls": args.calls, "lse_wrong": 0, "o_wrong": 0,
                       "lse_err": 0.0, "o_err": 0.0}
                try:
                    for call in range(args.calls):
                        g = torch.Generator(device="cuda").manual_seed(1000 * n + 10 * call + variant)
                        q, k, v = (torch.randn(1, args.heads, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                                   for _ in range(3))
                        poison(args.heads * n * 4)  # the float32 lse's block
                        o, lse = fa._forward(q, k, v, False, 128 ** -0.5, impl=impl, need_lse=False, lse_store=variant)
                        want_o, want_lse = reference(q, k, v, 128 ** -0.5)
                        row["ran"] = fa.last_forward_impl
                        e = float("nan") if lse is None else float((lse.double() - want_lse).abs().max())
                        row["lse_err"] = worse(row["lse_err"], e)
                        row["lse_wrong"] += int(not e <= 1e-2)
                        e = float((o.double() - want_o).abs().max())
                        row["o_err"] = worse(row["o_err"], e)
                        row["o_wrong"] += int(not e <= 2e-2)
                except Exception as ex:  # noqa: BLE001  (a variant that does not compile is a result too)
                    row["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
                rows.append(row)
                write_results(args.out, meta, rows)
                print(f"N={n:5d} store={variant} {impl} ran {row.get('ran')}: lse wrong {row['lse_wrong']}/{row['calls']} "
                      f"(max err {row['lse_err']:.1e}), o wrong {row['o_wrong']}/{row['calls']} {row.get('error', '')}",
                      flush=True)


if __name__ == "__main__":
    main()
