"""Solution markers: find the marked regions in a source file, stub them out, and check for leaks.

A region is a run of lines inside a function body::

    def f(x):
        \"\"\"Docstring stays.\"\"\"
        # BEGIN SOLUTION
        ...
        # END SOLUTION

The stub keeps everything outside the region (signature, docstring, any code before or
after) and puts ``raise NotImplementedError("assignment N: hint")`` in its place, at the
indentation of the BEGIN line. In the reference package the markers are comments, so
they change nothing.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .registry import AssignmentError

BEGIN = "# BEGIN SOLUTION"
END = "# END SOLUTION"
# Both words are searched for separately, so that this module itself never holds a marker line.
MARKER_WORDS = ("BEGIN SOLUTION", "END SOLUTION")


@dataclass(frozen=True)
class Region:
    path: str        # relative to the package root
    qualname: str    # the innermost enclosing function
    begin: int       # 0-based line index of the BEGIN marker
    end: int         # 0-based line index of the END marker
    indent: str


def functions(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    out = []

    def walk(node, prefix):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = prefix + ch.name
                if not isinstance(ch, ast.ClassDef):
                    out.append((q, ch))
                walk(ch, q + ".")
    walk(tree, "")
    return out


def find_regions(text: str, path: str) -> list[Region]:
    """Every marked region of one file, each tied to its enclosing function; bad markers raise."""
    lines = text.splitlines()
    if not any(w in text for w in MARKER_WORDS):
        return []
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise AssignmentError(f"{path}: cannot parse: {e}") from e
    funcs = functions(tree)
    regions, open_at = [], None
    for i, line in enumerate(lines):
        s = line.strip()
        if not any(w in s for w in MARKER_WORDS):
            continue
        if s not in (BEGIN, END):
            raise AssignmentError(f"{path}:{i + 1}: a marker must stand alone on its line, got {s!r}")
        if s == BEGIN:
            if open_at is not None:
                raise AssignmentError(f"{path}:{i + 1}: BEGIN inside the region opened at line {open_at + 1}")
            open_at = i
            continue
        if open_at is None:
            raise AssignmentError(f"{path}:{i + 1}: END without a BEGIN")
        indent = lines[open_at][:len(lines[open_at]) - len(lines[open_at].lstrip())]
        if line[:len(line) - len(line.lstrip())] != indent:
            raise AssignmentError(f"{path}:{i + 1}: END is not indented like its BEGIN (line {open_at + 1})")
        code = [k + 1 for k in range(open_at + 1, i) if lines[k].strip() and not lines[k].strip().startswith("#")]
        if not code:
            raise AssignmentError(f"{path}:{open_at + 1}: an empty solution region")
        inside = [(q, f) for q, f in funcs
                  if f.lineno < code[0] and code[-1] <= f.end_lineno and f.col_offset < len(indent)]
        if not inside:
            raise AssignmentError(f"{path}:{open_at + 1}: a solution region must lie inside a function body")
        qualname = max(inside, key=lambda qf: qf[1].lineno)[0]  # the innermost
        regions.append(Region(path, qualname, open_at, i, indent))
        open_at = None
    if open_at is not None:
        raise AssignmentError(f"{path}:{open_at + 1}: BEGIN SOLUTION is never closed")
    return regions


def stub(text: str, regions: list[Region], messages: dict[str, str]) -> str:
    """The file with each region named in ``messages`` (by qualname) replaced by
    ``raise NotImplementedError(message)``; other regions keep their code and lose their markers."""
    lines = text.splitlines(keepends=True)
    for r in sorted(regions, key=lambda r: r.begin, reverse=True):
        if r.qualname not in messages:  # a region of an assignment not handed out: keep it, drop its markers
            del lines[r.end]
            del lines[r.begin]
            continue
        lines[r.begin:r.end + 1] = [f"{r.indent}raise NotImplementedError({messages[r.qualname]!r})\n"]
    out = "".join(lines)
    compile(out, regions[0].path if regions else "<stub>", "exec")  # a stub must still be valid Python
    return out


def normalize(line: str) -> str:
    """A line with all whitespace removed: the leak check's second, looser comparison."""
    return "".join(line.split())


def solution_lines(package_dir: Path, regions: list[Region]) -> tuple[set[str], set[str]]:
    """(exact, normalized) forms of every region line that appears nowhere outside the regions.

    A line such as ``return out`` that the package also has outside any region is not a leak.
    """
    by_path: dict[str, list[Region]] = {}
    for r in regions:
        by_path.setdefault(r.path, []).append(r)
    inside, outside = set(), set()
    for py in sorted(package_dir.rglob("*.py")):
        rel = py.relative_to(package_dir).as_posix()
        if rel.startswith("assignments/"):
            continue
        lines = py.read_text().splitlines()
        marked = set()
        for r in by_path.get(rel, ()):
            marked.update(range(r.begin + 1, r.end))
            inside.update(lines[k].strip() for k in range(r.begin + 1, r.end))
        outside.update(line.strip() for k, line in enumerate(lines) if k not in marked)
    exact = {s for s in inside if s and s not in outside}
    norm_outside = {normalize(s) for s in outside}
    return exact, {normalize(s) for s in exact} - norm_outside


def scrub(text: str, exact: set[str], normalized: set[str]) -> tuple[str, int]:
    """Drop every solution line from a data file (the package ships a snapshot of its own source)."""
    kept, dropped = [], 0
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if s in exact or (normalize(s) and normalize(s) in normalized) or any(w in line for w in MARKER_WORDS):
            dropped += 1
        else:
            kept.append(line)
    return "".join(kept), dropped


TEXT_SUFFIXES = {".py", ".md", ".txt", ".ini", ".cfg", ".toml", ".json", ".ipynb", ".rst", ".yml", ".yaml"}


def find_leaks(tree: Path, exact: set[str], normalized: set[str]) -> list[str]:
    """Every line of every text file under ``tree`` that is a marker or a solution line."""
    leaks = []
    for f in sorted(tree.rglob("*")):
        if not f.is_file() or f.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for k, line in enumerate(text.splitlines()):
            s = line.strip()
            where = f"{f.relative_to(tree).as_posix()}:{k + 1}"
            if any(w in line for w in MARKER_WORDS):
                leaks.append(f"{where}: solution marker: {s}")
            elif s in exact:
                leaks.append(f"{where}: solution line: {s}")
            elif normalize(s) and normalize(s) in normalized:
                leaks.append(f"{where}: solution line (whitespace-normalized): {s}")
    return leaks
