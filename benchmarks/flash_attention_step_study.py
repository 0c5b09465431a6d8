"""A training step (forward + backward) of minillm's default against a variant of it, side by side in rounds.

    python benchmarks/flash_attention_step_study.py --points 128:1024:causal 64:1024:causal \
        --variant HOST_DESC_MIN_N=2048 --out benchmarks/results/flash_attention_step_study_h200.json

At N=1K an eager training step is short enough that the host's speed shows in its time, and the host's speed
moves between processes (in one pair of runs FA2's host issue time per step went from 215 to 393 us,
results/attention_step_hostraw_*_h200.json). So a change to the host path is judged here in one process: each
round visits every point and times minillm's default, the default with ``--variant``'s constants of
``minillm.kernels.flash_attention`` set for its calls only, and SDPA's FLASH backend (FA2) for reference, in an
order that rotates from round to round. Each timing is a median (triton's do_bench), eager and replayed from a
CUDA graph, on leaf tensors made anew per provider and round, as flash_attention_bwd_bench.py takes them. ``encoded_per_step`` counts
the host descriptors minillm's bound launches encoded per eager step (``launch.stats["encoded"]``: 0 once every
tensor address has been seen). The summary gives, per point, the median over rounds of variant / default time.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import flash_attention as fa  # noqa: E402  (first: it decides interpreter vs compiled)
from minillm.kernels import launch  # noqa: E402

from _common import (median_ms, median_ms_cudagraph, parse_variant, run_meta, step_inputs, step_point,  # noqa: E402
                     with_settings, write_results)
from flash_attention_bwd_bench import forward_fn  # noqa: E402  (the bwd bench's providers: the same calls)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["128:1024:causal", "64:1024:causal"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variant", nargs="+", required=True, metavar="NAME=VALUE",
                    help="flash_attention constants the variant sets for its calls")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("flash_attention_step_study.py needs a CUDA GPU")
    variant, default = parse_variant(fa, args.variant)
    meta = run_meta(dtype="bfloat16", batch=4, heads=32, rounds=args.rounds, variant=variant, default=default,
                    timing="triton.testing.do_bench (eager) / do_bench_cudagraph (graph), return_mode=median (ms)")

    providers = {"minillm": default, "variant": variant, "sdpa_flash": default}
    rows = []
    for r in range(args.rounds):
        for i, point in enumerate(args.points):
            d, n, causal = step_point(point)
            q0, k0, v0, do = step_inputs(d, n)
            names = list(providers)
            shift = (r + i) % len(names)
            for name in names[shift:] + names[:shift]:
                fn = forward_fn("sdpa_flash" if name == "sdpa_flash" else "minillm", causal, False)
                q, k, v = (t.detach().requires_grad_() for t in (q0, k0, v0))

                # (each call sets its provider's settings: the other providers' calls put the defaults back)
                step = with_settings(fa, providers[name], default,
                                     lambda fn=fn, q=q, k=k, v=v: torch.autograd.grad(fn(q, k, v), (q, k, v), do))
                step()
                encoded = launch.stats["encoded"]
                calls = [0]

                def counted():
                    calls[0] += 1
                    step()
                ms = median_ms(counted, warmup=25, rep=150)
                row = {"round": r, "D": d, "N": n, "causal": causal, "provider": name, "ms_eager": ms,
                       "encoded_per_step": (launch.stats["encoded"] - encoded) / calls[0],
                       "fwd_impl": fa.last_forward_impl if name != "sdpa_flash" else None}
                try:
                    row["ms_graph"] = median_ms_cudagraph(step)
                except Exception as e:  # noqa: BLE001  (recorded: a step that does not capture has no graph time)
                    row["ms_graph"], row["graph_error"] = None, f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                write_results(args.out, meta, rows)
                print(f"round {r} D={d} N={n} causal={causal} {name:10s} eager {ms:.3f} ms  graph "
                      f"{row['ms_graph'] or float('nan'):.3f} ms  encoded/step {row['encoded_per_step']:.2f}"
                      f"  {row['fwd_impl'] or ''} {row.get('graph_error', '')[:80]}", flush=True)
    print("\nmedian over rounds of variant / default time [min, max]", flush=True)
    summary = []
    for point in args.points:
        d, n, causal = step_point(point)
        for mode in ("ms_eager", "ms_graph"):
            ratio = []
            for r in range(args.rounds):
                t = {x["provider"]: x[mode] for x in rows if (x["round"], x["D"], x["N"], x["causal"]) == (r, d, n, causal)}
                if t["variant"] and t["minillm"]:  # (a graph that did not capture has no time)
                    ratio.append(t["variant"] / t["minillm"])
            if not ratio:
                continue
            summary.append({"D": d, "N": n, "causal": causal, "mode": mode, "variant_over_default": statistics.median(ratio),
                            "min": min(ratio), "max": max(ratio), "rounds_used": len(ratio)})
            print(f"D={d} N={n} causal={causal} {mode}: {statistics.median(ratio):.3f} [{min(ratio):.3f}, "
                  f"{max(ratio):.3f}]", flush=True)
    meta["summary"] = summary
    write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
