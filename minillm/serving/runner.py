"""Runners execute a scheduled step. One scheduler drives three of them:

* ``NumpyRunner`` -- the NumPy reference model over NumPy K/V pools (float32, CPU): the oracle.
* ``minillm.serving.torch_runner.TorchRunner`` -- the torch model with the Triton paged kernels (GPU);
  it lives in its own module because it imports torch.
* ``SimulatedRunner`` -- computes nothing. It counts tokens, steps and KV memory, and advances a
  virtual clock with a step-cost model, so traces of thousands of requests run in seconds.

A runner's contract is :class:`minillm.serving.interfaces.Runner`: ``execute(batch) -> token_ids``, one
token per entry of ``batch.logits_rows`` (one per sequence, or ``len(draft) + 1`` for a speculating one,
verified by :func:`minillm.sampling.verify_batch`; those of sequences whose ``batch.sample`` is False are
ignored); ``now()``, the clock the engine stamps tokens with, and ``sleep(seconds)`` on that clock;
``prepare(config)`` before the first step; ``check_engine(num_blocks, block_size, max_model_len)`` when the
engine is built (its pool and model must fit the engine's settings). A runner that also serves as a draft model
(:class:`minillm.serving.draft.DraftModelProposer`) is a :class:`~minillm.serving.interfaces.DraftRunner`:
``logits(step, input_ids=None)`` for a :class:`~minillm.serving.batch.RaggedStep`, ``draft(logits, ...)``,
array helpers ``zeros``, ``index`` and ``host`` for its backend, and ``decode_chain`` (or None).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..sampling import draft_batch, sample_batch, verify_batch
from .batch import StepBatch
from .sequence import check_int


TOP_K_CAP = 2**62  # any top-k of at least the vocabulary keeps every token: larger ones are capped to fit int64


def seq_sampling_arrays(seqs):
    """Per sequence: temperature, top-k (0 = off), top-p and seed."""
    ps = [s.params for s in seqs]
    return (np.array([p.temperature for p in ps], np.float64),
            np.array([min(p.top_k or 0, TOP_K_CAP) for p in ps], np.int64),
            np.array([p.top_p for p in ps], np.float64), np.array([s.seed for s in seqs], np.int64))


def sampling_arrays(batch: StepBatch):
    """Per logits row: temperature, top-k (0 = off), top-p, seed and step (index of the token it samples)."""
    seq_idx, step = batch.row_params()
    return (*(a[seq_idx] for a in seq_sampling_arrays(batch.seqs)), step)


def check_engine_fit(runner, pool_blocks: int, pool_block_size: int, positions: int, num_blocks: int,
                     block_size: int, max_model_len: int) -> None:
    """Raise ValueError unless a pool of ``pool_blocks`` blocks of ``pool_block_size`` tokens and a model of
    ``positions`` positions serve an engine of ``num_blocks`` blocks of ``block_size``, ``max_model_len``."""
    name = type(runner).__name__
    if pool_block_size != block_size or pool_blocks < num_blocks:
        raise ValueError(f"{name} was built for {pool_blocks} blocks of {pool_block_size} tokens, but the engine was "
                         f"told {num_blocks} blocks of {block_size}: build the runner with the engine's "
                         f"num_blocks and block_size")
    if max_model_len > positions:
        raise ValueError(f"max_model_len={max_model_len} exceeds the {positions} positions of {name}'s model")


class NumpyRunner:
    """The NumPy reference model over (n_layers, num_blocks, block_size, Hkv, D) float32 pools."""

    decode_chain = None          # a draft model's decode passes run one logits() call each

    def __init__(self, model, num_blocks: int, block_size: int, dtype=np.float32):
        cfg = model.config
        num_blocks, block_size = check_int("num_blocks", num_blocks, 1), check_int("block_size", block_size, 1)
        self.model, self.block_size = model, block_size
        shape = (cfg.n_layers, num_blocks, self.block_size, cfg.n_kv_heads, cfg.d_head)
        self.k_pool, self.v_pool = np.zeros(shape, dtype), np.zeros(shape, dtype)
        self.vocab_size = cfg.vocab_size
        self.last_logits: np.ndarray | None = None

    def logits(self, batch, input_ids=None) -> np.ndarray:
        """The logits rows ``batch.logits_rows`` of one ragged forward (a StepBatch or a RaggedStep)."""
        ids = batch.input_ids if input_ids is None else input_ids
        return self.model.forward_ragged(ids, batch.positions, batch.slot_mapping, batch.block_tables,
                                         batch.context_lens, batch.cu_seqlens_q, self.k_pool, self.v_pool,
                                         logits_rows=batch.logits_rows)

    def execute(self, batch: StepBatch) -> np.ndarray:
        logits = self.logits(batch)
        self.last_logits = logits
        t, k, p, seed, step = sampling_arrays(batch)
        if batch.num_draft_tokens:
            return verify_batch(logits, batch.row_drafts(), batch.draft_probs, t, k, p, seed, step)
        return sample_batch(logits, t, k, p, seed, step)

    # -- as a draft model ------------------------------------------------------------------------------
    @staticmethod
    def draft(logits, temperature, top_k, top_p, seeds, steps, want_probs: bool = True):
        return draft_batch(logits, temperature, top_k, top_p, seeds, steps, want_probs)

    @staticmethod
    def zeros(rows: int, cols: int) -> np.ndarray:
        return np.zeros((rows, cols))

    @staticmethod
    def index(idx: np.ndarray) -> np.ndarray:
        return idx

    @staticmethod
    def host(x) -> np.ndarray:
        return np.asarray(x)

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def prepare(self, config) -> None:
        """Nothing to get ready: every step runs eagerly."""

    def check_engine(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        check_engine_fit(self, self.k_pool.shape[1], self.block_size, self.model.config.max_seq_len, num_blocks,
                         block_size, max_model_len)


@dataclass
class StepCost:
    """A roofline-style cost of one step on a GPU: weights are read once per step, each token's K/V context
    is read once, and FLOPs are 2 * params per token plus ``attn_flops_per_context_token`` per (new token,
    position it sees) pair of causal attention. The step takes the longer of the
    memory time and the compute time, plus a fixed launch overhead.

    :meth:`for_model` counts the weights a step reads: every layer and the LM head, but not the input
    embedding table, of which a step reads only the rows of its new tokens (a lookup, no FLOPs). minillm's
    LM head is a separate matrix (not tied to the embedding); for a model with tied embeddings (Llama 3.2
    1B) the count equals its parameter count, the one table read once, as the head."""

    weight_bytes: float
    kv_bytes_per_token: float
    flops_per_token: float
    attn_flops_per_context_token: float = 0.0
    bandwidth: float = 4.8e12      # bytes/s (H200 HBM3e, datasheet)
    flops: float = 989e12          # dense bf16 FLOP/s (H100/H200 SXM datasheet)
    overhead: float = 0.0          # seconds per step (kernel launches, scheduling)

    def seconds(self, batch: StepBatch) -> float:
        return self.seconds_for(batch.num_new, batch.context_lens)

    def seconds_for(self, num_new, context_lens) -> float:
        """The same for sequences given only by their new tokens and context lengths (new ones included)."""
        num_new, ctx = np.asarray(num_new, np.float64), np.asarray(context_lens, np.float64)
        mem = self.weight_bytes + self.kv_bytes_per_token * float(ctx.sum())
        # attention: new token i of a sequence (0-based) sees its ctx - num_new + i + 1 positions (causal), so a
        # chunk of n new tokens scores n * ctx - n (n - 1) / 2 pairs: a decode ctx, a whole prompt of L about L^2 / 2
        pairs = num_new * ctx - num_new * (num_new - 1) / 2
        comp = self.flops_per_token * float(num_new.sum()) + self.attn_flops_per_context_token * float(pairs.sum())
        return max(mem / self.bandwidth, comp / self.flops) + self.overhead

    @classmethod
    def for_model(cls, config, bytes_per_param: int = 2, **kw) -> "StepCost":
        kv = 2 * config.n_layers * config.n_kv_heads * config.d_head * bytes_per_param
        read = cls.params_read_per_step(config)
        return cls(weight_bytes=read * bytes_per_param, kv_bytes_per_token=kv, flops_per_token=2 * read,
                   attn_flops_per_context_token=4 * config.n_layers * config.n_heads * config.d_head, **kw)

    @staticmethod
    def params_read_per_step(config) -> int:
        """Parameters a step reads and multiplies by: all of them but the input embedding table (its rows
        for the step's tokens are a lookup; the untied LM head, which is read, stays in)."""
        return config.n_params() - config.vocab_size * config.d_model


@dataclass
class SimulatedRunner:
    """Counts instead of computing; samples token 0 (use ``ignore_eos`` and ``max_tokens`` for lengths).

    With a ``cost`` model the clock advances by ``cost.seconds(batch)`` per step; without one, by one
    unit per step (the clock then counts steps).
    """

    cost: StepCost | None = None
    clock: float = 0.0
    steps: int = 0
    tokens: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)

    def execute(self, batch: StepBatch) -> np.ndarray:
        self.steps += 1
        self.tokens += batch.num_tokens
        self.decode_tokens += batch.num_decode_tokens
        self.prefill_tokens += batch.num_prefill_tokens
        self.batch_sizes.append(len(batch.seqs))
        self.step_tokens.append(batch.num_tokens)
        self.clock += self.cost.seconds(batch) if self.cost is not None else 1.0
        return np.zeros(len(batch.logits_rows), np.int64)

    def now(self) -> float:
        return self.clock

    def sleep(self, seconds: float) -> None:
        """Idle time passes at once: the virtual clock jumps ahead."""
        self.clock += seconds

    def prepare(self, config) -> None:
        """Nothing to get ready."""

    def check_engine(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        """Any settings: nothing is computed, so there is no pool or model to fit."""
