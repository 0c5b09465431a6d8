"""Elementwise functions that give the same bits on every CPU.

NumPy picks its float16 and float32 ``exp`` and ``log`` at run time by CPU feature: a scalar libm
loop, AVX2, AVX-512, AVX512-FP16 (Sapphire Rapids computes float16 natively) or NEON on arm64. The
implementations agree to an ulp or two, not to the bit, so a printed rounding error ("0.59 x eps")
computed on one CPU can read 0.60 on another.

These helpers compute in float64 and round once to the input's precision. That is the correctly
rounded result (up to float64's own last bit, which survives rounding to float32 or float16 only in
vanishingly rare ties), so it is the same on every CPU, and it is also the most accurate float16 or
float32 exp there is: the model a GPU's rounding is measured against. float64 inputs are computed as
they are.
"""
from __future__ import annotations

import numpy as np


def _rounded(fn, x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        return fn(x.astype(np.float64)).astype(x.dtype)
    return fn(x)


def exp(x) -> np.ndarray:
    """``np.exp`` rounded once to ``x``'s precision: the same bits on every CPU."""
    return _rounded(np.exp, x)


def log(x) -> np.ndarray:
    """``np.log`` rounded once to ``x``'s precision: the same bits on every CPU."""
    return _rounded(np.log, x)
