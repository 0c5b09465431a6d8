"""Backward versions (v1-v5) of minillm's FlashAttention against SDPA (FA2, cuDNN) and flex_attention, one process.

    python benchmarks/flash_attention_bwd_bench.py --out benchmarks/results/flash_attention_bwd_h200.json

bf16, B=4, H=32 (GQA: --kv-heads), causal and not, at the (D, N) points given (default D=128 N=1024/4096
and D=64 N=4096). Two timings per provider: ``fwd+bwd`` (forward, then backward of a fixed dO, as
flash_attention_bench.py times it) and ``bwd`` (the backward alone, from saved forward state). TFLOP/s
count useful FLOPs: forward 4*B*H*N^2*D (x0.5 causal), backward 2.5x that, fwd+bwd 3.5x.

Every minillm row also records its gradients' largest difference from cuDNN's (else FA2's), so a
fast wrong kernel shows up as wrong. ``--sweep`` adds backward v2 tile configs at one point with the
compiler's registers, spills and shared memory, for each version in --sweep-impls (v4 configs carry a
second (num_warps, num_stages) for its dQ launch; v5 configs a flag for rotating the query tiles' order). Each row is written to --out as soon as it is
measured; a provider that fails is recorded with its error and the run goes on.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)
from minillm.kernels import launch  # noqa: E402

from _common import apply_settings, median_ms, median_ms_cudagraph, run_meta, write_results  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
# (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages); the first is flex's sm90 default. Four-warp
# configs with N1=128 at D=128 spill kilobytes (benchmarks/aot_resources.py), so they are left out.
SWEEP = [(64, 128, 128, 64, 8, 3), (64, 128, 128, 64, 8, 2), (64, 128, 128, 64, 8, 4), (64, 64, 64, 64, 4, 3),
         (64, 64, 64, 64, 8, 3), (64, 128, 64, 64, 8, 3), (128, 128, 128, 128, 8, 2), (32, 64, 64, 32, 4, 3)]
SWEEP_TMA = [(64, 128, 128, 64, 8, 3), (64, 128, 128, 64, 8, 4), (32, 128, 128, 64, 8, 3), (32, 64, 64, 32, 4, 3),
             (64, 128, 128, 128, 8, 3), (32, 128, 128, 32, 8, 4)]
SWEEP_SPLIT = [(64, 128, 128, 64, 8, 3, 8, 3), (64, 128, 128, 64, 8, 3, 4, 3), (32, 128, 128, 64, 8, 3, 8, 2),
               (64, 128, 64, 64, 8, 3, 4, 3), (32, 64, 64, 64, 4, 3, 4, 3), (64, 128, 128, 128, 8, 4, 8, 2)]
# v5 has no dQ side: (M1, N1, M1, N1, warps, stages, rotate); FA3's sm90 tile (64 x 128, two consumer warp groups)
# first, then rotation off, deeper pipelines, and smaller tiles
SWEEP_ATOMIC = [(64, 128, 64, 128, 8, 2, 1), (64, 128, 64, 128, 8, 2, 0), (64, 128, 64, 128, 8, 3, 1),
                (32, 128, 32, 128, 8, 3, 1), (64, 64, 64, 64, 4, 3, 1), (64, 64, 64, 64, 8, 3, 1),
                (128, 128, 128, 128, 8, 2, 1), (32, 64, 32, 64, 4, 3, 1)]
# v6: v4 with its dK/dV side in one warp-specialized loop; 4 warps there become a producer and two consumer warp
# groups (12 warps; benchmarks/aot_resources.py --impl v6); the dQ launch as v4's
SWEEP_WS = [(64, 128, 128, 64, 4, 2, 8, 3), (64, 128, 128, 64, 4, 3, 8, 3), (32, 128, 128, 64, 4, 3, 8, 3),
            (64, 64, 128, 64, 4, 2, 8, 3), (64, 128, 128, 64, 4, 2, 4, 3)]
SWEEPS = {"v2": SWEEP, "v3": SWEEP_TMA, "v4": SWEEP_SPLIT, "v5": SWEEP_ATOMIC, "v6": SWEEP_WS}


def forward_fn(name, causal, gqa):
    """A function (q, k, v) -> o for one provider; flex and minillm handle GQA natively, SDPA via enable_gqa."""
    if name.startswith("minillm"):  # "minillm": the default plans; "minillm_vN": backward version N;
        # "minillm_jit": the default versions launched through Triton's binder (main turns launch.FAST_LAUNCH
        # off); "minillm_noplans": through fast_launch, deciding every call anew (main turns fa.PLANS off;
        # in results/flash_attention_n1k_plans*_h200.json that path also classed each launch's arguments twice)
        impl = name.split("_", 1)[1] if "_" in name and name not in ("minillm_jit", "minillm_noplans") else None
        return lambda q, k, v: fa.flash_attention(q, k, v, causal=causal, bwd_impl=impl)
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        for knob in ("recompile_limit", "cache_size_limit"):  # one compile per shape; never fall back to eager
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 256)
        # the backward-alone timing replays one graph (retain_graph=True), which a compiled backward with
        # donated buffers refuses ("non-empty donated buffers"): turn donation off before compiling
        torch._functorch.config.donated_buffer = False
        compiled = torch.compile(flex_attention)
        masks = {}

        def run(q, k, v):
            mask = None
            if causal:
                n = q.shape[2]
                if n not in masks:
                    masks[n] = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
                mask = masks[n]
            return compiled(q, k, v, block_mask=mask, enable_gqa=gqa)
        return run
    backend = BACKENDS[name]

    def run(q, k, v):
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


def grads(fn, q, k, v, do):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return out, torch.autograd.grad(out, (q, k, v), do)


def time_provider(fn, q, k, v, do, graphs: bool = False):
    """(ms fwd+bwd, ms bwd alone, ms fwd+bwd replayed from a CUDA graph or None). The eager times are what a
    training loop sees, host launch costs included; the graph time is the GPU's alone."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def fwd_bwd():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)
    ms_fb = median_ms(fwd_bwd, warmup=25, rep=150)
    ms_graph = median_ms_cudagraph(fwd_bwd) if graphs else None
    out = fn(q, k, v)
    ms_b = median_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), warmup=25, rep=150)
    return ms_fb, ms_b, ms_graph


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["128:1024", "128:4096", "64:4096"], help="D:N pairs")
    ap.add_argument("--providers", nargs="+", default=["minillm_v1", "minillm_v2", "minillm_v3", "minillm_v4",
                                                          "minillm_v5", "minillm_v6", "sdpa_flash", "sdpa_cudnn"])
    ap.add_argument("--flex-points", nargs="*", default=["128:4096"], help="D:N pairs that also time flex")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None, help="KV heads (GQA); default = --heads")
    ap.add_argument("--sweep", nargs="*", default=["128:4096"], help="D:N points of the backward tile sweep")
    ap.add_argument("--graphs", action="store_true", help="also time fwd+bwd replayed from a CUDA graph")
    ap.add_argument("--ws-lse-store", type=int, default=None, choices=[0, 1, 2],
                    help="set flash_attention.WS_LSE_STORE (how warp-specialized forwards store the LSE)")
    ap.add_argument("--sweep-impls", nargs="+", default=["v2"], choices=list(SWEEPS))
    ap.add_argument("--fa-set", nargs="*", default=[], metavar="NAME=VALUE",
                    help="set constants of minillm.kernels.flash_attention first (a Python literal each; recorded)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flash_attention_bwd_bench.py needs a CUDA GPU")
    if args.ws_lse_store is not None:
        fa.WS_LSE_STORE = args.ws_lse_store
    fa_set = apply_settings(fa, args.fa_set)
    B, H = args.batch, args.heads
    Hkv = args.kv_heads or H
    meta = run_meta(dtype="bfloat16", batch=B, heads=H, kv_heads=Hkv,
                    timing="triton.testing.do_bench, return_mode=median (ms)",
                    flops="fwd 4*B*H*N^2*D (x0.5 causal); bwd 2.5x fwd; fwd+bwd 3.5x fwd",
                    default_bwd_blocks={d: fa._bwd_blocks(d, torch.bfloat16) for d in (64, 128)},
                    ws_lse_store=fa.WS_LSE_STORE, fa_set=fa_set)
    rows = []

    def save(row):
        rows.append(row)
        write_results(args.out, meta, rows)

    print(f"{'D':>4s} {'N':>6s} {'causal':>6s} {'provider':12s} {'fb ms':>8s} {'fb TF/s':>8s} {'bwd ms':>8s} "
          f"{'bwd TF/s':>8s}  grad diff", flush=True)
    points = [tuple(map(int, p.split(":"))) for p in args.points]
    flex_points = {tuple(map(int, p.split(":"))) for p in args.flex_points}
    # flex compiles for tens of seconds per shape: its points run last, so a slow compile cuts only them short
    runs = [(d, n, list(args.providers)) for d, n in points] + [(d, n, ["flex"]) for d, n in sorted(flex_points)]
    for i_run, (d, n, providers) in enumerate(runs):
        if i_run == len(points) and args.sweep:
            sweep(args, B, H, Hkv, save)
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(d + n + causal)
            q = torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, Hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            do = torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            fwd_flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
            want = None
            for name in ("sdpa_cudnn", "sdpa_flash"):  # the reference gradients for the minillm rows
                try:
                    want = grads(forward_fn(name, causal, Hkv != H), q, k, v, do)[1]
                    ref_name = name
                    break
                except Exception:
                    continue
            for name in providers:
                row = {"D": d, "N": n, "causal": causal, "provider": name}
                launch.FAST_LAUNCH, fa.PLANS = name != "minillm_jit", name != "minillm_noplans"
                try:
                    fn = forward_fn(name, causal, Hkv != H)
                    if name.startswith("minillm") and want is not None:
                        got = grads(fn, q, k, v, do)[1]
                        row["max_abs_grad_diff"] = {f"d{x}": float((a.float() - b.float()).abs().max())
                                                    for x, a, b in zip("qkv", got, want)}
                        row["grad_reference"] = ref_name
                    ms_fb, ms_b, ms_graph = time_provider(fn, q, k, v, do, args.graphs and name != "flex")
                    row.update(ms_fwd_bwd=ms_fb, tflops_fwd_bwd=3.5 * fwd_flops / (ms_fb * 1e-3) / 1e12,
                               ms_bwd=ms_b, tflops_bwd=2.5 * fwd_flops / (ms_b * 1e-3) / 1e12)
                    if ms_graph is not None:
                        row.update(ms_fwd_bwd_graph=ms_graph,
                                   tflops_fwd_bwd_graph=3.5 * fwd_flops / (ms_graph * 1e-3) / 1e12)
                    if name in ("minillm", "minillm_jit", "minillm_noplans", "minillm_v2", "minillm_v3", "minillm_v4", "minillm_v5",
                                "minillm_v6") and \
                            fa.last_backward_kernel is not None:  # (v1 has its own kernels; the default is v2-v4)
                        kern = fa.last_backward_kernel
                        row.update(config=fa.last_backward_config, path=fa.last_backward_path, regs=getattr(kern, "n_regs", None), spills=getattr(kern, "n_spills", None),
                                   shared_bytes=getattr(getattr(kern, "metadata", None), "shared", None))
                except Exception as e:  # a backend that does not support the shape, or a compile failure
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                save(row)
                if "error" in row:
                    print(f"{d:4d} {n:6d} {str(causal):>6s} {name:12s} ERROR {row['error'][:90]}", flush=True)
                else:
                    diff = row.get("max_abs_grad_diff")
                    print(f"{d:4d} {n:6d} {str(causal):>6s} {name:12s} {row['ms_fwd_bwd']:8.3f} "
                          f"{row['tflops_fwd_bwd']:8.1f} {row['ms_bwd']:8.3f} {row['tflops_bwd']:8.1f}  "
                          f"{' '.join(f'{x:.1e}' for x in diff.values()) if diff else ''}"
                          + (f"  graph {row['ms_fwd_bwd_graph']:.3f} ms" if "ms_fwd_bwd_graph" in row else ""),
                          flush=True)
            launch.FAST_LAUNCH = fa.PLANS = True
            torch.cuda.empty_cache()
    if args.sweep and len(runs) == len(points):
        sweep(args, B, H, Hkv, save)


def sweep(args, B, H, Hkv, save):
    """The backward alone for each sweep config of each version at one (D, N): time, registers, spills,
    shared memory (of the dK/dV launch, for v4)."""
    for point in args.sweep:
        sweep_point(args, B, H, Hkv, save, *map(int, point.split(":")))


def sweep_point(args, B, H, Hkv, save, d, n):
    for impl in args.sweep_impls:
        print(f"\nbackward {impl} tile sweep, D={d} N={n}: (M1, N1, M2, N2, warps, stages[, dQ warps, stages])",
              flush=True)
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(1)
            q = torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(B, Hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            do = torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            o, lse = fa._forward(q, k, v, causal, d ** -0.5)
            want = fa._backward(q, k, v, o, lse, do, causal, d ** -0.5, "v1")
            fwd_flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
            flags = {"tma": impl in ("v3", "v4", "v5", "v6"), "split": impl in ("v4", "v6"), "dq_atomic": impl == "v5",
                     "one_loop": impl == "v6"}
            for cfg in SWEEPS[impl]:
                row = {"D": d, "N": n, "causal": causal, "provider": f"minillm_{impl}", "sweep": True, "config": cfg}
                run = lambda: fa._backward_v2(q, k, v, o, lse, do, causal, d ** -0.5, config=cfg, **flags)  # noqa: E731
                try:
                    got = run()
                    kern = fa.last_backward_kernel
                    row.update(max_abs_diff_vs_v1={f"d{x}": float((a.float() - b.float()).abs().max())
                                                   for x, a, b in zip("qkv", got, want)},
                               regs=getattr(kern, "n_regs", None), spills=getattr(kern, "n_spills", None),
                               shared_bytes=getattr(getattr(kern, "metadata", None), "shared", None),
                               path=fa.last_backward_path)
                    ms = median_ms(run, warmup=25, rep=150)
                    row.update(ms_bwd=ms, tflops_bwd=2.5 * fwd_flops / (ms * 1e-3) / 1e12)
                except Exception as e:  # out of shared memory / registers for this tile shape: record, go on
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                save(row)
                if "error" in row:
                    print(f"  causal={causal!s:5s} {cfg}  ERROR {row['error'][:80]}", flush=True)
                else:
                    print(f"  causal={causal!s:5s} {cfg}  {row['ms_bwd']:7.3f} ms {row['tflops_bwd']:7.1f} TF/s  "
                          f"regs {row['regs']} spills {row['spills']} smem {(row['shared_bytes'] or 0) / 1024:.0f} KiB"
                          f"  diff vs v1 {max(row['max_abs_diff_vs_v1'].values()):.1e}", flush=True)
            del q, k, v, do, o, lse, want
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
