"""The contracts between the engine's parts, as :class:`typing.Protocol` classes.

The engine is three pluggable parts around one scheduler loop (nano-vllm's split):

* a :class:`Runner` computes a scheduled step (``NumpyRunner``, the torch ``TorchRunner``, the counting
  ``SimulatedRunner``); a :class:`DraftRunner` also runs a draft model for a :class:`Drafter`;
* a :class:`MemoryManager` decides which KV blocks (or ranges) hold which sequence's tokens
  (``BlockManager``, chapter 7's ``ContiguousManager``);
* a :class:`Drafter` proposes speculative tokens (chapter 9): a prompt lookup answers when the step is
  scheduled, a draft model (``DraftModelProposer``) after it, on the step's own slots.

Every member a part may be asked for is declared here, including the ones a part answers with a no-op
(``Runner.prepare`` on CPU) or ``None`` (``DraftRunner.decode_chain``): the engine never probes an object for
what it can do. This module imports no serving module at run time (only for annotations: batch, sequence), so every
other serving module may import it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, Sequence as Seq, runtime_checkable

if TYPE_CHECKING:                                        # annotations only: no import cycle
    import numpy as np

    from .batch import RaggedStep, StepBatch
    from .sequence import Sequence


class Runner(Protocol):
    """Computes one scheduled step, on a clock the engine stamps tokens with."""

    def execute(self, batch: StepBatch) -> np.ndarray:
        """One token per entry of ``batch.logits_rows`` (sampled, or verified against the step's drafts by
        :func:`minillm.sampling.verify_batch`); a sequence whose ``batch.sample`` is False gets one it ignores."""

    def now(self) -> float:
        """Seconds on the runner's clock (wall time, or a simulated runner's virtual clock)."""

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass on the runner's clock: a real runner sleeps, a simulated one moves its clock."""

    def prepare(self, config) -> None:
        """Get ready for every step a scheduler with ``config`` (a :class:`~minillm.serving.scheduler.
        SchedulerConfig`) can build, before the first one: the torch
        runner captures its CUDA graphs here (decode batch sizes, mixed-step token buckets); elsewhere a no-op."""

    def check_engine(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        """Raise ValueError unless this runner can serve an engine with these settings (its K/V pool holds
        ``num_blocks`` blocks of ``block_size`` tokens, its model ``max_model_len`` positions); the engine
        calls it when it is built. A runner that computes nothing accepts any."""


@runtime_checkable
class DraftRunner(Runner, Protocol):
    """A runner that can also serve as a draft model (:class:`minillm.serving.draft.DraftModelProposer`)."""

    model: Any                 # has .config (vocab_size, max_seq_len)
    block_size: int
    k_pool: Any                # (n_layers, num_blocks, block_size, Hkv, D): the mirrored pool's size
    last_logits: Any           # the logits of its latest forward, set by whoever ran it (serving.processing)
    decode_chain: Callable | None
    """``decode_chain(step, input_ids, n_passes, sample)``: n decode passes that advance on the device with no
    host work between them (the torch runner), or None: the proposer runs one :meth:`logits` per pass."""

    def logits(self, batch: StepBatch | RaggedStep, input_ids=None) -> Any:
        """The logits rows ``batch.logits_rows`` of one ragged forward, as a backend array."""

    def draft(self, logits, temperature, top_k, top_p, seeds, steps, want_probs: bool = True) -> tuple[Any, Any]:
        """:func:`minillm.sampling.draft_batch` on the backend: (tokens, q or None)."""

    def zeros(self, rows: int, cols: int) -> Any:
        """A float64 backend array of zeros."""

    def index(self, idx: np.ndarray) -> Any:
        """Row indices as a backend array."""

    def host(self, x) -> np.ndarray:
        """A backend array as a NumPy array."""


class MemoryManager(Protocol):
    """Where each sequence's K/V lives: block ids (or a range), no tensors. What the scheduler asks."""

    num_blocks: int
    block_size: int

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks that hold ``n_tokens`` tokens."""

    def can_grow(self, seq: Sequence, n_tokens: int) -> bool:
        """Can ``seq``'s memory be made to cover its first ``n_tokens`` tokens now?"""

    def allocate(self, seq: Sequence, n_tokens: int) -> None:
        """Make it so (raises OutOfBlocks, changing nothing, where ``can_grow`` says no)."""

    def match_prefix(self, seq: Sequence) -> int:
        """Give a sequence with no memory its cached prefix; return the tokens it covers (0 without a cache)."""

    def register(self, seq: Sequence) -> None:
        """After a step: name the blocks its computed tokens filled (prefix caching; else a no-op)."""

    def truncate(self, seq: Sequence, n_tokens: int) -> None:
        """Keep the memory of the first ``n_tokens`` tokens (a speculative step rolls back)."""

    def free(self, seq: Sequence) -> None:
        """Give back all of ``seq``'s memory."""

    def check_invariants(self, seqs: Iterable[Sequence]) -> None:
        """AssertionError if the manager's books and the live sequences ``seqs`` disagree (tests call it)."""


@runtime_checkable
class PromptLookup(Protocol):
    """A drafter that answers when the step is scheduled, from the tokens alone
    (:class:`minillm.speculative.NgramDrafter`). :func:`as_drafter` makes it a :class:`Drafter`."""

    def lookup(self, tokens: Seq[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``tokens``."""


@runtime_checkable
class Drafter(Protocol):
    """What the engine and the scheduler ask for speculative tokens (chapter 9)."""

    def check_target(self, vocab_size: int, max_model_len: int, num_blocks: int, block_size: int) -> None:
        """Raise unless this drafter can serve an engine with these settings."""

    def draft(self, seq: Sequence, k: int) -> list[int]:
        """``k`` or fewer draft tokens for a decoding sequence now, or ``k`` placeholders (-1) that
        :meth:`propose` fills once the step is scheduled (a draft model needs the step's slots)."""

    def propose(self, batch: StepBatch) -> None:
        """Fill ``batch``'s placeholders (and ``draft_probs``) before the step runs."""

    def commit(self, seqs: Iterable[Sequence]) -> None:
        """After a step was verified and accounted: what the draft's state may keep of each sequence."""

    def release(self, seq: Sequence) -> None:
        """Forget a finished sequence."""


class LookupDrafter:
    """A :class:`PromptLookup` as a :class:`Drafter`: it drafts when scheduled and keeps no state."""

    def __init__(self, lookup: PromptLookup):
        self.lookup = lookup

    def check_target(self, vocab_size: int, max_model_len: int, num_blocks: int, block_size: int) -> None:
        pass

    def draft(self, seq: Sequence, k: int) -> list[int]:
        return [int(t) for t in self.lookup.lookup(seq.tokens, k)][:k]

    def propose(self, batch: StepBatch) -> None:
        pass

    def commit(self, seqs: Iterable[Sequence]) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def as_drafter(drafter: Drafter | PromptLookup | None) -> Drafter | None:
    """``drafter`` as a :class:`Drafter`: a prompt lookup is wrapped in :class:`LookupDrafter`."""
    if drafter is None or isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, PromptLookup):
        return LookupDrafter(drafter)
    raise TypeError(f"a drafter is a prompt lookup (lookup(tokens, k), e.g. minillm.speculative.NgramDrafter) or "
                    f"a draft model (minillm.serving.draft.DraftModelProposer), got {type(drafter).__name__}")
