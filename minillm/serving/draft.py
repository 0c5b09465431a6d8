"""A draft model inside the engine: batched drafting for every speculating sequence of a step.

The scheduler reserves ``k`` draft slots for a decoding sequence (``StepBatch.drafts`` holds -1
placeholders) and allocates blocks for ``1 + k`` new tokens. Before the step runs, the engine calls
:meth:`DraftModelProposer.propose`, which runs the draft model ``k`` times over all those sequences at once:

1. a ragged catch-up pass: each sequence feeds the tokens its draft cache is missing (usually the last
   one or two: the token the target just emitted, and after a fully accepted round the last draft too;
   the whole context the first time) and samples d_1 from the last row;
2. ``k - 1`` decode passes, each feeding the previous draft token and sampling the next one. When every
   sequence drafts the same ``k`` and the runner offers a ``decode_chain`` (the torch runner), the positions,
   lengths and slots of these passes advance on the device, with no host work between passes.

The draft model's K/V pool mirrors the target's block layout: the same block ids and slots, so it needs no
block manager of its own. A sequence's blocks already cover positions up to ``len(seq) + k - 1``, and the
draft writes at most up to ``len(seq) + k - 2``. Rolling back is free: after verification the draft's
valid length is ``min(what it wrote, seq.num_computed)``, because the accepted tokens are exactly the
drafts it fed, and anything past that is overwritten next time. The engine calls :meth:`commit` after
every step to fix that length there: in a later step without drafts (the budget went to other work) the
target computes the token after the accepted ones while the draft pool still holds a rejected draft's K/V
at that position, so the draft's valid length must not grow with ``num_computed``. A preempted sequence
loses its blocks, so its draft cache starts again from zero.

Sampling: greedy rows take the draft's argmax; other rows draw from q (shaped like p, by
``minillm.sampling.shape_logits``) with the request's own DRAFT random stream, and q goes to the target's
verifier (``StepBatch.draft_probs``) for the min(1, p/q) test. The draft runner is a ``NumpyRunner`` or a
``TorchRunner`` built for the draft model with the target's ``num_blocks`` and ``block_size``.
"""
from __future__ import annotations

import numpy as np

from .batch import RaggedStep, StepBatch, slot_mapping
from .interfaces import DraftRunner
from .runner import seq_sampling_arrays
from .sequence import Sequence


class DraftModelProposer:
    """A draft model as the engine's :class:`~minillm.serving.interfaces.Drafter`."""

    def __init__(self, runner: DraftRunner):
        if not isinstance(runner, DraftRunner):
            raise TypeError(f"a draft runner is a DraftRunner (NumpyRunner or TorchRunner: logits, draft, zeros, "
                            f"index, host, decode_chain), got {type(runner).__name__}")
        self.runner = runner
        self.config = runner.model.config
        self.block_size = int(runner.block_size)
        self.num_blocks = int(runner.k_pool.shape[1])
        self._written: dict[int, tuple[int, int]] = {}   # seq_id -> (preemptions then, tokens with draft K/V)
        self.calls = 0                                    # draft forward passes

    def check_target(self, vocab_size: int, max_model_len: int, num_blocks: int, block_size: int) -> None:
        """Raise unless this draft model can serve an engine with these settings."""
        cfg = self.config
        if cfg.vocab_size != vocab_size:
            raise ValueError(f"the draft model's vocabulary ({cfg.vocab_size}) differs from the target's "
                             f"({vocab_size}): drafts would be ids of another tokenizer")
        if cfg.max_seq_len < max_model_len:
            raise ValueError(f"the draft model holds {cfg.max_seq_len} positions, fewer than the target's "
                             f"{max_model_len}")
        if self.block_size != block_size or self.num_blocks < num_blocks:
            raise ValueError(f"the draft pool ({self.num_blocks} blocks of {self.block_size}) must mirror the "
                             f"target's ({num_blocks} blocks of {block_size})")

    def draft(self, seq: Sequence, k: int) -> list[int]:
        """``k`` placeholders: the draft model fills them in :meth:`propose`, on the scheduled step's slots."""
        return [-1] * k

    def valid_tokens(self, seq: Sequence) -> int:
        """How many of ``seq``'s leading tokens have K/V in the draft pool."""
        w = self._written.get(seq.seq_id)
        if w is None or w[0] != seq.num_preemptions:
            return 0
        return min(w[1], seq.num_computed)

    def release(self, seq: Sequence) -> None:
        self._written.pop(seq.seq_id, None)

    def commit(self, seqs) -> None:
        """After a step has been verified and accounted: each sequence's draft K/V is valid only up to the
        tokens the target kept now (its ``num_computed``); later steps that the draft model does not take
        part in must not extend it."""
        for s in seqs:
            w = self._written.get(s.seq_id)
            if w is not None:
                self._written[s.seq_id] = (w[0], self.valid_tokens(s))

    def _decode_step(self, tables: np.ndarray, positions: np.ndarray) -> RaggedStep:
        """One draft token per sequence at ``positions`` (ids come from the previous pass, on the device)."""
        n = len(positions)
        return RaggedStep(np.zeros(n, np.int64), positions, slot_mapping(tables, positions, self.block_size),
                          tables, np.ones(n, np.int64))

    def _keep(self, tokens, q_all, batch, rows, active, i, tok, q) -> None:
        """Record pass i's draft tokens, and put its q rows where the verifier will read them."""
        tokens.append((active, tok))
        if q is not None:
            q_all[self.runner.index(np.array([batch.row_offsets[rows[j]] + i for j in active]))] = q

    def propose(self, batch: StepBatch) -> None:
        """Fill ``batch``'s reserved drafts (and ``draft_probs``) by running the draft model."""
        rows = [i for i, d in enumerate(batch.drafts) if d]
        if not rows:
            return
        run = self.runner
        seqs = [batch.seqs[i] for i in rows]
        ks = np.array([len(batch.drafts[i]) for i in rows])
        lens = np.array([len(s) for s in seqs])
        tables = np.zeros((len(seqs), max(len(s.block_table) for s in seqs)), np.int32)
        for j, s in enumerate(seqs):
            tables[j, :len(s.block_table)] = s.block_table
        temp, top_k, top_p, seeds = seq_sampling_arrays(seqs)
        n_out = np.array([len(s.output) for s in seqs], np.int64)
        want_q = bool((temp > 0).any())
        R = len(batch.logits_rows)
        q_all = run.zeros(R, self.config.vocab_size) if want_q else None

        # pass 0: catch up on the tokens the draft cache is missing, sample d_1
        ids, pos, slots, n_new = [], [], [], []
        for j, s in enumerate(seqs):
            v = self.valid_tokens(s)
            p = np.arange(v, lens[j])
            ids.extend(s.token(int(i)) for i in p)
            pos.append(p)
            slots.append(slot_mapping(s.block_table, p, self.block_size))
            n_new.append(len(p))
        step = RaggedStep(ids, np.concatenate(pos), np.concatenate(slots), tables, n_new)
        active = np.arange(len(seqs))
        tokens = []                                     # per pass: (indices into seqs, backend tokens)
        logits = run.logits(step)
        self.calls += 1
        prev, q = run.draft(logits, temp, top_k, top_p, seeds, n_out, want_probs=want_q)
        self._keep(tokens, q_all, batch, rows, active, 0, prev, q)
        k_max = int(ks.max())
        if k_max > 1 and (ks == k_max).all() and run.decode_chain is not None:
            # every sequence drafts k: the k - 1 decode passes advance on the device (see decode_chain)
            step = self._decode_step(tables, lens)      # d_1 is fed at position len
            chain = run.decode_chain(step, prev, k_max - 1, lambda lg, i: run.draft(
                lg, temp, top_k, top_p, seeds, n_out + 1 + i, want_probs=want_q))
            self.calls += k_max - 1
            for i, (tok, q) in enumerate(chain, start=1):
                self._keep(tokens, q_all, batch, rows, active, i, tok, q)
        else:
            for i in range(1, k_max):
                keep = ks[active] > i                   # sequences that still want a draft
                if not keep.all():
                    prev = prev[run.index(np.flatnonzero(keep))]
                active = active[keep]
                step = self._decode_step(tables[active], lens[active] + i - 1)   # d_i at position len + i - 1
                logits = run.logits(step, input_ids=prev)
                self.calls += 1
                prev, q = run.draft(logits, temp[active], top_k[active], top_p[active], seeds[active],
                                    n_out[active] + i, want_probs=want_q)
                self._keep(tokens, q_all, batch, rows, active, i, prev, q)
        drafts = [[] for _ in batch.drafts]
        for active_i, tok in tokens:                    # one trip to the host for every pass
            for j, t in zip(active_i, run.host(tok)):
                drafts[rows[j]].append(int(t))
        for j, s in enumerate(seqs):
            self._written[s.seq_id] = (s.num_preemptions, int(lens[j] + ks[j] - 1))
        batch.set_drafts(drafts, q_all)
