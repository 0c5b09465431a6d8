import pytest

from minillm.paged.allocator import BlockAllocator, OutOfBlocks


# -- BlockAllocator ---------------------------------------------------------------------------------------

def test_block_allocator_allocates_in_order_and_reuses_freed_last():
    a = BlockAllocator(4, block_size=8)
    assert [a.allocate() for _ in range(3)] == [0, 1, 2]
    a.free(1)
    assert a.free_blocks() == [3, 1] and a.num_free == 2 and a.num_used == 2
    assert a.allocate() == 3 and a.allocate() == 1


def test_block_allocator_double_free_and_unknown_block_raise():
    a = BlockAllocator(2)
    b = a.allocate()
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    for bad in (-1, 2, 1.5, None):
        with pytest.raises(ValueError, match="unknown block"):
            a.free(bad)


def test_block_allocator_refcounts_free_at_zero():
    a = BlockAllocator(2)
    b = a.allocate()
    a.incref(b)
    a.incref(b)
    assert a.refcount(b) == 3
    with pytest.raises(ValueError, match="3 owners"):
        a.free(b)
    a.decref(b)
    a.decref(b)
    assert a.refcount(b) == 1 and a.num_free == 1
    a.decref(b)
    assert a.refcount(b) == 0 and a.num_free == 2
    with pytest.raises(ValueError, match="free"):
        a.incref(b)
    with pytest.raises(ValueError, match="double free"):
        a.decref(b)


def test_block_allocator_out_of_blocks_says_requested_and_free():
    a = BlockAllocator(1)
    a.allocate()
    with pytest.raises(OutOfBlocks, match="requested 1 block, 0 free of 1") as e:
        a.allocate()
    assert (e.value.requested, e.value.free) == (1, 0)


def test_block_allocator_claim_takes_a_specific_free_block():
    a = BlockAllocator(3)
    a.claim(1)
    assert a.free_blocks() == [0, 2] and a.refcount(1) == 1
    with pytest.raises(ValueError, match="in use"):
        a.claim(1)


# -- PagedKVCache: growth, copy-on-write, errors ---------------------------------------------------------


def test_drop_tail_drops_one_reference_each_last_block_first():
    a = BlockAllocator(6)
    table = [a.allocate() for _ in range(4)]   # blocks 0..3
    a.incref(table[2])                          # block 2 is shared
    a.drop_tail(table, 1)
    assert table == [0]
    assert a.refcount(2) == 1 and a.refcount(1) == 0 and a.refcount(3) == 0
    assert a.free_blocks() == [4, 5, 3, 1]       # freed last block first, behind the never-used ones
    a.drop_tail(table, 0)
    assert table == [] and a.num_free == 5
    with pytest.raises(ValueError, match="already free"):
        a.drop_tail([3], 0)
    live = [a.allocate(), a.allocate()]
    with pytest.raises(ValueError, match="already free"):  # nothing is dropped when any block is bad
        a.drop_tail(live + [3], 0)
    assert len(live) == 2 and all(a.refcount(b) == 1 for b in live)
    for bad in (-1, 3, 1.0, True):
        with pytest.raises(ValueError, match="keep"):
            a.drop_tail(live, bad)
