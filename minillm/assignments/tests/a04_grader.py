"""Assignment 4, grader-only tests: the tiles go through the counter in FlashAttention-2's order (a recording
counter, Nq != Nk), the output computed from the tiles the counter hands over, ragged tiles, tiny and huge blocks,
huge logits, dtypes, bad input. Core: the loop order, the output from the loaded tiles, and the formula on ragged
tiles."""
import math

import numpy as np
import pytest

from minillm.hardware import TrafficCounter, flash_attention_traffic, simulate_tiled_attention
from oracles import standard_attention


def _ref(q, k, v):
    return standard_attention(q[None, None], k[None, None], v[None, None])[0, 0]


def _span(n, rows):
    r = range(n)[rows]
    return (r.start, r.stop)


class RecordingCounter(TrafficCounter):
    """A TrafficCounter that also lists every tile it moves, in order (the loop order test puts it in place of
    the module's TrafficCounter)."""

    def __init__(self):
        super().__init__()
        self.events = []

    def load(self, name, hbm, rows=slice(None)):
        self.events.append(("load", name, _span(len(hbm), rows)))
        return super().load(name, hbm, rows)

    def store(self, name, hbm, rows, tile):
        self.events.append(("store", name, _span(len(hbm), rows)))
        return super().store(name, hbm, rows, tile)


@pytest.mark.core
@pytest.mark.points(3)
@pytest.mark.parametrize("nq, nk, bm, bn", [(11, 7, 4, 3), (5, 13, 2, 6)])
def test_tiles_move_through_the_counter_in_flash_order(rng, monkeypatch, nq, nk, bm, bn):
    """The counter's bytes come from tiles actually loaded, in FlashAttention-2's loop order (query tile outer,
    key tiles inner, each output tile stored once), also for Nq != Nk, which the formula does not cover."""
    import minillm.hardware as hw

    monkeypatch.setattr(hw, "TrafficCounter", RecordingCounter)
    d = 4
    q, k, v = rng.normal(size=(nq, d)), rng.normal(size=(nk, d)), rng.normal(size=(nk, d))
    o, counter = simulate_tiled_attention(q, k, v, bm, bn)
    np.testing.assert_allclose(o, _ref(q, k, v), rtol=1e-9, atol=1e-12)
    assert isinstance(counter, RecordingCounter), "the counter must be a TrafficCounter made in the function"
    events = counter.events
    want = []
    for i in range(0, nq, bm):
        rows = (i, min(i + bm, nq))
        want.append(("load", "q", rows))
        for j in range(0, nk, bn):
            cols = (j, min(j + bn, nk))
            want.append({("load", "k", cols), ("load", "v", cols)})
        want.append(("store", "o", rows))
    got, pos = [], 0
    for w in want:   # K and V of one tile may come in either order
        if isinstance(w, set):
            got.append(set(events[pos:pos + 2]))
            pos += 2
        else:
            got.append(events[pos] if pos < len(events) else None)
            pos += 1
    assert got == want and pos == len(events)
    assert counter.components == {"read_q": nq * d * 8, "read_k": len(range(0, nq, bm)) * nk * d * 8,
                                  "read_v": len(range(0, nq, bm)) * nk * d * 8, "write_o": nq * d * 8}


class SubstitutingCounter(TrafficCounter):
    """A TrafficCounter whose tiles hold other numbers than the arrays it is handed: ``load`` counts the bytes of
    ``hbm[rows]`` as usual but returns the rows of a substitute array (``SUBSTITUTES``: id of the array -> its
    substitute). On-chip work sees only what crossed the counter, so the output must be attention of the
    substitutes; one computed from the arrays directly, beside tile loads it throws away, is not."""
    SUBSTITUTES: dict = {}

    def load(self, name, hbm, rows=slice(None)):
        tile = super().load(name, hbm, rows)
        sub = self.SUBSTITUTES.get(id(hbm))
        return tile if sub is None else np.array(sub[rows])


@pytest.mark.core
@pytest.mark.points(2)
def test_output_is_computed_from_the_tiles_the_counter_hands_over(rng, monkeypatch):
    """The counter hands over tiles of other arrays (q, k and v each with a secret change) than the ones passed
    in: the output must be attention of what it handed over (an on-chip computation of the tiles), and the bytes
    are still counted at the arrays' dtype."""
    import minillm.hardware as hw

    nq, nk, d = 9, 11, 4
    q, k, v = rng.normal(size=(nq, d)), rng.normal(size=(nk, d)), rng.normal(size=(nk, d))
    q2, k2, v2 = q[::-1].copy(), rng.normal(size=(nk, d)), v * 2.0 - 1.0
    monkeypatch.setattr(SubstitutingCounter, "SUBSTITUTES", {id(q): q2, id(k): k2, id(v): v2})
    monkeypatch.setattr(hw, "TrafficCounter", SubstitutingCounter)
    o, counter = simulate_tiled_attention(q, k, v, 4, 3)
    assert isinstance(counter, SubstitutingCounter), "the counter must be a TrafficCounter made in the function"
    assert not np.allclose(_ref(q, k, v), _ref(q2, k2, v2))
    np.testing.assert_allclose(o, _ref(q2, k2, v2), rtol=1e-9, atol=1e-12,
                               err_msg="the output must come from the tiles loaded through the counter")
    tiles = math.ceil(nq / 4)
    assert counter.components == {"read_q": nq * d * 8, "read_k": tiles * nk * d * 8,
                                  "read_v": tiles * nk * d * 8, "write_o": nq * d * 8}


@pytest.mark.core
@pytest.mark.points(2)
@pytest.mark.parametrize("n, d, bm, bn", [(37, 8, 5, 3), (13, 4, 1, 1), (9, 6, 64, 64), (16, 16, 16, 5)])
def test_ragged_and_extreme_tiles_match_formula_and_reference(rng, n, d, bm, bn):
    q, k, v = (rng.normal(size=(n, d)) for _ in range(3))
    o, counter = simulate_tiled_attention(q, k, v, bm, bn)
    np.testing.assert_allclose(o, _ref(q, k, v), rtol=1e-9, atol=1e-12)
    model = flash_attention_traffic(n, d, bm, bn, dtype_bytes=8)
    assert model["q_tiles"] == math.ceil(n / bm)
    assert counter.components == model["components"] and counter.total == model["total"]


def test_more_keys_than_queries(rng):
    nq, nk, d, bm = 7, 13, 4, 3
    q, k, v = rng.normal(size=(nq, d)), rng.normal(size=(nk, d)), rng.normal(size=(nk, d))
    o, counter = simulate_tiled_attention(q, k, v, bm, 4)
    np.testing.assert_allclose(o, _ref(q, k, v), rtol=1e-9, atol=1e-12)
    tiles = math.ceil(nq / bm)
    assert counter.components == {"read_q": nq * d * 8, "read_k": tiles * nk * d * 8,
                                  "read_v": tiles * nk * d * 8, "write_o": nq * d * 8}


def test_huge_logits_stay_finite(rng):
    q, k, v = (rng.normal(size=(12, 4)) for _ in range(3))
    q *= 1e3
    o, _ = simulate_tiled_attention(q, k, v, 4, 4)
    assert np.all(np.isfinite(o))
    np.testing.assert_allclose(o, _ref(q, k, v), rtol=1e-8, atol=1e-10)


def test_fp16_counts_two_bytes_per_element(rng):
    q, k, v = (rng.normal(size=(10, 8)).astype(np.float16) for _ in range(3))
    o, counter = simulate_tiled_attention(q, k, v, 4, 4)
    assert o.dtype == np.float16
    assert counter.components == flash_attention_traffic(10, 8, 4, 4, dtype_bytes=2)["components"]
    np.testing.assert_allclose(o.astype(np.float32), _ref(*(x.astype(np.float64) for x in (q, k, v))), atol=2e-3)


def test_block_n_does_not_change_the_traffic():
    totals = {flash_attention_traffic(300, 64, 64, bn)["total"] for bn in (1, 7, 64, 512)}
    assert len(totals) == 1
    assert flash_attention_traffic(300, 64, 64, 64, dtype_bytes="fp32")["components"]["read_q"] == 300 * 64 * 4


@pytest.mark.parametrize("args", [(0, 64, 64, 64), (128, 64, 0, 64), (128, 64, 64, -1), (128, 1.5, 64, 64)])
def test_traffic_bad_sizes_raise(args):
    with pytest.raises(ValueError):
        flash_attention_traffic(*args)


@pytest.mark.parametrize("case", ["block0", "q1d", "dmismatch", "empty"])
def test_simulate_bad_input_raises(rng, case):
    q, k, v = (rng.normal(size=(6, 4)) for _ in range(3))
    bm = 2
    if case == "block0":
        bm = 0
    elif case == "q1d":
        q = q[0]
    elif case == "dmismatch":
        k = rng.normal(size=(6, 5))
    else:
        q = q[:0]
    with pytest.raises(ValueError):
        simulate_tiled_attention(q, k, v, bm, 2)
