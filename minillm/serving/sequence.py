"""A request as the engine sees it: its tokens, how many have K/V in the cache, its blocks and its clock.

A sequence's tokens are its prompt followed by what it has generated. ``num_computed`` of them have
K/V in the cache; the rest are computed by the next steps: many at once while it is prefilling (in
chunks if the token budget is short), then exactly one per step while it decodes (the last sampled
token, whose K/V nobody has computed yet). Preemption by recompute sets ``num_computed`` back to 0 and
keeps the tokens: the sequence prefills prompt + output again and carries on where it stopped.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from ..sampling import SEED_LIMIT


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__") or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _real(value) -> float | None:
    """``value`` as a Python float if it is a real number (int, float, NumPy integer or float), else None.
    Booleans are not numbers here."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def _token_ids(name: str, value) -> tuple[int, ...]:
    """A tuple of token ids (integers >= 0) from any iterable of integers, or a clear TypeError / ValueError."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a sequence of token ids, e.g. (2,), got {value!r}")
    out = []
    for t in value:
        if isinstance(t, bool) or not hasattr(t, "__index__"):
            raise TypeError(f"{name} must hold integer token ids, got {t!r} in {value!r}")
        if int(t) < 0:
            raise ValueError(f"{name} must hold token ids >= 0, got {int(t)}")
        out.append(int(t))
    return tuple(out)


def _stop_strings(value) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (None: none; one string: that one)."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"stop must be a string or a list of strings, got {value!r}")
    out = tuple(value)
    for s in out:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop must hold non-empty strings, got {s!r} in {value!r}")
    return out


MAX_LOGPROBS = 20       # as vLLM's default max_logprobs: the most alternatives a request may ask for per token
GREEDY_BELOW = 1e-5     # as vLLM's _SAMPLING_EPS: a lower temperature samples greedily


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded: the common subset of vLLM's ``SamplingParams``, with the same names.

    The book's one different default: ``temperature=0`` (greedy), where vLLM's is 1.0, so that chapters'
    runs are deterministic; pass ``temperature=1.0`` for vLLM's behaviour. Every other default is vLLM's.

    n              completions per prompt (each is a request of its own; with a seed, completion i uses
                   seed + i, so they differ); ``LLM.generate`` returns them in ``RequestOutput.outputs``
    temperature    0 is greedy (argmax); > 0 samples from softmax(logits / temperature); below
                   GREEDY_BELOW (vLLM's 1e-5) it is stored as 0, greedy: the limit of sampling as the
                   temperature falls, where dividing the logits by it would overflow
    top_k          keep the k most likely tokens; None, 0 or -1 (vLLM's "off") keep all (stored as None)
    top_p          keep the smallest set of most likely tokens with probability >= top_p, in (0, 1]
    min_p          drop the tokens less likely than min_p times the most likely one, in [0, 1] (0: off);
                   applied to the tempered distribution before top-k/top-p, as vLLM does
    repetition_penalty  > 0 (1: off). Every token already in the prompt or the output has its logit divided by
                   it where positive and multiplied by it where negative (CTRL's rule, vLLM's), before
                   temperature; greedy requests too
    max_tokens     tokens to generate at most (>= 1)
    stop           strings: generation stops once the text contains one; the text ends before it and the
                   token ids end with the token that completed it; ``stop_reason`` is the string
    stop_token_ids generation stops after emitting one of these (it is kept in the output); token ids >= 0
                   (the engine checks them against its vocabulary when the request is added)
    ignore_eos     do not stop at the end-of-sequence token (for fixed-length benchmarks)
    logprobs       None, or return for each output token its log-probability and those of the ``logprobs``
                   most likely tokens (0: the sampled one only), at most 20. As vLLM by default, they are
                   log-softmax of the model's raw logits (before temperature, penalties and truncation)
    seed           the request's own randomness: the same seed gives the same tokens whatever the batch,
                   with speculative decoding too (the scheduler never trims a seeded sampling request's
                   drafts to fit the others: see minillm.serving.scheduler); an integer in [0, 2**32) (the
                   sampler hashes 32 bits of it, so a larger seed would alias)

    ``min_p``, ``repetition_penalty`` and ``logprobs`` take a slower path: the steps that serve such a request
    sample on the host with NumPy (:mod:`minillm.serving.processing`); the other steps are unchanged.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None

    def __post_init__(self):
        # numbers of any real type (Python's or NumPy's) are accepted and stored as Python float / int
        t = _real(self.temperature)
        if t is None or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        p = _real(self.top_p)
        if p is None or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        m = _real(self.min_p)
        if m is None or not 0 <= m <= 1:
            raise ValueError(f"min_p must be a number in [0, 1] (0 = off), got {self.min_p!r}")
        r = _real(self.repetition_penalty)
        if r is None or not math.isfinite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), got "
                             f"{self.repetition_penalty!r}")
        set_ = lambda name, v: object.__setattr__(self, name, v)  # noqa: E731 (a frozen dataclass)
        set_("temperature", 0.0 if t < GREEDY_BELOW else t)
        set_("top_p", p)
        set_("min_p", m)
        set_("repetition_penalty", r)
        if self.top_k is not None:
            k = self.top_k
            if not isinstance(k, (bool, np.bool_)) and hasattr(k, "__index__") and int(k) in (0, -1):
                set_("top_k", None)                 # vLLM's "off" (-1, and 0 in its newer releases)
            else:
                set_("top_k", check_int("top_k", k, 1))
        set_("max_tokens", check_int("max_tokens", self.max_tokens, 1))
        set_("n", check_int("n", self.n, 1))
        if self.seed is not None:
            seed = check_int("seed", self.seed, 0)
            if seed >= SEED_LIMIT:
                raise ValueError(f"seed must be an integer in [0, 2**32), got {self.seed!r}: the sampler hashes "
                                 f"32 bits of it, so seed and seed + 2**32 would give the same tokens")
            set_("seed", seed)
        if self.logprobs is not None:
            lp = check_int("logprobs", self.logprobs, 0)
            if lp > MAX_LOGPROBS:
                raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {self.logprobs!r}")
            set_("logprobs", lp)
        set_("stop_token_ids", _token_ids("stop_token_ids", self.stop_token_ids))
        set_("stop", _stop_strings(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_host_sampling(self) -> bool:
        """True if a step serving this request samples on the host (min_p, repetition_penalty or logprobs)."""
        return self.min_p > 0 or self.repetition_penalty != 1 or self.logprobs is not None


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt: list[int]
    params: SamplingParams
    arrival_time: float = 0.0
    seed: int = 0                       # params.seed, or one the engine drew for this request
    output: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed: int = 0               # tokens whose K/V is in the cache
    block_table: list[int] = field(default_factory=list)   # a range(start, end) under ContiguousManager
    num_cached_prompt: int = 0          # prompt tokens found in the prefix cache at first admission
    num_preemptions: int = 0
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None
    finish_reason: str | None = None    # "length", "stop", "abort", or "error" (an internal error; see error)
    admitted: bool = False
    error: str | None = None            # what went wrong, when finish_reason is "error"

    def __len__(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def token(self, i: int) -> int:
        n = len(self.prompt)
        return self.prompt[i] if i < n else self.output[i - n]

    @property
    def num_pending(self) -> int:
        """Tokens still to push through the model before the next token can be sampled."""
        return len(self) - self.num_computed

    @property
    def is_decoding(self) -> bool:
        return bool(self.output) and self.num_pending == 1

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
