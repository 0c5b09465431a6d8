"""What every benchmark script records and how it times: one place, so the results files agree."""
from __future__ import annotations

import datetime
import json
import sys

import torch
import triton
import triton.testing


def run_meta(**extra) -> dict:
    """The ``meta`` block of a results file: GPU, versions, date, the command line, and extras."""
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "cuda": torch.version.cuda, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "command": "python " + " ".join(sys.argv), **extra}


def median_ms(fn, **kwargs) -> float:
    """Median milliseconds per call (do_bench's default is the mean, which one slow outlier moves)."""
    return triton.testing.do_bench(fn, return_mode="median", **kwargs)


def median_ms_cudagraph(fn) -> float:
    """Median milliseconds per call, replayed from a CUDA graph (no host launch cost in the time)."""
    return triton.testing.do_bench_cudagraph(fn, return_mode="median")


def write_results(path, meta: dict, rows: list) -> None:
    """Write ``{"meta": meta, "rows": rows}`` to ``path`` (nothing when ``path`` is empty). The benchmarks call
    it after every row, so a run cut short keeps what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


def worse(worst: float, err: float) -> float:
    """The larger error, where NaN counts as the worst of all (and stays once seen)."""
    return err if err != err or err > worst else worst


def poison(nbytes: int) -> None:
    """Hand the caching allocator a NaN-filled block of ``nbytes``: the next allocation of that size reuses it,
    so a value a kernel fails to write shows up as NaN instead of as whatever the block held."""
    t = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    t.fill_(float("nan"))
    del t


def step_point(spec: str) -> tuple[int, int, bool]:
    """(D, N, causal) of a "D:N" or "D:N:causal" point of the N=1K training-step scripts."""
    parts = spec.split(":")
    return int(parts[0]), int(parts[1]), parts[2:] == ["causal"]


def step_inputs(d: int, n: int):
    """q, k, v, dO of one training step at (D, N): bf16, B=4, H=32, seeded by D + N (the same in every script)."""
    g = torch.Generator(device="cuda").manual_seed(d + n)
    return tuple(torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))


def apply_settings(module, items) -> dict:
    """Set module constants from ``NAME=VALUE`` strings (each value a Python literal), as the scripts' --fa-set
    does; returns {name: value} for the results' meta. An unknown name or a malformed item exits with a message."""
    import ast

    done = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not hasattr(module, name):
            sys.exit(f"--fa-set {item!r}: expected NAME=VALUE with NAME a constant of {module.__name__}")
        try:
            done[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            sys.exit(f"--fa-set {item!r}: the value is not a Python literal")
        setattr(module, name, done[name])
    return done


def parse_variant(module, items) -> tuple[dict, dict]:
    """(the variant's {name: value}, the module's present values of those names) for the scripts' --variant:
    ``apply_settings``' checks, with the module left as it was."""
    present = {item.partition("=")[0]: getattr(module, item.partition("=")[0], None) for item in items}
    variant = apply_settings(module, items)
    for name, value in present.items():
        setattr(module, name, value)
    return variant, present


def with_settings(module, values: dict, restore: dict, fn):
    """``fn``, each call of it made with ``values`` set on ``module`` and ``restore`` put back after it."""
    def run(*args, **kwargs):
        for name, value in values.items():
            setattr(module, name, value)
        try:
            return fn(*args, **kwargs)
        finally:
            for name, value in restore.items():
                setattr(module, name, value)
    return run
