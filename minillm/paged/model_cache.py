"""A paged KV cache that the model can decode with (chapter 7).

``PagedModelCache`` speaks the same protocol as :class:`minillm.kvcache.KVCache`
(``length``, ``write``, ``advance``) plus ``attend``: the model's forward pass
calls ``cache.attend(layer, q)`` instead of its ``attn_fn`` when the cache offers
it. Keys and values live in shared pools of fixed-size blocks, in the NHD page
layout (num_blocks, block_size, Hkv, D); each batch row has a block table, and
a new block is taken from the allocator only when a row crosses a block boundary.

Decode steps (one query row) go through a paged-attention function that reads
K/V through the block table (the NumPy reference, or the Triton kernel on torch
tensors). Prefill gathers the prompt's K/V and runs ordinary causal attention.
"""
from __future__ import annotations

import numpy as np

from ..attention import standard_attention
from ..kvcache import check_advance
from .attention import paged_attention as paged_reference
from .allocator import BlockAllocator, OutOfBlocks


class PagedModelCache:
    def __init__(self, k_pool, v_pool, allocator: BlockAllocator, batch: int = 1, paged_fn=paged_reference,
                 dense_fn=standard_attention, index=np.asarray):
        if tuple(k_pool.shape) != tuple(v_pool.shape) or len(k_pool.shape) != 5:
            raise ValueError(f"pools must share a (layers, num_blocks, block_size, Hkv, D) shape, "
                             f"got {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
        self.k_pool, self.v_pool = k_pool, v_pool
        self.allocator = allocator
        self.block_size = int(k_pool.shape[2])
        self.tables: list[list[int]] = [[] for _ in range(batch)]
        self.length = 0
        self.paged_fn, self.dense_fn, self.index = paged_fn, dense_fn, index
        self._memo: dict = {}  # slot maps and the block table for the current forward pass (same in every layer)

    @classmethod
    def allocate(cls, config, num_blocks: int, block_size: int = 16, batch: int = 1, dtype=np.float32):
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.d_head)
        return cls(np.zeros(shape, dtype), np.zeros(shape, dtype), BlockAllocator(num_blocks, block_size), batch)

    def _ensure_blocks(self, n_new: int) -> None:
        need = -(-(self.length + n_new) // self.block_size)
        missing = sum(need - len(t) for t in self.tables)
        if missing > self.allocator.num_free:  # all-or-nothing: never leave a batch half-grown
            raise OutOfBlocks(f"{missing} blocks needed, {self.allocator.num_free} free",
                              requested=missing, free=self.allocator.num_free)
        for table in self.tables:
            while len(table) < need:
                table.append(self.allocator.allocate())

    def _slots(self, start: int, stop: int):
        if ("slots", start, stop) not in self._memo:
            self._memo[("slots", start, stop)] = self._build_slots(start, stop)
        return self._memo[("slots", start, stop)]

    def _build_slots(self, start: int, stop: int):
        pos = np.arange(start, stop)
        phys = np.array([[t[p // self.block_size] for p in pos] for t in self.tables])  # (B, n)
        return self.index(phys), self.index(np.broadcast_to(pos % self.block_size, phys.shape).copy())

    def write(self, layer: int, k, v):
        """Store new positions' K/V (B, Hkv, n, D) in their blocks; return them unchanged."""
        n = k.shape[2]
        if layer == 0:
            self._ensure_blocks(n)
        phys, slot = self._slots(self.length, self.length + n)
        # (B, Hkv, n, D) -> (B, n, Hkv, D): the page layout is token-major (swapaxes works for NumPy and torch)
        self.k_pool[layer][phys, slot] = k.swapaxes(1, 2)
        self.v_pool[layer][phys, slot] = v.swapaxes(1, 2)
        return k, v

    def block_table(self):
        if "table" not in self._memo:
            width = max(len(t) for t in self.tables)
            self._memo["table"] = self.index(np.array([t + [0] * (width - len(t)) for t in self.tables], np.int32))
        return self._memo["table"]

    def attend(self, layer: int, q, k_new, v_new):
        """Attention for the new positions of every row, reading the cache through the block tables."""
        total = self.length + q.shape[2]
        if q.shape[2] == 1:
            lens = self.index(np.full(len(self.tables), total, np.int32))
            out = self.paged_fn(q[:, :, 0], self.k_pool[layer], self.v_pool[layer], self.block_table(), lens)
            return out[:, :, None]
        phys, slot = self._slots(0, total)
        k = self.k_pool[layer][phys, slot].swapaxes(1, 2)  # gathered for the prefill pass: (B, Hkv, total, D)
        v = self.v_pool[layer][phys, slot].swapaxes(1, 2)
        return self.dense_fn(q, k, v, causal=True)

    def advance(self, n: int) -> None:
        """Count ``n`` more positions as cached (after every layer has written them)."""
        check_advance(n, None)                         # (its slots come from the allocator: no fixed capacity)
        self.length += int(n)
        self._memo.clear()

    def release(self) -> None:
        for table in self.tables:
            for block in table:
                self.allocator.free(block)
            table.clear()
        self.length = 0
        self._memo.clear()
