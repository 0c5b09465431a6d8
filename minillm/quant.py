"""KV-cache quantization references in NumPy: fp8 e4m3, int8 and int4.

Every quantizer returns the arrays a cache would really store (uint8 codes,
int8 values, packed int4 nibbles, float32 scales), so bytes are read off
``.nbytes`` rather than assumed. Dequantizers return float32.

Layout for the per-token formats is the cache's ``(B, H, N, D)``: one scale per
(batch, head, token), or per group of ``G`` channels along D for int4.

fp8 e4m3 here is the "e4m3fn" variant of the OCP FP8 spec used by NVIDIA GPUs:
1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, only NaN
(S.1111.111); largest finite 448 = 1.75 * 2**8; smallest normal 2**-6;
subnormals m * 2**-9 for m in 1..7.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .attention import check_attention_inputs, standard_attention

FP8_E4M3_MAX = 448.0
_FP8_MIN_NORMAL_EXP = -6   # 2**-6 is the smallest normal; below it the spacing stays 2**-9
_FP8_MANTISSA_BITS = 3
INT8_MAX = 127
INT4_MAX = 7               # symmetric [-7, 7]: code -8 unused, so +x and -x round alike


def _float_array(x, name: str = "x") -> np.ndarray:
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    return arr


def _cache_tensor(x, name: str = "x") -> np.ndarray:
    arr = _float_array(x, name)
    if arr.ndim != 4 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty cache tensor (B, H, N, D), got shape {arr.shape}")
    return arr


def _symmetric_scale(amax: np.ndarray, qmax: float) -> np.ndarray:
    # An all-zero row gets scale 1 instead of 0, so quantizing never divides by zero.
    return np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)


# --------------------------------------------------------------------------- fp8 e4m3


def fp8_e4m3_round(x) -> np.ndarray:
    """Round to the nearest e4m3fn value (ties to even), saturating to +-448; returns float32.

    Saturation (not NaN) on overflow is what KV-cache kernels do: they clamp to
    +-448 before the cast. So +-inf also becomes +-448; NaN stays NaN.
    """
    # float64 holds every float16/32 input exactly, so there is a single rounding step.
    x = _float_array(x).astype(np.float64)
    mag = np.abs(x)
    _, e = np.frexp(mag)                                   # mag = f * 2**e, f in [0.5, 1)
    exponent = np.maximum(e - 1, _FP8_MIN_NORMAL_EXP)      # binade of mag; subnormals share -6's
    spacing = np.ldexp(1.0, exponent - _FP8_MANTISSA_BITS)  # distance between neighbours there
    with np.errstate(invalid="ignore"):
        rounded = np.rint(mag / spacing) * spacing           # np.rint rounds half to even
    rounded = np.where(np.isinf(mag), FP8_E4M3_MAX, np.minimum(rounded, FP8_E4M3_MAX))
    return np.copysign(rounded, x).astype(np.float32)


def fp8_e4m3_decode(codes) -> np.ndarray:
    """uint8 bit patterns -> float32 values."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise ValueError(f"fp8 codes must be uint8, got {codes.dtype}")
    return _FP8_TABLE[codes]


def fp8_e4m3_encode(x) -> np.ndarray:
    """Values -> uint8 bit patterns, rounding with :func:`fp8_e4m3_round` first."""
    v = fp8_e4m3_round(x).astype(np.float64)
    nan = np.isnan(v)
    mag = np.where(nan, 0.0, np.abs(v))
    _, e = np.frexp(mag)
    normal = mag >= 2.0 ** _FP8_MIN_NORMAL_EXP
    # normal: mag = (1 + m/8) * 2**(E - 7) with E in 1..15;  subnormal: mag = m * 2**-9, E = 0
    exp_field = np.where(normal, e - 1 + 7, 0)
    mant = np.where(normal, np.ldexp(mag, 4 - e) - 8, np.ldexp(mag, 9))
    code = (np.signbit(v).astype(np.uint8) << 7) | (exp_field.astype(np.uint8) << 3) | mant.astype(np.uint8)
    return np.where(nan, np.uint8(0x7F), code).astype(np.uint8)


def _build_fp8_table() -> np.ndarray:
    bits = np.arange(256)
    sign = np.where(bits >> 7, -1.0, 1.0)
    exp, mant = (bits >> 3) & 0xF, bits & 0x7
    value = np.where(exp == 0, mant * 2.0 ** -9, (1 + mant / 8) * 2.0 ** (exp - 7.0))
    value = np.where((exp == 15) & (mant == 7), np.nan, sign * value)
    return value.astype(np.float32)


_FP8_TABLE = _build_fp8_table()


def quantize_fp8(x, scale=None, per_token: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """fp8 codes of x / scale; returns (uint8 codes, float32 scale).

    Without ``scale``, one is chosen so the largest magnitude lands on 448:
    per tensor (a 0-d scale), or with ``per_token=True`` one per (b, h, n) of a
    (B, H, N, D) tensor. A given ``scale`` must broadcast against x.
    """
    # BEGIN SOLUTION
    x = _float_array(x)
    if scale is None:
        if per_token:
            amax = np.abs(_cache_tensor(x)).max(axis=-1, keepdims=True)
        else:
            amax = np.abs(x).max() if x.size else np.zeros(())
        scale = _symmetric_scale(np.asarray(amax, np.float64), FP8_E4M3_MAX)
    scale = np.asarray(scale, np.float32)
    if np.any(~(scale > 0)) or not np.all(np.isfinite(scale)):
        raise ValueError("fp8 scale must be finite and > 0")
    return fp8_e4m3_encode(x.astype(np.float64) / scale), scale
    # END SOLUTION


def dequantize_fp8(codes, scale) -> np.ndarray:
    # BEGIN SOLUTION
    return fp8_e4m3_decode(codes) * np.asarray(scale, np.float32)
    # END SOLUTION


# --------------------------------------------------------------------------- int8, int4


def quantize_int8(x) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8, one scale per (b, h, n) = amax over D / 127. Returns (int8 (B,H,N,D), float32 (B,H,N,1))."""
    # BEGIN SOLUTION
    x = _cache_tensor(x).astype(np.float32)
    scale = _symmetric_scale(np.abs(x).max(axis=-1, keepdims=True), INT8_MAX)
    q = np.clip(np.rint(x / scale), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale
    # END SOLUTION


def dequantize_int8(q, scale) -> np.ndarray:
    # BEGIN SOLUTION
    q = np.asarray(q)
    if q.dtype != np.int8:
        raise ValueError(f"int8 values must have dtype int8, got {q.dtype}")
    return q.astype(np.float32) * np.asarray(scale, np.float32)
    # END SOLUTION


def _check_group(d: int, group: int) -> None:
    if group < 1 or d % group:
        raise ValueError(f"int4 group size {group} must be >= 1 and divide the head dim {d}")
    if d % 2:
        raise ValueError(f"int4 packs two values per byte, so the head dim must be even, got {d}")


def quantize_int4(x, group: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 in [-7, 7], one scale per group of ``group`` channels along D.

    Returns (packed uint8 (B,H,N,D/2), float32 scale (B,H,N,D/group)). Byte i holds
    channel 2i in its low nibble and 2i+1 in its high nibble, two's complement.
    """
    x = _cache_tensor(x).astype(np.float32)
    *lead, d = x.shape
    _check_group(d, group)
    xg = x.reshape(*lead, d // group, group)
    scale = _symmetric_scale(np.abs(xg).max(axis=-1), INT4_MAX)
    q = np.clip(np.rint(xg / scale[..., None]), -INT4_MAX, INT4_MAX).astype(np.int8).reshape(*lead, d)
    nibbles = (q & 0xF).astype(np.uint8)          # two's complement low 4 bits
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), scale


def dequantize_int4(packed, scale, group: int, d: int) -> np.ndarray:
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"packed int4 must be uint8, got {packed.dtype}")
    _check_group(d, group)
    scale = np.asarray(scale, np.float32)
    if packed.shape[-1] != d // 2 or scale.shape != packed.shape[:-1] + (d // group,):
        raise ValueError(f"for d={d}, group={group} expected packed (..., {d // 2}) and scale (..., {d // group}), "
                         f"got {packed.shape} and {scale.shape}")
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], d).astype(np.int8)
    q = np.where(nibbles >= 8, nibbles - 16, nibbles)   # sign-extend 4 -> 8 bits
    lead = packed.shape[:-1]
    return (q.reshape(*lead, d // group, group) * scale[..., None]).reshape(*lead, d)


# --------------------------------------------------------------------------- formats and report


@dataclass(frozen=True)
class QuantFormat:
    """A cache format: ``encode`` gives the arrays stored, ``decode`` turns them back into float32."""

    name: str
    encode: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    decode: Callable[..., np.ndarray]

    def round_trip(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """(dequantized float32 x, bytes stored for it)."""
        stored = self.encode(x)
        return self.decode(*stored).astype(np.float32), int(sum(a.nbytes for a in stored))


FORMATS: dict[str, QuantFormat] = {
    "fp16": QuantFormat("fp16", lambda x: (np.asarray(x, np.float16),), lambda a: a.astype(np.float32)),
    # One scale per tensor, the tensor's own amax / 448. vLLM's fp8 cache also keeps one scale per tensor,
    # but by default sets it to 1.0; amax-derived scales come from a calibrated checkpoint or from its
    # calculate_kv_scales option (docs.vllm.ai, features/quantization/quantized_kvcache).
    "fp8_e4m3": QuantFormat("fp8_e4m3", quantize_fp8, dequantize_fp8),
    # One scale per (batch, head, token), like int8 below: separates the effect of the scale from
    # that of e4m3's 3-bit mantissa.
    "fp8_e4m3_tok": QuantFormat("fp8_e4m3_tok", lambda x: quantize_fp8(_cache_tensor(x), per_token=True),
                                dequantize_fp8),
    "int8": QuantFormat("int8", quantize_int8, dequantize_int8),
    "int4": QuantFormat("int4", quantize_int4, lambda packed, scale: dequantize_int4(
        packed, scale, group=2 * packed.shape[-1] // scale.shape[-1], d=2 * packed.shape[-1])),
}


@dataclass(frozen=True)
class KVQuantResult:
    format: str
    bytes_stored: int          # K and V together, codes plus scales
    bytes_per_element: float   # bytes_stored / (k.size + v.size)
    bytes_saved: int           # vs the fp16 cache (negative: larger than fp16)
    max_abs_err: float         # attention output vs the fp16-cache output
    rel_rms_err: float         # rms(out - ref) / rms(ref)


def kv_quant_report(q, k, v, formats=("fp16", "fp8_e4m3", "int8", "int4"), causal: bool = False,
                    scale: float | None = None) -> list[KVQuantResult]:
    """Quantize K and V in each format, attend (fp32 compute) and compare with an fp16 cache."""
    check_attention_inputs(q, k, v)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; known: {sorted(FORMATS)}")
    q32 = _float_array(q, "q").astype(np.float32)
    k, v = _cache_tensor(k, "k"), _cache_tensor(v, "v")
    n_elements = k.size + v.size

    def attend(kk, vv):
        return standard_attention(q32, kk.astype(np.float32), vv.astype(np.float32), causal=causal, scale=scale)

    ref = attend(k.astype(np.float16), v.astype(np.float16))
    fp16_bytes = 2 * n_elements
    rms_ref = float(np.sqrt(np.mean(ref.astype(np.float64) ** 2)))
    rows = []
    for name in formats:
        (k_hat, k_bytes), (v_hat, v_bytes) = FORMATS[name].round_trip(k), FORMATS[name].round_trip(v)
        diff = attend(k_hat, v_hat).astype(np.float64) - ref
        stored = k_bytes + v_bytes
        rows.append(KVQuantResult(
            format=name, bytes_stored=stored, bytes_per_element=stored / n_elements,
            bytes_saved=fp16_bytes - stored, max_abs_err=float(np.abs(diff).max()),
            rel_rms_err=float(np.sqrt(np.mean(diff ** 2))) / rms_ref if rms_ref > 0 else 0.0))
    return rows


def format_kv_quant_report(rows: list[KVQuantResult]) -> str:
    """A plain-text table of :func:`kv_quant_report` rows."""
    lines = [f"{'format':<12} {'bytes/elem':>10} {'saved vs fp16':>14} {'max abs err':>12} {'rel rms err':>12}"]
    for r in rows:
        lines.append(f"{r.format:<12} {r.bytes_per_element:>10.4f} {r.bytes_saved:>14,d} "
                     f"{r.max_abs_err:>12.3e} {r.rel_rms_err:>12.3e}")
    return "\n".join(lines)
