"""Chapter 11's diagram: one sequence's keys cut into pieces by the batch it decodes in."""
from __future__ import annotations

from .palette import FONT, arrow, blank, box, label, new_figure, positive_int, title


def batch_dependent_cuts(context: int = 1000, batches=(1, 16), n_kv_heads: int | None = None,
                         gpu: str = "H100 SXM", tile: int | None = None):
    """The same sequence's keys, cut by the split count the paged decode kernel picks for each batch size in
    ``batches`` (``minillm.batch_invariant.gpu_split_count``, every piece whole tiles of ``tile`` keys, default the
    kernel's ``DEFAULT_TILE``), with the pieces' partial sums added in order below each cut: the same numbers,
    another order of roundings. ``n_kv_heads`` defaults to the 1B shape's (``minillm.model.LLAMA_1B``)."""
    from ..batch_invariant import gpu_split_count, split_bounds_by_count
    from ..hardware import GPUS
    from ..model import LLAMA_1B

    context = positive_int("context", context)
    n_kv_heads = positive_int("n_kv_heads", LLAMA_1B.n_kv_heads if n_kv_heads is None else n_kv_heads)
    tile = positive_int("tile", 64 if tile is None else tile)  # (DEFAULT_TILE, without importing the kernels)
    if gpu not in GPUS:
        raise ValueError(f"gpu must be a GPU of minillm.hardware.GPUS, got {gpu!r}")
    if isinstance(batches, (str, bytes)) or not hasattr(batches, "__len__") or not 1 <= len(batches) <= 3:
        raise ValueError(f"batches must be 1 to 3 batch sizes, got {batches!r}")
    batches = [positive_int("batches", b) for b in batches]
    sms = GPUS[gpu].sm_count
    cuts = {b: split_bounds_by_count(context, gpu_split_count(b, n_kv_heads, context, sms), tile) for b in batches}
    if max(len(c) - 1 for c in cuts.values()) > 32:
        raise ValueError(f"batches {batches} give more than 32 pieces of {context} keys; at most 32 draw legibly")

    width, row_h = 10.0, 2.0
    fig, ax = new_figure(9.5, 0.6 + 1.1 * row_h * len(batches))
    for r, b in enumerate(batches):
        bounds = cuts[b]
        y = -r * row_h
        n = len(bounds) - 1
        label(ax, 0, y + 0.75, f"in a batch of {b}: {n} piece{'s' if n > 1 else ''} "
              f"(the kernel's split count for {b} x {n_kv_heads} KV heads on the {gpu}'s {sms} SMs)",
              ha="left", size="small")
        for s in range(n):
            x0, x1 = width * bounds[s] / context, width * bounds[s + 1] / context
            box(ax, x0, y, x1 - x0 - 0.03, 0.45, f"s{s}" if n <= 16 else "", "memory", gid="cut-piece",
                fontsize=FONT["small"] - 1)
        arrow(ax, (width / 2, y - 0.02), (width / 2, y - 0.4))
        box(ax, width / 2 - 3.0, y - 0.78, 6.0, 0.36, f"result = {_order(n)}, every + rounded", "compute",
            gid="cut-merge", fontsize=FONT["small"])
    label(ax, 0, 1.2, f"one sequence's {context} cached keys (one KV head): each piece s_i is summed on its own, "
          "then the pieces are added", ha="left", size="small")
    blank(ax, (-0.2, width + 0.2), (-(len(batches) - 1) * row_h - 1.0, 1.45))
    title(ax, "The same keys, cut where the batch says: the same numbers added in another order")
    return fig


def _order(n: int) -> str:
    """The order in which ``n`` partial sums are added, left to right: ((s0 + s1) + s2) + s3."""
    if n == 1:
        return "s0 (one running sum over every key)"
    shown = list(range(min(n, 3))) + ([None, n - 1] if n > 4 else [n - 1] if n == 4 else [])
    expr = "s0"
    for i, s in enumerate(shown[1:]):
        term = "..." if s is None else f"s{s}"
        expr = f"{expr} + {term}" if i == 0 else f"({expr}) + {term}"
    return expr
