"""Chapter 10: the whole stack measured rung by rung, each rung on the same requests as the one before.

A *rung* is one way of serving a fixed set of requests (naive decoding, the KV cache, the engine, the
engine with speculation, ...). :func:`measure_rung` runs one, times it and keeps the greedy tokens it
produced; :func:`check_same_tokens` fails loudly when a rung changed the output; :class:`Ladder` turns the
rungs' tokens per second into per-rung and whole-stack speedups and says whether the gain comes from the
composition (the product of several factors) or from one step.

:func:`recorded_gpu_ladder` builds the same ladder from a recorded ``serving_bench.py`` run (HF ``generate``
vs the engine on the GPU; HF ran fewer requests than the engine), :func:`recorded_gpu_gap` the gap that run
supports with each factor measured on one request set, and :func:`composed_ladder` the ladder of a recorded
``composed_bench.py`` run. NumPy only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Rung:
    """One rung: its name, the output tokens it produced per request, and how long the whole set took."""

    name: str
    token_ids: list[list[int]] = field(repr=False)
    seconds: float

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds


def measure_rung(name: str, serve, repeats: int = 1) -> Rung:
    """Run ``serve()`` (which returns one list of new token ids per request) ``repeats`` times and keep the
    fastest run: the fastest is the least disturbed by whatever else the machine is doing."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    best, tokens = np.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = [list(map(int, t)) for t in serve()]
        dt = time.perf_counter() - t0
        if tokens is not None and out != tokens:
            raise AssertionError(f"rung {name!r} produced different tokens on a repeat")
        tokens, best = out, min(best, dt)
    if not tokens or any(len(t) == 0 for t in tokens):
        raise ValueError(f"rung {name!r} produced no tokens for some request")
    return Rung(name, tokens, best)


def check_same_tokens(rung: Rung, reference: list[list[int]]) -> None:
    """Raise AssertionError unless every request's greedy tokens equal the reference's."""
    if len(rung.token_ids) != len(reference):
        raise AssertionError(f"rung {rung.name!r} answered {len(rung.token_ids)} requests, expected {len(reference)}")
    bad = [i for i, (a, b) in enumerate(zip(rung.token_ids, reference)) if list(a) != list(b)]
    if bad:
        raise AssertionError(f"rung {rung.name!r} changed the greedy tokens of requests {bad}")


@dataclass
class Ladder:
    """Tokens per second of consecutive rungs (each adds one thing to the one before)."""

    names: list[str]
    tok_per_s: np.ndarray

    def __post_init__(self):
        self.tok_per_s = np.asarray(self.tok_per_s, dtype=float)
        if len(self.names) != self.tok_per_s.size or self.tok_per_s.size < 2:
            raise ValueError("a ladder needs one throughput per name and at least two rungs")
        if not np.all(np.isfinite(self.tok_per_s)) or np.any(self.tok_per_s <= 0):
            raise ValueError(f"throughputs must be positive and finite, got {self.tok_per_s}")

    @classmethod
    def of(cls, rungs: list[Rung]) -> "Ladder":
        return cls([r.name for r in rungs], [r.tok_per_s for r in rungs])

    @property
    def steps(self) -> np.ndarray:
        """Speedup of each rung over the rung before it (one fewer than the rungs)."""
        return self.tok_per_s[1:] / self.tok_per_s[:-1]

    @property
    def total(self) -> float:
        """The last rung over the first; equal to the product of :attr:`steps`."""
        return float(self.tok_per_s[-1] / self.tok_per_s[0])

    @property
    def best(self) -> float:
        """The fastest rung over the first (a later rung can be slower than an earlier one)."""
        return float(self.tok_per_s.max() / self.tok_per_s[0])

    @property
    def best_index(self) -> int:
        """Index of the fastest rung (the first of them on a tie)."""
        return int(np.argmax(self.tok_per_s))

    @property
    def best_name(self) -> str:
        return self.names[self.best_index]

    @property
    def stack(self) -> "Ladder":
        """The ladder up to and including its fastest rung: the stack worth deploying. Rungs after it lose
        throughput (speculation in a full batch, say) and are left out. Raises ValueError when the first rung
        is the fastest, as then there is no stack to climb."""
        if self.best_index == 0:
            raise ValueError(f"the first rung ({self.names[0]!r}) is the fastest: no rung gains over it")
        return Ladder(self.names[: self.best_index + 1], self.tok_per_s[: self.best_index + 1])

    @property
    def largest_step(self) -> float:
        return float(self.steps.max())

    @property
    def largest_step_name(self) -> str:
        return self.names[int(np.argmax(self.steps)) + 1]

    def steps_above(self, factor: float = 1.5) -> int:
        """How many rungs each multiply throughput by at least ``factor``."""
        return int(np.sum(self.steps >= factor))

    def from_composition(self, factor: float = 1.5, rest: float = 3.0) -> bool:
        """True when the whole gain needs several rungs of :attr:`stack` (the rungs up to the fastest): at
        least two of them gain ``factor`` or more, and the stack without its largest rung still gains ``rest``
        or more (the fastest rung over the first, divided by the largest step up to it). Rungs after the
        fastest are not part of the gain: a step that only wins back an earlier loss does not count. A
        ladder whose largest rung is most of the way, like a cache followed by rungs that barely pay, is one
        trick, not a composition; a ladder whose first rung is the fastest is neither."""
        if self.best_index == 0:
            return False
        s = self.stack
        return s.steps_above(factor) >= 2 and s.best / s.largest_step >= rest


def _index_runs(bench: dict) -> dict:
    return {(r["model"], r["policy"], r.get("max_num_seqs", r.get("batch"))): r
            for r in bench["runs"] if "output_tok_per_s" in r}


def recorded_gpu_ladder(bench: dict, model: str = "llama1b") -> Ladder:
    """The ladder a recorded ``serving_bench.py`` run allows: HF ``generate`` in static batches of 64 (KV cache,
    eager), then the engine (CUDA graphs, Triton paged kernels) with static batches of 64, continuous batching
    with 64 slots, and 256 slots. HF ran the first requests of the trace, the engine all of them."""
    runs = _index_runs(bench)
    keys = [("HF generate, static 64", "hf_generate_static", 64), ("engine, static 64", "static", 64),
            ("engine, continuous 64", "continuous", 64), ("engine, continuous 256", "continuous", 256)]
    missing = [p for _, p, s in keys if (model, p, s) not in runs]
    if missing:
        raise KeyError(f"recorded run has no {missing} rows for model {model!r}")
    return Ladder([n for n, _, _ in keys], [runs[model, p, s]["output_tok_per_s"] for _, p, s in keys])


def recorded_gpu_gap(bench: dict, model: str = "llama1b") -> dict:
    """The gap from HF ``generate`` to the engine that a recorded ``serving_bench.py`` run supports, each
    factor measured on one request set: ``first``, the engine over HF on HF's own requests (the first 64
    of the trace: static batching either way, as 64 slots hold them all), then ``trace_steps``, what
    continuous batching (64 slots over static 64) and 256 slots (over 64) gave the engine on the whole
    trace. ``gap`` is their product, ``rest`` the product without the first."""
    runs = _index_runs(bench)
    need = [(model, "hf_generate_static", 64), (model, "continuous_hf_subset", 64), (model, "static", 64),
            (model, "continuous", 64), (model, "continuous", 256)]
    missing = [k for k in need if k not in runs]
    if missing:
        raise KeyError(f"recorded run has no {missing} rows")
    tps = {k: runs[k]["output_tok_per_s"] for k in need}
    first = tps[need[1]] / tps[need[0]]
    trace_steps = [tps[need[3]] / tps[need[2]], tps[need[4]] / tps[need[3]]]
    return {"first": first, "trace_steps": trace_steps, "rest": float(np.prod(trace_steps)),
            "gap": first * float(np.prod(trace_steps)), "hf_requests": runs[need[0]].get("requests"),
            "trace_requests": runs[need[2]].get("requests")}


def composed_ladder(bench: dict, model: str, min_rungs: int = 2) -> tuple[Ladder, list[float]]:
    """The ladder of a recorded ``composed_bench.py`` run for one model, its rungs in order, and for each rung
    the share of requests whose greedy tokens equal the first rung's (the benchmark records the check).
    A run cut short has fewer rungs: ``min_rungs`` rejects it."""
    rows = [r for r in bench["rungs"] if r["model"] == model]
    if len(rows) < max(2, min_rungs):
        raise KeyError(f"recorded ladder has {len(rows)} rungs for model {model!r}, fewer than {max(2, min_rungs)}")
    return (Ladder([r["rung"] for r in rows], [r["output_tok_per_s"] for r in rows]),
            [float(r["identical_to_reference"]) for r in rows])


def hf_greedy(hf_model, prompts, n_new: int, use_cache: bool) -> list[list[int]]:
    """Greedy decoding with a ``transformers`` causal LM, one request at a time, written out as a plain loop
    (no ``generate``, so no stopping at EOS): with ``use_cache=False`` every step runs the whole sequence
    again (naive PyTorch), with ``use_cache=True`` it feeds one token against HF's KV cache."""
    import torch

    if n_new < 1:
        raise ValueError(f"n_new must be >= 1, got {n_new}")
    device = next(hf_model.parameters()).device
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([list(p)], device=device)
            new, past, feed = [], None, ids
            for _ in range(n_new):
                out = hf_model(input_ids=feed, past_key_values=past, use_cache=use_cache)
                nxt = int(out.logits[0, -1].argmax())
                new.append(nxt)
                ids = torch.cat([ids, ids.new_tensor([[nxt]])], dim=1)
                if use_cache:
                    past, feed = out.past_key_values, ids[:, -1:]
                else:
                    feed = ids
            outs.append(new)
    return outs


def token_agreement(tokens, reference) -> dict:
    """How far greedy tokens agree with a reference, request by request: ``identical``, the share of requests
    whose tokens all equal the reference's, and ``prefix``, the mean share of a request's tokens before its
    first difference (1.0 for an identical request). In bf16 a kernel that sums in another order flips a
    near-tied argmax now and then, and every token after the flip differs: ``prefix`` says how early."""
    tokens, reference = [list(map(int, t)) for t in tokens], [list(map(int, t)) for t in reference]
    if not tokens or len(tokens) > len(reference):
        raise ValueError(f"{len(tokens)} requests to compare against {len(reference)} reference requests")
    same, prefix = 0, []
    for a, b in zip(tokens, reference):
        if not b:
            raise ValueError("a reference request has no tokens")
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        same += a == b
        prefix.append(n / len(b))
    return {"identical": same / len(tokens), "prefix": float(np.mean(prefix))}


def leave_one_out(full: float, without: dict[str, float]) -> dict[str, float]:
    """Each technique's factor measured from the full stack: ``full`` (tokens/s of the whole stack) over the
    tokens/s of the stack with that one technique taken out (``without[name]``). Unlike a ladder's steps,
    which depend on the rungs below each one, every factor here is measured against the same stack, so they
    do not multiply to the whole gain: techniques that need each other (batching needs a step cheap enough to
    share) each get credit for the part they enable together."""
    if not np.isfinite(full) or full <= 0:
        raise ValueError(f"full stack throughput must be positive, got {full}")
    bad = {k: v for k, v in without.items() if not np.isfinite(v) or v <= 0}
    if bad:
        raise ValueError(f"throughputs must be positive, got {bad}")
    return {name: float(full / tps) for name, tps in without.items()}


@dataclass
class BatchSweep:
    """One configuration served at several batch sizes, every request of a batch arriving at once and asking
    for the same number of tokens: the aggregate tokens/s of the server and what one request sees (its own
    tokens over its time from arrival to its last token)."""

    batch: np.ndarray
    tok_per_s: np.ndarray            # aggregate: every request's output tokens over the wall time
    per_request_tok_per_s: np.ndarray

    def __post_init__(self):
        self.batch = np.asarray(self.batch, dtype=int)
        self.tok_per_s = np.asarray(self.tok_per_s, dtype=float)
        self.per_request_tok_per_s = np.asarray(self.per_request_tok_per_s, dtype=float)
        n = self.batch.size
        if n < 1 or self.tok_per_s.size != n or self.per_request_tok_per_s.size != n:
            raise ValueError("a sweep needs one aggregate and one per-request throughput per batch size")
        if np.any(np.diff(self.batch) <= 0) or self.batch[0] < 1:
            raise ValueError(f"batch sizes must be increasing and >= 1, got {self.batch}")
        if np.any(self.tok_per_s <= 0) or np.any(self.per_request_tok_per_s <= 0):
            raise ValueError("throughputs must be positive")

    @classmethod
    def of(cls, rows: list[dict]) -> "BatchSweep":
        rows = sorted(rows, key=lambda r: r["batch"])
        return cls([r["batch"] for r in rows], [r["output_tok_per_s"] for r in rows],
                   [r["per_request_tok_per_s"] for r in rows])

    def gains(self, baseline: float) -> tuple[np.ndarray, np.ndarray]:
        """(aggregate, per request) over ``baseline`` tokens/s (one request served at a time)."""
        return self.tok_per_s / baseline, self.per_request_tok_per_s / baseline

    def first_batch_reaching(self, baseline: float, factor: float) -> int | None:
        """The smallest batch whose aggregate throughput is ``factor`` times ``baseline`` or more, else None."""
        hit = np.nonzero(self.tok_per_s / baseline >= factor)[0]
        return int(self.batch[hit[0]]) if hit.size else None
