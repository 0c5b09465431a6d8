"""What the engine hands back: :class:`RequestOutput` (one prompt) holding :class:`CompletionOutput`\\ s (one per
sample), in vLLM's shape, plus the book's timing fields; and :class:`TextDeltas`, which turns a growing list of
token ids into text pieces safe to show as they come (what a stream and the HTTP server send).

A ``RequestOutput`` answers both vocabularies:

* vLLM's: ``prompt``, ``prompt_token_ids``, ``outputs[i].{index, text, token_ids, cumulative_logprob, logprobs,
  finish_reason, stop_reason}``, ``finished``, ``num_cached_tokens``;
* the book's (chapters 8-11, the benchmarks): ``token_ids``, ``text``, ``finish_reason`` (those of the first
  completion) and the timings ``arrival_time``, ``first_token_time``, ``token_times``, ``finish_time`` with
  ``ttft``, ``tpot``, ``itl`` and ``e2e``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Logprob:
    """One token's log-probability (log-softmax of the model's raw logits) and its rank (1 = most likely)."""
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    """One sample of a prompt (vLLM's class of the same name).

    ``logprobs``: None unless the request asked for them; else one dict per token of ``token_ids``, mapping the
    sampled token and the ``SamplingParams.logprobs`` most likely ones to their :class:`Logprob`.
    ``finish_reason``: "stop" (end-of-sequence, a stop token or a stop string), "length" (max_tokens or the
    model's context), "abort", "error", or None while unfinished. ``stop_reason``: the stop string or stop
    token id that ended it (None for end-of-sequence and the other reasons)."""
    index: int
    text: str | None
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """One prompt's output. The fields before ``outputs`` are the book's (those of the first completion, or the
    only one); ``outputs`` holds every completion (``SamplingParams.n`` of them)."""
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
    prompt: str | None = None       # the prompt as text, when it was given as text (vLLM's field)
    outputs: list[CompletionOutput] = field(default_factory=list)

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


def merge_samples(children: list[RequestOutput]) -> RequestOutput:
    """One RequestOutput for the ``n`` samples of one prompt (each ran as a request of its own): the first
    sample's fields, every sample in ``outputs`` (indexed 0..n-1), finished when all are."""
    first = children[0]
    outs = []
    for i, c in enumerate(children):
        o = c.outputs[0]
        outs.append(CompletionOutput(i, o.text, o.token_ids, o.cumulative_logprob, o.logprobs, o.finish_reason,
                                     o.stop_reason))
    finished = all(c.finished for c in children)
    return RequestOutput(first.request_id, first.prompt_token_ids, first.token_ids, first.text, finished,
                         first.finish_reason, first.arrival_time, first.first_token_time, first.token_times,
                         first.finish_time, first.num_cached_tokens, sum(c.num_preemptions for c in children),
                         next((c.error for c in children if c.error), None), first.prompt, outs)


class TextDeltas:
    """The text of a growing list of token ids, handed out in pieces that are never taken back.

    ``push(text, finished)`` takes the whole text so far (the tokenizer's decode of all output tokens, already
    cut at a stop string once one is found) and returns the part not yet handed out. Until the request has
    finished it holds back (a) a trailing U+FFFD, which may be a multi-byte UTF-8 character still arriving, and
    (b) the last ``len(longest stop string) - 1`` characters, which may turn out to be the start of a stop
    string that the final text does not contain (vLLM holds back the same way)."""

    def __init__(self, stop: tuple[str, ...] = ()):
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = 0

    def push(self, text: str, finished: bool) -> str:
        end = len(text)
        if not finished:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
            end -= self.hold
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece
