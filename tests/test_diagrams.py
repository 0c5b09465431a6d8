"""The book's diagrams (minillm.diagrams): each draws with its defaults, shows the labels and the number of
tiles/blocks its arguments ask for, changes when its numbers change, and names a bad argument."""
import math
import subprocess
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from minillm import diagrams  # noqa: E402
from minillm.diagrams.palette import COLORS, artists, texts  # noqa: E402


def joined(fig) -> str:
    return "\n".join(texts(fig))


def test_import_needs_no_matplotlib():
    code = "import sys, minillm, minillm.diagrams; assert 'matplotlib' not in sys.modules, 'imported matplotlib'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", sorted({f for items in diagrams.CHAPTERS.values() for _, f in items}))
def test_every_diagram_draws_with_its_defaults(name, tmp_path):
    fig = getattr(diagrams, name)()
    assert isinstance(fig, Figure)
    assert texts(fig), "a diagram without any label"
    fig.savefig(tmp_path / f"{name}.png", dpi=40)        # the layout engine runs without error
    assert fig._repr_png_().startswith(b"\x89PNG")      # a notebook stores a picture, pyplot imported or not


def test_autoregressive_loop_counts_positions():
    fig = diagrams.autoregressive_loop(prompt_len=3, n_new=4)
    # step s runs 3 + s positions: 3 + 4 + 5 + 6 = 18, of which 0 + 3 + 4 + 5 were done before
    assert len(artists(fig, "computed-position")) + len(artists(fig, "recomputed-position")) == 18
    assert len(artists(fig, "recomputed-position")) == 12
    assert len(artists(fig, "emitted-token")) == 4
    assert "positions computed: 3 + 4 + 5 + 6 = 18" in joined(fig)
    cached = diagrams.autoregressive_loop(prompt_len=3, n_new=4, cached=True)
    assert "positions computed: 3 + 1 + 1 + 1 = 6" in joined(cached)
    assert len(artists(cached, "recomputed-position")) == 0
    assert "= 20" in joined(diagrams.autoregressive_loop(prompt_len=2, n_new=5))   # 2 + 3 + 4 + 5 + 6


def test_kv_cache_per_layer_bytes_from_the_config():
    from minillm.model import ModelConfig

    cfg = ModelConfig()
    fig = diagrams.kv_cache_per_layer()
    per_layer = 2 * cfg.n_kv_heads * cfg.d_head * 4
    assert f"= {per_layer:,} B per layer" in joined(fig)
    assert f"= {per_layer * cfg.n_layers:,} B" in joined(fig)
    drawn = min(cfg.n_layers, 3)
    assert len(artists(fig, "new-row")) == drawn * 2 * cfg.n_kv_heads
    fig2 = diagrams.kv_cache_per_layer(n_layers=2, n_kv_heads=1, d_head=8, n_tokens=4, dtype_bytes=2)
    assert len(artists(fig2, "cached-row")) == 2 * 2 * 3 and "= 32 B per layer" in joined(fig2)


def test_gqa_head_grouping_uses_the_published_config():
    from minillm.sizing import MODELS

    spec = MODELS["Llama 3.1 70B"]
    fig = diagrams.gqa_head_grouping()
    assert len(artists(fig, "query-head")) == spec.n_heads and len(artists(fig, "kv-head")) == spec.n_kv_heads
    assert f"the cache is {spec.n_heads // spec.n_kv_heads}x smaller" in joined(fig)
    assert "MHA" in joined(diagrams.gqa_head_grouping(n_heads=8, n_kv_heads=8))
    fig = diagrams.gqa_head_grouping("Llama 3.1 8B")
    assert len(artists(fig, "query-head")) == MODELS["Llama 3.1 8B"].n_heads


def test_kv_bytes_vs_context_labels_models_and_gpus():
    from minillm.hardware import GPUS
    from minillm.sizing import GIB, MODELS

    fig = diagrams.kv_bytes_vs_context(models=("Llama 3.1 8B",), gpus=("H100 SXM",), max_context=32768)
    want = MODELS["Llama 3.1 8B"].kv_bytes(32768) / GIB
    assert f"Llama 3.1 8B: {want:,.1f} GiB" in joined(fig)
    assert f"H100 SXM: {GPUS['H100 SXM'].memory_bytes / GIB:.1f} GiB" in joined(fig)
    fp8 = diagrams.kv_bytes_vs_context(models=("Llama 3.1 8B",), gpus=(), max_context=32768, cache_dtype="fp8")
    assert f"Llama 3.1 8B: {want / 2:,.1f} GiB" in joined(fp8)
    ax = diagrams.kv_bytes_vs_context().axes[0]           # the log axis holds every line (lower limit > 0)
    low, high = ax.get_ylim()
    lines = [y for line in ax.get_lines() if line.get_gid() == "model-line" for y in line.get_ydata()]
    assert 0 < low <= min(lines) and max(lines) <= high


def test_hbm_round_trips_bytes_from_the_traffic_model():
    from minillm.hardware import flash_attention_traffic, standard_attention_traffic

    fig = diagrams.hbm_round_trips(n=2048, d=64, block_m=64, block_n=64)
    std, fused = standard_attention_traffic(2048, 64, 2), flash_attention_traffic(2048, 64, 64, 64, 2)
    text = joined(fig)
    assert f"total {std['total'] / 2**20:,.0f} MiB" in text
    assert f"{std['total'] / fused['total']:.1f}x fewer bytes" in text
    assert len(artists(fig, "kernel")) == 4          # three unfused kernels, one fused
    assert joined(diagrams.hbm_round_trips(n=4096)) != joined(diagrams.hbm_round_trips(n=8192))


def test_online_softmax_rescale_follows_the_steps():
    from minillm.explorables import online_softmax_steps

    scores = np.array([1.0, 0.0, 3.0, -1.0, 5.0, 2.0])
    fig = diagrams.online_softmax_rescale(scores, tile=2)
    steps = online_softmax_steps(scores, 2)
    assert len(artists(fig, "score-bar")) == 6 and len(artists(fig, "accumulator")) == 3
    assert f"= {steps[2]['rescale']:.3f}" in joined(fig) and f"l = {steps[-1]['l']:.3f}" in joined(fig)
    assert len(artists(diagrams.online_softmax_rescale(scores, tile=3), "accumulator")) == 2


def test_online_softmax_rescale_default_shows_a_rescale_that_changes_l():
    """Was: the default draw's one rescale (0.150) left l at 1.193 before and after to three decimals, so the
    figure that introduces the rescale seemed to show it doing nothing."""
    from minillm.diagrams.attention import _default_scores
    from minillm.explorables import online_softmax_steps

    steps = online_softmax_steps(_default_scores(), 4)
    moved = [i for i, s in enumerate(steps) if i and s["rescale"] < 1]
    assert moved and all(f"{steps[i]['l']:.3f}" != f"{steps[i - 1]['l']:.3f}" for i in moved)
    assert f"l = {steps[moved[0]]['l']:.3f}" in joined(diagrams.online_softmax_rescale())


def test_flash_diagrams_count_tiles():
    fig = diagrams.flash_tile_dataflow(n=512, block_m=128, block_n=64, causal=False)
    assert len(artists(fig, "score-tile")) == 4 * 8
    assert len(artists(fig, "q-tile")) == 4 and len(artists(fig, "kv-tile")) == 8
    assert "K_j, V_j streamed for j = 0..7" in joined(fig)
    causal = diagrams.flash_tile_dataflow(n=512, block_m=128, block_n=128, q_tile=1)
    assert "for j = 0..1" in joined(causal)
    assert len(artists(diagrams.flash_loops(3, 5), "loop-tile")) == 3 * 3 * 5


def test_hopper_overlap_fills_the_tensor_cores():
    fig = diagrams.hopper_overlap(n_tiles=3)
    assert len(artists(fig, "op")) == 3 * 3 + 2 * 3 * 3
    text = joined(fig)
    one = float(text.split("one warpgroup: 3 tile-steps in ")[1].split(" us")[0])
    two = float(text.split("ping-pong: 6 tile-steps in ")[1].split(" us")[0])
    assert two / 6 < one / 3                       # the second warpgroup hides softmax behind matmuls
    assert joined(diagrams.hopper_overlap(d=64)) != text


def test_block_table_runs_the_allocator():
    fig = diagrams.block_table(seq_lens=(20, 5, 40), reserved=(32, 16, 48), finished=1, waiting=20, block_size=8)
    blocks = {"A": math.ceil(20 / 8), "C": math.ceil(40 / 8), "D": math.ceil(20 / 8)}
    assert len(artists(fig, "logical-block")) == sum(blocks.values())
    pool = (32 + 16 + 48 + 19) // 8
    assert len(artists(fig, "physical-block")) == pool
    assert f"{pool} blocks of 8 tokens" in joined(fig)
    internal = sum(n * 8 for n in blocks.values()) - (20 + 40 + 20)
    assert f"the only waste: {internal} tokens" in joined(fig)
    assert "reserved but unused: 20 tokens" in joined(fig)       # (32 - 20) + (48 - 40)


def test_split_k_decode_uses_the_kernels_split_count():
    from minillm.batch_invariant import gpu_split_count
    from minillm.hardware import GPUS

    fig = diagrams.split_k_decode(context=1024, batch=16, n_kv_heads=8, gpu="H200")
    n = gpu_split_count(16, 8, 1024, GPUS["H200"].sm_count)
    assert len(artists(fig, "split-program")) == n == len(artists(fig, "kv-split"))
    assert len(artists(diagrams.split_k_decode(batch=32, n_kv_heads=8), "kv-split")) != n


def test_batch_dependent_cuts_uses_the_kernels_split_count():
    from minillm.batch_invariant import gpu_split_count, split_bounds_by_count
    from minillm.hardware import GPUS

    sms = GPUS["H100 SXM"].sm_count
    fig = diagrams.batch_dependent_cuts(context=1000, batches=(1, 16), n_kv_heads=8, gpu="H100 SXM", tile=64)
    want = [len(split_bounds_by_count(1000, gpu_split_count(b, 8, 1000, sms), 64)) - 1 for b in (1, 16)]
    assert want[0] != want[1]  # (the point of the figure: the batch moves the cuts)
    assert len(artists(fig, "cut-piece")) == sum(want)
    assert len(artists(fig, "cut-merge")) == 2
    joined_text = joined(fig)
    assert f"in a batch of 1: {want[0]} pieces" in joined_text and f"in a batch of 16: {want[1]} pieces" in joined_text
    assert "((s0 + s1) + s2) + s3" in joined_text


def test_ladder_work_counts_calls_and_rows():
    """Against a direct count: 2 requests, 3-token prompts, 4 new tokens, k = 2."""
    from minillm.diagrams.composition import ladder_work

    naive, cached, engine, spec = ladder_work(n_req=2, n_new=4, prompt_len=3, k=2)
    assert naive[2] == (8, 8) and naive[3] == 2 * (3 + 4 + 5 + 6)        # step t reruns 3 + t tokens
    assert cached[2] == (8, 8) and cached[3] == 2 * (3 + 3)               # every token once but the last
    assert engine[2] == (4, 4) and engine[3] == cached[3]                 # one call per step for both requests
    assert spec[2] == (2, 4)                                              # prefill + one call keeping 3 tokens
    assert spec[3] == 2 * (3 + 3 * 3)                                     # at most: 3 calls of k + 1 rows each
    fig = diagrams.composition_ladder(n_req=2, n_new=4, prompt_len=3, k=2)
    assert len(artists(fig, "rung")) == 4
    assert "2 to 4 model calls in sequence" in joined(fig)


def test_every_chapter_draws_its_diagrams_in_order():
    """diagrams.CHAPTERS is what each chapter shows: every listed diagram is called in that chapter's notebook, in
    a cell whose code the site hides (a picture, not code to read), in the listed order."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for number, items in diagrams.CHAPTERS.items():
        (path,) = root.glob(f"chapters/{number:02d}_*.ipynb")
        cells = json.loads(path.read_text())["cells"]
        where = []
        for _, name in items:
            calls = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and f"{name}(" in "".join(c["source"])]
            assert calls, f"{path.name} never draws {name}"
            assert "remove-input" in cells[calls[0]]["metadata"].get("tags", []), f"{path.name}: {name}'s code shows"
            where.append(calls[0])
        assert where == sorted(where), f"{path.name} draws its diagrams out of the order diagrams.CHAPTERS lists"


def test_ragged_batch_layout():
    from minillm.serving.batch import slot_mapping

    fig = diagrams.ragged_batch(num_new=(1, 4), context_lens=(10, 4), block_size=4)
    assert len(artists(fig, "token")) == 5 and len(artists(fig, "block-table")) == 2
    # A's context is blocks [0, 1, 2], its new token at position 9 -> block 2, offset 1 -> slot 9
    assert int(slot_mapping(np.array([0, 1, 2]), np.array([9]), 4)[0]) == 9
    slots = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "9" in slots and "12" in slots and "15" in slots      # B: block 3 holds positions 0..3 -> slots 12..15
    assert "C" not in slots


def test_chunked_prefill_trade_and_frontier_from_the_cost_model():
    from minillm.diagrams.serving import step_cost

    cost = step_cost()
    fig = diagrams.chunked_prefill_trade(prompt_len=1024, n_decodes=8, decode_context=512, chunks=[128, 1024])
    assert f"decode step alone: {cost.seconds_for([1] * 8, [513] * 8) * 1e3:.1f} ms" in joined(fig)
    ttft = fig.axes[0].lines[0].get_ydata()
    assert ttft[0] > ttft[1]                                       # small chunks delay the first token
    front = diagrams.latency_throughput_frontier(batches=[1, 4, 16])
    line = front.axes[0].lines[0]
    assert list(line.get_xdata()) == pytest.approx([b / cost.seconds_for([1] * b, [2048] * b) for b in (1, 4, 16)])

    class Sweep:
        batch, tok_per_s, per_request_tok_per_s = [1, 2], [100.0, 180.0], [100.0, 90.0]

    assert "measured" in joined(diagrams.latency_throughput_frontier(batches=[1, 2], measured=Sweep()))


def test_draft_verify_round_applies_the_rule():
    p = np.array([[0.5, 0.5], [0.9, 0.1], [0.3, 0.7]])
    q = np.array([[0.5, 0.5], [0.2, 0.8]])
    fig = diagrams.draft_verify_round(p=p, q=q, drafts=[0, 1], u=[0.9, 0.5])
    # d1: p/q = 1 accepted; d2: p/q = 0.125 < 0.5 rejected; residual (0.7, 0) / 0.7
    assert "2 tokens emitted this round" in joined(fig) and "1 accepted" in joined(fig)
    assert [t for t in texts(fig) if "rejected" in t]
    assert len(artists(fig, "residual")) == 2
    all_in = diagrams.draft_verify_round(p=p, q=q, drafts=[0, 0], u=[0.1, 0.1])
    assert "3 tokens emitted" in joined(all_in) and "bonus from p" in joined(all_in)


@pytest.mark.parametrize("call, name", [
    (lambda: diagrams.autoregressive_loop(prompt_len=0), "prompt_len"),
    (lambda: diagrams.autoregressive_loop(n_new=2.5), "n_new"),
    (lambda: diagrams.kv_cache_per_layer(n_kv_heads=-1), "n_kv_heads"),
    (lambda: diagrams.gqa_head_grouping(n_heads=8, n_kv_heads=3), "n_kv_heads"),
    (lambda: diagrams.gqa_head_grouping("DeepSeek V3 671B"), "model"),
    (lambda: diagrams.kv_bytes_vs_context(models=("GPT-9",)), "models"),
    (lambda: diagrams.kv_bytes_vs_context(cache_dtype="fp7"), "cache_dtype"),
    (lambda: diagrams.hbm_round_trips(d=0), "d"),
    (lambda: diagrams.hbm_round_trips(dtype="int3"), "dtype"),
    (lambda: diagrams.online_softmax_rescale([1.0, np.nan]), "scores"),
    (lambda: diagrams.online_softmax_rescale(tile=0), "tile"),
    (lambda: diagrams.flash_tile_dataflow(n=8192, block_m=64), "block"),
    (lambda: diagrams.flash_loops(n_q_tiles=0), "n_q_tiles"),
    (lambda: diagrams.hopper_overlap(gpu="T4"), "gpu"),
    (lambda: diagrams.block_table(seq_lens=(10, 20), reserved=(5, 20)), "reserved"),
    (lambda: diagrams.block_table(waiting=10), "waiting"),
    (lambda: diagrams.split_k_decode(batch=0), "batch"),
    (lambda: diagrams.batch_dependent_cuts(batches=(1, 0)), "batches"),
    (lambda: diagrams.composition_ladder(k=0), "k"),
    (lambda: diagrams.composition_ladder(n_new=2.5), "n_new"),
    (lambda: diagrams.batch_dependent_cuts(batches=(1, 2, 4, 8)), "batches"),
    (lambda: diagrams.batch_dependent_cuts(context=100_000), "32 pieces"),
    (lambda: diagrams.batch_dependent_cuts(gpu="TPU v5"), "gpu"),
    (lambda: diagrams.ragged_batch(num_new=(3,), context_lens=(2,)), "context_lens"),
    (lambda: diagrams.chunked_prefill_trade(chunks=[0]), "chunks"),
    (lambda: diagrams.latency_throughput_frontier(batches=[4, 2]), "batches"),
    (lambda: diagrams.draft_verify_round(k=0), "k"),
    (lambda: diagrams.draft_verify_round(p=np.ones((2, 2))), "p, q, drafts and u"),
])
def test_bad_arguments_name_themselves(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_one_palette():
    assert len(set(COLORS.values())) == len(COLORS)
    with pytest.raises(ValueError, match="role"):
        from minillm.diagrams.palette import color
        color("purple")
    with pytest.raises(AttributeError):
        diagrams.no_such_diagram


def test_hopper_overlap_exp_rate_is_derived_and_agrees_with_flashattention3():
    """The H100's exp throughput is computed from the registry's bf16 peak (16 exp2 per clock per SM against 4096
    tensor-core FLOP), and agrees with FlashAttention-3 section 3.1's rounded '3.9 TFLOPS of special functions'."""
    from minillm.book import agrees
    from minillm.diagrams import flash
    from minillm.hardware import GPUS

    assert flash.H100_EXP_PER_S == GPUS["H100 SXM"].bf16_flops * 16 / 4096
    assert agrees(3.9e12, flash.H100_EXP_PER_S)
    assert agrees(989e12, GPUS["H100 SXM"].bf16_flops)  # the paper's matmul figure, same registry entry


def test_latency_throughput_frontier_names_the_measured_points():
    """The measured points carry the label the caller gives (their model, GPU and context), not a bare "measured"."""
    from types import SimpleNamespace

    sweep = SimpleNamespace(batch=[1, 2], tok_per_s=[100.0, 180.0], per_request_tok_per_s=[100.0, 90.0])
    fig = diagrams.latency_throughput_frontier(batches=[1, 2], measured=sweep, measured_label="measured: 1B on an H100")
    assert "measured: 1B on an H100" in joined(fig)
