"""One engine step's metadata: the ragged batch the model runs (flash-attn's varlen layout).

Sequence s contributes ``num_new[s]`` tokens, laid end to end in ``input_ids``; ``cu_seqlens_q`` holds
the offsets. Each token carries its absolute position and the pool slot its K/V goes to
(``block * block_size + offset``). ``block_tables`` and ``context_lens`` tell attention where each
sequence's whole context lives. A decode is a sequence with one new token, so one step can mix decodes
and prefill chunks. ``sample[s]`` says whether the step reaches the end of sequence s's tokens, i.e.
whether its last row's logits give it a new token (a prefill chunk in the middle of a prompt does not).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sequence import Sequence


@dataclass
class StepBatch:
    seqs: list[Sequence]
    num_new: np.ndarray        # (S,) tokens per sequence this step
    input_ids: np.ndarray      # (T,) int64
    positions: np.ndarray      # (T,) int64
    slot_mapping: np.ndarray   # (T,) int64
    block_tables: np.ndarray   # (S, max_blocks) int32, padded with 0 (never read past context_lens)
    context_lens: np.ndarray   # (S,) int32, the new tokens included
    cu_seqlens_q: np.ndarray   # (S+1,) int32
    sample: np.ndarray         # (S,) bool

    @classmethod
    def build(cls, seqs: list[Sequence], num_new: list[int], block_size: int) -> "StepBatch":
        if not seqs or len(seqs) != len(num_new):
            raise ValueError("a step needs at least one sequence and one count per sequence")
        ids, pos, slots = [], [], []
        for s, n in zip(seqs, num_new):
            start = s.num_computed
            if n < 1 or start + n > len(s):
                raise ValueError(f"sequence {s.seq_id}: cannot compute tokens {start}..{start + n - 1} of {len(s)}")
            p = np.arange(start, start + n)
            table = np.asarray(s.block_table, np.int64)
            if len(table) * block_size < start + n:
                raise ValueError(f"sequence {s.seq_id} has {len(table)} blocks for {start + n} tokens")
            ids.extend(s.token(i) for i in range(start, start + n))
            pos.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
        width = max(len(s.block_table) for s in seqs)
        tables = np.zeros((len(seqs), width), np.int32)
        for row, s in enumerate(seqs):
            tables[row, :len(s.block_table)] = s.block_table
        num_new = np.asarray(num_new, np.int64)
        ctx = np.array([s.num_computed + n for s, n in zip(seqs, num_new)], np.int32)
        return cls(seqs=list(seqs), num_new=num_new, input_ids=np.asarray(ids, np.int64),
                   positions=np.concatenate(pos).astype(np.int64), slot_mapping=np.concatenate(slots),
                   block_tables=tables, context_lens=ctx,
                   cu_seqlens_q=np.concatenate([[0], np.cumsum(num_new)]).astype(np.int32),
                   sample=np.array([s.num_computed + n == len(s) for s, n in zip(seqs, num_new)]))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_decode_tokens(self) -> int:
        return int(sum(1 for s in self.seqs if s.is_decoding))

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens
