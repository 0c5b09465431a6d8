"""Where the paged decode kernel loses time against SDPA on a contiguous cache: a measurement script.

    python benchmarks/paged_decode_study.py --out benchmarks/results/paged_decode_study_h200.json

bf16, GQA 32/8, D=128, B in {1, 16, 64}, L in {1K, 4K, 16K}, block size 16. Four parts, one JSON:

* ``table``: the same kernel, the same data, with the blocks in order (block i of sequence b at
  physical block b * nb + i) against scattered at random: what the indirection costs.
* ``resources``: the compiled decode kernel's registers, spills and shared memory for each
  (num_warps, num_stages), and from them how many programs fit on one SM (shared memory, registers,
  warps), set against the grid ``default_splits`` builds, which assumes about 4 programs per SM.
* ``sweep``: num_warps x num_stages at every (B, L), scattered table.
* ``sdpa``: SDPA FLASH and cuDNN on a contiguous (B, Hkv, L, D) copy of the same K and V, same run.

``tbps`` is bytes of K and V read per call / time (2 * B * L * Hkv * D * 2 bytes), in TB/s. Times
are CUDA-graph replays (do_bench_cudagraph, median). Each row is written to --out as it is measured;
a config that fails to compile or launch is recorded with its error and skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import paged_attention as pa  # noqa: E402  (first: interpreter vs compiled)

from _common import run_meta  # noqa: E402
from paged_attention_bench import BACKENDS, bench_ms, to_pages  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402


def sm_limits(device=0) -> dict:
    """Per-SM limits that decide occupancy (Hopper values where torch does not expose them)."""
    p = torch.cuda.get_device_properties(device)
    return {"sms": p.multi_processor_count,
            "smem_per_sm": getattr(p, "shared_memory_per_multiprocessor", 233472),
            "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", 232448),
            "regs_per_sm": getattr(p, "regs_per_multiprocessor", 65536),
            "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", 2048),
            "max_blocks_per_sm": 32}


def programs_per_sm(lim: dict, regs: int | None, shared: int | None, warps: int) -> dict:
    """How many programs of this kernel one SM can hold, and which resource decides it."""
    by = {"warps": lim["max_threads_per_sm"] // (32 * warps), "blocks": lim["max_blocks_per_sm"]}
    if regs:  # registers are allocated per warp in units of 256
        per_warp = -(-regs * 32 // 256) * 256
        by["registers"] = lim["regs_per_sm"] // (per_warp * warps)
    if shared:  # the driver reserves 1 KiB per block
        by["shared"] = lim["smem_per_sm"] // (shared + 1024)
    limiter = min(by, key=by.get)
    return {"fit": by[limiter], "limited_by": limiter, "by": by}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("paged_decode_study.py needs a CUDA GPU")
    hq, hkv, d, bs = 32, 8, 128, args.block_size
    lim = sm_limits()
    meta = run_meta(dtype="bfloat16", Hq=hq, Hkv=hkv, D=d, block_size=bs, sm_limits=lim,
                    tbps="bytes of K and V read per call / time, TB/s",
                    timing="triton.testing.do_bench_cudagraph, median of CUDA-graph replays (per-row 'timing' says if not)")
    rows = []

    def save(row):
        rows.append(row)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)

    fits = {}  # (num_warps, num_stages) -> programs per SM
    for B in args.batches:
        for L in args.lengths:
            kv_bytes = 2 * B * L * hkv * d * 2
            q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, hkv, L, d, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                              SDPBackend.MATH]):
                want = sdpa(q[:, :, None], k, v, enable_gqa=True)[:, :, 0].float()
            lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
            nb = L // bs
            splits = pa.default_splits(B, hkv, nb * bs, q.device)
            base = {"B": B, "L": L, "block_size": bs, "default_splits": splits,
                    "grid_programs": B * hkv * splits}
            tables = {"in_order": torch.arange(B * nb, device="cuda", dtype=torch.int32).view(B, nb),
                      "scattered": torch.randperm(B * nb, device="cuda").to(torch.int32).view(B, nb)}
            for tname, table in tables.items():
                kc, vc = (to_pages(t, table, bs) for t in (k, v))
                configs = [(None, None)]
                if tname == "scattered":
                    configs += [(w, s) for w in args.warps for s in args.stages]
                for warps, stages in configs:
                    part = "table" if warps is None else "sweep"
                    row = {**base, "part": part, "table": tname, "num_warps": warps, "num_stages": stages}
                    try:
                        got = pa.paged_attention(q, kc, vc, table, lens, validate=False, num_warps=warps,
                                                 num_stages=stages).float()
                        row["max_abs_diff_vs_sdpa"] = float((got - want).abs().max())
                        kern = pa.last_decode_kernel
                        key = (warps, stages)
                        if key not in fits and kern is not None:
                            regs, spills = getattr(kern, "n_regs", None), getattr(kern, "n_spills", None)
                            shared = getattr(getattr(kern, "metadata", None), "shared", None)
                            w = warps or 4
                            occ = programs_per_sm(lim, regs, shared, w)
                            res = {"part": "resources", "num_warps": w, "num_stages": stages, "regs": regs,
                                   "spills": spills, "shared_bytes": shared, "programs_per_sm": occ}
                            fits[key] = occ["fit"]
                            save(res)
                            print(f"resources warps={w} stages={stages}: regs {regs} spills {spills} "
                                  f"smem {(shared or 0) / 1024:.1f} KiB -> {occ['fit']} programs/SM "
                                  f"({occ['limited_by']})", flush=True)
                        ms, how = bench_ms(lambda: pa.paged_attention(q, kc, vc, table, lens, validate=False,
                                                                      num_warps=warps, num_stages=stages))
                        row.update(ms=ms, timing=how, tbps=kv_bytes / (ms * 1e-3) / 1e12)
                        if fits.get(key):  # programs / (programs resident at once on all SMs)
                            row["waves"] = base["grid_programs"] / (fits[key] * lim["sms"])
                    except Exception as e:  # a config that does not compile / fit: record, go on
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    save(row)
                    shown = (f"{row['ms']:8.4f} ms {row['tbps']:5.2f} TB/s diff {row['max_abs_diff_vs_sdpa']:.1e}"
                             if "ms" in row else "ERROR " + row["error"][:80])
                    print(f"B={B:3d} L={L:6d} {tname:9s} warps={warps} stages={stages}: {shown}", flush=True)
                del kc, vc
            for name, backend in BACKENDS.items():
                row = {**base, "part": "sdpa", "provider": name}
                try:
                    def run():
                        with sdpa_kernel(backend):
                            return sdpa(q[:, :, None], k, v, enable_gqa=True)
                    ms, how = bench_ms(run)
                    row.update(ms=ms, timing=how, tbps=kv_bytes / (ms * 1e-3) / 1e12)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                save(row)
                print(f"B={B:3d} L={L:6d} {name:12s}: " + (f"{row['ms']:8.4f} ms {row['tbps']:5.2f} TB/s"
                                                          if "ms" in row else "ERROR " + row["error"][:80]), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    # one summary line per (B, L): minillm default (scattered / in order), best sweep, best SDPA
    print("\nsummary (TB/s): B L | scattered in_order best_sweep(config) | best_sdpa | ratio", flush=True)
    for B in args.batches:
        for L in args.lengths:
            at = [r for r in rows if r.get("B") == B and r.get("L") == L and r.get("tbps")]
            get = lambda pred: max((r for r in at if pred(r)), key=lambda r: r["tbps"], default=None)  # noqa: E731
            sc = get(lambda r: r["part"] == "table" and r["table"] == "scattered")
            io = get(lambda r: r["part"] == "table" and r["table"] == "in_order")
            sw = get(lambda r: r["part"] == "sweep")
            sd = get(lambda r: r["part"] == "sdpa")
            f = lambda r: f"{r['tbps']:.2f}" if r else "-"  # noqa: E731
            ratio = f"{sc['tbps'] / sd['tbps']:.2f}" if sc and sd else "-"
            cfg = f"({sw['num_warps']},{sw['num_stages']})" if sw else ""
            print(f"{B:3d} {L:6d} | {f(sc)} {f(io)} {f(sw)}{cfg} | {f(sd)} {sd['provider'] if sd else ''} | {ratio}",
                  flush=True)


if __name__ == "__main__":
    main()
