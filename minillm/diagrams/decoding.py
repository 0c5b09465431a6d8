"""Chapters 1 and 2: the autoregressive loop, and what the KV cache stores per layer."""
from __future__ import annotations

from .palette import FONT, arrow, blank, box, label, new_figure, positive_int, title


def autoregressive_loop(prompt_len: int = 3, n_new: int = 4, cached: bool = False):
    """Decoding one token at a time. Each row is one step: the tokens the model runs over, the model, and the
    token it emits, which joins the input of the next step. Without a cache (``cached=False``) every step runs
    the whole sequence again (positions already done are marked as recomputed); with one, only the new token.
    The total of positions computed is written under the rows."""
    prompt_len = positive_int("prompt_len", prompt_len, at_most=12)
    n_new = positive_int("n_new", n_new, at_most=8)
    if not isinstance(cached, bool):
        raise ValueError(f"cached must be a bool, got {cached!r}")
    total_len = prompt_len + n_new
    cell = 0.55
    fig, ax = new_figure(1.2 + cell * (total_len + 6), 0.65 * (n_new + 2.2))
    x_model = cell * total_len + 0.6
    computed = []
    for step in range(n_new):
        y = n_new - step
        seq = prompt_len + step                         # tokens the model sees at this step
        done_before = seq - 1 if step else 0            # positions a previous step already computed
        work = seq - done_before if cached and step else seq
        computed.append(work)
        label(ax, -0.25, y + cell / 2, f"step {step + 1}", ha="right", size="small")
        for i in range(seq):
            if i < prompt_len:
                name = f"x{i + 1}"
            else:
                name = f"y{i - prompt_len + 1}"
            if cached and step and i < done_before:
                role, gid = "neutral", "cached-position"   # read from the cache, not computed
            elif i < done_before:
                role, gid = "waste", "recomputed-position"
            else:
                role, gid = "compute", "computed-position"
            box(ax, i * cell, y, cell * 0.92, cell, name, role, gid=gid, fontsize=FONT["small"])
        box(ax, x_model, y, 1.4, cell, "model", "compute", bold=True)
        arrow(ax, (seq * cell, y + cell / 2), (x_model, y + cell / 2))
        out_x = x_model + 2.0
        box(ax, out_x, y, cell * 0.92, cell, f"y{step + 1}", "chip", gid="emitted-token", fontsize=FONT["small"])
        arrow(ax, (x_model + 1.4, y + cell / 2), (out_x, y + cell / 2))
        if step + 1 < n_new:   # the emitted token joins the next step's input
            arrow(ax, (out_x, y), ((seq + 0.9) * cell, y - 1 + cell), role="chip", lw=0.9)
        label(ax, out_x + cell + 0.3, y + cell / 2, f"{work} position{'s' * (work != 1)}", ha="left",
              size="small")
    label(ax, 0, 0.35, f"positions computed: {' + '.join(map(str, computed))} = {sum(computed)}", ha="left")
    handles = [("computed this step", "compute"), ("emitted token", "chip")]
    handles.insert(1, ("read from the KV cache", "neutral") if cached else ("recomputed (done before)", "waste"))
    from matplotlib.patches import Patch

    ax.legend([Patch(facecolor=_tint(r), edgecolor=_col(r)) for _, r in handles], [t for t, _ in handles],
              loc="lower right", fontsize=FONT["small"], frameon=False, ncol=3, bbox_to_anchor=(1.0, -0.12))
    blank(ax, (-1.4, out_x + cell + 2.2), (0, n_new + 1))
    title(ax, "Decoding with a KV cache: one new position per step" if cached else
          "Naive decoding: every step runs the whole sequence again")
    return fig


def _tint(role):
    from .palette import tint
    return tint(role)


def _col(role):
    from .palette import color
    return color(role)


def kv_cache_per_layer(n_layers: int | None = None, n_kv_heads: int | None = None, d_head: int | None = None,
                       n_tokens: int = 6, dtype_bytes: int = 4, max_layers_drawn: int = 3):
    """What the cache holds: for every layer, one K and one V matrix per KV head, one row of ``d_head`` numbers
    per cached token; a decode step appends one row to each (the new token, highlighted). Defaults: the book's
    tiny model (``minillm.model.ModelConfig()``) in float32. The bytes per token per layer and per token are
    computed and written beside the picture."""
    from ..model import ModelConfig

    cfg = ModelConfig()
    n_layers = positive_int("n_layers", cfg.n_layers if n_layers is None else n_layers)
    n_kv_heads = positive_int("n_kv_heads", cfg.n_kv_heads if n_kv_heads is None else n_kv_heads, at_most=8)
    d_head = positive_int("d_head", cfg.d_head if d_head is None else d_head)
    n_tokens = positive_int("n_tokens", n_tokens, at_most=16)
    dtype_bytes = positive_int("dtype_bytes", dtype_bytes, at_most=8)
    max_layers_drawn = positive_int("max_layers_drawn", max_layers_drawn, at_most=6)
    drawn = list(range(n_layers)) if n_layers <= max_layers_drawn else \
        list(range(max_layers_drawn - 1)) + [n_layers - 1]
    cell, gap = 0.32, 0.5
    head_w = n_tokens * cell
    layer_w = 2 * (n_kv_heads * (head_w + 0.2)) + gap
    fig, ax = new_figure(2.8 + layer_w, 0.9 + 1.05 * len(drawn) + (0.4 if len(drawn) < n_layers else 0))
    y = 0.0
    for pos, layer in enumerate(reversed(drawn)):
        if pos == 1 and len(drawn) < n_layers:
            label(ax, layer_w / 2, y + 0.25, f"... {n_layers - len(drawn)} more layer"
                  f"{'s' * (n_layers - len(drawn) != 1)}, the same ...", size="small")
            y += 0.55
        label(ax, -0.2, y + 0.35, f"layer {layer}", ha="right", size="small")
        x = 0.0
        for kind in ("K", "V"):
            for h in range(n_kv_heads):
                for t in range(n_tokens):
                    new = t == n_tokens - 1
                    box(ax, x + t * cell, y, cell * 0.9, 0.7, "", "chip" if new else "memory",
                        gid="new-row" if new else "cached-row", lw=0.8)
                label(ax, x + head_w / 2, y + 0.85, f"{kind} head {h}", size="small")
                x += head_w + 0.2
            x += gap
        y += 1.05
    per_layer = 2 * n_kv_heads * d_head * dtype_bytes
    label(ax, 0, -0.35, f"each column: one token's vector of d_head = {d_head} numbers;  per token: "
          f"2 (K, V) x {n_kv_heads} KV heads x {d_head} x {dtype_bytes} B = {per_layer:,} B per layer, "
          f"x {n_layers} layers = {per_layer * n_layers:,} B", ha="left", size="small")
    from matplotlib.patches import Patch

    ax.legend([Patch(facecolor=_tint("memory"), edgecolor=_col("memory")),
               Patch(facecolor=_tint("chip"), edgecolor=_col("chip"))],
              [f"cached tokens (1..{n_tokens - 1})", "appended by this decode step"],
              loc="upper right", fontsize=FONT["small"], frameon=False, ncol=2, bbox_to_anchor=(1.0, 1.08))
    blank(ax, (-1.4, layer_w + 0.2), (-0.6, y + 0.1))
    title(ax, "What the KV cache stores, per layer")
    return fig
