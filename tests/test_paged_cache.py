import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm.attention import standard_attention
from minillm.paged.allocator import OutOfBlocks, block_hash
from minillm.paged.attention import paged_attention
from minillm.paged.cache import PagedKVCache

L, H, D = 2, 2, 3

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
    """Random add / append / prefix-shared add / fork / truncate / release against a shadow copy of every sequence."""

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

    @precondition(lambda self: self.shadow)
    @rule(i=st.integers(0, 100), cut=st.integers(0, 12))
    def truncate(self, i, cut):
        s = self._pick(i)
        toks, k, v = self.shadow[s]
        n = max(0, k.shape[1] - cut)
        self.cache.truncate(s, n)
        self.shadow[s] = [None if toks is None else toks[:n], k[:, :n], v[:, :n]]

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


def test_truncate_frees_tail_blocks_and_keeps_values(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=4)
    cache.add_sequence("a")
    k, v = random_kv(rng, 11)
    cache.append("a", k, v, tokens=list(range(11)))
    assert len(cache.block_tables["a"]) == 3
    cache.truncate("a", 5)
    cache.check_invariants()
    assert cache.seq_lens["a"] == 5 and len(cache.block_tables["a"]) == 2 and cache.allocator.num_free == 6
    gk, gv = cache.gather("a", 1)
    np.testing.assert_array_equal(gk, k[1, :5])
    k2, v2 = random_kv(rng, 3)
    cache.append("a", k2, v2, tokens=[50, 51, 52])   # the re-grown tail holds the new values
    cache.check_invariants()
    np.testing.assert_array_equal(cache.gather("a", 0)[0], np.concatenate([k[0, :5], k2[0]]))
    cache.truncate("a", 0)
    cache.check_invariants()
    assert cache.allocator.num_free == 8


def test_truncate_keeps_blocks_shared_by_a_fork(rng):
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=4)
    cache.add_sequence("a")
    k, v = random_kv(rng, 8)
    cache.append("a", k, v)
    cache.fork("a", "b")
    cache.truncate("b", 3)
    cache.check_invariants()
    assert cache.refcount(cache.block_tables["a"][1]) == 1 and cache.refcount(cache.block_tables["a"][0]) == 2
    np.testing.assert_array_equal(cache.gather("a", 0)[0], k[0])


def test_truncate_within_the_last_block_keeps_prefix_naming(rng):
    """Rolling back inside the partial last block keeps its pending tokens, so re-filling it names it again."""
    cache = PagedKVCache(L, H, D, num_blocks=8, block_size=4)
    cache.add_sequence("a")
    k, v = fake_kv([1, 2, 3, 4, 5, 6])
    cache.append("a", k, v, tokens=[1, 2, 3, 4, 5, 6])
    cache.truncate("a", 5)
    k2, v2 = fake_kv([1, 2, 3, 4, 5, 9, 9, 9])
    cache.append("a", k2[:, 5:], v2[:, 5:], tokens=[9, 9, 9])
    cache.check_invariants()
    assert cache.lookup_prefix([1, 2, 3, 4, 5, 9, 9, 9]) == cache.block_tables["a"][:2]


@pytest.mark.parametrize("bad", [-1, 4, 2.0])
def test_truncate_rejects_bad_lengths(rng, bad):
    cache = PagedKVCache(L, H, D, num_blocks=4, block_size=4)
    cache.add_sequence("a")
    cache.append("a", *random_kv(rng, 3))
    with pytest.raises(ValueError, match="truncate"):
        cache.truncate("a", bad)
    with pytest.raises(KeyError):
        cache.truncate("nope", 0)


# -- one prefix cache for chapter 7's PagedKVCache and the serving engine's BlockManager ----------------------


def test_paged_cache_and_block_manager_share_one_prefix_cache_and_agree_block_for_block():
    """Both used to keep their own hash maps and eviction code (and their own invariant check). Now both hold a
    minillm.paged.prefix_cache.PrefixCache: served the same requests (admit with the cached prefix, compute the
    rest, finish), they hand out the same blocks, hit the same prefixes and name the same blocks."""
    from minillm.paged.prefix_cache import PrefixCache
    from minillm.serving import BlockManager, SamplingParams, Sequence

    rng = np.random.default_rng(5)
    bs, n_blocks = 4, 12
    cache, bm = PagedKVCache(L, H, D, num_blocks=n_blocks, block_size=bs), BlockManager(n_blocks, bs)
    assert type(cache.prefix_cache) is PrefixCache and type(bm.prefix_cache) is PrefixCache
    stem = [int(t) for t in rng.integers(0, 50, 9)]
    prompts = [stem + [int(t) for t in rng.integers(0, 50, n)] for n in (3, 6, 1, 9, 2, 5, 7)]
    live = []
    for i, prompt in enumerate(prompts):
        if len(live) == 2:                                   # finish the oldest: its blocks stay revivable
            old = live.pop(0)
            cache.release(old.seq_id)
            bm.free(old)
        # chapter 7's cache: look up prompt[:-1], start on those blocks, append the rest with their tokens
        prefix = cache.lookup_prefix(prompt[:-1])
        start = cache.add_sequence(i, prefix)
        k, v = fake_kv(prompt)
        cache.append(i, k[:, start:], v[:, start:], tokens=prompt[start:])
        # the engine's block manager: match_prefix, allocate the rest, register the full blocks once computed
        seq = Sequence(i, prompt, SamplingParams())
        hit = bm.match_prefix(seq)
        bm.allocate(seq, len(prompt))
        seq.num_computed = len(prompt)
        bm.register(seq)
        live.append(seq)
        assert hit == start and seq.block_table == cache.block_tables[i], i
        assert bm.prefix_cache._block == cache.prefix_cache._block        # the same names for the same blocks
        cache.check_invariants()
        bm.check_invariants(live)
    assert len(bm.prefix_cache) > 2 and bm.prefix_hit_tokens > 0


def test_prefix_cache_check_finds_a_name_that_points_nowhere():
    from minillm.serving import BlockManager, SamplingParams, Sequence
    bm = BlockManager(4, 2)
    seq = Sequence(0, [1, 2, 3, 4, 5], SamplingParams())
    bm.match_prefix(seq)
    bm.allocate(seq, 5)
    seq.num_computed = 4
    bm.register(seq)
    bm.check_invariants([seq])
    bm.prefix_cache._key.pop(seq.block_table[0])
    with pytest.raises(AssertionError, match="prefix cache maps a hash to block 0"):
        bm.check_invariants([seq])
    with pytest.raises(AssertionError, match="block 0 has refcount 1 but 0"):
        bm.check_invariants([])
