"""Where the paged decode kernel loses time against SDPA on a contiguous cache: a measurement script.

    python benchmarks/paged_decode_study.py --out benchmarks/results/paged_decode_study_h200.json
    python benchmarks/paged_decode_study.py --parts merge sdpa --batches 1 16 --lengths 1024 4096   # a short run

bf16, GQA 32/8, D=128, B in {1, 16, 64}, L in {1K, 4K, 16K}, block size 16. Five parts (``--parts``,
default all), one JSON:

* ``table``: the same kernel, the same data, with the blocks in order (block i of sequence b at
  physical block b * nb + i) against scattered at random: what the indirection costs. Default launch
  configuration (``decode_config``) and merge (``DEFAULT_MERGE``).
* ``resources``: the compiled decode kernel's registers, spills and shared memory for each
  (num_warps, num_stages, variant), and from them how many programs fit on one SM (shared memory,
  registers, warps), set against the grid ``default_splits`` builds, which assumes about 4 programs
  per SM. The variant is ``direct`` (one split: the program writes the output), ``launch`` or
  ``ticket`` (the merge compiled in). Without ``sweep`` each --warps x --stages config is run once,
  untimed, to compile it.
* ``sweep``: num_warps x num_stages at every (B, L), scattered table, default merge.
* ``merge``: merge="launch" (a second kernel) against merge="ticket" (the last program of each
  (sequence, KV head) merges), scattered table, for the default configuration and, where the sweep
  ran in the same invocation, for the best sweep configuration at that (B, L). Where the default
  splits are 1 both are the same direct write.
* ``loops``: the two decode loops, v1 (Triton's pipeliner places the loads) at the default configuration,
  then for each loop in --loop-prefetch (v2, ``prefetch=True``: each step issues the next tile's loads
  before its math; 0 sweeps v1) a few split counts around the default (half, default, double) x
  --loop-tiles x --loop-warps (x --loop-stages for v1) x --loop-merges, scattered table.
* ``pieces``: what a call is made of, at the default configuration and scattered table: the whole call,
  and again with the merge launched plainly (``pdl=False``), as a programmatic dependent released once the
  decode programs' loads are done (``pdl=True``) and released as they begin (``pdl="early"``);
  the decode kernel alone (the merge launch skipped, so its output is not read); and an empty kernel with
  the decode kernel's number of programs, which does nothing: the cost of a launch in a CUDA graph.
* ``layout``: the same data in the two memory orders of a block (``to_pages``): "nhd" (slot, head, dim),
  the pool the engine allocates, where one KV head's consecutive tokens lie Hkv * D elements apart, and
  "hnd" (head, slot, dim), where they lie side by side (a block of one head is one contiguous run), passed
  to the same kernel as a permuted view. Each at the default configuration, then "hnd" over
  --layout-tiles x --layout-warps x --layout-stages at the default splits, and the pieces of an "hnd" call.
* ``heads``: the all-heads kernel (``minillm/kernels/paged_heads.py``: one box per block for every KV head)
  against v1 (and v3 where the default runs it), at its defaults, then over split counts (half, its default,
  twice) x --heads-warps x --heads-stages.
* ``tma``: the v3 loop (``tma=True``: whole blocks per step, one by default or --tma-tiles tokens, each
  block's K and V copied whole by TMA) against v1, both at the default configuration, then, at B >= --tma-sweep-min-batch, v3 over split counts (one, half
  the default, the default) x --tma-warps x --tma-stages, with v3's two descriptors built by every program in the kernel
  and/or made once on the host (--tma-host, ``TMA_HOST_DESCRIPTORS``). One split needs no merge launch at all, if
  one program per (sequence, KV head) can stream fast enough on its own.
* ``sdpa``: SDPA FLASH and cuDNN on a contiguous (B, Hkv, L, D) copy of the same K and V, same run.

``tbps`` is bytes of K and V read per call / time (2 * B * L * Hkv * D * 2 bytes), in TB/s. Times
are CUDA-graph replays (do_bench_cudagraph, median). Each row is written to --out as it is measured;
a config that fails to compile or launch is recorded with its error and skipped. ``num_warps`` /
``num_stages`` of None in a row mean the default (``decode_config``); ``config`` holds what it resolved to.

The console ends with one summary line per (B, L): the default splits; the table part (default config,
scattered and in order); the best sweep config; the merge part: launch and ticket, both at the config
where ticket was fastest; the best SDPA backend; and the ratios default-scattered / SDPA and best
minillm row of any part / SDPA.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels import paged_attention as pa  # noqa: E402  (first: interpreter vs compiled)
from minillm.kernels import paged_heads as ph  # noqa: E402

from _common import run_meta, write_results  # noqa: E402
from paged_attention_bench import bench_ms, decode_case, tbps, time_sdpa, to_pages  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _empty_kernel(X, n):
    """Does nothing with its arguments: what a launch of this many programs costs with no work in them."""
    if n < 0:  # never true; keeps the arguments used
        tl.store(X, 0.0)

PARTS = ("table", "resources", "sweep", "merge", "loops", "pieces", "layout", "tma", "heads", "sdpa")


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


def best(rows, B, L, pred):
    """The fastest measured row at (B, L) that pred accepts, or None."""
    at = [r for r in rows if r.get("B") == B and r.get("L") == L and r.get("tbps") and pred(r)]
    return max(at, key=lambda r: r["tbps"], default=None)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure (default: all)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--warps", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--loop-prefetch", type=int, nargs="+", default=[1], choices=[0, 1],
                    help="loops: which loops to sweep (0: v1, 1: v2)")
    ap.add_argument("--loop-tiles", type=int, nargs="+", default=[32, 64], help="loops: tiles")
    ap.add_argument("--loop-warps", type=int, nargs="+", default=[4, 8], help="loops: num_warps")
    ap.add_argument("--loop-stages", type=int, nargs="+", default=[2], help="loops: v1's num_stages")
    ap.add_argument("--loop-splits", type=int, nargs="+", default=None,
                    help="loops: split counts (default: half, the default and double the default)")
    ap.add_argument("--layout-tiles", type=int, nargs="+", default=[64, 128], help="layout: hnd tiles")
    ap.add_argument("--layout-warps", type=int, nargs="+", default=[4, 8], help="layout: hnd num_warps")
    ap.add_argument("--layout-stages", type=int, nargs="+", default=[2, 3], help="layout: hnd num_stages")
    ap.add_argument("--tma-warps", type=int, nargs="+", default=[4, 8], help="tma: v3's num_warps")
    ap.add_argument("--tma-stages", type=int, nargs="+", default=[2, 3, 4], help="tma: v3's num_stages")
    ap.add_argument("--tma-tiles", type=int, nargs="+", default=None,
                    help="tma: v3's tokens per step, whole blocks (default: the block size)")
    ap.add_argument("--heads-warps", type=int, nargs="+", default=[4, 8], help="heads: num_warps")
    ap.add_argument("--heads-stages", type=int, nargs="+", default=[2, 3], help="heads: num_stages")
    ap.add_argument("--tma-host", type=int, nargs="+", default=[0], choices=[0, 1],
                    help="tma: v3's descriptors built in the kernel (0) and/or made on the host (1)")
    ap.add_argument("--tma-sweep-min-batch", type=int, default=16, help="tma: sweep v3 at batches from this on")
    ap.add_argument("--loop-merges", nargs="+", default=["launch"], choices=list(pa.MERGES),
                    help="loops: merges where there are splits")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("paged_decode_study.py needs a CUDA GPU")
    parts = set(args.parts)
    hq, hkv, d, bs = 32, 8, 128, args.block_size
    lim = sm_limits()
    meta = run_meta(dtype="bfloat16", Hq=hq, Hkv=hkv, D=d, block_size=bs, sm_limits=lim, parts=args.parts,
                    default_merge=pa.DEFAULT_MERGE, default_prefetch=pa.DEFAULT_PREFETCH,
                    default_pdl=pa.DEFAULT_PDL,
                    tbps="bytes of K and V read per call / time, TB/s",
                    timing="triton.testing.do_bench_cudagraph, median of CUDA-graph replays (per-row 'timing' says if not)")
    rows = []

    def save(row):
        rows.append(row)
        write_results(args.out, meta, rows)

    fits = {}  # (num_warps, num_stages, variant) as compiled -> programs per SM

    def note_resources(warps, stages, variant):
        """Programs per SM of the kernel the latest call compiled; a resources row the first time it is seen."""
        key = (warps, stages, variant)  # variant: how the splits end, plus the loop and tile where not v1's
        kern = pa.last_decode_kernel
        if key not in fits and kern is not None:
            regs, spills = getattr(kern, "n_regs", None), getattr(kern, "n_spills", None)
            shared = getattr(getattr(kern, "metadata", None), "shared", None)
            occ = programs_per_sm(lim, regs, shared, warps)
            fits[key] = occ["fit"]
            if "resources" in parts:
                save({"part": "resources", "num_warps": warps, "num_stages": stages, "variant": variant, "regs": regs,
                      "spills": spills, "shared_bytes": shared, "programs_per_sm": occ})
                print(f"resources warps={warps} stages={stages} {variant}: regs {regs} spills {spills} "
                      f"smem {(shared or 0) / 1024:.1f} KiB -> {occ['fit']} programs/SM ({occ['limited_by']})",
                      flush=True)
        return fits.get(key)

    for B in args.batches:
        for L in args.lengths:
            kv_bytes = 2 * B * L * hkv * d * 2
            q, k, v, want = decode_case(B, L, hq, hkv, d)
            lens = torch.full((B,), L, device=q.device, dtype=torch.int32)
            nb = L // bs
            splits = pa.default_splits(B, hkv, nb * bs, q.device)
            default_cfg = pa.decode_config(B, hkv, nb * bs)
            base = {"B": B, "L": L, "block_size": bs, "default_splits": splits, "grid_programs": B * hkv * splits}

            def variant(merge, n):
                """How n splits end: written directly (one split) or merged."""
                return "direct" if n == 1 else (merge or pa.DEFAULT_MERGE)

            def measure(row, kc, vc, table, warps, stages, merge, **knobs):
                """Check one configuration (knobs: more paged_attention arguments) against SDPA, time it, save the row."""
                # v3's and the all-heads kernel's own default launch configurations
                if knobs.get("heads"):
                    dcfg = ph.heads_config(bs, hkv, d, 2, pa._shared_per_sm(q.device))
                elif knobs.get("tma"):
                    dcfg = pa.tma_config(B, hkv, lim["sms"], knobs.get("tile", bs), d, 2, pa._shared_per_sm(q.device))
                else:
                    dcfg = default_cfg
                cfg = (warps if warps is not None else dcfg[0], stages if stages is not None else dcfg[1])
                if knobs.get("prefetch"):  # v2's loop does not pipeline: the stages do not apply
                    cfg = (cfg[0], None)
                row["config"] = list(cfg)

                heads = knobs.pop("heads", False)  # the all-heads kernel (minillm/kernels/paged_heads.py)

                def call():
                    if heads:
                        return ph.paged_attention_heads(q, kc, vc, table, lens, validate=False, num_warps=warps,
                                                        num_stages=stages, num_splits=knobs.get("num_splits"))
                    return pa.paged_attention(q, kc, vc, table, lens, validate=False, num_warps=warps,
                                              num_stages=stages, merge=merge, **knobs)
                try:
                    row["max_abs_diff_vs_sdpa"] = float((call().float() - want).abs().max())
                    if heads:  # the all-heads kernel's own split rule, in whole blocks
                        _, n = pa.split_plan(L, knobs.get("num_splits") or ph.default_heads_splits(B, L, bs, q.device),
                                             bs)
                    else:
                        _, n = pa.split_plan(L, knobs.get("num_splits", splits), knobs.get("tile", pa.DEFAULT_TILE))
                    row["splits_run"] = n
                    extra = "".join(f" {k}={v}" for k, v in knobs.items() if k != "num_splits")
                    fit = None if heads else note_resources(*cfg, variant(merge, n) + extra)
                    ms, how = bench_ms(call)
                    row.update(ms=ms, timing=how, tbps=tbps(kv_bytes, ms))
                    if fit:  # programs / (programs resident at once on all SMs)
                        row["waves"] = B * hkv * n / (fit * lim["sms"])
                except Exception as e:  # a config that does not compile / fit: record, go on
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                save(row)
                shown = (f"{row['ms']:8.4f} ms {row['tbps']:5.2f} TB/s diff {row['max_abs_diff_vs_sdpa']:.1e}"
                         if "ms" in row else "ERROR " + row["error"][:80])
                knob_s = "".join(f" {k}={v}" for k, v in knobs.items())
                print(f"B={B:3d} L={L:6d} {row['part']:6s} {row.get('table', ''):9s} warps={warps} stages={stages} "
                      f"merge={merge or pa.DEFAULT_MERGE}{knob_s}: {shown}", flush=True)

            def measure_pieces(base, kc, vc, table):
                """The whole call, the decode kernel alone, an empty launch of its grid: one row each."""
                def whole():
                    return pa.paged_attention(q, kc, vc, table, lens, validate=False)

                launch = pa.fast_launch

                def decode_only(kernel, grid, *a, **kw):  # every launch but the merge's
                    return None if kernel is pa._merge_splits_kernel else launch(kernel, grid, *a, **kw)

                x = torch.zeros(1, device=q.device)
                pieces = {"whole call": whole, "empty launch": lambda: _empty_kernel[(base["grid_programs"],)](x, 1),
                          "whole call, no PDL": lambda: pa.paged_attention(q, kc, vc, table, lens, validate=False,
                                                                           pdl=False),
                          "whole call, PDL": lambda: pa.paged_attention(q, kc, vc, table, lens, validate=False,
                                                                        pdl=True),
                          "whole call, early PDL": lambda: pa.paged_attention(q, kc, vc, table, lens,
                                                                              validate=False, pdl="early")}
                for name, fn in pieces.items():
                    ms, how = bench_ms(fn)
                    save({**base, "part": "pieces", "piece": name, "ms": ms, "timing": how})
                pa.fast_launch = decode_only
                try:
                    ms, how = bench_ms(whole)
                finally:
                    pa.fast_launch = launch
                save({**base, "part": "pieces", "piece": "decode kernel alone", "ms": ms, "timing": how})
                got = {r["piece"]: 1e3 * r["ms"] for r in rows[-len(pieces) - 1:]}
                print(f"B={B:3d} L={L:6d} pieces  " + ", ".join(f"{k} {v:.1f} us" for k, v in got.items()), flush=True)

            tables = {}
            if parts & {"table", "resources", "sweep", "merge", "loops", "pieces", "layout", "tma", "heads"}:
                tables["scattered"] = torch.randperm(B * nb, device=q.device).to(torch.int32).view(B, nb)
            if "table" in parts:
                tables["in_order"] = torch.arange(B * nb, device=q.device, dtype=torch.int32).view(B, nb)
            for tname, table in tables.items():
                kc, vc = (to_pages(t, table, bs) for t in (k, v))
                if "table" in parts:
                    measure({**base, "part": "table", "table": tname, "num_warps": None, "num_stages": None,
                             "merge": pa.DEFAULT_MERGE}, kc, vc, table, None, None, None)
                if tname != "scattered":
                    del kc, vc
                    continue
                grid = [(w, s) for w in args.warps for s in args.stages]
                if "sweep" in parts:
                    for w, s in grid:
                        measure({**base, "part": "sweep", "table": tname, "num_warps": w, "num_stages": s,
                                 "merge": pa.DEFAULT_MERGE}, kc, vc, table, w, s, None)
                elif "resources" in parts:  # compile each config once (untimed) to read its resources
                    for w, s in grid:
                        try:
                            pa.paged_attention(q, kc, vc, table, lens, validate=False, num_warps=w, num_stages=s)
                            note_resources(w, s, variant(pa.DEFAULT_MERGE, splits))
                        except Exception as e:
                            print(f"resources warps={w} stages={s}: ERROR {type(e).__name__}: {str(e)[:80]}",
                                  flush=True)
                if "merge" in parts:
                    configs = {tuple(default_cfg): ("default", None, None)}
                    sw = best(rows, B, L, lambda r: r["part"] == "sweep")
                    if sw:
                        configs.setdefault(tuple(sw["config"]), ("best_sweep", sw["num_warps"], sw["num_stages"]))
                    for label, w, s in configs.values():
                        for merge in ("launch", "ticket"):
                            measure({**base, "part": "merge", "table": tname, "num_warps": w, "num_stages": s,
                                     "merge": merge, "merge_config": label}, kc, vc, table, w, s, merge)
                if "loops" in parts:
                    measure({**base, "part": "loops", "table": tname, "num_warps": None, "num_stages": None,
                             "merge": pa.DEFAULT_MERGE, "prefetch": False}, kc, vc, table, None, None, None,
                            prefetch=False)
                    for prefetch in args.loop_prefetch:
                        for n in sorted(args.loop_splits or {max(1, splits // 2), splits, 2 * splits}):
                            for tile in args.loop_tiles:
                                for w in args.loop_warps:
                                    for st in (args.loop_stages if not prefetch else [None]):
                                        for merge in (args.loop_merges if n > 1 else [None]):
                                            measure({**base, "part": "loops", "table": tname, "num_warps": w,
                                                     "num_stages": st, "merge": merge or pa.DEFAULT_MERGE,
                                                     "prefetch": prefetch, "tile": tile, "num_splits": n},
                                                    kc, vc, table, w, st, merge, prefetch=prefetch, tile=tile,
                                                    num_splits=n)
                if "pieces" in parts:
                    measure_pieces(base, kc, vc, table)
                if "tma" in parts:
                    row = {**base, "part": "tma", "table": tname, "num_warps": None, "num_stages": None,
                           "merge": pa.DEFAULT_MERGE}
                    measure({**row, "loop": "v1"}, kc, vc, table, None, None, None, tma=False)
                    host_default = pa.TMA_HOST_DESCRIPTORS
                    for host in args.tma_host:
                        pa.TMA_HOST_DESCRIPTORS = bool(host)
                        try:
                            row["host_desc"] = bool(host)
                            for tt in args.tma_tiles or [bs]:
                                measure({**row, "loop": "v3", "tile": tt}, kc, vc, table, None, None, None, tma=True,
                                        tile=tt)
                                if B < args.tma_sweep_min_batch:
                                    continue
                                for n in sorted({1, max(1, splits // 2), splits}):
                                    for w in args.tma_warps:
                                        for st in args.tma_stages:
                                            measure({**row, "loop": "v3", "tile": tt, "num_warps": w,
                                                     "num_stages": st, "num_splits": n}, kc, vc, table, w, st, None,
                                                    tma=True, tile=tt, num_splits=n)
                        finally:
                            pa.TMA_HOST_DESCRIPTORS = host_default
                if "heads" in parts:
                    row = {**base, "part": "heads", "table": tname, "num_warps": None, "num_stages": None,
                           "merge": pa.DEFAULT_MERGE}
                    measure({**row, "loop": "v1"}, kc, vc, table, None, None, None, tma=False)
                    if pa.prefers_tma(B, hkv, bs, q.device):  # what the default runs there
                        measure({**row, "loop": "v3"}, kc, vc, table, None, None, None, tma=True)
                    measure({**row, "loop": "heads"}, kc, vc, table, None, None, None, heads=True)
                    hs = ph.default_heads_splits(B, L, bs, q.device)
                    for n in sorted({max(1, hs // 2), hs, 2 * hs}):
                        for w in args.heads_warps:
                            for st in args.heads_stages:
                                measure({**row, "loop": "heads", "num_warps": w, "num_stages": st, "num_splits": n},
                                        kc, vc, table, w, st, None, heads=True, num_splits=n)
                del kc, vc
                if "layout" in parts:
                    for lay in ("nhd", "hnd"):
                        kc, vc = (to_pages(t, table, bs, lay) for t in (k, v))
                        row = {**base, "part": "layout", "layout": lay, "table": tname, "num_warps": None,
                               "num_stages": None, "merge": pa.DEFAULT_MERGE}
                        measure(row, kc, vc, table, None, None, None)
                        if lay == "hnd":
                            for tile in args.layout_tiles:
                                for w in args.layout_warps:
                                    for st in args.layout_stages:
                                        measure({**row, "num_warps": w, "num_stages": st, "tile": tile},
                                                kc, vc, table, w, st, None, tile=tile)
                            measure_pieces({**base, "layout": lay}, kc, vc, table)
                        del kc, vc
            if "sdpa" in parts:
                for name, ms, how, tb, err in time_sdpa(q, k, v, kv_bytes):
                    row = {**base, "part": "sdpa", "provider": name}
                    row.update({"ms": ms, "timing": how, "tbps": tb} if err is None else {"error": err})
                    save(row)
                    print(f"B={B:3d} L={L:6d} {name:12s}: " + (f"{ms:8.4f} ms {tb:5.2f} TB/s" if err is None
                                                              else "ERROR " + err[:80]), flush=True)
            del q, k, v, want
            torch.cuda.empty_cache()
    # one summary line per (B, L): minillm default (scattered / in order), best sweep, the merges, best SDPA
    print("\nsummary (TB/s): B L splits | table: scattered in_order | best_sweep(config) | merge: launch ticket(config) "
          "| best_sdpa | ratios: default/sdpa best/sdpa", flush=True)
    f = lambda r: f"{r['tbps']:.2f}" if r else "-"  # noqa: E731
    cfg = lambda r: f"({r['config'][0]},{r['config'][1]})" if r else ""  # noqa: E731
    for B in args.batches:
        for L in args.lengths:
            sc = best(rows, B, L, lambda r: r["part"] == "table" and r["table"] == "scattered")
            io = best(rows, B, L, lambda r: r["part"] == "table" and r["table"] == "in_order")
            sw = best(rows, B, L, lambda r: r["part"] == "sweep")
            tk = best(rows, B, L, lambda r: r["part"] == "merge" and r["merge"] == "ticket")
            ln = best(rows, B, L, lambda r: r["part"] == "merge" and r["merge"] == "launch"
                      and tk is not None and r["config"] == tk["config"])  # launch at the ticket's best config
            sd = best(rows, B, L, lambda r: r["part"] == "sdpa")
            mine = best(rows, B, L, lambda r: r["part"] in ("table", "sweep", "merge", "loops"))
            v2 = best(rows, B, L, lambda r: r["part"] == "loops" and r.get("prefetch"))
            v1 = best(rows, B, L, lambda r: r["part"] == "loops" and not r.get("prefetch") and "tile" not in r)
            v1s = best(rows, B, L, lambda r: r["part"] == "loops" and not r.get("prefetch") and "tile" in r)
            splits = next((r["default_splits"] for r in rows if r.get("B") == B and r.get("L") == L), "-")
            ratio = f"{sc['tbps'] / sd['tbps']:.2f}" if sc and sd else "-"
            ratio_best = f"{mine['tbps'] / sd['tbps']:.2f}" if mine and sd else "-"
            print(f"{B:3d} {L:6d} {splits!s:>3s} | {f(sc)} {f(io)} | {f(sw)}{cfg(sw)} | {f(ln)} {f(tk)}{cfg(tk)} | "
                  f"{f(sd)} {sd['provider'] if sd else ''} | {ratio} {ratio_best}", flush=True)
            lays = {lay: best(rows, B, L, lambda r: r["part"] == "layout" and r["layout"] == lay and "tile" not in r)
                    for lay in ("nhd", "hnd")}
            hs = best(rows, B, L, lambda r: r["part"] == "layout" and r["layout"] == "hnd")
            if lays["nhd"] and lays["hnd"]:
                print(f"    layout: nhd {f(lays['nhd'])} hnd {f(lays['hnd'])} | best hnd {f(hs)} (tile "
                      f"{hs.get('tile', pa.DEFAULT_TILE)}, config {hs['config']}) | /sdpa "
                      + (f"{lays['nhd']['tbps'] / sd['tbps']:.2f} {lays['hnd']['tbps'] / sd['tbps']:.2f} "
                         f"{hs['tbps'] / sd['tbps']:.2f}" if sd else "-"), flush=True)
            t1 = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v1")
            t3 = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v3" and "num_splits" not in r
                      and r.get("tile", bs) == bs)
            t3s = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v3")
            for host in (False, True):
                h = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v3" and r.get("host_desc") is host)
                if h:
                    print(f"    tma, descriptors {'on the host' if host else 'in the kernel'}: best {f(h)} "
                          f"(tile {h.get('tile', bs)}, config {h['config']}, splits "
                          f"{h.get('num_splits', h['default_splits'])})", flush=True)
            for tt in args.tma_tiles or []:
                d3 = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v3" and "num_splits" not in r
                          and r.get("tile") == tt)
                b3 = best(rows, B, L, lambda r: r["part"] == "tma" and r["loop"] == "v3" and r.get("tile") == tt)
                if d3 and sd:
                    print(f"    tma tile {tt}: defaults {f(d3)} ({d3['tbps'] / sd['tbps']:.2f}x sdpa) | best {f(b3)} "
                          f"({b3['tbps'] / sd['tbps']:.2f}x; config {b3['config']}, splits "
                          f"{b3.get('num_splits', b3['default_splits'])})", flush=True)
            if t1 and t3:
                print(f"    tma: v1 {f(t1)} v3 {f(t3)} | best v3 {f(t3s)} (config {t3s['config']}, splits "
                      f"{t3s.get('num_splits', t3s['default_splits'])}) | /sdpa "
                      + (f"{t1['tbps'] / sd['tbps']:.2f} {t3['tbps'] / sd['tbps']:.2f} {t3s['tbps'] / sd['tbps']:.2f}"
                         if sd else "-"), flush=True)
            hv1 = best(rows, B, L, lambda r: r["part"] == "heads" and r["loop"] == "v1")
            hd = best(rows, B, L, lambda r: r["part"] == "heads" and r["loop"] == "heads" and "num_splits" not in r)
            hb = best(rows, B, L, lambda r: r["part"] == "heads" and r["loop"] == "heads")
            if hv1 and hd and sd:
                print(f"    heads: v1 {f(hv1)} | all-heads default {f(hd)} | best {f(hb)} (config {hb['config']}, "
                      f"splits {hb.get('num_splits', '-')}) | /sdpa {hv1['tbps'] / sd['tbps']:.2f} "
                      f"{hd['tbps'] / sd['tbps']:.2f} {hb['tbps'] / sd['tbps']:.2f}", flush=True)
            for name, r in (("v2", v2), ("v1 swept", v1s)):  # the loops part: v1's default against the best swept
                if r:
                    print(f"    loops: v1 default {f(v1)} | best {name} {f(r)} (tile {r['tile']}, warps "
                          f"{r['num_warps']}, stages {r['num_stages']}, splits {r['num_splits']}, {r['merge']}) | "
                          f"/sdpa {r['tbps'] / sd['tbps'] if sd else float('nan'):.2f}", flush=True)


if __name__ == "__main__":
    main()
