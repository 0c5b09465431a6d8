"""Suite ``paged``: minillm's paged decode kernel against SDPA on a contiguous cache of the same data.

    python -m benchmarks paged                 # the grid: record paged_attention of results/paged_<gpu>.json

bf16, GQA with 32 query heads and 8 KV heads, D=128; B in {1, 16, 32, 64, 256}, L in {1024, 4096,
16384} (+131072 where it fits), block sizes 16 and 128. ``tbps`` is bytes of K and V read per
second (2 * B * L * Hkv * D * 2 bytes per call), in TB/s. The SDPA providers run on contiguous
(B, Hkv, L, D) tensors holding the same values, in the same run.
"""
from __future__ import annotations

import argparse
import sys

from minillm.kernels import paged_attention as pa  # (first: interpreter vs compiled)
from minillm.kernels.paged_attention import PagedConfig, paged_attention

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa

from ._common import median_ms, median_ms_cudagraph, run_meta, sdpa_provider, write_results

RECORD = "paged_attention"  # the record a plain run writes
BACKENDS = ("sdpa_flash", "sdpa_cudnn")  # on the contiguous cache


def bench_ms(fn):
    """GPU time per call, replayed from a CUDA graph as a decode step is served: a decode kernel at
    small batch runs for microseconds, less than Python takes to launch it, so plain timing would
    measure the host. Falls back to do_bench (marked in the row) if the call cannot be captured."""
    try:
        return median_ms_cudagraph(fn), "cudagraph"
    except Exception:
        torch.cuda.synchronize()
        return median_ms(fn), "do_bench"


def to_pages(t, table, bs, layout: str = "nhd"):
    """A (B, Hkv, L, D) cache written into pool blocks at the table's slots, returned as the kernel's logical
    (num_blocks, bs, Hkv, D). ``layout`` is the memory order of a block: "nhd" (slot, head, dim), the
    contiguous pool, or "hnd" (head, slot, dim), where one KV head's tokens in a block lie side by side;
    an "hnd" pool is returned as a permuted view of itself (the kernel takes strides, no copy)."""
    B, hkv, L, d = t.shape
    if layout not in ("nhd", "hnd"):
        raise ValueError(f"layout must be 'nhd' or 'hnd', got {layout!r}")
    blocks = t.view(B, hkv, L // bs, bs, d).permute(0, 2, 3, 1, 4).reshape(-1, bs, hkv, d)  # (slot, head, dim)
    if layout == "hnd":
        pool = torch.empty(B * (L // bs), hkv, bs, d, device=t.device, dtype=t.dtype)
        pool[table.long().flatten()] = blocks.transpose(1, 2)
        return pool.transpose(1, 2)
    pool = torch.empty(B * (L // bs), bs, hkv, d, device=t.device, dtype=t.dtype)
    pool[table.long().flatten()] = blocks
    return pool


def tbps(kv_bytes: int, ms: float) -> float:
    """Bytes of K and V read per call / time, in TB/s."""
    return kv_bytes / (ms * 1e-3) / 1e12


def decode_case(B: int, L: int, hq: int, hkv: int, d: int):
    """Random bf16 q (B, Hq, D) and contiguous k, v (B, Hkv, L, D), and the attention output from SDPA (fp32)."""
    q = torch.randn(B, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, hkv, L, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.MATH]):
        want = sdpa(q[:, :, None], k, v, enable_gqa=True)[:, :, 0].float()
    return q, k, v, want


def time_sdpa(q, k, v, kv_bytes: int):
    """(provider, ms, timing, tbps, error) for each SDPA backend in BACKENDS on the contiguous cache."""
    for name in BACKENDS:
        run = sdpa_provider(name, q[:, :, None], k, v, gqa=True)
        try:
            ms, how = bench_ms(run)
        except Exception as e:  # a backend that rejects the shape: record it
            yield name, None, None, None, f"{type(e).__name__}: {str(e)[:160]}"
            continue
        yield name, ms, how, tbps(kv_bytes, ms), None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32, 64, 256])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 131072])
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--sweep-splits", type=int, nargs="*", default=[4, 8, 16, 32, 64, 128],
                    help="also time these num_splits at B <= --sweep-max-batch (rows marked sweep)")
    ap.add_argument("--sweep-max-batch", type=int, default=16)
    ap.add_argument("--sweep-tiles", type=int, nargs="*", default=[32, 64, 128])
    ap.add_argument("--mem-limit-gib", type=float, default=60.0, help="skip (B, L) whose cache exceeds this")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("the paged suite needs a CUDA GPU")
    hq, hkv, d = 32, 8, 128
    meta = run_meta(dtype="bfloat16", Hq=hq, Hkv=hkv, D=d, sms=torch.cuda.get_device_properties(0).multi_processor_count,
                    tbps="bytes of K and V read per call / time, TB/s",
                    timing="triton.testing.do_bench_cudagraph, median of CUDA-graph replays (per-row 'timing' says if not)")
    rows = []
    print(f"{'B':>4s} {'L':>7s} {'block':>5s} {'provider':12s} {'ms':>8s} {'TB/s':>6s}")
    for B in args.batches:
        for L in args.lengths:
            kv_bytes = 2 * B * L * hkv * d * 2
            if kv_bytes * 2.2 > args.mem_limit_gib * 2**30:  # paged pool + contiguous copy
                continue
            q, k, v, want = decode_case(B, L, hq, hkv, d)
            for bs in args.block_sizes:
                nb = L // bs
                perm = torch.randperm(B * nb, device="cuda").to(torch.int32)  # scattered physical blocks
                table = perm.view(B, nb)
                kc, vc = (to_pages(t, table, bs) for t in (k, v))
                lens = torch.full((B,), L, device="cuda", dtype=torch.int32)
                # checked once (validate=True reads the table back), then timed without the host check
                got, info = pa.paged_decode(q, kc, vc, table, lens)
                got, loop = got.float(), info.loop  # which decode loop the default ran (v1, or v3 with TMA)
                diff = float((got - want).abs().max())
                ms, how = bench_ms(lambda: paged_attention(q, kc, vc, table, lens, validate=False))
                rows.append({"B": B, "L": L, "block_size": bs, "provider": "minillm", "ms": ms, "timing": how,
                             "tbps": tbps(kv_bytes, ms), "max_abs_diff_vs_sdpa": diff, "loop": loop})
                print(f"{B:4d} {L:7d} {bs:5d} {'minillm':12s} {ms:8.3f} {rows[-1]['tbps']:6.2f}  diff {diff:.1e}",
                      flush=True)
                sweeps = []
                if B <= args.sweep_max_batch and bs == args.block_sizes[0]:  # how many splits small batches want
                    sweeps += [{"num_splits": n} for n in args.sweep_splits]
                if (B, L) in ((64, 4096), (16, 16384)):  # tokens per loop step
                    sweeps += [{"tile": t} for t in args.sweep_tiles]
                for knob in sweeps:
                    ms, how = bench_ms(lambda: paged_attention(q, kc, vc, table, lens, validate=False, config=PagedConfig(**knob)))
                    rows.append({"B": B, "L": L, "block_size": bs, "provider": "minillm", **knob, "sweep": True,
                                 "ms": ms, "timing": how, "tbps": tbps(kv_bytes, ms)})
                    name = "  " + ",".join(f"{k}={v}" for k, v in knob.items())
                    print(f"{B:4d} {L:7d} {bs:5d} {name:12s} {ms:8.3f} {rows[-1]['tbps']:6.2f}", flush=True)
                del kc, vc
            for name, ms, how, tb, err in time_sdpa(q, k, v, kv_bytes):
                row = {"B": B, "L": L, "block_size": None, "provider": name, "ms": ms, "tbps": tb}
                row.update({"timing": how} if err is None else {"error": err})
                rows.append(row)
                print(f"{B:4d} {L:7d} {'-':>5s} {name:12s} {row['ms'] or float('nan'):8.3f} {row['tbps'] or float('nan'):6.2f}",
                      flush=True)
            write_results(args.out, meta, rows)

