"""The scheduler: which sequences run in the next step, and how many of their tokens.

One step has a token budget (``max_num_batched_tokens``) and a cap on live sequences (``max_num_seqs``).
The running sequences go first, in admission order: a decode costs one token, a sequence still
prefilling takes as many prompt tokens as the budget (and ``max_prefill_chunk``) allow. What is left of
the budget admits waiting requests first come, first served, each with a prefill chunk, so a step mixes
decodes and prefill chunks (chunked prefill, as in vLLM v1 and Sarathi).

When a running sequence needs a block and none is free, the most recently admitted running sequence is
preempted -- possibly the one asking -- by recompute: its blocks are freed, it goes back to the front of
the waiting queue, and it later prefills prompt + output again. Its tokens are kept, so greedy decoding
produces exactly what it would have without the interruption.

The memory manager is pluggable: the paged :class:`BlockManager` by default, or chapter 7's
:class:`~minillm.serving.contiguous.ContiguousManager` (one contiguous range per sequence). The scheduler
only asks it ``can_grow(seq, n_tokens)`` -- can this sequence's memory be made to cover ``n_tokens`` tokens
now? -- then ``allocate``, ``match_prefix``, ``register`` and ``free``.

A request that could never fit (its prompt plus ``max_tokens`` need more blocks than the whole pool, or
its positions would pass the model's ``max_seq_len``) is rejected when it is added, with a clear error;
nothing else is touched.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .batch import StepBatch
from .block_manager import BlockManager
from .contiguous import ContiguousManager
from .sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_prefill_chunk: int | None = None     # prompt tokens one sequence may compute per step (None: budget)
    enable_chunked_prefill: bool = True      # False: a prompt is prefilled in one step or waits
    num_speculative_tokens: int = 0          # k draft tokens verified per decode step (needs a drafter: a prompt
                                             # lookup, minillm.speculative.NgramDrafter, or a draft model,
                                             # minillm.serving.draft.DraftModelProposer)
    static_batching: bool = False            # the baseline: admit a batch of up to max_num_seqs only when the
                                             # previous batch has entirely finished (no refill of free slots)

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"num_speculative_tokens must be an integer >= 0, got {k!r}")
        c = self.max_prefill_chunk
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"max_prefill_chunk must be None or an integer >= 1, got {c!r}")


class RequestRejected(ValueError):
    """The request can never be served by this engine (too long, or larger than the whole pool)."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager | ContiguousManager,
                 max_model_len: int, drafter=None):
        if config.num_speculative_tokens and drafter is None:
            raise ValueError("num_speculative_tokens > 0 needs a drafter (NgramDrafter or DraftModelProposer)")
        self.config, self.bm, self.max_model_len = config, block_manager, int(max_model_len)
        self.drafter = drafter
        self.spec_proposed = self.spec_accepted = self.spec_steps = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.memory_limited = False              # did memory limit the last schedule()? (a preemption, or the
                                                 # head of the queue did not fit)
        self._static_quota = 0                   # static batching: admissions left in the current batch

    # -- admission ---------------------------------------------------------------------------------------
    def check_fits(self, seq: Sequence) -> None:
        n_prompt, n_out = len(seq.prompt), seq.params.max_tokens
        if n_prompt > self.max_model_len:
            raise RequestRejected(f"prompt has {n_prompt} tokens, longer than max_seq_len={self.max_model_len}")
        # the last sampled token is never fed back, so prompt + max_tokens - 1 positions are computed
        if n_prompt + n_out - 1 > self.max_model_len:
            raise RequestRejected(f"prompt ({n_prompt}) + max_tokens ({n_out}) - 1 exceeds "
                                  f"max_seq_len={self.max_model_len}")
        need = self.bm.blocks_for(n_prompt + n_out - 1)
        if need > self.bm.num_blocks:
            raise RequestRejected(f"request needs {need} blocks of {self.bm.block_size} tokens at its longest; "
                                  f"the whole pool has {self.bm.num_blocks}")
        if not self.config.enable_chunked_prefill and n_prompt + n_out - 1 > self.config.max_num_batched_tokens:
            raise RequestRejected(f"without chunked prefill a prompt (and its recompute after preemption, up to "
                                  f"{n_prompt + n_out - 1} tokens) must fit one step's budget of "
                                  f"{self.config.max_num_batched_tokens} tokens")

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------------------------------
    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens this sequence computes this step: what it has pending, capped by the budget left and, while
        it prefills, by ``max_prefill_chunk``."""
        # BEGIN SOLUTION
        n = min(seq.num_pending, budget)
        if not seq.is_decoding and self.config.max_prefill_chunk is not None:
            n = min(n, self.config.max_prefill_chunk)
        return n
        # END SOLUTION

    def _preempt(self, seq: Sequence) -> None:
        """Preempt by recompute: free the sequence's blocks, forget its K/V, put it at the front of the queue."""
        # BEGIN SOLUTION
        self.bm.free(seq)
        seq.num_computed = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        if self.config.static_batching:
            self._static_quota += 1             # it rejoins the current batch
        # END SOLUTION

    def schedule(self) -> StepBatch | None:
        """Pick this step's sequences and token counts, and give them blocks. None when there is no work.

        Running sequences first, in admission order (a decode, plus its drafts, or a prefill chunk), preempting
        the latest admitted when a block is missing; then waiting requests first come, first served, while
        budget and ``max_num_seqs`` allow. Sets ``memory_limited``; counts ``num_steps``."""
        # BEGIN SOLUTION
        budget = self.config.max_num_batched_tokens
        self.memory_limited = False
        chosen: list[tuple[Sequence, int]] = []
        drafts: dict[int, list[int]] = {}
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            draft = self._draft(seq, budget) if n == 1 else []
            n += len(draft)
            while not self.bm.can_grow(seq, seq.num_computed + n):
                victim = self.running.pop()     # the latest admitted; never one already chosen (those are < i)
                self._preempt(victim)
                self.memory_limited = True
                if victim is seq:
                    break
            else:
                self.bm.allocate(seq, seq.num_computed + n)
                chosen.append((seq, n))
                if draft:
                    drafts[seq.seq_id] = draft
                budget -= n
                i += 1
        static = self.config.static_batching
        if static and not self.running and not self._static_quota:
            # the last batch is done: the next one is whoever is waiting now, up to max_num_seqs
            self._static_quota = min(self.config.max_num_seqs, len(self.waiting))
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if static and not self._static_quota:
                break
            seq = self.waiting[0]
            if not seq.block_table:
                seq.num_computed = self.bm.match_prefix(seq)
                if not seq.admitted:
                    seq.num_cached_prompt = seq.num_computed
            n = self._chunk(seq, budget)
            too_big = not self.config.enable_chunked_prefill and n < seq.num_pending
            if too_big or not self.bm.can_grow(seq, seq.num_computed + n):
                self.bm.free(seq)               # give back the prefix blocks; retry in a later step
                seq.num_computed = 0
                self.memory_limited = self.memory_limited or not too_big
                break
            self.bm.allocate(seq, seq.num_computed + n)
            self.waiting.popleft()
            seq.status, seq.admitted = SequenceStatus.RUNNING, True
            self.running.append(seq)
            if static:
                self._static_quota -= 1
            chosen.append((seq, n))
            budget -= n
        if not chosen:
            if self.has_unfinished():
                raise RuntimeError("scheduler made no progress with requests pending (this is a bug: "
                                   "check_fits admits only requests that fit an empty pool)")
            return None
        self.num_steps += 1
        return StepBatch.build([s for s, _ in chosen], [n for _, n in chosen], self.bm.block_size,
                               [drafts.get(s.seq_id, []) for s, _ in chosen] if drafts else None)
        # END SOLUTION

    def _draft(self, seq: Sequence, budget: int) -> list[int]:
        """Up to k draft tokens for a decoding sequence, clipped to what it may still emit and hold.

        A prompt-lookup drafter (``lookup(tokens, k)``) answers now; any other drafter (a draft model, which
        needs this step's slots for its own K/V) gets k placeholder tokens (-1) that the engine's proposer
        fills before the step runs."""
        k = self.config.num_speculative_tokens
        if not k or not seq.is_decoding:
            return []
        k = min(k, seq.params.max_tokens - len(seq.output) - 1,   # it emits at most k + 1 tokens
                self.max_model_len - len(seq),                     # drafts sit at positions len(seq)...
                budget - 1)
        if k <= 0:
            return []
        if hasattr(self.drafter, "lookup"):
            return [int(t) for t in self.drafter.lookup(seq.tokens, k)][:k]
        return [-1] * k

    def postprocess(self, batch: StepBatch, token_ids, eos_token_id: int | None, now: float | None = None
                    ) -> list[Sequence]:
        """Account for a finished step: advance, name full blocks, append sampled tokens, retire finished.

        ``token_ids`` holds one token per entry of ``batch.logits_rows``; a speculating sequence's
        ``len(draft) + 1`` tokens are the verifier's answers after each prefix of its draft (the draft token
        itself where it is accepted: see :func:`minillm.sampling.verify_batch`).
        Returns the sequences that got a token this step.
        """
        now = time.perf_counter() if now is None else now
        got = []
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new)):
            draft = batch.drafts[row]
            off = int(batch.row_offsets[row])
            if draft:
                # keep the drafts the verifier accepted, then the verifier's token at the first rejection (or the bonus)
                toks = [int(t) for t in token_ids[off:off + len(draft) + 1]]
                a = 0
                while a < len(draft) and draft[a] == toks[a]:
                    a += 1
                emitted = draft[:a] + [toks[a]]
                seq.num_computed += 1 + a            # the fed token and the accepted drafts have valid K/V
                self.bm.truncate(seq, seq.num_computed)   # the rejected drafts' slots go back to the pool
                self.spec_proposed += len(draft)
                self.spec_accepted += a
                self.spec_steps += 1
            else:
                seq.num_computed += int(n)
                if not batch.sample[row]:
                    self.bm.register(seq)
                    continue
                emitted = [int(token_ids[off])]
            got.append(seq)
            reason = None
            for tok in emitted:
                seq.output.append(tok)
                seq.token_times.append(now)
                if seq.first_token_time is None:
                    seq.first_token_time = now
                p = seq.params
                if tok in p.stop_token_ids or (tok == eos_token_id and not p.ignore_eos):
                    reason = "stop"
                elif len(seq.output) >= p.max_tokens:
                    reason = "length"
                if reason:
                    break
            self.bm.register(seq)      # name the blocks that became full (a finished sequence's stay revivable)
            if reason:
                self.finish(seq, reason, now)
        return got

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, reason, now
        self.bm.free(seq)
        self.running.remove(seq)

    def abort(self, seq: Sequence, now: float) -> None:
        """Drop a request wherever it is (a client went away); its blocks go back to the pool."""
        if seq in self.running:
            self.finish(seq, "abort", now)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.bm.free(seq)
            seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, "abort", now
