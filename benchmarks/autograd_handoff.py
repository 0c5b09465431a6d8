"""Where the autograd engine's thread hand-off costs a Triton backward its time (issue 12, N=1K).

    python benchmarks/autograd_handoff.py --out benchmarks/results/autograd_handoff_h200.json

results/host_breakdown_fast_h200.json: issuing one eager training step of minillm's attention took
the host 640 µs at D=64 causal, N=1K, but 258 µs with autograd's engine single-threaded (the backward
on the calling thread instead of the engine's device thread), while a Python autograd.Function that
launches nothing cost 146 µs with the default threading. This splits each step at four clock marks:
the forward call returns (``forward``); the backward body is entered (``to backward``: the engine's
set-up and the hand-off to its thread); the body returns (``backward body``); ``autograd.grad``
returns (``back to caller``). Medians over steps, in µs, each mode in the same process; every chunk
of steps is synchronized before the next. Then the backward's Python profile (cProfile, which sees
one thread: it is switched on inside the body) on each thread, and the same backward issued without
autograd on the main thread and on a plain Python thread. "minillm" runs with plans (fa.PLANS: a later
call of a seen shape replays the first one's decisions and bound launches), "minillm, no plans" without.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minillm.kernels import flash_attention as fa  # noqa: E402

from _common import run_meta, step_inputs, step_point, write_results  # noqa: E402
from host_breakdown import _Noop  # noqa: E402  (a Function that launches nothing)


class Marks:
    """Wraps a Function's backward: records when its body is entered and left, and can profile it."""

    def __init__(self, cls):
        self.cls, self.orig, self.enter, self.leave, self.threads = cls, cls.backward, [], [], set()
        self.profile = None

    def __enter__(self):
        orig = self.orig

        def backward(ctx, *grads):
            self.enter.append(time.perf_counter())
            self.threads.add(threading.get_ident())
            if self.profile is not None:
                self.profile.enable()
            try:
                return orig(ctx, *grads)
            finally:
                if self.profile is not None:
                    self.profile.disable()
                self.leave.append(time.perf_counter())

        self.cls.backward = staticmethod(backward)
        return self

    def __exit__(self, *exc):
        self.cls.backward = staticmethod(self.orig)


def split_step(apply, inputs, do, cls, steps: int, chunk: int, single: bool) -> dict:
    """Median µs of each part of ``steps`` steps (in chunks, each synchronized after its clock stops)."""
    parts = {"forward": [], "to backward": [], "backward body": [], "back to caller": [], "step": []}
    with Marks(cls) as m, torch.autograd.set_multithreading_enabled(not single):
        for i in range(steps + 5):
            m.enter.clear(), m.leave.clear()
            t0 = time.perf_counter()
            out = apply(*inputs)
            t1 = time.perf_counter()
            torch.autograd.grad(out, inputs, do)
            t3 = time.perf_counter()
            if i >= 5:
                (t2a,), (t2b,) = m.enter, m.leave
                for name, dt in (("forward", t1 - t0), ("to backward", t2a - t1), ("backward body", t2b - t2a),
                                 ("back to caller", t3 - t2b), ("step", t3 - t0)):
                    parts[name].append(dt * 1e6)
            if i % chunk == chunk - 1:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        threads = len(m.threads - {threading.get_ident()})
    out = {k: statistics.median(v) for k, v in parts.items()}
    out["backward ran on another thread"] = bool(threads)
    return out


def profile_backward(apply, inputs, do, cls, steps: int, single: bool, top: int) -> str:
    prof = cProfile.Profile()
    with Marks(cls) as m, torch.autograd.set_multithreading_enabled(not single):
        m.profile = prof
        for i in range(steps):
            torch.autograd.grad(apply(*inputs), inputs, do)
            if i % 20 == 19:
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def issue_us(fn, steps: int, chunk: int) -> float:
    times = []
    for i in range(steps + 5):
        t = time.perf_counter()
        fn()
        if i >= 5:
            times.append((time.perf_counter() - t) * 1e6)
        if i % chunk == chunk - 1:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times)


def on_thread(fn):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("us", fn()))
    t.start()
    t.join()
    return box["us"]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["64:1024:causal", "128:1024"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("autograd_handoff.py needs a CUDA GPU")
    meta = run_meta(dtype="bfloat16", batch=4, heads=32, steps=args.steps, chunk=args.chunk,
                    timing="host µs per part, median over steps; chunks of steps synchronized between")
    rows, profiles = [], {}
    meta["backward profiles (cProfile, top by own time)"] = profiles
    for point in args.points:
        d, n, causal = step_point(point)
        q, k, v, do = step_inputs(d, n)
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        scale = d ** -0.5
        o, lse = fa._forward(q, k, v, causal, scale)
        fns = {"minillm": (lambda a, b, c: fa.flash_attention(a, b, c, causal=causal), fa._FlashAttention),
               "minillm, no plans": (lambda a, b, c: fa.flash_attention(a, b, c, causal=causal), fa._FlashAttention),
               "no-op Function": (_Noop.apply, _Noop)}
        for name, (apply, cls) in fns.items():
            for single in (False, True):
                fa.PLANS = name != "minillm, no plans"
                try:
                    r = split_step(apply, (qg, kg, vg), do, cls, args.steps, args.chunk, single)
                finally:
                    fa.PLANS = True
                rows.append({"D": d, "N": n, "causal": causal, "fn": name, "engine single-threaded": single, **r})
                print(f"D={d} N={n} causal={causal!s:5s} {name:17s} single={single!s:5s} "
                      + " ".join(f"{k}={v:.1f}" for k, v in r.items() if isinstance(v, float)),
                      f"other thread={r['backward ran on another thread']}", flush=True)
                write_results(args.out, meta, rows)
        bwd = lambda: fa._backward(q, k, v, o, lse, do, causal, scale)  # noqa: E731
        for where, us in (("main thread", issue_us(bwd, args.steps, args.chunk)),
                          ("plain Python thread", on_thread(lambda: issue_us(bwd, args.steps, args.chunk)))):
            rows.append({"D": d, "N": n, "causal": causal, "fn": "backward, no autograd", "where": where,
                         "host_us": us})
            print(f"D={d} N={n} causal={causal!s:5s} backward, no autograd, {where}: {us:.1f} us", flush=True)
        for single in (False, True):
            key = f"D={d} N={n} causal={causal} engine single-threaded={single}"
            profiles[key] = profile_backward(lambda a, b, c: fa.flash_attention(a, b, c, causal=causal),
                                             (qg, kg, vg), do, fa._FlashAttention, 100, single, args.top)
            print(key, profiles[key], sep="\n", flush=True)
        write_results(args.out, meta, rows)


if __name__ == "__main__":
    main()
