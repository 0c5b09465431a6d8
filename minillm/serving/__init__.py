"""Chapter 8: a serving engine with continuous batching (nano-vllm's ``engine/`` split).

* :mod:`.interfaces` -- the contracts between the parts: ``Runner``, ``DraftRunner``, ``MemoryManager``, ``Drafter``
* :mod:`.sequence` -- ``SamplingParams`` and ``Sequence`` (a request's tokens, blocks and timings)
* :mod:`.block_manager` -- block ids and prefix hashes (chapter 7's ``PrefixCache``); no tensors
* :mod:`.contiguous` -- ``ContiguousManager``: one range per sequence, first fit (chapter 7's baseline)
* :mod:`.batch` -- ``StepBatch``: one step's ragged metadata (positions, slot mapping, block tables, cu_seqlens)
* :mod:`.scheduler` -- token budget, chunked prefill, preemption by recompute, FCFS admission
* :mod:`.runner` -- ``NumpyRunner`` (reference) and ``SimulatedRunner`` (counts only);
  :mod:`.torch_runner` -- ``TorchRunner`` (GPU, imports torch; samples with :mod:`minillm.torch_sampling`)
* :mod:`.draft` -- ``DraftModelProposer``: a draft model drafting for every speculating sequence of a step
* :mod:`.engine` -- ``LLMEngine`` (add_request / step / generate / stream) and ``LLM``
"""
from .batch import StepBatch
from .block_manager import BlockManager
from .contiguous import ContiguousManager, FirstFitAllocator
from .engine import LLM, LLMEngine, RequestFailed, RequestOutput, TokenStream
from .interfaces import Drafter, DraftRunner, MemoryManager, Runner
from .runner import NumpyRunner, SimulatedRunner, StepCost
from .scheduler import RequestRejected, Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence, SequenceStatus

__all__ = ["BlockManager", "ContiguousManager", "DraftRunner", "Drafter", "FirstFitAllocator", "LLM", "LLMEngine",
           "MemoryManager", "NumpyRunner", "RequestFailed", "RequestOutput", "RequestRejected", "Runner",
           "SamplingParams", "Scheduler", "SchedulerConfig", "Sequence", "SequenceStatus", "SimulatedRunner",
           "StepBatch", "StepCost", "TokenStream"]
