"""Sweep the forward kernel's tile configs on the GPU and report speed and the compiler's resource use.

    python benchmarks/flash_attention_tune.py --out benchmarks/results/flash_attention_tune_h200.json

For each (D, causal) at bf16, B=4, H=32, N=4096, every config (BLOCK_M, BLOCK_N, num_warps,
num_stages) is checked against cuDNN's output (a wrong config is reported, never timed as a win)
and timed; the best per (D, causal) is what ``_blocks`` in minillm/kernels/flash_attention.py uses.
Registers, spills and shared memory come from the compiled kernel, as the compiler reports them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)

from _common import median_ms, run_meta  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

CONFIGS = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 4, 2), (128, 128, 4, 3), (128, 128, 8, 3),
         (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 3)],
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3),
          (64, 64, 4, 3), (128, 32, 8, 4), (64, 128, 4, 2)],
}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flash_attention_tune.py needs a CUDA GPU")
    B, H, N = 4, 32, args.seq_len
    meta = run_meta(dtype="bfloat16", B=B, H=H, N=N, timing="triton.testing.do_bench, return_mode=median")
    rows = []
    print(f"{'D':>4s} {'causal':>6s} {'BM':>4s} {'BN':>4s} {'warps':>5s} {'stages':>6s} {'TFLOP/s':>8s} "
          f"{'regs':>5s} {'spills':>6s} {'smem KiB':>8s}  check")
    for d in args.head_dims:
        for causal in (False, True):
            q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                want = sdpa(q, k, v, is_causal=causal).float()
            flops = 4 * B * H * N * N * d * (0.5 if causal else 1.0)
            for cfg in CONFIGS.get(d, []):
                row = {"D": d, "causal": causal, "config": cfg}
                try:
                    o, _ = fa._forward(q, k, v, causal, d ** -0.5, config=cfg)
                    kern = fa.last_forward_kernel
                    row.update(max_abs_diff_vs_cudnn=float((o.float() - want).abs().max()),
                               regs=getattr(kern, "n_regs", None), spills=getattr(kern, "n_spills", None),
                               shared_bytes=getattr(getattr(kern, "metadata", None), "shared", None))
                    row["ok"] = row["max_abs_diff_vs_cudnn"] < 2e-2
                    ms = median_ms(lambda: fa._forward(q, k, v, causal, d ** -0.5, config=cfg))
                    row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
                except Exception as e:  # e.g. out of shared memory for this tile shape: record, go on
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:160]}")
                rows.append(row)
                smem = row.get("shared_bytes")
                print(f"{d:4d} {str(causal):>6s} {cfg[0]:4d} {cfg[1]:4d} {cfg[2]:5d} {cfg[3]:6d} "
                      f"{row.get('tflops') or float('nan'):8.1f} {row.get('regs') or -1:5d} {row.get('spills') or 0:6d} "
                      f"{(smem or 0) / 1024:8.0f}  {'ok' if row['ok'] else row.get('error', 'WRONG')[:50]}", flush=True)
                if args.out:
                    with open(args.out, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    for d in args.head_dims:
        for causal in (False, True):
            good = [r for r in rows if r["D"] == d and r["causal"] == causal and r["ok"] and r.get("tflops")]
            if good:
                best = max(good, key=lambda r: r["tflops"])
                print(f"best D={d} causal={causal}: {tuple(best['config'])} {best['tflops']:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
