"""Each chapter's reading time, under its title on the website (loaded from _config.yml).

Computed at build time from what the page shows before its "Exercises" section: the words of its prose (not
code, outputs or math) at ``WORDS_PER_MINUTE``, and the lines of its visible code at ``CODE_LINES_PER_MINUTE``
(code is read slower than prose). Counted from the rendered document, so it is never typed and never stale.
"""
from __future__ import annotations

import math
import re

from docutils import nodes

WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 20
WORD = re.compile(r"[A-Za-z0-9]+(?:['’.-][A-Za-z0-9]+)*")


def reading_minutes(words: int, code_lines: int) -> int:
    """Minutes to read ``words`` of prose and ``code_lines`` of code, rounded up to whole minutes (at least 1)."""
    if words < 0 or code_lines < 0:
        raise ValueError(f"counts must be >= 0, got {words} words and {code_lines} code lines")
    return max(1, math.ceil(words / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE))


def _classes(node) -> set:
    return set(node.get("classes", [])) if isinstance(node, nodes.Element) else set()


def _skipped(node) -> bool:
    """Inside something a reader does not read as prose: an output, a hidden cell, math, raw HTML."""
    while node is not None:
        if isinstance(node, (nodes.math, nodes.math_block, nodes.raw, nodes.literal_block, nodes.comment)):
            return True
        if _classes(node) & {"cell_output", "tag_remove-input", "tag_remove-cell"}:
            return True
        node = node.parent
    return False


def count(doctree) -> tuple[int, int]:
    """(prose words, visible code lines) of the document before a section titled "Exercises"."""
    stop = next((s for s in doctree.findall(nodes.section)
                 if s.children and isinstance(s[0], nodes.title) and s[0].astext().strip() == "Exercises"), None)
    words = code = 0
    for node in doctree.findall(nodes.Text):
        if stop is not None and _inside(node, stop):
            continue
        if not _skipped(node.parent):
            words += len(WORD.findall(node.astext()))
    for block in doctree.findall(nodes.literal_block):
        if (stop is None or not _inside(block, stop)) and not _skipped(block.parent) \
                and any("cell_input" in _classes(p) for p in _ancestors(block)):
            code += len([line for line in block.astext().splitlines() if line.strip()])
    return words, code


def _ancestors(node):
    while node is not None:
        yield node
        node = node.parent


def _inside(node, ancestor) -> bool:
    return any(p is ancestor for p in _ancestors(node))


def add_reading_time(app, doctree) -> None:
    if not app.env.docname.startswith("chapters/"):
        return
    top = next(iter(doctree.findall(nodes.section)), None)
    if top is None or not isinstance(top[0], nodes.title):
        return
    words, code = count(doctree)
    minutes = reading_minutes(words, code)
    para = nodes.paragraph(classes=["reading-time"])
    para += nodes.emphasis(text=f"Reading time: about {minutes} minutes ({words:,} words of text and {code:,} "
                                f"lines of code, exercises not counted).")
    top.insert(1, para)


def setup(app):
    app.connect("doctree-read", add_reading_time)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
