"""Chapter 10's diagram: the ladder of techniques, each rung with the work it leaves."""
from __future__ import annotations

from .palette import FONT, arrow, blank, box, label, new_figure, positive_int, title


def ladder_work(n_req: int, n_new: int, prompt_len: int, k: int) -> list[tuple[str, str, tuple[int, int], int]]:
    """Per rung of chapter 10's CPU ladder: (name, what it changes, (fewest, most) model calls one after another,
    most token rows computed in all), for ``n_req`` requests of ``prompt_len`` prompt tokens each asking for
    ``n_new`` greedy tokens. Naive decoding runs the whole sequence at every step; a KV cache computes each token
    once; the engine puts every request into each call; speculation verifies up to ``k`` drafts per sequence per
    call (k + 1 tokens per call when all are kept, 1 when none is)."""
    n_req, n_new = positive_int("n_req", n_req), positive_int("n_new", n_new)
    prompt_len, k = positive_int("prompt_len", prompt_len), positive_int("k", k)
    naive_rows = n_req * sum(prompt_len + t for t in range(n_new))      # step t runs prompt + t tokens again
    cached_rows = n_req * (prompt_len + n_new - 1)                      # each token once (the last is only sampled)
    least = -(-(n_new - 1) // (k + 1)) + 1                             # the prefill, then k + 1 tokens per call
    return [("naive decoding", "every step runs the whole sequence", (n_req * n_new,) * 2, naive_rows),
            ("+ KV cache", "each token's K/V computed once, kept", (n_req * n_new,) * 2, cached_rows),
            ("+ engine, all at once", f"one call serves all {n_req} requests", (n_new,) * 2, cached_rows),
            ("+ speculation", f"a call verifies up to {k} drafts per request", (least, n_new),
             n_req * (prompt_len + (n_new - 1) * (k + 1)))]


def composition_ladder(n_req: int = 8, n_new: int = 64, prompt_len: int = 60, k: int = 4):
    """The CPU ladder of chapter 10 as a staircase: each rung adds one technique, and is labelled with what it
    changes and the work left for ``n_req`` requests (:func:`ladder_work`): model calls one after another, and
    token rows computed."""
    rungs = ladder_work(n_req, n_new, prompt_len, k)
    fig, ax = new_figure(9.5, 3.9)
    w, h = 4.3, 0.95
    for i, (name, change, (lo, hi), rows) in enumerate(rungs):
        x, y = 0.9 * i, 1.15 * (len(rungs) - 1 - i)
        box(ax, x, y, w, h, "", "compute" if i else "waste", gid="rung")
        label(ax, x + 0.12, y + 0.68, name, ha="left", size="label", fontweight="bold")
        label(ax, x + 0.12, y + 0.3, change, ha="left", size="small")
        calls = f"{lo:,}" if lo == hi else f"{lo:,} to {hi:,}"
        label(ax, x + w + 0.2, y + 0.62, f"{calls} model calls in sequence", ha="left", size="small")
        label(ax, x + w + 0.2, y + 0.28, f"{'up to ' if lo != hi else ''}{rows:,} token rows computed", ha="left",
              size="small")
        if i:
            arrow(ax, (x - 0.55, y + h + 0.18), (x + 0.3, y + h - 0.02))
    label(ax, 0, -0.45, f"{n_req} requests of {prompt_len} prompt tokens, {n_new} new tokens each; every rung gives "
          "the same greedy tokens", ha="left", size="small")
    blank(ax, (-0.2, 0.9 * (len(rungs) - 1) + w + 4.2), (-0.7, 1.15 * len(rungs) + 0.1))
    title(ax, "The ladder: each rung adds one technique and removes one kind of work")
    return fig
