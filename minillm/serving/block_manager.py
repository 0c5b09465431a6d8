"""Block ids and prefix hashes for the engine's sequences -- no tensors (nano-vllm's ``block_manager.py``).

The runner owns the K/V pools; this class only decides which physical block holds which logical block
of which sequence. It grows a sequence's block table as the scheduler schedules its tokens, names every
block that becomes full, and at admission hands a new sequence the longest run of cached full blocks that
starts its prompt (automatic prefix caching). The names, the lookup and the eviction policy are chapter 7's:
:class:`minillm.paged.prefix_cache.PrefixCache`, the same object ``PagedKVCache`` uses (a cached block whose
last user finishes is freed but keeps its name until the allocator hands it out again, so a later request
can revive it), and so is the consistency check.

A prompt that is entirely cached still recomputes its last token: only prompt[:-1] is looked up, because
the next token's logits come from the last prompt token's forward pass.
"""
from __future__ import annotations

from ..paged.allocator import BlockAllocator, OutOfBlocks, ceil_div
from ..paged.prefix_cache import PrefixCache
from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.num_blocks, self.block_size = self.allocator.num_blocks, self.allocator.block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self.prefix_cache = PrefixCache(self.allocator)
        self._chain: dict[int, list[bytes]] = {}  # seq_id -> hashes of its full blocks, in order
        self.prefix_hit_tokens = 0               # prompt tokens served from the cache, summed over admissions
        self.prefix_query_tokens = 0             # prompt tokens looked up

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def blocks_for(self, n_tokens: int) -> int:
        return ceil_div(n_tokens, self.block_size)

    def blocks_needed(self, seq: Sequence, n_tokens: int) -> int:
        """New blocks ``seq`` needs so that its first ``n_tokens`` tokens have slots."""
        return max(0, self.blocks_for(n_tokens) - len(seq.block_table))

    def can_grow(self, seq: Sequence, n_tokens: int) -> bool:
        """Can ``seq`` get slots for its first ``n_tokens`` tokens now? (Any free block will do.)"""
        return self.blocks_needed(seq, n_tokens) <= self.allocator.num_free

    def match_prefix(self, seq: Sequence) -> int:
        """Give a sequence with no blocks the cached blocks of its longest cached prefix; return its tokens."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already has blocks")
        self._chain[seq.seq_id] = []
        if not self.enable_prefix_caching:
            return 0
        chain, tokens = self._chain[seq.seq_id], seq.tokens
        lookup = len(tokens) - 1                # the last token is always computed
        for block, h in self.prefix_cache.match(tokens[:lookup], self.block_size):
            self.prefix_cache.acquire(block)     # in use: one more owner; free but still named: revive it
            seq.block_table.append(block)
            chain.append(h)
        hit = len(seq.block_table) * self.block_size
        self.prefix_hit_tokens += hit
        self.prefix_query_tokens += lookup
        return hit

    def allocate(self, seq: Sequence, n_tokens: int) -> None:
        """Grow ``seq``'s table to cover ``n_tokens`` tokens. All or nothing (raises OutOfBlocks first)."""
        need = self.blocks_needed(seq, n_tokens)
        if need > self.allocator.num_free:
            raise OutOfBlocks(f"sequence {seq.seq_id} needs {need} blocks, {self.allocator.num_free} free",
                              requested=need, free=self.allocator.num_free)
        seq.block_table.extend(self.prefix_cache.take() for _ in range(need))
        self._chain.setdefault(seq.seq_id, [])

    def register(self, seq: Sequence) -> None:
        """Name the blocks that became full of computed tokens (call after the step that computed them)."""
        if not self.enable_prefix_caching:
            return
        bs, chain = self.block_size, self._chain.setdefault(seq.seq_id, [])
        for i in range(len(chain), seq.num_computed // bs):   # first writer wins
            chain.append(self.prefix_cache.name(seq.block_table[i], chain[-1] if chain else None,
                                                [seq.token(j) for j in range(i * bs, (i + 1) * bs)]))

    def free(self, seq: Sequence) -> None:
        """Drop one reference to each of the sequence's blocks, last block first (its tail is evicted first)."""
        self.allocator.drop_tail(seq.block_table, 0)
        self._chain.pop(seq.seq_id, None)

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        """Keep the blocks of the first ``n_tokens`` tokens (speculative decoding rolls back this way)."""
        if not 0 <= n_tokens <= len(seq.block_table) * self.block_size:
            raise ValueError(f"cannot truncate sequence {seq.seq_id} to {n_tokens} tokens")
        keep = self.blocks_for(n_tokens)
        if n_tokens % self.block_size and keep:
            last = seq.block_table[keep - 1]
            if self.prefix_cache.is_named(last):
                if self.allocator.refcount(last) > 1:
                    raise ValueError(f"sequence {seq.seq_id}: the cut at {n_tokens} falls inside block {last}, "
                                     f"which other sequences share; a rollback never reaches a shared block")
                self.prefix_cache.forget(last)    # its tail is about to be overwritten
        self.allocator.drop_tail(seq.block_table, keep)
        del self._chain.setdefault(seq.seq_id, [])[n_tokens // self.block_size:]

    def check_invariants(self, seqs) -> None:
        """AssertionError if a sequence has too few blocks for its computed tokens, or if refcounts, the free
        list, the tables and the prefix cache's names disagree (:meth:`PrefixCache.check_invariants`)."""
        seqs = list(seqs)
        for s in seqs:
            if len(s.block_table) < self.blocks_for(s.num_computed):
                raise AssertionError(f"sequence {s.seq_id} has {s.num_computed} computed tokens in "
                                     f"{len(s.block_table)} blocks of {self.block_size}")
        self.prefix_cache.check_invariants((s.seq_id, s.block_table) for s in seqs)
