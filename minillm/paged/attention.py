"""Chapter 7: decode attention over a paged KV cache, NumPy reference.

Layout (shared with the Triton kernel, ``minillm.kernels.paged_attention``):

    q            (B, Hq, D)                       one new query row per sequence
    k_cache      (num_blocks, block_size, Hkv, D) the "NHD" page layout (flash-attn, FlashInfer)
    v_cache      (num_blocks, block_size, Hkv, D)
    block_table  (B, max_blocks) int32            logical block i of sequence b lives in block_table[b, i]
    seq_lens     (B,) int32                       tokens cached for each sequence

Position t of sequence b is slot ``t % block_size`` of physical block
``block_table[b, t // block_size]``. Entries of the table past a sequence's last
block are padding and are never read.
"""
from __future__ import annotations

import numpy as np

from ..softmax import safe_softmax


def check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, check_table: bool = True) -> tuple[int, ...]:
    """Validate shapes, dtypes and every table entry that will be read; return (B, Hq, Hkv, D, bs, nb).

    ``check_table=False`` stops after the shapes and dtypes, before reading the table's contents
    (for GPU tensors that read is a copy to the host and a sync).
    """
    shapes = {n: tuple(x.shape) for n, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                                                ("block_table", block_table), ("seq_lens", seq_lens))}
    if len(shapes["q"]) != 3:
        raise ValueError(f"q must be (B, Hq, D), got {shapes['q']}")
    if len(shapes["k_cache"]) != 4 or shapes["k_cache"] != shapes["v_cache"]:
        raise ValueError(f"k_cache and v_cache must share a (num_blocks, block_size, Hkv, D) shape, "
                         f"got {shapes['k_cache']} and {shapes['v_cache']}")
    B, Hq, D = shapes["q"]
    num_blocks, block_size, Hkv, Dk = shapes["k_cache"]
    if Dk != D:
        raise ValueError(f"head dim of q ({D}) and cache ({Dk}) differ")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if len(shapes["block_table"]) != 2 or shapes["block_table"][0] != B:
        raise ValueError(f"block_table must be (B={B}, max_blocks), got {shapes['block_table']}")
    if shapes["seq_lens"] != (B,):
        raise ValueError(f"seq_lens must be (B={B},), got {shapes['seq_lens']}")
    for name, x in (("block_table", block_table), ("seq_lens", seq_lens)):
        if str(x.dtype) not in ("int32", "torch.int32"):
            raise ValueError(f"{name} must be int32, got {x.dtype}")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        floating = getattr(x.dtype, "is_floating_point", None)   # torch dtypes say so themselves
        if not (np.issubdtype(np.dtype(x.dtype), np.floating) if floating is None else floating):
            raise ValueError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if q.dtype != k_cache.dtype or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"q, k_cache, v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if not check_table:
        return B, Hq, Hkv, D, block_size, num_blocks
    lens = np.asarray(seq_lens.cpu() if hasattr(seq_lens, "cpu") else seq_lens).astype(np.int64)
    table = np.asarray(block_table.cpu() if hasattr(block_table, "cpu") else block_table).astype(np.int64)
    max_blocks = table.shape[1]
    if lens.min(initial=1) < 1:
        raise ValueError(f"every seq_len must be >= 1, got {lens.tolist()}")
    needed = -(-lens // block_size)
    if needed.max(initial=0) > max_blocks:
        b = int(needed.argmax())
        raise ValueError(f"seq_len {lens[b]} of sequence {b} needs {needed[b]} blocks; its table covers {max_blocks}")
    used = np.arange(max_blocks)[None, :] < needed[:, None]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        b, i = map(int, np.argwhere(bad)[0])
        raise ValueError(f"block_table[{b}, {i}] = {table[b, i]} points outside the pool of {num_blocks} blocks")
    return B, Hq, Hkv, D, block_size, num_blocks


def gather_kv(k_cache, v_cache, block_table, seq_len: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The contiguous (seq_len, Hkv, D) keys and values of sequence b."""
    bs = k_cache.shape[1]
    pos = np.arange(seq_len)
    phys = np.asarray(block_table)[b, pos // bs]
    return k_cache[phys, pos % bs], v_cache[phys, pos % bs]


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None,
                    validate: bool = True) -> np.ndarray:
    """softmax(q K^T * scale) V for each sequence's cached keys, read through its block table.

    ``validate=False`` skips the table check (the Triton kernel's way to avoid a host sync per call);
    here a bad table then fails in NumPy indexing or reads the wrong block.
    """
    B, Hq, Hkv, D, _, _ = check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, check_table=validate)
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    ct = np.result_type(np.float32, q.dtype)
    group = Hq // Hkv
    out = np.empty((B, Hq, D), ct)
    for b in range(B):
        k, v = gather_kv(k_cache, v_cache, block_table, int(seq_lens[b]), b)   # (L, Hkv, D)
        qb = q[b].astype(ct).reshape(Hkv, group, D)
        s = np.einsum("hgd,lhd->hgl", qb, k.astype(ct)) * scale
        out[b] = np.einsum("hgl,lhd->hgd", safe_softmax(s), v.astype(ct)).reshape(Hq, D)
    return out.astype(q.dtype, copy=False)


def check_varlen_inputs(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q,
                        check_table: bool = True) -> tuple[int, ...]:
    """Validate a ragged batch for :func:`paged_varlen_attention`; return (T, S, Hq, Hkv, D, bs, nb).

    With ``check_table=False`` only shapes and dtypes are checked (no read of the index arrays' contents,
    which on a GPU is a copy to the host).
    """
    if len(tuple(q.shape)) != 3:
        raise ValueError(f"q must be (T, Hq, D): the new tokens of every sequence, flat; got {tuple(q.shape)}")
    T = int(q.shape[0])
    S = int(tuple(context_lens.shape)[0]) if len(tuple(context_lens.shape)) == 1 else -1
    if S < 1 or tuple(cu_seqlens_q.shape) != (S + 1,):
        raise ValueError(f"context_lens must be (S,) and cu_seqlens_q (S+1,), got {tuple(context_lens.shape)} "
                         f"and {tuple(cu_seqlens_q.shape)}")
    if str(cu_seqlens_q.dtype) not in ("int32", "torch.int32"):
        raise ValueError(f"cu_seqlens_q must be int32, got {cu_seqlens_q.dtype}")
    if T < S:
        raise ValueError(f"{T} query tokens for {S} sequences: every sequence needs at least one new token")
    # the per-sequence checks are the decode kernel's, with the first S query rows standing in for the tokens
    _, Hq, Hkv, D, bs, nb = check_paged_inputs(q[:S], k_cache, v_cache, block_tables, context_lens,
                                               check_table=False)
    if not check_table:
        return T, S, Hq, Hkv, D, bs, nb
    cu = np.asarray(cu_seqlens_q.cpu() if hasattr(cu_seqlens_q, "cpu") else cu_seqlens_q).astype(np.int64)
    lens = np.asarray(context_lens.cpu() if hasattr(context_lens, "cpu") else context_lens).astype(np.int64)
    qlens = np.diff(cu)
    if cu[0] != 0 or cu[-1] != T or (qlens < 1).any():
        raise ValueError(f"cu_seqlens_q must rise from 0 to T={T} in steps >= 1, got {cu.tolist()}")
    if (qlens > lens).any():
        s = int(np.argmax(qlens > lens))
        raise ValueError(f"sequence {s} has {qlens[s]} new tokens but a context of only {lens[s]} "
                         f"(the context length counts the new tokens too)")
    check_paged_inputs(q[:S], k_cache, v_cache, block_tables, context_lens, check_table=True)
    return T, S, Hq, Hkv, D, bs, nb


def paged_varlen_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q,
                           scale: float | None = None, validate: bool = True) -> np.ndarray:
    """Causal attention for a ragged batch of new tokens against a paged cache (prefill chunks and decodes).

    Layout (shared with the Triton kernel ``minillm.kernels.paged_prefill``):

        q             (T, Hq, D)       the new tokens of all S sequences, sequence after sequence
        k_cache       (num_blocks, block_size, Hkv, D), v_cache likewise: one layer's pools
        block_tables  (S, max_blocks) int32
        context_lens  (S,) int32       cached tokens of each sequence, the new ones included
        cu_seqlens_q  (S+1,) int32     sequence s owns rows cu_seqlens_q[s] : cu_seqlens_q[s+1] of q

    The new tokens' K/V must already be in the cache (the model writes them through the slot mapping
    first). New token i of sequence s sits at position ``context_lens[s] - q_len[s] + i`` and attends to
    positions 0..itself: the cached context, then its own chunk causally. A decode step is q_len = 1.
    """
    T, S, Hq, Hkv, D, _, _ = check_varlen_inputs(q, k_cache, v_cache, block_tables, context_lens,
                                                 cu_seqlens_q, check_table=validate)
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    ct = np.result_type(np.float32, q.dtype)
    group = Hq // Hkv
    out = np.empty((T, Hq, D), ct)
    cu = np.asarray(cu_seqlens_q)
    for s in range(S):
        lo, hi, n = int(cu[s]), int(cu[s + 1]), int(context_lens[s])
        k, v = gather_kv(k_cache, v_cache, block_tables, n, s)                # (n, Hkv, D)
        qs = q[lo:hi].astype(ct).reshape(hi - lo, Hkv, group, D)
        sc = np.einsum("thgd,lhd->hgtl", qs, k.astype(ct)) * scale
        qpos = n - (hi - lo) + np.arange(hi - lo)
        sc = np.where(np.arange(n)[None, :] <= qpos[:, None], sc, -np.inf)
        out[lo:hi] = np.einsum("hgtl,lhd->thgd", safe_softmax(sc), v.astype(ct)).reshape(hi - lo, Hq, D)
    return out.astype(q.dtype, copy=False)
