"""Chapter 7: the paged KV cache -- K/V pools, block tables, fork with copy-on-write, prefix caching.

Chapter 2's cache reserves one contiguous array per sequence. Paging, as in
vLLM, cuts the pool into fixed-size blocks and gives each sequence a *block
table*: logical block i of a sequence lives in physical block ``table[i]``,
anywhere in the pool. ``PagedKVCache`` holds the K/V pools in the "NHD" page
layout of flash-attn and FlashInfer, (n_layers, num_blocks, block_size, Hkv, D),
the block tables, and three kinds of sharing that reference counts make cheap:
``fork`` (beams, parallel samples) shares every block and copies a shared block
only when one side writes to it (copy-on-write); automatic prefix caching finds
full blocks already computed for the same tokens at the same position by a
chained content hash, so a new request skips their prefill. ``truncate`` rolls a
sequence back (speculative decoding rejects draft tokens) and frees the blocks
past its new end.

The prefix cache (names, lookup, eviction policy, and the consistency check of
the allocator, the tables and the names) is :class:`minillm.paged.prefix_cache.PrefixCache`,
shared with the serving engine's block manager.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from .allocator import BlockAllocator, OutOfBlocks, ceil_div, check_count
from .prefix_cache import PrefixCache


@dataclass(frozen=True)
class MemoryStats:
    used_blocks: int
    free_blocks: int
    cached_blocks: int          # blocks with a prefix-cache entry, in use or free-but-revivable
    slots_allocated: int        # used_blocks * block_size
    tokens_stored: int          # slots holding a token (a shared block counts once)
    logical_tokens: int         # sum of sequence lengths (a shared block counts once per sequence)

    @property
    def internal_fragmentation(self) -> float:
        """Fraction of allocated slots that hold no token."""
        return 1 - self.tokens_stored / self.slots_allocated if self.slots_allocated else 0.0


class PagedKVCache:
    """K/V pools of fixed-size blocks, per-sequence block tables, fork with copy-on-write, and prefix caching.

    Position t of a sequence is slot ``t % block_size`` of physical block
    ``block_tables[seq][t // block_size]``. ``block_tables`` and ``seq_lens``
    are exposed for reading; change them only through the methods.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, d_head: int, num_blocks: int, block_size: int = 16,
                 dtype=np.float32):
        self.n_layers = check_count("n_layers", n_layers)
        self.n_kv_heads = check_count("n_kv_heads", n_kv_heads)
        self.d_head = check_count("d_head", d_head)
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.num_blocks, self.block_size = self.allocator.num_blocks, self.allocator.block_size
        shape = (self.n_layers, self.num_blocks, self.block_size, self.n_kv_heads, self.d_head)
        self.k_pool = np.zeros(shape, dtype)
        self.v_pool = np.zeros(shape, dtype)
        self.block_tables: dict[Hashable, list[int]] = {}
        self.seq_lens: dict[Hashable, int] = {}
        # Prefix cache. ``_chain[s]`` holds the hashes of s's full blocks and ``_pending[s]`` the tokens of its
        # partly filled last block; ``_pending[s] is None`` once a position was appended without its token,
        # after which none of s's later blocks can be named by content.
        self.prefix_cache = PrefixCache(self.allocator)
        self._chain: dict[Hashable, list[bytes]] = {}
        self._pending: dict[Hashable, list[int] | None] = {}

    # -- blocks -------------------------------------------------------------------------------------------
    def _allocate(self) -> int:
        return self.prefix_cache.take()          # handing out a cached free block is what evicts it

    def refcount(self, block: int) -> int:
        return self.allocator.refcount(block)

    # -- sequences ------------------------------------------------------------------------------------------
    def _seq(self, seq_id) -> list[int]:
        if seq_id not in self.block_tables:
            raise KeyError(f"unknown sequence {seq_id!r}")
        return self.block_tables[seq_id]

    def add_sequence(self, seq_id, prefix_blocks: Sequence[int] = ()) -> int:
        """Start a sequence, optionally on cached full blocks from ``lookup_prefix``; return its length.

        The sequence begins with ``len(prefix_blocks) * block_size`` tokens whose
        K/V need no computing. Call this right after ``lookup_prefix``: an
        allocation in between may evict a free cached block.
        """
        if seq_id in self.block_tables:
            raise ValueError(f"sequence {seq_id!r} already exists")
        prefix = [self.allocator.check_block(b) for b in prefix_blocks]
        parent = None
        for i, b in enumerate(prefix):
            key = self.prefix_cache.key(b)
            if key is None or key[0] != parent:
                raise ValueError(f"prefix_blocks[{i}] = {b} is not the cached block that follows "
                                 f"prefix_blocks[:{i}]; pass what lookup_prefix returned")
            parent = key[1]
        for b in prefix:
            self.prefix_cache.acquire(b)  # in use: one more owner; free but still cached: revive it
        self.block_tables[seq_id] = prefix
        self.seq_lens[seq_id] = len(prefix) * self.block_size
        self._chain[seq_id] = [self.prefix_cache.key(b)[1] for b in prefix]
        self._pending[seq_id] = []
        return self.seq_lens[seq_id]

    def lookup_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Cached blocks holding the longest run of full blocks that starts ``tokens``.

        Only whole blocks are matched. A caller that needs the logits of the last
        prompt token should look up ``tokens[:-1]`` so that at least that token is
        computed.
        """
        return [block for block, _ in self.prefix_cache.match(tokens, self.block_size)]

    def append(self, seq_id, k, v, tokens: Sequence[int] | None = None) -> None:
        """Write K/V for ``n_new`` new positions, ``k`` and ``v`` shaped (n_layers, n_new, Hkv, D).

        A new block is taken only when a position crosses a block boundary. If
        the last block is shared and partly filled, it is first copied
        (copy-on-write). With ``tokens`` (the n_new token ids), every block this
        append fills is entered in the prefix cache. All or nothing: if the pool
        cannot supply every block needed, OutOfBlocks is raised before anything
        changes.
        """
        table = self._seq(seq_id)
        k, v = np.asarray(k), np.asarray(v)
        want = (self.n_layers, None, self.n_kv_heads, self.d_head)
        for name, x in (("k", k), ("v", v)):
            if x.ndim != 4 or x.shape[0] != want[0] or x.shape[2:] != want[2:] or x.shape[1] < 1:
                raise ValueError(f"{name} must be (n_layers={self.n_layers}, n_new>=1, Hkv={self.n_kv_heads}, "
                                 f"D={self.d_head}), got {x.shape}")
        if k.shape != v.shape:
            raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
        n, bs, cur = k.shape[1], self.block_size, self.seq_lens[seq_id]
        if tokens is not None and len(tokens) != n:
            raise ValueError(f"got {len(tokens)} tokens for {n} new positions")
        # BEGIN SOLUTION
        fill = cur % bs   # slots used in the last block; 0 means it is full (or there is none)
        # A shared block is copied before a write, and so is a named (prefix-cached) one: after a truncate the
        # last block can be a full cached block cut short, and its cached content must survive.
        cow = fill > 0 and (self.allocator.refcount(table[-1]) > 1 or self.prefix_cache.is_named(table[-1]))
        need = ceil_div(cur + n, bs) - len(table) + cow
        if need > self.allocator.num_free:
            raise OutOfBlocks(f"sequence {seq_id!r}: appending {n} tokens at length {cur} needs {need} new "
                              f"block(s){' (one for copy-on-write)' if cow else ''}, {self.allocator.num_free} "
                              f"free of {self.num_blocks}", requested=need, free=self.allocator.num_free)
        if cow:
            old, new = table[-1], self._allocate()
            self.k_pool[:, new, :fill] = self.k_pool[:, old, :fill]
            self.v_pool[:, new, :fill] = self.v_pool[:, old, :fill]
            self.allocator.decref(old)
            table[-1] = new
        while len(table) < ceil_div(cur + n, bs):
            table.append(self._allocate())
        pos = np.arange(cur, cur + n)
        phys = np.asarray(table)[pos // bs]
        self.k_pool[:, phys, pos % bs] = k   # fancy index (n,) x (n,) -> (L, n, Hkv, D)
        self.v_pool[:, phys, pos % bs] = v
        self.seq_lens[seq_id] = cur + n
        # END SOLUTION
        self._register_full_blocks(seq_id, cur, n, tokens)

    def _register_full_blocks(self, seq_id, cur: int, n: int, tokens) -> None:
        pending = self._pending[seq_id]
        if pending is None or tokens is None:
            self._pending[seq_id] = None
            return
        bs, table, chain = self.block_size, self.block_tables[seq_id], self._chain[seq_id]
        buf = pending + [int(t) for t in tokens]   # tokens from the start of block cur // bs
        first, done = cur // bs, (cur + n) // bs   # blocks first .. done-1 became full in this append
        for i in range(first, done):
            # first writer wins: if another block already holds this content, this one stays unnamed
            chain.append(self.prefix_cache.name(table[i], chain[-1] if chain else None,
                                                buf[(i - first) * bs:(i - first + 1) * bs]))
        self._pending[seq_id] = buf[(done - first) * bs:]

    def fork(self, src_id, dst_id) -> None:
        """A new sequence sharing all of ``src_id``'s blocks; whichever writes a shared block first copies it."""
        # BEGIN SOLUTION
        table = self._seq(src_id)
        if dst_id in self.block_tables:
            raise ValueError(f"sequence {dst_id!r} already exists")
        for b in table:
            self.allocator.incref(b)
        self.block_tables[dst_id] = list(table)
        self.seq_lens[dst_id] = self.seq_lens[src_id]
        self._chain[dst_id] = list(self._chain[src_id])
        pending = self._pending[src_id]
        self._pending[dst_id] = None if pending is None else list(pending)
        # END SOLUTION

    def truncate(self, seq_id, n: int) -> None:
        """Roll ``seq_id`` back to its first ``n`` positions and drop its blocks past position n-1.

        Blocks past the new end get one reference dropped (a shared one stays
        with its other owners; a cached one stays revivable). If the cut falls
        inside a cached block, the next append copies that block before writing
        (as for a shared one), so the cached content is never overwritten.
        """
        table = self._seq(seq_id)
        cur = self.seq_lens[seq_id]
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= cur:
            raise ValueError(f"truncate needs an integer in [0, {cur}] (sequence {seq_id!r}'s length), got {n!r}")
        n, bs = int(n), self.block_size
        self.allocator.drop_tail(table, ceil_div(n, bs))
        self.seq_lens[seq_id] = n
        chain, pending = self._chain[seq_id], self._pending[seq_id]
        full, rest = divmod(n, bs)
        if pending is not None:
            if len(chain) == full:          # still inside the same partial block: its tokens are in pending
                self._pending[seq_id] = pending[:rest]
            elif rest == 0:                 # cut on a block boundary: nothing partial remains
                self._pending[seq_id] = []
            else:                           # the new partial block's tokens were hashed away with its block
                self._pending[seq_id] = None
        del chain[full:]

    def release(self, seq_id) -> None:
        """Drop the sequence and one reference to each of its blocks (last block first; see the module doc)."""
        for b in reversed(self._seq(seq_id)):  # the table itself stays as it was: callers may hold it
            self.allocator.decref(b)
        for d in (self.block_tables, self.seq_lens, self._chain, self._pending):
            del d[seq_id]

    # -- reading ------------------------------------------------------------------------------------------
    def block_table_array(self, seq_ids: Sequence, max_blocks: int | None = None) -> np.ndarray:
        """The (B, max_blocks) int32 tables a paged-attention kernel takes, padded with block 0.

        Padding is never read: ``seq_lens_array`` bounds each row, and a kernel
        only visits blocks below ceil(seq_len / block_size). Block 0 is a valid
        index, so even a kernel that prefetches stays inside the pool.
        """
        tables = [self._seq(s) for s in seq_ids]
        width = max([len(t) for t in tables] + [1]) if max_blocks is None else int(max_blocks)
        out = np.zeros((len(tables), width), np.int32)
        for row, t in enumerate(tables):
            if len(t) > width:
                raise ValueError(f"sequence {seq_ids[row]!r} has {len(t)} blocks; max_blocks is {width}")
            out[row, :len(t)] = t
        return out

    def seq_lens_array(self, seq_ids: Sequence) -> np.ndarray:
        for s in seq_ids:
            self._seq(s)
        return np.array([self.seq_lens[s] for s in seq_ids], np.int32)

    def gather(self, seq_id, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """One layer of the sequence's keys and values as contiguous (len, Hkv, D) copies, for references and tests."""
        table, n = self._seq(seq_id), self.seq_lens[seq_id]
        pos = np.arange(n)
        phys = np.asarray(table, dtype=np.int64)[pos // self.block_size]
        return self.k_pool[layer][phys, pos % self.block_size], self.v_pool[layer][phys, pos % self.block_size]

    # -- accounting ---------------------------------------------------------------------------------------
    def _block_fill(self) -> dict[int, int]:
        """Filled slots of every referenced block (the most any owner has written to it)."""
        bs, fill = self.block_size, {}
        for s, table in self.block_tables.items():
            n = self.seq_lens[s]
            for i, b in enumerate(table):
                fill[b] = max(fill.get(b, 0), min(bs, n - i * bs))
        return fill

    def memory_stats(self) -> MemoryStats:
        a = self.allocator
        return MemoryStats(used_blocks=a.num_used, free_blocks=a.num_free, cached_blocks=len(self.prefix_cache),
                           slots_allocated=a.num_used * self.block_size,
                           tokens_stored=sum(self._block_fill().values()),
                           logical_tokens=sum(self.seq_lens.values()))

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant of the tables, the allocator and the prefix
        cache (the last two: :meth:`PrefixCache.check_invariants`, shared with the serving block manager)."""
        bs = self.block_size
        if set(self.seq_lens) != set(self.block_tables):
            raise AssertionError("seq_lens and block_tables name different sequences")
        for s, table in self.block_tables.items():
            n = self.seq_lens[s]
            if len(table) != ceil_div(n, bs):
                raise AssertionError(f"sequence {s!r} has length {n} but {len(table)} blocks of {bs}")
        self.prefix_cache.check_invariants(self.block_tables.items())
        for s in self.block_tables:
            if self._pending[s] is not None and (len(self._chain[s]) != self.seq_lens[s] // bs
                                                 or len(self._pending[s]) != self.seq_lens[s] % bs):
                raise AssertionError(f"sequence {s!r}: token bookkeeping does not match its length")
