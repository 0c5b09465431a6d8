"""The scheduler: which sequences run in the next step, and how many of their tokens.

One step has a token budget (``max_num_batched_tokens``) and a cap on live sequences (``max_num_seqs``).
The running sequences go first, in admission order: a decode costs one token, a sequence still
prefilling takes as many prompt tokens as the budget (and ``max_prefill_chunk``) allow once one token is
set aside for every running decode. What is left of the budget admits waiting requests first come, first
served, each with a prefill chunk, so a step mixes decodes and prefill chunks (chunked prefill, as in
vLLM v1 and Sarathi). Speculative draft tokens come last: a decoding sequence drafts up to k tokens from
the budget (and free blocks) that decodes and prefill chunks left over, so speculation never delays
another sequence's token or a newcomer's prefill; under load it simply drafts less.

One exception keeps the seed's promise (the same tokens whatever the batch): a sampling request with a seed
(temperature > 0, ``seed`` set) emits a different token at a position that verifies a draft than at one that
samples plainly (the accept/residual streams of :func:`minillm.sampling.verify_batch`), so its draft length
must not depend on the other requests. Its draft is part of its decode: it is as long as its own state
allows (k, the n-gram match, ``max_tokens``, ``max_seq_len``), it takes its budget and blocks with the
decodes (preempting like a decode if blocks are missing), and if the whole decode does not fit the budget
left this step it waits for a later step instead of drafting less. Greedy requests (whose tokens are the
argmax whatever the draft) and unseeded ones may still be trimmed. ``max_num_batched_tokens`` must hold at
least ``k + 1`` tokens, so that such a decode always fits an empty step.

When a running sequence needs a block and none is free, the most recently admitted running sequence is
preempted -- possibly the one asking -- by recompute: its blocks are freed, it goes back to the front of
the waiting queue, and it later prefills prompt + output again. Its tokens are kept, so greedy decoding
produces exactly what it would have without the interruption.

The memory manager is pluggable (:class:`~minillm.serving.interfaces.MemoryManager`): the paged
:class:`BlockManager` by default, or chapter 7's :class:`~minillm.serving.contiguous.ContiguousManager` (one
contiguous range per sequence). The scheduler only asks it ``can_grow(seq, n_tokens)`` -- can this
sequence's memory be made to cover ``n_tokens`` tokens now? -- then ``allocate``, ``match_prefix``,
``register``, ``truncate`` and ``free``. The drafter is a :class:`~minillm.serving.interfaces.Drafter` (a prompt
lookup is wrapped into one).

A request that could never fit (its prompt plus ``max_tokens`` need more blocks than the whole pool, or
its positions would pass the model's ``max_seq_len``) is rejected when it is added, with a clear error;
nothing else is touched. An internal error while scheduling or accounting for one sequence finishes that
sequence with ``finish_reason = "error"`` (the message in ``seq.error``, and a warning) and frees its
blocks; the other sequences keep running.
"""
from __future__ import annotations

import time
import warnings
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from .batch import StepBatch
from .interfaces import Drafter, MemoryManager, PromptLookup, as_drafter
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
        if k and self.max_num_batched_tokens < k + 1:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                             f"num_speculative_tokens + 1 ({k + 1}): a seeded sampling request verifies its whole "
                             f"draft in one step")


class RequestRejected(ValueError):
    """The request can never be served by this engine (too long, or larger than the whole pool)."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: MemoryManager, max_model_len: int,
                 drafter: Drafter | PromptLookup | None = None):
        if config.num_speculative_tokens and drafter is None:
            raise ValueError("num_speculative_tokens > 0 needs a drafter (NgramDrafter or DraftModelProposer)")
        self.config, self.bm, self.max_model_len = config, block_manager, int(max_model_len)
        self.drafter = as_drafter(drafter)
        self.spec_proposed = self.spec_accepted = self.spec_steps = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.memory_limited = False              # did memory limit the last schedule()? (a preemption, or the
                                                 # head of the queue did not fit)
        self._static_quota = 0                   # static batching: admissions left in the current batch
        self.failed: list[Sequence] = []         # sequences finished by an internal error (see fail); the
                                                 # engine takes them with take_failed()

    # -- admission ---------------------------------------------------------------------------------------
    def check_prompt_length(self, n_prompt: int) -> None:
        """RequestRejected if a prompt of ``n_prompt`` tokens can never run (checked before its ids are)."""
        if n_prompt > self.max_model_len:
            raise RequestRejected(f"prompt has {n_prompt} tokens, longer than max_seq_len={self.max_model_len}")

    def check_fits(self, seq: Sequence) -> None:
        n_prompt, n_out = len(seq.prompt), seq.params.max_tokens
        self.check_prompt_length(n_prompt)
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

    def schedule(self, now: float | None = None) -> StepBatch | None:
        """Pick this step's sequences and token counts, and give them blocks. None when there is no work.

        1. Running sequences, in admission order: a decode takes one token (a seeded sampling request's
           decode takes 1 + its whole draft, or waits if that does not fit the budget left: see the module
           docstring); a sequence still prefilling takes a chunk of what the budget holds beyond the decodes
           not yet served. When a block is missing, the latest admitted sequence is preempted.
        2. Waiting requests, first come first served, while budget and ``max_num_seqs`` allow.
        3. Speculation: every other decoding sequence drafts up to k tokens from the budget left after 1
           and 2, and only into free blocks (such a draft never preempts anyone).

        Sets ``memory_limited``; counts ``num_steps``. ``now`` (the engine's clock) stamps a sequence that
        an internal error finishes here (see :meth:`fail`): each phase serves one sequence at a time inside
        :meth:`_isolated`, so an error finishes that sequence and the phase goes on with the next."""
        # BEGIN SOLUTION
        self.memory_limited = False
        failed_before = len(self.failed)
        budget = self.config.max_num_batched_tokens
        chosen: list[list] = []                  # [seq, tokens this step]
        drafts: dict[int, list[int]] = {}
        fixed = self._fixed_drafts(now)          # seeded sampling decodes: their whole draft, or they wait

        def unit(s):                             # the tokens of a decode
            return 1 + len(fixed.get(s.seq_id, ()))

        def choose(seq, n):
            nonlocal budget
            chosen.append([seq, n])
            budget -= n

        def serve_running():
            """Phase 1: every running sequence's decode or prefill chunk, preempting the latest admitted
            sequence while a block is missing."""
            reserve = sum(unit(s) for s in self.running if s.is_decoding)   # decode tokens not yet served
            i = 0
            while i < len(self.running) and budget > 0:
                seq = self.running[i]
                with self._isolated(seq, now):   # on an error seq leaves running: running[i] is the next one
                    if seq.num_pending < 1:
                        raise RuntimeError(f"sequence {seq.seq_id} has {seq.num_computed} computed tokens of "
                                           f"{len(seq)}: its accounting is broken")
                    decoding = seq.is_decoding
                    reserve -= unit(seq) if decoding else 0
                    n = unit(seq) if decoding else self._chunk(seq, budget - reserve)
                    if n <= 0 or n > budget:     # a prefill chunk waits while the decodes take the budget; a
                        i += 1                   # seeded sampling decode waits for room for its whole draft
                        continue
                    while not self.bm.can_grow(seq, seq.num_computed + n):
                        victim = self.running.pop()  # the latest admitted; never one already chosen (< i)
                        if victim is not seq and victim.is_decoding:
                            reserve -= unit(victim)  # it was counted as a decode still to serve
                        with nullcontext() if victim is seq else self._isolated(victim, now):
                            self._preempt(victim)    # a victim's own error finishes it, not the one asking
                        self.memory_limited = True
                        if victim is seq:
                            break
                    else:
                        self.bm.allocate(seq, seq.num_computed + n)
                        choose(seq, n)
                        if fixed.get(seq.seq_id) and decoding:
                            drafts[seq.seq_id] = fixed[seq.seq_id]
                        i += 1

        def admit_waiting():
            """Phase 2: waiting requests, first come first served, each with its cached prefix and a
            prefill chunk, while the budget, ``max_num_seqs`` (and a static batch's quota) allow."""
            static = self.config.static_batching
            if static and not self.running and not self._static_quota:
                # the last batch is done: the next one is whoever is waiting now, up to max_num_seqs
                self._static_quota = min(self.config.max_num_seqs, len(self.waiting))
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                if static and not self._static_quota:
                    break
                seq = self.waiting[0]
                with self._isolated(seq, now):   # on an error seq leaves the queue: waiting[0] is the next one
                    if not seq.block_table:
                        seq.num_computed = self.bm.match_prefix(seq)
                        if not seq.admitted:
                            seq.num_cached_prompt = seq.num_computed
                    n = self._chunk(seq, budget)
                    too_big = not self.config.enable_chunked_prefill and n < seq.num_pending
                    if too_big or not self.bm.can_grow(seq, seq.num_computed + n):
                        self.bm.free(seq)        # give back the prefix blocks; retry in a later step
                        seq.num_computed = 0
                        self.memory_limited = self.memory_limited or not too_big
                        break
                    self.bm.allocate(seq, seq.num_computed + n)
                    self.waiting.popleft()
                    seq.status, seq.admitted = SequenceStatus.RUNNING, True
                    self.running.append(seq)
                    if static:
                        self._static_quota -= 1
                    choose(seq, n)

        def add_drafts():
            """Phase 3 (lowest priority): each other decode drafts from the budget the first two phases left,
            only into free blocks (a draft never preempts anyone)."""
            nonlocal budget
            for entry in chosen:
                seq, n = entry
                if budget <= 0:
                    break
                if n != 1 or seq.seq_id in fixed:
                    continue
                with self._isolated(seq, now):
                    draft = self._draft(seq, budget)
                    while draft and not self.bm.can_grow(seq, seq.num_computed + 1 + len(draft)):
                        draft.pop()
                    if draft:
                        self.bm.allocate(seq, seq.num_computed + 1 + len(draft))
                        entry[1] += len(draft)
                        drafts[seq.seq_id] = draft
                        budget -= len(draft)

        serve_running()
        admit_waiting()
        if self.config.num_speculative_tokens:
            add_drafts()
        batch = self._build([e for e in chosen if not e[0].finished], drafts, now)
        if batch is None and len(self.failed) == failed_before and self.has_unfinished():
            raise RuntimeError("scheduler made no progress with requests pending (this is a bug: "
                               "check_fits admits only requests that fit an empty pool)")
        if batch is not None:
            self.num_steps += 1
        return batch
        # END SOLUTION

    @contextmanager
    def _isolated(self, seq: Sequence, now: float | None):
        """Run a block of work for one sequence: an internal error in it finishes that sequence
        (:meth:`fail`) and is not raised, so the step goes on with the others. The one place where the
        scheduler isolates errors (scheduling, drafting, accounting)."""
        try:
            yield
        except Exception as e:
            self.fail(seq, e, now)

    def _build(self, chosen: list[list], drafts: dict[int, list[int]], now: float | None = None) -> StepBatch | None:
        """The step's StepBatch. If building it fails, the sequences that fail on their own are finished
        with an error and the step is built from the others (None if no sequence is left)."""
        bs = self.bm.block_size

        def build(entries):
            return StepBatch.build([s for s, _ in entries], [n for _, n in entries], bs,
                                   [drafts.get(s.seq_id, []) for s, _ in entries] if drafts else None)
        if not chosen:
            return None
        try:
            return build(chosen)
        except Exception:
            ok = []
            for entry in chosen:
                try:
                    build([entry])
                    ok.append(entry)
                except Exception as e:
                    self.fail(entry[0], e, now)
            if len(ok) == len(chosen):
                raise                           # no single sequence is at fault: a bug in the batch itself
            return build(ok) if ok else None

    def _fixed_drafts(self, now: float | None) -> dict[int, list[int]]:
        """The drafts of the running seeded sampling requests that decode this step, by seq_id: as long as
        their own state allows, whatever the budget (see the module docstring). A sequence whose drafter
        fails is finished with an error."""
        out = {}
        if not self.config.num_speculative_tokens:
            return out
        for seq in list(self.running):
            p = seq.params
            if p.greedy or p.seed is None or not seq.is_decoding:
                continue
            with self._isolated(seq, now):
                out[seq.seq_id] = self._draft(seq, self.config.num_speculative_tokens)
        return out

    def _draft(self, seq: Sequence, budget: int) -> list[int]:
        """Up to k draft tokens for a decoding sequence, clipped to what it may still emit and hold and to
        ``budget`` (the draft tokens the step still has room for).

        A prompt-lookup drafter answers now; a draft model (which
        needs this step's slots for its own K/V) gets k placeholder tokens (-1) that the engine's proposer
        fills before the step runs."""
        k = self.config.num_speculative_tokens
        if not k or not seq.is_decoding:
            return []
        k = min(k, seq.params.max_tokens - len(seq.output) - 1,   # it emits at most k + 1 tokens
                self.max_model_len - len(seq),                     # drafts sit at positions len(seq)...
                budget)
        if k <= 0:
            return []
        return self.drafter.draft(seq, k)

    def postprocess(self, batch: StepBatch, token_ids, eos_token_id: int | None, now: float | None = None
                    ) -> list[Sequence]:
        """Account for a finished step: advance, name full blocks, append sampled tokens, retire finished.

        ``token_ids`` holds one token per entry of ``batch.logits_rows``; a speculating sequence's
        ``len(draft) + 1`` tokens are the verifier's answers after each prefix of its draft (the draft token
        itself where it is accepted: see :func:`minillm.sampling.verify_batch`).
        Returns the sequences that got a token this step. A sequence whose accounting fails is finished
        with an error (:meth:`fail`); the others are accounted for as usual.
        """
        now = time.perf_counter() if now is None else now
        if len(token_ids) != len(batch.logits_rows):  # the runner's fault, not any one sequence's: no isolation
            raise ValueError(f"the step has {len(batch.logits_rows)} logits rows but the runner returned "
                             f"{len(token_ids)} tokens")
        got = []
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new)):
            if seq.finished:                    # aborted or failed while the step ran
                continue
            with self._isolated(seq, now):
                if self._account(seq, int(n), batch, row, token_ids, eos_token_id, now):
                    got.append(seq)
        return got

    def _account(self, seq: Sequence, n: int, batch: StepBatch, row: int, token_ids, eos_token_id, now) -> bool:
        """One sequence's share of :meth:`postprocess`; True if it got tokens."""
        draft = batch.drafts[row]
        off = int(batch.row_offsets[row])
        if draft:
            # keep the drafts the verifier accepted, then the verifier's token at the first rejection (or the bonus)
            toks = [int(t) for t in token_ids[off:off + len(draft) + 1]]
            a = 0
            while a < len(draft) and draft[a] == toks[a]:
                a += 1
            emitted = draft[:a] + [toks[a]]
            self.spec_proposed += len(draft)
            self.spec_accepted += a
            self.spec_steps += 1
        else:
            seq.num_computed += n
            if not batch.sample[row]:
                self.bm.register(seq)
                return False
            emitted = [int(token_ids[off])]
        reason = None
        for tok in emitted:                     # a stop token or max_tokens may cut the emitted run short
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
        if draft:
            # The fed token and the drafts before the last kept token have valid K/V; the last kept token
            # (an accepted draft, the correction or the bonus) has none that counts -- exactly as after a
            # plain decode. So every token but the last is computed, and the cache is cut back to them:
            # the slots of rejected drafts, and of accepted drafts past a stop token, go back to the pool.
            seq.num_computed = len(seq) - 1
            self.bm.truncate(seq, seq.num_computed)
        self.bm.register(seq)      # name the blocks that became full (a finished sequence's stay revivable)
        if reason:
            self.finish(seq, reason, now)
        return True

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, reason, now
        self.bm.free(seq)
        self.running.remove(seq)

    def fail(self, seq: Sequence, error: BaseException, now: float | None = None) -> None:
        """Finish ``seq`` after an internal error in its scheduling or accounting: ``finish_reason`` "error",
        the message in ``seq.error``, its blocks back to the pool, a RuntimeWarning. Nothing else changes."""
        now = time.perf_counter() if now is None else now
        seq.error = f"{type(error).__name__}: {error}"
        seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, "error", now
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        try:
            self.bm.free(seq)
        except Exception as e:                  # its table is broken: drop it rather than stop the engine
            seq.error += f" (freeing its blocks failed too: {type(e).__name__}: {e})"
            seq.block_table = []
        self.failed.append(seq)
        warnings.warn(f"request {seq.seq_id} failed and was finished with an error: {seq.error}",
                      RuntimeWarning, stacklevel=2)

    def take_failed(self) -> list[Sequence]:
        """The sequences finished by :meth:`fail` since the last call."""
        out, self.failed = self.failed, []
        return out

    def abort(self, seq: Sequence, now: float) -> None:
        """Drop a request wherever it is (a client went away); its blocks go back to the pool."""
        if seq in self.running:
            self.finish(seq, "abort", now)
        elif seq in self.waiting:
            self.waiting.remove(seq)
            self.bm.free(seq)
            seq.status, seq.finish_reason, seq.finish_time = SequenceStatus.FINISHED, "abort", now
