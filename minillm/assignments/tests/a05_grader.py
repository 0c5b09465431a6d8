"""Assignment 5, grader-only tests: -inf entries, empty rows, huge logits, tile edge cases, the merge's algebra,
and the kernel on wide, masked and low-precision rows. Core: one pass in a fraction of the row's memory, any tile,
the merge's algebra, a kernel row wider than its block (the rescale), read twice and no more (the online
statistics in one pass)."""
import numpy as np
import pytest

from minillm.softmax import Partial, merge, online_max_and_normalizer
from oracles import partial_attention, safe_softmax


@pytest.mark.core
@pytest.mark.points(3)
def test_online_statistics_stream_in_a_fraction_of_the_rows_memory(rng):
    """One pass over tiles: the statistics of two 4 MB rows, tile 2048, in under 1 MB of temporaries. A version
    that exponentiates the whole row (two passes over it) needs the row's size again."""
    import tracemalloc

    x = rng.normal(size=(2, 2**18)) * 5
    tracemalloc.start()
    try:
        m, l = online_max_and_normalizer(x, 2048)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(m, x.max(-1))
    np.testing.assert_allclose(l, np.exp(x - x.max(-1, keepdims=True)).sum(-1), rtol=1e-9)
    assert peak < 1_000_000, f"{peak / 1e6:.1f} MB of temporaries"


@pytest.mark.core
@pytest.mark.parametrize("tile", [1, 3, 10, 64])
def test_online_statistics_any_tile(rng, tile):
    x = rng.normal(size=(2, 3, 10)) * 5
    m, l = online_max_and_normalizer(x, tile)
    np.testing.assert_allclose(m, x.max(-1))
    np.testing.assert_allclose(l, np.exp(x - x.max(-1, keepdims=True)).sum(-1), rtol=1e-12)


def test_online_statistics_huge_logits_and_minus_inf():
    x = np.array([[1e4, 1e4 - 1, -np.inf, 1e4 + 2, -np.inf], [-np.inf] * 5])
    m, l = online_max_and_normalizer(x, tile=2)
    assert m[0] == 1e4 + 2 and np.isclose(l[0], np.exp(-2) + np.exp(-3) + 1)
    assert m[1] == -np.inf and l[1] == 0.0  # an all -inf row: no NaN


def test_online_statistics_accumulate_in_fp32_for_fp16(rng):
    x = (rng.normal(size=(4, 300)) * 3).astype(np.float16)
    _, l = online_max_and_normalizer(x, tile=7)
    assert l.dtype == np.float32
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(l, np.exp(x32 - x32.max(-1, keepdims=True)).sum(-1), rtol=1e-5)


@pytest.mark.parametrize("tile", [0, -3])
def test_online_bad_tile_raises(tile):
    with pytest.raises(ValueError):
        online_max_and_normalizer(np.zeros((2, 4)), tile)


@pytest.mark.core
def test_merge_is_associative_and_commutative(rng):
    s, v = rng.normal(size=(3, 15)) * 10, rng.normal(size=(15, 4))
    a, b, c = (partial_attention(s[:, i:j], v[i:j]) for i, j in ((0, 4), (4, 11), (11, 15)))
    want = safe_softmax(s) @ v
    for out in (merge(merge(a, b), c), merge(a, merge(b, c)), merge(c, merge(b, a))):
        np.testing.assert_allclose(out.finalize(), want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(out.lse(), np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1))


def test_merge_with_an_empty_partial_is_identity(rng):
    s, v = rng.normal(size=(2, 6)), rng.normal(size=(6, 3))
    a = partial_attention(s, v)
    empty = Partial(np.full(2, -np.inf), np.zeros(2), np.zeros((2, 3)))
    for out in (merge(a, empty), merge(empty, a)):
        np.testing.assert_allclose(out.finalize(), a.finalize(), rtol=1e-12)
    both = merge(empty, empty)
    assert np.all(both.l == 0) and np.all(np.isfinite(both.finalize()))


def test_merge_huge_logit_gap(rng):
    v = rng.normal(size=(4, 2))
    a = partial_attention(np.array([[1e4, 1e4 - 1]]), v[:2])
    b = partial_attention(np.array([[-1e4, 0.0]]), v[2:])
    out = merge(a, b).finalize()
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, safe_softmax(np.array([[1e4, 1e4 - 1, -1e4, 0.0]])) @ v, rtol=1e-10)


def _triton_softmax(x, **kw):
    import torch

    from minillm.kernels.softmax import softmax

    return softmax(torch.from_numpy(x), **kw).float().numpy()


@pytest.mark.core
@pytest.mark.points(2)
def test_triton_softmax_rows_wider_than_a_block(rng):
    x = rng.normal(size=(3, 100)).astype(np.float32) * 10
    np.testing.assert_allclose(_triton_softmax(x, block=16), safe_softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.core
@pytest.mark.points(2)
def test_triton_softmax_reads_each_element_twice(rng):
    """The online kernel reads a row twice (the statistics, then the write) whatever its width; a kernel that
    finds the max in one pass and the sum in another reads it three times. Counted in Triton's interpreter: the
    lanes of every load that its mask lets through, against 2 x the elements (a row wider than its block)."""
    import probes

    x = rng.normal(size=(3, 100)).astype(np.float32) * 10
    with probes.count_loads():
        y = _triton_softmax(x, block=16)
        loaded = probes.loaded_elements()
    np.testing.assert_allclose(y, safe_softmax(x), rtol=1e-5, atol=1e-7)
    assert 0 < loaded <= 2 * x.size, f"{loaded} elements loaded for {x.size}: more than two reads a row"


def test_triton_softmax_minus_inf_and_empty_rows():
    x = np.array([[0.0, -np.inf, 1.0, -np.inf, 50.0], [-np.inf] * 5, [1e4, -1e4, 0.0, 1e4, 3.0]], np.float32)
    y = _triton_softmax(x, block=16)
    np.testing.assert_allclose(y, safe_softmax(x), rtol=1e-5, atol=1e-7)
    assert np.all(y[1] == 0.0)


def test_triton_softmax_fp16_and_3d(rng):
    import torch

    from minillm.kernels.softmax import softmax

    x = (rng.normal(size=(2, 3, 20)) * 3).astype(np.float16)
    y = softmax(torch.from_numpy(x), block=16)
    assert y.dtype == torch.float16 and tuple(y.shape) == (2, 3, 20)
    np.testing.assert_allclose(y.float().numpy(), safe_softmax(x.astype(np.float32)), atol=2e-3)
