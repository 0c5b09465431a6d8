"""Assignment 10, grader-only tests: RMSNorm's bits are those of its stated order (a float32 accumulator, one
block at a time, planted so that float64 gives other bits) and the same for a row alone and in batches of many
sizes and positions, float16 too; attention rows bit-identical as a decode alone, in batches, as verify rows and
inside a prefill chunk (split points that follow a split COUNT move with the context and change them), close to
float64; the pieces merged in their stated order, bit for bit (planted so that one softmax over all the keys
gives other bits), with empty pieces and huge logit gaps; bad input. Core: the stated orders, RMSNorm's
invariance, attention's invariance."""
import math

import numpy as np
import pytest

from minillm.batch_invariant import attend_pieces, attention_reference, rmsnorm_reference, split_bounds_by_size


def _fixed_order_rmsnorm(x, w, eps, block):
    """The order the assignment states, written out (the grader's own copy)."""
    acc_t = np.result_type(np.float32, x.dtype)
    xf = x.astype(acc_t)
    ss = np.zeros(x.shape[:-1], acc_t)
    for d0 in range(0, x.shape[-1], block):
        part = (xf[..., d0:d0 + block].astype(np.float64) ** 2).sum(-1).astype(acc_t)
        ss = (ss + part).astype(acc_t)
    r = (1.0 / np.sqrt(ss.astype(np.float64) / x.shape[-1] + eps)).astype(acc_t)
    return ((xf * r[..., None]).astype(x.dtype).astype(acc_t) * w.astype(acc_t)).astype(x.dtype)


def _rms64(x, w, eps=1e-5):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w.astype(np.float64)


@pytest.mark.core
@pytest.mark.points(3)
def test_rmsnorm_accumulates_in_float32_one_block_at_a_time():
    """A planted row: 2^12 then 1000 blocks whose squares sum to 1 each. A float32 accumulator that adds one
    block at a time stays at 2^24 (2^24 + 1 rounds to even), a float64 sum does not: the row's bits tell the
    two orders apart."""
    block = 4
    x = np.concatenate([[2.0 ** 12, 0, 0, 0], np.full(4000, 0.5)]).astype(np.float32)[None]
    w = np.ones(x.shape[1], np.float32)
    got = rmsnorm_reference(x, w, block=block)
    want = _fixed_order_rmsnorm(x, w, 1e-5, block)
    assert got.dtype == np.float32
    assert got.tobytes() == want.tobytes(), "the sum of squares is not a float32 accumulator, one block at a time"
    assert _rms64(x, w).astype(np.float32).tobytes() != want.tobytes()   # the plant separates the two orders


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("dtype,d,block", [(np.float32, 1000, 256), (np.float16, 520, 128), (np.float32, 64, 7)])
def test_rmsnorm_bits_follow_the_stated_order(rng, dtype, d, block):
    x = (rng.normal(size=(9, d)) * 3).astype(dtype)
    w = rng.normal(size=d).astype(dtype)
    got = rmsnorm_reference(x, w, eps=1e-6, block=block)
    assert got.dtype == dtype and got.shape == x.shape
    assert got.tobytes() == _fixed_order_rmsnorm(x, w, 1e-6, block).tobytes()
    np.testing.assert_allclose(got.astype(np.float64), _rms64(x, w, 1e-6), rtol=2e-3 if dtype == np.float16 else 2e-6,
                               atol=2e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rmsnorm_row_is_the_same_in_batches_of_every_size_and_place(rng, dtype):
    rows = (rng.normal(size=(17, 300)) * 2).astype(dtype)
    w = rng.normal(size=300).astype(dtype)
    target = rows[5]
    alone = rmsnorm_reference(target[None], w, block=64)[0]
    for size in (2, 3, 8, 17):
        for place in (0, size // 2, size - 1):
            batch = np.delete(rows, 5, axis=0)[:size - 1]
            batch = np.insert(batch, place, target, axis=0)
            got = rmsnorm_reference(batch, w, block=64)[place]
            assert got.tobytes() == alone.tobytes(), f"batch of {size}, row at {place}"
    np.testing.assert_allclose(alone.astype(np.float64), _rms64(target[None], w)[0],
                               rtol=2e-3 if dtype == np.float16 else 2e-6, atol=2e-3 if dtype == np.float16 else 1e-6)


def test_rmsnorm_zero_row_and_3d_input(rng):
    x = np.zeros((2, 3, 40), np.float32)
    x[1, 2] = rng.normal(size=40)
    w = np.ones(40, np.float32)
    got = rmsnorm_reference(x, w, block=16)
    assert got.shape == x.shape and np.all(got[0] == 0) and np.all(np.isfinite(got))
    assert got[1, 2].tobytes() == rmsnorm_reference(x[1, 2][None], w, block=16)[0].tobytes()


def test_split_bounds_by_size_edges():
    assert split_bounds_by_size(0, 8) == [0, 0]
    assert split_bounds_by_size(1, 1) == [0, 1]
    assert split_bounds_by_size(64, 64) == [0, 64]
    assert split_bounds_by_size(65, 64) == [0, 64, 65]
    assert split_bounds_by_size(7, 2) == [0, 2, 4, 6, 7]


@pytest.mark.parametrize("size", [0, -4])
def test_split_bounds_by_size_bad_size_raises(size):
    with pytest.raises(ValueError):
        split_bounds_by_size(10, size)


def _paged(rng, lens, block_size=4, hkv=2, d=8, dtype=np.float32):
    blocks = [max(1, math.ceil(n / block_size)) for n in lens]
    perm = rng.permutation(sum(blocks))
    kc = rng.normal(size=(sum(blocks), block_size, hkv, d)).astype(dtype)
    vc = rng.normal(size=(sum(blocks), block_size, hkv, d)).astype(dtype)
    table = np.zeros((len(lens), max(blocks)), np.int32)
    start = 0
    for s, b in enumerate(blocks):
        table[s, :b] = perm[start:start + b]
        start += b
    return kc, vc, table


def _dense64(q, kc, vc, table, n, pos):
    """float64 causal attention of one query row (Hq, D) at position ``pos`` of a sequence (GQA)."""
    hkv, d = kc.shape[2], kc.shape[3]
    k = kc[table[:math.ceil(n / kc.shape[1])]].reshape(-1, hkv, d)[:pos + 1].astype(np.float64)
    v = vc[table[:math.ceil(n / vc.shape[1])]].reshape(-1, hkv, d)[:pos + 1].astype(np.float64)
    g = q.shape[0] // hkv
    out = np.empty(q.shape)
    for h in range(q.shape[0]):
        s = k[:, h // g] @ q[h].astype(np.float64) / math.sqrt(d)
        p = np.exp(s - s.max())
        out[h] = p @ v[:, h // g] / p.sum()
    return out


@pytest.mark.core
@pytest.mark.points(3)
def test_attention_row_is_the_same_as_decode_verify_prefill_and_in_any_batch(rng):
    """Row t of a 45-token sequence: as a decode (context t + 1, alone), as the last of 4 verify rows, inside the
    whole prefill chunk, and next to other sequences in batches of 2-4 -- the same bits, close to float64. Cuts
    at a fixed SIZE stay where they are when the context grows; cuts that follow a COUNT move."""
    lens = [45, 13, 30, 8]
    kc, vc, table = _paged(rng, lens)
    q_all = rng.normal(size=(45, 4, 8)).astype(np.float32)
    others = [rng.normal(size=(n, 4, 8)).astype(np.float32) for n in lens[1:]]
    split = 8
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    prefill = attention_reference(q_all, kc, vc, table[:1], i32(45), i32(0, 45), split_size=split)
    for t in (9, 20, 31, 44):
        decode = attention_reference(q_all[t:t + 1], kc, vc, table[:1], i32(t + 1), i32(0, 1), split_size=split)
        verify = attention_reference(q_all[t - 3:t + 1], kc, vc, table[:1], i32(t + 1), i32(0, 4), split_size=split)
        assert decode[0].tobytes() == prefill[t].tobytes(), f"row {t}: decode vs prefill chunk"
        assert verify[3].tobytes() == prefill[t].tobytes(), f"row {t}: verify rows vs prefill chunk"
        for size in (2, 3, 4):
            qs = [q_all[t:t + 1]] + [o[-1:] for o in others[:size - 1]]
            ctx = [t + 1] + lens[1:size]
            batch = attention_reference(np.concatenate(qs), kc, vc, table[:size], np.array(ctx, np.int32),
                                        np.arange(size + 1, dtype=np.int32), split_size=split)
            assert batch[0].tobytes() == decode[0].tobytes(), f"row {t} in a batch of {size}"
        np.testing.assert_allclose(decode[0], _dense64(q_all[t], kc, vc, table[0], 45, t), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split", [1, 5, 64])
def test_attention_close_to_float64_for_any_split_size(rng, split):
    lens = [19, 7]
    kc, vc, table = _paged(rng, lens, hkv=1, d=4)
    q = rng.normal(size=(26, 2, 4)).astype(np.float32)
    out = attention_reference(q, kc, vc, table, np.array(lens, np.int32),
                              np.array([0, 19, 26], np.int32), split_size=split)
    for t in range(19):
        np.testing.assert_allclose(out[t], _dense64(q[t], kc, vc, table[0], 19, t), rtol=1e-5, atol=1e-6)
    for t in range(7):
        np.testing.assert_allclose(out[19 + t], _dense64(q[19 + t], kc, vc, table[1], 7, t), rtol=1e-5, atol=1e-6)


def _merge_in_order(q, k, v, bounds, scale, acc_t):
    """The docstring's order written out again: each piece's (m, l, o) from float64, rounded once to ``acc_t``,
    merged left to right in ``acc_t`` through the running maximum; then o / l."""
    m = np.full(q.shape[0], -np.inf, acc_t)
    l, o = np.zeros(q.shape[0], acc_t), np.zeros((q.shape[0], v.shape[1]), acc_t)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if hi <= lo:
            continue
        s = (q.astype(np.float64) @ k[lo:hi].astype(np.float64).T) * scale
        mp = s.max(-1)
        e = np.exp(s - mp[:, None])
        lp, op, mp = e.sum(-1).astype(acc_t), (e @ v[lo:hi].astype(np.float64)).astype(acc_t), mp.astype(acc_t)
        mn = np.maximum(m, mp)
        a, b = (np.exp(x.astype(np.float64) - mn).astype(acc_t) for x in (m, mp))
        o, l, m = (o * a[:, None] + op * b[:, None]).astype(acc_t), (l * a + lp * b).astype(acc_t), mn
    return o / l[:, None]


@pytest.mark.core
@pytest.mark.points(2)
def test_attend_pieces_bits_follow_the_stated_merge(rng):
    """The pieces' merge in its stated order, bit for bit, planted so that one softmax over all the keys
    (float64, rounded once) gives other bits: the cut points must change the result, or nothing is invariant to
    prove."""
    q, k, v = (rng.normal(size=shape).astype(np.float32) for shape in ((4, 8), (40, 8), (40, 8)))
    bounds = [0, 7, 19, 19, 33, 40]
    want = _merge_in_order(q, k, v, bounds, 0.35, np.float32)
    s = (q.astype(np.float64) @ k.astype(np.float64).T) * 0.35
    e = np.exp(s - s.max(-1, keepdims=True))
    assert ((e @ v.astype(np.float64)) / e.sum(-1, keepdims=True)).astype(np.float32).tobytes() != want.tobytes()
    got = attend_pieces(q, k, v, bounds, 0.35, np.float32)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), "not the pieces merged in order"


def test_merge_of_pieces_skips_empty_pieces_and_survives_huge_gaps(rng):
    q = rng.normal(size=(2, 4))
    k = rng.normal(size=(9, 4))
    k[4] = q[0] * 400.0                      # one huge score: the other pieces weigh ~0 for row 0
    v = rng.normal(size=(9, 3))
    for bounds in ([0, 3, 3, 9], [0, 9], [0, 1, 2, 5, 9, 9], [0, 4, 5, 9]):
        got = attend_pieces(q, k, v, bounds, 0.5, np.float32)
        s = (q @ k.T) * 0.5
        p = np.exp(s - s.max(-1, keepdims=True))
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        np.testing.assert_allclose(got, p @ v / p.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
