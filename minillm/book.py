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


def source_claims(path: Path | None = None) -> list[dict]:
    """The inventory of the source page's quantitative claims (``minillm/data/source_claims.json``), in page order.

    Each entry has an ``id``, the page's ``section``, a short verbatim ``quote`` and ``checked_by``: a list of
    ``{"chapter": "chapters/NN_x", "verdict": <the claim text passed to verdict>}``, or None while no chapter
    checks the claim. Raises ValueError on a malformed inventory.
    """
    path = _PACKAGE / "data" / "source_claims.json" if path is None else Path(path)
    doc = json.loads(path.read_text())
    sections, claims = doc.get("sections"), doc.get("claims")
    if not isinstance(sections, list) or not isinstance(claims, list) or not claims:
        raise ValueError(f"{path.name}: needs a list of 'sections' and a non-empty list of 'claims'")
    seen = set()
    for c in claims:
        where = f"{path.name}: claim {c.get('id')!r}"
        if set(c) != {"id", "section", "quote", "checked_by"}:
            raise ValueError(f"{where} has keys {sorted(c)}, expected id, section, quote, checked_by")
        if c["id"] in seen:
            raise ValueError(f"{where} appears twice")
        seen.add(c["id"])
        if c["section"] not in sections:
            raise ValueError(f"{where}: section {c['section']!r} is not one of {sections}")
        if str(c["id"]).split(".")[0] != str(sections.index(c["section"]) + 1):
            raise ValueError(f"{where}: the id must be <section number>.<n>, section {c['section']!r} is "
                             f"number {sections.index(c['section']) + 1}")
        if not isinstance(c["quote"], str) or not c["quote"].strip() or len(c["quote"].split()) > 25:
            raise ValueError(f"{where}: the quote must be a short (at most 25 words) non-empty string")
        checked = c["checked_by"]
        if checked is not None and (not isinstance(checked, list) or not checked or not all(
                isinstance(v, dict) and set(v) == {"chapter", "verdict"} and v["chapter"].startswith("chapters/")
                and isinstance(v["verdict"], str) and v["verdict"] for v in checked)):
            raise ValueError(f"{where}: checked_by must be null or a non-empty list of "
                             "{'chapter': 'chapters/NN_x', 'verdict': claim text}")
    return claims


def source(obj) -> str:
    """``inspect.getsource(obj)`` without the course's solution-marker lines (``minillm.assignments``), for
    chapters that print the package's code."""
    import inspect

    from .assignments.markers import BEGIN, END

    return "".join(line for line in inspect.getsource(obj).splitlines(keepends=True)
                   if line.strip() not in (BEGIN, END))
