"""Chapters 8 and 10: one ragged step's metadata, the chunked-prefill trade, and the latency-throughput frontier.

The curves come from the book's step-cost model (``minillm.serving.StepCost``: a step takes the longer of its
memory time and its compute time) applied to a published model (``minillm.sizing.MODELS``) on a GPU of
``minillm.hardware.GPUS``."""
from __future__ import annotations

import numpy as np

from .palette import COLORS, FONT, blank, box, color, label, new_figure, positive_int, title


def step_cost(model: str = "Llama 3.1 8B", gpu: str = "H200", dtype_bytes: int = 2):
    """A :class:`minillm.serving.StepCost` for a published model on a GPU: every weight read once per step,
    2 FLOPs per parameter per token, each context token's K and V read once, 4 L H d attention FLOPs per
    context token of each new token; the GPU's HBM bandwidth and dense bf16 peak."""
    from ..hardware import GPUS
    from ..serving.runner import StepCost
    from ..sizing import GB, MODELS

    if model not in MODELS or MODELS[model].attention == "MLA":
        raise ValueError(f"model must be a GQA/MHA model of minillm.sizing.MODELS, got {model!r}")
    if gpu not in GPUS or GPUS[gpu].bf16_flops is None:
        raise ValueError(f"gpu must be a GPU of minillm.hardware.GPUS with bf16 tensor cores, got {gpu!r}")
    spec, g = MODELS[model], GPUS[gpu]
    return StepCost(weight_bytes=spec.weight_bytes(dtype_bytes), kv_bytes_per_token=spec.kv_bytes_per_token(dtype_bytes),
                    flops_per_token=2 * spec.n_params_b * GB,
                    attn_flops_per_context_token=4 * spec.n_layers * spec.n_heads * spec.d_head,
                    bandwidth=g.hbm_bw, flops=g.bf16_flops)


def ragged_batch(num_new=(1, 1, 5), context_lens=(37, 20, 5), block_size: int | None = None):
    """One engine step flattened, flash-attn's varlen layout. Sequence s contributes ``num_new[s]`` tokens (1
    for a decode, more for a prefill chunk), laid end to end; ``cu_seqlens_q`` marks where each begins; every
    token has its position and the pool slot its K/V goes to (``minillm.serving.batch.slot_mapping``: block
    table entry x block size + offset); the block tables, allocated by the package's ``BlockAllocator``, say
    where each sequence's whole context of ``context_lens[s]`` tokens lives."""
    from ..paged.allocator import BlockAllocator
    from ..serving.batch import slot_mapping
    from .paging import NAMES, default_block_size

    num_new = [positive_int("num_new", v) for v in num_new]
    context_lens = [positive_int("context_lens", v) for v in context_lens]
    if not 1 <= len(num_new) <= 6 or len(context_lens) != len(num_new):
        raise ValueError("num_new and context_lens must hold one value each for 1 to 6 sequences")
    if any(n > c for n, c in zip(num_new, context_lens)):
        raise ValueError(f"context_lens (which count the new tokens) must be >= num_new, got {context_lens}")
    if sum(num_new) > 16:
        raise ValueError(f"num_new: at most 16 tokens in all draw legibly, got {sum(num_new)}")
    block_size = positive_int("block_size", default_block_size() if block_size is None else block_size)
    alloc = BlockAllocator(sum(-(-c // block_size) for c in context_lens), block_size)
    tables = [[alloc.allocate() for _ in range(-(-c // block_size))] for c in context_lens]
    cu = np.concatenate([[0], np.cumsum(num_new)])
    positions = [np.arange(c - n, c) for n, c in zip(num_new, context_lens)]
    slots = [slot_mapping(np.array(t), p, block_size) for t, p in zip(tables, positions)]
    fig, ax = new_figure(11.0, 3.8)
    cell = 0.62
    rows = [("input tokens", None), ("positions", positions), ("slot_mapping", slots)]
    for r, (name, values) in enumerate(rows):
        y = 2.0 - r * 0.8
        label(ax, -0.15, y + 0.25, name, ha="right", size="small")
        for s, n in enumerate(num_new):
            role = "compute" if n == 1 else "memory"
            for t in range(n):
                x = (cu[s] + t) * cell
                text = NAMES[s] if values is None else str(int(values[s][t]))
                box(ax, x, y, cell * 0.92, 0.5, text, role, gid="token" if values is None else name,
                    fontsize=FONT["small"])
    for s, c in enumerate(cu):
        x = c * cell - 0.04
        ax.plot([x, x], [0.25, 2.65], color=COLORS["ink"], lw=1.0, ls=":")
        label(ax, x, 2.85, str(int(c)), size="small")
    label(ax, -0.15, 2.85, "cu_seqlens_q", ha="right", size="small")
    x_tab = cu[-1] * cell + 1.0
    label(ax, x_tab, 2.85, "block tables (context length)", ha="left", size="small")
    for s, (t, c) in enumerate(zip(tables, context_lens)):
        kind = "decode" if num_new[s] == 1 else f"prefill chunk of {num_new[s]}"
        box(ax, x_tab, 2.1 - s * 0.6, 4.2, 0.45, f"{NAMES[s]} ({kind}, context {c}): {t}",
            "compute" if num_new[s] == 1 else "memory", gid="block-table", fontsize=FONT["small"])
    label(ax, 0, -0.1, f"{len(num_new)} sequences, {int(cu[-1])} tokens in one step; slot = block table "
          f"entry x {block_size} + position mod {block_size}", ha="left", size="small")
    blank(ax, (-2.0, x_tab + 4.4), (-0.3, 3.05))
    title(ax, "A ragged batch: decodes and a prefill chunk in one flattened step")
    return fig


def chunked_prefill_trade(prompt_len: int = 8192, n_decodes: int = 32, decode_context: int = 2048,
                          chunks=None, model: str = "Llama 3.1 8B", gpu: str = "H200"):
    """The chunked-prefill trade, from the step-cost model: a prompt of ``prompt_len`` tokens is prefilled in
    chunks while ``n_decodes`` sequences (``decode_context`` tokens each) keep decoding in the same steps. Larger
    chunks finish the prompt sooner (its time to first token falls) but make every step the decodes wait through
    longer (their inter-token latency rises); the dashed line is the decode step with no prefill at all."""
    prompt_len = positive_int("prompt_len", prompt_len, at_least=2)
    n_decodes = positive_int("n_decodes", n_decodes, at_least=0)
    decode_context = positive_int("decode_context", decode_context)
    chunks = [2 ** k for k in range(6, int(np.log2(prompt_len)) + 1)] if chunks is None else list(chunks)
    if not chunks or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= prompt_len
                         for c in chunks):
        raise ValueError(f"chunks must be chunk sizes between 1 and prompt_len ({prompt_len}), got {chunks!r}")
    cost = step_cost(model, gpu)
    dec_new, dec_ctx = [1] * n_decodes, [decode_context + 1] * n_decodes
    ttft, itl = [], []
    for c in chunks:
        times = []
        for start in range(0, prompt_len, c):
            n = min(c, prompt_len - start)
            times.append(cost.seconds_for([n] + dec_new, [start + n] + dec_ctx))
        ttft.append(sum(times))
        itl.append(float(np.mean(times)))
    base = cost.seconds_for(dec_new, dec_ctx) if n_decodes else None
    fig, ax = new_figure(7.0, 4.0)
    ax.plot(chunks, np.array(ttft) * 1e3, "-o", color=color("memory"), ms=4, label="new prompt: time to first token",
            gid="ttft-line")
    ax.plot(chunks, np.array(itl) * 1e3, "-s", color=color("compute"), ms=4,
            label=f"{n_decodes} running decodes: time per step", gid="itl-line")
    if base is not None:
        ax.axhline(base * 1e3, color=color("compute"), ls="--", lw=1)
        ax.text(chunks[0], base * 1e3 * 1.08, f"decode step alone: {base * 1e3:.1f} ms", color=color("compute"),
                fontsize=FONT["small"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xticks(chunks)
    ax.set_xticklabels([str(c) for c in chunks], fontsize=FONT["small"])
    ax.minorticks_off()
    ax.set_xlabel("prefill chunk (tokens per step)", fontsize=FONT["label"])
    ax.set_ylabel("milliseconds (modelled)", fontsize=FONT["label"])
    ax.grid(True, color="0.9", lw=0.6)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=FONT["small"], frameon=False, loc="center right")
    title(ax, f"Chunked prefill: a {prompt_len:,}-token prompt beside {n_decodes} decodes ({model}, {gpu})")
    return fig


def latency_throughput_frontier(batches=None, context: int = 2048, model: str = "Llama 3.1 8B", gpu: str = "H200",
                                measured=None, measured_label: str = "measured"):
    """Aggregate tokens/s (x) against the time each request waits per token (y) as the batch grows, from the
    step-cost model (every request decoding with ``context`` cached tokens). Small batches are memory-bound:
    adding a request adds throughput almost for free; past the ridge each request waits longer. ``measured``,
    a :class:`minillm.studies.composition.BatchSweep` (or anything with ``batch``, ``tok_per_s`` and
    ``per_request_tok_per_s``), is drawn on the same axes, named ``measured_label`` in the legend (say which model,
    GPU and context it ran: the model's line and the measured points need not be the same setting)."""
    batches = [2 ** k for k in range(0, 10)] if batches is None else list(batches)
    if not batches or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in batches) \
            or any(np.diff(batches) <= 0):
        raise ValueError(f"batches must be increasing batch sizes >= 1, got {batches!r}")
    context = positive_int("context", context)
    cost = step_cost(model, gpu)
    step = np.array([cost.seconds_for([1] * b, [context] * b) for b in batches])
    agg = np.array(batches) / step
    fig, ax = new_figure(7.0, 4.2)
    ax.plot(agg, step * 1e3, "-o", color=color("compute"), ms=4, label=f"step-cost model ({model}, {gpu})",
            gid="model-frontier")
    for b, x, y in zip(batches, agg, step * 1e3):
        ax.annotate(f"{b}", (x, y), xytext=(-4, 5), textcoords="offset points", fontsize=FONT["small"], ha="right")
    if measured is not None:
        mb = np.asarray(measured.batch)
        tpot = 1e3 / np.asarray(measured.per_request_tok_per_s, dtype=float)
        ax.plot(np.asarray(measured.tok_per_s, dtype=float), tpot, "-s", color=color("memory"), ms=4,
                label=measured_label, gid="measured-frontier")
        for b, x, y in zip(mb, measured.tok_per_s, tpot):
            ax.annotate(f"{b}", (x, y), xytext=(4, -9), textcoords="offset points", fontsize=FONT["small"])
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("aggregate throughput (tokens/s)", fontsize=FONT["label"])
    ax.set_ylabel("time per output token (ms)", fontsize=FONT["label"])
    ax.grid(True, which="major", color="0.9", lw=0.6)
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(fontsize=FONT["small"], frameon=False, loc="upper left")
    ax.text(0.98, 0.02, f"numbers at the points: requests decoding at once (model: context {context})",
            transform=ax.transAxes, ha="right", fontsize=FONT["small"], color=COLORS["ink"])
    title(ax, "The latency-throughput frontier: more requests, more tokens/s, slower tokens")
    return fig
