"""Chapters 4 and 5: attention's bytes through HBM, unfused and fused, and the online softmax's rescale."""
from __future__ import annotations

import math

import numpy as np

from .palette import COLORS, FONT, arrow, blank, box, color, label, new_figure, positive_int, tint, title


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 10 * 2**20 else f"{n / 2**20:,.0f} MiB"


def hbm_round_trips(n: int = 4096, d: int = 128, dtype: str = "fp16", block_m: int | None = None,
                    block_n: int | None = None):
    """One attention head, two ways. Left: three kernels (S = QK^T, P = softmax(S), O = PV), each reading its
    inputs from HBM and writing its output back, so the n x n matrices S and P cross four times. Right: one
    fused kernel that loops over Q tiles and, inside, over K/V tiles, keeping S and P on chip. Every arrow
    carries its bytes from the book's traffic model (``minillm.hardware``); the tile sizes default to the
    FlashAttention-1 rule for the H100's shared memory (``flash_block_size_for_sram``)."""
    from ..hardware import DTYPE_BYTES, GPUS, flash_attention_traffic, flash_block_size_for_sram, \
        standard_attention_traffic

    n = positive_int("n", n, at_least=2)
    d = positive_int("d", d)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    auto_m, auto_n = flash_block_size_for_sram(d, GPUS["H100 SXM"].smem_per_sm_bytes, DTYPE_BYTES[dtype])
    block_m = positive_int("block_m", auto_m if block_m is None else block_m)
    block_n = positive_int("block_n", auto_n if block_n is None else block_n)
    std = standard_attention_traffic(n, d, DTYPE_BYTES[dtype])
    fused = flash_attention_traffic(n, d, block_m, block_n, DTYPE_BYTES[dtype])
    c, f = std["components"], fused["components"]
    fig, (left, right) = new_figure(12.0, 3.9, ncols=2, width_ratios=[1.35, 1])
    for ax, xmax in ((left, 12), (right, 9)):
        ax.add_patch(_band(-0.55, 1.95, "memory"))
        ax.add_patch(_band(2.4, 1.6, "chip"))
        label(ax, xmax - 0.05, 1.2, "HBM (off chip)", ha="right", size="small", role="memory")
        label(ax, 0.05, 3.85, "on chip (SRAM, registers)", ha="left", size="small", role="chip")
    # unfused: three kernels, each a round trip
    kernels = [("S = Q K^T", 1.8), ("P = softmax(S)", 6.0), ("O = P V", 10.2)]
    for text, x in kernels:
        box(left, x - 1.0, 2.8, 2.0, 0.8, text, "compute", gid="kernel", bold=True)
    arrays = {"Q": 0.7, "K": 2.4, "S": 4.1, "P": 7.9, "V": 9.6, "O": 11.3}
    for name, x in arrays.items():
        role = "waste" if name in "SP" else "memory"
        size = f"{n}x{n}" if name in "SP" else f"{n}x{d}"
        box(left, x - 0.45, 0.35, 0.9, 0.6, f"{name}\n{size}", role, gid="hbm-array", fontsize=FONT["small"])
    moves = [("Q", 0, "read_q", True), ("K", 0, "read_k", True), ("S", 0, "write_s", False),
             ("S", 1, "read_s", True), ("P", 1, "write_p", False), ("P", 2, "read_p", True),
             ("V", 2, "read_v", True), ("O", 2, "write_o", False)]
    for name, k, key, read in moves:
        ax_x, kx = arrays[name], kernels[k][1] + (-0.5 if read else 0.5)
        start, end = ((ax_x, 0.95), (kx, 2.8)) if read else ((kx, 2.8), (ax_x, 0.95))
        arrow(left, start, end, role="waste" if name in "SP" else "ink")
    for name, x in arrays.items():   # each array's traffic, written under it
        parts = [f"{'read' if key.startswith('read') else 'written'} {_mib(c[key])}"
                 for m, _, key, _ in moves if m == name]
        label(left, x, 0.12 if len(parts) == 1 else 0.05, "\n".join(parts), size="small", va="top")
    label(left, 6.0, -0.75, f"total {_mib(std['total'])}; S and P alone {_mib(4 * std['score_matrix_bytes'])}",
          size="label")
    blank(left, (0, 12), (-0.95, 4.1))
    title(left, f"Unfused: three kernels, S and P through HBM (n = {n}, d = {d}, {dtype})")
    # fused: one kernel, a loop over tiles
    box(right, 0.8, 2.55, 7.4, 1.15, "", "compute", gid="kernel")
    label(right, 4.5, 3.45, "one fused kernel", size="label").set_fontweight("bold")
    label(right, 4.5, 3.15, f"for each Q tile ({fused['q_tiles']} tiles of {block_m} rows):  for each K/V tile "
          f"({math.ceil(n / block_n)} of {block_n}):", size="small")
    label(right, 4.5, 2.8, "S_ij = Q_i K_j^T,  P_ij, rescale O_i  (S and P never leave the chip)", size="small")
    for name, x, key, read in (("Q", 1.5, "read_q", True), ("K", 3.5, "read_k", True), ("V", 5.5, "read_v", True),
                               ("O", 7.5, "write_o", False)):
        box(right, x - 0.45, 0.35, 0.9, 0.6, f"{name}\n{n}x{d}", "memory", gid="hbm-array", fontsize=FONT["small"])
        times = f" ({fused['q_tiles']}x)" if name in "KV" else ""
        start, end = ((x, 0.95), (x, 2.55)) if read else ((x, 2.55), (x, 0.95))
        arrow(right, start, end)
        label(right, x, 0.12, f"{'read' if read else 'written'} {_mib(f[key])}" + (f"\n{times.strip()}" if times else ""),
              size="small", va="top")
    label(right, 4.5, -0.75, f"total {_mib(fused['total'])}: {std['total'] / fused['total']:.1f}x fewer bytes",
          size="label")
    blank(right, (0, 9), (-0.95, 4.1))
    title(right, f"Fused: one loop over tiles ({block_m} x {block_n})")
    return fig


def _band(y, h, role):
    from matplotlib.patches import Rectangle

    return Rectangle((-10, y), 40, h, facecolor=tint(role), edgecolor="none", alpha=0.45, zorder=-1)


def _default_scores():
    # a fixed draw whose running maximum rises in a later tile by enough that l visibly shrinks (2.30 -> 1.71):
    # the picture shows a rescale doing something
    return np.round(np.random.default_rng(7).normal(0.0, 1.5, 12), 1)


def online_softmax_rescale(scores=None, tile: int = 4):
    """The online softmax over ``scores`` in tiles of ``tile``: the bars are the scores, the step line the
    running maximum m after each tile; below, each tile's update of the running sum l and of the output
    accumulator O, both multiplied by exp(m_old - m_new) whenever the maximum moves. Numbers come from
    ``minillm.explorables.online_softmax_steps`` (what chapter 5's explorable computes)."""
    from ..explorables import online_softmax_steps

    scores = _default_scores() if scores is None else np.asarray(scores, dtype=np.float64)
    tile = positive_int("tile", tile)
    if scores.ndim != 1 or not 2 <= scores.size <= 32 or not np.isfinite(scores).all():
        raise ValueError(f"scores must be 2 to 32 finite numbers, got shape {scores.shape}")
    if math.ceil(scores.size / tile) > 6:
        raise ValueError(f"tile must cut the scores into at most 6 tiles to draw legibly, got tile={tile}")
    steps = online_softmax_steps(scores, tile)
    fig, (top, bottom) = new_figure(2.0 + 2.3 * len(steps), 5.2, nrows=2, height_ratios=[1.1, 1])
    xs = np.arange(scores.size)
    top.set_ylim(min(scores.min(), 0) * 1.15 - 0.3, max(scores.max(), 0) * 1.3 + 0.5)
    for s in steps:
        lo = s["tile"] * tile
        hi = min(lo + tile, scores.size)
        top.axvspan(lo - 0.5, hi - 0.5, color=tint("neutral") if s["tile"] % 2 else "white", zorder=0)
        top.hlines(s["m"], lo - 0.5, hi - 0.5, color=color("compute"), lw=2, zorder=3)
        top.text((lo + hi - 1) / 2, top.get_ylim()[1] * 0.97, f"tile {s['tile']}", ha="center", va="top",
                  fontsize=FONT["small"])
    bars = top.bar(xs, scores, color=color("memory"), width=0.7, zorder=2)
    for b in bars:
        b.set_gid("score-bar")
    top.axhline(0, color=COLORS["ink"], lw=0.6)
    top.set_xticks(xs)
    top.set_xticklabels([str(i) for i in xs], fontsize=FONT["small"])
    top.set_xlabel("score index", fontsize=FONT["small"])
    top.set_ylabel("score", fontsize=FONT["label"])
    top.spines[["top", "right"]].set_visible(False)
    top.set_xlim(-0.6, scores.size - 0.4)
    title(top, f"Online softmax: {scores.size} scores in tiles of {tile}, one pass (bars: the scores; "
          "blue line: the running maximum m)")
    w = 2.0
    for i, s in enumerate(steps):
        x = i * (w + 0.6)
        moved = s["rescale"] < 1.0 and math.isfinite(s["m_old"])
        role = "compute" if moved else "neutral"
        m_old = "-inf" if not math.isfinite(s["m_old"]) else f"{s['m_old']:.1f}"
        box(bottom, x, 1.2, w, 1.0, f"m: {m_old} -> {s['m']:.1f}\nrescale exp({m_old} - {s['m']:.1f})\n"
            f"= {s['rescale']:.3f}", role, gid="rescale-step", fontsize=FONT["small"])
        box(bottom, x, 0.0, w, 0.8, f"l = {s['l']:.3f}\nO = {s['rescale']:.3f} O + P V", "chip", gid="accumulator",
            fontsize=FONT["small"])
        arrow(bottom, (x + w / 2, 1.2), (x + w / 2, 0.8))
        if i:
            arrow(bottom, (x - 0.6, 0.4), (x, 0.4))
    x_end = len(steps) * (w + 0.6)
    box(bottom, x_end, 0.0, 1.2, 0.8, "O / l", "chip", bold=True)
    arrow(bottom, (x_end - 0.6, 0.4), (x_end, 0.4))
    label(bottom, 0.0, 2.55, "blue: the maximum moved, so l and O shrink by the rescale factor before the tile's "
          "terms are added; grey: no rescale", ha="left", size="small")
    blank(bottom, (-0.1, x_end + 1.3), (-0.1, 2.8))
    return fig
