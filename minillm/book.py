"""Small helpers the chapter notebooks share (NumPy only).

``glue`` puts a computed value into the website's prose (MyST-NB's glue) when
myst-nb is installed, and is a silent no-op elsewhere (Colab, a bare laptop), so
the notebooks run unchanged everywhere.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

_PACKAGE = Path(__file__).resolve().parent


def glue(name: str, value, display: bool = False) -> None:
    try:
        from myst_nb import glue as _glue
    except ImportError:
        return
    _glue(name, value, display=display)


def verdict(claim: str, computed, holds: bool) -> None:
    """Print one line comparing a claim from the source page with what the code computed."""
    print(f"{'holds' if holds else 'DOES NOT HOLD'}: claim {claim!r}; computed {computed}")


def median_seconds(fn, repeats: int = 3) -> float:
    """Median wall time of fn() over a few runs (after one warm-up call)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def result_path(name: str) -> Path:
    """A recorded GPU results file: ``benchmarks/results/<name>`` in a checkout, else the copy the package
    ships in ``minillm/results/`` (a test keeps the two identical). No path relative to the notebook."""
    for folder in (_PACKAGE.parent / "benchmarks" / "results", _PACKAGE / "results"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"no recorded result {name!r} in a checkout's benchmarks/results or in the package")


def load_result(name: str) -> dict:
    return json.loads(result_path(name).read_text())


def benchmark_script(name: str) -> Path | None:
    """``benchmarks/<name>`` when running from a checkout (the scripts are not in the installed package)."""
    path = _PACKAGE.parent / "benchmarks" / name
    return path if path.exists() else None
