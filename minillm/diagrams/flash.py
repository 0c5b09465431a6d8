"""Chapter 6: FlashAttention's tiles, its forward and backward loops, and how Hopper overlaps softmax with matmuls."""
from __future__ import annotations

import math

from ..hardware import GPUS
from .palette import FONT, arrow, blank, box, label, new_figure, positive_int, title

# The H100 SXM5's special-function (exp) throughput, derived from the registry's dense bf16 peak: that peak counts
# 4 tensor cores x 512 FMA = 4096 FLOP per clock per SM, and exp2 issues 16 per clock per SM on compute
# capability 9.0 (CUDA C++ Programming Guide, arithmetic instruction throughput), so at the peak's clock the exp
# rate is peak x 16 / 4096 (chapter 6 computes it the same way). FlashAttention-3 (Shah et al. 2024, section 3.1)
# states the same figure rounded: "989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of special functions";
# tests/test_diagrams.py checks the two agree.
TC_BF16_FLOP_PER_CLOCK_SM = 4096
EXP2_PER_CLOCK_SM = 16
H100_EXP_PER_S = GPUS["H100 SXM"].bf16_flops * EXP2_PER_CLOCK_SM / TC_BF16_FLOP_PER_CLOCK_SM


def _grid(n, block_m, block_n, n_max=12):
    tr, tc = math.ceil(n / block_m), math.ceil(n / block_n)
    if max(tr, tc) > n_max:
        raise ValueError(f"n / block sizes give a {tr} x {tc} tile grid; at most {n_max} x {n_max} draws legibly "
                         "(raise block_m/block_n or lower n)")
    return tr, tc


def flash_tile_dataflow(n: int = 1024, block_m: int = 128, block_n: int = 128, q_tile: int | None = None,
                        causal: bool = True):
    """The score matrix as a grid of ``ceil(n/block_m) x ceil(n/block_n)`` tiles. One program owns one Q tile
    (its row, highlighted): it loads Q_i once, streams K_j and V_j tile by tile along the row (the inner loop),
    keeps S_ij and P_ij on chip, and writes O_i once. With ``causal`` the tiles above the diagonal are skipped.
    Other rows are other programs, running in parallel."""
    n = positive_int("n", n, at_least=2)
    block_m, block_n = positive_int("block_m", block_m), positive_int("block_n", block_n)
    tr, tc = _grid(n, block_m, block_n)
    q_tile = positive_int("q_tile", tr // 2 if q_tile is None else q_tile, at_least=0, at_most=tr - 1)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    fig, ax = new_figure(7.0, 5.4)
    s = 0.5
    top = tr * s
    for j in range(tc):
        box(ax, j * s, top + 0.25, s * 0.9, s * 0.9, f"K{j}\nV{j}" if tc <= 10 else "", "memory", gid="kv-tile",
            fontsize=FONT["small"] - 1)
    for i in range(tr):
        y = top - (i + 1) * s
        box(ax, -s - 0.25, y, s * 0.9, s * 0.9, f"Q{i}", "compute", gid="q-tile", fontsize=FONT["small"] - 1)
        box(ax, tc * s + 0.25, y, s * 0.9, s * 0.9, f"O{i}", "chip" if i == q_tile else "neutral", gid="o-tile",
            fontsize=FONT["small"] - 1)
        for j in range(tc):
            masked = causal and j * block_n > (i + 1) * block_m - 1       # every key of the tile is in the future
            mine = i == q_tile
            role = "neutral" if masked else "chip" if mine else "compute"
            box(ax, j * s, y, s * 0.9, s * 0.9, "", role, gid="score-tile", alpha=1.0 if mine or masked else 0.35,
                lw=0.7)
    y_row = top - (q_tile + 0.5) * s
    last = max(j for j in range(tc) if not (causal and j * block_n > (q_tile + 1) * block_m - 1))
    arrow(ax, (0.05, y_row), ((last + 0.85) * s, y_row), role="chip", lw=2)
    label(ax, tc * s / 2, -0.35, f"row {q_tile}: one program. Q{q_tile} loaded once; K_j, V_j streamed for j = 0.."
          f"{last}; S, P stay on chip; O{q_tile} written once", size="small")
    label(ax, tc * s / 2, top + 0.25 + s + 0.2, f"K/V tiles ({block_n} keys each), read from HBM", size="small")
    label(ax, -s - 0.35, top / 2, f"Q tiles ({block_m} rows)", size="small", ha="right", rotation=90)
    if causal:
        label(ax, tc * s + s + 0.45, top - s, "grey: skipped\n(causal mask)", size="small", ha="left")
    blank(ax, (-s - 1.0, tc * s + s + 1.6), (-0.6, top + s + 0.6))
    title(ax, f"FlashAttention's tiles: n = {n}, {tr} x {tc} score tiles of {block_m} x {block_n}")
    return fig


def flash_loops(n_q_tiles: int = 4, n_kv_tiles: int = 4):
    """Which program owns which tiles, and in which order it walks them. Forward: one program per Q tile walks
    along its row of K/V tiles. Backward: the dK/dV programs own one K/V tile each and walk down its column of Q
    tiles (recomputing P from Q, K and the saved log-sum-exp); the dQ programs own one Q tile each and walk along
    its row, as the forward does."""
    tr = positive_int("n_q_tiles", n_q_tiles, at_most=10)
    tc = positive_int("n_kv_tiles", n_kv_tiles, at_most=10)
    fig, axes = new_figure(11.0, 3.8, ncols=3)
    s = 0.5
    panels = [("forward: O_i", "row", "compute"), ("backward: dK_j, dV_j", "column", "memory"),
              ("backward: dQ_i", "row", "compute")]
    for ax, (name, walk, role) in zip(axes, panels):
        for i in range(tr):
            for j in range(tc):
                box(ax, j * s, (tr - 1 - i) * s, s * 0.9, s * 0.9, "", role, gid="loop-tile", lw=0.7)
        if walk == "row":
            for i in range(tr):
                y = (tr - 1 - i) * s + 0.45 * s
                arrow(ax, (0.05, y), (tc * s - 0.05, y), role="chip", lw=1.4)
            who = f"{tr} programs, one per Q tile;\neach walks its row of {tc} K/V tiles"
        else:
            for j in range(tc):
                x = j * s + 0.45 * s
                arrow(ax, (x, tr * s - 0.05), (x, 0.05), role="chip", lw=1.4)
            who = f"{tc} programs, one per K/V tile;\neach walks its column of {tr} Q tiles"
        label(ax, tc * s / 2, -0.35, who, size="small")
        label(ax, tc * s / 2, tr * s + 0.2, "K/V tiles  j ->", size="small")
        label(ax, -0.15, tr * s / 2, "Q tiles  i ->", size="small", rotation=90, ha="right")
        blank(ax, (-0.6, tc * s + 0.2), (-0.55, tr * s + 0.4))
        title(ax, name)
    return fig


def _pingpong(n_tiles: int, gemm: float, softmax: float, groups: int):
    """The schedule of ``groups`` warpgroups (each on its own Q tile) running S = QK^T -> softmax -> O += PV per
    K/V tile, with the tensor-core operations issued in FlashAttention-3's ping-pong order: every group's first
    S, then, round by round, one group's O += PV of this tile and S of the next, then the next group's. Each
    operation starts when its pipe (tensor cores, or the exp unit for the softmax) is free and its inputs are
    ready. Returns [(group, op, start, end)] in microseconds."""
    order = [(g, "S = QK^T", 0) for g in range(groups)]
    for j in range(n_tiles):
        for g in range(groups):
            order.append((g, "O += PV", j))
            if j + 1 < n_tiles:
                order.append((g, "S = QK^T", j + 1))
    tensor_free, exp_free = 0.0, 0.0
    soft_end = {}                                  # (group, tile) -> when its softmax ends
    out = []
    for g, op, j in order:
        if op == "S = QK^T":
            start = max(tensor_free, soft_end.get((g, j - 1), 0.0))   # the accumulator's rescale needs m
            tensor_free = start + gemm
            out.append((g, op, start, tensor_free))
            s0 = max(tensor_free, exp_free)
            exp_free = soft_end[g, j] = s0 + softmax
            out.append((g, "softmax", s0, exp_free))
        else:
            start = max(tensor_free, soft_end[g, j])
            tensor_free = start + gemm
            out.append((g, op, start, tensor_free))
    return out


def hopper_overlap(n_tiles: int = 3, block_m: int = 128, block_n: int = 128, d: int = 128, gpu: str = "H100 SXM"):
    """One SM's timeline for ``n_tiles`` K/V tiles. Top: a single warpgroup runs S = QK^T, the softmax, then
    O += PV, so the tensor cores idle during every softmax. Bottom: two warpgroups in ping-pong, each on its own
    Q tile: one's softmax runs while the other's matmuls use the tensor cores. Durations are modelled: a matmul
    tile at the GPU's dense bf16 peak per SM (``minillm.hardware.GPUS``), a softmax tile (one exp per score) at
    the H100's exp throughput per SM. The copies of K and V run on the TMA unit, issued by a producer warp
    ahead of use, and are not drawn to scale."""

    n_tiles = positive_int("n_tiles", n_tiles, at_most=6)
    block_m, block_n, d = (positive_int(k, v) for k, v in (("block_m", block_m), ("block_n", block_n), ("d", d)))
    if gpu not in GPUS or GPUS[gpu].bf16_flops is None:
        raise ValueError(f"gpu must be a GPU of minillm.hardware.GPUS with bf16 tensor cores, got {gpu!r}")
    spec = GPUS[gpu]
    gemm = 2 * block_m * block_n * d / (spec.bf16_flops / spec.sm_count) * 1e6        # microseconds
    softmax = block_m * block_n / (H100_EXP_PER_S / GPUS["H100 SXM"].sm_count) * 1e6
    one, two = _pingpong(n_tiles, gemm, softmax, 1), _pingpong(n_tiles, gemm, softmax, 2)
    span = max(e for *_, e in two)
    fig, ax = new_figure(11.0, 3.6)
    rows = [("1 warpgroup", 0, one, 3.0), ("warpgroup 1", 0, two, 1.2), ("warpgroup 2", 1, two, 0.4)]
    for name, g, sched, y in rows:
        label(ax, -0.02 * span, y + 0.3, name, ha="right", size="small")
        for gg, op, a, b in sched:
            if gg != g:
                continue
            role = "memory" if op == "softmax" else "compute"
            box(ax, a, y, b - a, 0.6, op if b - a > 0.06 * span else "", role, gid="op", fontsize=FONT["small"] - 1)
    for sched, y, what in ((one, 3.75, "one warpgroup"), (two, 1.95, "ping-pong")):
        end = max(e for *_, e in sched)
        busy = sum(e - a for _, op, a, e in sched if op != "softmax")
        label(ax, 0, y, f"{what}: {len(sched) // 3} tile-steps in {end:.2f} us ({end / (len(sched) // 3):.2f} us "
              f"each); tensor cores busy {busy / end:.0%} of the time", ha="left", size="small")
    ax.plot([0, span], [0.1, 0.1], color="0.5", lw=0.8)
    label(ax, span, -0.15, f"time (us), modelled: one {block_m}x{block_n}x{d} matmul {gemm:.2f} us, its softmax "
          f"{softmax:.2f} us", ha="right", size="small")
    blank(ax, (-0.16 * span, span * 1.02), (-0.35, 4.0))
    title(ax, "Hopper: a second warpgroup's matmuls fill the tensor cores during a softmax")
    return fig
