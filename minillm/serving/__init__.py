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
* :mod:`.engine` -- ``LLMEngine`` (add_request / step / generate / stream)
* :mod:`.llm` -- ``LLM``: an engine for a shipped model behind vLLM's offline API; ``apply_chat_template``
* :mod:`.outputs` -- ``RequestOutput`` / ``CompletionOutput`` (vLLM's shape plus the book's timings)
* :mod:`.processing` -- the host-sampling path for min_p, repetition_penalty and logprobs
"""
from .batch import StepBatch
from .block_manager import BlockManager
from .contiguous import ContiguousManager, FirstFitAllocator
from .engine import LLMEngine, RequestFailed, TokenStream
from .llm import LLM, apply_chat_template
from .outputs import CompletionOutput, Logprob, RequestOutput
from .interfaces import Drafter, DraftRunner, MemoryManager, Runner
from .runner import NumpyRunner, SimulatedRunner, StepCost
from .scheduler import RequestRejected, Scheduler, SchedulerConfig
from .sequence import SamplingParams, Sequence, SequenceStatus

__all__ = ["BlockManager", "CompletionOutput", "ContiguousManager", "DraftRunner", "Drafter", "FirstFitAllocator", "LLM", "LLMEngine", "Logprob",
           "MemoryManager", "NumpyRunner", "RequestFailed", "RequestOutput", "RequestRejected", "Runner",
           "SamplingParams", "Scheduler", "SchedulerConfig", "Sequence", "SequenceStatus", "SimulatedRunner",
           "StepBatch", "StepCost", "TokenStream", "apply_chat_template"]
