"""Sweep the forward kernel's versions and tile configs on the GPU; report speed and the compiler's resource use.

    python benchmarks/flash_attention_tune.py --out benchmarks/results/flash_attention_tune_h200.json
    python benchmarks/flash_attention_tune.py --impls v1 v2 v3 v4 v5 --seq-lens 1024 4096 --out ...

For each (D, causal, N) at bf16, B=4, H=32, every (version, config) -- config = (BLOCK_M, BLOCK_N,
num_warps, num_stages), plus programs per SM for the persistent versions v4/v5 -- is checked against
cuDNN's output (a wrong config is reported, never timed as a win) and timed; cuDNN and FA2 are timed
at the same point, in the same process. The best per (D, causal) is what ``_blocks`` and
``fwd_plan`` in minillm/kernels/flash_attention.py use. Registers, spills and shared memory
come from the compiled kernel, as the compiler reports them. A config that fails to compile (out of
resources, a warp-specialization compile error) is recorded with its error and skipped.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)

from _common import apply_settings, median_ms, median_ms_cudagraph, run_meta, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

CONFIGS = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages)
    64: [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 4, 2), (128, 128, 4, 3), (128, 128, 8, 3),
         (64, 64, 4, 3), (128, 32, 4, 4), (64, 128, 4, 3)],
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3),
          (64, 64, 4, 3), (128, 32, 8, 4), (64, 128, 4, 2)],
}
# the TMA versions get the configs that won or came close with v1, and the deeper pipelines that TMA's
# lower register use may now afford
TMA_CONFIGS = {
    64: [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3), (128, 128, 4, 3)],
    128: [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 128, 4, 2)],
}
WS_CONFIGS = {  # warp specialization: the producer warp group holds few registers, the consumers the rest
    64: [(128, 64, 4, 3), (128, 128, 4, 2), (128, 64, 8, 3), (128, 128, 8, 3)],
    128: [(128, 128, 8, 2), (128, 64, 8, 3), (128, 128, 4, 2), (128, 64, 4, 3)],
}


def candidates(impl: str, d: int, only=None):
    """(config, programs_per_sm) pairs to try for one version; ``only`` ("v1:64,64,4,3", "v5:128,128,4,2x2")
    replaces the built-in lists."""
    if only:
        out = []
        for spec in only:
            name, _, rest = spec.partition(":")
            cfg, _, per_sm = rest.partition("x")
            if name == impl:
                out.append((tuple(int(x) for x in cfg.split(",")), int(per_sm or 1)))
        return out
    if impl == "v1":
        return [(c, 1) for c in CONFIGS.get(d, [])]
    if impl == "v2":
        return [(c, 1) for c in TMA_CONFIGS.get(d, [])]
    if impl in ("v3", "v6"):
        return [(c, 1) for c in WS_CONFIGS.get(d, [])]
    base = TMA_CONFIGS if impl == "v4" else WS_CONFIGS
    return [(c, p) for c in base.get(d, [])[:3] for p in (1, 2)]


def repeat_check(d, n, causal, cfg, impl, per_sm, repeats):
    """Max |o - cuDNN| over ``repeats`` fresh random inputs (B=2, H=8, so it stays cheap)."""
    diffs = []
    for _ in range(repeats):
        q, k, v = (torch.randn(2, 8, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            want = sdpa(q, k, v, is_causal=causal).float()
        o, _ = fa._forward(q, k, v, causal, d ** -0.5, config=cfg, impl=impl, programs_per_sm=per_sm,
                           need_lse=False)
        diffs.append(float((o.float() - want).abs().max()))
    return diffs


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--impls", nargs="+", default=["v1"], choices=fa.FWD_IMPLS)
    ap.add_argument("--causal", nargs="+", default=["False", "True"], choices=["False", "True"])
    ap.add_argument("--only", nargs="*", help="impl:BM,BN,warps,stages[xP] specs to try instead of the lists")
    ap.add_argument("--host-desc", type=int, nargs="+", default=[0], choices=[0, 1],
                    help="TMA versions: descriptors built in the kernel (0) and/or made on the host (1)")
    ap.add_argument("--cudagraph", action="store_true",
                    help="time every provider by CUDA-graph replays (no host launch cost in any time)")
    ap.add_argument("--repeats", type=int, default=10, help="fresh-input rechecks of each warp-specialized config")
    ap.add_argument("--fa-set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="set constants of minillm.kernels.flash_attention first (a Python literal each; recorded)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flash_attention_tune.py needs a CUDA GPU")
    fa_set = apply_settings(fa, args.fa_set)
    B, H = 4, 32
    timer = median_ms_cudagraph if args.cudagraph else median_ms
    meta = run_meta(dtype="bfloat16", B=B, H=H, timing=("triton.testing.do_bench_cudagraph" if args.cudagraph
                                                        else "triton.testing.do_bench") + ", return_mode=median",
                    flops="4*B*H*N^2*D (x0.5 causal)", fa_set=fa_set)
    rows = []

    def save(row):
        rows.append(row)
        write_results(args.out, meta, rows)

    print(f"{'D':>4s} {'N':>6s} {'causal':>6s} {'impl':>4s} {'BM':>4s} {'BN':>4s} {'warps':>5s} {'stages':>6s} "
          f"{'p/SM':>4s} {'TFLOP/s':>8s} {'regs':>5s} {'spills':>6s} {'smem KiB':>8s}  check", flush=True)
    host_default = fa.TMA_HOST_DESCRIPTORS

    def hosts(impl):  # v1 has no descriptors; v6 makes its own (its first launch writes a scratch buffer)
        return [0] if impl == "v1" or impl in fa.SPLIT_IMPLS else args.host_desc
    for d in args.head_dims:
        for causal in (c == "True" for c in args.causal):
            for n in args.seq_lens:
                q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    want = sdpa(q, k, v, is_causal=causal).float()
                for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                      ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
                    def run_sdpa():
                        with sdpa_kernel(backend):
                            return sdpa(q, k, v, is_causal=causal)
                    ms = timer(run_sdpa)
                    save({"D": d, "N": n, "causal": causal, "provider": name, "ms": ms,
                          "tflops": flops / (ms * 1e-3) / 1e12})
                    print(f"{d:4d} {n:6d} {str(causal):>6s} {name}: {rows[-1]['tflops']:8.1f}", flush=True)
                for impl, cfg, per_sm, host in ((i, c, p, h) for i in args.impls for c, p in candidates(i, d, args.only)
                                                for h in hosts(i)):
                        fa.TMA_HOST_DESCRIPTORS = bool(host)
                        row = {"D": d, "N": n, "causal": causal, "provider": "minillm", "impl": impl,
                               "config": cfg, "programs_per_sm": per_sm, "host_desc": bool(host)}
                        run = lambda: fa._forward(q, k, v, causal, d ** -0.5, config=cfg, impl=impl,  # noqa: E731
                                                  programs_per_sm=per_sm, need_lse=False)
                        try:
                            o, _ = run()
                            kern = fa.last_forward_kernel
                            row.update(ran=fa.last_forward_impl,
                                       max_abs_diff_vs_cudnn=float((o.float() - want).abs().max()),
                                       regs=getattr(kern, "n_regs", None), spills=getattr(kern, "n_spills", None),
                                       shared_bytes=getattr(getattr(kern, "metadata", None), "shared", None))
                            row["ok"] = row["max_abs_diff_vs_cudnn"] < 2e-2 and row["ran"] == impl
                            if impl in fa.WS_IMPLS and row["ok"]:  # a warp-specialization race shows up as
                                row["repeat_diffs"] = repeat_check(d, n, causal, cfg, impl, per_sm, args.repeats)
                                row["ok"] = max(row["repeat_diffs"]) < 2e-2  # a rare wrong result: recheck
                            ms = timer(run)
                            row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
                        except Exception as e:  # out of resources, a compile error: record, go on
                            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[:160]}")
                        save(row)
                        smem = row.get("shared_bytes")
                        print(f"{d:4d} {n:6d} {str(causal):>6s} {impl:>4s} {cfg[0]:4d} {cfg[1]:4d} {cfg[2]:5d} "
                              f"{cfg[3]:6d} {per_sm:4d} {row.get('tflops') or float('nan'):8.1f} "
                              f"{row.get('regs') or -1:5d} {row.get('spills') or 0:6d} {(smem or 0) / 1024:8.0f}  "
                              f"{'ok' if row['ok'] else row.get('error', 'WRONG')[:60]}"
                              + ("  host descriptors" if host else ""), flush=True)
                        fa.TMA_HOST_DESCRIPTORS = host_default
                del q, k, v, want
    print("\nbest per point (TFLOP/s; ratio to cuDNN, to FA2):", flush=True)
    for d in args.head_dims:
        for causal in (c == "True" for c in args.causal):
            for n in args.seq_lens:
                at = [r for r in rows if r["D"] == d and r["N"] == n and r["causal"] == causal]
                ref = {r["provider"]: r["tflops"] for r in at if r["provider"] != "minillm"}
                line = []
                for impl, host in ((i, h) for i in args.impls for h in hosts(i)):
                    good = [r for r in at if r.get("impl") == impl and r.get("ok") and r.get("tflops")
                            and r.get("host_desc", False) == bool(host)]
                    name = impl + ("h" if host else "")
                    if good:
                        b = max(good, key=lambda r: r["tflops"])
                        line.append(f"{name} {b['tflops']:.0f} {tuple(b['config'])}x{b['programs_per_sm']} "
                                    f"({b['tflops'] / ref['sdpa_cudnn']:.2f}, {b['tflops'] / ref['sdpa_flash']:.2f})")
                    else:
                        line.append(f"{name} -")
                print(f"D={d} N={n} causal={causal}: cudnn {ref['sdpa_cudnn']:.0f} fa2 {ref['sdpa_flash']:.0f} | "
                      + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
