"""The per-assignment part of the book's "For instructors" page, written from the registry and the test files.

``python -m minillm.assignments instructors-page instructors.md`` rewrites the block between the two
``assignments-generated`` comments; a test fails while the committed page differs from what this writes.
"""
from __future__ import annotations

import ast
from pathlib import Path

from .builder import TESTS_DIR
from .registry import ASSIGNMENTS, Assignment

START = "<!-- assignments-generated: start (python -m minillm.assignments instructors-page instructors.md) -->"
STOP = "<!-- assignments-generated: end -->"


def _tests(a: Assignment, file: str) -> tuple[str, list[str]]:
    tree = ast.parse((TESTS_DIR / file).read_text())
    doc = (ast.get_docstring(tree) or "").split(":", 1)[-1].strip().replace("\n", " ")
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return doc, names


def _section(a: Assignment) -> str:
    graded = [p for p in a.parts if not p.stretch]
    stretch = [p for p in a.parts if p.stretch]
    grader_doc, _ = _tests(a, a.grader_tests)
    _, public_names = _tests(a, a.public_tests)
    chapter = f"{{doc}}`{a.chapter}`"
    lines = [f"({a.label})=", f"### Assignment {a.number}: {a.title}", "",
             f"After {chapter}. {a.goal}", "",
             "Students write: " + ", ".join(f"`{p.module}.{p.qualname}`" for p in graded) + "."]
    if stretch:
        lines += ["", "Stretch (bonus points, outside the maximum): "
                  + ", ".join(f"`{p.module}.{p.qualname}`" for p in stretch) + "."]
    if a.builds_on:
        lines += ["", "Builds on assignment(s) " + ", ".join(str(n) for n in a.builds_on)
                  + ": their reference solutions stay in its tree and in its grading."]
    if a.forbid:
        lines += ["", "Its bodies may not use " + ", ".join(f"`{n}`" for n in a.forbid) + "."]
    lines += ["", f"Public tests (`{a.public_tests}`): " + ", ".join(f"`{n}`" for n in public_names) + ".", "",
              f"Grader-only tests (`{a.grader_tests}`): {grader_doc}", "",
              f"Done: {a.done}", "",
              f"Time estimate: {a.hours[0]}-{a.hours[1]} hours."]
    if a.gpu_task:
        lines += ["", f"GPU extension (a benchmark, not graded): {a.gpu_task}"]
    return "\n".join(lines)


def generated_block() -> str:
    rows = "\n".join(f"| {{ref}}`{a.number} <{a.label}>` | {a.title} | {a.hours[0]}-{a.hours[1]} h |"
                     for a in ASSIGNMENTS.values())
    table = "| # | Assignment | Time |\n|---|---|---|\n" + rows
    body = "\n\n".join(_section(a) for a in ASSIGNMENTS.values())
    return f"{START}\n\n{table}\n\n{body}\n\n{STOP}"


def update_page(path) -> bool:
    """Rewrite the generated block of the page; returns whether anything changed."""
    p = Path(path)
    text = p.read_text()
    if START not in text or STOP not in text:
        raise ValueError(f"{p} has no generated block: put the two lines\n{START}\n{STOP}\nwhere it belongs")
    head, rest = text.split(START, 1)
    tail = rest.split(STOP, 1)[1]
    new = head + generated_block() + tail
    if new != text:
        p.write_text(new)
    return new != text
