"""minillm.numerics and the chapter-5 references: the same bits whatever SIMD path NumPy picks."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from minillm import numerics

# NumPy's runtime dispatch switched off down to SSE4.2 (x86-64) or plain NEON (arm64); unknown names are ignored.
OLD_CPU = ("AVX512_SPR AVX512_ICL AVX512_CNL AVX512_CLX AVX512_SKX AVX512CD AVX512F AVX2 FMA3 F16C "
           "ASIMDHP ASIMDDP ASIMDFHM")

_PROBE = """
import hashlib, numpy as np
from minillm.softmax import safe_softmax, online_softmax
from minillm import numerics
x = (np.random.default_rng(0).normal(size=(64, 512)) * 8).astype(np.float32)
h = hashlib.sha256()
for dt in (np.float16, np.float32):
    y = x.astype(dt)
    for a in (numerics.exp(y), safe_softmax(y), online_softmax(y, tile=16)):
        h.update(np.ascontiguousarray(a).tobytes())
print(h.hexdigest())
"""


def _probe(disabled: str) -> str:
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=disabled)
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_exp_is_correctly_rounded_float16_and_float32():
    x = np.linspace(-12, 10, 20001)
    for dt in (np.float16, np.float32):
        y = x.astype(dt)
        want = np.exp(y.astype(np.float64)).astype(dt)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(numerics.exp(y), want)
        assert numerics.exp(y).dtype == dt


def test_log_keeps_float64_as_is():
    x = np.array([0.5, 1.0, 3.0])
    np.testing.assert_array_equal(numerics.log(x), np.log(x))


def test_safe_softmax_same_bits_with_simd_paths_switched_off():
    """The references must not depend on the CPU: with AVX-512/AVX2/F16C (or NEON's fp16) dispatch off, the
    same bits. Fails on the old code on a CPU with AVX512-FP16 or AVX-512 (NumPy's float16/32 exp differ)."""
    native, old = _probe(""), _probe(OLD_CPU)
    if not native:
        pytest.fail("probe printed nothing")
    assert native == old, "float16/float32 softmax results depend on NumPy's SIMD path"
    assert len(hashlib.sha256().hexdigest()) == len(native)
