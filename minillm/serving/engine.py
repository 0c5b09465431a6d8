"""The engine: requests in, tokens out, one scheduler step at a time (nano-vllm's ``llm_engine.py``).

``LLMEngine`` ties a :class:`Scheduler` (which tokens run next), a :class:`BlockManager` (where their
K/V live) and a runner (which computes them) together. ``add_request`` / ``step`` is the streaming
interface a server loop calls; ``generate`` runs a list of prompts to completion; ``stream`` yields one
request's tokens as they come while everything else in the engine keeps running. ``LLM``
(:mod:`minillm.serving.llm`) builds an engine for a shipped model with one of the three runners, behind
vLLM's offline API; the output types are in :mod:`minillm.serving.outputs`.

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

import numbers
import sys
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

import numpy as np

from ..model import check_prompt_ids
from ..sampling import SEED_LIMIT
from .processing import execute as execute_step
from .block_manager import BlockManager
from .interfaces import Drafter, DraftRunner, LookupDrafter, MemoryManager, PromptLookup, Runner, as_drafter
from .outputs import CompletionOutput, Logprob, RequestOutput, TextDeltas, merge_samples
from .scheduler import Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence

__all__ = ["CompletionOutput", "LLMEngine", "Logprob", "PreparedRequest", "RequestFailed", "RequestOutput",
           "TokenStream"]


@dataclass(frozen=True)
class PreparedRequest:
    """A request checked and tokenized by :meth:`LLMEngine.prepare`, for :meth:`LLMEngine.add_prepared`."""
    ids: tuple[int, ...]
    params: SamplingParams
    prompt_text: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "ids", tuple(self.ids))


@dataclass(eq=False)
class _Request(Sequence):
    """A Sequence plus what only the front end needs: the prompt's text, per-token logprobs, stop strings."""
    prompt_text: str | None = None
    logprobs: list = field(default_factory=list)     # one dict[int, Logprob] per output token (if asked for)
    cumulative_logprob: float = 0.0
    stop_reason: str | int | None = None
    text_end: int | None = None         # the text is cut here (before the stop string that ended it)
    stop_checked: int = 0               # output tokens already searched for stop strings


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

    def text(self) -> Iterator[str]:
        """The same stream as text pieces: each step's new text, held back while it may be part of a
        multi-byte character or of a stop string (see :class:`~minillm.serving.outputs.TextDeltas`)."""
        deltas = TextDeltas(self._seq.params.stop)
        for _ in self:
            piece = deltas.push(self.engine.text(self._seq), self._seq.finished)
            if piece:
                yield piece
        piece = deltas.push(self.engine.text(self._seq), True)
        if piece:
            yield piece

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
        runner.check_engine(num_blocks, block_size, max_model_len)     # its pool and model fit these settings
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
    @staticmethod
    def _unpack(prompt):
        """(text or token ids, the prompt's text or None): vLLM's prompt dicts ``{"prompt": text}`` and
        ``{"prompt_token_ids": ids}`` are accepted besides a text and a list of ids."""
        if isinstance(prompt, dict):
            keys = set(prompt) - {"multi_modal_data", "mm_processor_kwargs"}
            if keys == {"prompt"} and isinstance(prompt["prompt"], str):
                return prompt["prompt"], prompt["prompt"]
            if keys <= {"prompt_token_ids", "prompt"} and "prompt_token_ids" in keys:
                return prompt["prompt_token_ids"], prompt.get("prompt")
            raise ValueError(f"a prompt dict holds 'prompt' (a text) or 'prompt_token_ids', got keys {sorted(prompt)}")
        return prompt, prompt if isinstance(prompt, str) else None

    def _encode(self, prompt) -> list[int]:
        prompt = self._unpack(prompt)[0]
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise TypeError("this engine has no tokenizer: pass token ids")
            try:
                prompt = self.tokenizer.encode(prompt)
            except UnicodeEncodeError as e:
                shown = prompt if len(prompt) <= 40 else prompt[:40] + "..."
                raise ValueError(f"prompt {shown!r} cannot be encoded as UTF-8: character {prompt[e.start]!r} at "
                                 f"position {e.start} is a lone surrogate ({e.reason})") from None
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], numbers.Integral):
            self.scheduler.check_prompt_length(len(prompt))     # before checking every id of a huge prompt
        return check_prompt_ids(prompt, self.vocab_size)

    def _check_params(self, params, one_sample: bool = True) -> SamplingParams:
        """``params`` (None: the defaults) checked against this engine: a clear error if they cannot apply."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids {bad} lie outside the vocabulary [0, {self.vocab_size}): "
                             f"the model can never emit them")
        if one_sample and params.n != 1:
            raise ValueError(f"add_request and stream run one sample (n=1), got n={params.n}: generate() runs n "
                             f"samples per prompt (or add n requests, with seeds seed + i)")
        if params.needs_host_sampling and not isinstance(self.runner, DraftRunner):
            raise ValueError(f"min_p, repetition_penalty and logprobs need a runner that computes logits; "
                             f"{type(self.runner).__name__} computes none")
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer (this engine has none): use stop_token_ids")
        return params

    def add_request(self, prompt, params: SamplingParams | None = None, arrival_time: float | None = None) -> int:
        """Queue a request; return its id. Raises (and queues nothing) if the request is invalid.

        ``prompt``: a text, a list of token ids, or vLLM's ``{"prompt": text}`` / ``{"prompt_token_ids": ids}``.
        One sample per request (``params.n`` must be 1). The prompt is tokenized and checked before the engine's
        lock is taken (:meth:`prepare`), so a long prompt does not hold up the steps of the others."""
        return self.add_prepared(self.prepare(prompt, params), arrival_time)

    def prepare(self, prompt, params: SamplingParams | None = None) -> PreparedRequest:
        """``params`` checked against this engine and ``prompt`` tokenized and checked, as add_request does (and
        raising as it does), without the lock: it reads only the engine's fixed settings, so any thread may
        prepare while the engine steps. :meth:`add_prepared` queues the result."""
        params = self._check_params(params)
        return PreparedRequest(self._encode(prompt), params, self._unpack(prompt)[1])

    def add_prepared(self, request: PreparedRequest, arrival_time: float | None = None) -> int:
        """Queue a request made by :meth:`prepare`; return its id (raises RequestRejected if it can never fit)."""
        if not isinstance(request, PreparedRequest):
            raise TypeError(f"add_prepared takes what prepare() returns, got {type(request).__name__}")
        with self._lock:
            return self._enqueue(request, arrival_time)

    def _add(self, prompt, params, arrival_time) -> int:
        return self._enqueue(self.prepare(prompt, params), arrival_time)

    def _enqueue(self, request: PreparedRequest, arrival_time) -> int:
        ids, params = request.ids, request.params
        seed = params.seed if params.seed is not None else int(self._seeds.integers(0, 2**31))
        if arrival_time is None:
            arrival_time = self.runner.now()
        elif isinstance(arrival_time, bool) or not isinstance(arrival_time, numbers.Real) or \
                not np.isfinite(arrival_time):
            raise ValueError(f"arrival_time must be a finite number (seconds on the runner's clock), "
                             f"got {arrival_time!r}")
        seq = _Request(self._next_id, list(ids), params, float(arrival_time), seed=seed,
                       prompt_text=request.prompt_text)
        self.scheduler.add(seq)         # raises RequestRejected for a request that can never fit
        self.requests[seq.seq_id] = seq
        self._next_id += 1
        return seq.seq_id

    def _seq(self, request_id: int) -> _Request:
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

    @property
    def lock(self):
        """The engine's re-entrant lock: every public method takes it; hold it to read ``requests`` or to run
        several calls as one from another thread (the server's engine loop does)."""
        return self._lock

    def output(self, request_id: int) -> RequestOutput:
        """The request's output so far. Once the request has finished, this hands its output over and the
        engine forgets it (a second call raises KeyError), so ``requests`` does not grow without bound."""
        with self._lock:
            s = self._seq(request_id)
            if s.finished:
                del self.requests[request_id]
            text = self.text(s)
            lps = list(s.logprobs) if s.params.logprobs is not None else None     # (s: a _Request, always)
            comp = CompletionOutput(0, text, list(s.output), s.cumulative_logprob if lps is not None else None, lps,
                                    s.finish_reason, s.stop_reason)
            return RequestOutput(s.seq_id, list(s.prompt), list(s.output), text, s.finished, s.finish_reason,
                                 s.arrival_time, s.first_token_time, list(s.token_times), s.finish_time,
                                 s.num_cached_prompt, s.num_preemptions, s.error, s.prompt_text,
                                 [comp])

    def text(self, seq: Sequence) -> str | None:
        """A sequence's output as text (cut before the stop string that ended it), or None without a tokenizer."""
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(seq.output)
        end = getattr(seq, "text_end", None)
        return text if end is None else text[:end]

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
        token_ids, row_logprobs = execute_step(self.runner, batch)
        rows = batch.row_params() if row_logprobs is not None else None    # before the outputs grow
        now = self.runner.now()
        got = self.scheduler.postprocess(batch, token_ids, self.eos_token_id, now)
        if row_logprobs is not None:
            self._keep_logprobs(batch, rows, token_ids, row_logprobs)
        for s in got:
            if s.params.stop_token_ids and s.finish_reason == "stop" and s.output[-1] in s.params.stop_token_ids:
                s.stop_reason = s.output[-1]
            if s.params.stop and s.finish_reason not in ("abort", "error"):
                self._check_stop_strings(s, now)
        if self.drafter is not None:
            self.drafter.commit([s for s in batch.seqs if not s.finished])
        self._release([s for s in batch.seqs if s.finished] + self.scheduler.take_failed())
        return [s.seq_id for s in got]

    def _keep_logprobs(self, batch, row_params, token_ids, rows) -> None:
        """Attach each row's logprobs to the output token it produced (rows of rejected drafts are dropped)."""
        seq_idx, step = row_params
        dec = self.tokenizer.decode if self.tokenizer is not None else (lambda ids: None)
        for r, info in enumerate(rows):
            if info is None:
                continue
            s, j = batch.seqs[seq_idx[r]], int(step[r])
            if s.finish_reason == "error" or j != len(s.logprobs) or j >= len(s.output) or \
                    s.output[j] != int(token_ids[r]):
                continue
            lp, rank, top_ids, top_lps = info
            d = {i: Logprob(v, k + 1, dec([i])) for k, (i, v) in enumerate(zip(top_ids, top_lps))}
            d[s.output[j]] = Logprob(lp, rank, dec([s.output[j]]))
            s.logprobs.append(d)
            s.cumulative_logprob += lp

    def _check_stop_strings(self, s, now: float) -> None:
        """Finish ``s`` with reason "stop" if its text now contains one of its stop strings: its tokens end
        with the one that completed the string (later ones, from the same speculative step, are dropped) and
        its text ends before the string."""
        dec = self.tokenizer.decode
        longest = max(len(x) for x in s.params.stop)
        prev = len(dec(s.output[:s.stop_checked]))
        for j in range(s.stop_checked + 1, len(s.output) + 1):
            text = dec(s.output[:j])
            start = max(0, prev - longest + 1)
            hits = [(i, x) for x in s.params.stop if (i := text.find(x, start)) >= 0]
            prev = len(text)
            if hits:
                i, x = min(hits)
                del s.output[j:], s.token_times[j:], s.logprobs[j:]
                s.cumulative_logprob = sum(d[t].logprob for d, t in zip(s.logprobs, s.output))
                s.text_end, s.stop_reason = i, x
                if s.finished:
                    s.finish_reason = "stop"
                else:
                    self.scheduler.finish(s, "stop", now)
                break
        s.stop_checked = len(s.output)

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
        """Run ``prompts`` (texts, token-id lists or vLLM's prompt dicts) to completion; one
        :class:`RequestOutput` per prompt, in prompt order, with ``params.n`` samples in its ``outputs``.

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
        if not isinstance(prompts, (str, dict, list, tuple)):
            raise TypeError(f"prompts must be a text, a list of token ids, a prompt dict or a list of them, got "
                            f"{type(prompts).__name__}")
        if isinstance(prompts, (str, dict)) or (len(prompts) and isinstance(prompts[0], (int, np.integer))):
            prompts = [prompts]
        with self._lock:
            samples = []                                        # (prompt index, prompt, params of one sample)
            for i, (p, sp) in enumerate(zip(prompts, self._validated(prompts, params, one_sample=False))):
                for c in range(sp.n):
                    seed = None if sp.seed is None else (sp.seed + c) % SEED_LIMIT
                    samples.append((i, p, sp if sp.n == 1 else replace(sp, n=1, seed=seed)))
            ids = [self._add(p, sp, None) for _, p, sp in samples]
        try:
            self._wait(ids, len(ids) >= 8 if progress is None else progress)
        except BaseException:
            for i in ids:
                self._forget(i)
            raise
        got = [self.output(i) for i in ids]
        outs = []
        for i in range(len(prompts)):
            mine = [o for (j, _, _), o in zip(samples, got) if j == i]
            outs.append(mine[0] if len(mine) == 1 else merge_samples(mine))
        failed = [j for j, o in enumerate(outs) if any(c.finish_reason == "error" for c in o.outputs)]
        if failed:
            raise RequestFailed(outs, failed)
        return outs

    def _validated(self, prompts, params, one_sample: bool) -> list[SamplingParams]:
        """Each prompt's checked SamplingParams (``params``: one for all, or a list, one per prompt); raises,
        naming the prompt, if any prompt or params cannot run on this engine."""
        if params is None or isinstance(params, (SamplingParams, dict, str)):
            params = [params] * len(prompts)          # one for all (a wrong type is named by _check_params)
        else:
            try:
                params = list(params)                 # any iterable, one per prompt (a generator too)
            except TypeError:
                raise TypeError(f"params must be SamplingParams or an iterable of them, one per prompt, got "
                                f"{type(params).__name__}") from None
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        out = []
        for i, (p, sp) in enumerate(zip(prompts, params)):
            try:
                sp = self._check_params(sp, one_sample)
                self.scheduler.check_fits(Sequence(-1, self._encode(p), sp))
            except (TypeError, ValueError) as e:
                raise _prefixed(e, f"prompt {i}: ") from e
            out.append(sp)
        return out

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
        """Serve requests that arrive over time; one output per prompt, in prompt order.

        ``params``: one SamplingParams for all (n=1), or a list, one per prompt; ``arrivals``: one per prompt,
        seconds after the call (>= 0, finite, in any order) on the runner's clock. Everything is validated
        before anything is queued (a bad prompt, params or arrival raises and queues nothing). Each request
        is added once the clock reaches its arrival. When the engine is idle, a simulated runner's clock jumps
        to the next arrival; a real one sleeps until then. Holds the engine's lock throughout (other threads
        wait). If the call is interrupted (an exception, KeyboardInterrupt), its requests are aborted and
        forgotten.
        """
        if isinstance(prompts, (str, dict)):
            raise TypeError("prompts must be a list of prompts (texts, token-id lists or prompt dicts)")
        prompts, arrivals = list(prompts), list(arrivals)
        if len(arrivals) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(arrivals)} arrival times")
        for i, a in enumerate(arrivals):
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, numbers.Real) or not np.isfinite(a) or a < 0:
                raise ValueError(f"arrivals[{i}] must be a finite number of seconds >= 0 (after the call), got {a!r}")
        with self._lock:
            params = self._validated(prompts, params, one_sample=True)
            ids: dict[int, int] = {}
            try:
                return self._serve_trace(prompts, params, [float(a) for a in arrivals], ids)
            except BaseException:
                for rid in ids.values():
                    self._forget(rid)
                raise

    def _serve_trace(self, prompts, params, arrivals, ids: dict[int, int]) -> list[RequestOutput]:
        order = np.argsort(np.asarray(arrivals, np.float64), kind="stable")
        t0 = self.runner.now()
        nxt = 0
        while nxt < len(order) or self.has_unfinished():
            now = self.runner.now() - t0
            while nxt < len(order) and arrivals[order[nxt]] <= now:
                i = int(order[nxt])
                ids[i] = self._add(prompts[i], params[i], t0 + arrivals[i])
                nxt += 1
            if self.has_unfinished():
                self.step()
            elif nxt < len(order):
                self.runner.sleep(arrivals[order[nxt]] - now)   # a simulated clock jumps there
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

