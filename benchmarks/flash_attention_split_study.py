"""Where the causal forward v6's time goes: its two launches apart, over settings of the second.

    python benchmarks/flash_attention_split_study.py --out benchmarks/results/flash_attention_split_study_h200.json

v6 runs the causal forward in two launches (minillm/kernels/flash_attention.py): the unmasked key tiles,
warp-specialized, then the diagonal resumed from the partial O and the LSE. For each length (causal, D=128,
bf16, B=4, H=32) and each setting of the second launch -- its tiles and warps (``RESUME_CONFIG``) and
whether the partial O is float32 (``SPLIT_PARTIAL_FP32``) -- it checks v6 against cuDNN's output, then
times the whole call, the first launch alone and the second alone. The default forward (``fwd_plan``),
cuDNN and FA2 are timed at the same point in the same process. The launches alone replay from CUDA graphs
(GPU time); the whole call is timed both from a CUDA graph and eagerly.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)

from _common import median_ms, median_ms_cudagraph, run_meta, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

SETTINGS = [  # (RESUME_CONFIG, SPLIT_PARTIAL_FP32)
    ((64, 64, 4, 2), True), ((64, 64, 4, 3), True), ((64, 128, 4, 2), True), ((128, 128, 8, 2), True),
    ((32, 64, 4, 2), True), ((64, 64, 4, 2), False)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--settings", type=int, default=len(SETTINGS), help="the first this many of SETTINGS")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flash_attention_split_study.py needs a CUDA GPU")
    B, H, D = 4, 32, 128
    meta = run_meta(dtype="bfloat16", B=B, H=H, D=D, causal=True, flops="2*B*H*N^2*D",
                    timing="median ms; *_graph from triton.testing.do_bench_cudagraph, eager from do_bench")
    rows = []
    saved = fa.RESUME_CONFIG, fa.SPLIT_PARTIAL_FP32
    for n in args.seq_lens:
        q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 2 * B * H * n * n * D
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            want = sdpa(q, k, v, is_causal=True).float()

        def timed(name, fn, **extra):
            ms, ms_graph = median_ms(fn), median_ms_cudagraph(fn)
            rows.append({"N": n, "provider": name, "ms": ms, "ms_graph": ms_graph, "tflops": flops / ms / 1e9,
                         "tflops_graph": flops / ms_graph / 1e9, **extra})
            write_results(args.out, meta, rows)
            print(f"N={n:6d} {name:10s} {extra.get('setting', '')!s:24s} eager {flops / ms / 1e9:6.1f} "
                  f"graph {flops / ms_graph / 1e9:6.1f} TFLOP/s", flush=True)

        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def run_sdpa(backend=backend):
                with sdpa_kernel(backend):
                    return sdpa(q, k, v, is_causal=True)
            timed(name, run_sdpa)
        fa.clear_plans()
        fa._forward(q, k, v, True, D ** -0.5)  # what the default runs here, recorded with its times
        timed("default", lambda: fa._forward(q, k, v, True, D ** -0.5), ran=fa.last_forward_impl)
        for resume, fp32 in SETTINGS[:args.settings]:
            fa.RESUME_CONFIG, fa.SPLIT_PARTIAL_FP32 = resume, fp32
            fa.clear_plans()
            setting = {"resume_config": list(resume), "partial_fp32": fp32}
            try:
                o, _ = fa._forward(q, k, v, True, D ** -0.5, impl="v6")
                ran = fa.last_forward_impl
                chain = next(p[1] for p in fa._plans.values() if isinstance(p[1], fa._Chain))
                diff = float((o.float() - want).abs().max())
                timed("v6", lambda: fa._forward(q, k, v, True, D ** -0.5, impl="v6"), setting=setting, ran=ran,
                      max_abs_diff_vs_cudnn=diff)
                o2 = torch.empty_like(o)
                part = torch.empty_like(o, dtype=torch.float32) if chain.fp32 else o2
                lse = torch.empty((B, H, n), device="cuda", dtype=torch.float32)
                for part_name, bound, fn in (("v6_first", chain.first, lambda: chain.first(q, k, v, part, lse)),
                                             ("v6_second", chain.second, lambda: chain.second(q, k, v, o2, lse, part))):
                    ms_graph = median_ms_cudagraph(fn)
                    kern = bound.compiled
                    rows.append({"N": n, "provider": part_name, "setting": setting, "ms_graph": ms_graph,
                                 "regs": getattr(kern, "n_regs", None), "spills": getattr(kern, "n_spills", None),
                                 "shared_bytes": getattr(getattr(kern, "metadata", None), "shared", None)})
                    write_results(args.out, meta, rows)
                    print(f"N={n:6d} {part_name:10s} {setting!s:24s} graph {ms_graph:.3f} ms", flush=True)
            except Exception as e:  # a setting that does not compile or fit: record it, go on
                rows.append({"N": n, "provider": "v6", "setting": setting, "error": f"{type(e).__name__}: {str(e)[:160]}"})
                write_results(args.out, meta, rows)
                print(f"N={n:6d} v6 {setting} failed: {rows[-1]['error']}", flush=True)
        fa.RESUME_CONFIG, fa.SPLIT_PARTIAL_FP32 = saved
        del q, k, v, want


if __name__ == "__main__":
    main()
