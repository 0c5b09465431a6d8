"""Validation leg 2: Triton's interpreter against compiled Triton, on the same inputs.

    TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= python benchmarks/check_interpreter_vs_compiled.py dump /tmp/interp.npz
    python benchmarks/check_interpreter_vs_compiled.py compare /tmp/interp.npz

`dump` runs the kernels in the interpreter on CPU tensors (fp32 and fp16; the interpreter's bf16
dot is wrong, triton #11584) and saves inputs and outputs; `compare` runs the compiled kernels on
the GPU on the same inputs and prints the max differences, exiting non-zero if any exceeds its bound.
"""
import json
import sys

from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minillm.kernels.flash_attention import FWD_IMPLS, flash_attention  # noqa: E402
from minillm.kernels.paged_attention import paged_attention  # noqa: E402
from minillm.kernels.paged_prefill import paged_varlen_attention  # noqa: E402
from minillm.kernels.softmax import softmax  # noqa: E402

CASES = [  # (name, B, Hq, Hkv, Nq, Nk, D, causal)
    ("square_causal", 1, 4, 2, 65, 65, 64, True),
    ("decode_row", 2, 8, 2, 1, 300, 128, True),
    ("prefix_gqa", 1, 8, 1, 40, 97, 80, True),
    ("noncausal_d256", 1, 2, 2, 33, 33, 256, False),
]
BOUND = {"float32": 1e-3, "float16": 4e-3}  # compiled fp32 dot is IEEE here; fp16 accumulates in fp32 either way


def inputs(case, dtype):
    _, B, Hq, Hkv, Nq, Nk, D, _ = case
    g = torch.Generator().manual_seed(CASES.index(case))  # not hash(): str hashes differ between processes
    return (torch.randn(B, Hq, Nq, D, generator=g).to(dtype), torch.randn(B, Hkv, Nk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype))


def run(device):
    out = {}
    for case in CASES:
        for dtype in (torch.float32, torch.float16):
            q, k, v = (t.to(device) for t in inputs(case, dtype))
            out[f"{case[0]}/{str(dtype)[6:]}/attn"] = flash_attention(q, k, v, causal=case[7]).float().cpu().numpy()
            for impl in FWD_IMPLS[1:]:  # the TMA versions (v1 is the default above in the interpreter)
                o = flash_attention(q, k, v, causal=case[7], fwd_impl=impl)
                out[f"{case[0]}/{str(dtype)[6:]}/attn_{impl}"] = o.float().cpu().numpy()
    x = (torch.randn(3, 700, generator=torch.Generator().manual_seed(9)) * 10).to(device)
    out["softmax/float32"] = softmax(x).cpu().numpy()
    g = torch.Generator().manual_seed(11)
    lens = torch.tensor([1, 45, 300], dtype=torch.int32)
    table = torch.randperm(3 * 19, generator=g).to(torch.int32).view(3, 19)  # 19 blocks of 16 cover 300
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(3, 8, 128, generator=g).to(dtype)
        kc, vc = (torch.randn(3 * 19, 16, 2, 128, generator=g).to(dtype) for _ in range(2))
        for merge in ("launch", "ticket"):
            o = paged_attention(*(t.to(device) for t in (q, kc, vc, table, lens)), num_splits=3, merge=merge)
            out[f"paged/{str(dtype)[6:]}" + ("" if merge == "launch" else "/ticket")] = o.float().cpu().numpy()
    # a ragged batch: decodes, a whole-prompt chunk, chunks starting on a block boundary (100 - 20 = 80)
    # and inside a block (57 - 30 = 27); GQA 4, 16-token blocks
    g = torch.Generator().manual_seed(12)
    ctx = torch.tensor([300, 45, 17, 100, 57], dtype=torch.int32)
    qlens = torch.tensor([1, 45, 1, 20, 30], dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), qlens.cumsum(0).to(torch.int32)])
    for dtype in (torch.float32, torch.float16):
        q = torch.randn(int(cu[-1]), 8, 128, generator=g).to(dtype)
        kc, vc = (torch.randn(5 * 19, 16, 2, 128, generator=g).to(dtype) for _ in range(2))
        tables = torch.randperm(5 * 19, generator=g).to(torch.int32).view(5, 19)
        o = paged_varlen_attention(*(t.to(device) for t in (q, kc, vc, tables, ctx, cu)))
        out[f"paged_prefill/{str(dtype)[6:]}"] = o.float().cpu().numpy()
    return out


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "dump":
        np.savez(path, **run("cpu"))
        print(f"interpreter outputs written to {path}")
    else:
        ref = np.load(path)
        got = run("cuda")
        report = {}
        for key, value in got.items():
            bound = BOUND["float16" if "float16" in key else "float32"]
            report[key] = {"max_abs_diff": float(np.abs(value - ref[key]).max()), "bound": bound}
        print(json.dumps(report, indent=1))
        bad = [k for k, r in report.items() if not r["max_abs_diff"] <= r["bound"]]
        print("interpreter vs compiled:", "FAIL " + ", ".join(bad) if bad else "all within bounds")
        sys.exit(1 if bad else 0)
