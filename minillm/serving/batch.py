"""One engine step's metadata: the ragged batch the model runs (flash-attn's varlen layout).

Sequence s contributes ``num_new[s]`` tokens, laid end to end in ``input_ids``; ``cu_seqlens_q`` holds
the offsets. Each token carries its absolute position and the pool slot its K/V goes to
(``block * block_size + offset``). ``block_tables`` and ``context_lens`` tell attention where each
sequence's whole context lives. A decode is a sequence with one new token, so one step can mix decodes
and prefill chunks. ``sample[s]`` says whether the step reaches the end of sequence s's tokens, i.e.
whether its last row's logits give it a new token (a prefill chunk in the middle of a prompt does not).

Speculative decoding gives a decoding sequence ``1 + len(draft)`` query rows: its last sampled token
followed by the draft tokens, all verified in this one ragged pass. ``logits_rows`` lists the rows whose
logits the runner must turn into tokens: each sequence's last row, or all ``len(draft) + 1`` rows of a
speculating one (``row_counts``), in sequence order. A prompt-lookup draft is known when the step is
scheduled; a draft model's is not (it needs the step's slots to write its own K/V), so the scheduler
reserves ``k`` placeholder tokens (-1) and the engine's proposer fills them with :meth:`StepBatch.set_drafts`
before the step runs, together with the draft probabilities q (``draft_probs``) that verification needs.

:class:`RaggedStep` is the same layout built from explicit arrays: what a draft model runs.
"""
from __future__ import annotations

import numpy as np

from .sequence import Sequence


def slot_mapping(tables, positions, block_size: int) -> np.ndarray:
    """Pool slots of ``positions``: ``tables[..., position // block_size] * block_size + position % block_size``.

    ``tables`` is one sequence's block table with ``positions`` (n,), or one table row per sequence with
    one position each (S, max_blocks) and (S,)."""
    tables, positions = np.asarray(tables, np.int64), np.asarray(positions, np.int64)
    blocks = tables[positions // block_size] if tables.ndim == 1 else \
        tables[np.arange(len(positions)), positions // block_size]
    return blocks * block_size + positions % block_size


class StepBatch:
    """Built by :meth:`build`. ``seqs``, ``num_new``, ``context_lens``, ``cu_seqlens_q`` and ``sample`` are
    computed at once; the per-token arrays (``input_ids``, ``positions``, ``slot_mapping``) and
    ``block_tables`` on first access, from the tables as they were at build time -- a runner that only
    counts (the simulated one) never pays for them."""

    seqs: list[Sequence]
    num_new: np.ndarray        # (S,) tokens per sequence this step
    context_lens: np.ndarray   # (S,) int32, the new tokens included
    cu_seqlens_q: np.ndarray   # (S+1,) int32
    sample: np.ndarray         # (S,) bool
    # input_ids (T,) int64, positions (T,) int64, slot_mapping (T,) int64,
    # block_tables (S, max_blocks) int32 padded with 0 (never read past context_lens): lazy, see below

    def __init__(self, seqs: list[Sequence], num_new, block_size: int, drafts: list[list[int]] | None = None):
        if not seqs or len(seqs) != len(num_new):
            raise ValueError("a step needs at least one sequence and one count per sequence")
        drafts = [list(d) for d in drafts] if drafts is not None else [[] for _ in seqs]
        if len(drafts) != len(seqs):
            raise ValueError("one draft list per sequence")
        starts, tables, sample, n_decode = [], [], [], 0
        for s, n, d in zip(seqs, num_new, drafts):
            start, total, table = s.num_computed, len(s) + len(d), s.block_table
            if d and not (s.is_decoding and n == len(d) + 1):
                raise ValueError(f"sequence {s.seq_id}: a draft rides only on a decode (1 + {len(d)} tokens), got {n}")
            if n < 1 or start + n > total:
                raise ValueError(f"sequence {s.seq_id}: cannot compute tokens {start}..{start + n - 1} of {total}")
            if len(table) * block_size < start + n:
                raise ValueError(f"sequence {s.seq_id} has {len(table)} blocks for {start + n} tokens")
            starts.append(start)
            tables.append(table[:])             # a snapshot (a range slices to itself)
            sample.append(start + n == total)
            n_decode += s.is_decoding
        self.seqs, self._block_size, self._starts, self._tables = list(seqs), block_size, starts, tables
        self.drafts = drafts
        self.num_new = np.asarray(num_new, np.int64)
        self.context_lens = (np.asarray(starts, np.int64) + self.num_new).astype(np.int32)
        self.cu_seqlens_q = np.concatenate([[0], np.cumsum(self.num_new)]).astype(np.int32)
        self.sample = np.asarray(sample, bool)
        self.num_tokens = int(self.cu_seqlens_q[-1])
        self.num_decode_tokens = n_decode
        self.row_counts = np.array([len(d) + 1 for d in drafts], np.int64)
        self.row_offsets = np.concatenate([[0], np.cumsum(self.row_counts)[:-1]]).astype(np.int64)
        self.logits_rows = np.concatenate([self.cu_seqlens_q[s + 1] - self.row_counts[s] + np.arange(self.row_counts[s])
                                           for s in range(len(seqs))]).astype(np.int64)
        self.num_draft_tokens = int(self.row_counts.sum()) - len(seqs)
        self.draft_probs = None      # (len(logits_rows), V) drafter probabilities per verify row, or None: one-hot
        self._arrays: dict[str, np.ndarray] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def needs_drafts(self) -> bool:
        """True while a reserved draft (placeholder -1 tokens) is waiting for a proposer."""
        return any(d and d[0] < 0 for d in self.drafts)

    def set_drafts(self, drafts: list[list[int]], draft_probs=None) -> None:
        """Fill the reserved drafts (one list per sequence, each as long as its reservation) before the step
        runs. ``draft_probs``: the drafter's probabilities, one row per entry of ``logits_rows`` (rows without
        a draft are ignored), as a NumPy array or a tensor on the runner's device."""
        if self._arrays is not None:
            raise RuntimeError("set_drafts after the step's arrays were built")
        if len(drafts) != len(self.drafts) or any(len(a) != len(b) for a, b in zip(drafts, self.drafts)):
            raise ValueError("set_drafts needs one draft per sequence, each as long as its reservation "
                             f"({[len(d) for d in self.drafts]}), got {[len(d) for d in drafts]}")
        for row, d in enumerate(drafts):
            if any(int(t) < 0 for t in d):
                raise ValueError(f"sequence {self.seqs[row].seq_id}: draft tokens must be >= 0, got {list(d)}")
        self.drafts = [[int(t) for t in d] for d in drafts]
        self.draft_probs = draft_probs

    def row_drafts(self) -> np.ndarray:
        """Per logits row: the draft token that row verifies, or -1 (a sequence's last row verifies nothing)."""
        return np.asarray([t for d in self.drafts for t in (*d, -1)], np.int64)

    def __repr__(self) -> str:
        return (f"StepBatch({len(self.seqs)} sequences, {self.num_tokens} tokens, "
                f"{self.num_decode_tokens} of them decodes)")

    @classmethod
    def build(cls, seqs: list[Sequence], num_new: list[int], block_size: int,
              drafts: list[list[int]] | None = None) -> StepBatch:
        return cls(seqs, num_new, block_size, drafts)

    def _build_arrays(self) -> dict[str, np.ndarray]:
        if self.needs_drafts:
            raise RuntimeError("this step's drafts are reserved but not filled (the engine runs the proposer)")
        bs, ids, pos, slots = self._block_size, [], [], []
        for s, n, start, table, d in zip(self.seqs, self.num_new.tolist(), self._starts, self._tables, self.drafts):
            p = np.arange(start, start + n)
            # tokens are append-only, so they are still those of build time; drafts come after them
            ids.extend(s.token(i) if i < start + n - len(d) else d[i - (start + n - len(d))]
                       for i in range(start, start + n))
            pos.append(p)
            slots.append(slot_mapping(table, p, bs))
        tables = np.zeros((len(self.seqs), max(len(t) for t in self._tables)), np.int32)
        for row, t in enumerate(self._tables):
            tables[row, :len(t)] = t
        return {"input_ids": np.asarray(ids, np.int64), "positions": np.concatenate(pos).astype(np.int64),
                "slot_mapping": np.concatenate(slots), "block_tables": tables}

    def _array(self, name: str) -> np.ndarray:
        if self._arrays is None:
            self._arrays = self._build_arrays()
        return self._arrays[name]

    @property
    def input_ids(self) -> np.ndarray:
        return self._array("input_ids")

    @property
    def positions(self) -> np.ndarray:
        return self._array("positions")

    @property
    def slot_mapping(self) -> np.ndarray:
        return self._array("slot_mapping")

    @property
    def block_tables(self) -> np.ndarray:
        return self._array("block_tables")

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens - self.num_draft_tokens

    def row_params(self):
        """Per logits row: (the sequence's index, the index of the output token this row would sample)."""
        seq_idx = np.repeat(np.arange(len(self.seqs)), self.row_counts)
        step = np.concatenate([len(s.output) + np.arange(c) for s, c in zip(self.seqs, self.row_counts)])
        return seq_idx, step.astype(np.int64)


class RaggedStep:
    """A ragged forward pass given by explicit arrays (the layout of :class:`StepBatch`): what a draft model
    runs. ``logits_rows`` defaults to each sequence's last row."""

    def __init__(self, input_ids, positions, slot_mapping, block_tables, num_new, logits_rows=None):
        self.input_ids = np.asarray(input_ids, np.int64)
        self.positions = np.asarray(positions, np.int64)
        self.slot_mapping = np.asarray(slot_mapping, np.int64)
        self.block_tables = np.asarray(block_tables, np.int32)
        self.num_new = np.asarray(num_new, np.int64)
        self.cu_seqlens_q = np.concatenate([[0], np.cumsum(self.num_new)]).astype(np.int32)
        self.num_tokens = int(self.cu_seqlens_q[-1])
        self.num_seqs = len(self.num_new)
        if not (self.input_ids.shape == self.positions.shape == self.slot_mapping.shape == (self.num_tokens,)):
            raise ValueError("input_ids, positions and slot_mapping need one entry per token")
        self.context_lens = (self.positions[self.cu_seqlens_q[1:] - 1] + 1).astype(np.int32)
        self.logits_rows = (self.cu_seqlens_q[1:] - 1).astype(np.int64) if logits_rows is None else \
            np.asarray(logits_rows, np.int64)
