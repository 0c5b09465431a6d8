"""Chapter 2: the KV cache.

``KVCache`` is preallocated to its capacity: one K and one V array of shape
(n_layers, B, Hkv, capacity, D), filled left to right. Appending a token is a
slice assignment -- O(1) new bytes -- and reading the cache is a view, never a
copy. When it is full it raises :class:`CacheFull`; it never wraps around.

``ConcatKVCache`` is the "grow it as you go" version (what a Python list of
vectors turns into once you need an array for the matmul): every append builds
a new array, so step t copies t rows and a generation of N tokens copies
O(N^2) bytes. It exists to be measured against, in the chapter.

``truncate(n)`` rolls the cache back to its first ``n`` positions (speculative
decoding drops rejected draft tokens this way). The decode loops that use these
caches (``prefill``, ``decode_step``, ``cached_decode``) are in
:mod:`minillm.decode`; this module imports nothing from the package.
"""
from __future__ import annotations

import numpy as np



class CacheFull(RuntimeError):
    """Raised when a write would go past the cache's capacity."""


def _nbytes(x) -> int:
    return int(x.nbytes) if hasattr(x, "nbytes") else int(x.numel() * x.element_size())


def _check_truncate(n, length: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= length:
        raise ValueError(f"truncate needs an integer in [0, {length}] (the cached length), got {n!r}")


def check_advance(n, room: int | None) -> None:
    """``advance``'s check, for every cache that speaks this protocol (``paged.model_cache`` too): ``n`` new
    positions, an integer >= 0 and, where the cache has a capacity, at most the ``room`` left."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 or (room is not None and n > room):
        where = "[0, ...)" if room is None else f"[0, {room}] (the room left in the cache)"
        raise ValueError(f"advance needs an integer in {where}, got {n!r}")


class KVCache:
    """Preallocated per-layer K/V storage; works with NumPy arrays or torch tensors."""

    def __init__(self, k, v):
        if tuple(k.shape) != tuple(v.shape) or len(k.shape) != 5:
            raise ValueError(f"k and v must share a 5-D shape (L, B, Hkv, capacity, D), got {tuple(k.shape)}, {tuple(v.shape)}")
        self.k, self.v = k, v
        self.length = 0

    @classmethod
    def allocate(cls, config, batch: int = 1, capacity: int | None = None, dtype=np.float32):
        capacity = config.max_seq_len if capacity is None else int(capacity)
        if capacity < 1 or batch < 1:
            raise ValueError(f"capacity and batch must be >= 1, got {capacity}, {batch}")
        shape = (config.n_layers, batch, config.n_kv_heads, capacity, config.d_head)
        return cls(np.zeros(shape, dtype), np.zeros(shape, dtype))

    @property
    def capacity(self) -> int:
        return int(self.k.shape[3])

    def write(self, layer: int, k, v):
        """Store the new positions' K/V for one layer; return views of all positions so far."""
        # BEGIN SOLUTION
        n = k.shape[2]
        end = self.length + n
        if end > self.capacity:
            raise CacheFull(f"cache holds {self.capacity} positions; {self.length} used, {n} more requested")
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]
        # END SOLUTION

    def advance(self, n: int) -> None:
        """Count ``n`` more positions as cached (after every layer has written them)."""
        check_advance(n, self.capacity - self.length)
        self.length += int(n)

    def reset(self) -> None:
        self.length = 0

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions. Later writes overwrite the rest; nothing is copied."""
        # BEGIN SOLUTION
        _check_truncate(n, self.length)
        self.length = int(n)
        # END SOLUTION

    @property
    def nbytes(self) -> int:
        """Bytes reserved for the whole capacity (K and V, every layer)."""
        return _nbytes(self.k) + _nbytes(self.v)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position occupies across all layers, K and V, read off the arrays."""
        return self.nbytes // (self.capacity * self.k.shape[1])


class ConcatKVCache:
    """The growing cache, for comparison: each append reallocates and copies everything."""

    def __init__(self, n_layers: int):
        self.k = [None] * n_layers
        self.v = [None] * n_layers
        self.length = 0
        self.bytes_copied = 0

    def write(self, layer: int, k, v):
        if self.k[layer] is not None:
            self.bytes_copied += self.k[layer].nbytes + self.v[layer].nbytes
            k = np.concatenate([self.k[layer], k], axis=2)
            v = np.concatenate([self.v[layer], v], axis=2)
        self.k[layer], self.v[layer] = k, v
        return k, v

    def advance(self, n: int) -> None:
        check_advance(n, None)
        self.length += int(n)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` positions (views; the dropped rows go with the old arrays)."""
        _check_truncate(n, self.length)
        for layer, arr in enumerate(self.k):
            if arr is not None:
                self.k[layer], self.v[layer] = arr[:, :, :n], self.v[layer][:, :, :n]
        self.length = int(n)
