"""_ext/minillm_reading_time.py: the reading time each chapter page prints under its title."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

docutils = pytest.importorskip("docutils")
import docutils.nodes  # noqa: E402
from docutils.core import publish_doctree  # noqa: E402

SPEC = importlib.util.spec_from_file_location("minillm_reading_time",
                                              Path(__file__).resolve().parents[1] / "_ext" / "minillm_reading_time.py")
rt = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rt)

PAGE = """
Title
=====

One two three four five.

.. container:: cell_input

   ::

      x = 1

      y = 2

.. container:: cell_output

   ::

      printed words are not read as prose

.. math:: a + b

Six seven, eight-nine.

Exercises
---------

These ten words are exercises and are never counted at all here.

.. container:: cell_input

   ::

      z = 3
"""


def page():
    """PAGE as MyST-NB's doctree has it: cells are containers of class cell_input / cell_output (reST would
    normalize the underscore away)."""
    doctree = publish_doctree(PAGE)
    for node in doctree.findall(docutils.nodes.container):
        node["classes"] = [c.replace("-", "_") for c in node["classes"]]
    return doctree


def test_count_reads_prose_and_visible_code_before_the_exercises():
    words, code = rt.count(page())
    assert (words, code) == (1 + 5 + 3, 2)   # the title, two paragraphs; two non-blank code lines


def test_reading_minutes_rounds_up_and_rejects_negative_counts():
    assert rt.reading_minutes(0, 0) == 1
    assert rt.reading_minutes(rt.WORDS_PER_MINUTE, 0) == 1
    assert rt.reading_minutes(rt.WORDS_PER_MINUTE + 1, 0) == 2
    assert rt.reading_minutes(2000, 200) == 10 + 10
    with pytest.raises(ValueError, match="counts must be >= 0"):
        rt.reading_minutes(-1, 0)
