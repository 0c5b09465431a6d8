"""The engine: requests in, tokens out, one scheduler step at a time (nano-vllm's ``llm_engine.py``).

``LLMEngine`` ties a :class:`Scheduler` (which tokens run next), a :class:`BlockManager` (where their
K/V live) and a runner (which computes them) together. ``add_request`` / ``step`` is the streaming
interface a server loop calls; ``generate`` runs a list of prompts to completion; ``stream`` yields one
request's tokens as they come while everything else in the engine keeps running. ``LLM`` builds an
engine for a shipped model with one of the three runners.

Bad requests raise a clear exception from ``add_request`` and are never queued, so nothing already in
the engine is affected. A request that hits an internal error once it is running is finished with
``finish_reason == "error"`` (the message in ``RequestOutput.error``, and a RuntimeWarning); the other
requests keep running. ``generate`` raises :class:`RequestFailed` if any request of its call failed, so a
returned list never holds a failed request; ``stream`` raises RuntimeError.

One engine may be used from several threads: every method takes the engine's lock, and ``generate`` and
``stream`` take it one step at a time, so concurrent callers share steps (each step serves every caller's
requests, as continuous batching does) and each call returns when its own requests have finished.

The engine forgets a finished request once its output has been handed over: by ``generate``, by a stream
that ran to its end, or by ``output()`` for a finished request. A stream that is closed or dropped before
its end aborts its request.
"""
from __future__ import annotations

import inspect
import numbers
import sys
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

import numpy as np

from ..model import check_prompt_ids
from .block_manager import BlockManager
from .interfaces import Drafter, LookupDrafter, MemoryManager, PromptLookup, Runner, as_drafter
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


class RequestFailed(RuntimeError):
    """Raised by :meth:`LLMEngine.generate` when an internal error finished a request of that call.

    ``outputs``: every output of the call, in prompt order (the failed ones with ``finish_reason ==
    "error"`` and the message in ``error``); ``failed``: the indices of the failed ones."""

    def __init__(self, outputs: list[RequestOutput], failed: list[int]):
        self.outputs, self.failed = outputs, failed
        what = "; ".join(f"prompt {i} (request {outputs[i].request_id}): {outputs[i].error}" for i in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        super().__init__(f"{len(failed)} of {len(outputs)} requests failed: {what}{more} "
                         f"(the outputs of the call are in this exception's .outputs)")


def _prefixed(e: Exception, prefix: str) -> Exception:
    """``e`` with ``prefix`` before its message: the same type where it takes one message (else its base,
    TypeError or ValueError)."""
    msg = f"{prefix}{e}"
    try:
        return type(e)(msg)
    except TypeError:
        return (TypeError if isinstance(e, TypeError) else ValueError)(msg)


class TokenStream:
    """One request's tokens, as they are sampled: what :meth:`LLMEngine.stream` returns (an iterator).

    Each ``next()`` steps the engine (every request in it advances) until the request has a new token.
    Raises RuntimeError once its tokens are out if an internal error finished the request. ``close()`` --
    or leaving a ``with`` block -- aborts the request if it has not finished; so does dropping the stream
    (it is aborted before the engine's next step)."""

    def __init__(self, engine: LLMEngine, request_id: int):
        self.engine, self.request_id = engine, request_id
        self._seq = engine.requests[request_id]
        self._sent, self._open = 0, True

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> int:
        eng, seq = self.engine, self._seq
        while self._open:
            with eng._lock:
                if self._sent < len(seq.output):
                    self._sent += 1
                    return seq.output[self._sent - 1]
                if seq.finished:
                    self._open = False
                    eng.requests.pop(self.request_id, None)
                    if seq.finish_reason == "error":
                        raise RuntimeError(f"request {seq.seq_id} failed: {seq.error}")
                    break
                eng.step()
        raise StopIteration

    def close(self) -> None:
        """Abort the request if it has not finished, and let the engine forget it."""
        if self._open:
            self._open = False
            self.engine._forget(self.request_id)

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # garbage collection may run inside any engine call: only note the request, the engine aborts it
        if getattr(self, "_open", False):
            self.engine._orphans.append(self.request_id)


class LLMEngine:
    def __init__(self, runner: Runner, num_blocks: int, block_size: int, max_model_len: int, vocab_size: int,
                 scheduler_config: SchedulerConfig | None = None, enable_prefix_caching: bool = True,
                 eos_token_id: int | None = None, tokenizer=None, seed: int = 0,
                 block_manager: MemoryManager | None = None, drafter: Drafter | PromptLookup | None = None):
        self.runner = runner
        if block_manager is None:
            block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching)
        elif (block_manager.num_blocks, block_manager.block_size) != (num_blocks, block_size):
            raise ValueError(f"block_manager has {block_manager.num_blocks} blocks of {block_manager.block_size}, "
                             f"the engine was told {num_blocks} of {block_size}")
        self.block_manager = block_manager      # or another memory manager (chapter 7's ContiguousManager)
        self.drafter = as_drafter(drafter)      # a prompt lookup, or a draft model over a pool mirroring ours
        if self.drafter is not None:
            self.drafter.check_target(vocab_size, max_model_len, num_blocks, block_size)
        self.scheduler = Scheduler(scheduler_config or SchedulerConfig(), self.block_manager, max_model_len,
                                   self.drafter)
        self.vocab_size, self.eos_token_id, self.tokenizer = int(vocab_size), eos_token_id, tokenizer
        self.requests: dict[int, Sequence] = {}   # queued, running, and finished until their output is read
        self.step_observers: list = []          # fn(batch) for each step, after drafting and before running it
        self._next_id = 0
        self._seeds = np.random.default_rng(seed)
        self._lock = threading.RLock()          # one caller at a time inside the engine (see the module doc)
        self._orphans: deque[int] = deque()     # requests of streams dropped unfinished: aborted at next step

    @property
    def proposer(self) -> Drafter | None:
        """The draft model that fills each step's reserved drafts, or None (no drafter, or a prompt lookup)."""
        return None if self.drafter is None or isinstance(self.drafter, LookupDrafter) else self.drafter

    # -- requests ----------------------------------------------------------------------------------------
    def _encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("this engine has no tokenizer: pass token ids")
            try:
                prompt = self.tokenizer.encode(prompt)
            except UnicodeEncodeError as e:
                shown = prompt if len(prompt) <= 40 else prompt[:40] + "..."
                raise ValueError(f"prompt {shown!r} cannot be encoded as UTF-8: character {prompt[e.start]!r} at "
                                 f"position {e.start} is a lone surrogate ({e.reason})") from None
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
        with self._lock:
            return self._add(prompt, params, arrival_time)

    def _add(self, prompt, params, arrival_time) -> int:
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

    def _seq(self, request_id: int) -> Sequence:
        try:
            return self.requests[request_id]
        except KeyError:
            raise KeyError(f"no request {request_id!r} in this engine: never added, or finished and its output "
                           f"already handed over (the engine then forgets it)") from None

    def abort_request(self, request_id: int) -> None:
        """Stop a request wherever it is; its output (finish_reason "abort") stays readable with ``output``."""
        with self._lock:
            seq = self._seq(request_id)
            self.scheduler.abort(seq, self.runner.now())
            if seq.finished:
                self._release([seq])               # the draft model's state for it, if any

    def _forget(self, request_id: int) -> None:
        """Abort the request if it is unfinished, and drop it from ``requests``."""
        with self._lock:
            if request_id in self.requests:
                self.abort_request(request_id)
                del self.requests[request_id]

    def _reap(self) -> None:
        """Abort the requests of streams that were dropped unfinished."""
        while self._orphans:
            self._forget(self._orphans.popleft())

    def has_unfinished(self) -> bool:
        with self._lock:
            self._reap()
            return self.scheduler.has_unfinished()

    def output(self, request_id: int) -> RequestOutput:
        """The request's output so far. Once the request has finished, this hands its output over and the
        engine forgets it (a second call raises KeyError), so ``requests`` does not grow without bound."""
        with self._lock:
            s = self._seq(request_id)
            if s.finished:
                del self.requests[request_id]
            text = self.tokenizer.decode(s.output) if self.tokenizer is not None else None
            return RequestOutput(s.seq_id, list(s.prompt), list(s.output), text, s.finished, s.finish_reason,
                                 s.arrival_time, s.first_token_time, list(s.token_times), s.finish_time,
                                 s.num_cached_prompt, s.num_preemptions, s.error)

    # -- stepping ----------------------------------------------------------------------------------------
    def step(self) -> list[int]:
        """Run one scheduled step; return the ids of the requests that got a token (or [] if idle).

        A request that hits an internal error is finished with ``finish_reason == "error"`` and the step
        goes on with the others (see :meth:`Scheduler.fail`)."""
        with self._lock:
            self._reap()
            return self._step()

    def _step(self) -> list[int]:
        batch = self.scheduler.schedule(self.runner.now())
        if batch is None:
            self._release(self.scheduler.take_failed())
            return []
        if batch.needs_drafts:
            self.drafter.propose(batch)        # a draft model fills the reserved drafts
        for observe in self.step_observers:
            observe(batch)
        token_ids = self.runner.execute(batch)
        got = self.scheduler.postprocess(batch, token_ids, self.eos_token_id, self.runner.now())
        if self.drafter is not None:
            self.drafter.commit([s for s in batch.seqs if not s.finished])
        self._release([s for s in batch.seqs if s.finished] + self.scheduler.take_failed())
        return [s.seq_id for s in got]

    def _release(self, seqs) -> None:
        """Forget the draft model's cache of finished sequences."""
        if self.drafter is not None:
            for s in seqs:
                self.drafter.release(s)

    def add_step_observer(self, fn):
        """Call ``fn(batch)`` on every step's StepBatch, after its drafts are filled and before the runner
        computes it (studies count occupancy, tests check invariants). Returns ``fn``."""
        self.step_observers.append(fn)
        return fn

    def run(self, progress: bool = False) -> None:
        """Step until every queued request has finished (those of other threads too)."""
        with self._lock:
            total = len([s for s in self.requests.values() if not s.finished])
        bar = _Progress(total) if progress else None
        while True:
            with self._lock:
                if not self.has_unfinished():
                    break
                self.step()
                left = len(self.scheduler.waiting) + len(self.scheduler.running)
            if bar is not None:
                bar.update(max(0, total - left))
        if bar is not None:
            bar.close()

    def generate(self, prompts, params: SamplingParams | Iterable[SamplingParams] | None = None,
                 progress: bool | None = None) -> list[RequestOutput]:
        """Run ``prompts`` (texts or token-id lists) to completion; outputs in prompt order.

        Every prompt is validated before any is queued, so one bad prompt raises and queues nothing. If an
        internal error finishes any request of this call, raises :class:`RequestFailed` (a RuntimeError)
        once all of them have finished: its ``outputs`` hold every output of the call (the failed ones
        with ``finish_reason == "error"``), its ``failed`` their indices. A returned list never holds a
        failed request.

        Safe to call from several threads at once: the calls share the engine's steps, and each returns
        when its own requests have finished (greedy and seeded requests get the tokens they get alone).
        If the call is interrupted (an exception, KeyboardInterrupt), its unfinished requests are aborted.
        The engine forgets the call's requests once it returns.
        """
        if isinstance(prompts, str) or (len(prompts) and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        with self._lock:
            for i, (p, sp) in enumerate(zip(prompts, params)):   # validate everything first
                try:
                    sp = self._check_params(sp)
                    ids = self._encode(p)
                    self.scheduler.check_fits(Sequence(-1, ids, sp))
                except (TypeError, ValueError) as e:
                    raise _prefixed(e, f"prompt {i}: ") from e
            ids = [self._add(p, sp, None) for p, sp in zip(prompts, params)]
        try:
            self._wait(ids, len(ids) >= 8 if progress is None else progress)
        except BaseException:
            for i in ids:
                self._forget(i)
            raise
        outs = [self.output(i) for i in ids]
        failed = [j for j, o in enumerate(outs) if o.finish_reason == "error"]
        if failed:
            raise RequestFailed(outs, failed)
        return outs

    def _wait(self, ids: list[int], progress: bool) -> None:
        """Step until the requests ``ids`` have finished (other requests advance in the same steps)."""
        seqs = [self.requests[i] for i in ids]
        bar = _Progress(len(seqs)) if progress else None
        while True:
            with self._lock:
                done = sum(s.finished for s in seqs)
                if done < len(seqs):
                    if not self.has_unfinished():
                        raise RuntimeError("requests are unfinished but the scheduler holds none (a bug)")
                    self.step()
            if bar is not None:
                bar.update(done)
            if done == len(seqs):
                break
        if bar is not None:
            bar.close()

    def stream(self, prompt, params: SamplingParams | None = None) -> TokenStream:
        """Queue one request now (a bad request raises here) and return a :class:`TokenStream` that yields
        its tokens as they are sampled; other queued requests advance alongside. Closing the stream before
        its end, or dropping it, aborts the request. Raises RuntimeError (from the stream) if the request
        is finished by an internal error."""
        with self._lock:
            return TokenStream(self, self._add(prompt, params, None))

    def serve_trace(self, prompts, params, arrivals) -> list[RequestOutput]:
        """Serve requests that arrive over time (seconds on the runner's clock, sorted ascending).

        Each request is added once the clock reaches its arrival. When the engine is idle, a simulated
        runner's clock jumps to the next arrival; a real one sleeps until then. Holds the engine's lock
        throughout (other threads wait).
        """
        with self._lock:
            return self._serve_trace(prompts, params, arrivals)

    def _serve_trace(self, prompts, params, arrivals) -> list[RequestOutput]:
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
                self.runner.sleep(float(arrivals[order[nxt]]) - now)   # a simulated clock jumps there
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

    On a GPU, "torch" captures its CUDA graphs when the LLM is built (vLLM's and nano-vllm's startup
    capture): one per decode batch size up to ``max_num_seqs`` and one per mixed-step token bucket up to
    ``max_num_batched_tokens``, so decode-only and mixed steps replay graphs. ``enforce_eager=True`` (vLLM's
    name) captures none and runs every step eagerly. Elsewhere (CPU, "numpy", "simulated") there is nothing
    to capture.

    Other keyword arguments go to the runner (``dtype`` for "numpy"; ``device``, ``dtype``, ``attention``,
    ``max_graph_batch`` for "torch"; ``cost`` for "simulated"); any other name raises TypeError. "torch"
    needs the ``[gpu]`` extra (``pip install 'minillm[gpu]'``).
    """

    def __init__(self, model="tiny", runner: str = "numpy", num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 512, max_prefill_chunk: int | None = None,
                 enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, seed: int = 0,
                 num_speculative_tokens: int = 0, speculative_model="ngram", enforce_eager: bool = False,
                 **runner_kw):
        from ..model import Model, load_model
        from ..tokenizer import EOS, ByteTokenizer

        self._check_runner_kw(runner, runner_kw)
        if runner == "torch":
            runner_kw = {**runner_kw, "cuda_graphs": not enforce_eager}
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
            draft_run = self._runner(runner, draft, num_blocks, block_size, runner_kw)
            draft_run.prepare(replace(sched, num_speculative_tokens=0))   # one logits row per sequence
            drafter = DraftModelProposer(draft_run)
        run.prepare(sched)                      # the torch runner captures its CUDA graphs (none on CPU)
        self.engine = LLMEngine(run, num_blocks, block_size, cfg.max_seq_len, cfg.vocab_size, sched,
                                enable_prefix_caching, eos_token_id=EOS, tokenizer=ByteTokenizer(), seed=seed,
                                drafter=drafter)

    @staticmethod
    def _runner_class(kind: str):
        if kind == "numpy":
            from .runner import NumpyRunner
            return NumpyRunner
        if kind == "torch":
            try:
                from .torch_runner import TorchRunner
            except ImportError as e:
                if (e.name or "").split(".")[0] in ("torch", "triton"):
                    raise ImportError(f"runner='torch' needs PyTorch, which is not installed ({e}): install the "
                                      f"GPU extra, pip install 'minillm[gpu]'") from e
                raise
            return TorchRunner
        if kind == "simulated":
            from .runner import SimulatedRunner
            return SimulatedRunner
        raise ValueError(f"runner must be 'numpy', 'torch' or 'simulated', got {kind!r}")

    @classmethod
    def _runner_options(cls, kind: str) -> list[str]:
        """The keyword arguments the runner of this kind takes from ``LLM(...)``."""
        runner = cls._runner_class(kind)
        if kind == "simulated":
            return ["cost", "clock"]                              # its other fields are counters
        given = {"self", "model", "num_blocks", "block_size", "cuda_graphs"}   # the LLM passes these itself
        return [n for n in inspect.signature(runner).parameters if n not in given]

    @classmethod
    def _check_runner_kw(cls, kind: str, kw: dict) -> None:
        accepted = cls._runner_options(kind)
        bad = sorted(set(kw) - set(accepted))
        if bad:
            own = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "runner_kw")]
            raise TypeError(f"LLM() got unexpected keyword argument(s) {', '.join(map(repr, bad))}: it takes "
                            f"{', '.join(own)}, and for runner={kind!r} "
                            f"{', '.join(accepted) if accepted else 'nothing else'}")

    @classmethod
    def _runner(cls, kind: str, model, num_blocks: int, block_size: int, kw: dict):
        if kind == "simulated":
            return cls._runner_class(kind)(**kw)
        return cls._runner_class(kind)(model, num_blocks, block_size, **kw)

    def generate(self, prompts, params=None, progress: bool | None = None) -> list[RequestOutput]:
        """:meth:`LLMEngine.generate` (thread-safe; raises :class:`RequestFailed` if a request failed)."""
        return self.engine.generate(prompts, params, progress)

    def stream(self, prompt, params=None) -> TokenStream:
        """:meth:`LLMEngine.stream`: an iterator over one request's tokens (closing or dropping it aborts)."""
        return self.engine.stream(prompt, params)
