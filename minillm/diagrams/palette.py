"""The book's one palette and the drawing helpers every diagram shares.

Colour is used for meaning only, and means the same thing in every chapter:

* ``compute`` (blue): work being done now: a query, the model's forward pass, a decode step, the target model;
* ``memory`` (orange): what is stored and moved: cached K/V, HBM, a prefill chunk, the draft model;
* ``chip`` (green): what stays on chip or is kept: SRAM tiles, an accepted token, used cache;
* ``waste`` (red): work or bytes thrown away: recomputation, a rejected token, idle memory;
* ``neutral`` (grey): everything else (free blocks, inactive slots, masked tiles).

Each colour has a light tint for fills (``tint``). This module imports matplotlib only inside its functions, so
``import minillm.diagrams`` needs NumPy alone. Every patch a diagram draws for a counted thing carries a
``gid`` (``"tile"``, ``"block"``, ...) so tests can count them with :func:`artists`.
"""
from __future__ import annotations

import numbers

COLORS = {
    "compute": "#3b6ea8",
    "memory": "#d9822b",
    "chip": "#3f8f4f",
    "waste": "#c0392b",
    "neutral": "#8c8c8c",
    "ink": "#222222",
}
TINTS = {
    "compute": "#dbe6f3",
    "memory": "#f8e3cc",
    "chip": "#d9eedc",
    "waste": "#f5d5d1",
    "neutral": "#eeeeee",
    "ink": "#ffffff",
}
FONT = {"title": 11, "label": 9, "small": 8}


def color(role: str) -> str:
    if role not in COLORS:
        raise ValueError(f"role must be one of {sorted(COLORS)}, got {role!r}")
    return COLORS[role]


def tint(role: str) -> str:
    if role not in TINTS:
        raise ValueError(f"role must be one of {sorted(TINTS)}, got {role!r}")
    return TINTS[role]


# ---- argument checks: a bad number is a ValueError that names the argument ----------------------------
def positive_int(name: str, value, *, at_most: int | None = None, at_least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < at_least:
        raise ValueError(f"{name} must be an integer >= {at_least}, got {value!r}")
    if at_most is not None and value > at_most:
        raise ValueError(f"{name} must be at most {at_most} to draw legibly, got {value!r}")
    return int(value)


def positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


# ---- drawing ---------------------------------------------------------------------------------------------
def figure(**kw):
    """A Figure not registered with pyplot (no global state) that a notebook shows as a PNG by itself: its
    ``_repr_png_`` draws it, so the picture is stored even before the notebook has imported pyplot (whose inline
    backend is what otherwise renders a Figure; without it a cell stores only the text ``<Figure ...>``)."""
    from matplotlib.figure import Figure

    def _repr_png_(self) -> bytes:
        import io

        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()

    # named Figure, so its text repr is a Figure's ("<Figure size 700x420 with 1 Axes>", what nbval compares)
    return type("Figure", (Figure,), {"_repr_png_": _repr_png_})(**kw)


def new_figure(width: float, height: float, ncols: int = 1, nrows: int = 1, **kw):
    """A :func:`figure` with its Axes: one, or an array for several."""
    fig = figure(figsize=(width, height), layout=kw.pop("layout", "constrained"))
    axes = fig.subplots(nrows, ncols, squeeze=True, **kw)
    return fig, axes


def blank(ax, xlim, ylim) -> None:
    """An Axes used as a drawing canvas: fixed limits, equal units where asked, no frame."""
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_axis_off()


def box(ax, x, y, w, h, text: str = "", role: str = "neutral", *, gid: str | None = None, filled: bool = True,
        fontsize: float | None = None, bold: bool = False, text_color: str | None = None, hatch: str | None = None,
        lw: float = 1.0, alpha: float = 1.0):
    """A rectangle with its lower-left corner at (x, y), edged in the role's colour and filled with its tint,
    with centred text. Returns the patch."""
    from matplotlib.patches import Rectangle

    rect = Rectangle((x, y), w, h, facecolor=tint(role) if filled else "none", edgecolor=color(role), lw=lw,
                     hatch=hatch, alpha=alpha)
    if gid:
        rect.set_gid(gid)
    ax.add_patch(rect)
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize or FONT["label"],
                color=text_color or COLORS["ink"], fontweight="bold" if bold else "normal")
    return rect


def arrow(ax, start, end, text: str = "", role: str = "ink", *, rad: float = 0.0, text_offset=(0.0, 0.0),
          fontsize: float | None = None, lw: float = 1.2, ha: str = "center", style: str = "-|>"):
    """An arrow from ``start`` to ``end`` (optionally curved by ``rad``) with a label at its middle."""
    from matplotlib.patches import FancyArrowPatch

    patch = FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=10, color=color(role), lw=lw,
                            connectionstyle=f"arc3,rad={rad}", shrinkA=1, shrinkB=1)
    patch.set_gid("arrow")
    ax.add_patch(patch)
    if text:
        mx, my = (start[0] + end[0]) / 2 + text_offset[0], (start[1] + end[1]) / 2 + text_offset[1]
        ax.text(mx, my, text, ha=ha, va="center", fontsize=fontsize or FONT["small"], color=COLORS["ink"])
    return patch


def label(ax, x, y, text: str, *, size: str = "label", ha: str = "center", va: str = "center", role: str = "ink",
          **kw):
    return ax.text(x, y, text, ha=ha, va=va, fontsize=FONT[size], color=color(role), **kw)


def title(ax, text: str) -> None:
    ax.set_title(text, fontsize=FONT["title"], loc="left")


# ---- what tests read back --------------------------------------------------------------------------------
def artists(fig, gid: str) -> list:
    """Every patch of ``fig`` drawn with ``gid``."""
    return [p for ax in fig.axes for p in ax.patches if p.get_gid() == gid]


def texts(fig) -> list[str]:
    """Every string ``fig`` shows: texts, titles, axis labels, tick labels and legend entries."""
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [t.get_text() for t in ax.texts]
        out += [ax.get_title(loc) for loc in ("left", "center", "right")]
        out += [ax.get_xlabel(), ax.get_ylabel()]
        out += [t.get_text() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        legend = ax.get_legend()
        if legend is not None:
            out += [t.get_text() for t in legend.get_texts()]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    return [t for t in out if t]
