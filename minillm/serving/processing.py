"""The slow path of a step: sampling on the host, for requests that ask for ``min_p``, ``repetition_penalty``
or ``logprobs`` (vLLM's names; see :class:`~minillm.serving.sequence.SamplingParams`).

A runner's ``execute(batch)`` computes the logits and samples in one go (on the GPU for the torch runner,
inside its CUDA graphs). A step that serves at least one such request goes through :func:`execute` instead:
``runner.logits(batch)`` (the same forward pass: the K/V it writes are the same), the logits rows copied to the
host, then per row

1. the raw log-softmax, kept for ``logprobs`` (vLLM's default: log-probabilities of the model itself);
2. the repetition penalty on the raw logits (a row sees the prompt, the output so far and, for a speculating
   request, the drafts before it: exactly what a plain decode would see at that position);
3. min-p: tokens whose tempered probability is below ``min_p`` times the largest are dropped. On the raw
   logits z that is ``z < max(z) + temperature * log(min_p)``, so it applies before temperature, top-k and
   top-p, as vLLM applies it before top-k/top-p;
4. the usual seeded samplers of :mod:`minillm.sampling` (``sample_batch`` or ``verify_batch``), the same
   functions the NumPy runner uses, so a row without these options gets the token it gets on the fast path
   (bit-identical on the NumPy runner; the torch runner samples the same hash in torch).

The rows of other requests in the same step go through step 4 only. Steps without such a request never come
here. The runner must be a :class:`~minillm.serving.interfaces.DraftRunner` (``logits``, ``host``): the
NumPy and torch runners are; the simulated runner computes no logits, and these options are refused there.
"""
from __future__ import annotations

import numpy as np

from ..sampling import sample_batch, verify_batch
from .batch import StepBatch


def needs_host(batch: StepBatch) -> bool:
    return any(s.params.needs_host_sampling for s in batch.seqs)


def _host(runner, x) -> np.ndarray:
    return np.asarray(runner.host(x), np.float64)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def execute(runner, batch: StepBatch):
    """``(tokens, row_logprobs)``: one token per logits row, and for each row whose request asked for logprobs
    a ``(token_logprob, token_rank, top_ids, top_logprobs)`` tuple (None for the other rows)."""
    if not needs_host(batch):
        return runner.execute(batch), None
    from .runner import sampling_arrays
    raw = runner.last_logits = runner.logits(batch)          # a DraftRunner (the engine checked)
    z = _host(runner, raw).copy()
    seq_idx, step = batch.row_params()
    seqs = batch.seqs
    drafts = batch.row_drafts() if batch.num_draft_tokens else None
    lp = None
    want = [r for r in range(len(z)) if seqs[seq_idx[r]].params.logprobs is not None]
    if want:
        lp = {r: row for r, row in zip(want, _log_softmax(z[want]))}
    for r in range(len(z)):
        s = seqs[seq_idx[r]]
        p = s.params
        if p.repetition_penalty != 1:
            seen = list(s.tokens)
            k = int(step[r]) - len(s.output)           # drafts before this row (0 unless speculating)
            if k > 0:                                   # rows r-k..r-1 verify the drafts row r has after it
                seen += [int(d) for d in drafts[r - k:r]]
            ids = np.unique(np.asarray(seen, np.int64))
            ids = ids[ids < z.shape[1]]
            v = z[r, ids]
            z[r, ids] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
        if p.min_p > 0 and p.temperature > 0:
            z[r, z[r] < z[r].max() + p.temperature * np.log(p.min_p)] = -np.inf
    t, k, tp, seed, st = sampling_arrays(batch)
    if batch.num_draft_tokens:
        q = batch.draft_probs
        if q is not None:
            q = _host(runner, q)
        tokens = verify_batch(z, drafts, q, t, k, tp, seed, st)
    else:
        tokens = sample_batch(z, t, k, tp, seed, st)
    rows = None
    if lp is not None:
        rows = [None] * len(z)
        for r, row in lp.items():
            n = seqs[seq_idx[r]].params.logprobs
            tok = int(tokens[r])
            rank = int((row > row[tok]).sum()) + 1
            top = np.argsort(-row, kind="stable")[:n]
            rows[r] = (float(row[tok]), rank, [int(i) for i in top], [float(row[i]) for i in top])
    return tokens, rows
