"""minillm/batch_invariant.py: addition order, split plans and the NumPy references (NumPy only)."""
import numpy as np
import pytest

from minillm import batch_invariant as bi
from minillm.paged.attention import paged_varlen_attention

from .test_paged_attention import _ragged_case


def test_addition_order_examples_round_as_stated():
    ex = {e["dtype"]: e for e in bi.addition_order_examples()}
    assert ex["float16"]["left"] == 1.0 and ex["float16"]["right"] == 1.0 + 2.0 ** -10
    assert ex["bfloat16"]["left"] == 1.0 and ex["bfloat16"]["right"] == 1.0 + 2.0 ** -7
    assert ex["float32"]["left"] == 2.0 ** 24 and ex["float32"]["right"] == 2.0 ** 24 + 2
    # float16 agrees with NumPy's own float16 arithmetic
    one, t = np.float16(1), np.float16(2.0 ** -11)
    assert (one + t) + t == ex["float16"]["left"] and one + (t + t) == ex["float16"]["right"]


def test_to_bfloat16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -9, -2.5, np.inf, 3.0e38], np.float32)
    got = bi.to_bfloat16(x)
    np.testing.assert_array_equal(got[:5], [1.0, 1.0, 1 + 2 ** -6, 1.0, -2.5])   # ties go to the even neighbour
    assert got[5] == np.inf and np.isfinite(got[6])
    assert np.isnan(bi.to_bfloat16(np.float32("nan")))
    assert bi.bits_differ(bi.to_bfloat16(got), got) == 0                          # idempotent


def test_sum_order_changes_the_result_and_the_split_count_changes_the_order():
    rng = np.random.default_rng(1)
    v = rng.normal(size=2000).astype(np.float16)
    fwd = bi.sum_in_order(v, "float16")
    rev = bi.sum_in_order(v, "float16", order=np.arange(2000)[::-1])
    assert fwd != rev
    by_count = {n: bi.split_sum(v, bi.split_bounds_by_count(2000, n), "float16") for n in (1, 2, 3, 5, 8)}
    assert len(set(by_count.values())) > 1
    assert by_count[1] == fwd
    # a fixed split size cuts every prefix at the same places, however long the rest is
    assert bi.split_bounds_by_size(200, 64)[:4] == bi.split_bounds_by_size(1000, 64)[:4] == [0, 64, 128, 192]


def test_split_plans():
    assert bi.split_bounds_by_count(100, 3, 16) == [0, 48, 96, 100]
    assert bi.split_bounds_by_size(100, 32) == [0, 32, 64, 96, 100]
    assert bi.split_bounds_by_size(0, 32) == [0, 0]
    with pytest.raises(ValueError):
        bi.split_bounds_by_size(10, 0)
    # the decode kernel's count falls as the batch grows (H100: 132 SMs, Hkv=8, 4K tokens)
    counts = [bi.gpu_split_count(b, 8, 4096, 132) for b in (1, 4, 16, 64)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1] == 1


def test_matmul_reference_is_row_invariant_and_accurate():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(37, 200)).astype(np.float32)
    w = rng.normal(size=(200, 30)).astype(np.float32)
    full = bi.matmul_reference(x, w)
    np.testing.assert_allclose(full, x.astype(np.float64) @ w, atol=1e-4)
    for r in (0, 17, 36):
        assert bi.bits_differ(bi.matmul_reference(x[r:r + 1], w)[0], full[r]) == 0
        assert bi.bits_differ(bi.matmul_reference(x[r:], w)[0], full[r]) == 0
    with pytest.raises(ValueError):
        bi.matmul_reference(x, w.T)


def test_rmsnorm_reference_is_row_invariant_and_matches_the_formula():
    rng = np.random.default_rng(3)
    x = (3 * rng.normal(size=(9, 600))).astype(np.float32)
    w = rng.normal(size=600).astype(np.float32)
    full = bi.rmsnorm_reference(x, w, 1e-5)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(full, want, rtol=1e-5, atol=1e-5)
    alone, batched = bi.row_alone_vs_batched(lambda r: bi.rmsnorm_reference(r, w, 1e-5), x, 4)
    assert bi.bits_differ(alone, batched) == 0
    assert bi.rmsnorm_reference(x.astype(np.float16), w.astype(np.float16)).dtype == np.float16


@pytest.mark.parametrize("split", [8, 16, 64])
def test_attention_reference_matches_plain_attention(split):
    rng = np.random.default_rng(4)
    case = _ragged_case(rng, [1, 5, 3, 1], [40, 70, 3, 17], block_size=8, hq=4, hkv=2, d=16)
    np.testing.assert_allclose(bi.attention_reference(*case, split_size=split), paged_varlen_attention(*case),
                               atol=1e-6)


def test_attention_reference_fixed_size_is_row_invariant_and_fixed_count_is_not():
    """The same decode row alone and batched, as a decode and as the last row of a chunk: identical bits with a
    split size; with a split count, the count a GPU picks alone (batch 1) and in a batch differ, and so do
    the bits."""
    rng = np.random.default_rng(5)
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [4, 1], [90, 30], block_size=8, hq=4, hkv=2, d=16)
    last = 3                                            # row 3: the chunk's last token, position 89
    batched = bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=16)
    alone = bi.attention_reference(q[last:last + 1], kc, vc, tables[:1], lens[:1], np.array([0, 1], np.int32),
                                   split_size=16)
    assert bi.bits_differ(alone[0], batched[last]) == 0
    counts = bi.gpu_split_count(1, 2, 96, 132), bi.gpu_split_count(200, 2, 96, 132)
    assert counts[0] != counts[1]
    a, b = (bi.attention_reference(q[last:last + 1], kc, vc, tables[:1], lens[:1], np.array([0, 1], np.int32),
                                   split_size=None, num_splits=n) for n in counts)
    assert bi.bits_differ(a, b) > 0
    np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ValueError, match="exactly one"):
        bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=None)


def test_attention_reference_split_count_rounds_pieces_to_whole_tiles():
    """``tile`` cuts as the decode kernel's split_plan: 3 splits of 100 keys in 16-key tiles are pieces of 48 keys
    (split_bounds_by_count(100, 3, 16)), the same cuts as a split size of 48; without a tile the cuts fall at 34."""
    rng = np.random.default_rng(6)
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [1], [100], block_size=8, hq=4, hkv=2, d=16)
    by_tiles = bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=None, num_splits=3, tile=16)
    assert bi.bits_differ(by_tiles, bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=48)) == 0
    untiled = bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=None, num_splits=3)
    assert bi.bits_differ(untiled, bi.attention_reference(q, kc, vc, tables, lens, cu, split_size=34)) == 0
