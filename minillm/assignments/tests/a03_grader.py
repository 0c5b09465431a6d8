"""Assignment 3, grader-only tests: dtype names, 4-bit rounding, the fp8 codes of x over one scale, per-token
scales, zeros, huge values, bad input. Core: both byte formulas with dtype names and half bytes, int8's row scale
(the row max on 127), and fp8's codes: e4m3 of x / (amax / 448)."""
import numpy as np
import pytest

from minillm.quant import (
    FP8_E4M3_MAX,
    dequantize_fp8,
    dequantize_int8,
    fp8_e4m3_encode,
    quantize_fp8,
    quantize_int8,
)
from minillm.sizing import gqa_kv_bytes, mla_kv_bytes


@pytest.mark.core
def test_gqa_kv_bytes_dtype_names_and_half_bytes():
    assert gqa_kv_bytes(7, 3, 2, 64, "fp8") == 2 * 7 * 3 * 2 * 64
    assert gqa_kv_bytes(7, 3, 2, 64, "fp32") == 4 * 2 * 7 * 3 * 2 * 64
    assert gqa_kv_bytes(1, 1, 1, 3, "int4") == 3  # 6 elements at half a byte
    assert gqa_kv_bytes(1, 1, 1, 1, 0.5) == 1     # one element still takes a whole byte
    assert gqa_kv_bytes(32e3, 32, 8, 128, 2) == gqa_kv_bytes(32000, 32, 8, 128, 2)


@pytest.mark.core
def test_mla_kv_bytes_independent_of_heads_and_half_bytes():
    assert mla_kv_bytes(3, 2, 5, 0 + 2, "int4") == int(np.ceil(3 * 2 * 7 * 0.5))
    assert mla_kv_bytes(4096, 61, 512, 64, "bf16", batch=2) == 2 * 4096 * 61 * 576 * 2


@pytest.mark.parametrize("kwargs", [{"n_tokens": 0}, {"n_layers": -1}, {"n_kv_heads": 1.5},
                                    {"d_head": "128"}, {"dtype_bytes": "fp7"}, {"batch": True}])
def test_gqa_kv_bytes_bad_input_raises(kwargs):
    args = {"n_tokens": 10, "n_layers": 2, "n_kv_heads": 2, "d_head": 8, "dtype_bytes": 2, "batch": 1} | kwargs
    with pytest.raises(ValueError):
        gqa_kv_bytes(**args)


@pytest.mark.parametrize("kwargs", [{"kv_lora_rank": 0}, {"qk_rope_dim": -2}, {"n_tokens": 2.5},
                                    {"dtype_bytes": 0}])
def test_mla_kv_bytes_bad_input_raises(kwargs):
    args = {"n_tokens": 10, "n_layers": 2, "kv_lora_rank": 16, "qk_rope_dim": 4, "dtype_bytes": 2} | kwargs
    with pytest.raises(ValueError):
        mla_kv_bytes(**args)


@pytest.mark.core
def test_int8_row_max_maps_to_127_and_zero_rows_survive(rng):
    x = rng.normal(size=(1, 2, 4, 8)).astype(np.float32)
    x[0, 1, 2] = 0.0
    q, scale = quantize_int8(x)
    assert np.all(np.isfinite(scale)) and np.all(scale > 0)
    np.testing.assert_array_equal(q[0, 1, 2], 0)
    amax_codes = np.abs(q.astype(np.int32)).max(axis=-1)
    assert np.all(amax_codes[np.abs(x).max(axis=-1) > 0] == 127)
    np.testing.assert_allclose(scale[..., 0], np.where(np.abs(x).max(-1) > 0, np.abs(x).max(-1) / 127, 1.0),
                               rtol=1e-6)


def test_int8_huge_and_tiny_rows(rng):
    x = rng.normal(size=(1, 1, 3, 8)).astype(np.float32) * np.array([1e30, 1e-30, 1.0], np.float32)[:, None]
    q, scale = quantize_int8(x)
    back = dequantize_int8(q, scale)
    assert np.all(np.isfinite(back))
    assert np.all(np.abs(back - x) <= scale / 2 * (1 + 1e-5))


@pytest.mark.parametrize("bad", [np.zeros((2, 3)), np.zeros((1, 1, 0, 4)), np.ones((1, 1, 2, 4), np.int32)])
def test_quantize_int8_bad_input_raises(bad):
    with pytest.raises(ValueError):
        quantize_int8(bad)


def test_dequantize_int8_wrong_dtype_raises():
    with pytest.raises(ValueError):
        dequantize_int8(np.zeros((1, 1, 2, 4), np.int16), np.ones((1, 1, 2, 1), np.float32))


@pytest.mark.core
@pytest.mark.points(2)
def test_fp8_codes_are_e4m3_of_x_over_one_scale(rng):
    """Per tensor, the scale is one number, amax / 448, and the codes are the e4m3 encoding of x / scale: a
    "quantizer" that keeps x in the scale and returns constant codes round-trips exactly but quantizes nothing."""
    x = rng.normal(size=(1, 2, 6, 8)).astype(np.float32) * 3
    codes, scale = quantize_fp8(x)
    assert np.ndim(scale) == 0, f"a per-tensor scale is one number, got shape {np.shape(scale)}"
    np.testing.assert_allclose(float(scale), np.abs(x).max() / FP8_E4M3_MAX, rtol=1e-6)
    s32 = np.float32(scale)   # (x / scale rounded in float64 or in float32 may round to neighbouring codes)
    exact = (codes == fp8_e4m3_encode(x.astype(np.float64) / s32)) | (codes == fp8_e4m3_encode(x / s32))
    assert exact.all(), f"{(~exact).sum()} of {codes.size} codes are not e4m3 of x / scale"


def test_fp8_per_token_scales(rng):
    x = rng.normal(size=(2, 2, 3, 8)).astype(np.float32) * rng.uniform(0.01, 100, size=(2, 2, 3, 1))
    codes, scale = quantize_fp8(x, per_token=True)
    assert scale.shape == (2, 2, 3, 1)
    np.testing.assert_allclose(scale, np.abs(x).max(-1, keepdims=True) / FP8_E4M3_MAX, rtol=1e-6)
    back = dequantize_fp8(codes, scale)
    np.testing.assert_allclose(np.abs(back).max(-1), np.abs(x).max(-1), rtol=1e-6)


def test_fp8_huge_values_and_given_scale(rng):
    x = rng.normal(size=(1, 1, 4, 8)) * 1e30
    codes, scale = quantize_fp8(x)
    back = dequantize_fp8(codes, scale)
    assert np.all(np.isfinite(back))
    big = np.abs(x) > 0.05 * np.abs(x).max()
    assert np.all(np.abs(back - x)[big] <= 2.0**-4 * np.abs(x)[big])
    codes2, scale2 = quantize_fp8(np.array([1.0, -2.0, 0.0], np.float32), scale=0.5)
    np.testing.assert_array_equal(dequantize_fp8(codes2, scale2), [1.0, -2.0, 0.0])


def test_fp8_all_zero_tensor():
    codes, scale = quantize_fp8(np.zeros((1, 1, 2, 4), np.float32))
    assert float(scale) > 0
    np.testing.assert_array_equal(dequantize_fp8(codes, scale), 0.0)


@pytest.mark.parametrize("scale", [0.0, -1.0, np.nan, np.inf])
def test_fp8_bad_scale_raises(scale):
    with pytest.raises(ValueError):
        quantize_fp8(np.ones(4, np.float32), scale=scale)


def test_fp8_integer_input_raises():
    with pytest.raises(ValueError):
        quantize_fp8(np.arange(4))
