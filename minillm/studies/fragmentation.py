"""Chapter 7: the fragmentation study -- one scheduler, several ways to hand out memory.

``chat_trace`` makes synthetic chat requests. ``simulate_contiguous`` (one contiguous range per sequence,
first fit over a linear address space) and ``simulate_paged`` (blocks) serve them on chapter 8's engine:
the same :class:`~minillm.serving.Scheduler` with a different memory manager
(:class:`~minillm.serving.ContiguousManager` or :class:`~minillm.serving.BlockManager`), and the
:class:`~minillm.serving.SimulatedRunner`, which only counts. They return numbers; the chapter compares
them with the claims it quotes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..paged.allocator import check_count
from ..serving import (BlockManager, ContiguousManager, LLMEngine, RequestRejected, SamplingParams,
                       SchedulerConfig, SimulatedRunner)
from ..serving.contiguous import STRATEGIES as CONTIGUOUS_STRATEGIES
from ..serving.contiguous import FirstFitAllocator  # noqa: F401  (re-exported: the chapter's allocator)


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
    n = check_count("n_requests", n_requests)
    max_context = check_count("max_context", max_context, 2)
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(math.log(prompt_median), PROMPT_SIGMA, n)), 1, max_context - 1)
    output = np.rint(rng.lognormal(math.log(output_median), OUTPUT_SIGMA, n))
    output = np.clip(output, 1, max_context - prompt)
    return [Request(i, int(p), int(o)) for i, (p, o) in enumerate(zip(prompt, output))]


@dataclass(frozen=True)
class ServingStats:
    """What serving a trace measured, read off the engine at every step.

    A step is one engine step: every running sequence decodes one token and newly admitted (or
    readmitted) sequences prefill and sample their first token, so each scheduled sequence gets one
    token a step. Memory is measured when the step's tokens have their slots, before finished
    sequences give theirs back; a live token is one whose K/V the step leaves in the cache (the token
    sampled last is not one yet: the next step computes it).
    """

    strategy: str
    pool_tokens: int
    steps: int                      # engine steps to finish the trace; each scheduled sequence gets 1 token a step
    tokens_generated: int
    memory_bound_steps: int         # steps where memory was the limit: the queue's head did not fit, or a preemption
    memory_bound_tokens: int        # tokens generated during those steps
    idle_fraction: float            # mean of 1 - live tokens / pool, over the memory-bound steps
    reserved_unused_fraction: float  # ... of which allocated to a sequence but holding no token (internal)
    free_fraction: float            # ... of which not allocated, yet too small or scattered for the next request
    idle_fraction_all_steps: float  # the same mean over every step, including the final drain
    reserved_unused_per_seq: float  # mean allocated-but-empty slots per running sequence
    max_reserved_unused_per_seq: float
    tokens_copied: int              # K/V token slots copied by moving a sequence to a larger range
    preemptions: int                # sequences evicted (and later recomputed) because memory ran out
    recomputed_tokens: int          # tokens whose K/V a preemption threw away and a later prefill computed again
    max_concurrent: int
    mean_concurrent: float

    @property
    def tokens_per_step(self) -> float:
        """Throughput proxy over the whole trace, taking a step's cost as independent of batch size
        (true while decode is memory-bound) and prefill as free. Dominated by the final drain on short traces:
        the last long answers finish alone."""
        return self.tokens_generated / self.steps

    @property
    def memory_bound_tokens_per_step(self) -> float:
        """The same proxy in steady state: over the steps where memory, not a lack of work, was the limit."""
        return self.memory_bound_tokens / self.memory_bound_steps if self.memory_bound_steps else float("nan")


class _MeasuringRunner:
    """The counting runner, plus a look at memory before each step is "computed" (the engine calls
    ``execute`` after the scheduler has given the step's tokens their slots, before it retires anything)."""

    def __init__(self, manager, pool_tokens: int):
        self.inner, self.mem, self.pool = SimulatedRunner(), manager, pool_tokens
        self.scheduler = None                   # set once the engine exists
        self.steps = self.generated = self.max_conc = self.conc_sum = 0
        self.idle_all = self.waste_sum = self.waste_max = 0.0
        self.bound_steps = self.bound_tokens = 0
        self.idle_b = self.unused_b = self.free_b = 0.0

    def now(self) -> float:
        return self.inner.now()

    def sleep(self, seconds: float) -> None:  # the rest of the Runner protocol: the inner runner's clock
        self.inner.sleep(seconds)

    def prepare(self, config) -> None:
        self.inner.prepare(config)

    def check_engine(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        self.inner.check_engine(num_blocks, block_size, max_model_len)

    def execute(self, batch):
        running = len(batch.seqs)               # the budget is never the limit: every running sequence is here
        live = int(batch.context_lens.sum())
        allocated = (self.mem.num_blocks - self.mem.num_free) * self.mem.block_size
        tokens = int(batch.sample.sum())
        self.steps += 1
        self.generated += tokens
        self.conc_sum += running
        self.max_conc = max(self.max_conc, running)
        idle = 1 - live / self.pool
        self.idle_all += idle
        waste = (allocated - live) / running
        self.waste_sum += waste
        self.waste_max = max(self.waste_max, waste)
        if self.scheduler.memory_limited:
            self.bound_steps += 1
            self.bound_tokens += tokens
            self.idle_b += idle
            self.unused_b += (allocated - live) / self.pool
            self.free_b += (self.pool - allocated) / self.pool
        return self.inner.execute(batch)


def _serve(trace: Sequence[Request], manager, strategy: str, pool_tokens: int, max_context: int,
           max_running: int | None, seed: int = 0) -> ServingStats:
    """Queue the whole trace on an engine with ``manager`` and the counting runner; run it; read the stats.

    The scheduler is chapter 8's: running sequences first, then strict first-come-first-served admission
    while memory allows; a sequence that cannot grow preempts the latest admitted one (recompute: it goes
    back to the front of the queue and later prefills its prompt plus what it had generated). The token
    budget is larger than any step can use and ``max_num_seqs`` is ``max_running`` (default: no cap), so
    only memory limits a step. Prompts are random tokens (there is no prefix caching to find them).
    """
    runner = _MeasuringRunner(manager, pool_tokens)
    cfg = SchedulerConfig(max_num_seqs=max_running or len(trace),
                          max_num_batched_tokens=manager.num_blocks * manager.block_size + len(trace))
    vocab = 32_000
    eng = LLMEngine(runner, manager.num_blocks, manager.block_size, max_context, vocab, cfg,
                    enable_prefix_caching=False, block_manager=manager)
    runner.scheduler = eng.scheduler
    rng = np.random.default_rng(seed)
    for r in trace:
        params = SamplingParams(max_tokens=r.output_len, ignore_eos=True)
        try:
            eng.add_request(rng.integers(0, vocab, r.prompt_len), params)
        except RequestRejected as e:
            raise ValueError(f"request {r.rid} ({r.prompt_len} + {r.output_len} tokens) cannot fit in an empty "
                             f"pool of {pool_tokens} slots under {strategy!r}: {e}") from e
    eng.run()
    # without preemption each request computes prompt + output - 1 tokens (the last sampled one never runs)
    recomputed = runner.inner.tokens - sum(r.prompt_len + r.output_len - 1 for r in trace)
    steps = runner.steps
    nb = runner.bound_steps or float("nan")   # never memory-bound (e.g. max_running was the limit)
    return ServingStats(strategy=strategy, pool_tokens=pool_tokens, steps=steps, tokens_generated=runner.generated,
                        memory_bound_steps=runner.bound_steps, memory_bound_tokens=runner.bound_tokens,
                        idle_fraction=runner.idle_b / nb, reserved_unused_fraction=runner.unused_b / nb,
                        free_fraction=runner.free_b / nb, idle_fraction_all_steps=runner.idle_all / steps,
                        reserved_unused_per_seq=runner.waste_sum / steps,
                        max_reserved_unused_per_seq=runner.waste_max,
                        tokens_copied=getattr(manager, "tokens_copied", 0),
                        preemptions=eng.scheduler.num_preemptions, recomputed_tokens=recomputed,
                        max_concurrent=runner.max_conc, mean_concurrent=runner.conc_sum / steps)


def simulate_contiguous(trace: Sequence[Request], pool_tokens: int, strategy: str, max_context: int = 4096,
                        guess_output: int | None = None, max_running: int | None = None) -> ServingStats:
    """Serve ``trace`` with one contiguous range per sequence, first fit over ``pool_tokens`` slots
    (:class:`~minillm.serving.ContiguousManager` under the serving scheduler).

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
    manager = ContiguousManager(pool_tokens, strategy, max_context, guess_output)
    return _serve(trace, manager, strategy, pool_tokens, max_context, max_running)


def simulate_paged(trace: Sequence[Request], pool_tokens: int, block_size: int = 16,
                   max_running: int | None = None, max_context: int = 4096) -> ServingStats:
    """Serve ``trace`` from ``pool_tokens // block_size`` blocks: the same scheduler, the paged
    :class:`~minillm.serving.BlockManager` (prefix caching off)."""
    if max(r.prompt_len + r.output_len for r in trace) > max_context:
        raise ValueError(f"a request in the trace is longer than max_context={max_context}")
    manager = BlockManager(pool_tokens // block_size, block_size, enable_prefix_caching=False)
    return _serve(trace, manager, "paged", pool_tokens, max_context, max_running)


def compare_strategies(trace: Sequence[Request], pool_tokens: int, block_size: int = 16, max_context: int = 4096,
                       max_running: int | None = None) -> dict[str, ServingStats]:
    """Every contiguous strategy and paging on the same trace and pool."""
    out = {s: simulate_contiguous(trace, pool_tokens, s, max_context, max_running=max_running)
           for s in CONTIGUOUS_STRATEGIES}
    out["paged"] = simulate_paged(trace, pool_tokens, block_size, max_running, max_context)
    return out
