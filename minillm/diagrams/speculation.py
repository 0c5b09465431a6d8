"""Chapter 9: one draft-and-verify round with the acceptance rule and the residual distribution."""
from __future__ import annotations

import numpy as np

from .palette import COLORS, FONT, blank, box, color, figure, label, new_figure, positive_int, title


def _default_round(k: int, vocab: int, seed: int):
    """A round on a small vocabulary: the target's distributions p (k+1 rows) and the draft's q (k rows), each a
    softmax of random logits, the draft's are the target's plus noise (a draft close to its target); the
    drafts are sampled from q and the uniforms drawn, all from ``seed``."""
    from ..speculative import SpecParams, sample_probs, to_probs

    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 1.5, (k + 1, vocab))
    plain = SpecParams(temperature=1.0)
    p = to_probs(logits, plain)
    q = to_probs(logits[:k] + rng.normal(0.0, 1.2, (k, vocab)), plain)
    drafts = np.array([sample_probs(q[i], rng.random()) for i in range(k)])
    u = rng.random(k)
    return p, q, drafts, u


def draft_verify_round(k: int = 4, vocab: int = 6, seed: int = 3, p=None, q=None, drafts=None, u=None):
    """One round: the draft proposes ``k`` tokens, the target scores all of them in one forward pass, and each
    is accepted while u_i < p_i(d_i) / q_i(d_i) (probability min(1, p/q)). At the first rejection the token is
    resampled from the residual normalize(max(p - q, 0)) and the round ends; if every draft is accepted the
    target's last row gives a bonus token. Top: the drafts and their fate; below, for each position verified,
    p and q over the vocabulary with the drafted token marked and, at a rejection, the residual. Pass ``p``
    (k+1, V), ``q`` (k, V), ``drafts`` (k,) and ``u`` (k,) to draw a given round; the default is a seeded one
    (``minillm.speculative``'s sampling)."""
    k = positive_int("k", k, at_most=6)
    vocab = positive_int("vocab", vocab, at_least=2, at_most=12)
    seed = positive_int("seed", seed, at_least=0)
    given = [x is not None for x in (p, q, drafts, u)]
    if any(given) and not all(given):
        raise ValueError("p, q, drafts and u must be given together (or none of them)")
    if all(given):
        p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
        drafts, u = np.asarray(drafts, np.int64), np.asarray(u, np.float64)
        k = drafts.size
        if not 1 <= k <= 6 or p.shape != (k + 1, p.shape[1]) or q.shape != (k, p.shape[1]) or u.shape != (k,):
            raise ValueError(f"p must be (k+1, V), q (k, V), drafts and u (k,) with 1 <= k <= 6; got "
                             f"{p.shape}, {q.shape}, {drafts.shape}, {u.shape}")
        vocab = p.shape[1]
    else:
        p, q, drafts, u = _default_round(k, vocab, seed)
    ratio = p[np.arange(k), drafts] / q[np.arange(k), drafts]
    accepted = u < ratio
    n_acc = int(np.argmin(accepted)) if not accepted.all() else k
    residual = None
    if n_acc < k:
        r = np.maximum(p[n_acc] - q[n_acc], 0.0)
        residual = r / r.sum()
    shown = min(n_acc + 1, k)                               # positions with a verdict to draw
    fig = _figure(k, shown, vocab)
    top, panels = fig.axes[0], fig.axes[1:]
    cell = 1.0
    label(top, -0.2, 0.35, "prefix ...", ha="right", size="small")
    for i in range(k):
        fate = "accepted" if i < n_acc else "rejected" if i == n_acc else "discarded"
        role = {"accepted": "chip", "rejected": "waste", "discarded": "neutral"}[fate]
        box(top, i * cell, 0, cell * 0.9, 0.7, f"d{i + 1} = {drafts[i]}\n{fate}", role, gid="draft-token",
            fontsize=FONT["small"])
    end = "bonus from p" if n_acc == k else f"resampled from\nthe residual"
    box(top, k * cell, 0, cell * 1.2, 0.7, end, "compute", gid="target-token", fontsize=FONT["small"])
    label(top, (k * cell + 1.2) / 2, 1.0, f"one target pass verifies {k} drafts: {n_acc} accepted, "
          f"{n_acc + 1} token{'s' * (n_acc != 0)} emitted this round", size="label")
    blank(top, (-1.2, k * cell + 1.4), (-0.1, 1.25))
    title(top, "Speculative decoding: one draft-verify round")
    xs = np.arange(vocab)
    for i, ax in enumerate(panels):
        ax.bar(xs - 0.2, p[i], 0.4, color=color("compute"), label="target p", gid="p-bar")
        ax.bar(xs + 0.2, q[i], 0.4, color=color("memory"), label="draft q", gid="q-bar")
        d = drafts[i]
        ax.annotate("draft", (d, max(p[i, d], q[i, d])), xytext=(0, 6), textcoords="offset points",
                    ha="center", fontsize=FONT["small"], arrowprops=dict(arrowstyle="-|>", color=COLORS["ink"]))
        verdict = "accept" if accepted[i] else "reject"
        ax.set_title(f"d{i + 1}: p/q = {ratio[i]:.2f}, u = {u[i]:.2f}: {verdict}", fontsize=FONT["small"])
        if residual is not None and i == n_acc:
            ax.bar(xs, residual, 0.85, facecolor="none", edgecolor=color("waste"), lw=1.5, label="residual",
                   gid="residual")
        top_y = max(p[i].max(), q[i].max(), 0 if residual is None or i != n_acc else residual.max())
        ax.set_ylim(0, top_y * 1.45)
        ax.set_xticks(xs)
        ax.tick_params(labelsize=FONT["small"])
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_xlabel("token", fontsize=FONT["small"])
        if i == 0 or (residual is not None and i == n_acc):
            ax.legend(fontsize=FONT["small"] - 1, frameon=False, loc="upper right")
    return fig


def _figure(k, shown, vocab):
    fig = figure(figsize=(max(8.0, 3.3 * shown), 4.8), layout="constrained")
    grid = fig.add_gridspec(2, shown, height_ratios=[0.8, 1.2])
    fig.add_subplot(grid[0, :])
    for i in range(shown):
        fig.add_subplot(grid[1, i])
    return fig
