"""The engine: requests in, tokens out, one scheduler step at a time (nano-vllm's ``llm_engine.py``).

``LLMEngine`` ties a :class:`Scheduler` (which tokens run next), a :class:`BlockManager` (where their
K/V live) and a runner (which computes them) together. ``add_request`` / ``step`` is the streaming
interface a server loop calls; ``generate`` runs a list of prompts to completion; ``stream`` yields one
request's tokens as they come while everything else in the engine keeps running. ``LLM`` builds an
engine for a shipped model with one of the three runners.

Bad requests raise a clear exception from ``add_request`` and are never queued, so nothing already in
the engine is affected. A request that hits an internal error once it is running is finished with
``finish_reason == "error"`` (the message in ``RequestOutput.error``, and a RuntimeWarning); the other
requests keep running.
"""
from __future__ import annotations

import numbers
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from ..model import check_prompt_ids
from .block_manager import BlockManager
from .scheduler import Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence, _int


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finished: bool
    finish_reason: str | None
    arrival_time: float
    first_token_time: float | None
    token_times: list[float] = field(repr=False)
    finish_time: float | None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    error: str | None = None        # the internal error that finished this request (finish_reason "error")

    @property
    def ttft(self) -> float:
        """Time to first token: arrival to the first sampled token."""
        return self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float:
        return self.finish_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive tokens."""
        return list(np.diff(self.token_times))

    @property
    def tpot(self) -> float:
        """Time per output token after the first (NaN for a one-token answer)."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else float("nan")


class LLMEngine:
    def __init__(self, runner, num_blocks: int, block_size: int, max_model_len: int, vocab_size: int,
                 scheduler_config: SchedulerConfig | None = None, enable_prefix_caching: bool = True,
                 eos_token_id: int | None = None, tokenizer=None, seed: int = 0, block_manager=None,
                 drafter=None):
        self.runner = runner
        if block_manager is None:
            block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        elif (block_manager.num_blocks, block_manager.block_size) != (num_blocks, block_size):
            raise ValueError(f"block_manager has {block_manager.num_blocks} blocks of {block_manager.block_size}, "
                             f"the engine was told {num_blocks} of {block_size}")
        self.block_manager = block_manager      # or another memory manager (chapter 7's ContiguousManager)
        if hasattr(drafter, "check_target"):    # a draft model: it must share the vocabulary and mirror the pool
            drafter.check_target(vocab_size, max_model_len, num_blocks, block_size)
        self.scheduler = Scheduler(scheduler_config or SchedulerConfig(), self.block_manager, max_model_len, drafter)
        self.proposer = None if drafter is None or hasattr(drafter, "lookup") else drafter   # a draft model
        self.vocab_size, self.eos_token_id, self.tokenizer = int(vocab_size), eos_token_id, tokenizer
        self.requests: dict[int, Sequence] = {}
        self.step_observers: list = []          # fn(batch) for each step, after drafting and before running it
        self._next_id = 0
        self._seeds = np.random.default_rng(seed)

    # -- requests ----------------------------------------------------------------------------------------
    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("this engine has no tokenizer: pass token ids")
            prompt = self.tokenizer.encode(prompt)
        return check_prompt_ids(prompt, self.vocab_size)

    def _check_params(self, params) -> SamplingParams:
        """``params`` (None: the defaults) checked against this engine: a clear error if they cannot apply."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad} lie outside the vocabulary [0, {self.vocab_size}): "
                             f"the model can never emit them")
        return params

    def add_request(self, prompt, params: SamplingParams | None = None, arrival_time: float | None = None) -> int:
        """Queue a request; return its id. Raises (and queues nothing) if the request is invalid."""
        params = self._check_params(params)
        ids = self._encode(prompt)
        seed = params.seed if params.seed is not None else int(self._seeds.integers(0, 2**31))
        if arrival_time is None:
            arrival_time = self.runner.now()
        elif isinstance(arrival_time, bool) or not isinstance(arrival_time, numbers.Real) or \
                not np.isfinite(arrival_time):
            raise ValueError(f"arrival_time must be a finite number (seconds on the runner's clock), "
                             f"got {arrival_time!r}")
        seq = Sequence(self._next_id, ids, params, float(arrival_time), seed=seed)
        self.scheduler.add(seq)         # raises RequestRejected for a request that can never fit
        self.requests[seq.seq_id] = seq
        self._next_id += 1
        return seq.seq_id

    def abort_request(self, request_id: int) -> None:
        seq = self.requests[request_id]
        self.scheduler.abort(seq, self.runner.now())
        if seq.finished:
            self._release([seq])               # the draft model's state for it, if any

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def output(self, request_id: int) -> RequestOutput:
        s = self.requests[request_id]
        text = self.tokenizer.decode(s.output) if self.tokenizer is not None else None
        return RequestOutput(s.seq_id, list(s.prompt), list(s.output), text, s.finished, s.finish_reason,
                             s.arrival_time, s.first_token_time, list(s.token_times), s.finish_time,
                             s.num_cached_prompt, s.num_preemptions, s.error)

    # -- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """Run one scheduled step; return the ids of the requests that got a token (or [] if idle).

        A request that hits an internal error is finished with ``finish_reason == "error"`` and the step
        goes on with the others (see :meth:`Scheduler.fail`)."""
        batch = self.scheduler.schedule(self.runner.now())
        if batch is None:
            self._release(self.scheduler.take_failed())
            return []
        if batch.needs_drafts:
            self.proposer.propose(batch)       # a draft model fills the reserved drafts
        for observe in self.step_observers:
            observe(batch)
        token_ids = self.runner.execute(batch)
        got = self.scheduler.postprocess(batch, token_ids, self.eos_token_id, self.runner.now())
        if self.proposer is not None:
            self.proposer.commit([s for s in batch.seqs if not s.finished])
        self._release([s for s in batch.seqs if s.finished] + self.scheduler.take_failed())
        return [s.seq_id for s in got]

    def _release(self, seqs) -> None:
        """Forget the draft model's cache of finished sequences."""
        if self.proposer is not None:
            for s in seqs:
                self.proposer.release(s)

    def add_step_observer(self, fn):
        """Call ``fn(batch)`` on every step's StepBatch, after its drafts are filled and before the runner
        computes it (studies count occupancy, tests check invariants). Returns ``fn``."""
        self.step_observers.append(fn)
        return fn

    def run(self, progress: bool = False) -> None:
        """Step until every queued request has finished."""
        total = len([s for s in self.requests.values() if not s.finished])
        bar = _Progress(total) if progress else None
        while self.has_unfinished():
            self.step()
            if bar is not None:
                bar.update(total - len(self.scheduler.waiting) - len(self.scheduler.running))
        if bar is not None:
            bar.close()

    def generate(self, prompts, params: SamplingParams | Iterable[SamplingParams] | None = None,
                 progress: bool | None = None) -> list[RequestOutput]:
        """Run ``prompts`` (texts or token-id lists) to completion; outputs in prompt order.

        Every prompt is validated before any is queued, so one bad prompt raises and queues nothing.
        """
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        for i, (p, sp) in enumerate(zip(prompts, params)):   # validate everything first
            try:
                sp = self._check_params(sp)
                ids = self._encode(p)
                self.scheduler.check_fits(Sequence(-1, ids, sp))
            except (TypeError, ValueError) as e:
                raise type(e)(f"prompt {i}: {e}") from e
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params)]
        self.run(progress=len(ids) >= 8 if progress is None else progress)
        return [self.output(i) for i in ids]

    def stream(self, prompt, params: SamplingParams | None = None) -> Iterator[int]:
        """Yield one request's tokens as they are sampled; other queued requests advance alongside.
        Raises RuntimeError if the request is finished by an internal error."""
        seq, sent = self.requests[self.add_request(prompt, params)], 0
        while not seq.finished:
            self.step()
            yield from seq.output[sent:]
            sent = len(seq.output)
        if seq.finish_reason == "error":
            raise RuntimeError(f"request {seq.seq_id} failed: {seq.error}")

    def serve_trace(self, prompts, params, arrivals) -> list[RequestOutput]:
        """Serve requests that arrive over time (seconds on the runner's clock, sorted ascending).

        Each request is added once the clock reaches its arrival. When the engine is idle, a simulated
        runner's clock jumps to the next arrival; a real one sleeps until then.
        """
        order = np.argsort(np.asarray(arrivals, np.float64), kind="stable")
        t0 = self.runner.now()
        ids: dict[int, int] = {}
        nxt = 0
        while nxt < len(order) or self.has_unfinished():
            now = self.runner.now() - t0
            while nxt < len(order) and arrivals[order[nxt]] <= now:
                i = int(order[nxt])
                ids[i] = self.add_request(prompts[i], params[i] if isinstance(params, list) else params,
                                          arrival_time=t0 + float(arrivals[i]))
                nxt += 1
            if self.has_unfinished():
                self.step()
            elif nxt < len(order):
                wait = float(arrivals[order[nxt]]) - now
                if hasattr(self.runner, "clock"):
                    self.runner.clock += wait
                else:
                    time.sleep(max(0.0, wait))
        return [self.output(ids[i]) for i in range(len(order))]


class _Progress:
    """A dependency-free progress bar on stderr (tqdm when installed)."""

    def __init__(self, total: int):
        try:
            from tqdm.auto import tqdm
            self._bar = tqdm(total=total, desc="requests", unit="req")
        except ImportError:
            self._bar = None
        self.total, self.done = total, 0

    def update(self, done: int) -> None:
        if done == self.done:
            return
        if self._bar is not None:
            self._bar.update(done - self.done)
        else:
            sys.stderr.write(f"\rrequests {done}/{self.total}")
        self.done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\n")


class LLM:
    """``LLM("tiny").generate(prompts, SamplingParams(...))``: an engine for a model and a runner.

    runner: "numpy" (the reference, CPU), "torch" (the GPU path: torch model + Triton kernels) or
    "simulated" (counts only). ``num_speculative_tokens=k`` verifies up to k draft tokens per decode step
    (chapter 9), drafted by ``speculative_model``: "ngram" (prompt lookup, the default) or a draft model (a
    shipped name such as "draft", or a ``Model``) run by a second runner of the same kind over a pool that
    mirrors the target's. ``num_blocks`` defaults to enough blocks for ``max_num_seqs`` sequences of
    ``max_seq_len`` tokens, so nothing is preempted unless you ask for a smaller pool.
    """

    def __init__(self, model="tiny", runner: str = "numpy", num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512, max_prefill_chunk: int | None = None,
                 enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, seed: int = 0,
                 num_speculative_tokens: int = 0, speculative_model="ngram", **runner_kw):
        from ..model import Model, load_model
        from ..tokenizer import EOS, ByteTokenizer

        block_size = _int("block_size", block_size, 1)
        if num_blocks is not None:
            num_blocks = _int("num_blocks", num_blocks, 1)
        sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                max_prefill_chunk=max_prefill_chunk, enable_chunked_prefill=enable_chunked_prefill,
                                num_speculative_tokens=num_speculative_tokens)
        self.model = model if isinstance(model, Model) else load_model(model)
        cfg = self.model.config
        if num_blocks is None:
            num_blocks = max_num_seqs * -(-cfg.max_seq_len // block_size)
        run = self._runner(runner, self.model, num_blocks, block_size, runner_kw)
        drafter = None
        if num_speculative_tokens and speculative_model == "ngram":
            from ..speculative import NgramDrafter
            drafter = NgramDrafter()
        elif num_speculative_tokens:
            if runner == "simulated":
                raise ValueError("a draft model needs a runner that computes ('numpy' or 'torch')")
            from .draft import DraftModelProposer
            draft = speculative_model if isinstance(speculative_model, Model) else load_model(speculative_model)
            drafter = DraftModelProposer(self._runner(runner, draft, num_blocks, block_size, runner_kw))
        self.engine = LLMEngine(run, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, sched,
                                enable_prefix_caching, eos_token_id=EOS, tokenizer=ByteTokenizer(), seed=seed,
                                drafter=drafter)

    @staticmethod
    def _runner(kind: str, model, num_blocks: int, block_size: int, kw: dict):
        if kind == "numpy":
            from .runner import NumpyRunner
            return NumpyRunner(model, num_blocks, block_size)
        if kind == "torch":
            from .torch_runner import TorchRunner
            return TorchRunner(model, num_blocks, block_size, **kw)
        if kind == "simulated":
            from .runner import SimulatedRunner
            return SimulatedRunner(**kw)
        raise ValueError(f"runner must be 'numpy', 'torch' or 'simulated', got {kind!r}")

    def generate(self, prompts, params=None, progress: bool | None = None) -> list[RequestOutput]:
        return self.engine.generate(prompts, params, progress)

    def stream(self, prompt, params=None) -> Iterator[int]:
        return self.engine.stream(prompt, params)
