"""Chapter 3: grouped-query attention's head sharing, and cache bytes against context length beside GPU memory."""
from __future__ import annotations

import numpy as np

from .palette import COLORS, FONT, blank, box, color, label, new_figure, positive_int, title

_LINE_STYLES = ("-", "--", "-.", ":")


def gqa_head_grouping(model: str = "Llama 3.1 70B", n_heads: int | None = None, n_kv_heads: int | None = None):
    """Query heads (top) sharing K/V heads (bottom): each group of ``n_heads / n_kv_heads`` query heads reads
    one cached K/V head. Head counts default to ``model``'s published config (``minillm.sizing.MODELS``); the
    cache saving against multi-head attention (one K/V head per query head) is ``n_heads / n_kv_heads``."""
    from ..sizing import MODELS

    if model not in MODELS or MODELS[model].n_kv_heads is None:
        raise ValueError(f"model must be a GQA/MHA/MQA model of minillm.sizing.MODELS, got {model!r}")
    spec = MODELS[model]
    n_heads = positive_int("n_heads", spec.n_heads if n_heads is None else n_heads, at_most=128)
    n_kv_heads = positive_int("n_kv_heads", spec.n_kv_heads if n_kv_heads is None else n_kv_heads, at_most=n_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads})")
    group = n_heads // n_kv_heads
    fig, ax = new_figure(9.0, 3.0)
    width = 10.0
    q_w = width / n_heads
    kv_w = width / n_kv_heads
    for h in range(n_heads):
        g = h // group
        box(ax, h * q_w, 2.0, q_w * 0.85, 0.45, "", "compute" if g % 2 == 0 else "neutral", gid="query-head", lw=0.6)
    for g in range(n_kv_heads):
        x = g * kv_w + kv_w * 0.15
        box(ax, x, 0.0, kv_w * 0.7, 0.5, f"KV {g}" if n_kv_heads <= 16 else "", "memory", gid="kv-head",
            fontsize=FONT["small"])
        left, right = g * group * q_w, ((g + 1) * group - 0.15) * q_w
        ax.fill([left, right, x + kv_w * 0.7, x], [2.0, 2.0, 0.5, 0.5],
                color=color("compute" if g % 2 == 0 else "neutral"), alpha=0.12, lw=0)
    label(ax, -0.15, 2.22, f"{n_heads} query heads", ha="right")
    label(ax, -0.15, 0.25, f"{n_kv_heads} K/V heads\n(cached)", ha="right")
    kind = "MHA" if group == 1 else "MQA" if n_kv_heads == 1 else "GQA"
    label(ax, width / 2, 1.25, f"{kind}: each K/V head serves {group} query head{'s' * (group != 1)}; "
          f"the cache is {group}x smaller than with one K/V head per query head", size="label",
          bbox=dict(facecolor="white", edgecolor="none", pad=2))
    blank(ax, (-2.4, width + 0.1), (-0.2, 2.6))
    title(ax, f"Grouped-query attention: {model}" if (n_heads, n_kv_heads) == (spec.n_heads, spec.n_kv_heads)
          else f"Grouped-query attention: {n_heads} query heads, {n_kv_heads} K/V heads")
    return fig


def kv_bytes_vs_context(models=("Llama 3.1 8B", "Llama 3.1 70B", "Llama 3.1 405B", "DeepSeek V3 671B"),
                        gpus=("H100 SXM", "H200"), max_context: int | None = None, cache_dtype: str = "fp16",
                        batch: int = 1):
    """One sequence's KV cache (GiB, log scale) against context length (log scale) for published models
    (``minillm.sizing.MODELS``), with horizontal lines at the memory of GPUs (``minillm.hardware.GPUS``: what
    the device reports), up to ``max_context`` (default: the shortest maximum context of the models). Each
    line is labelled at its right end with its value at the longest context."""
    from ..hardware import GPUS
    from ..sizing import GIB, MODELS, dtype_bytes

    models, gpus = list(models), list(gpus)
    if not models or any(m not in MODELS for m in models):
        raise ValueError(f"models must name models of minillm.sizing.MODELS, got {models!r}")
    if len(models) > len(_LINE_STYLES) * 2:
        raise ValueError(f"models: at most {len(_LINE_STYLES) * 2} lines to draw legibly, got {len(models)}")
    if any(g not in GPUS for g in gpus):
        raise ValueError(f"gpus must name GPUs of minillm.hardware.GPUS, got {gpus!r}")
    try:
        per = dtype_bytes(cache_dtype)
    except (ValueError, TypeError, KeyError):
        raise ValueError(f"cache_dtype must be a dtype name such as 'fp16' or 'fp8', got {cache_dtype!r}") from None
    max_context = positive_int("max_context", min(MODELS[m].max_context for m in models)
                               if max_context is None else max_context, at_least=2048)
    batch = positive_int("batch", batch)
    contexts = 2 ** np.arange(10, int(np.log2(max_context)) + 1)
    if contexts[-1] != max_context:
        contexts = np.append(contexts, max_context)
    fig, ax = new_figure(7.5, 4.2)
    lowest = np.inf
    for i, name in enumerate(models):
        spec = MODELS[name]
        gib = np.array([spec.kv_bytes(int(spec.cached_tokens(int(n))), per, batch) for n in contexts]) / GIB
        lowest = min(lowest, gib.min())
        role = "compute" if spec.attention != "MLA" else "chip"
        ax.plot(contexts, gib, _LINE_STYLES[i % len(_LINE_STYLES)], color=color(role), lw=1.8, marker="o",
                ms=3, label=f"{name} ({spec.attention})", gid="model-line")
        ax.annotate(f"{name}: {gib[-1]:,.1f} GiB", (contexts[-1], gib[-1]), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=FONT["small"], color=COLORS["ink"])
    for gpu in gpus:
        mem = GPUS[gpu].memory_bytes / GIB
        ax.axhline(mem, color=color("waste"), lw=1.0, ls="--", gid="gpu-line")
        ax.text(contexts[0], mem * 1.06, f"{gpu}: {mem:.1f} GiB", fontsize=FONT["small"], color=color("waste"),
                va="bottom")
    top = max([GPUS[g].memory_bytes / GIB for g in gpus] + [ax.get_ylim()[1]])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")                 # before the limits: a linear lower limit may be <= 0 (lines squashed)
    ax.set_ylim(bottom=lowest / 2, top=top * 2.5)
    ax.set_xticks(contexts)
    ax.set_xticklabels([f"{n // 1024}K" if n % 1024 == 0 else f"{n / 1024:.1f}K" for n in contexts],
                       fontsize=FONT["small"])
    ax.minorticks_off()
    ax.set_xlim(contexts[0] / 1.3, contexts[-1] * 9)
    ax.set_xlabel("context length (tokens)", fontsize=FONT["label"])
    ax.set_ylabel(f"KV cache per {'sequence' if batch == 1 else f'{batch} sequences'} (GiB, {cache_dtype})",
                  fontsize=FONT["label"])
    ax.grid(True, which="major", color="0.9", lw=0.6)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=FONT["small"], frameon=False, loc="lower right")
    title(ax, "KV cache bytes grow linearly with context; GPU memory does not")
    return fig
