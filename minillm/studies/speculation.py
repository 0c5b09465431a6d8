"""Chapter 9: speculative decoding measured -- acceptance, tokens per target call, and what they cost.

* :func:`held_out_source` -- chunks of this package's own ``.py`` files, tokenized: code the models never saw
  (they were trained on the Python standard library)
* :func:`expected_tokens_per_call` -- the i.i.d. model: each draft accepted independently with probability alpha
* :func:`alpha_from_tokens_per_call` -- its inverse in alpha: the alpha a measured tokens-per-call implies
* :func:`speedup_model` -- that, divided by the cost of a round in target-call units, ``1 + k * c``
* :class:`SpecStats` / :func:`pool_results` -- per-call statistics of many :class:`~minillm.speculative.SpecResult`
  runs pooled together, with the conditional acceptance rate alpha the i.i.d. model needs
* :func:`verify_step_seconds` / :func:`batched_speedup_model` -- a roofline step cost with k+1 query rows per
  sequence, to show why speculation stops paying once a batch makes the step compute-bound
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np


HELD_OUT = Path(__file__).resolve().parents[1] / "data" / "held_out_python.txt"


def held_out_source(n: int, n_bytes: int = 200, seed: int = 0, stride: int = 1500) -> list[list[int]]:
    """``n`` byte-token chunks of ``n_bytes`` characters of Python the models never saw, chosen at random (seeded).

    The text is ``minillm/data/held_out_python.txt``: a frozen snapshot of this package's own source taken on
    2026-12-02 (the models trained on the standard library). Frozen, so the chapters' numbers do not move
    whenever the package's code is edited. Chunks start every ``stride`` characters.
    """
    from ..tokenizer import ByteTokenizer
    if n < 1 or n_bytes < 1:
        raise ValueError(f"n and n_bytes must be >= 1, got {n}, {n_bytes}")
    tok = ByteTokenizer()
    text = HELD_OUT.read_text()
    chunks = [tok.encode(text[s:s + n_bytes]) for s in range(0, len(text) - n_bytes + 1, stride)]
    if n > len(chunks):
        raise ValueError(f"only {len(chunks)} chunks of {n_bytes} characters, asked for {n}")
    rng = np.random.default_rng(seed)
    return [chunks[i] for i in rng.choice(len(chunks), n, replace=False)]


def expected_tokens_per_call(alpha, k):
    """E[tokens emitted per target call] = (1 - alpha^(k+1)) / (1 - alpha) (k + 1 at alpha = 1).

    Drafts are accepted one after another, each with probability alpha independently; the round stops at
    the first rejection and always emits one more token (the resampled or bonus token).
    """
    a = np.asarray(alpha, np.float64)
    k = np.asarray(k)
    if np.any((a < 0) | (a > 1)):
        raise ValueError("alpha must lie in [0, 1]")
    if np.any(k < 0):
        raise ValueError("k must be >= 0")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(a < 1, (1 - a ** (k + 1)) / np.where(a < 1, 1 - a, 1.0), k + 1.0)
    return float(out) if out.ndim == 0 else out


def alpha_from_tokens_per_call(tokens_per_call, k: int, tol: float = 1e-12) -> float:
    """The alpha at which :func:`expected_tokens_per_call` equals a measured mean of tokens per call with k drafts.

    E[tokens per call] rises strictly with alpha from 1 (alpha = 0) to k + 1 (alpha = 1), so the inverse is
    unique; it is found by bisection. Use it on rounds that each had all k drafts: a round cut to fewer drafts
    (near a token limit) emits fewer tokens, and the alpha it implies comes out low.
    """
    t = float(tokens_per_call)
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if not 1.0 <= t <= k + 1:
        raise ValueError(f"tokens per call with k = {k} drafts lie in [1, {k + 1}], got {t}")
    k = int(k)
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        # 1 + a + ... + a^k as a sum: the closed form loses digits to cancellation near a = 1
        lo, hi = (mid, hi) if sum(mid ** i for i in range(k + 1)) < t else (lo, mid)
    return 0.5 * (lo + hi)


def speedup_model(alpha, k, c):
    """Speedup over the target alone when a draft step costs ``c`` target steps and verifying k+1 tokens costs
    one target step: E[tokens per call] / (1 + k c)."""
    c = np.asarray(c, np.float64)
    if np.any(c < 0):
        raise ValueError("c must be >= 0")
    out = expected_tokens_per_call(alpha, k) / (1 + np.asarray(k) * c)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class SpecStats:
    """Per-call statistics pooled over runs: ``proposed`` / ``accepted`` / ``emitted`` per target call.

    ``room`` (optional): per call, the drafts the token limit left room for, ``min(k, tokens left - 1)``; a
    round near the end of a request is cut to fewer than k drafts whatever the drafter does.
    """

    proposed: np.ndarray
    accepted: np.ndarray
    emitted: np.ndarray
    k: int
    room: np.ndarray | None = None

    @property
    def calls(self) -> int:
        return int(self.proposed.size)

    @property
    def tokens_per_call(self) -> float:
        return float(self.emitted.sum() / max(1, self.calls))

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts / proposed drafts (drafts after a rejection count as proposed and not accepted)."""
        return float(self.accepted.sum() / max(1, self.proposed.sum()))

    @property
    def alpha(self) -> float:
        """Conditional acceptance: accepted / drafts actually tested (every accepted one, plus one per rejection).

        Under the i.i.d. model this is the maximum-likelihood estimate of alpha.
        """
        tested = self.accepted.sum() + np.sum(self.accepted < self.proposed)
        return float(self.accepted.sum() / tested) if tested else float("nan")

    def alpha_per_position(self) -> np.ndarray:
        """alpha_i: of the calls that tested draft i (drafts before it accepted), the share that accepted it."""
        out = np.full(self.k, np.nan)
        for i in range(self.k):
            reached = (self.proposed > i) & (self.accepted >= i)
            if reached.any():
                out[i] = np.mean(self.accepted[reached] > i)
        return out

    @property
    def empty_share(self) -> float:
        """Share of target calls with no draft at all (the n-gram drafter found no match, or no room was left)."""
        return float(np.mean(self.proposed == 0)) if self.calls else float("nan")

    def _room(self) -> np.ndarray:
        if self.room is None:
            raise ValueError("no per-call room recorded: pool_results needs runs that ended at their token limit, "
                             "or n_new")
        return self.room

    def subset(self, mask) -> "SpecStats":
        """The statistics of the calls where ``mask`` is true."""
        mask = np.asarray(mask, bool)
        return SpecStats(self.proposed[mask], self.accepted[mask], self.emitted[mask], self.k,
                         None if self.room is None else self.room[mask])

    @property
    def clipped_share(self) -> float:
        """Share of calls the token limit cut to fewer than k drafts."""
        return float(np.mean(self._room() < self.k)) if self.calls else float("nan")

    @property
    def no_match_share(self) -> float:
        """Share of the calls with room for all k drafts in which the drafter proposed none (prompt lookup found
        no earlier occurrence of the context's suffix)."""
        full = self._room() == self.k
        return float(np.mean(self.proposed[full] == 0)) if full.any() else float("nan")

    @property
    def with_k_drafts(self) -> "SpecStats":
        """The calls that verified all k drafts: the rounds the i.i.d. formula with k describes."""
        return self.subset(self.proposed == self.k)

    @property
    def target_rows_per_token(self) -> float:
        """Query rows the target computed per emitted token: (drafts + 1) per call over tokens emitted."""
        return float((self.proposed + 1).sum() / max(1, self.emitted.sum()))


def pool_results(results: Iterable, n_new: int | None = None) -> SpecStats:
    """Pool the per-call lists of several SpecResult runs (all with the same k).

    The per-call ``room`` (drafts the token limit allowed) is reconstructed from the tokens each call emitted:
    a call with ``left`` tokens still to generate had room for ``min(k, left - 1)``. ``n_new`` is the runs'
    token limit; without it, a run's limit is the tokens it emitted, which holds for runs that ended at their
    limit (``finish_reason == "length"``); if some run stopped early and ``n_new`` is not given, ``room`` is
    None.
    """
    results = list(results)
    if not results:
        raise ValueError("no results to pool")
    ks = {r.k for r in results}
    if len(ks) != 1:
        raise ValueError(f"results mix different k: {sorted(ks)}")
    k = ks.pop()
    cat = lambda name: np.concatenate([np.asarray(getattr(r, name), np.int64) for r in results])  # noqa: E731
    room = None
    if n_new is not None or all(r.finish_reason == "length" for r in results):
        parts = []
        for r in results:
            emitted = np.asarray(r.emitted, np.int64)
            limit = int(emitted.sum()) if n_new is None else int(n_new)
            left = limit - (np.cumsum(emitted) - emitted)       # tokens still to generate before each call
            if np.any(left < 1):
                raise ValueError(f"a run emitted more than its token limit {limit}")
            parts.append(np.minimum(k, left - 1))
        room = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return SpecStats(cat("proposed"), cat("accepted"), cat("emitted"), k, room)


def verify_step_seconds(cost, batch: int, rows_per_seq: int, context: int) -> float:
    """Roofline time of one step with ``batch`` sequences of ``context`` cached tokens, each computing
    ``rows_per_seq`` query rows (1 for plain decode, k+1 for a speculative verify), under a
    :class:`minillm.serving.StepCost` (its ``seconds_for``)."""
    if batch < 1 or rows_per_seq < 1 or context < 0:
        raise ValueError("batch and rows_per_seq must be >= 1, context >= 0")
    return cost.seconds_for(np.full(batch, rows_per_seq), np.full(batch, context + rows_per_seq))


def batched_speedup_model(cost, alpha: float, k: int, batch: int, context: int) -> float:
    """Modeled speedup of speculation with a free drafter at a batch size: E[tokens per call] x
    (plain step time) / (verify step time with k+1 rows per sequence)."""
    return (expected_tokens_per_call(alpha, k) * verify_step_seconds(cost, batch, 1, context)
            / verify_step_seconds(cost, batch, k + 1, context))
