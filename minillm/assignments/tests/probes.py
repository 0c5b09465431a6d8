"""Measurements a grader test takes of the student's run, beside tracemalloc's: each is a registered call
(``replay_codec.OBSERVED``), so in the replay it returns what it measured in the child, where the student's code
ran.

* :func:`count_loads` counts, while it is open, the elements that Triton's interpreter loads (the lanes of each
  ``tl.load`` that its mask lets through); :func:`loaded_elements` reads the count. A kernel that reads its input
  more often than its algorithm needs (a max pass, a sum pass, then the write) loads more.
"""
from __future__ import annotations

import contextlib

_count = {"elements": 0}


@contextlib.contextmanager
def count_loads():
    """Count the elements the interpreter loads from here to the end of the block (it starts from zero)."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.__dict__.get("create_masked_load")
    if original is None:
        raise RuntimeError("this Triton's interpreter has no InterpreterBuilder.create_masked_load to count loads "
                           "through (the grader's load counts were written against Triton 3.6)")

    def counting(self, ptrs, mask, *args, **kwargs):
        _count["elements"] += int(np.count_nonzero(mask.data))
        return original(self, ptrs, mask, *args, **kwargs)
    _count["elements"] = 0
    builder.create_masked_load = counting
    try:
        yield
    finally:
        builder.create_masked_load = original


def loaded_elements() -> int:
    """The elements loaded inside the last :func:`count_loads` block (so far, inside an open one)."""
    return _count["elements"]
