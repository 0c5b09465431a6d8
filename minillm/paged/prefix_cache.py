"""Automatic prefix caching over a block allocator: one implementation for chapter 7's ``PagedKVCache`` and
the serving engine's ``BlockManager``.

A full block is named by the chained content hash of its tokens (:func:`~minillm.paged.allocator.block_hash`:
these tokens, after exactly this prefix). A new request looks its prompt up block by block and reuses the
longest run of named blocks that starts it, so their K/V need no computing.

Eviction policy: the hash table holds no reference. A named block whose reference count drops to 0 goes to
the back of the allocator's free list but *keeps* its name, so a later request can still find and revive it
(:meth:`PrefixCache.acquire`). It loses its name only when the allocator hands it out again
(:meth:`PrefixCache.take`), which happens in the order blocks were freed: least recently freed first. A
sequence releases its blocks last to first, so a prompt's tail is evicted before its head (the head is the
part other requests are likeliest to share).

:meth:`PrefixCache.check_invariants` is the one consistency check of the allocator, the block tables that
reference its blocks and the names: both users call it after their own per-sequence checks.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from .allocator import BlockAllocator, block_hash


class PrefixCache:
    """Names of full blocks (content hash -> block, block -> (parent hash, own hash)) over ``allocator``."""

    def __init__(self, allocator: BlockAllocator):
        self.allocator = allocator
        self._block: dict[bytes, int] = {}                      # hash -> block
        self._key: dict[int, tuple[bytes | None, bytes]] = {}   # block -> (parent hash, own hash)

    def __len__(self) -> int:
        """Named blocks, in use or free but revivable."""
        return len(self._block)

    def key(self, block: int) -> tuple[bytes | None, bytes] | None:
        """(parent hash, own hash) of a named block, or None."""
        return self._key.get(block)

    def is_named(self, block: int) -> bool:
        return block in self._key

    # -- blocks ---------------------------------------------------------------------------------------------
    def take(self) -> int:
        """A new block from the allocator; handing out a named free block is what evicts its name."""
        block = self.allocator.allocate()
        self.forget(block)
        return block

    def acquire(self, block: int) -> None:
        """Add a reference to a named block found by :meth:`match`: one more owner if it is in use, else
        revive it from the free list."""
        if self.allocator.refcount(block):
            self.allocator.incref(block)
        else:
            self.allocator.claim(block)

    def forget(self, block: int) -> None:
        """Drop a block's name, if it has one (its content is about to change)."""
        key = self._key.pop(block, None)
        if key is not None:
            del self._block[key[1]]

    # -- names ----------------------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], block_size: int) -> list[tuple[int, bytes]]:
        """(block, hash) of the longest run of named full blocks that starts ``tokens``. Only whole blocks
        match; nothing is acquired."""
        out, parent = [], None
        for i in range(len(tokens) // block_size):
            h = block_hash(parent, tokens[i * block_size:(i + 1) * block_size])
            block = self._block.get(h)
            if block is None:
                break
            out.append((block, h))
            parent = h
        return out

    def name(self, block: int, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """Name a block that just became full of ``tokens`` after the block hashed ``parent``; return its
        hash (the next block's parent). First writer wins: if another block already holds this content,
        or this block already has a name, nothing changes."""
        h = block_hash(parent, tokens)
        if h not in self._block and block not in self._key:
            self._block[h] = block
            self._key[block] = (parent, h)
        return h

    # -- checking -------------------------------------------------------------------------------------------
    def check_invariants(self, tables: Iterable[tuple[object, Sequence[int]]]) -> None:
        """AssertionError naming the first disagreement between the allocator's free list and reference
        counts, the block tables ``(owner, table)`` that reference its blocks, and the names."""
        a = self.allocator
        n = a.num_blocks
        free = a.free_blocks()
        if len(set(free)) != len(free):
            raise AssertionError(f"free list has duplicates: {free}")
        refs = [0] * n
        for owner, table in tables:
            for b in table:
                if not 0 <= b < n:
                    raise AssertionError(f"sequence {owner!r} refers to block {b} outside the pool")
                refs[b] += 1
        free_set = set(free)
        for b in range(n):
            if a.refcount(b) != refs[b]:
                raise AssertionError(f"block {b} has refcount {a.refcount(b)} but {refs[b]} block-table references")
            if (b in free_set) != (refs[b] == 0):
                raise AssertionError(f"block {b} is {'free' if b in free_set else 'not free'} with {refs[b]} "
                                     f"references")
        if len(free) + a.num_used != n:
            raise AssertionError(f"{len(free)} free + {a.num_used} used != {n} blocks")
        for h, b in self._block.items():
            if self._key.get(b, (None, None))[1] != h:
                raise AssertionError(f"prefix cache maps a hash to block {b}, whose own key disagrees")
        if len(self._key) != len(self._block):
            raise AssertionError("prefix cache and its reverse map differ in size")
