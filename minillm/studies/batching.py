"""Chapter 8: static vs continuous batching, chunked prefill, preemption and prefix caching, on the serving
engine's own scheduler with the runner that only counts (``SimulatedRunner``).

Every study here builds an :class:`~minillm.serving.LLMEngine` around a simulated runner, replays a trace
of requests (prompt length, output length, arrival time) and reads what happened off the engine: the
tokens of each step, which sequences held a slot, when each token was emitted. With a
:class:`~minillm.serving.StepCost` the clock is a roofline model of a GPU step; without one it counts
steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..serving import LLMEngine, SamplingParams, SchedulerConfig, SimulatedRunner, StepCost


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> np.ndarray:
    """Arrival times (seconds on the runner's clock) of a Poisson process with ``rate`` requests per unit."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    return np.concatenate([[0.0], np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, n - 1))])


@dataclass
class ServingRun:
    """What one replay of a trace measured."""

    policy: str
    seconds: float                 # runner clock from the first arrival to the last token
    steps: int
    output_tokens: int
    slot_utilization: float        # mean over steps of decoding sequences / max_num_seqs
    ttft: np.ndarray               # per request, runner-clock units
    e2e: np.ndarray
    max_itl: np.ndarray            # per request: the longest gap between two of its tokens
    preemptions: int
    prefill_tokens: int            # tokens pushed through prefill (recomputation included)
    prefix_hit_tokens: int
    timeline: list[list[int]] = field(repr=False, default_factory=list)   # per step: request ids in the batch
    token_times: list[np.ndarray] = field(repr=False, default_factory=list)  # per request: when each token came

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds


def replay(prompts, output_lens, arrivals, *, static: bool = False, max_num_seqs: int = 64,
           max_num_batched_tokens: int = 2048, max_prefill_chunk: int | None = None,
           enable_chunked_prefill: bool = True, num_blocks: int = 100_000, block_size: int = 16,
           enable_prefix_caching: bool = False, cost: StepCost | None = None, max_model_len: int = 1 << 20,
           record_timeline: bool = False) -> ServingRun:
    """Serve the trace on the engine with the counting runner; return what it measured."""
    runner = SimulatedRunner(cost=cost)
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          max_prefill_chunk=max_prefill_chunk, enable_chunked_prefill=enable_chunked_prefill,
                          static_batching=static)
    vocab = 1 << 30
    eng = LLMEngine(runner, num_blocks, block_size, max_model_len, vocab, cfg,
                    enable_prefix_caching=enable_prefix_caching)
    decoding, timeline = [], []

    @eng.add_step_observer
    def observed(batch):
        decoding.append(sum(s.is_decoding for s in batch.seqs))
        if record_timeline:
            timeline.append([s.seq_id for s in batch.seqs])

    params = [SamplingParams(max_tokens=int(o), ignore_eos=True) for o in output_lens]
    outs = eng.serve_trace(list(prompts), params, arrivals)
    finish = max(o.finish_time for o in outs)
    return ServingRun(
        policy="static" if static else "continuous", seconds=finish - float(np.min(arrivals)),
        steps=runner.steps, output_tokens=sum(len(o.token_ids) for o in outs),
        slot_utilization=float(np.mean(decoding)) / max_num_seqs,
        ttft=np.array([o.ttft for o in outs]), e2e=np.array([o.e2e for o in outs]),
        max_itl=np.array([max(o.itl) if len(o.itl) else 0.0 for o in outs]),
        preemptions=eng.scheduler.num_preemptions, prefill_tokens=runner.prefill_tokens,
        prefix_hit_tokens=eng.block_manager.prefix_hit_tokens, timeline=timeline,
        token_times=[np.asarray(o.token_times) for o in outs])


def random_prompts(lengths, seed: int = 0, vocab: int = 32000) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, int(n)).tolist() for n in lengths]
