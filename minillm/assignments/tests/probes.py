"""Measurements a grader test takes of the student's run, beside tracemalloc's: each is a registered call
(``replay_codec.OBSERVED``), so in the replay it returns what it measured in the child, where the student's code
ran.

* :func:`count_loads` counts, while it is open, the elements that Triton's interpreter loads (the lanes of each
  ``tl.load`` that its mask lets through); :func:`loaded_elements` reads the count, and
  :func:`most_loaded_by_one_program` the largest count of one program (one launch's grid and program id). A kernel
  that reads its input more often than its algorithm needs (a max pass, a sum pass, then the write) loads more; one
  whose first program does every split's work loads more in that program.
* :func:`record_forward` lists, while it is open, every call of ``Model.forward``: the ids' shape, whether a cache
  was passed, and the counters its ``ops`` held after it; :func:`forward_calls` reads the list. A decoder that
  uses a cache where it should re-run the sequence, or re-runs it where it should use the cache, and fills its
  counters from a formula, calls the model otherwise.
"""
from __future__ import annotations

import contextlib

_count = {"elements": 0, "programs": {}}
_forward_calls: list = []


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
        # (every load reaches this method: plain, masked, block pointers and tensor descriptors)
        n = int(np.size(ptrs.data) if mask is None else np.count_nonzero(mask.data))
        _count["elements"] += n
        program = (getattr(self, "grid_dim", None), getattr(self, "grid_idx", None))
        _count["programs"][program] = _count["programs"].get(program, 0) + n
        return original(self, ptrs, mask, *args, **kwargs)
    _count["elements"], _count["programs"] = 0, {}
    builder.create_masked_load = counting
    try:
        yield
    finally:
        builder.create_masked_load = original


def loaded_elements() -> int:
    """The elements loaded inside the last :func:`count_loads` block (so far, inside an open one)."""
    return _count["elements"]


def most_loaded_by_one_program() -> int:
    """The most elements one program loaded inside the last :func:`count_loads` block."""
    return max(_count["programs"].values(), default=0)


@contextlib.contextmanager
def record_forward():
    """List every ``minillm.model.Model.forward`` call from here to the end of the block (the list starts empty)."""
    import inspect

    import numpy as np
    from minillm.model import Model

    original = Model.__dict__["forward"]
    signature = inspect.signature(original)

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        ops = bound.get("ops")
        counted = None if ops is None else [int(ops.attn_rows), int(ops.score_elements), int(ops.proj_flops)]
        _forward_calls.append({"shape": [int(n) for n in np.shape(bound["ids"])],
                               "cache": bound.get("cache") is not None, "ops": counted})
        return out
    _forward_calls.clear()
    Model.forward = recording
    try:
        yield
    finally:
        Model.forward = original


def forward_calls() -> list:
    """The calls :func:`record_forward` listed: dicts of ``shape``, ``cache`` (bool) and ``ops`` ([attn_rows,
    score_elements, proj_flops] after the call, or None)."""
    return [dict(c) for c in _forward_calls]
