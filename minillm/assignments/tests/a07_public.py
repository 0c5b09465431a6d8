"""Assignment 7, public tests: the block allocator, fork with copy-on-write, the paged decode kernel."""
import numpy as np
import pytest

from minillm.paged.allocator import BlockAllocator, OutOfBlocks
from minillm.paged.attention import paged_attention
from minillm.paged.cache import PagedKVCache


def test_allocator_hands_out_blocks_in_order_with_refcount_one():
    a = BlockAllocator(4, block_size=16)
    assert [a.allocate() for _ in range(4)] == [0, 1, 2, 3]
    assert a.num_free == 0 and all(a.refcount(b) == 1 for b in range(4))
    with pytest.raises(OutOfBlocks):
        a.allocate()


def test_decref_frees_at_zero_to_the_back_of_the_list():
    a = BlockAllocator(3)
    b0, b1 = a.allocate(), a.allocate()
    a.incref(b0)
    a.decref(b0)
    assert a.refcount(b0) == 1 and a.num_free == 1
    a.decref(b0)
    a.free(b1)
    assert a.free_blocks() == [2, 0, 1]


def test_fork_shares_blocks_and_copies_on_write(rng):
    c = PagedKVCache(n_layers=1, n_kv_heads=1, d_head=2, num_blocks=6, block_size=4)
    c.add_sequence("a")
    k = rng.normal(size=(1, 6, 1, 2)).astype(np.float32)
    c.append("a", k, -k)
    c.fork("a", "b")
    assert c.block_tables["b"] == c.block_tables["a"] and all(c.refcount(b) == 2 for b in c.block_tables["a"])
    new = rng.normal(size=(1, 1, 1, 2)).astype(np.float32)
    c.append("b", new, new)
    assert c.block_tables["b"][0] == c.block_tables["a"][0]   # the full block stays shared
    assert c.block_tables["b"][1] != c.block_tables["a"][1]   # the partial one was copied
    np.testing.assert_array_equal(c.gather("a", 0)[0], k[0])
    np.testing.assert_array_equal(c.gather("b", 0)[0], np.concatenate([k[0], new[0]]))
    c.check_invariants()


def test_triton_paged_decode_matches_reference(rng):
    import torch

    from minillm.kernels.paged_attention import paged_attention as triton_paged

    q = rng.normal(size=(2, 4, 16)).astype(np.float32)
    kc, vc = (rng.normal(size=(10, 4, 2, 16)).astype(np.float32) for _ in range(2))
    table = np.array([[3, 7, 0], [9, 1, 5]], np.int32)
    lens = np.array([5, 9], np.int32)
    want = paged_attention(q, kc, vc, table, lens)
    got = triton_paged(*(torch.from_numpy(x) for x in (q, kc, vc, table, lens))).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
