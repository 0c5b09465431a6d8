"""The book build drops the outputs of chapter cells tagged ``assignment-solution`` (loaded from _config.yml).

A chapter may print a graded assignment body (chapter 6 shows its FlashAttention forward and backward with
``source(...)``). Students read the book, so the site keeps such a cell's code and drops what it printed;
the committed notebook keeps its outputs for nbval. The student tree holds no chapters, so this is where the
tag takes effect (minillm.assignments.builder.strip_solution_outputs; the leak check flags an untagged cell
whose output quotes a graded body: ``python -m minillm.assignments leak-check-book``).
"""
from __future__ import annotations


def strip_source(app, docname: str, source: list) -> None:
    """Sphinx's source-read: rewrite a notebook's JSON without the outputs of its tagged cells."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    from minillm.assignments.builder import strip_notebook_text

    text, n = strip_notebook_text(source[0])
    if n:
        source[0] = text


def setup(app):
    app.connect("source-read", strip_source)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
