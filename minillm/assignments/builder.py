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

PYTEST_INI = """\
[pytest]
testpaths = tests
markers =
    points(n): the test is worth n points (default 1)
    stretch: an optional part; its points are a bonus outside the maximum
filterwarnings =
    ignore::RuntimeWarning:triton.*
    ignore::DeprecationWarning:triton.*
"""


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


def stubbed_sources(numbers, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{relative path: stubbed text} for every file with a region of the chosen assignments."""
    regions = all_regions(package_dir)
    owner = {(p.path, p.qualname): ASSIGNMENTS[n] for n in numbers for p in ASSIGNMENTS[n].parts}
    by_path: dict[str, list[Region]] = {}
    for r in regions:
        by_path.setdefault(r.path, []).append(r)
    out = {}
    for path, rs in by_path.items():
        msgs = {r.qualname: message(owner[(path, r.qualname)], r.qualname) for r in rs if (path, r.qualname) in owner}
        if msgs:
            out[path] = stub((package_dir / path).read_text(), rs, msgs)
    return out


def _strip_markers(text: str) -> str:
    """A file whose regions stay (assignments not handed out) without its marker lines."""
    return "".join(line for line in text.splitlines(keepends=True) if line.strip() not in (BEGIN, END))


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
             "and the docstring; everything else in the package already works."), "", items(graded), ""]
    if stretch:
        text += ["### Stretch (bonus points)", "", items(stretch), ""]
    text += ["## How to run the tests", "",
             "From the folder that holds this tree (no GPU needed: Triton kernels run in the interpreter):", "",
             "```bash",
             f"PYTHONPATH=$PWD python -m pytest -q tests/{a.public_tests}",
             "```", "",
             ("The grader runs these public tests and more that you do not see (edge cases, bad inputs, "
              "property tests), each with a time limit."), "",
             "## Done means", "", a.done, "",
             f"Time estimate: {a.hours[0]}-{a.hours[1]} hours.", ""]
    if a.gpu_task:
        text += ["## GPU extension (a benchmark, not graded)", "", a.gpu_task, ""]
    return "\n".join(text)


def readme(numbers) -> str:
    rows = "\n".join(f"| {n} | [{ASSIGNMENTS[n].title}](handouts/{ASSIGNMENTS[n].slug}.md) | "
                     f"`tests/{ASSIGNMENTS[n].public_tests}` | {ASSIGNMENTS[n].hours[0]}-{ASSIGNMENTS[n].hours[1]} h |"
                     for n in numbers)
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
PYTHONPATH=$PWD python -m pytest -q tests/a01_public.py
python handin.py 1        # runs the public tests, then writes assignment-01-submission.zip
```

The grader runs the public tests and hidden ones on the files in the zip.
"""


HANDIN = '''"""Hand in one assignment: run its public tests, then zip the files you wrote (python handin.py N).

Written by `python -m minillm.assignments build`; the same format as `python -m minillm.assignments pack`.
"""
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

n = int(sys.argv[1]) if len(sys.argv) == 2 and sys.argv[1].isdigit() else None
if str(n) not in FILES:
    sys.exit(f"usage: python handin.py N, with N one of {{', '.join(FILES)}}")
root = Path(__file__).resolve().parent
rc = subprocess.call([sys.executable, "-m", "pytest", "-q", f"tests/a{{n:02d}}_public.py"], cwd=root,
                     env={{**os.environ, "PYTHONPATH": str(root)}})
files = FILES[str(n)]
manifest = {{"assignment": n, "title": TITLES[str(n)], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {{f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files}}}}
out = root / f"assignment-{{n:02d}}-submission.zip"
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for f in files:
        z.write(root / f, f)
    z.writestr("submission.json", json.dumps(manifest, indent=2))
print(f"wrote {{out}}" + ("" if rc == 0 else "  (some public tests fail: it is packed anyway)"))
'''


def handin_script(numbers) -> str:
    return HANDIN.format(files=repr({str(n): ASSIGNMENTS[n].files for n in numbers}),
                         titles=repr({str(n): ASSIGNMENTS[n].title for n in numbers}))


def build(out_dir, numbers=None, force: bool = False) -> dict:
    """Write the student tree; returns {"out_dir", "assignments", "stubbed"}. Leaks raise AssignmentError."""
    numbers = sorted(ASSIGNMENTS) if not numbers else sorted({get(n).number for n in numbers})
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not force:
            raise AssignmentError(f"{out} exists and is not empty; choose a new folder or pass --force")
        shutil.rmtree(out)
    stubs = stubbed_sources(numbers)
    pkg = out / "minillm"
    shutil.copytree(PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "assignments"))
    for py in pkg.rglob("*.py"):
        rel = py.relative_to(pkg).as_posix()
        py.write_text(stubs[rel] if rel in stubs else _strip_markers(py.read_text()))
    # Data files can quote the source too (chapter 9's held-out text is a snapshot of the package).
    exact, normalized = _solution_lines(numbers)
    scrubbed = {}
    for f in sorted(pkg.rglob("*")):
        if f.is_file() and f.suffix in TEXT_SUFFIXES and f.suffix != ".py":
            text, dropped = scrub(f.read_text(errors="surrogateescape"), exact, normalized)
            if dropped:
                f.write_text(text, errors="surrogateescape")
                scrubbed[f.relative_to(out).as_posix()] = dropped
    (out / "tests").mkdir()
    shutil.copy(TESTS_DIR / SUPPORT, out / "tests" / SUPPORT)
    (out / "handouts").mkdir()
    for n in numbers:
        a = ASSIGNMENTS[n]
        shutil.copy(TESTS_DIR / a.public_tests, out / "tests" / a.public_tests)
        (out / "handouts" / f"{a.slug}.md").write_text(handout(a))
    (out / "pytest.ini").write_text(PYTEST_INI)
    (out / "README.md").write_text(readme(numbers))
    (out / "handin.py").write_text(handin_script(numbers))
    leaks = leak_check(out, numbers)
    if leaks:
        raise AssignmentError(f"the student tree leaks {len(leaks)} solution line(s):\n" + "\n".join(leaks[:20]))
    return {"out_dir": str(out), "assignments": numbers, "stubbed": sorted(stubs), "scrubbed": scrubbed}


def leak_check(tree, numbers=None) -> list[str]:
    """Solution lines or markers of the handed-out assignments found in ``tree`` (empty: no leak)."""
    exact, normalized = _solution_lines(sorted(ASSIGNMENTS) if not numbers else numbers)
    return find_leaks(Path(tree), exact, normalized)


def _solution_lines(numbers) -> tuple[set[str], set[str]]:
    keep = {(p.path, p.qualname) for n in numbers for p in ASSIGNMENTS[get(n).number].parts}
    regions = [r for r in all_regions() if (r.path, r.qualname) in keep]
    return solution_lines(PACKAGE_DIR, regions)
