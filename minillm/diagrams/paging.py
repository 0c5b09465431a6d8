"""Chapter 7: contiguous slabs against fixed blocks (reserved, internal and external waste), and split-K decoding."""
from __future__ import annotations

import inspect
import math

from .palette import FONT, arrow, blank, box, label, new_figure, positive_int, title

NAMES = "ABCDEFGH"


def default_block_size() -> int:
    from ..paged.allocator import BlockAllocator

    return inspect.signature(BlockAllocator.__init__).parameters["block_size"].default


def block_table(seq_lens=(37, 12, 50), reserved=(64, 24, 80), finished: int = 1, waiting: int = 32,
                block_size: int | None = None):
    """The same memory managed two ways. Top: contiguous slabs, one per sequence, each reserving ``reserved[i]``
    tokens for ``seq_lens[i]`` used (reserved waste); sequence ``finished`` has ended, leaving a hole that a
    waiting request of ``waiting`` tokens cannot use although enough memory is free in total (external waste).
    Bottom: the pool cut into blocks of ``block_size`` tokens (default: the package's ``BlockAllocator``); each
    sequence's block table maps its logical blocks to physical ones, allocated by the real ``BlockAllocator`` as
    the sequences grow token by token, the finished one's blocks freed and the waiting request admitted. The
    only waste is the unfilled tail of each sequence's last block (internal waste)."""
    from ..paged.allocator import BlockAllocator

    seq_lens = [positive_int("seq_lens", v) for v in seq_lens]
    reserved = [positive_int("reserved", v) for v in reserved]
    if not 2 <= len(seq_lens) <= 6 or len(reserved) != len(seq_lens):
        raise ValueError(f"seq_lens and reserved must hold the same number (2 to 6) of lengths, got "
                         f"{len(seq_lens)} and {len(reserved)}")
    if any(u > r for u, r in zip(seq_lens, reserved)):
        raise ValueError(f"reserved must be >= seq_lens for every sequence, got {reserved} for {seq_lens}")
    finished = positive_int("finished", finished, at_least=0, at_most=len(seq_lens) - 1)
    waiting = positive_int("waiting", waiting)
    if waiting <= reserved[finished]:
        raise ValueError(f"waiting ({waiting}) must exceed the hole the finished sequence leaves "
                         f"({reserved[finished]}), or there is no external fragmentation to show")
    block_size = positive_int("block_size", default_block_size() if block_size is None else block_size)
    tail = waiting - 1                         # free at the end of the pool: too short on its own, as is the hole
    pool_tokens = sum(reserved) + tail
    num_blocks = pool_tokens // block_size
    if num_blocks > 40:
        raise ValueError(f"{num_blocks} blocks of {block_size} tokens are too many to draw: raise block_size")
    fig, (top, bottom) = new_figure(11.0, 6.2, nrows=2, height_ratios=[1, 2.1])
    # -- contiguous slabs
    scale = 10.0 / pool_tokens
    x = 0.0
    for i, (used, res) in enumerate(zip(seq_lens, reserved)):
        name = NAMES[i]
        if i == finished:
            box(top, x, 0, res * scale, 0.6, f"hole ({res})", "neutral", gid="hole", fontsize=FONT["small"])
        else:
            box(top, x, 0, used * scale, 0.6, f"{name}: {used}", "chip", gid="used", fontsize=FONT["small"])
            box(top, x + used * scale, 0, (res - used) * scale, 0.6, "", "waste", gid="reserved", hatch="//")
        x += res * scale
    box(top, x, 0, tail * scale, 0.6, f"free ({tail})", "neutral", gid="hole", fontsize=FONT["small"])
    live = [i for i in range(len(seq_lens)) if i != finished]
    reserved_waste = sum(reserved[i] - seq_lens[i] for i in live)
    label(top, 0, 0.95, f"reserved but unused: {reserved_waste} tokens (hatched).  Free: {reserved[finished]} + "
          f"{tail} = {reserved[finished] + tail} tokens, yet no gap holds the waiting request of {waiting} "
          "tokens (external fragmentation)", ha="left", size="small")
    blank(top, (-0.2, 10.2), (-0.3, 1.3))
    title(top, f"Contiguous slabs: {pool_tokens} tokens of cache, one slab per sequence")
    # -- paged: the real allocator, sequences growing round-robin
    alloc = BlockAllocator(num_blocks, block_size)
    tables: dict[int, list[int]] = {i: [] for i in range(len(seq_lens))}
    for t in range(max(seq_lens)):
        for i, n in enumerate(seq_lens):
            if t < n and t % block_size == 0:
                tables[i].append(alloc.allocate())
    for b in tables.pop(finished):
        alloc.decref(b)
    lens = {i: seq_lens[i] for i in tables}
    new = len(seq_lens)
    tables[new], lens[new] = [alloc.allocate() for _ in range(math.ceil(waiting / block_size))], waiting
    owner = {b: (i, k) for i, tab in tables.items() for k, b in enumerate(tab)}
    y = 0.0
    cell = 0.55
    for i in sorted(tables, reverse=True):
        tab, n = tables[i], lens[i]
        name = NAMES[i] if i < new else f"{NAMES[new]} (was waiting)"
        label(bottom, -0.2, y + cell / 2, f"{name}, {n} tokens", ha="right", size="small")
        for k in range(len(tab)):
            fill = min(block_size, n - k * block_size) / block_size
            box(bottom, k * cell, y, cell * fill * 0.92, cell, "", "chip", gid="logical-block", lw=0.7)
            if fill < 1:
                box(bottom, k * cell + cell * fill * 0.92, y, cell * (1 - fill) * 0.92, cell, "", "waste",
                    gid="internal-waste", hatch="//", lw=0.5)
        box(bottom, 4.0, y, 0.45 * len(tab) + 0.2, cell, "[" + ", ".join(map(str, tab)) + "]", "compute",
            gid="block-table", fontsize=FONT["small"])
        y += cell + 0.3
    label(bottom, 0, y + 0.05, "logical blocks", ha="left", size="small")
    label(bottom, 4.0, y + 0.05, "block table", ha="left", size="small")
    cols = 8
    px0 = 7.2
    for b in range(num_blocks):
        r, c = divmod(b, cols)
        bx, by = px0 + c * cell, y - (r + 1) * (cell + 0.08)
        if b in owner:
            i, k = owner[b]
            box(bottom, bx, by, cell * 0.92, cell, f"{NAMES[i]}{k}", "chip", gid="physical-block",
                fontsize=FONT["small"] - 1)
        else:
            box(bottom, bx, by, cell * 0.92, cell, str(b), "neutral", gid="physical-block", fontsize=FONT["small"] - 1)
    label(bottom, px0, y + 0.05, f"physical pool: {num_blocks} blocks (block id = row x {cols} + column)",
          ha="left", size="small")
    internal = sum(len(t) * block_size - lens[i] for i, t in tables.items())
    label(bottom, 0, -0.35, f"the only waste: {internal} tokens in partly filled last blocks (hatched); a block of "
          f"{block_size} tokens is either owned or free, so any free block serves any sequence", ha="left",
          size="small")
    blank(bottom, (-2.6, px0 + cols * cell + 0.2),
          (min(-0.6, y - (math.ceil(num_blocks / cols) + 1) * (cell + 0.08)), y + 0.4))
    title(bottom, f"Paged: the same memory as {num_blocks} blocks of {block_size} tokens")
    return fig


def split_k_decode(context: int = 1024, batch: int = 16, n_kv_heads: int | None = None, gpu: str = "H200",
                   tile: int = 64):
    """One decode query against a long context, split across programs: the keys are cut into the split count
    the book's paged decode kernel picks (``minillm.batch_invariant.gpu_split_count``: enough programs for one
    wave of about four per SM, given ``batch`` sequences and ``n_kv_heads``, default Llama 3.1 8B's), each split
    computes a partial (m_s, l_s, o_s) with the online softmax, and a merge rescales and sums them."""
    from ..batch_invariant import gpu_split_count, split_bounds_by_count
    from ..hardware import GPUS
    from ..sizing import MODELS

    context = positive_int("context", context)
    batch = positive_int("batch", batch)
    n_kv_heads = positive_int("n_kv_heads", MODELS["Llama 3.1 8B"].n_kv_heads if n_kv_heads is None else n_kv_heads)
    tile = positive_int("tile", tile)
    if gpu not in GPUS:
        raise ValueError(f"gpu must be a GPU of minillm.hardware.GPUS, got {gpu!r}")
    sms = GPUS[gpu].sm_count
    splits = gpu_split_count(batch, n_kv_heads, context, sms)
    if splits > 8:
        raise ValueError(f"batch={batch}, n_kv_heads={n_kv_heads} and context={context} give {splits} splits on "
                         f"the {gpu}; at most 8 draw legibly (raise batch)")
    bounds = split_bounds_by_count(context, splits, tile)
    fig, ax = new_figure(9.5, 4.2)
    width = 10.0
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        x0, x1 = width * a / context, width * b / context
        box(ax, x0, 3.0, x1 - x0 - 0.05, 0.5, f"keys {a}..{b - 1}", "memory", gid="kv-split", fontsize=FONT["small"])
        cx = (x0 + x1) / 2
        box(ax, cx - 0.9, 1.6, 1.8, 0.7, f"program {s}\n(m{s}, l{s}, o{s})", "compute", gid="split-program",
            fontsize=FONT["small"])
        arrow(ax, (cx, 3.0), (cx, 2.3))
        arrow(ax, (cx, 1.6), (width / 2, 0.75))
    box(ax, width / 2 - 2.6, 0.0, 5.2, 0.75, "merge: m = max m_s;  O = sum_s e^(m_s - m) o_s / sum_s e^(m_s - m) l_s",
        "chip", gid="merge", fontsize=FONT["small"])
    label(ax, 0, 3.85, f"one query row against {context} cached keys (one sequence, one KV head)", ha="left",
          size="small")
    label(ax, width, -0.35, f"{batch} sequences x {n_kv_heads} KV heads = {batch * n_kv_heads} programs unsplit; "
          f"the {gpu}'s {sms} SMs take about {4 * sms} at once -> {splits} splits", ha="right", size="small")
    blank(ax, (-0.2, width + 0.2), (-0.6, 4.1))
    title(ax, f"Split-K decoding: {splits} programs share one sequence's keys, then merge")
    return fig
