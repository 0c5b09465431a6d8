"""Time the kernels' defaults of one minillm tree (issue 33: before / after the consolidation).

    PYTHONPATH=<tree> python3 benchmarks/kernel_defaults_ab.py --label new --out $OUT/new_1.json

Only the public calls both trees share: flash_attention(q, k, v, causal=...) forward (no grad) and forward +
backward (autograd), and paged_attention(..., validate=False); every call as the defaults run it. Each case is
timed eagerly (triton.testing.do_bench, median), as 100 calls back to back (the host's time per call where it is
the slower side; median of 7) and replayed from a CUDA graph (do_bench_cudagraph, median: the GPU's time alone).
``--compare a.json b.json ...`` prints, per case, the median over the files of each label and the ratio.
``--archive DIR --rounds R`` times both trees in this one process (the archived package imported as
``minillm_old`` beside ``minillm``), on the same tensors, in R rounds with the trees' order alternating: the host's
speed drifts between processes by as much as the trees differ, and one process takes that drift out.
``--variant NAME`` adds this tree with a FlashConfig override (VARIANTS) to the flash cases.
``--host-parts`` times instead where a synchronized N=1K training step spends its host time (before, in and after
the autograd forward and backward) and one launch of a tiny kernel through Triton's JIT call and the tree's own
launcher: what is left of the host-bound gap, part by part.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import sys
from collections import defaultdict

FLASH = [(d, n, causal) for d in (64, 128) for n in (1024, 4096) for causal in (False, True)] + \
        [(128, 2048, True), (128, 16384, False), (128, 16384, True), (128, 32768, True)]
PAGED = [(b, 4096, bs) for b in (1, 16, 32, 64) for bs in (16, 64)]
MODES = ("eager_ms", "loop_ms", "graph_ms")  # the timings of a row (files from before the loop timing lack it)
# This tree with one FlashConfig override (--variant): at the causal D=128 N=1K-2K forward, v1 and v2 with the
# descriptors made in the kernel against the default (v2, descriptors made on the host).
VARIANTS = {"fwd_v1": {"fwd": "v1"}, "device_desc": {"host_descriptors": False}}


def load_archive(path: str) -> str:
    """Import the archived tree's package (``path``/minillm) as ``minillm_old``; its imports are relative."""
    init = os.path.join(path, "minillm", "__init__.py")
    spec = importlib.util.spec_from_file_location("minillm_old", init,
                                                  submodule_search_locations=[os.path.dirname(init)])
    sys.modules["minillm_old"] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return "minillm_old"


def cases(bwd_impl=None, trees=None, variants=()):
    """(case name, {label: call}) for each case; ``trees``: label -> package (default {"tree": "minillm"}),
    every label's call on the same tensors; ``variants``: VARIANTS names, this tree's flash calls with them."""
    import torch

    trees = trees or {"tree": "minillm"}
    flash, paged = {}, {}
    for label, pkg in trees.items():
        importlib.import_module(f"{pkg}.kernels")  # (before triton)
        flash[label] = importlib.import_module(f"{pkg}.kernels.flash_attention").flash_attention
        paged[label] = importlib.import_module(f"{pkg}.kernels.paged_attention").paged_attention
    calls = {label: (f, {}) for label, f in flash.items()}
    if variants:
        from minillm.kernels.flash_dispatch import FlashConfig
        calls.update({v: (flash["new"], {"config": FlashConfig(**VARIANTS[v])}) for v in variants})

    for d, n, causal in FLASH:
        b, h = (4, 32) if n <= 4096 else (1, 32)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        if not bwd_impl:
            yield f"fwd d={d} N={n} causal={causal}", {
                label: (lambda f=f, kw=kw, t=(q, k, v), c=causal: f(*t, causal=c, **kw))
                for label, (f, kw) in calls.items()}
        if n <= 4096 and (not bwd_impl or n > 1024):
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            do = torch.randn_like(q)

            def step(f, kw, t=(qg, kg, vg), do=do, c=causal):
                kw = {**kw, "bwd_impl": bwd_impl} if bwd_impl else kw  # (the archive tree only: its versions)
                return torch.autograd.grad(f(*t, causal=c, **kw), t, do)
            yield f"fwd+bwd d={d} N={n} causal={causal}", {
                label: (lambda f=f, kw=kw, step=step: step(f, kw)) for label, (f, kw) in calls.items()}
    if bwd_impl:  # a version of the archived backward against the defaults: the fwd+bwd cases only
        return
    hq, hkv, d = 32, 8, 128
    for b, L, bs in PAGED:
        nb = L // bs
        table = torch.randperm(b * nb, device="cuda").to(torch.int32).view(b, nb)
        kc, vc = (torch.randn(b * nb, bs, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((b,), L, device="cuda", dtype=torch.int32)
        yield f"paged B={b} L={L} block={bs}", {
            label: (lambda f=f, t=(q, kc, vc, table, lens): f(*t, validate=False)) for label, f in paged.items()}


def back_to_back(fn, calls: int = 100, repeats: int = 7) -> float:
    """ms per call of ``calls`` calls issued back to back (one synchronize at the end), median of ``repeats``: the
    GPU's time where it is the slower side, the host's where the host is. (``do_bench``'s eager time hides up to
    the length of its L2 flush of host time: the kernels queue behind the flush.)"""
    import time

    import torch

    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def timings(fn) -> dict:
    """One case's three timings (ms): eager (do_bench median), loop (back_to_back), graph (do_bench_cudagraph)."""
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    eager = do_bench(fn, warmup=25, rep=100, return_mode="median")
    loop = back_to_back(fn, calls=max(5, min(100, int(20 / eager))))  # about 20 ms a repeat
    with torch.cuda.stream(torch.cuda.Stream()):
        graph = do_bench_cudagraph(fn, rep=100, return_mode="median")
    return {"eager_ms": eager, "loop_ms": loop, "graph_ms": graph}


def run(label: str, out: str, bwd_impl: str | None = None, only=(), archive: str | None = None,
        rounds: int = 1, variants=()) -> None:
    """Time each case: this tree alone (under ``label``), or with ``archive`` both trees ("old", "new", and the
    ``variants``) in ``rounds`` rounds, each round every case with the labels' order turned by one."""
    import torch

    trees = {"old": load_archive(archive), "new": "minillm"} if archive else {label: "minillm"}
    todo = [(name, fns) for name, fns in cases(bwd_impl, trees, variants) if not only or any(o in name for o in only)]
    for _, fns in todo:  # compile and plan every call first
        for fn in fns.values():
            fn()
    torch.cuda.synchronize()
    rows = []
    for r in range(rounds):
        for name, fns in todo:
            labels = list(fns)
            labels = labels[r % len(labels):] + labels[:r % len(labels)]
            for lab in labels:
                rows.append({"case": name, "label": lab, "round": r, **timings(fns[lab])})
                t = rows[-1]
                print(f"{lab:11s} r{r} {name:32s} eager {t['eager_ms']:8.4f} ms  loop {t['loop_ms']:8.4f} ms  "
                      f"graph {t['graph_ms']:8.4f} ms", flush=True)
            with open(out, "w") as f:  # after every case: a run cut short by a time limit keeps what it measured
                json.dump({"label": label, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "rows": rows}, f, indent=1)


def host_parts(label: str, out: str, steps: int = 300) -> None:
    """Host microseconds of each part of a synchronized training step (B=4, H=32, N=1024, bf16), medians over
    ``steps`` steps, and of one launch of a tiny kernel (:func:`back_to_back`: median of 5 x 5000 launches)."""
    import time

    import torch
    import triton
    import triton.language as tl

    from minillm.kernels import flash_attention as fa

    marks, fn = {}, fa._FlashAttention  # (both trees define the autograd Function under this name)
    fwd, bwd = fn.forward, fn.backward

    def timed(f, a, b):
        def call(ctx, *args):
            marks[a] = time.perf_counter()
            r = f(ctx, *args)
            marks[b] = time.perf_counter()
            return r
        return staticmethod(call)
    fn.forward, fn.backward = timed(fwd, "f0", "f1"), timed(bwd, "b0", "b1")
    rows = []
    for d in (64, 128):
        for causal in (True, False):
            q, k, v = (torch.randn(4, 32, 1024, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            do = torch.randn_like(q)
            parts = defaultdict(list)
            for i in range(steps + 50):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                o = fa.flash_attention(q, k, v, causal=causal)
                t1 = time.perf_counter()
                torch.autograd.grad(o, (q, k, v), do)
                t2 = time.perf_counter()
                if i >= 50:  # (after the compiles and the plans)
                    for name, (a, b) in {"call_to_forward": (t0, marks["f0"]), "forward": ("f0", "f1"),
                                         "forward_to_return": ("f1", t1), "return_to_backward": (t1, "b0"),
                                         "backward": ("b0", "b1"), "backward_to_return": ("b1", t2),
                                         "step": (t0, t2)}.items():
                        a, b = (marks[x] if isinstance(x, str) else x for x in (a, b))
                        parts[name].append((b - a) * 1e6)
            rows.append({"D": d, "causal": causal, **{p: statistics.median(x) for p, x in parts.items()}})
            print(label, " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                  flush=True)
    fn.forward, fn.backward = fwd, bwd

    @triton.jit
    def touch(X, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(X + i, tl.load(X + i, mask=i < n) + 1, mask=i < n)

    x = torch.zeros(1024, device="cuda")

    def per_launch(f):  # us per launch, launched back to back (the host is the slower side)
        f()  # (compiles)
        return back_to_back(f, calls=5000, repeats=5) * 1e3
    launch = {"jit_us": per_launch(lambda: touch[(1,)](x, 1024, BLOCK=1024))}
    try:  # this tree's launcher
        from minillm.kernels.common import CachedLaunch
        launcher = CachedLaunch(touch).bind((1,), x, 1024, BLOCK=1024)[1]
    except ImportError:  # the archived tree's (Triton's private C launcher behind it)
        from minillm.kernels.launch import bind
        launcher = bind(touch, (1,), 1, x, 1024, BLOCK=1024)
    launch["tree_launcher_us"] = per_launch(lambda: launcher(x))
    print(label, "launch:", " ".join(f"{k}={v:.2f}" for k, v in launch.items()), flush=True)
    with open(out, "w") as f:
        json.dump({"label": label, "gpu": torch.cuda.get_device_name(), "steps": rows, "launch": launch}, f,
                  indent=1)


def compare(paths) -> None:
    by = defaultdict(lambda: defaultdict(list))  # case -> (label, mode) -> times
    for p in paths:
        doc = json.load(open(p))
        for r in doc["rows"]:
            for mode in MODES:
                if mode in r:
                    by[r["case"]][r.get("label", doc["label"]), mode].append(r[mode])
    modes = [m for m in MODES if any(m == k[1] for t in by.values() for k in t)]
    print(f"{'case':32s} " + " ".join(f"{'old ' + m[:-3]:>10s} {'new ' + m[:-3]:>10s} {'new/old':>8s}" for m in modes))
    for case, t in by.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        cells = []
        for mode in modes:
            old, new = med.get(("old", mode)), med.get(("new", mode))
            cells += [f"{old:10.4f}", f"{new:10.4f}", f"{new / old:8.3f}"] if old and new else ["-"] * 3
        others = sorted({lab for lab, _ in t} - {"old", "new"})
        for lab in others:  # e.g. an archived backward version: its ratio to the old defaults
            for mode in modes:
                if med.get(("old", mode)) and med.get((lab, mode)):
                    cells.append(f"{lab}/old {mode[:5]} {med[lab, mode] / med['old', mode]:.3f}")
        print(f"{case:32s} " + " ".join(cells))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--label")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs="+")
    ap.add_argument("--only", action="append", default=[],
                    help="time only the cases whose name contains this (e.g. paged); repeat for several")
    ap.add_argument("--bwd-impl", help="archive tree only: time this backward version in the fwd+bwd cases")
    ap.add_argument("--host-parts", action="store_true", help="the N=1K step's host time, part by part")
    ap.add_argument("--archive", help="the archived tree's root (holding minillm/): both trees in this process")
    ap.add_argument("--rounds", type=int, default=1, help="with --archive: rounds over the cases")
    ap.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS),
                    help="with --archive: this tree with a FlashConfig override, beside old and new")
    a = ap.parse_args()
    if a.compare:
        compare(a.compare)
    elif a.host_parts:
        host_parts(a.label, a.out)
    else:
        sys.exit(run(a.label or "ab", a.out, a.bwd_impl, a.only, a.archive, a.rounds, a.variant))
