"""Chapter 7: paged KV-cache memory.

* :mod:`.allocator` -- block ids, reference counts, content hashes (no arrays)
* :mod:`.prefix_cache` -- ``PrefixCache``: full blocks named by content hash (also the serving block manager's)
* :mod:`.cache` -- ``PagedKVCache``: K/V pools, block tables, fork/copy-on-write, prefix caching, truncate
* :mod:`.attention` -- the NumPy paged-attention references (decode, and ragged prefill chunks)
* :mod:`.model_cache` -- ``PagedModelCache``: the model's cache protocol on top of a paged pool
"""
from .allocator import BlockAllocator, OutOfBlocks, block_hash
from .attention import gather_kv, paged_attention
from .cache import MemoryStats, PagedKVCache
from .model_cache import PagedModelCache
from .prefix_cache import PrefixCache

__all__ = ["BlockAllocator", "MemoryStats", "OutOfBlocks", "PagedKVCache", "PagedModelCache", "PrefixCache", "block_hash",
           "gather_kv", "paged_attention"]
