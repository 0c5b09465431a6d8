"""Speculative decoding at batch 1 (chapter 9): tokens per second of the target alone, of the draft-model
drafter at k = 2, 4, 6, 8 and of the prompt-lookup drafter, on held-out Python source, greedy.

    python benchmarks/speculative_bench.py --out benchmarks/results/speculative_b1_h200.json

Both models run through ``minillm.torch_model.TorchRunner``, the NumPy-in/NumPy-out adapter that lets
``cached_decode`` and ``speculative_decode`` (the same NumPy loops as on CPU) drive torch models: eager,
one host sync per forward, float32 (no CUDA graphs: this measures the algorithm's loop, and the engine's
graphed prompt-lookup numbers are in ``speculative_engine_h200.json``). The baseline runs in the same
process on the same prompts; every speculative output is checked against it token for token.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import minillm.kernels  # noqa: E402,F401  (first: it decides interpreter vs compiled before triton loads)
from minillm import ModelDrafter, NgramDrafter, cached_decode, load_model, speculative_decode  # noqa: E402
from minillm.studies.speculation import held_out_source  # noqa: E402
from minillm.torch_model import TorchModel, TorchRunner  # noqa: E402


def runner(name: str, device) -> TorchRunner:
    m = load_model(name)
    return TorchRunner(TorchModel.from_numpy(m.config, m.params), device=device, dtype=torch.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    target, draft = runner("tiny", device), runner("draft", device)
    prompts = held_out_source(args.prompts, 200)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "numpy": np.__version__, "command": "python " + " ".join(sys.argv),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "dtype": "float32", "cuda_graphs": False}
    rows = []

    def timed(fn):
        fn(prompts[0][:50], 8)                                  # warm-up
        t = time.perf_counter()
        outs = [fn(p, args.new) for p in prompts]
        return outs, time.perf_counter() - t

    base, dt = timed(lambda p, n: cached_decode(target, p, n))
    ref = [o.new_tokens for o in base]
    rows.append({"drafter": "none", "k": 0, "tok_per_s": len(prompts) * args.new / dt})
    print("target alone", round(rows[-1]["tok_per_s"]), "tok/s", flush=True)
    for name, make, ks in (("draft_model", lambda: ModelDrafter(draft), (2, 4, 6, 8)),
                           ("ngram", NgramDrafter, (2, 4, 8))):
        for k in ks:
            outs, dt = timed(lambda p, n: speculative_decode(target, make(), p, n, k))
            prop, acc = sum(sum(o.proposed) for o in outs), sum(sum(o.accepted) for o in outs)
            rows.append({"drafter": name, "k": k, "tok_per_s": len(prompts) * args.new / dt,
                         "speedup": len(prompts) * args.new / dt / rows[0]["tok_per_s"],
                         "acceptance": acc / prop if prop else float("nan"),
                         "tokens_per_target_call": sum(sum(o.emitted) for o in outs) / sum(len(o.emitted) for o in outs),
                         "target_seconds": sum(o.target_seconds for o in outs),
                         "draft_seconds": sum(o.draft_seconds for o in outs),
                         "identical": all(o.new_tokens == r for o, r in zip(outs, ref))})
            print(name, k, round(rows[-1]["tok_per_s"]), "tok/s", round(rows[-1]["speedup"], 2), "x",
                  "identical" if rows[-1]["identical"] else "DIFFERENT", flush=True)
            Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
