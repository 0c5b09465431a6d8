"""Chapter 7: paged KV-cache memory -- blocks, block tables, sharing, and what they buy.

Chapter 2's cache reserves one contiguous array per sequence. A server that does
not know how long each answer will be must either reserve the maximum context
(most of it stays empty) or grow and copy (and the holes left by finished
sequences fragment the pool). Paging, as in vLLM, cuts the pool into fixed-size
blocks of ``block_size`` token slots and gives each sequence a *block table*:
logical block i of a sequence lives in physical block ``table[i]``, anywhere in
the pool. Consequences, each one a piece of this module:

* ``BlockAllocator``: a free list and a reference count per block. A sequence
  takes a new block only when it crosses a block boundary, so it wastes at most
  ``block_size - 1`` slots, and any free block fits any sequence (no external
  fragmentation).
* ``PagedKVCache``: the K/V pools in the "NHD" page layout of flash-attn and
  FlashInfer, (n_layers, num_blocks, block_size, Hkv, D), the block tables, and
  three kinds of sharing that reference counts make cheap:
  ``fork`` (beams, parallel samples) shares every block and copies a shared
  block only when one side writes to it (copy-on-write); automatic prefix
  caching finds full blocks already computed for the same tokens at the same
  position by a chained content hash, so a new request skips their prefill.
* A fragmentation study: ``chat_trace`` (synthetic requests), a serving loop
  run with contiguous strategies (``simulate_contiguous``, first-fit over a
  linear address space) and with blocks (``simulate_paged``), and
  ``agent_workload`` / ``simulate_prefix_sharing`` for many requests behind one
  long system prompt. They return numbers; the chapter compares them with the
  claims it quotes.

Prefix-cache eviction policy: the hash table holds no reference. A cached
block whose reference count drops to 0 goes to the back of the free list but
*keeps* its hash entry, so a later request can still find and revive it. It is
evicted (its hash entry dropped) only when the allocator hands it out again,
which happens in the order blocks were freed: least recently freed first.
A sequence releases its blocks last-to-first, so a prompt's tail is evicted
before its head (the head is the part other requests are likeliest to share).
"""
from __future__ import annotations

import hashlib
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than an operation needs. Nothing was changed.

    Whether to wait, preempt a sequence or swap it out is the caller's (the
    scheduler's) decision, so this is an exception and not a policy.
    """

    def __init__(self, message: str, *, requested: int | None = None, free: int | None = None):
        super().__init__(message)
        self.requested, self.free = requested, free


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_count(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class BlockAllocator:
    """Hands out block ids from a free list and counts references to each block.

    The free list is an insertion-ordered dict used as a queue: ``allocate``
    takes the block at the front, a block that becomes free goes to the back,
    and ``claim`` can pull a particular free block out of the middle (a cached
    prefix block being reused) in O(1). The order is deterministic: blocks
    0, 1, 2, ... first, then in the order they were freed.
    """

    def __init__(self, num_blocks: int, block_size: int = 16):
        self.num_blocks = _check_count("num_blocks", num_blocks)
        self.block_size = _check_count("block_size", block_size)
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(self.num_blocks))
        self._refs = [0] * self.num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def free_blocks(self) -> list[int]:
        """The free list, front (next to be allocated) first."""
        return list(self._free)

    def _known(self, block) -> int:
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}: the pool has blocks 0..{self.num_blocks - 1}")
        return int(block)

    def refcount(self, block: int) -> int:
        return self._refs[self._known(block)]

    def allocate(self) -> int:
        """A free block with reference count 1."""
        if not self._free:
            raise OutOfBlocks(f"requested 1 block, 0 free of {self.num_blocks}", requested=1, free=0)
        block, _ = self._free.popitem(last=False)
        self._refs[block] = 1
        return block

    def claim(self, block: int) -> None:
        """Take one particular free block (reference count 0 -> 1)."""
        block = self._known(block)
        if self._refs[block]:
            raise ValueError(f"block {block} is in use (refcount {self._refs[block]}), not free; use incref")
        del self._free[block]
        self._refs[block] = 1

    def incref(self, block: int) -> None:
        block = self._known(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is free; a reference to it would dangle (use allocate or claim)")
        self._refs[block] += 1

    def decref(self, block: int) -> None:
        """Drop one reference; the last one returns the block to the back of the free list."""
        block = self._known(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is already free (double free)")
        self._refs[block] -= 1
        if not self._refs[block]:
            self._free[block] = None

    def free(self, block: int) -> None:
        """Return an unshared block. Freeing a shared one would leave other owners dangling, so that is an error."""
        block = self._known(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is already free (double free)")
        if self._refs[block] > 1:
            raise ValueError(f"block {block} has {self._refs[block]} owners; each must decref it")
        self.decref(block)


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """Content hash of a full block, chained to the hash of the block before it (None for the first).

    Chaining makes the key mean "these tokens, after exactly this prefix": K/V
    at a position depend on every earlier token, so equal blocks only hold
    equal K/V when their whole prefixes are equal. SHA-256 rather than Python's
    64-bit ``hash`` because a collision would silently serve another prompt's
    K/V.
    """
    h = hashlib.sha256(parent or b"")
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


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
        self.n_layers = _check_count("n_layers", n_layers)
        self.n_kv_heads = _check_count("n_kv_heads", n_kv_heads)
        self.d_head = _check_count("d_head", d_head)
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
        self._cached: dict[bytes, int] = {}                     # hash -> block
        self._block_key: dict[int, tuple[bytes | None, bytes]] = {}  # block -> (parent hash, own hash)
        self._chain: dict[Hashable, list[bytes]] = {}
        self._pending: dict[Hashable, list[int] | None] = {}

    # -- blocks -------------------------------------------------------------------------------------------
    def _allocate(self) -> int:
        block = self.allocator.allocate()
        key = self._block_key.pop(block, None)   # handing out a cached free block is what evicts it
        if key is not None:
            del self._cached[key[1]]
        return block

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
        prefix = [self.allocator._known(b) for b in prefix_blocks]
        parent = None
        for i, b in enumerate(prefix):
            key = self._block_key.get(b)
            if key is None or key[0] != parent:
                raise ValueError(f"prefix_blocks[{i}] = {b} is not the cached block that follows "
                                 f"prefix_blocks[:{i}]; pass what lookup_prefix returned")
            parent = key[1]
        for b in prefix:
            if self.allocator.refcount(b):
                self.allocator.incref(b)
            else:
                self.allocator.claim(b)   # free but still cached: revive it
        self.block_tables[seq_id] = prefix
        self.seq_lens[seq_id] = len(prefix) * self.block_size
        self._chain[seq_id] = [self._block_key[b][1] for b in prefix]
        self._pending[seq_id] = []
        return self.seq_lens[seq_id]

    def lookup_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Cached blocks holding the longest run of full blocks that starts ``tokens``.

        Only whole blocks are matched. A caller that needs the logits of the last
        prompt token should look up ``tokens[:-1]`` so that at least that token is
        computed.
        """
        bs, out, parent = self.block_size, [], None
        for i in range(len(tokens) // bs):
            h = block_hash(parent, tokens[i * bs:(i + 1) * bs])
            block = self._cached.get(h)
            if block is None:
                break
            out.append(block)
            parent = h
        return out

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
        fill = cur % bs   # slots used in the last block; 0 means it is full (or there is none)
        cow = fill > 0 and self.allocator.refcount(table[-1]) > 1
        need = _ceil_div(cur + n, bs) - len(table) + cow
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
        while len(table) < _ceil_div(cur + n, bs):
            table.append(self._allocate())
        pos = np.arange(cur, cur + n)
        phys = np.asarray(table)[pos // bs]
        self.k_pool[:, phys, pos % bs] = k   # fancy index (n,) x (n,) -> (L, n, Hkv, D)
        self.v_pool[:, phys, pos % bs] = v
        self.seq_lens[seq_id] = cur + n
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
            parent = chain[-1] if chain else None
            h = block_hash(parent, buf[(i - first) * bs:(i - first + 1) * bs])
            chain.append(h)
            # First writer wins: if another block already holds this content, this one stays unnamed.
            if h not in self._cached:
                self._cached[h] = table[i]
                self._block_key[table[i]] = (parent, h)
        self._pending[seq_id] = buf[(done - first) * bs:]

    def fork(self, src_id, dst_id) -> None:
        """A new sequence sharing all of ``src_id``'s blocks; whichever writes a shared block first copies it."""
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

    def release(self, seq_id) -> None:
        """Drop the sequence and one reference to each of its blocks (last block first; see the module doc)."""
        table = self._seq(seq_id)
        for b in reversed(table):
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
        return MemoryStats(used_blocks=a.num_used, free_blocks=a.num_free, cached_blocks=len(self._cached),
                           slots_allocated=a.num_used * self.block_size,
                           tokens_stored=sum(self._block_fill().values()),
                           logical_tokens=sum(self.seq_lens.values()))

    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant of the allocator, tables and prefix cache."""
        def fail(msg):
            raise AssertionError(msg)

        a, bs = self.allocator, self.block_size
        free = a.free_blocks()
        if len(set(free)) != len(free):
            fail(f"free list has duplicates: {free}")
        refs = [0] * self.num_blocks
        for s, table in self.block_tables.items():
            n = self.seq_lens.get(s)
            if n is None or len(table) != _ceil_div(n, bs):
                fail(f"sequence {s!r} has length {n} but {len(table)} blocks of {bs}")
            for b in table:
                if not 0 <= b < self.num_blocks:
                    fail(f"sequence {s!r} refers to block {b} outside the pool")
                refs[b] += 1
        if set(self.seq_lens) != set(self.block_tables):
            fail("seq_lens and block_tables name different sequences")
        free_set = set(free)
        for b in range(self.num_blocks):
            if a.refcount(b) != refs[b]:
                fail(f"block {b} has refcount {a.refcount(b)} but {refs[b]} block-table references")
            if (b in free_set) != (refs[b] == 0):
                fail(f"block {b} is {'free' if b in free_set else 'not free'} with {refs[b]} references")
        if len(free) + a.num_used != self.num_blocks:
            fail(f"{len(free)} free + {a.num_used} used != {self.num_blocks} blocks")
        for h, b in self._cached.items():
            if self._block_key.get(b, (None, None))[1] != h:
                fail(f"prefix cache maps a hash to block {b}, whose own key disagrees")
        if len(self._block_key) != len(self._cached):
            fail("prefix cache and its reverse map differ in size")
        fill = self._block_fill()
        for b in self._block_key:
            if b in fill and fill[b] != bs:
                fail(f"cached block {b} is only {fill[b]}/{bs} full in some sequence (it could be overwritten)")
        for s in self.block_tables:
            if self._pending[s] is not None and (len(self._chain[s]) != self.seq_lens[s] // bs
                                                 or len(self._pending[s]) != self.seq_lens[s] % bs):
                fail(f"sequence {s!r}: token bookkeeping does not match its length")


# ---------------------------------------------------------------------------------------------------------
# Fragmentation study: one serving loop, several ways to hand out memory.
# ---------------------------------------------------------------------------------------------------------

# Synthetic chat trace. Lengths are log-normal (a few long prompts and answers, many short ones); medians
# ~300 prompt and ~200 output tokens. The sigmas put the 95th percentile near 1,550 prompt and 750 output
# tokens. These are our assumptions, not fitted to any published trace.
PROMPT_MEDIAN, PROMPT_SIGMA = 300, 1.0
OUTPUT_MEDIAN, OUTPUT_SIGMA = 200, 0.8


@dataclass(frozen=True)
class Request:
    rid: int
    prompt_len: int
    output_len: int


def chat_trace(n_requests: int, seed: int = 0, max_context: int = 4096) -> list[Request]:
    """``n_requests`` chat-like requests in arrival order, each fitting in ``max_context`` tokens.

    All of them are queued at time 0 (an offline backlog), so the serving loop
    is always limited by memory: the regime in which memory management decides
    throughput.
    """
    n = _check_count("n_requests", n_requests)
    max_context = _check_count("max_context", max_context, 2)
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(math.log(PROMPT_MEDIAN), PROMPT_SIGMA, n)), 1, max_context - 1)
    output = np.rint(rng.lognormal(math.log(OUTPUT_MEDIAN), OUTPUT_SIGMA, n))
    output = np.clip(output, 1, max_context - prompt)
    return [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompt, output))]


class FirstFitAllocator:
    """Contiguous ranges of a linear address space of ``capacity`` slots, first fit.

    Holes are kept sorted by address and merged with their neighbours on free.
    ``allocate`` returns None when no single hole is large enough, even if the
    free slots add up to enough: that is external fragmentation.
    """

    def __init__(self, capacity: int):
        self.capacity = _check_count("capacity", capacity)
        self.holes: list[list[int]] = [[0, self.capacity]]   # [start, size], sorted by start
        self.free_slots = self.capacity

    def allocate(self, size: int) -> int | None:
        for hole in self.holes:
            if hole[1] >= size:
                start = hole[0]
                self._take(hole, size)
                return start
        return None

    def _take(self, hole: list[int], n: int) -> None:
        """Use the first ``n`` slots of ``hole``; drop the hole once it is empty."""
        hole[0] += n
        hole[1] -= n
        if not hole[1]:
            self.holes.remove(hole)
        self.free_slots -= n

    def try_extend(self, start: int, size: int, extra: int) -> bool:
        """Grow the range [start, start+size) in place by ``extra`` slots if the hole right after it allows."""
        for hole in self.holes:
            if hole[0] == start + size and hole[1] >= extra:
                self._take(hole, extra)
                return True
            if hole[0] > start + size:
                break
        return False

    def free(self, start: int, size: int) -> None:
        i = 0
        while i < len(self.holes) and self.holes[i][0] < start:
            i += 1
        self.holes.insert(i, [start, size])
        if i + 1 < len(self.holes) and start + size == self.holes[i + 1][0]:   # merge with the next hole
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:     # and with the previous one
            self.holes[i - 1][1] += self.holes.pop(i)[1]
        self.free_slots += size


class _Seq:
    """A request being served: ``length`` tokens in its cache so far, ``generated`` of them new."""

    def __init__(self, req: Request):
        self.req, self.length, self.generated = req, req.prompt_len, 0
        self.start = self.capacity = 0   # contiguous strategies: its range
        self.blocks: list[int] = []      # paged: its block table


class _Contiguous:
    """One range per sequence. The initial reservation is the strategy; growth doubles (up to max_context)."""

    def __init__(self, pool_tokens: int, max_context: int, initial):
        self.mem, self.max_context, self.initial = FirstFitAllocator(pool_tokens), max_context, initial
        self.tokens_copied = 0

    @property
    def allocated(self) -> int:
        return self.mem.capacity - self.mem.free_slots

    def admit(self, s: _Seq) -> bool:
        size = self.initial(s)
        start = self.mem.allocate(size)
        if start is None:
            return False
        s.start, s.capacity = start, size
        return True

    def grow(self, s: _Seq) -> bool:
        """Make room for one more token. Extends in place when the next hole allows (the kindest version of
        this baseline); otherwise allocates the new range while the old is still held, copies, frees the old."""
        if s.length + 1 <= s.capacity:
            return True
        size = min(self.max_context, max(2 * s.capacity, s.length + 1))
        if self.mem.try_extend(s.start, s.capacity, size - s.capacity):
            s.capacity = size
            return True
        start = self.mem.allocate(size)
        if start is None:
            return False
        self.tokens_copied += s.length
        self.mem.free(s.start, s.capacity)
        s.start, s.capacity = start, size
        return True

    def release(self, s: _Seq) -> None:
        self.mem.free(s.start, s.capacity)
        s.capacity = 0


class _Paged:
    def __init__(self, pool_tokens: int, block_size: int):
        self.alloc = BlockAllocator(pool_tokens // block_size, block_size)
        self.bs, self.tokens_copied = block_size, 0

    @property
    def allocated(self) -> int:
        return self.alloc.num_used * self.bs

    def admit(self, s: _Seq) -> bool:
        need = _ceil_div(s.length + 1, self.bs)   # the prompt and the token this step writes
        if need > self.alloc.num_free:
            return False
        s.blocks = [self.alloc.allocate() for _ in range(need)]
        return True

    def grow(self, s: _Seq) -> bool:
        if s.length + 1 <= len(s.blocks) * self.bs:
            return True
        if not self.alloc.num_free:
            return False
        s.blocks.append(self.alloc.allocate())
        return True

    def release(self, s: _Seq) -> None:
        for b in s.blocks:
            self.alloc.free(b)
        s.blocks = []


@dataclass(frozen=True)
class ServingStats:
    strategy: str
    pool_tokens: int
    steps: int                      # decode steps to finish the trace; each running sequence writes 1 token a step
    tokens_generated: int
    memory_bound_steps: int         # steps where memory was the limit: the queue's head did not fit, or a preemption
    memory_bound_tokens: int        # tokens generated during those steps
    idle_fraction: float            # mean of 1 - live tokens / pool, over the memory-bound steps
    reserved_unused_fraction: float  # ... of which allocated to a sequence but holding no token (internal)
    free_fraction: float            # ... of which not allocated, yet too small or scattered for the next request
    idle_fraction_all_steps: float  # the same mean over every step, including the final drain
    reserved_unused_per_seq: float  # mean allocated-but-empty slots per running sequence
    max_reserved_unused_per_seq: float
    tokens_copied: int              # K/V token slots copied by reallocation
    preemptions: int                # sequences evicted (and later recomputed) because memory ran out
    recomputed_tokens: int          # tokens prefilled again after preemption
    max_concurrent: int
    mean_concurrent: float

    @property
    def tokens_per_step(self) -> float:
        """Throughput proxy over the whole trace, taking a decode step's cost as independent of batch size
        (true while decode is memory-bound) and prefill as free. Dominated by the final drain on short traces:
        the last long answers finish alone."""
        return self.tokens_generated / self.steps

    @property
    def memory_bound_tokens_per_step(self) -> float:
        """The same proxy in steady state: over the steps where memory, not a lack of work, was the limit."""
        return self.memory_bound_tokens / self.memory_bound_steps if self.memory_bound_steps else float("nan")


def _serve(trace: Sequence[Request], mem, strategy: str, pool_tokens: int, max_running: int | None) -> ServingStats:
    """Strict FCFS serving: admit from the head of the queue while memory allows; every running sequence writes
    one token per step; a sequence that cannot grow preempts the youngest running one (recompute: it goes back
    to the front of the queue and prefills its prompt plus what it had generated); finished sequences free."""
    waiting = deque(_Seq(r) for r in trace)
    running: list[_Seq] = []
    steps = generated = preemptions = recomputed = max_conc = 0
    conc_sum = idle_all = 0.0
    bound_steps = bound_tokens = 0
    idle_b = unused_b = free_b = 0.0
    waste_sum, waste_max = 0.0, 0.0
    while waiting or running:
        bound = False   # did memory, rather than the queue or max_running, limit this step?
        while waiting and (max_running is None or len(running) < max_running):
            if not mem.admit(waiting[0]):
                bound = True
                break
            running.append(waiting.popleft())
        if not running:
            raise ValueError(f"request {waiting[0].req.rid} ({waiting[0].length + 1} tokens) cannot fit in an "
                             f"empty pool of {pool_tokens} slots under {strategy!r}")
        i = 0
        while i < len(running):
            s = running[i]
            if mem.grow(s):
                s.length += 1
                s.generated += 1
                i += 1
                continue
            victim = running.pop()   # the youngest; s itself when s is the youngest
            mem.release(victim)
            waiting.appendleft(victim)
            preemptions += 1
            bound = True
            recomputed += victim.length
        # measure after this step's writes, before the finished sequences free their memory
        live = sum(s.length for s in running)
        allocated = mem.allocated
        steps += 1
        generated += len(running)
        conc_sum += len(running)
        max_conc = max(max_conc, len(running))
        idle_all += 1 - live / pool_tokens
        waste = (allocated - live) / len(running) if running else 0.0
        waste_sum += waste
        waste_max = max(waste_max, waste)
        if bound:
            bound_steps += 1
            bound_tokens += len(running)
            idle_b += 1 - live / pool_tokens
            unused_b += (allocated - live) / pool_tokens
            free_b += (pool_tokens - allocated) / pool_tokens
        done = [s for s in running if s.generated >= s.req.output_len]
        for s in done:
            mem.release(s)
        running = [s for s in running if s.generated < s.req.output_len]
    nb = bound_steps or float("nan")   # never memory-bound (e.g. max_running was the limit): no idle memory to blame
    return ServingStats(strategy=strategy, pool_tokens=pool_tokens, steps=steps, tokens_generated=generated,
                        memory_bound_steps=bound_steps, memory_bound_tokens=bound_tokens,
                        idle_fraction=idle_b / nb, reserved_unused_fraction=unused_b / nb, free_fraction=free_b / nb,
                        idle_fraction_all_steps=idle_all / steps, reserved_unused_per_seq=waste_sum / steps,
                        max_reserved_unused_per_seq=waste_max, tokens_copied=mem.tokens_copied,
                        preemptions=preemptions, recomputed_tokens=recomputed, max_concurrent=max_conc,
                        mean_concurrent=conc_sum / steps)


CONTIGUOUS_STRATEGIES = ("reserve_max", "grow_copy", "guess")


def simulate_contiguous(trace: Sequence[Request], pool_tokens: int, strategy: str, max_context: int = 4096,
                        guess_output: int | None = None, max_running: int | None = None) -> ServingStats:
    """Serve ``trace`` with one contiguous range per sequence, first fit over ``pool_tokens`` slots.

    * ``reserve_max``: reserve ``max_context`` slots per sequence (the server
      cannot know the answer's length), never grow.
    * ``grow_copy``: reserve what the sequence holds now, and on overflow double
      (up to max_context), in place if possible, else reallocate and copy.
    * ``guess``: reserve prompt + ``guess_output`` (default: the trace's mean
      output length, which a server could measure), then grow as grow_copy.
    """
    if strategy not in CONTIGUOUS_STRATEGIES:
        raise ValueError(f"strategy must be one of {CONTIGUOUS_STRATEGIES}, got {strategy!r}")
    if max(r.prompt_len + r.output_len for r in trace) > max_context:
        raise ValueError(f"a request in the trace is longer than max_context={max_context}")
    if guess_output is None:
        guess_output = round(float(np.mean([r.output_len for r in trace])))
    initial = {"reserve_max": lambda s: max_context,
               "grow_copy": lambda s: s.length + 1,
               "guess": lambda s: min(max_context, max(s.length + 1, s.req.prompt_len + guess_output))}[strategy]
    return _serve(trace, _Contiguous(pool_tokens, max_context, initial), strategy, pool_tokens, max_running)


def simulate_paged(trace: Sequence[Request], pool_tokens: int, block_size: int = 16,
                   max_running: int | None = None) -> ServingStats:
    """Serve ``trace`` from ``pool_tokens // block_size`` blocks: the same loop, block allocation."""
    return _serve(trace, _Paged(pool_tokens, block_size), "paged", pool_tokens, max_running)


def compare_strategies(trace: Sequence[Request], pool_tokens: int, block_size: int = 16, max_context: int = 4096,
                       max_running: int | None = None) -> dict[str, ServingStats]:
    """Every contiguous strategy and paging on the same trace and pool."""
    out = {s: simulate_contiguous(trace, pool_tokens, s, max_context, max_running=max_running)
           for s in CONTIGUOUS_STRATEGIES}
    out["paged"] = simulate_paged(trace, pool_tokens, block_size, max_running)
    return out


# ---------------------------------------------------------------------------------------------------------
# Prefix sharing: many agents behind one system prompt.
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PromptRequest:
    rid: int
    tokens: tuple[int, ...]   # system prompt followed by this request's own part
    output_len: int


def agent_workload(n_agents: int, system_prompt_len: int, user_len: int, seed: int = 0, output_len: int = 64,
                   vocab_size: int = 32000) -> list[PromptRequest]:
    """``n_agents`` requests with the same ``system_prompt_len`` tokens in front of ``user_len`` tokens of their own."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, _check_count("system_prompt_len", system_prompt_len, 0)).tolist()
    user_len = _check_count("user_len", user_len)   # >= 1: the last prompt token is always computed
    return [PromptRequest(i, tuple(system + rng.integers(0, vocab_size, user_len).tolist()), output_len)
            for i in range(_check_count("n_agents", n_agents))]


@dataclass(frozen=True)
class PrefixSharingStats:
    n_requests: int
    concurrent: bool
    peak_blocks_shared: int      # most blocks in use at once, with prefix caching
    peak_blocks_unshared: int    # ... without
    prefill_tokens_shared: int   # prompt tokens whose K/V had to be computed, with prefix caching
    prefill_tokens_unshared: int

    @property
    def memory_ratio(self) -> float:
        return self.peak_blocks_unshared / self.peak_blocks_shared

    @property
    def prefill_ratio(self) -> float:
        return self.prefill_tokens_unshared / self.prefill_tokens_shared


def _run_prefix(requests: Sequence[PromptRequest], block_size: int, share: bool, concurrent: bool) -> tuple[int, int]:
    """Serve the requests one after another on a real PagedKVCache; return (peak used blocks, prefill tokens)."""
    num_blocks = sum(_ceil_div(len(r.tokens) + r.output_len, block_size) for r in requests) + 1
    cache = PagedKVCache(1, 1, 1, num_blocks, block_size)   # the values do not matter here, only the blocks
    peak = prefill = 0
    for r in requests:
        prefix = cache.lookup_prefix(r.tokens[:-1]) if share else []   # the last prompt token is always computed
        start = cache.add_sequence(r.rid, prefix)
        rest = r.tokens[start:]
        prefill += len(rest)
        cache.append(r.rid, np.zeros((1, len(rest), 1, 1), np.float32), np.zeros((1, len(rest), 1, 1), np.float32),
                     tokens=rest if share else None)
        if r.output_len:
            out = np.zeros((1, r.output_len, 1, 1), np.float32)
            # generated tokens: ids outside any prompt's vocabulary, distinct per request
            cache.append(r.rid, out, out, tokens=[-1 - r.rid] * r.output_len if share else None)
        peak = max(peak, cache.allocator.num_used)
        if not concurrent:
            cache.release(r.rid)
    return peak, prefill


def simulate_prefix_sharing(requests: Sequence[PromptRequest], block_size: int = 16,
                            concurrent: bool = True) -> PrefixSharingStats:
    """Memory and prefill work with and without content-hash prefix caching.

    ``concurrent=True``: every request stays resident (a batch of agents running
    at once), so the peak counts all of them. ``concurrent=False``: each
    finishes before the next arrives; the peak is one request, and what is
    shared is whatever the eviction policy kept cached.
    """
    shared = _run_prefix(requests, block_size, True, concurrent)
    unshared = _run_prefix(requests, block_size, False, concurrent)
    return PrefixSharingStats(len(requests), concurrent, shared[0], unshared[0], shared[1], unshared[1])
