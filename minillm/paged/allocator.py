"""Chapter 7: the block allocator -- block ids, reference counts, and the content hash of a full block.

The pool is cut into ``num_blocks`` blocks of ``block_size`` token slots. This
module knows only ids: no K/V arrays live here, so the same allocator serves the
NumPy cache (:mod:`minillm.paged.cache`), the serving engine's block manager
(:mod:`minillm.serving.block_manager`) and the simulators that only count.

* ``BlockAllocator``: a free list and a reference count per block. A sequence
  takes a new block only when it crosses a block boundary, so it wastes at most
  ``block_size - 1`` slots, and any free block fits any sequence (no external
  fragmentation).
* ``block_hash``: the chained content hash that names a full block for prefix
  caching.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Sequence

import numpy as np


class OutOfBlocks(RuntimeError):
    """The pool has fewer free blocks than an operation needs. Nothing was changed.

    Whether to wait, preempt a sequence or swap it out is the caller's (the
    scheduler's) decision, so this is an exception and not a policy.
    """

    def __init__(self, message: str, *, requested: int | None = None, free: int | None = None):
        super().__init__(message)
        self.requested, self.free = requested, free


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_count(name: str, value, minimum: int = 1) -> int:
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
        self.num_blocks = check_count("num_blocks", num_blocks)
        self.block_size = check_count("block_size", block_size)
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

    def check_block(self, block) -> int:
        """``block`` as an int, or ValueError unless it is one of the pool's block ids."""
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or not 0 <= block < self.num_blocks:
            raise ValueError(f"unknown block {block!r}: the pool has blocks 0..{self.num_blocks - 1}")
        return int(block)

    def refcount(self, block: int) -> int:
        return self._refs[self.check_block(block)]

    def allocate(self) -> int:
        """A free block with reference count 1."""
        # BEGIN SOLUTION
        if not self._free:
            raise OutOfBlocks(f"requested 1 block, 0 free of {self.num_blocks}", requested=1, free=0)
        block, _ = self._free.popitem(last=False)
        self._refs[block] = 1
        return block
        # END SOLUTION

    def claim(self, block: int) -> None:
        """Take one particular free block (reference count 0 -> 1)."""
        block = self.check_block(block)
        if self._refs[block]:
            raise ValueError(f"block {block} is in use (refcount {self._refs[block]}), not free; use incref")
        del self._free[block]
        self._refs[block] = 1

    def incref(self, block: int) -> None:
        """Add an owner to a block that is in use (a fork, a reused prefix)."""
        # BEGIN SOLUTION
        block = self.check_block(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is free; a reference to it would dangle (use allocate or claim)")
        self._refs[block] += 1
        # END SOLUTION

    def decref(self, block: int) -> None:
        """Drop one reference; the last one returns the block to the back of the free list."""
        # BEGIN SOLUTION
        block = self.check_block(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is already free (double free)")
        self._refs[block] -= 1
        if not self._refs[block]:
            self._free[block] = None
        # END SOLUTION

    def drop_tail(self, table: list, keep: int) -> None:
        """Drop one reference to each block of ``table`` past its first ``keep`` (last block first, so the
        free list gets them back in the order they were taken) and cut them from ``table``: the rollback of
        the paged cache and of the serving block manager, and the block manager's release (``keep`` = 0)."""
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or not 0 <= keep <= len(table):
            raise ValueError(f"keep must be an integer in [0, {len(table)}], got {keep!r}")
        tail = [self.check_block(b) for b in table[keep:]]
        if any(not self._refs[b] for b in tail):  # check all before changing any: no half-done rollback
            raise ValueError(f"blocks {[b for b in tail if not self._refs[b]]} are already free (double free)")
        for block in reversed(tail):
            self.decref(block)
        del table[keep:]

    def free(self, block: int) -> None:
        """Return an unshared block. Freeing a shared one would leave other owners dangling, so that is an error."""
        # BEGIN SOLUTION
        block = self.check_block(block)
        if not self._refs[block]:
            raise ValueError(f"block {block} is already free (double free)")
        if self._refs[block] > 1:
            raise ValueError(f"block {block} has {self._refs[block]} owners; each must decref it")
        self.decref(block)
        # END SOLUTION


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
