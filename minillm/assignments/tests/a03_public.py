"""Assignment 3, public tests: KV-cache sizing and fp8/int8 round trips."""
import numpy as np

from minillm.quant import dequantize_fp8, dequantize_int8, quantize_fp8, quantize_int8
from minillm.sizing import gqa_kv_bytes, mla_kv_bytes


def test_gqa_kv_bytes_formula():
    # a Llama-3-8B-like shape: 32 layers, 8 KV heads of 128, bf16
    assert gqa_kv_bytes(1, 32, 8, 128, 2) == 2 * 32 * 8 * 128 * 2
    assert gqa_kv_bytes(1000, 32, 8, 128, 2, batch=3) == 3 * 1000 * 2 * 32 * 8 * 128 * 2


def test_mla_kv_bytes_formula():
    assert mla_kv_bytes(10, 61, 512, 64, 2) == 10 * 61 * (512 + 64) * 2


def test_int8_round_trip_within_half_a_step(rng):
    x = rng.normal(size=(2, 3, 5, 16)).astype(np.float32)
    q, scale = quantize_int8(x)
    assert q.dtype == np.int8 and q.shape == x.shape and scale.shape == (2, 3, 5, 1)
    err = np.abs(dequantize_int8(q, scale) - x)
    assert np.all(err <= scale / 2 + 1e-6)


def test_fp8_round_trip_relative_error(rng):
    x = rng.normal(size=(1, 2, 8, 16)).astype(np.float32)
    codes, scale = quantize_fp8(x)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    back = dequantize_fp8(codes, scale)
    big = np.abs(x) > 0.05 * np.abs(x).max()  # normal range of e4m3: 3 mantissa bits
    assert np.all(np.abs(back - x)[big] <= 2.0**-4 * np.abs(x)[big] + 1e-7)
