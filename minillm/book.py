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

PACKAGE = Path(__file__).resolve().parent


def glue(name: str, value, display: bool = False) -> None:
    try:
        from myst_nb import glue as _glue
    except ImportError:
        return
    _glue(name, value, display=display)


# What a verdict's number comes from. Every verdict names one, then says on which model and workload.
SCOPES = {
    "arithmetic": "computed by formula from published configurations or specifications; nothing is run",
    "live": "measured by the notebook itself, on the machine that executes it",
    "recorded": "measured on a named GPU by the benchmark harness and read from its recorded results",
    "simulated": "computed by one of the book's models (step cost, memory traffic, a scheduler trace)",
    "cited": "checked against the text of the paper, specification or release the page relies on",
}

# The tolerance policy for a number the page states (the intro writes it out): a number stated plainly
# agrees with ours within 1%; one stated as "about", "around", "roughly" or "~" within 10%; a range holds
# when ours lies inside it, widened by the same tolerance.
EXACT_TOLERANCE = 0.01
ABOUT_TOLERANCE = 0.10


def agrees(stated: float, computed: float, *, about: bool = False) -> bool:
    """Whether ``computed`` matches the page's ``stated`` number under the book's tolerance policy."""
    tol = ABOUT_TOLERANCE if about else EXACT_TOLERANCE
    return abs(float(computed) - float(stated)) <= tol * abs(float(stated))


def in_range(low: float, high: float, computed: float, *, about: bool = False) -> bool:
    """Whether ``computed`` lies in the page's range [low, high], widened by the tolerance policy."""
    if low > high:
        raise ValueError(f"in_range needs low <= high, got {low} > {high}")
    tol = ABOUT_TOLERANCE if about else EXACT_TOLERANCE
    return float(low) * (1 - tol) <= float(computed) <= float(high) * (1 + tol)


def verdict_line(claim: str, computed, holds: bool, *, scope: str, only_when: str | None = None) -> str:
    """The line :func:`verdict` prints; ``tools/claims_ledger.py`` reads it back from the executed chapters.

    ``holds`` is the verdict on the claim as the page states it. ``only_when`` is the third state, for a claim
    the data supports only under a condition: then ``holds`` must be False (the claim as stated, without the
    condition, does not hold) and the line reads ``holds only when <condition>``. ``scope`` is
    ``"<kind>: <what was measured or computed, on which model and workload>"`` with a kind from ``SCOPES``.
    """
    if not isinstance(claim, str) or not claim.strip():
        raise ValueError("verdict needs the claim as a non-empty string")
    if not isinstance(holds, (bool, np.bool_)):
        raise TypeError(f"verdict's holds must be a bool, got {type(holds).__name__}")
    kind, _, detail = str(scope).partition(": ")
    if kind not in SCOPES or not detail.strip():
        raise ValueError(f"verdict's scope must read '<kind>: <what, on which model and workload>' with a kind "
                         f"from {sorted(SCOPES)}, got {scope!r}")
    computed = str(computed)
    for text, name in ((computed, "computed"), (detail, "scope")):
        if "\n" in text or "; scope " in text:
            raise ValueError(f"verdict's {name} text must be one line without '; scope ', got {text!r}")
    if only_when is not None:
        if holds:
            raise ValueError("only_when is the verdict for a claim that does not hold as stated: pass holds=False")
        if not str(only_when).strip() or ": claim " in str(only_when) or "\n" in str(only_when):
            raise ValueError(f"only_when must be a one-line condition, got {only_when!r}")
        state = f"holds only when {only_when}"
    else:
        state = "holds" if holds else "DOES NOT HOLD"
    return f"{state}: claim {claim!r}; computed {computed}; scope {kind}: {detail}"


def verdict(claim: str, computed, holds: bool, *, scope: str, only_when: str | None = None) -> None:
    """Print one line comparing a claim from the source page with what the code computed, and where that
    number comes from (``scope``). See :func:`verdict_line`."""
    print(verdict_line(claim, computed, holds, scope=scope, only_when=only_when))


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
    """A recorded GPU results file, one per benchmark suite and GPU (``flash_h200.json``): ``benchmarks/results/``
    in a checkout, else the copy an installed wheel ships in ``minillm/results/`` (``make dist`` puts it there).
    No path relative to the notebook."""
    for folder in (PACKAGE.parent / "benchmarks" / "results", PACKAGE / "results"):
        if (folder / name).exists():
            return folder / name
    raise FileNotFoundError(f"no recorded result {name!r} in a checkout's benchmarks/results or in the package")


def load_result(name: str, record: str | None = None) -> dict:
    """A results file (``{"suite", "gpu", "records"}``), or with ``record`` one record of it, as the benchmark
    wrote it: its own ``meta`` (GPU, versions, date, command) and its data, e.g.
    ``load_result("flash_h200.json", "flash_attention")`` is the flash suite's grid recorded on the H200."""
    doc = json.loads(result_path(name).read_text())
    if record is None:
        return doc
    if record not in doc["records"]:
        raise KeyError(f"{name} has no record {record!r}; it has {sorted(doc['records'])}")
    return doc["records"][record]


def benchmark_command(suite: str) -> list[str] | None:
    """The command that runs one suite of the benchmark harness (``python -m benchmarks SUITE``) from a checkout;
    None from an installed package (the harness is not in the wheel). Append options such as ``--out FILE``."""
    import sys

    harness = PACKAGE.parent / "benchmarks"
    return [sys.executable, str(harness), suite] if (harness / "bench.py").exists() else None


def source_claims(path: Path | None = None) -> list[dict]:
    """The inventory of the source page's quantitative claims (``minillm/data/source_claims.json``), in page order.

    Each entry has an ``id``, the page's ``section``, a short verbatim ``quote`` and ``checked_by``: a list of
    ``{"chapter": "chapters/NN_x", "verdict": <the claim text passed to verdict>}``, or None while no chapter
    checks the claim; such a claim may carry ``why_unchecked``, the reason no code can check it. Raises ValueError on a malformed inventory.
    """
    path = PACKAGE / "data" / "source_claims.json" if path is None else Path(path)
    doc = json.loads(path.read_text())
    sections, claims = doc.get("sections"), doc.get("claims")
    if not isinstance(sections, list) or not isinstance(claims, list) or not claims:
        raise ValueError(f"{path.name}: needs a list of 'sections' and a non-empty list of 'claims'")
    seen = set()
    for c in claims:
        where = f"{path.name}: claim {c.get('id')!r}"
        if not {"id", "section", "quote", "checked_by"} <= set(c) <= {"id", "section", "quote", "checked_by",
                                                                      "why_unchecked"}:
            raise ValueError(f"{where} has keys {sorted(c)}, expected id, section, quote, checked_by "
                             "(and why_unchecked when checked_by is null)")
        if "why_unchecked" in c and (c["checked_by"] is not None or not isinstance(c["why_unchecked"], str)
                                     or not c["why_unchecked"].strip()):
            raise ValueError(f"{where}: why_unchecked is a non-empty reason, only for a claim no verdict checks")
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
