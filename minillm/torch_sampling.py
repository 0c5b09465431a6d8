"""The engine's samplers on the device: :mod:`minillm.sampling`'s batched functions for torch tensors.

Same names, arguments and arithmetic (float64, the same counter hash and random streams), so the GPU runner
picks the token NumPy picks from the same logits, with no host sync per row: ``tests/test_serving_torch_runner.py``
checks each function against its NumPy twin. Every argument is a tensor on the logits' device (``q`` may be
None). One difference: :func:`draft_batch` returns q with zero rows for greedy rows instead of None for an
all-greedy pass, which would need the host to look at the temperatures (``TorchRunner.draft`` answers that case
itself with the argmax, before asking the device).
"""
from __future__ import annotations

import torch

from .sampling import ACCEPT, DRAFT, RESIDUAL, mix32, sub_seed

_M32 = 0xFFFFFFFF


def counter_uniform(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``minillm.sampling.counter_uniform`` on the device: the same hash (``mix32`` works on int64 tensors,
    whose wrapped products keep the low 32 bits exact), so the same uniforms."""
    seed = (seed.long() & _M32)[:, None]
    step = (step.long() & _M32)[:, None]
    ids = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)[None, :]
    h = mix32(mix32(mix32(seed ^ 0x9E3779B9) ^ step) ^ ids)
    h = mix32(h ^ ((seed * 0x85EBCA6B) & _M32))
    return (h.double() + 0.5) / 2.0**32


def shape_logits(logits, temperature, top_k, top_p) -> torch.Tensor:
    """``minillm.sampling.shape_logits`` on the device (float64), rows with temperature 0 scaled by 1."""
    z = logits.double()
    V = z.shape[1]
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).double()
    z = z / t[:, None]
    zs, order = torch.sort(z, dim=1, descending=True, stable=True)
    k = torch.where((top_k <= 0) | (top_k >= V), torch.full_like(top_k, V), top_k)
    kth = zs.gather(1, (k - 1)[:, None])
    ps = torch.softmax(torch.where(zs < kth, torch.full_like(zs, -torch.inf), zs), dim=1)   # top-p after top-k
    before = torch.cumsum(ps, dim=1) - ps
    drop_sorted = (before >= top_p[:, None].double()) & (top_p[:, None] < 1)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return torch.where((z < kth) | drop, torch.full_like(z, -torch.inf), z)


def _gumbel(seed, step, V):
    return -torch.log(-torch.log(counter_uniform(seed, step, V)))


def _draw(z, logits, temperature, seed, step) -> torch.Tensor:
    """Gumbel-max from shaped logits ``z`` where temperature > 0, the raw argmax elsewhere."""
    drawn = (z + _gumbel(seed, step, z.shape[1])).argmax(dim=1)
    return torch.where(temperature > 0, drawn, logits.argmax(dim=1))


def sample_batch(logits, temperature, top_k, top_p, seed, step) -> torch.Tensor:
    """:func:`minillm.sampling.sample_batch` on the device, every row at once, no host sync.

    Float64 like the NumPy version, so both pick the same token from the same logits (up to ties).
    """
    return _draw(shape_logits(logits, temperature, top_k, top_p), logits, temperature, seed, step)


def verify_batch(logits, drafts, q, temperature, top_k, top_p, seed, step) -> torch.Tensor:
    """``minillm.sampling.verify_batch`` on the device: the same streams and float64 arithmetic."""
    z = shape_logits(logits, temperature, top_k, top_p)      # once: the plain draw and p share it
    out = _draw(z, logits, temperature, seed, step)
    if q is None:           # one-hot drafts: the plain sample, accepted when it equals the draft (see NumPy's)
        return out
    p = torch.softmax(z, dim=1)
    d = drafts.clamp(min=0)[:, None]
    pd = p.gather(1, d)[:, 0]
    q = q.double()
    qd = q.gather(1, d)[:, 0]
    r = (p - q).clamp(min=0)
    u = counter_uniform(sub_seed(seed.long(), ACCEPT), step, 1)[:, 0]
    accept = u * qd < pd
    resid = (torch.log(r) + _gumbel(sub_seed(seed.long(), RESIDUAL), step, p.shape[1])).argmax(dim=1)
    hot = (drafts >= 0) & (temperature > 0)
    return torch.where(hot, torch.where(accept, d[:, 0], resid), out)


def draft_batch(logits, temperature, top_k, top_p, seed, step, want_probs: bool = True):
    """``minillm.sampling.draft_batch`` on the device for rows of which at least one samples (temperature > 0;
    ``TorchRunner.draft`` answers an all-greedy pass with the argmax and no q, as NumPy does, without asking
    the device): tokens, and q (zeros on greedy rows) or None."""
    greedy = logits.argmax(dim=1)
    hot = temperature > 0
    z = shape_logits(logits, temperature, top_k, top_p)
    tokens = torch.where(hot, (z + _gumbel(sub_seed(seed.long(), DRAFT), step, z.shape[1])).argmax(dim=1), greedy)
    if not want_probs:
        return tokens, None
    q = torch.where(hot[:, None], torch.softmax(z, dim=1), torch.zeros_like(z))
    return tokens, q
