"""Samplers: turn one row of logits into a token id (chapter 1)."""
from __future__ import annotations

import numpy as np


def greedy(logits: np.ndarray) -> int:
    """Pick the most likely token (ties go to the lowest id)."""
    return int(np.argmax(logits))


class TemperatureSampler:
    """Sample from softmax(logits / temperature), optionally restricted to the top-k ids.

    Carries its own seeded generator so a run is reproducible.
    """

    def __init__(self, temperature: float = 1.0, top_k: int | None = None, seed: int = 0):
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (use greedy for argmax), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.temperature, self.top_k = float(temperature), top_k
        self.rng = np.random.default_rng(seed)

    def __call__(self, logits: np.ndarray) -> int:
        z = np.asarray(logits, np.float64) / self.temperature
        if self.top_k is not None and self.top_k < z.size:
            cutoff = np.partition(z, -self.top_k)[-self.top_k]
            z = np.where(z >= cutoff, z, -np.inf)
        p = np.exp(z - z.max())
        return int(self.rng.choice(z.size, p=p / p.sum()))
