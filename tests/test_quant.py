import math

import numpy as np
import pytest

from minillm.quant import (FORMATS, dequantize_fp8, dequantize_int4, dequantize_int8, format_kv_quant_report,
                           fp8_e4m3_decode, fp8_e4m3_encode, fp8_e4m3_round, kv_quant_report, quantize_fp8,
                           quantize_int4, quantize_int8)


def e4m3fn_code_values() -> list[float]:
    """Value of each of the 256 bit patterns, decoded field by field (NaN for S.1111.111)."""
    values = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exp, mant = (code >> 3) & 0xF, code & 0x7
        if exp == 15 and mant == 7:
            values.append(math.nan)
        elif exp == 0:
            values.append(sign * math.ldexp(mant, -9))
        else:
            values.append(sign * math.ldexp(8 + mant, exp - 7 - 3))
    return values


CODE_VALUES = e4m3fn_code_values()
FINITE = np.array(sorted({v for v in CODE_VALUES if not math.isnan(v)}))  # 253 values (+0 == -0)
POSITIVE = np.array(CODE_VALUES[:127])  # codes 0x00..0x7E, increasing


def log_uniform(rng, lo, hi, size):
    mag = np.exp2(rng.uniform(np.log2(lo), np.log2(hi), size))
    return (mag * rng.choice([-1.0, 1.0], size)).astype(np.float32)


# --------------------------------------------------------------------------- fp8 e4m3


def test_fp8_e4m3_code_table_has_expected_extremes():
    assert FINITE.size == 253 and FINITE.max() == 448.0 and POSITIVE[1] == 2.0 ** -9 and POSITIVE[8] == 2.0 ** -6


def test_fp8_e4m3_round_outputs_are_in_the_e4m3_value_set(rng):
    x = np.concatenate([log_uniform(rng, 2.0 ** -14, 2.0 ** 12, 50_000), rng.normal(size=10_000).astype(np.float32),
                        [0.0, -0.0, 1e-30, 447.9, 448.0, 1e30]]).astype(np.float32)
    r = fp8_e4m3_round(x)
    assert r.dtype == np.float32 and r.shape == x.shape
    assert np.all(np.isin(r, FINITE))


def test_fp8_e4m3_round_ties_go_to_even_code_on_every_midpoint():
    lo, hi = POSITIVE[:-1], POSITIVE[1:]
    mid = (lo + hi) / 2  # exact in float64 and float32
    even = np.where(np.arange(126) % 2 == 0, lo, hi)  # code i is even -> lo wins
    np.testing.assert_array_equal(fp8_e4m3_round(mid.astype(np.float32)), even)
    np.testing.assert_array_equal(fp8_e4m3_round(-mid), -even)
    # Just off the midpoint, the nearer neighbour wins regardless of parity.
    np.testing.assert_array_equal(fp8_e4m3_round(np.nextafter(mid, hi)), hi)
    np.testing.assert_array_equal(fp8_e4m3_round(np.nextafter(mid, lo)), lo)


def test_fp8_e4m3_round_saturates_at_448():
    big = np.array([448.0, 449.0, 464.0, 480.0, 1e4, np.finfo(np.float32).max, np.inf])
    np.testing.assert_array_equal(fp8_e4m3_round(big), 448.0)
    np.testing.assert_array_equal(fp8_e4m3_round(-big), -448.0)
    assert np.isnan(fp8_e4m3_round(np.array([np.nan]))).all()


def test_fp8_e4m3_round_relative_error_at_most_2_pow_minus_4_in_normal_range(rng):
    x = log_uniform(rng, 2.0 ** -6, 448.0, 100_000).astype(np.float64)
    rel = np.abs(fp8_e4m3_round(x) - x) / np.abs(x)
    assert rel.max() <= 2.0 ** -4


def test_fp8_e4m3_round_keeps_representable_values_and_signed_zero():
    np.testing.assert_array_equal(fp8_e4m3_round(FINITE), FINITE)
    assert np.signbit(fp8_e4m3_round(np.array([-0.0, -2.0 ** -10]))).all()  # a tie between -0 and -2**-9: even wins


def test_fp8_e4m3_encode_decode_round_trip_every_code():
    codes = np.array([c for c in range(256) if not math.isnan(CODE_VALUES[c])], np.uint8)
    values = fp8_e4m3_decode(codes)
    np.testing.assert_array_equal(values, np.array(CODE_VALUES)[codes])
    np.testing.assert_array_equal(fp8_e4m3_encode(values), codes)
    assert fp8_e4m3_encode(np.array([np.nan]))[0] == 0x7F


def test_fp8_e4m3_round_bit_exact_with_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.concatenate([log_uniform(rng, 2.0 ** -12, 448.0, 100_000), (POSITIVE[:-1] + POSITIVE[1:]) / 2])
    x = x.astype(np.float32)
    ref = x.astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(fp8_e4m3_round(x), ref.astype(np.float32))
    np.testing.assert_array_equal(fp8_e4m3_encode(x), ref.view(np.uint8))


def test_quantize_fp8_per_tensor_scale_maps_amax_to_448(rng):
    x = rng.normal(size=(2, 3, 5, 16)).astype(np.float32) * 0.01
    codes, scale = quantize_fp8(x)
    assert codes.dtype == np.uint8 and codes.shape == x.shape and scale.shape == ()
    assert scale == np.float32(np.abs(x).max() / 448.0)
    assert fp8_e4m3_decode(codes).max() == 448.0 or fp8_e4m3_decode(codes).min() == -448.0
    back = dequantize_fp8(codes, scale)
    normal = np.abs(x) >= scale * 2.0 ** -6
    assert np.all(np.abs(back - x)[normal] <= 2.0 ** -4 * np.abs(x)[normal] * (1 + 1e-6))


def test_quantize_fp8_per_token_scale_has_one_scale_per_token_and_head(rng):
    x = rng.normal(size=(2, 3, 5, 16)).astype(np.float32)
    codes, scale = quantize_fp8(x, per_token=True)
    assert scale.shape == (2, 3, 5, 1)
    np.testing.assert_array_equal(np.abs(fp8_e4m3_decode(codes)).max(axis=-1), 448.0)


def test_quantize_fp8_rejects_bad_inputs():
    with pytest.raises(ValueError, match="floating-point"):
        quantize_fp8(np.arange(4))
    with pytest.raises(ValueError, match="scale"):
        quantize_fp8(np.ones(4, np.float32), scale=0.0)
    with pytest.raises(ValueError, match="uint8"):
        fp8_e4m3_decode(np.zeros(3, np.int8))


# --------------------------------------------------------------------------- int8


def test_quantize_int8_round_trip_error_within_half_scale(rng):
    x = rng.normal(size=(2, 4, 9, 64)).astype(np.float32) * rng.uniform(0.01, 10, size=(2, 4, 9, 1))
    q, scale = quantize_int8(x)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and scale.shape == (2, 4, 9, 1)
    assert np.abs(q).max(axis=-1).min() == 127  # each token-head uses the full range
    err = np.abs(dequantize_int8(q, scale) - x)
    assert np.all(err <= scale / 2 * (1 + 1e-5))


def test_quantize_int8_zero_rows_stay_zero():
    q, scale = quantize_int8(np.zeros((1, 1, 2, 8), np.float32))
    assert np.all(q == 0) and np.all(scale > 0)
    assert np.all(dequantize_int8(q, scale) == 0)


@pytest.mark.parametrize("bad", [np.zeros((4, 8)), np.zeros((1, 1, 0, 8)), np.zeros((1, 1, 2, 8), np.int32)])
def test_quantize_int8_rejects_non_cache_tensors(bad):
    with pytest.raises(ValueError):
        quantize_int8(bad)


# --------------------------------------------------------------------------- int4


@pytest.mark.parametrize("group", [8, 32, 64])
def test_quantize_int4_round_trip_error_within_half_group_scale(rng, group):
    x = rng.normal(size=(2, 3, 7, 64)).astype(np.float32)
    packed, scale = quantize_int4(x, group=group)
    assert scale.shape == (2, 3, 7, 64 // group)
    back = dequantize_int4(packed, scale, group, 64)
    bound = np.repeat(scale, group, axis=-1) / 2
    assert np.all(np.abs(back - x) <= bound * (1 + 1e-5))


def test_quantize_int4_packs_two_values_per_byte(rng):
    B, H, N, D, G = 2, 3, 5, 128, 32
    packed, scale = quantize_int4(rng.normal(size=(B, H, N, D)).astype(np.float32), group=G)
    assert packed.dtype == np.uint8 and packed.shape == (B, H, N, D // 2)
    assert packed.nbytes + scale.nbytes == B * H * N * (D // 2 + 4 * D // G)


def test_quantize_int4_nibble_layout_low_then_high_twos_complement():
    x = np.array([7, -7, 1, -1, 0, 3, -3, 7], np.float32).reshape(1, 1, 1, 8)
    packed, scale = quantize_int4(x, group=8)
    assert scale.item() == 1.0
    assert packed.ravel().tolist() == [0x97, 0xF1, 0x30, 0x7D]  # (-7 -> 0x9, -1 -> 0xF, -3 -> 0xD)
    np.testing.assert_array_equal(dequantize_int4(packed, scale, 8, 8), x)


def test_quantize_int4_group_must_divide_head_dim():
    with pytest.raises(ValueError, match="divide the head dim 48"):
        quantize_int4(np.ones((1, 1, 1, 48), np.float32), group=32)
    with pytest.raises(ValueError, match="even"):
        quantize_int4(np.ones((1, 1, 1, 3), np.float32), group=1)
    packed, scale = quantize_int4(np.ones((1, 1, 1, 64), np.float32))
    with pytest.raises(ValueError, match="expected packed"):
        dequantize_int4(packed, scale, 16, 64)


# --------------------------------------------------------------------------- report


def test_kv_quant_report_orders_errors_and_bytes(rng):
    B, H, N, D = 1, 4, 64, 128
    q, k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) for _ in range(3))
    rows = {r.format: r for r in kv_quant_report(q, k, v, causal=True)}
    assert list(rows) == ["fp16", "fp8_e4m3", "int8", "int4"]
    assert rows["fp16"].max_abs_err == 0.0 and rows["fp16"].bytes_saved == 0
    assert 0 < rows["int8"].rel_rms_err < rows["int4"].rel_rms_err
    assert 0 < rows["fp8_e4m3"].rel_rms_err < rows["int4"].rel_rms_err
    assert rows["int8"].max_abs_err < rows["int4"].max_abs_err
    assert rows["int4"].bytes_stored < rows["int8"].bytes_stored < rows["fp16"].bytes_stored
    n = 2 * B * H * N * D
    assert rows["fp16"].bytes_per_element == 2.0
    assert rows["fp8_e4m3"].bytes_stored == n + 2 * 4            # codes + one fp32 scale each for K and V
    assert rows["int8"].bytes_per_element == 1 + 4 / D           # one fp32 scale per token-head
    assert rows["int4"].bytes_per_element == 0.5 + 4 / 32        # one fp32 scale per 32 channels
    assert rows["int4"].bytes_saved == 2 * n - rows["int4"].bytes_stored
    assert "int4" in format_kv_quant_report(list(rows.values()))


def test_kv_quant_report_fp8_per_token_scale_stores_one_scale_per_token_head(rng):
    B, H, N, D = 1, 2, 32, 64
    q = rng.normal(size=(B, H, N, D)).astype(np.float32)
    # rows of very different magnitude: the case a per-tensor scale handles worst
    k, v = (rng.normal(size=(B, H, N, D)).astype(np.float32) * np.exp2(rng.uniform(-12, 4, size=(B, H, N, 1)))
            for _ in range(2))
    rows = {r.format: r for r in kv_quant_report(q, k, v, formats=("fp16", "fp8_e4m3", "fp8_e4m3_tok", "int8"))}
    assert rows["fp8_e4m3_tok"].bytes_per_element == 1 + 4 / D   # same bytes as per-token int8
    assert rows["fp8_e4m3_tok"].bytes_stored == rows["int8"].bytes_stored
    assert rows["fp8_e4m3_tok"].rel_rms_err <= rows["fp8_e4m3"].rel_rms_err
    # the 3-bit mantissa still leaves per-token fp8 well behind per-token int8
    assert rows["fp8_e4m3_tok"].rel_rms_err > 2 * rows["int8"].rel_rms_err


def test_fp8_per_token_format_matches_quantize_fp8_per_token(rng):
    x = rng.normal(size=(1, 2, 5, 16)).astype(np.float32)
    back, nbytes = FORMATS["fp8_e4m3_tok"].round_trip(x)
    codes, scale = quantize_fp8(x, per_token=True)
    np.testing.assert_array_equal(back, dequantize_fp8(codes, scale))
    assert nbytes == codes.nbytes + scale.nbytes == x.size + 4 * 10


def test_kv_quant_report_rejects_unknown_format_and_bad_shapes(rng):
    q = k = v = rng.normal(size=(1, 2, 4, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="unknown formats"):
        kv_quant_report(q, k, v, formats=("fp16", "nf4"))
    with pytest.raises(ValueError):
        kv_quant_report(q, k[:, :, :, :4], v)


def test_quant_formats_registry_round_trips_shape_and_dtype(rng):
    x = rng.normal(size=(1, 2, 3, 64)).astype(np.float32)
    for fmt in FORMATS.values():
        back, nbytes = fmt.round_trip(x)
        assert back.shape == x.shape and back.dtype == np.float32 and nbytes > 0
