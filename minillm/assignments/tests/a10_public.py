"""Assignment 10, public tests: a fixed split size, and a row's RMSNorm and attention the same alone and in a
batch (bit for bit), close to float64."""
import math

import numpy as np

from minillm.batch_invariant import attention_reference, rmsnorm_reference, split_bounds_by_size


def test_split_bounds_by_size_cuts_every_size_keys():
    assert split_bounds_by_size(10, 4) == [0, 4, 8, 10]
    assert split_bounds_by_size(8, 4) == [0, 4, 8]
    assert split_bounds_by_size(3, 64) == [0, 3]


def test_rmsnorm_row_alone_equals_the_row_in_a_batch(rng):
    x = rng.normal(size=(6, 600)).astype(np.float32)
    w = rng.normal(size=600).astype(np.float32)
    batched = rmsnorm_reference(x, w, block=128)
    for r in range(6):
        alone = rmsnorm_reference(x[r:r + 1], w, block=128)[0]
        assert alone.tobytes() == batched[r].tobytes(), f"row {r} changed bits inside the batch"
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(batched, want, rtol=1e-5, atol=1e-6)


def _paged(rng, lens, block_size=4, hkv=1, d=8):
    blocks = [math.ceil(n / block_size) for n in lens]
    total = sum(blocks)
    kc = rng.normal(size=(total, block_size, hkv, d)).astype(np.float32)
    vc = rng.normal(size=(total, block_size, hkv, d)).astype(np.float32)
    table = np.zeros((len(lens), max(blocks)), np.int32)
    start = 0
    for s, b in enumerate(blocks):
        table[s, :b] = np.arange(start, start + b)
        start += b
    return kc, vc, table


def test_a_decode_row_is_the_same_alone_and_next_to_another_sequence(rng):
    kc, vc, table = _paged(rng, [37, 21])
    q = rng.normal(size=(2, 2, 8)).astype(np.float32)
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    alone = attention_reference(q[:1], kc, vc, table[:1], i32(37), i32(0, 1), split_size=8)
    both = attention_reference(q, kc, vc, table, i32(37, 21), i32(0, 1, 2), split_size=8)
    assert alone[0].tobytes() == both[0].tobytes()
    k = kc[table[0, :10]].reshape(-1, 1, 8)[:37, 0].astype(np.float64)
    v = vc[table[0, :10]].reshape(-1, 1, 8)[:37, 0].astype(np.float64)
    s = q[0].astype(np.float64) @ k.T / math.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(alone[0], (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)
