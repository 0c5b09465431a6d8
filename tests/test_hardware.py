import subprocess
import sys

import numpy as np
import pytest

from minillm import hardware as hw

SHAPES = [(1, 1, 1, 1), (7, 4, 3, 2), (37, 16, 8, 5), (64, 8, 16, 16), (100, 32, 64, 128), (130, 8, 128, 32)]


def reference_attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v in float64: the plain formula the simulators must reproduce."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v


def qkv(rng, n, d, dtype):
    return tuple(rng.normal(size=(n, d)).astype(dtype) for _ in range(3))


# --------------------------------------------------------------------------- simulator == formulas

@pytest.mark.parametrize("n,d,block_m,block_n", SHAPES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_tiled_simulator_counts_equal_flash_formula(n, d, block_m, block_n, dtype, rng):
    q, k, v = qkv(rng, n, d, dtype)
    _, counter = hw.simulate_tiled_attention(q, k, v, block_m, block_n)
    model = hw.flash_attention_traffic(n, d, block_m, block_n, np.dtype(dtype).itemsize)
    assert counter.components == model["components"]
    assert counter.total == model["total"]


@pytest.mark.parametrize("n,d", [(1, 1), (7, 4), (37, 16), (130, 8)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_standard_simulator_counts_equal_standard_formula(n, d, dtype, rng):
    q, k, v = qkv(rng, n, d, dtype)
    _, counter = hw.simulate_standard_attention(q, k, v)
    model = hw.standard_attention_traffic(n, d, np.dtype(dtype).itemsize)
    assert counter.components == model["components"]
    assert counter.total == model["total"]


@pytest.mark.parametrize("n,d,block_m,block_n", SHAPES)
def test_simulators_match_reference_output(n, d, block_m, block_n, rng):
    q, k, v = qkv(rng, n, d, np.float64)
    ref = reference_attention(q, k, v)
    tiled, _ = hw.simulate_tiled_attention(q, k, v, block_m, block_n)
    standard, _ = hw.simulate_standard_attention(q, k, v)
    np.testing.assert_allclose(tiled, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(standard, ref, rtol=1e-12, atol=1e-12)


def test_simulators_in_fp16_stay_close_and_keep_dtype(rng):
    q, k, v = qkv(rng, 50, 16, np.float16)
    ref = reference_attention(q, k, v)
    tiled, _ = hw.simulate_tiled_attention(q, k, v, 16, 8)
    standard, _ = hw.simulate_standard_attention(q, k, v)
    assert tiled.dtype == standard.dtype == np.float16
    np.testing.assert_allclose(tiled, ref, atol=2e-3)
    np.testing.assert_allclose(standard, ref, atol=5e-3)  # S and P rounded to fp16 in HBM


# --------------------------------------------------------------------------- the chapter's numbers

def test_score_matrix_at_4096_fp16_is_32_mib():
    t = hw.standard_attention_traffic(4096, 128, 2)
    assert t["score_matrix_bytes"] == 33_554_432 == 32 * hw.MiB


def test_page_round_trip_claim_versus_textbook_count():
    t = hw.standard_attention_traffic(4096, 128, 2)
    # The page's "about 96 MB in all" is three score-matrix transfers ...
    assert 3 * t["score_matrix_bytes"] == 96 * hw.MiB
    # ... while the textbook three-kernel schedule moves an n x n matrix four times
    # (write S, read S, write P, read P), plus Q, K, V, O once each.
    n2 = sum(v for key, v in t["components"].items() if key[-1] in "sp")
    assert n2 == 4 * t["score_matrix_bytes"] == 128 * hw.MiB
    assert t["total"] == 132 * hw.MiB


def test_flash_traffic_at_4096_with_h100_blocks():
    h100 = hw.get_gpu("H100 SXM")
    assert hw.flash_block_size_for_sram(128, h100.sram_per_sm_bytes, 2) == (128, 256)
    assert hw.flash_block_size_for_sram(128, h100.smem_per_sm_bytes, 2) == (128, 128)
    f = hw.flash_attention_traffic(4096, 128, 128, 128, 2)
    # 32 query tiles: Q and O once (1 MiB each), K and V 32 times (32 MiB each).
    assert f["q_tiles"] == 32 and f["total"] == 66 * hw.MiB
    assert hw.traffic_ratio(4096, 128, 128, 128, 2) == 2.0
    # Only with perfect reuse of K/V (e.g. from L2) does the cut approach the 4 n d floor:
    assert hw.standard_attention_traffic(4096, 128)["total"] / hw.compulsory_attention_traffic(4096, 128) == 33.0


def test_traffic_ratio_versus_n():
    ns = [512, 1024, 2048, 4096, 8192, 16384]
    # ratio = 2 block_m (d + n) / (d (block_m + n)) for n a multiple of block_m:
    # exactly 2 at block_m == d, rising with n towards 2 block_m / d when block_m > d.
    assert [hw.traffic_ratio(n, 128, 128, 128) for n in ns] == [2.0] * len(ns)
    rising = [hw.traffic_ratio(n, 64, 128, 64) for n in ns]
    assert all(a < b for a, b in zip(rising, rising[1:]))
    assert rising[-1] < 4.0 and rising[-1] == pytest.approx(4.0, rel=0.01)


def test_block_sizes_fit_q_k_v_s_in_sram():
    for d in (16, 64, 100, 128, 256):
        for sram in (48 * hw.KiB, 100 * hw.KiB, 228 * hw.KiB, 256 * hw.KiB):
            bm, bn = hw.flash_block_size_for_sram(d, sram, 2)
            assert bm <= d and bm & (bm - 1) == 0 and bn & (bn - 1) == 0
            assert (bm * d + 2 * bn * d + bm * bn) * 2 <= sram
            assert 2 * bn * 4 * d * 2 > sram   # the next power of two would break FA1's M/(4d) rule


# --------------------------------------------------------------------------- GPUs and roofline

def test_gpu_table():
    assert set(hw.GPUS) == {"A100 40GB", "A100 80GB", "H100 SXM", "H200", "B200", "L40S", "T4"}
    for name, spec in hw.GPUS.items():
        assert spec.name == name and spec.sources
        assert spec.smem_per_sm_bytes <= spec.sram_per_sm_bytes
    assert hw.get_gpu("h200") is hw.GPUS["H200"]
    assert hw.GPUS["T4"].bf16_flops is None and hw.GPUS["A100 80GB"].fp8_flops is None


def test_h200_registry_matches_recorded_device_query():
    # The H200's L2 and SM count come from the CUDA device query recorded with the chapter's measurements,
    # not from the H100 SXM's whitepaper figures (50 MiB of L2 there).
    from minillm.book import load_result

    meta = load_result("hardware_h200.json", "hardware")["meta"]
    h200 = hw.GPUS["H200"]
    assert meta["gpu"] == "NVIDIA H200"
    assert h200.l2_bytes == meta["l2_bytes"] == 60 * hw.MiB
    assert h200.sm_count == meta["sm_count"]
    assert h200.l2_bytes != hw.GPUS["H100 SXM"].l2_bytes


def test_ridge_h200_bf16():
    assert hw.get_gpu("H200").ridge("bf16") == pytest.approx(989e12 / 4.8e12, rel=1e-3)
    with pytest.raises(ValueError):
        hw.get_gpu("T4").ridge("bf16")
    with pytest.raises(ValueError):
        hw.get_gpu("A100 40GB").ridge("fp8")


def test_matmul_intensities():
    assert hw.decode_matmul_intensity(1, 8192, 8192, 2) == pytest.approx(1.0, rel=1e-3)
    assert hw.matmul_intensity(8192, 8192, 8192, 2) == pytest.approx(8192 / 3)
    decode = [hw.decode_matmul_intensity(b, 4096, 4096, "bf16") for b in (1, 8, 64)]
    assert decode == sorted(decode) and decode[-1] < hw.prefill_matmul_intensity(2048, 4096, 4096, 2)


def test_attention_intensity_and_roofline():
    n, d = 4096, 128
    assert hw.attention_intensity(n, d, 2, fused=False) == 4 * n * n * d / (132 * hw.MiB)
    assert hw.attention_intensity(n, d, 2, fused=True) == 2 * hw.attention_intensity(n, d, 2, fused=False)
    h200 = hw.get_gpu("H200")
    assert hw.roofline(h200, 1.0) == h200.hbm_bw
    assert hw.roofline("H200", 1e6) == h200.bf16_flops
    assert hw.roofline(h200, h200.ridge()) == pytest.approx(h200.bf16_flops)
    np.testing.assert_allclose(hw.roofline(h200, np.array([1.0, 1e6])), [h200.hbm_bw, h200.bf16_flops])


def test_fused_attention_intensities_hbm_versus_l2():
    n, d = 4096, 128
    i = hw.fused_attention_intensities(n, d, 128, 128, 2)
    # HBM sees one pass over Q, K, V, O: 4 n^2 d / (4 n d * 2 B) = n / 2 FLOP/B.
    assert i["hbm"] == n / 2 and i["hbm_bytes"] == 4 * hw.MiB
    # L2 serves every tile load, so its intensity is the tiled model's.
    assert i["l2"] == hw.attention_intensity(n, d, 2, fused=True) and i["l2_bytes"] == 66 * hw.MiB
    assert i["q_tiles"] == 32 and i["flops"] == 4 * n * n * d
    # With 128-row query tiles the L2 intensity tends to 128 FLOP/B (bf16), whatever d; HBM's grows with n.
    assert hw.fused_attention_intensities(1 << 16, 64)["l2"] == pytest.approx(128, rel=0.01)
    h200 = hw.get_gpu("H200")
    assert i["l2"] < h200.ridge() < i["hbm"]
    with pytest.raises(ValueError):
        hw.fused_attention_intensities(0, 128)


def test_plot_roofline_draws_line_and_points():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    pts = [("decode", 1.0, 3e12), ("prefill", 500.0, 7e14)]
    assert hw.plot_roofline(ax, "H200", pts) is ax
    assert len(ax.collections) == 2 and ax.get_xscale() == "log" and ax.get_yscale() == "log"
    plt.close(fig)


def test_plot_roofline_names_points_in_legend_inside_axes():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    pts = [("matmul m=1", 1.0, 3e12), ("matmul m=16", 16.0, 5e13), ("attention", 124.0, 6.6e14),
           ("fused, L2", 2048.0, 6.6e14)]
    hw.plot_roofline(ax, "H200", pts)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(label in texts for label, _, _ in pts)
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert all(x0 < x < x1 and y0 < y < y1 for _, x, y in pts)
    fig.tight_layout()
    fig.canvas.draw()  # the legend must lie inside the figure and cover no point
    box, page = ax.get_legend().get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    for _, x, y in pts:
        px, py = ax.transData.transform((x, y))
        assert not box.contains(px, py)
    plt.close(fig)


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("call", [
    lambda: hw.standard_attention_traffic(0, 128),
    lambda: hw.standard_attention_traffic(-4, 128),
    lambda: hw.standard_attention_traffic(4096, 2.5),
    lambda: hw.standard_attention_traffic(True, 128),
    lambda: hw.standard_attention_traffic(4096, 128, 3),
    lambda: hw.standard_attention_traffic(4096, 128, "int3"),
    lambda: hw.flash_attention_traffic(4096, 128, 0, 64),
    lambda: hw.flash_attention_traffic(4096, 128, 64, -1),
    lambda: hw.flash_block_size_for_sram(128, 100, 2),
    lambda: hw.flash_block_size_for_sram(0, 100_000, 2),
    lambda: hw.matmul_intensity(1, 0, 1, 2),
    lambda: hw.decode_matmul_intensity(1, 8192, 8192, 0),
    lambda: hw.roofline("H200", 0.0),
    lambda: hw.roofline("H200", -1.0),
    lambda: hw.roofline("H200", 1.0, dtype="fp4"),
    lambda: hw.get_gpu("H300"),
    lambda: hw.simulate_tiled_attention(np.ones((4, 2)), np.ones((4, 3)), np.ones((4, 3)), 2, 2),
    lambda: hw.simulate_tiled_attention(np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 2)), 0, 2),
    lambda: hw.simulate_standard_attention(np.ones(4), np.ones(4), np.ones(4)),
])
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_import_needs_no_torch_or_matplotlib():
    code = "import sys, minillm.hardware; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _load_bench():
    import importlib
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # the harness is a checkout's package, not minillm's
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module("benchmarks.hardware")


@pytest.mark.parametrize("n", [512, 1000, 4096, 16384])
def test_benchmark_formulas_agree_with_module(n):
    bench = _load_bench()
    assert bench.standard_traffic_model(n, 128) == hw.standard_attention_traffic(n, 128, 2)["total"]
    assert bench.flash_traffic_model(n, 128) == hw.flash_attention_traffic(n, 128, 128, 128, 2)["total"]
    # eager PyTorch moves each score matrix far more often than the textbook count (28 vs 8 bytes per score)
    assert bench.standard_traffic_eager(n, 128) - 4 * n * 128 * 2 == 28 * n * n


def test_gpu_registry_memory_is_device_reported_with_labels_apart():
    # One registry, one unit convention: memory_bytes is what the device reports (an "80 GB" H100: 79.2 GiB),
    # the product's "GB" is a label (the old registry stored the label as 80e9 bytes).
    h100, b200 = hw.GPUS["H100 SXM"], hw.GPUS["B200"]
    assert h100.memory_bytes == 85_045_477_376 and h100.memory_label_gb == 80
    assert round(h100.memory_bytes / hw.GiB, 1) == 79.2
    assert b200.memory_label_announced_gb == 192 and b200.memory_label_gb == 180
    assert round(b200.memory_bytes / hw.GiB, 2) == 178.35
    assert {n for n, g in hw.GPUS.items() if g.memory_kind == "GDDR6"} == {"L40S", "T4"}
    assert all(g.memory_kind.startswith("HBM") for n, g in hw.GPUS.items() if n not in ("L40S", "T4"))
    assert all(g.memory_source for g in hw.GPUS.values())


def test_decode_attention_is_memory_bound_fused_or_not():
    # One query row per query head against n cached keys: about `group` FLOP/B in 16-bit, whatever n.
    for g in (1, 4, 8, 16):
        fused = hw.decode_attention_intensity(32_768, 128, g, 2)
        unfused = hw.decode_attention_intensity(32_768, 128, g, 2, fused=False)
        assert fused == pytest.approx(g, rel=0.01)
        assert unfused < fused < hw.get_gpu("H200").ridge("bf16") / 10
    t = hw.decode_attention_traffic(4096, 128, 8, 2)
    assert t["flops"] == 4 * 8 * 4096 * 128
    assert t["components"]["read_k"] == t["components"]["read_v"] == 4096 * 128 * 2
    assert "write_s" in hw.decode_attention_traffic(4096, 128, 8, 2, fused=False)["components"]
    with pytest.raises(ValueError):
        hw.decode_attention_traffic(4096, 128, 0)
