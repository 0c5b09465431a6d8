"""The book's diagrams, drawn by code so that they are tested and redrawn when the numbers change.

Every function returns a :class:`matplotlib.figure.Figure` (not registered with pyplot: a notebook shows the
returned figure once) and takes the numbers it shows as arguments, with defaults computed from the package's
model configs (``minillm.model``, ``minillm.sizing``), GPU registry (``minillm.hardware``) and algorithms. A bad
argument raises ValueError naming it. matplotlib is imported only when a diagram is drawn, so ``import minillm``
and ``import minillm.diagrams`` need NumPy alone. The colours are one palette for the whole book
(:mod:`minillm.diagrams.palette`).

``CHAPTERS`` lists, per chapter, the diagrams that go before the code they explain.
"""
from __future__ import annotations

import importlib

# chapter -> [(module, function)], in the order the chapter shows them
CHAPTERS: dict[int, list[tuple[str, str]]] = {
    1: [("decoding", "autoregressive_loop")],
    2: [("decoding", "kv_cache_per_layer")],
    3: [("memory", "kv_bytes_vs_context"), ("memory", "gqa_head_grouping")],
    4: [("attention", "hbm_round_trips")],
    5: [("attention", "online_softmax_rescale")],
    6: [("flash", "flash_tile_dataflow"), ("flash", "flash_loops"), ("flash", "hopper_overlap")],
    7: [("paging", "block_table"), ("paging", "split_k_decode")],
    8: [("serving", "ragged_batch"), ("serving", "chunked_prefill_trade")],
    9: [("speculation", "draft_verify_round")],
    10: [("composition", "composition_ladder"), ("serving", "latency_throughput_frontier")],
    11: [("invariance", "batch_dependent_cuts")],
}
__all__ = sorted({name for items in CHAPTERS.values() for _, name in items}) + ["CHAPTERS"]


def __getattr__(name: str):
    """``minillm.diagrams.autoregressive_loop`` etc., imported on first use."""
    for items in CHAPTERS.values():
        for module, function in items:
            if function == name:
                return getattr(importlib.import_module(f"{__name__}.{module}"), function)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
