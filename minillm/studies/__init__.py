"""Simulation studies that count instead of compute (chapters 7 and 8).

* :mod:`.fragmentation` -- contiguous vs paged KV memory on a chat trace
* :mod:`.prefix_sharing` -- many agents behind one system prompt
"""
from .fragmentation import (CONTIGUOUS_STRATEGIES, FirstFitAllocator, Request, ServingStats, chat_trace,
                            compare_strategies, simulate_contiguous, simulate_paged)
from .prefix_sharing import PrefixSharingStats, PromptRequest, agent_workload, simulate_prefix_sharing

__all__ = ["CONTIGUOUS_STRATEGIES", "FirstFitAllocator", "PrefixSharingStats", "PromptRequest", "Request",
           "ServingStats", "agent_workload", "chat_trace", "compare_strategies", "simulate_contiguous",
           "simulate_paged", "simulate_prefix_sharing"]
