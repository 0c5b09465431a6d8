"""Chapters 1-2: the decode loops -- naive, and with a KV cache -- and the per-step record they return.

``naive_decode`` is the decoder with no memory: at every step it runs the full
forward pass over the whole sequence so far and keeps only the last row of the
logits. Everything it computes for positions 0..t-1 it computed already at the
previous step. The op counter makes that visible: step t pushes t rows through
attention, so N steps cost 1 + 2 + ... + N = N(N+1)/2 rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .model import StepOps, check_prompt_ids
from .sampling import greedy


@dataclass
class DecodeResult:
    """What a decoder returns: the tokens and, per generated token, what it cost."""

    tokens: list[int]
    prompt_len: int
    logits: list[np.ndarray] = field(default_factory=list, repr=False)
    steps: list[StepOps] = field(default_factory=list, repr=False)
    step_seconds: list[float] = field(default_factory=list, repr=False)

    def record(self, token: int, logits: np.ndarray, ops: StepOps, seconds: float) -> None:
        self.tokens.append(token)
        self.logits.append(np.asarray(logits))
        self.steps.append(ops)
        self.step_seconds.append(seconds)

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def total(self) -> StepOps:
        return sum(self.steps, StepOps())


def check_decode_args(model, prompt_ids, n_new: int) -> list[int]:
    """Shared validation for every decoder; returns the prompt as a list of ints."""
    ids = check_prompt_ids(prompt_ids, model.config.vocab_size)
    if isinstance(n_new, bool) or not isinstance(n_new, (int, np.integer)) or n_new < 1:
        raise ValueError(f"n_new must be a positive integer, got {n_new!r}")
    max_len = model.config.max_seq_len
    if len(ids) > max_len:
        raise ValueError(f"prompt has {len(ids)} tokens, longer than max_seq_len={max_len}")
    # The last sampled token is never fed back, so prompt + n_new - 1 positions are processed.
    if len(ids) + n_new - 1 > max_len:
        raise ValueError(f"prompt ({len(ids)}) + n_new ({n_new}) - 1 exceeds max_seq_len={max_len}")
    return ids


def naive_decode(model, prompt_ids, n_new: int, sampler=greedy) -> DecodeResult:
    """Generate ``n_new`` tokens by re-running the whole sequence at every step."""
    # BEGIN SOLUTION
    tokens = check_decode_args(model, prompt_ids, n_new)
    result = DecodeResult(tokens=tokens, prompt_len=len(tokens))
    for _ in range(n_new):
        ops = StepOps()
        t0 = time.perf_counter()
        logits = model.forward(np.asarray(tokens), ops=ops)  # (N, V): every row recomputed
        nxt = int(sampler(logits[-1]))                        # ...and only the last one used
        result.record(nxt, logits[-1], ops, time.perf_counter() - t0)
    return result
    # END SOLUTION


def prefill(model, prompt_ids, cache, ops: StepOps | None = None) -> np.ndarray:
    """Phase 1: one parallel pass over the whole prompt; fills the cache; returns last-position logits."""
    # BEGIN SOLUTION
    logits = model.forward(np.asarray(prompt_ids)[None], cache=cache, ops=ops)
    return logits[0, -1]
    # END SOLUTION


def decode_step(model, token_id: int, cache, ops: StepOps | None = None) -> np.ndarray:
    """Phase 2: push one token through the model against the cache; returns its logits."""
    # BEGIN SOLUTION
    logits = model.forward(np.asarray([[token_id]]), cache=cache, ops=ops)
    return logits[0, -1]
    # END SOLUTION


def check_decode_cache(cache, positions: int) -> None:
    """A cache handed to :func:`cached_decode` must be empty, hold one sequence and fit ``positions``.

    The prefill writes the prompt at position ``cache.length``, so a cache that already holds positions
    would silently decode a different (longer) sequence: it is refused (``cache.reset()`` or
    ``cache.truncate(0)`` empties one). Batch and capacity are checked where the cache states them
    (a contiguous ``KVCache``); a growing or paged cache reports running out itself.
    """
    length = getattr(cache, "length", None)
    if length != 0:
        raise ValueError(f"cached_decode needs an empty cache, but this one already holds {length} positions "
                         f"(empty it with cache.reset() or cache.truncate(0), or pass a new one)")
    shape = tuple(getattr(getattr(cache, "k", None), "shape", ()))
    tables = getattr(cache, "tables", None)
    batch = shape[1] if len(shape) == 5 else (len(tables) if isinstance(tables, list) else 1)
    if batch != 1:
        raise ValueError(f"cached_decode decodes one sequence, but the cache has batch {batch}")
    capacity = getattr(cache, "capacity", None)
    if capacity is not None and capacity < positions:
        raise ValueError(f"the cache holds {capacity} positions, but the prompt + n_new - 1 = {positions} "
                         f"positions need to be cached")


def cached_decode(model, prompt_ids, n_new: int, sampler=greedy, cache=None) -> DecodeResult:
    """Generate ``n_new`` tokens: prefill once, then one cached decode step per token.

    ``cache`` (default: a new ``KVCache`` of exactly the size needed) must be empty and hold one sequence:
    see :func:`check_decode_cache`.
    """
    prompt = check_decode_args(model, prompt_ids, n_new)
    if cache is None:
        cache = model.new_cache(batch=1, capacity=len(prompt) + n_new - 1)
    else:
        check_decode_cache(cache, len(prompt) + n_new - 1)
    tokens = list(prompt)
    result = DecodeResult(tokens=tokens, prompt_len=len(prompt))
    for step in range(n_new):
        ops = StepOps()
        t0 = time.perf_counter()
        if step == 0:
            logits = prefill(model, prompt, cache, ops)
        else:
            logits = decode_step(model, tokens[-1], cache, ops)
        nxt = int(sampler(logits))
        result.record(nxt, logits, ops, time.perf_counter() - t0)
    return result
