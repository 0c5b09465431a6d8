"""Repeat each forward version many times on poisoned memory and compare every call with cuDNN.

    python benchmarks/check_forward_repeats.py --out benchmarks/results/forward_repeats_h200.json

A kernel that skips a tile, or a warp-specialized pipeline with a race, can be right on one call
and wrong on the next. Before each call the caching allocator is handed a NaN-filled block of the
output's size, which the call's output then reuses: an unwritten tile shows up as NaN instead of
as whatever the block held. Each row: version, shape, calls, how many calls were wrong (max abs
difference from cuDNN over 2x the tolerance of the bf16 output, or non-finite), the worst
difference, the same for the log-sum-exp the backward reads (against float64), and for the backward
rows the same for the gradients (through autograd, behind each forward of --bwd-fwd-impls). bf16, B=4, H=32.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minillm.kernels import flash_attention as fa  # noqa: E402

from _common import poison, run_meta, worse, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def cudnn(q, k, v, causal):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--impls", nargs="+", default=list(fa.FWD_IMPLS) + ["default"])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--bwd-impls", nargs="*", default=[], help="also check gradients of these backward versions")
    ap.add_argument("--bwd-fwd-impls", nargs="+", default=["v1", "default"], help="the forward before each backward")
    ap.add_argument("--tol", type=float, default=2e-2, help="max abs difference from cuDNN counted as right")
    args = ap.parse_args(argv)
    rows = []
    meta = run_meta(dtype="bfloat16", batch=4, heads=32, calls=args.calls, tol=args.tol)
    for d in args.head_dims:
        for n in args.seq_lens:
            for causal in (False, True):
                g = torch.Generator(device="cuda").manual_seed(n + d + causal)
                q, k, v, do = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                               for _ in range(4))
                want = cudnn(q, k, v, causal)
                # the log-sum-exp the backward reads: float64 math on the same inputs
                want_lse = torch.empty(q.shape[:3], device="cuda", dtype=torch.float64)
                future = torch.ones(n, n, device="cuda", dtype=torch.bool).triu(1)
                for b in range(q.shape[0]):  # a head group at a time: N=8K in float64 is 0.5 GB per head
                    for h in range(0, q.shape[1], 8):
                        s = (q[b, h:h + 8].double() @ k[b, h:h + 8].double().transpose(-1, -2)) * d ** -0.5
                        want_lse[b, h:h + 8] = torch.logsumexp(s.masked_fill(future, float("-inf")) if causal else s,
                                                               dim=-1)
                del s, future
                for impl in args.impls:
                    bad, worst, bad_lse, worst_lse, ran = 0, 0.0, 0, 0.0, set()
                    for _ in range(args.calls):
                        poison(q.numel() * 2)
                        poison(q.numel() // d * 4)
                        o, lse = fa.flash_attention(q, k, v, causal=causal, return_lse=True,
                                                    fwd_impl=None if impl == "default" else impl)
                        ran.add(fa.last_forward_impl)
                        err = (o.float() - want.float()).abs().max().item()
                        err_lse = (lse.double() - want_lse).abs().max().item()
                        bad += not err <= args.tol  # NaN counts as wrong
                        bad_lse += not err_lse <= args.tol
                        worst, worst_lse = worse(worst, err), worse(worst_lse, err_lse)
                    row = dict(D=d, N=n, causal=causal, impl=impl, ran=sorted(ran), calls=args.calls, wrong=bad,
                               worst=worst, wrong_lse=bad_lse, worst_lse=worst_lse)
                    rows.append(row)
                    print(f"D={d:3d} N={n:5d} causal={causal!s:5s} fwd {impl:7s} ran {','.join(sorted(ran)):5s} "
                          f"wrong {bad:2d}/{args.calls} worst {worst:.2e} | lse wrong {bad_lse:2d} worst "
                          f"{worst_lse:.2e}", flush=True)
                if args.bwd_impls:
                    qr, kr, vr = (t.detach().requires_grad_() for t in (q, k, v))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                        gw = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(
                            qr, kr, vr, is_causal=causal), (qr, kr, vr), do)
                    for bimpl, fimpl in [(b, f) for b in args.bwd_impls for f in args.bwd_fwd_impls]:
                        bad, worst = 0, 0.0
                        for _ in range(max(1, args.calls // 4)):
                            poison(q.numel() // d * 4)
                            o = fa.flash_attention(qr, kr, vr, causal=causal, bwd_impl=bimpl,
                                                   fwd_impl=None if fimpl == "default" else fimpl)
                            poison(q.numel() * 4)
                            got = torch.autograd.grad(o, (qr, kr, vr), do)
                            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, gw))
                            bad += not err <= 10 * args.tol
                            worst = worse(worst, err)
                        row = dict(D=d, N=n, causal=causal, bwd_impl=bimpl, fwd_impl=fimpl, fwd_ran=fa.last_forward_impl,
                                   path=fa.last_backward_path, calls=max(1, args.calls // 4), wrong=bad, worst=worst)
                        rows.append(row)
                        print(f"D={d:3d} N={n:5d} causal={causal!s:5s} bwd {bimpl:7s} (fwd {fimpl}) wrong "
                              f"{bad:2d}/{row['calls']} worst {worst:.2e}", flush=True)
                write_results(args.out, meta, rows)
                del q, k, v, do, want
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
