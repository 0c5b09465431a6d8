import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm.attention import standard_attention
from minillm.paged_attention import paged_attention
from minillm.paging import (
    BlockAllocator, FirstFitAllocator, OutOfBlocks, PagedKVCache, agent_workload, block_hash, chat_trace,
    compare_strategies, simulate_contiguous, simulate_paged, simulate_prefix_sharing,
)

L, H, D = 2, 2, 3


def fake_kv(tokens, n_layers=L, n_heads=H, d_head=D):
    """K/V that depend on the whole token prefix, as a real model's do: equal prefixes, equal values."""
    h, vals = 7, []
    for t in tokens:
        h = (h * 1_000_003 + int(t) + 1) % 2**31
        vals.append(h / 2**31)
    base = np.array(vals, np.float64).reshape(1, -1, 1, 1)
    offsets = (np.arange(n_layers).reshape(-1, 1, 1, 1) * 0.1 + np.arange(n_heads).reshape(1, 1, -1, 1) * 0.01
               + np.arange(d_head) * 0.001)
    k = (base + offsets).astype(np.float32)
    return k, -k


def random_kv(rng, n, n_layers=L, n_heads=H, d_head=D):
    return (rng.normal(size=(n_layers, n, n_heads, d_head)).astype(np.float32),
            rng.normal(size=(n_layers, n, n_heads, d_head)).astype(np.float32))


def snapshot(cache):
    a = cache.allocator
    return ({s: tuple(t) for s, t in cache.block_tables.items()}, dict(cache.seq_lens), a.free_blocks(),
            [a.refcount(b) for b in range(a.num_blocks)], cache.memory_stats(), cache.k_pool.copy(),
            cache.v_pool.copy())


def assert_same(before, after):
    for x, y in zip(before, after):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


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

def test_append_grows_only_on_block_boundaries(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=16)
    cache.add_sequence("a")
    for length in range(100):
        used = cache.allocator.num_used
        cache.append("a", *random_kv(rng, 1))
        assert cache.allocator.num_used - used == (1 if length % 16 == 0 else 0), length
        assert len(cache.block_tables["a"]) == -(-(length + 1) // 16)


def test_append_many_tokens_takes_ceil_blocks_and_values_roundtrip(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=16)
    cache.add_sequence(0)
    k1, v1 = random_kv(rng, 40)
    k2, v2 = random_kv(rng, 30)
    cache.append(0, k1, v1)
    assert cache.allocator.num_used == 3
    cache.append(0, k2, v2)
    assert cache.allocator.num_used == 5 and cache.seq_lens[0] == 70
    for layer in range(L):
        k, v = cache.gather(0, layer)
        np.testing.assert_array_equal(k, np.concatenate([k1, k2], 1)[layer])
        np.testing.assert_array_equal(v, np.concatenate([v1, v2], 1)[layer])


def test_fork_then_append_to_child_copies_on_write(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=16)
    cache.add_sequence("parent")
    kp, vp = random_kv(rng, 20)
    cache.append("parent", kp, vp)
    cache.fork("parent", "child")
    shared_first, shared_last = cache.block_tables["parent"]
    assert cache.block_tables["child"] == [shared_first, shared_last] and cache.refcount(shared_last) == 2
    kc, vc = random_kv(rng, 1)
    cache.append("child", kc, vc)
    child = cache.block_tables["child"]
    assert child[0] == shared_first and cache.refcount(shared_first) == 2   # full block: still shared
    assert child[1] not in cache.block_tables["parent"] and cache.refcount(shared_last) == 1   # copied
    for layer in range(L):
        k, v = cache.gather("parent", layer)
        np.testing.assert_array_equal(k, kp[layer])
        np.testing.assert_array_equal(v, vp[layer])
        k, v = cache.gather("child", layer)
        np.testing.assert_array_equal(k, np.concatenate([kp, kc], 1)[layer])
        np.testing.assert_array_equal(v, np.concatenate([vp, vc], 1)[layer])
    cache.check_invariants()


def test_fork_at_block_boundary_needs_no_copy(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=16)
    cache.add_sequence(0)
    cache.append(0, *random_kv(rng, 32))
    cache.fork(0, 1)
    cache.append(1, *random_kv(rng, 1))
    assert cache.allocator.num_used == 3   # two shared blocks + the child's new third one
    assert cache.block_tables[1][:2] == cache.block_tables[0]


def test_append_out_of_blocks_raises_before_any_change(rng):
    cache = PagedKVCache(L, H, D, num_blocks=3, block_size=4)
    cache.add_sequence("a")
    cache.append("a", *random_kv(rng, 6))
    before = snapshot(cache)
    with pytest.raises(OutOfBlocks, match=r"appending 7 tokens at length 6 needs 2 new block\(s\), 1 free of 3"):
        cache.append("a", *random_kv(rng, 7))
    assert_same(before, snapshot(cache))
    cache.check_invariants()


def test_append_out_of_blocks_counts_the_copy_on_write_block(rng):
    cache = PagedKVCache(L, H, D, num_blocks=2, block_size=4)
    cache.add_sequence("a")
    cache.append("a", *random_kv(rng, 6))
    cache.fork("a", "b")
    before = snapshot(cache)
    with pytest.raises(OutOfBlocks, match="copy-on-write") as e:
        cache.append("b", *random_kv(rng, 1))
    assert (e.value.requested, e.value.free) == (1, 0)
    assert_same(before, snapshot(cache))


def test_append_rejects_bad_shapes_and_token_counts(rng):
    cache = PagedKVCache(L, H, D, num_blocks=4, block_size=4)
    cache.add_sequence(0)
    k, v = random_kv(rng, 2)
    with pytest.raises(ValueError, match="n_layers"):
        cache.append(0, k[:1], v[:1])
    with pytest.raises(ValueError, match="n_new>=1"):
        cache.append(0, k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="differ"):
        cache.append(0, k, v[:, :1])
    with pytest.raises(ValueError, match="3 tokens for 2"):
        cache.append(0, k, v, tokens=[1, 2, 3])
    with pytest.raises(KeyError):
        cache.append("nope", k, v)
    assert cache.allocator.num_used == 0


def test_release_frees_everything_and_fork_keeps_shared_blocks(rng):
    cache = PagedKVCache(L, H, D, num_blocks=6, block_size=4)
    cache.add_sequence(0)
    cache.append(0, *random_kv(rng, 10))
    cache.fork(0, 1)
    cache.release(0)
    assert cache.allocator.num_used == 3 and all(cache.refcount(b) == 1 for b in cache.block_tables[1])
    cache.release(1)
    assert cache.allocator.num_free == 6
    cache.check_invariants()


# -- prefix caching ---------------------------------------------------------------------------------------

def add_with_prefix(cache, seq_id, tokens):
    """What a server does: reuse cached full blocks, compute and append only the rest."""
    start = cache.add_sequence(seq_id, cache.lookup_prefix(tokens))
    k, v = fake_kv(tokens)
    if start < len(tokens):
        cache.append(seq_id, k[:, start:], v[:, start:], tokens=tokens[start:])
    return start


def test_prefix_sharing_shares_three_equal_full_blocks_not_the_differing_one():
    cache = PagedKVCache(L, H, D, num_blocks=20, block_size=4)
    common = list(range(12))                         # three full blocks
    a, b = common + [50, 51, 52, 53, 54], common + [60, 61, 62, 63, 64]
    assert add_with_prefix(cache, "a", a) == 0
    assert add_with_prefix(cache, "b", b) == 12
    ta, tb = cache.block_tables["a"], cache.block_tables["b"]
    assert ta[:3] == tb[:3] and all(cache.refcount(x) == 2 for x in ta[:3])
    assert ta[3] != tb[3] and cache.refcount(ta[3]) == cache.refcount(tb[3]) == 1
    for layer in range(L):
        np.testing.assert_array_equal(cache.gather("b", layer)[0], fake_kv(b)[0][layer])
    cache.check_invariants()


def test_prefix_sharing_is_by_whole_prefix_not_by_block_content():
    cache = PagedKVCache(L, H, D, num_blocks=20, block_size=4)
    add_with_prefix(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.lookup_prefix([9, 9, 9, 9, 5, 6, 7, 8]) == []   # equal second block after a different first
    assert cache.lookup_prefix([1, 2, 3, 4, 5, 6, 7]) == cache.block_tables["a"][:1]   # only full blocks
    assert block_hash(None, [5, 6, 7, 8]) != block_hash(block_hash(None, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_prefix_blocks_stay_cached_after_release_until_reallocated(rng):
    cache = PagedKVCache(L, H, D, num_blocks=4, block_size=4)
    tokens = list(range(9))
    add_with_prefix(cache, "a", tokens)
    blocks = cache.block_tables["a"][:2]
    cache.release("a")
    assert cache.allocator.num_free == 4 and cache.lookup_prefix(tokens) == blocks   # free, still findable
    assert add_with_prefix(cache, "b", tokens) == 8 and cache.block_tables["b"][:2] == blocks  # revived
    np.testing.assert_array_equal(cache.gather("b", 1)[1], fake_kv(tokens)[1][1])
    cache.release("b")
    cache.add_sequence("c")
    cache.append("c", *random_kv(rng, 16))   # takes all four blocks: the cached ones are evicted
    assert cache.lookup_prefix(tokens) == []
    cache.check_invariants()


def test_release_returns_blocks_tail_first_so_the_prefix_is_evicted_last(rng):
    cache = PagedKVCache(L, H, D, num_blocks=3, block_size=4)
    add_with_prefix(cache, "a", list(range(12)))
    table = cache.block_tables["a"]
    cache.release("a")
    assert cache.allocator.free_blocks() == table[::-1]


def test_add_sequence_rejects_blocks_that_are_not_a_cached_prefix(rng):
    cache = PagedKVCache(L, H, D, num_blocks=6, block_size=4)
    add_with_prefix(cache, "a", list(range(8)))
    cache.add_sequence("x")
    cache.append("x", *random_kv(rng, 4))        # no tokens: never cached
    t = cache.block_tables
    with pytest.raises(ValueError, match="not the cached block"):
        cache.add_sequence("b", [t["x"][0]])
    with pytest.raises(ValueError, match="not the cached block"):
        cache.add_sequence("b", [t["a"][1], t["a"][0]])   # right blocks, wrong order
    with pytest.raises(ValueError, match="already exists"):
        cache.add_sequence("a")
    assert "b" not in t and cache.refcount(t["a"][0]) == 1


# -- arrays for kernels, stats, invariants -----------------------------------------------------------------

def test_block_table_array_and_seq_lens_array_shapes_dtypes_and_padding(rng):
    cache = PagedKVCache(L, H, D, num_blocks=10, block_size=4)
    for s, n in (("a", 1), ("b", 9), ("c", 4)):
        cache.add_sequence(s)
        cache.append(s, *random_kv(rng, n))
    table = cache.block_table_array(["a", "b", "c"])
    assert table.shape == (3, 3) and table.dtype == np.int32
    assert table[1].tolist() == cache.block_tables["b"] and table[0, 1:].tolist() == [0, 0]
    assert cache.block_table_array(["c"], max_blocks=5).shape == (1, 5)
    lens = cache.seq_lens_array(["a", "b", "c"])
    assert lens.dtype == np.int32 and lens.shape == (3,) and lens.tolist() == [1, 9, 4]
    with pytest.raises(ValueError, match="max_blocks is 2"):
        cache.block_table_array(["b"], max_blocks=2)


def test_block_table_array_feeds_the_paged_attention_reference(rng):
    cache = PagedKVCache(L, H, D, num_blocks=12, block_size=4)
    ids = [0, 1, 2]
    for s, n in zip(ids, (3, 13, 8)):
        cache.add_sequence(s)
        cache.append(s, *random_kv(rng, n))
    cache.fork(1, 3)
    cache.append(3, *random_kv(rng, 2))   # a forked, copied-on-write sequence too
    ids.append(3)
    q = rng.normal(size=(len(ids), 4, D)).astype(np.float32)
    out = paged_attention(q, cache.k_pool[1], cache.v_pool[1], cache.block_table_array(ids), cache.seq_lens_array(ids))
    for b, s in enumerate(ids):
        k, v = cache.gather(s, 1)
        kk, vv = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)   # GQA: 4 query heads over 2 KV heads
        want = standard_attention(q[b][None, :, None], kk.transpose(1, 0, 2)[None], vv.transpose(1, 0, 2)[None])
        np.testing.assert_allclose(out[b], want[0, :, 0], atol=1e-5)


def test_memory_stats_internal_fragmentation_below_one_block_per_sequence(rng):
    bs = 16
    cache = PagedKVCache(1, 1, 1, num_blocks=200, block_size=bs)
    lens = rng.integers(1, 300, size=12)
    for s, n in enumerate(lens):
        cache.add_sequence(s)
        cache.append(s, *random_kv(rng, int(n), 1, 1, 1))
    stats = cache.memory_stats()
    assert stats.tokens_stored == stats.logical_tokens == lens.sum()
    assert stats.slots_allocated - stats.tokens_stored <= (bs - 1) * len(lens)
    assert 0 <= stats.internal_fragmentation < 1
    cache.fork(0, "f")
    shared = cache.memory_stats()
    assert shared.tokens_stored == stats.tokens_stored and shared.logical_tokens == stats.logical_tokens + lens[0]


def test_check_invariants_detects_a_leak_and_a_dangling_reference(rng):
    cache = PagedKVCache(L, H, D, num_blocks=4, block_size=4)
    cache.add_sequence(0)
    cache.append(0, *random_kv(rng, 5))
    cache.check_invariants()
    cache.allocator.incref(cache.block_tables[0][0])   # a reference no table holds: a leak
    with pytest.raises(AssertionError, match="refcount 2 but 1"):
        cache.check_invariants()
    cache.allocator.decref(cache.block_tables[0][0])
    cache.block_tables[0].append(3)                    # a table entry pointing at a free block
    with pytest.raises(AssertionError, match="length 5 but 3 blocks"):
        cache.check_invariants()
    cache.seq_lens[0] = 9
    with pytest.raises(AssertionError, match="block 3 has refcount 0 but 1"):
        cache.check_invariants()


# -- property test: thousands of random operations ------------------------------------------------------

TEMPLATES = [[i % 3 for i in range(40)], [1] * 40, [(i * 7) % 5 for i in range(40)]]


class PagedCacheMachine(RuleBasedStateMachine):
    """Random add / append / prefix-shared add / fork / release against a shadow copy of every sequence."""

    def __init__(self):
        super().__init__()
        self.cache = PagedKVCache(L, H, D, num_blocks=24, block_size=4)
        self.shadow: dict[int, list] = {}   # seq -> [tokens or None, k (L, n, H, D), v]
        self.next_id = 0
        self.rng = np.random.default_rng(0)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _pick(self, i: int) -> int:
        ids = sorted(self.shadow)
        return ids[i % len(ids)]

    @rule(template=st.integers(0, len(TEMPLATES) - 1), n=st.integers(0, 40), share=st.booleans())
    def add(self, template, n, share):
        tokens = TEMPLATES[template][:n]
        s = self._new_id()
        prefix = self.cache.lookup_prefix(tokens) if share else []
        start = self.cache.add_sequence(s, prefix)
        assert start == len(prefix) * self.cache.block_size
        k, v = fake_kv(tokens[:start])
        self.shadow[s] = [tokens[:start], k, v]
        if start < len(tokens):
            self._append(s, tokens[start:])

    def _append(self, s, new_tokens, known=True):
        toks, k0, v0 = self.shadow[s]
        if known and toks is not None:
            k, v = fake_kv(toks + new_tokens)
            k, v = k[:, len(toks):], v[:, len(toks):]
        else:
            k, v = random_kv(self.rng, len(new_tokens))
        before = snapshot(self.cache)
        try:
            self.cache.append(s, k, v, tokens=new_tokens if known else None)
        except OutOfBlocks:
            assert_same(before, snapshot(self.cache))
            return
        self.shadow[s] = [toks + new_tokens if known and toks is not None else None,
                          np.concatenate([k0, k], 1), np.concatenate([v0, v], 1)]

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 100), new=st.lists(st.integers(0, 2), min_size=1, max_size=9), known=st.booleans())
    def append(self, i, new, known):
        self._append(self._pick(i), new, known)

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 100))
    def fork(self, i):
        src, dst = self._pick(i), self._new_id()
        self.cache.fork(src, dst)
        toks, k, v = self.shadow[src]
        self.shadow[dst] = [None if toks is None else list(toks), k, v]

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 100))
    def release(self, i):
        s = self._pick(i)
        self.cache.release(s)
        del self.shadow[s]

    @invariant()
    def consistent(self):
        self.cache.check_invariants()
        for s, (_, k, v) in self.shadow.items():
            assert self.cache.seq_lens[s] == k.shape[1]
            for layer in range(L):
                gk, gv = self.cache.gather(s, layer)
                np.testing.assert_array_equal(gk, k[layer])
                np.testing.assert_array_equal(gv, v[layer])

    def teardown(self):
        for s in list(self.shadow):
            self.cache.release(s)
        self.cache.check_invariants()
        stats = self.cache.memory_stats()
        assert self.cache.allocator.num_free == self.cache.num_blocks and stats.used_blocks == 0, "leaked blocks"


PagedCacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=50, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
test_paged_cache_random_operations_keep_invariants = PagedCacheMachine.TestCase


# -- fragmentation study ---------------------------------------------------------------------------------

CTX = 2048
POOL = 16 * CTX


@pytest.fixture(scope="module")
def trace():
    return chat_trace(300, seed=1, max_context=CTX)


@pytest.fixture(scope="module")
def results(trace):
    return compare_strategies(trace, POOL, block_size=16, max_context=CTX)


def test_chat_trace_deterministic_bounded_and_near_its_medians():
    a, b = chat_trace(2000, seed=3), chat_trace(2000, seed=3)
    assert a == b and a != chat_trace(2000, seed=4)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= 4096 for r in a)
    assert 250 < np.median([r.prompt_len for r in a]) < 350
    assert 170 < np.median([r.output_len for r in a]) < 230
    assert [r.rid for r in a] == list(range(2000))


def test_first_fit_allocator_leaves_and_merges_holes():
    mem = FirstFitAllocator(100)
    x, y, z = mem.allocate(30), mem.allocate(30), mem.allocate(30)
    assert (x, y, z) == (0, 30, 60)
    mem.free(y, 30)
    assert mem.allocate(40) is None and mem.free_slots == 40   # 40 free, but in holes of 30 and 10
    assert mem.try_extend(x, 30, 5) and mem.holes == [[35, 25], [90, 10]]   # grows into the hole after it
    assert not mem.try_extend(z, 30, 11) and mem.try_extend(z, 30, 10) and mem.free_slots == 25
    mem.free(x, 35)
    mem.free(z, 40)
    assert mem.holes == [[0, 100]] and mem.free_slots == 100


def test_simulate_all_strategies_generate_every_token(trace, results):
    want = sum(r.output_len for r in trace)
    assert set(results) == {"reserve_max", "grow_copy", "guess", "paged"}
    for name, r in results.items():
        assert r.tokens_generated == want, name
        assert r.steps >= max(x.output_len for x in trace)
        assert 0 <= r.idle_fraction <= 1 and r.mean_concurrent <= r.max_concurrent


def test_simulate_paged_wastes_under_one_block_per_sequence(results):
    paged = results["paged"]
    assert paged.max_reserved_unused_per_seq <= 16 - 1    # a sequence's last block is never empty
    assert paged.reserved_unused_per_seq < 16 - 1
    assert paged.free_fraction < 0.05                     # no external fragmentation, just the last partial fit


def test_simulate_reserve_max_idles_more_than_paged(results):
    assert results["reserve_max"].idle_fraction > results["paged"].idle_fraction
    assert results["reserve_max"].max_concurrent == POOL // CTX
    assert results["paged"].mean_concurrent > results["reserve_max"].mean_concurrent


def test_simulate_grow_copy_copies_paged_does_not(results):
    assert results["grow_copy"].tokens_copied > 0
    assert results["guess"].tokens_copied > 0
    assert results["paged"].tokens_copied == 0 and results["reserve_max"].tokens_copied == 0


def test_simulate_max_running_caps_concurrency(trace):
    capped = simulate_paged(trace, POOL, max_running=8)
    assert capped.max_concurrent == 8 and capped.preemptions == 0


def test_simulate_contiguous_rejects_unknown_strategy_and_oversized_pool_needs(trace):
    with pytest.raises(ValueError, match="strategy"):
        simulate_contiguous(trace, POOL, "best_fit", max_context=CTX)
    with pytest.raises(ValueError, match="cannot fit"):
        simulate_contiguous(trace, CTX - 1, "reserve_max", max_context=CTX)


def test_simulate_prefix_sharing_counts_blocks_and_prefill_exactly():
    reqs = agent_workload(16, system_prompt_len=320, user_len=32, seed=0, output_len=64)
    assert all(r.tokens[:320] == reqs[0].tokens[:320] for r in reqs)
    stats = simulate_prefix_sharing(reqs, block_size=16)
    # The first request computes all 352 prompt tokens; the rest find the system prompt's 20 full blocks.
    assert stats.prefill_tokens_unshared == 16 * 352 and stats.prefill_tokens_shared == 352 + 15 * 32
    # Unshared: 16 x ceil(416 / 16) blocks; shared: 20 system-prompt blocks + 16 x ceil(96 / 16).
    assert stats.peak_blocks_unshared == 16 * 26 and stats.peak_blocks_shared == 20 + 16 * 6
    assert stats.memory_ratio == pytest.approx(416 / 116) and stats.prefill_ratio == pytest.approx(5632 / 832)


def test_simulate_prefix_sharing_one_at_a_time_still_saves_prefill_via_cached_free_blocks():
    reqs = agent_workload(8, system_prompt_len=100, user_len=20, seed=1)
    stats = simulate_prefix_sharing(reqs, concurrent=False)
    assert stats.peak_blocks_shared == stats.peak_blocks_unshared   # one request resident at a time
    assert stats.prefill_tokens_shared == 120 + 7 * (120 - 96)      # 6 full blocks (96 tokens) reused
