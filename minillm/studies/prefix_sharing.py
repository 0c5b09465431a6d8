"""Chapter 7: prefix sharing -- many agents behind one long system prompt, with and without prefix caching."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..paged.allocator import ceil_div, check_count
from ..paged.cache import PagedKVCache


@dataclass(frozen=True)
class PromptRequest:
    rid: int
    tokens: tuple[int, ...]   # system prompt followed by this request's own part
    output_len: int


def agent_workload(n_agents: int, system_prompt_len: int, user_len: int, seed: int = 0, output_len: int = 64,
                   vocab_size: int = 32000) -> list[PromptRequest]:
    """``n_agents`` requests with the same ``system_prompt_len`` tokens in front of ``user_len`` tokens of their own."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab_size, check_count("system_prompt_len", system_prompt_len, 0)).tolist()
    user_len = check_count("user_len", user_len)   # >= 1: the last prompt token is always computed
    return [PromptRequest(i, tuple(system + rng.integers(0, vocab_size, user_len).tolist()), output_len)
            for i in range(check_count("n_agents", n_agents))]


@dataclass(frozen=True)
class PrefixSharingStats:
    n_requests: int
    concurrent: bool
    peak_blocks_shared: int      # most blocks in use at once, with prefix caching
    peak_blocks_unshared: int    # ... without
    prefill_tokens_shared: int   # prompt tokens whose K/V had to be computed, with prefix caching
    prefill_tokens_unshared: int

    @property
    def memory_ratio(self) -> float:
        return self.peak_blocks_unshared / self.peak_blocks_shared

    @property
    def prefill_ratio(self) -> float:
        return self.prefill_tokens_unshared / self.prefill_tokens_shared


def _run_prefix(requests: Sequence[PromptRequest], block_size: int, share: bool, concurrent: bool) -> tuple[int, int]:
    """Serve the requests one after another on a real PagedKVCache; return (peak used blocks, prefill tokens)."""
    num_blocks = sum(ceil_div(len(r.tokens) + r.output_len, block_size) for r in requests) + 1
    cache = PagedKVCache(1, 1, 1, num_blocks, block_size)   # the values do not matter here, only the blocks
    peak = prefill = 0
    for r in requests:
        prefix = cache.lookup_prefix(r.tokens[:-1]) if share else []   # the last prompt token is always computed
        start = cache.add_sequence(r.rid, prefix)
        rest = r.tokens[start:]
        prefill += len(rest)
        cache.append(r.rid, np.zeros((1, len(rest), 1, 1), np.float32), np.zeros((1, len(rest), 1, 1), np.float32),
                     tokens=rest if share else None)
        if r.output_len:
            out = np.zeros((1, r.output_len, 1, 1), np.float32)
            # generated tokens: ids outside any prompt's vocabulary, distinct per request
            cache.append(r.rid, out, out, tokens=[-1 - r.rid] * r.output_len if share else None)
        peak = max(peak, cache.allocator.num_used)
        if not concurrent:
            cache.release(r.rid)
    return peak, prefill


def simulate_prefix_sharing(requests: Sequence[PromptRequest], block_size: int = 16,
                            concurrent: bool = True) -> PrefixSharingStats:
    """Memory and prefill work with and without content-hash prefix caching.

    ``concurrent=True``: every request stays resident (a batch of agents running
    at once), so the peak counts all of them. ``concurrent=False``: each
    finishes before the next arrives; the peak is one request, and what is
    shared is whatever the eviction policy kept cached.
    """
    shared = _run_prefix(requests, block_size, True, concurrent)
    unshared = _run_prefix(requests, block_size, False, concurrent)
    return PrefixSharingStats(len(requests), concurrent, shared[0], unshared[0], shared[1], unshared[1])
