"""Which training steps of minillm's FlashAttention capture in a CUDA graph, and which do not (a diagnostic).

    python benchmarks/check_graph_capture.py --out benchmarks/results/graph_capture_h200.json

In benchmarks/profile_attention_step.py and flash_attention_step_study.py, triton's do_bench_cudagraph failed to
capture the d=128 causal step on v2 with host descriptors ("operation failed due to a previous error during
capture") the first time per shape, while v1 captured, later rounds of the same shape captured, and
tests/test_kernels_flash_attention.py's capture of the same step passed. Each trial here runs in a fresh process
(a failed capture can leave the context unusable): a step (forward + autograd.grad, bf16, B=4, H=32, causal) run
eagerly a few times on the default stream, then captured as do_bench_cudagraph captures it (a new side stream, one
warm-up call there, then torch.cuda.graph) or as the test does (warm-up on a side stream, the capture's own
stream). Trials vary the forward (host descriptors or v1), the launch path (bound launches with plans, or Triton's
binder), and whether the capture's first call encodes a descriptor (a fresh address) or not.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TRIALS = {  # name: (settings, how, launch path)
    "hostdesc_dobench": ({}, "dobench", "plans"),
    "v1_dobench": ({"HOST_DESC_MIN_N": 1 << 30}, "dobench", "plans"),
    "hostdesc_dobench_jit": ({}, "dobench", "jit"),
    "hostdesc_test_style": ({}, "test", "plans"),
    "hostdesc_dobench_forward_only": ({}, "dobench_fwd", "plans"),
    "hostdesc_dobench_twice": ({}, "dobench_twice", "plans"),
    "hostdesc_dobench_wrapper": ({}, "dobench", "plans_wrapper"),  # plans, but Triton's descriptor wrapper
    "hostdesc_thread_local": ({}, "dobench_thread_local", "plans"),  # capture_error_mode="thread_local"
    "hostdesc_dobench_noplan_fwd": ({}, "dobench", "plans_nofwdplan"),  # plans for the backward only
}


def trial(name: str, n: int) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from minillm.kernels import flash_attention as fa
    from minillm.kernels import launch

    settings, how, path = TRIALS[name]
    for k, v in settings.items():
        setattr(fa, k, v)
    launch.FAST_LAUNCH = fa.PLANS = path != "jit"
    if path == "plans_wrapper":
        launch._unwrapped = lambda run: None
    if path == "plans_nofwdplan":
        fa._remember = lambda key, plan: fa._plans.__setitem__(key, plan) if key[0] == "bwd" else None
    g = torch.Generator(device="cuda").manual_seed(n)
    q0, k0, v0, do = (torch.randn(4, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    q, k, v = (t.detach().requires_grad_() for t in (q0, k0, v0))

    def step():
        if how == "dobench_fwd":
            with torch.no_grad():
                return fa.flash_attention(q, k, v, causal=True)
        return torch.autograd.grad(fa.flash_attention(q, k, v, causal=True), (q, k, v), do)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    out = {"trial": name, "N": n, "fwd_impl": fa.last_forward_impl, "encoded_before": launch.stats["encoded"]}
    attempts = 2 if how == "dobench_twice" else 1
    out["captured"] = []
    for _ in range(attempts):
        try:
            if how == "test":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    step()
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
            else:
                mode = "thread_local" if how == "dobench_thread_local" else "global"
                with torch.cuda.stream(torch.cuda.Stream()):
                    step()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, capture_error_mode=mode):
                        for _ in range(4):
                            step()
            graph.replay()
            torch.cuda.synchronize()
            out["captured"].append(True)
        except Exception as e:  # noqa: BLE001  (the finding)
            out["captured"].append(False)
            out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["encoded_after"] = launch.stats["encoded"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--only", nargs="*", help="these trials (default: every one)")
    ap.add_argument("--trial", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.trial:  # one trial, in this process
        print(json.dumps(trial(args.trial, args.n)))
        return
    from _common import run_meta, write_results

    meta = run_meta(dtype="bfloat16", batch=4, heads=32, head_dim=128, causal=True, trials=TRIALS,
                    captured="the capture and one replay raised no error (outputs not compared)")
    rows = []
    for n in args.seq_lens:
        for name in args.only or TRIALS:
            try:
                p = subprocess.run([sys.executable, __file__, "--trial", name, "--n", str(n)], capture_output=True,
                                   text=True, timeout=120)
                last = [line for line in p.stdout.splitlines() if line.startswith("{")]
                row = json.loads(last[-1]) if last else {"trial": name, "N": n, "error": p.stderr[-300:]}
            except subprocess.TimeoutExpired:
                row = {"trial": name, "N": n, "error": "timed out after 120 s"}
            rows.append(row)
            write_results(args.out, meta, rows)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
