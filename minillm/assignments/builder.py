"""``python -m minillm.assignments build OUT_DIR``: the student tree, generated from the package.

OUT_DIR/
  README.md                 the course overview: how to run the tests, the list of assignments
  pytest.ini
  handouts/assignment-NN.md one handout per assignment: goal, functions, how to test, what "done" means
  tests/aNN_public.py       the public tests (the grader-only tests stay with the instructor)
  tests/conftest.py
  minillm/...               the package, each graded region replaced by a NotImplementedError stub
"""
from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

from .markers import (
    BEGIN,
    END,
    TEXT_SUFFIXES,
    Region,
    find_leaks,
    find_regions,
    scrub,
    solution_lines,
    stub,
)
from .registry import ASSIGNMENTS, Assignment, AssignmentError, get

PACKAGE_DIR = Path(__file__).resolve().parent.parent   # the reference minillm package
TESTS_DIR = Path(__file__).resolve().parent / "tests"
SUPPORT = "conftest.py"                                 # shared by the public and grader tests
ORACLES = "oracles.py"                                  # trusted references the tests compare against

PYTEST_INI = """\
[pytest]
testpaths = tests
markers =
    points(n): the test is worth n points (default 1)
    stretch: an optional part; its points are a bonus outside the maximum
    core: a test of the core idea; the other tests count only once every core test passes
filterwarnings =
    ignore::RuntimeWarning:triton.*
    ignore::DeprecationWarning:triton.*
"""

# The references and oracles the tests compare against, copied out of the package into tests/oracles.py: the
# tests import them from there, so a graded file (softmax.py, attention.py, speculative.py hold some of them)
# can never change what it is compared with.
ORACLE_SOURCES = (("attention.py", ("check_attention_inputs", "causal_mask", "_compute_dtype", "standard_attention")),
                  ("softmax.py", ("_as_float", "safe_softmax", "Partial", "partial_attention")),
                  ("speculative.py", ("chi2_sf", "chi_square_gof")))
ORACLE_HEADER = '''"""Trusted references for the assignment tests, copied from the reference package by the generator.

The tests compare your code with these, never with functions in the files you hand in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy import exp, log
'''

# Given code that looks like part of a solution but is not one (reviewed): the token leak check skips it.
GIVEN_LOOKALIKES = frozenset({
    ("attention.py", "standard_attention"),           # the oracle: the unfused algorithm, shown in chapter 6
    ("hardware.py", "standard_attention_traffic"),    # traffic of the unfused kernel (assignment 4 counts the fused)
    ("hardware.py", "compulsory_attention_traffic"),
    ("hardware.py", "simulate_standard_attention"),
    ("kernels/common.py", "softmax_step"),           # a helper assignment 7 calls; assignment 6 may not (forbid)
    ("kernels/paged_attention.py", "_finish_split"),  # the epilogue handed to assignment 7
    ("kernels/paged_prefill.py", "_varlen_kernel"),
    ("mla.py", "MLACache.append"),
    ("paged/attention.py", "paged_attention"),        # the NumPy paged reference assignment 7's kernel is tested on
    ("paged/attention.py", "paged_varlen_attention"),
})
WINDOW = 24   # tokens: a run this long of a solution's tokens is a near-copy


def all_regions(package_dir: Path = PACKAGE_DIR) -> list[Region]:
    """Every marked region in the package, checked against the registry (both ways)."""
    regions = []
    for py in sorted(package_dir.rglob("*.py")):
        rel = py.relative_to(package_dir).as_posix()
        if rel.startswith("assignments/") or "__pycache__" in rel:
            continue
        regions += find_regions(py.read_text(), rel)
    claimed = {(p.path, p.qualname): a.number for a in ASSIGNMENTS.values() for p in a.parts}
    seen: dict[tuple[str, str], int] = {}
    for r in regions:
        key = (r.path, r.qualname)
        if key not in claimed:
            raise AssignmentError(f"{r.path}:{r.begin + 1}: solution region in {r.qualname}, which no assignment "
                                  f"in minillm/assignments/registry.py lists")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            raise AssignmentError(f"{r.path}: {r.qualname} has more than one solution region")
    missing = sorted(set(claimed) - set(seen))
    if missing:
        raise AssignmentError("no solution region for " + ", ".join(f"{p}:{q}" for p, q in missing))
    return regions


def message(a: Assignment, qualname: str) -> str:
    part = next(p for p in a.parts if p.qualname == qualname)
    return f"assignment {a.number}: {part.hint}"


def release_set(numbers) -> set[int]:
    """The assignments a tree for ``numbers`` stubs: the earliest of them and every later one (the release flow:
    the solutions of assignments before it have been released)."""
    first = min(get(n).number for n in numbers)
    return {n for n in ASSIGNMENTS if n >= first}


def _function_node(tree: ast.AST, qualname: str):
    node = tree
    for part in qualname.split("."):
        node = next((n for n in ast.iter_child_nodes(node)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part),
                    None)
        if node is None:
            return None
    return node


def stub_function(text: str, qualname: str, msg: str, path: str = "<file>") -> str:
    """The file with the body of ``qualname`` (below its docstring) replaced by ``raise NotImplementedError``."""
    fn = _function_node(ast.parse(text), qualname)
    if fn is None:
        raise AssignmentError(f"{path}: no function {qualname} to stub (minillm/assignments/registry.py reveals)")
    body = fn.body
    first = body[1] if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str)) else body[0]
    lines = text.splitlines(keepends=True)
    indent = lines[first.lineno - 1][:first.col_offset]
    lines[first.lineno - 1:fn.end_lineno] = [f"{indent}raise NotImplementedError({msg!r})\n"]
    return "".join(lines)


def reveal_message(n: int) -> str:
    return (f"not in the student tree: this function holds the reference solution of assignment {n} "
            f"(it comes back when that solution is released)")


def tree_text(rel: str, text: str, stubbed: set[int], regions: list[Region] | None = None) -> str:
    """One package file as a tree that stubs the assignments in ``stubbed`` has it: their regions stubbed, every
    other region kept without its markers, and the given code that reveals their solutions stubbed."""
    regions = find_regions(text, rel) if regions is None else [r for r in regions if r.path == rel]
    owner = {(p.path, p.qualname): a for a in ASSIGNMENTS.values() for p in a.parts}
    msgs = {r.qualname: message(owner[(rel, r.qualname)], r.qualname) for r in regions
            if owner[(rel, r.qualname)].number in stubbed}
    out = stub(text, regions, msgs) if regions else text
    for n in sorted(stubbed):
        for path, qualname in ASSIGNMENTS[n].reveals:
            if path == rel:
                out = stub_function(out, qualname, reveal_message(n), rel)
    return out


def stubbed_sources(numbers, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{relative path: stubbed text} for every file with a region of the chosen assignments (or given code that
    reveals one), as a tree that stubs exactly ``numbers`` has it."""
    numbers = {get(n).number for n in numbers}
    regions = all_regions(package_dir)
    paths = {r.path for r in regions if (r.path, r.qualname) in
             {(p.path, p.qualname) for n in numbers for p in ASSIGNMENTS[n].parts}}
    paths |= {path for n in numbers for path, _ in ASSIGNMENTS[n].reveals}
    return {path: tree_text(path, (package_dir / path).read_text(), numbers, regions) for path in sorted(paths)}


def oracles_source(package_dir: Path = PACKAGE_DIR) -> str:
    """tests/oracles.py: the reference functions the tests compare against, copied out of the package."""
    parts = [ORACLE_HEADER]
    for path, names in ORACLE_SOURCES:
        text = (package_dir / path).read_text()
        lines = text.splitlines()
        tree = ast.parse(text)
        for name in names:
            node = _function_node(tree, name)
            if node is None:
                raise AssignmentError(f"{path} has no {name} to copy into the tests' oracles")
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            parts.append(f"\n\n# from minillm/{path}\n" + "\n".join(lines[start - 1:node.end_lineno]) + "\n")
    out = "".join(parts)
    out = "\n".join(line for line in out.splitlines() if line.strip() not in (BEGIN, END)) + "\n"
    compile(out, ORACLES, "exec")
    return out


def _strip_markers(text: str) -> str:
    """A file whose regions stay (assignments not handed out) without its marker lines."""
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() not in (BEGIN, END))


RULES = """\
- Write only inside the bodies listed above: the grader takes those bodies from the files you hand in and
  puts them into its own copy of the package. A change anywhere else in a handed-in file (an import at the
  top, a helper function, an edited docstring) rejects the whole submission with a score of 0, so put
  imports and helpers inside the body (a nested function is fine).
- Graded code may import only math, numpy, triton (and triton.language), collections, itertools,
  functools, heapq, bisect, dataclasses, time, random and minillm (not its grader, minillm.assignments), may not
  use torch (every graded body is NumPy or a Triton kernel), and may not touch files, processes, the
  interpreter (sys, os, open, eval, exec, getattr/setattr, dunder attributes, private names of modules, ...)
  or assign into modules, classes or globals. With the book's minillm package installed, run from outside this folder,
  `python -m minillm.assignments check PATH/TO/THIS/FOLDER -a N` tells you whether the grader accepts your files.
- Do not write into the arrays or tensors your function is handed (a Triton kernel: into the tensors its
  launcher passes as inputs): a test whose graded call changed one fails. Objects such as `self` may change.
- The tests compare your results with references in `tests/oracles.py`, not with the files you hand in."""


def handout(a: Assignment) -> str:
    graded = [p for p in a.parts if not p.stretch]
    stretch = [p for p in a.parts if p.stretch]

    def items(parts):
        return "\n".join(f"- `{p.module}.{p.qualname}` (in `minillm/{p.path}`): {p.hint}." for p in parts)

    text = [f"# Assignment {a.number}: {a.title}", "",
            f"Follows the chapter `{a.chapter.split('/')[-1]}` of the book.", "",
            "## Goal", "", a.goal, "",
            "## What to write", "",
            ("Each function below raises `NotImplementedError` where its body should be. Keep the signature "
             "and the docstring."), "", items(graded), ""]
    if stretch:
        text += ["### Stretch (bonus points)", "", items(stretch), ""]
    if a.builds_on:
        earlier = ", ".join(str(n) for n in a.builds_on)
        text += ["### It builds on", "",
                 (f"The tests run through the code of assignment(s) {earlier}: in a tree built for this "
                  f"assignment those bodies are the released reference solutions. If you work on in your own "
                  f"tree, your solutions there must pass their own tests first. The grader always uses the "
                  f"reference for them."), ""]
    if a.forbid:
        text += [f"Your bodies may not call {', '.join(f'`{n}`' for n in a.forbid)}: it does the step you "
                 f"are asked to write.", ""]
    text += ["## Rules for graded code", "", RULES, "",
             "## How to run the tests", "",
             "From the folder that holds this tree (no GPU needed: Triton kernels run in the interpreter):", "",
             "```bash",
             f"PYTHONPATH=$PWD python -m pytest -q tests/{a.public_tests}   # the public tests",
             f"python handin.py {a.number}           # the public tests (600 s at most), then the zip to hand in",
             "```", "",
             ("The grader runs these public tests and more that you do not see (edge cases, bad inputs, "
              "property tests, checks that your code has the algorithm's shape), each with a time and a memory "
              "limit and the whole submission with a total time cap. Your code runs in one process and returns "
              "its results; the checks run on those results in another, so what your functions return (and "
              "leave in their arguments) is what is graded. Tests of the core idea come first: the later tests "
              "only count once those pass."), "",
             "## Done means", "", a.done, "",
             f"Time estimate: {a.hours[0]}-{a.hours[1]} hours.", ""]
    if a.needs_triton:
        text += ["## On a GPU", "",
                 ("The tests build CPU tensors, so the kernels run in Triton's interpreter: `tests/conftest.py` "
                  "sets `TRITON_INTERPRET=1` (before triton is imported) unless you set it yourself, also on a "
                  "machine with CUDA. Only that interpreter run is graded. To run your kernel compiled, use a "
                  "fresh Python without `TRITON_INTERPRET` and call it on CUDA tensors (for example the GPU "
                  "extension below); the interpreter does not check shared-memory limits, register pressure "
                  "or speed, so a kernel that passes may still fail to compile for a given block size."), ""]
    if a.gpu_task:
        text += ["## GPU extension (a benchmark, not graded)", "", a.gpu_task, ""]
    return "\n".join(text)


def readme(numbers) -> str:
    rows = "\n".join(f"| {n} | [{ASSIGNMENTS[n].title}](handouts/{ASSIGNMENTS[n].slug}.md) | "
                     f"`tests/{ASSIGNMENTS[n].public_tests}` | {ASSIGNMENTS[n].hours[0]}-{ASSIGNMENTS[n].hours[1]} h |"
                     for n in numbers)
    first = numbers[0]
    return f"""# minillm: course assignments

This folder is the `minillm` package with some function bodies removed. Each removed body raises
`NotImplementedError` with a hint; the rest of the package works, so you can import it, run it and
compare against it while you write your part. Needs Python >= 3.10 and NumPy; the Triton
assignments also need `torch` and `triton` (they run on a CPU through Triton's interpreter).

| # | Assignment | Public tests | Time |
|---|---|---|---|
{rows}

Run one assignment's public tests from this folder, and pack your files to hand in:

```bash
PYTHONPATH=$PWD python -m pytest -q tests/{ASSIGNMENTS[first].public_tests}
python handin.py {first}        # runs the public tests, then writes {ASSIGNMENTS[first].slug}-submission.zip
```

The grader runs the public tests and hidden ones on the bodies you wrote, inside its own copy of the
package: read "Rules for graded code" in your handout before you start.
"""


HANDIN = """\"\"\"Hand in one assignment: run its public tests, then zip the files you wrote (python handin.py N).

Written by `python -m minillm.assignments build`; the same format as `python -m minillm.assignments pack`.
The public tests run with a time limit (TIMEOUT seconds in all); the zip is written even if they fail.
\"\"\"
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

FILES = {files}
TITLES = {titles}
TIMEOUT = 600

n = int(sys.argv[1]) if len(sys.argv) == 2 and sys.argv[1].isdigit() else None
if str(n) not in FILES:
    sys.exit(f"usage: python handin.py N, with N one of {{', '.join(FILES)}}")
root = Path(__file__).resolve().parent
try:
    rc = subprocess.run([sys.executable, "-m", "pytest", "-q", f"tests/a{{n:02d}}_public.py"], cwd=root,
                        env={{**os.environ, "PYTHONPATH": str(root)}}, timeout=TIMEOUT).returncode
except subprocess.TimeoutExpired:
    print(f"the public tests ran past {{TIMEOUT}} s and were stopped (an endless loop?)")
    rc = 1
files = FILES[str(n)]
manifest = {{"assignment": n, "title": TITLES[str(n)], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {{f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}}}}
out = root / f"assignment-{{n:02d}}-submission.zip"
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for f in files:
        z.write(root / f, f)
    z.writestr("submission.json", json.dumps(manifest, indent=2))
print(f"wrote {{out}}" + ("" if rc == 0 else "  (some public tests fail: it is packed anyway)"))
"""


def handin_script(numbers) -> str:
    return HANDIN.format(files=repr({str(n): ASSIGNMENTS[n].files for n in numbers}),
                         titles=repr({str(n): ASSIGNMENTS[n].title for n in numbers}))


# --------------------------------------------------------------------------- notebooks

# A chapter cell that prints a graded body (chapter 6 shows its forward and backward with ``source(...)``) carries
# this tag: its code stays, its outputs are dropped wherever the book reaches students. The student tree holds no
# chapters (only the package, the public tests and the handouts), so the book build honours the tag
# (_ext/minillm_assignment_cells.py, on Sphinx's source-read); a notebook inside a student tree would be stripped
# by write_package all the same.
SOLUTION_TAG = "assignment-solution"


def strip_solution_outputs(nb: dict) -> int:
    """Clear the outputs (and execution count) of every code cell tagged SOLUTION_TAG, keeping its code; returns
    how many cells changed."""
    n = 0
    for cell in nb.get("cells", []):
        if SOLUTION_TAG in (cell.get("metadata", {}).get("tags") or []) and cell.get("cell_type") == "code":
            if cell.get("outputs"):
                n += 1
            cell["outputs"] = []
            cell["execution_count"] = None
    return n


def strip_notebook_text(text: str) -> tuple[str, int]:
    """:func:`strip_solution_outputs` on a notebook's JSON text (unchanged text when no cell is tagged)."""
    nb = json.loads(text)
    n = strip_solution_outputs(nb)
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n", n) if n else (text, 0)


def _output_text(output: dict) -> str:
    parts = [output.get("text", "")]
    for key in ("text/plain", "text/markdown", "text/html", "text/latex"):
        parts.append((output.get("data") or {}).get(key, ""))
    parts.append("\n".join(output.get("traceback") or []))
    return "\n".join("".join(p) if isinstance(p, list) else str(p) for p in parts)


def notebook_leaks(nb, numbers=None, *, where: str = "<notebook>", tagged_ok: bool = True) -> list[str]:
    """Cells whose outputs quote a solution of ``numbers`` (default: all): a solution line or a near-copy.
    ``nb``: a notebook dict, its JSON text or a path. ``tagged_ok``: a cell tagged SOLUTION_TAG is fine (the book
    build strips its outputs); off for a student tree, where nothing may be left."""
    if isinstance(nb, (str, Path)) and not str(nb).lstrip().startswith("{"):
        where, nb = str(nb), Path(nb).read_text()
    if isinstance(nb, str):
        nb = json.loads(nb)
    stubbed = set(ASSIGNMENTS) if numbers is None else {get(n).number for n in numbers}
    exact, normalized = _solution_lines(stubbed)
    windows = solution_windows(stubbed)
    from .markers import normalize

    leaks = []
    for k, cell in enumerate(nb.get("cells", [])):
        if tagged_ok and SOLUTION_TAG in (cell.get("metadata", {}).get("tags") or []):
            continue
        text = "\n".join(_output_text(o) for o in cell.get("outputs") or [])
        lines = [s.strip() for s in text.splitlines()]
        hit = next((s for s in lines if s in exact or (normalize(s) and normalize(s) in normalized)), None)
        near = _window_hits(text, windows)
        if hit is not None or near:
            what = f"solution line: {hit}" if hit is not None else f"near-copy of the solution of {near[0][2]}"
            leaks.append(f"{where}: cell {k}: output quotes a graded body ({what}); tag the cell {SOLUTION_TAG!r}"
                         + (" so the book drops its outputs" if tagged_ok else ""))
    return leaks


def write_package(dest: Path, stubbed: set[int], package_dir: Path = PACKAGE_DIR) -> dict:
    """The package as a tree that stubs ``stubbed`` has it, written to ``dest`` (a ``minillm`` folder).
    Returns {"stubbed": files changed by a stub, "scrubbed": {data file: lines dropped}}."""
    shutil.copytree(package_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "assignments"))
    regions = all_regions(package_dir)
    changed = []
    for py in dest.rglob("*.py"):
        rel = py.relative_to(dest).as_posix()
        text = py.read_text()
        out = _strip_markers(tree_text(rel, text, stubbed, regions))
        if out != _strip_markers(text):
            changed.append(rel)
        py.write_text(out)
    # A notebook in the package loses the outputs of its cells tagged SOLUTION_TAG (the code stays).
    for nb in dest.rglob("*.ipynb"):
        text, n = strip_notebook_text(nb.read_text())
        if n:
            nb.write_text(text)
            changed.append(nb.relative_to(dest).as_posix())
    # Data files can quote the source too (chapter 9's held-out text is a snapshot of the package).
    exact, normalized = _solution_lines(stubbed)
    windows = solution_windows(stubbed)
    scrubbed = {}
    for f in sorted(dest.rglob("*")):
        if f.is_file() and f.suffix in TEXT_SUFFIXES and f.suffix != ".py":
            text, dropped = scrub(f.read_text(errors="surrogateescape"), exact, normalized)
            text, dropped_w = scrub_windows(text, windows)
            if dropped + dropped_w:
                f.write_text(text, errors="surrogateescape")
                scrubbed[f"minillm/{f.relative_to(dest).as_posix()}"] = dropped + dropped_w
    return {"stubbed": sorted(changed), "scrubbed": scrubbed}


def build(out_dir, numbers=None, force: bool = False, *, stub: set[int] | None = None) -> dict:
    """Write the student tree for the assignments ``numbers`` (default: all); returns {"out_dir", "assignments",
    "stubbed", "stubbed_assignments", "scrubbed"}. Leaks raise AssignmentError.

    The release flow: the tree stubs the earliest of ``numbers`` and every later assignment; the solutions of
    the earlier ones (released after their due dates) stay in. ``stub`` overrides which assignments are stubbed
    (the grader and the CI checks use it)."""
    numbers = sorted(ASSIGNMENTS) if not numbers else sorted({get(n).number for n in numbers})
    stubbed = release_set(numbers) if stub is None else {get(n).number for n in stub}
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise AssignmentError(f"{out} exists and is not empty; choose a new folder or pass --force")
        shutil.rmtree(out)
    info = write_package(out / "minillm", stubbed)
    (out / "tests").mkdir()
    shutil.copy(TESTS_DIR / SUPPORT, out / "tests" / SUPPORT)
    (out / "tests" / ORACLES).write_text(oracles_source())
    (out / "handouts").mkdir()
    for n in numbers:
        a = ASSIGNMENTS[n]
        shutil.copy(TESTS_DIR / a.public_tests, out / "tests" / a.public_tests)
        (out / "handouts" / f"{a.slug}.md").write_text(handout(a))
    (out / "pytest.ini").write_text(PYTEST_INI)
    (out / "README.md").write_text(readme(numbers))
    (out / "handin.py").write_text(handin_script(numbers))
    leaks = leak_check(out, stub=stubbed)
    if leaks:
        raise AssignmentError(f"the student tree leaks {len(leaks)} solution line(s):\n" + "\n".join(leaks[:20]))
    return {"out_dir": str(out), "assignments": numbers, "stubbed": info["stubbed"],
            "stubbed_assignments": sorted(stubbed), "scrubbed": info["scrubbed"]}


def leak_check(tree, numbers=None, *, stub=None) -> list[str]:
    """Solution lines, near-copies (a run of WINDOW tokens of a solution) or markers of the stubbed assignments
    found in ``tree`` (empty: no leak). ``numbers`` as for :func:`build` (the release flow); default all."""
    stubbed = ({get(n).number for n in stub} if stub is not None
               else release_set(numbers) if numbers else set(ASSIGNMENTS))
    exact, normalized = _solution_lines(stubbed)
    leaks = find_leaks(Path(tree), exact, normalized)
    for nb in sorted(Path(tree).rglob("*.ipynb")):   # outputs are JSON strings: the line check cannot see them
        leaks += notebook_leaks(nb.read_text(), stubbed, where=nb.relative_to(tree).as_posix(), tagged_ok=False)
    return leaks + find_window_leaks(Path(tree), solution_windows(stubbed))


def _solution_lines(numbers) -> tuple[set[str], set[str]]:
    keep = {(p.path, p.qualname) for n in numbers for p in ASSIGNMENTS[get(n).number].parts}
    regions = [r for r in all_regions() if (r.path, r.qualname) in keep]
    return solution_lines(PACKAGE_DIR, regions)


# --------------------------------------------------------------------------- near-copies (token windows)

_TOKEN = re.compile(r"\w+|[^\w\s]")


def _tokens(text: str) -> list[tuple[str, int]]:
    """(token, 1-based line) of every word or punctuation character; comments dropped."""
    out = []
    for k, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        out += [(t, k) for t in _TOKEN.findall(code)]
    return out


def solution_windows(numbers) -> dict[tuple, str]:
    """Every run of WINDOW tokens of a solution region of ``numbers`` -> "path:qualname" (regions shorter than
    WINDOW tokens are left to the line check), less the runs that a released solution (of an assignment not in
    ``numbers``) also has: those are out already."""
    numbers = {get(n).number for n in numbers}
    owner = {(p.path, p.qualname): n for n, a in ASSIGNMENTS.items() for p in a.parts}
    out, released = {}, set()
    for r in all_regions():
        lines = (PACKAGE_DIR / r.path).read_text().splitlines()[r.begin + 1:r.end]
        toks = [t for t, _ in _tokens("\n".join(lines))]
        for i in range(len(toks) - WINDOW + 1):
            w = tuple(toks[i:i + WINDOW])
            if owner[(r.path, r.qualname)] in numbers:
                out.setdefault(w, f"{r.path}:{r.qualname}")
            else:
                released.add(w)
    return {w: src for w, src in out.items() if w not in released}


def _window_hits(text: str, windows: dict) -> list[tuple[int, int, str]]:
    toks = _tokens(text)
    words = [t for t, _ in toks]
    hits = []
    for i in range(len(words) - WINDOW + 1):
        src = windows.get(tuple(words[i:i + WINDOW]))
        if src is not None:
            hits.append((toks[i][1], toks[i + WINDOW - 1][1], src))
    return hits


def scrub_windows(text: str, windows: dict) -> tuple[str, int]:
    """Drop every line that a near-copy of a solution touches."""
    drop = set()
    for a, b, _ in _window_hits(text, windows):
        drop.update(range(a, b + 1))
    if not drop:
        return text, 0
    lines = text.splitlines(keepends=True)
    return "".join(line for k, line in enumerate(lines, 1) if k not in drop), len(drop)


def find_window_leaks(tree: Path, windows: dict) -> list[str]:
    leaks = []
    for f in sorted(tree.rglob("*")):
        if not f.is_file() or f.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        rel = f.relative_to(tree).as_posix()
        if rel == f"tests/{ORACLES}":   # generated from ORACLE_SOURCES, none of which is a solution
            continue
        allowed = []
        if f.suffix == ".py":
            try:
                parsed = ast.parse(text)
            except SyntaxError:
                parsed = None
            if parsed is not None:
                from .markers import functions

                pkg_rel = rel[len("minillm/"):]
                funcs = functions(parsed)
                allowed = [(fn.lineno, fn.end_lineno) for q, fn in funcs if (pkg_rel, q) in GIVEN_LOOKALIKES]
                # a signature repeats the argument list of the call in a solution: not a leak
                allowed += [(fn.lineno, fn.body[0].lineno - 1) for q, fn in funcs if fn.body[0].lineno > fn.lineno]
        seen = set()
        for a, b, src in _window_hits(text, windows):
            if any(lo <= a and b <= hi for lo, hi in allowed) or (a, src) in seen:
                continue
            if any(x[1] == src and abs(x[0] - a) < 3 for x in seen):
                continue
            seen.add((a, src))
            leaks.append(f"{rel}:{a}: near-copy of the solution of {src}")
    return leaks
