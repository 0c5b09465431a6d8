"""The baseline PagedAttention replaced: one contiguous range of K/V slots per sequence (chapter 7's study).

``ContiguousManager`` is a memory manager the :class:`~minillm.serving.scheduler.Scheduler` can use instead
of the paged :class:`~minillm.serving.block_manager.BlockManager`. To the scheduler it looks like a block
manager with one-slot blocks: a sequence's ``block_table`` is ``range(start, start + size)``, its range in
one linear address space of ``num_slots`` slots, handed out first fit by :class:`FirstFitAllocator`.

How big a range is, is the strategy:

* ``reserve_max``: ``max_context`` slots at admission (the server cannot know the answer's length);
  never grows.
* ``grow_copy``: what the step being scheduled needs; on overflow the range doubles (up to
  ``max_context``), in place when the hole right after it is large enough, else a new range is taken
  while the old one is still held, the sequence's K/V is copied, and the old range is freed.
* ``guess``: prompt + ``guess_output`` slots at admission, then grows as ``grow_copy``.

Unlike the paged manager, "enough free slots" does not mean "it fits": first fit fails when no single
hole is large enough (external fragmentation), so the scheduler asks :meth:`can_grow`, not a free count.
Moves are counted (``tokens_copied``), not performed: this manager is for the simulated runner, which
holds no K/V. (``reserve_max`` never moves, so it would also drive a real runner with ``block_size=1``.)
There is no prefix caching.
"""
from __future__ import annotations

from ..paged.allocator import OutOfBlocks, check_count
from .sequence import Sequence

STRATEGIES = ("reserve_max", "grow_copy", "guess")


class FirstFitAllocator:
    """Contiguous ranges of a linear address space of ``capacity`` slots, first fit.

    Holes are kept sorted by address and merged with their neighbours on free.
    ``allocate`` returns None when no single hole is large enough, even if the
    free slots add up to enough: that is external fragmentation.
    """

    def __init__(self, capacity: int):
        self.capacity = check_count("capacity", capacity)
        self.holes: list[list[int]] = [[0, self.capacity]]   # [start, size], sorted by start
        self.ranges: dict[int, int] = {}                       # start -> size of each range handed out
        self.free_slots = self.capacity

    def fits(self, size: int) -> bool:
        """Would ``allocate(size)`` succeed?"""
        size = check_count("size", size)
        return any(hole[1] >= size for hole in self.holes)

    def allocate(self, size: int) -> int | None:
        """The start of a new range of ``size`` (an integer >= 1) slots, first fit; None if no hole is large enough."""
        size = check_count("size", size)
        for hole in self.holes:
            if hole[1] >= size:
                start = hole[0]
                self._take(hole, size)
                self.ranges[start] = size
                return start
        return None

    def _take(self, hole: list[int], n: int) -> None:
        """Use the first ``n`` slots of ``hole``; drop the hole once it is empty."""
        hole[0] += n
        hole[1] -= n
        if not hole[1]:
            self.holes.remove(hole)
        self.free_slots -= n

    def _hole_after(self, start: int, size: int) -> list[int] | None:
        for hole in self.holes:
            if hole[0] == start + size:
                return hole
            if hole[0] > start + size:
                break
        return None

    def can_extend(self, start: int, size: int, extra: int) -> bool:
        """Would ``try_extend(start, size, extra)`` succeed?"""
        extra = check_count("extra", extra)
        hole = self._hole_after(start, size)
        return hole is not None and hole[1] >= extra

    def try_extend(self, start: int, size: int, extra: int) -> bool:
        """Grow the range [start, start+size) in place by ``extra`` slots if the hole right after it allows.
        [start, start+size) must be a range handed out (ValueError otherwise)."""
        extra = check_count("extra", extra)
        if self.ranges.get(start) != size:
            raise ValueError(f"cannot extend [{start}, {start + size}): not a range this allocator handed out")
        hole = self._hole_after(start, size)
        if hole is None or hole[1] < extra:
            return False
        self._take(hole, extra)
        self.ranges[start] = size + extra
        return True

    def free(self, start: int, size: int) -> None:
        """Return the range [start, start+size) to the holes: a range handed out, or the tail of one (what is left
        of it stays handed out). Anything else -- a range freed twice, never handed out, the middle or the head
        of one, or across two -- would corrupt the holes: ValueError."""
        start, size = check_count("start", start, 0), check_count("size", size)
        if start + size > self.capacity:
            raise ValueError(f"cannot free [{start}, {start + size}): the address space has {self.capacity} slots")
        owner = next((a for a, n in self.ranges.items() if a <= start < a + n), None)
        if owner is None or start + size != owner + self.ranges[owner]:
            held = "" if owner is None else f" (the range handed out there is [{owner}, {owner + self.ranges[owner]}))"
            raise ValueError(f"cannot free [{start}, {start + size}): not a range handed out, nor the tail of "
                             f"one{held}: a double free, or a range never allocated")
        if start == owner:
            del self.ranges[owner]
        else:
            self.ranges[owner] = start - owner
        i = 0
        while i < len(self.holes) and self.holes[i][0] < start:
            i += 1
        self.holes.insert(i, [start, size])
        if i + 1 < len(self.holes) and start + size == self.holes[i + 1][0]:   # merge with the next hole
            self.holes[i][1] += self.holes.pop(i + 1)[1]
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == start:     # and with the previous one
            self.holes[i - 1][1] += self.holes.pop(i)[1]
        self.free_slots += size


class ContiguousManager:
    """One contiguous range per sequence, first fit over ``num_slots`` slots; the same interface as
    ``BlockManager`` with ``block_size = 1`` (a range is a block table of consecutive one-slot blocks)."""

    block_size = 1
    enable_prefix_caching = False
    prefix_hit_tokens = prefix_query_tokens = 0

    def __init__(self, num_slots: int, strategy: str = "grow_copy", max_context: int | None = None,
                 guess_output: int | None = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.mem = FirstFitAllocator(num_slots)
        self.num_blocks = self.mem.capacity
        self.strategy = strategy
        self.max_context = self.num_blocks if max_context is None else check_count("max_context", max_context)
        if strategy == "guess" and guess_output is None:
            raise ValueError("the 'guess' strategy needs guess_output (the output length it reserves for)")
        self.guess_output = 0 if guess_output is None else check_count("guess_output", guess_output, 0)
        self.tokens_copied = 0          # K/V token slots copied by moves to a new range
        self.num_moves = 0

    @property
    def num_free(self) -> int:
        return self.mem.free_slots

    def blocks_for(self, n_tokens: int) -> int:
        """Slots a sequence of ``n_tokens`` tokens may need at its longest (the scheduler rejects a request
        for which this exceeds the pool): its tokens, or the whole reservation under ``reserve_max``."""
        return max(n_tokens, self.max_context) if self.strategy == "reserve_max" else n_tokens

    def blocks_needed(self, seq: Sequence, n_tokens: int) -> int:
        """Slots ``seq``'s range lacks for ``n_tokens`` tokens (a lower bound on what growing it takes)."""
        return max(0, n_tokens - len(seq.block_table))

    def can_allocate(self, n_slots: int) -> bool:
        """Are ``n_slots`` slots free in total? Necessary, not sufficient: see :meth:`can_grow`."""
        return n_slots <= self.mem.free_slots

    def _target(self, seq: Sequence, n_tokens: int) -> int:
        """The range size ``seq`` moves to when it needs ``n_tokens`` slots and has fewer."""
        size = len(seq.block_table)
        if not size:
            want = {"reserve_max": self.max_context, "grow_copy": n_tokens,
                    "guess": len(seq.prompt) + self.guess_output}[self.strategy]
        else:
            want = 2 * size
        return max(n_tokens, min(want, self.max_context, self.num_blocks))

    def can_grow(self, seq: Sequence, n_tokens: int) -> bool:
        """Can ``seq``'s range be made to cover ``n_tokens`` slots right now (in place, or by a move)?"""
        table = seq.block_table
        if n_tokens <= len(table):
            return True
        size = self._target(seq, n_tokens)
        if table and self.mem.can_extend(table.start, len(table), size - len(table)):
            return True
        return self.mem.fits(size)

    def allocate(self, seq: Sequence, n_tokens: int) -> None:
        """Make ``seq``'s range cover ``n_tokens`` slots. All or nothing (raises OutOfBlocks first)."""
        table = seq.block_table
        if n_tokens <= len(table):
            return
        size = self._target(seq, n_tokens)
        if table and self.mem.try_extend(table.start, len(table), size - len(table)):
            seq.block_table = range(table.start, table.start + size)
            return
        start = self.mem.allocate(size)      # the old range is still held while the new one is taken
        if start is None:
            raise OutOfBlocks(f"sequence {seq.seq_id} needs a range of {size} slots; {self.mem.free_slots} are "
                              f"free but no hole is that large", requested=size, free=self.mem.free_slots)
        if table:
            self.tokens_copied += seq.num_computed
            self.num_moves += 1
            self.mem.free(table.start, len(table))
        seq.block_table = range(start, start + size)

    def match_prefix(self, seq: Sequence) -> int:
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already has a range")
        return 0                             # no prefix caching

    def register(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        table = seq.block_table
        if table:
            self.mem.free(table.start, len(table))
        seq.block_table = []

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        """Keep the first ``n_tokens`` slots of ``seq``'s range; the tail goes back to the pool."""
        table = seq.block_table
        if not 0 <= n_tokens <= len(table):
            raise ValueError(f"cannot truncate sequence {seq.seq_id} to {n_tokens} tokens")
        if n_tokens < len(table):
            self.mem.free(table.start + n_tokens, len(table) - n_tokens)
        seq.block_table = range(table.start, table.start + n_tokens) if n_tokens else []

    def check_invariants(self, seqs) -> None:
        """AssertionError unless the sequences' ranges and the holes tile the address space exactly."""
        spans = []
        for s in seqs:
            t = s.block_table
            if len(t) < s.num_computed:
                raise AssertionError(f"sequence {s.seq_id} has {s.num_computed} computed tokens in {len(t)} slots")
            if t:
                if not isinstance(t, range) or t.step != 1:
                    raise AssertionError(f"sequence {s.seq_id}: table {t!r} is not a contiguous range")
                spans.append((t.start, len(t), f"sequence {s.seq_id}"))
        spans += [(h[0], h[1], "a hole") for h in self.mem.holes]
        spans.sort()
        at = 0
        for start, size, what in spans:
            if size < 1 or start != at:
                raise AssertionError(f"{what} at [{start}, {start + size}) does not continue the tiling at {at}")
            at = start + size
        if at != self.num_blocks:
            raise AssertionError(f"ranges and holes cover {at} of {self.num_blocks} slots")
        if sum(h[1] for h in self.mem.holes) != self.mem.free_slots:
            raise AssertionError("the free count disagrees with the holes")
        for a, b in zip(self.mem.holes, self.mem.holes[1:]):
            if a[0] + a[1] == b[0]:
                raise AssertionError(f"adjacent holes at {a[0]} and {b[0]} were not merged")
