"""The contiguous memory manager (chapter 7's baseline) under the serving scheduler."""
import numpy as np
import pytest

from minillm.decode import cached_decode
from minillm.paged.allocator import OutOfBlocks
from minillm.serving import (ContiguousManager, LLMEngine, NumpyRunner, RequestRejected, SamplingParams,
                             SchedulerConfig, SimulatedRunner)
from minillm.serving.sequence import Sequence


def seq(i, prompt_len, out=8):
    return Sequence(i, list(range(prompt_len)), SamplingParams(max_tokens=out))


def test_grow_copy_extends_in_place_then_moves_and_counts_the_copy():
    m = ContiguousManager(100, "grow_copy", max_context=64)
    a, b = seq(0, 10), seq(1, 10)
    m.allocate(a, 10)
    m.allocate(b, 10)
    assert a.block_table == range(0, 10) and b.block_table == range(10, 20)
    m.free(b)
    m.allocate(a, 11)                       # doubles in place into the hole b left
    assert a.block_table == range(0, 20) and m.tokens_copied == 0
    m.allocate(b, 5)
    a.num_computed = 20
    m.allocate(a, 21)                       # no room after it: a new range of 40, 20 tokens copied
    assert a.block_table == range(25, 65) and m.tokens_copied == 20 and m.num_moves == 1
    m.check_invariants([a, b])
    m.free(a)
    m.free(b)
    assert m.mem.holes == [[0, 100]] and m.num_free == 100


def test_can_grow_fails_with_enough_free_slots_in_scattered_holes():
    m = ContiguousManager(100, "grow_copy")
    seqs = [seq(i, 20) for i in range(5)]
    for s in seqs:
        m.allocate(s, 20)
    m.free(seqs[1])
    m.free(seqs[3])                         # 40 slots free, in two holes of 20
    s = seq(9, 30)
    assert m.can_allocate(m.blocks_needed(s, 30))   # the free count says yes...
    assert not m.can_grow(s, 30)                    # ...first fit says no: external fragmentation
    with pytest.raises(OutOfBlocks):
        m.allocate(s, 30)
    assert s.block_table == [] and m.num_free == 40
    assert m.can_grow(s, 20)


def test_reserve_max_and_guess_reserve_up_front():
    m = ContiguousManager(1000, "reserve_max", max_context=300)
    a = seq(0, 10)
    m.allocate(a, 10)
    assert len(a.block_table) == 300 and m.blocks_for(10) == 300
    g = ContiguousManager(1000, "guess", max_context=300, guess_output=50)
    b = seq(1, 10)
    g.allocate(b, 10)
    assert len(b.block_table) == 60
    with pytest.raises(ValueError, match="guess_output"):
        ContiguousManager(1000, "guess")
    with pytest.raises(ValueError, match="strategy"):
        ContiguousManager(1000, "best_fit")


@pytest.mark.parametrize("strategy", ["reserve_max", "grow_copy", "guess"])
def test_scheduler_serves_a_tight_pool_with_contiguous_memory(strategy):
    """Every request finishes with its tokens; ranges and holes tile the pool after every step."""
    rng = np.random.default_rng(7)
    reqs = [(int(rng.integers(1, 60)), int(rng.integers(1, 40))) for _ in range(40)]
    mgr = ContiguousManager(400, strategy, max_context=100, guess_output=20)
    eng = LLMEngine(SimulatedRunner(), 400, 1, 100, 50, SchedulerConfig(max_num_seqs=32, max_num_batched_tokens=64),
                    enable_prefix_caching=False, block_manager=mgr)
    ids = [eng.add_request(rng.integers(0, 50, p), SamplingParams(max_tokens=o, ignore_eos=True)) for p, o in reqs]
    sched = eng.scheduler
    while eng.has_unfinished():
        eng.step()
        mgr.check_invariants(sched.running + list(sched.waiting))
    assert [len(eng.output(i).token_ids) for i in ids] == [o for _, o in reqs]
    assert mgr.num_free == 400
    if strategy == "reserve_max":
        assert mgr.tokens_copied == 0 and len(sched.running) == 0
    else:
        assert sched.num_preemptions > 0    # the pool is tight enough to thrash


def test_request_larger_than_its_reservation_allows_is_rejected():
    mgr = ContiguousManager(99, "reserve_max", max_context=100)
    eng = LLMEngine(SimulatedRunner(), 99, 1, 100, 50, enable_prefix_caching=False, block_manager=mgr)
    with pytest.raises(RequestRejected, match="whole pool"):
        eng.add_request([1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="blocks"):
        LLMEngine(SimulatedRunner(), 98, 1, 100, 50, block_manager=mgr)


def test_reserve_max_drives_the_numpy_model_with_one_slot_blocks(small_model):
    """A range is a block table of one-slot blocks: the reference model decodes through it unchanged.
    (reserve_max never moves a range, so no K/V copy is needed.)"""
    cfg = small_model.config
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, cfg.vocab_size, int(rng.integers(3, 25))).tolist() for _ in range(5)]
    outs = [int(rng.integers(1, 10)) for _ in prompts]
    ctx = 40
    slots = 3 * ctx                         # three sequences at a time: the others wait for a range
    mgr = ContiguousManager(slots, "reserve_max", max_context=ctx)
    eng = LLMEngine(NumpyRunner(small_model, slots, 1), slots, 1, cfg.max_seq_len, cfg.vocab_size,
                    SchedulerConfig(max_num_batched_tokens=16), enable_prefix_caching=False, block_manager=mgr)
    got = eng.generate(prompts, [SamplingParams(max_tokens=o, ignore_eos=True) for o in outs], progress=False)
    for p, o, r in zip(prompts, outs, got):
        assert r.token_ids == cached_decode(small_model, p, o).new_tokens


def test_first_fit_allocator_rejects_sizes_below_one():
    """allocate(-5) used to succeed and leave a hole [-5, 15): a range before the address space."""
    from minillm.serving import FirstFitAllocator

    mem = FirstFitAllocator(10)
    for bad in (-5, 0, 2.5, True, "3"):
        with pytest.raises(ValueError, match="size"):
            mem.allocate(bad)
        with pytest.raises(ValueError, match="size"):
            mem.fits(bad)
    with pytest.raises(ValueError, match="extra"):
        mem.try_extend(0, 0, -3)
    assert mem.holes == [[0, 10]] and mem.free_slots == 10


def test_first_fit_allocator_free_rejects_double_free_and_out_of_bounds():
    """Freeing a range twice used to leave overlapping holes ([[0, 4], [0, 10]]) and 14 free slots of 10."""
    from minillm.serving import FirstFitAllocator

    mem = FirstFitAllocator(10)
    a, b = mem.allocate(4), mem.allocate(3)
    mem.free(a, 4)
    for start, size in ((a, 4), (a + 2, 1), (2, 3), (b + 1, 4), (b + 3, 3)):    # every one touches a free slot
        with pytest.raises(ValueError, match="double free"):
            mem.free(start, size)
    for start, size in ((8, 5), (-1, 2), (4, 0), (4, 1.5)):
        with pytest.raises(ValueError, match="cannot free|start|size"):
            mem.free(start, size)
    assert mem.holes == [[0, 4], [7, 3]] and mem.free_slots == 7
    mem.free(b, 3)                                          # the real free still merges everything
    assert mem.holes == [[0, 10]] and mem.free_slots == 10


def test_first_fit_allocator_free_rejects_a_range_it_did_not_hand_out():
    """Freeing the middle or the head of a range handed out, or a span across two, touches no free slot, so it used
    to pass: the slots went back to the holes while a sequence still held them, and the next allocation handed
    them out twice. Only a range handed out, or its tail (truncate), may be freed; extend follows the range."""
    from minillm.serving import FirstFitAllocator

    mem = FirstFitAllocator(20)
    a, b = mem.allocate(6), mem.allocate(4)                 # [0, 6), [6, 10)
    for start, size in ((a + 1, 2), (a, 3), (a + 4, 4), (b, 2)):
        with pytest.raises(ValueError, match="not a range handed out"):
            mem.free(start, size)
    with pytest.raises(ValueError, match="not a range this allocator handed out"):
        mem.try_extend(a, 5, 1)
    assert mem.holes == [[10, 10]] and mem.free_slots == 10
    mem.free(a + 4, 2)                                      # a tail: [0, 4) stays handed out
    assert mem.ranges == {a: 4, b: 4} and mem.holes == [[4, 2], [10, 10]]
    assert mem.try_extend(b, 4, 3) and mem.ranges[b] == 7   # [6, 13)
    with pytest.raises(ValueError, match="not a range handed out"):
        mem.free(b, 4)                                      # its size before the extension
    mem.free(b, 7)
    mem.free(a, 4)
    assert mem.holes == [[0, 20]] and mem.free_slots == 20 and mem.ranges == {}
