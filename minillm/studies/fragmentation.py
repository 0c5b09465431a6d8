"""Chapter 7: the fragmentation study -- one serving loop, several ways to hand out memory.

``chat_trace`` makes synthetic chat requests; the loop serves them with
contiguous strategies (``simulate_contiguous``, first fit over a linear address
space) and with blocks (``simulate_paged``). They return numbers; the chapter
compares them with the claims it quotes.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..paged.allocator import BlockAllocator, _ceil_div, _check_count


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


def chat_trace(n_requests: int, seed: int = 0, max_context: int = 4096, prompt_median: float = PROMPT_MEDIAN,
               output_median: float = OUTPUT_MEDIAN) -> list[Request]:
    """``n_requests`` chat-like requests in arrival order, each fitting in ``max_context`` tokens.

    All of them are queued at time 0 (an offline backlog), so the serving loop
    is always limited by memory: the regime in which memory management decides
    throughput.
    """
    n = _check_count("n_requests", n_requests)
    max_context = _check_count("max_context", max_context, 2)
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(math.log(prompt_median), PROMPT_SIGMA, n)), 1, max_context - 1)
    output = np.rint(rng.lognormal(math.log(output_median), OUTPUT_SIGMA, n))
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
