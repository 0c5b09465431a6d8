"""Paged decode attention with one TMA box per block for every KV head at once (chapter 7, an experiment).

Same contract as ``minillm.paged.attention.paged_attention`` and the kernel in ``paged_attention.py``: q
(B, Hq, D); caches (num_blocks, block_size, Hkv, D); block_table (B, max_blocks) int32; seq_lens (B,) int32.

Why: v3 of ``paged_attention.py`` copies one block of one KV head per step. With 16-token blocks that
is a (16, D) box, too little per step for one program to stream at the HBM rate; taking several such
boxes per step, or stacking them into one tile, ran slower still (chapter 7). In the engine's
(slot, head, dim) pool, though, one block holds all of its KV heads side by side: block_size * Hkv
rows of D elements, one contiguous run (32 KiB at 16 tokens, 8 heads, D=128, bf16), as many bytes as a
128-token block of one head. This kernel copies that whole run as one box per step and computes every
query head against it: the scores are (Hq, block_size * Hkv), and a query head keeps only the columns
of its own KV head (row r of the box is slot r // Hkv, head r % Hkv), so 1/Hkv of the dot products are
used. Decode attention is bound by the bytes read, so the extra multiply-adds may cost nothing.

Grid: (B, num_splits), one program per sequence and slice of its tokens, all heads; splits merged
through their log-sum-exp by ``paged_attention.py``'s merge kernel (same partial layout).

Not yet measured on a GPU: ``benchmarks/paged_decode_study.py --parts heads`` (gpu_session ``kernels15``).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import INTERPRETED
from .flash_attention import _ensure_allocator, _num_sms
from .launch import next_power_of_2
from .paged_attention import _merge_splits_kernel, _shared_per_sm, decode_dims, split_plan

MAX_BOX_ROWS = 256  # a TMA box has at most 256 rows: block_size * Hkv must fit
HOST_DESCRIPTORS = True  # the two descriptors made on the host and passed in (else built in every program)


@triton.jit
def _heads_step(q, m, l, acc, k_desc, v_desc, TABLE, b, t0, end, qk_scale, stb, max_blocks, num_blocks, own,
                BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One block, every KV head: its box of BLOCK_SIZE * HKV rows (row r: slot r // HKV, head r % HKV), the
    scores of every query head against every row, all but its own head's masked, the online-softmax step.
    An entry outside the pool points one block past it (TMA reads zeros) and weighs nothing; MASKED masks the
    slots past ``end`` and zeroes their value rows (they may hold anything)."""
    blk = t0 // BLOCK_SIZE
    phys = tl.load(TABLE + b * stb + blk, mask=blk < max_blocks, other=-1)
    ok = (phys >= 0) & (phys < num_blocks)
    row0 = tl.where(ok, phys, num_blocks) * (BLOCK_SIZE * HKV)
    k = k_desc.load([row0, 0])
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale
    rows = tl.arange(0, BLOCK_SIZE * HKV)
    if MASKED:
        live = (t0 + rows // HKV) < end
        valid = own & live[None, :] & ok
    else:
        valid = own & ok
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    v = v_desc.load([row0, 0])
    if MASKED:
        v = tl.where(live[:, None], v, 0.0)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l, acc


@triton.jit
def _paged_heads_kernel(Q, KC, VC, K_DESC, V_DESC, TABLE, LENS, M_OUT, L_OUT, O_OUT, OUT, qk_scale, split_len,
                        sqb, sqh, stb, max_blocks, num_splits, num_blocks, Hq,
                        BLOCK_SIZE: tl.constexpr, HKV: tl.constexpr, GROUP: tl.constexpr, HQ_PAD: tl.constexpr,
                        HEAD_DIM: tl.constexpr, DIRECT: tl.constexpr, IEEE: tl.constexpr):
    b = tl.program_id(0)
    split = tl.program_id(1)
    seq_len = tl.load(LENS + b)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    heads = tl.arange(0, HQ_PAD)
    dims = tl.arange(0, HEAD_DIM)
    hmask = heads < Hq
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :], mask=hmask[:, None], other=0.0)
    # query head h reads the rows of KV head h // GROUP (padding rows read none: no KV head has that index)
    own = (tl.arange(0, BLOCK_SIZE * HKV)[None, :] % HKV) == (heads[:, None] // GROUP)
    m = tl.full([HQ_PAD], float("-inf"), tl.float32)
    l = tl.zeros([HQ_PAD], tl.float32)
    acc = tl.zeros([HQ_PAD, HEAD_DIM], tl.float32)
    if K_DESC is None:
        rows = num_blocks * BLOCK_SIZE * HKV
        k_desc = tl.make_tensor_descriptor(KC, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_SIZE * HKV, HEAD_DIM])
        v_desc = tl.make_tensor_descriptor(VC, shape=[rows, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_SIZE * HKV, HEAD_DIM])
    else:
        k_desc = K_DESC
        v_desc = V_DESC
    full_end = start + tl.maximum(end - start, 0) // BLOCK_SIZE * BLOCK_SIZE
    for t0 in tl.range(start, full_end, BLOCK_SIZE):
        m, l, acc = _heads_step(q, m, l, acc, k_desc, v_desc, TABLE, b, t0, end, qk_scale, stb, max_blocks,
                                num_blocks, own, BLOCK_SIZE=BLOCK_SIZE, HKV=HKV, MASKED=False, IEEE=IEEE)
    if full_end < end:
        m, l, acc = _heads_step(q, m, l, acc, k_desc, v_desc, TABLE, b, full_end, end, qk_scale, stb, max_blocks,
                                num_blocks, own, BLOCK_SIZE=BLOCK_SIZE, HKV=HKV, MASKED=True, IEEE=IEEE)
    if DIRECT:  # one split: normalize and write (0 / 0 = NaN for an empty sequence, as the merge gives)
        out = acc / tl.where(hmask, l, 1.0)[:, None]
        tl.store(OUT + (b * Hq + heads)[:, None] * HEAD_DIM + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=hmask[:, None])
    else:  # the partial, in the layout _merge_splits_kernel reads (BLOCK_D == HEAD_DIM here)
        row = (b * Hq + heads) * num_splits + split
        tl.store(M_OUT + row, m, mask=hmask)
        tl.store(L_OUT + row, l, mask=hmask)
        tl.store(O_OUT + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=hmask[:, None])


def heads_unsupported(k_cache, v_cache) -> str | None:
    """Why this kernel cannot read these caches, or None if it can: the pool must be the engine's contiguous
    (num_blocks, block_size, Hkv, D) layout, so that a block of every head is one run of rows, with
    block_size * Hkv a power of two from 16 (the smallest dot) to ``MAX_BOX_ROWS`` and D a power of two in [16, 256] (TMA boxes, 16-byte rows)."""
    nb, bs, hkv, d = k_cache.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        return "the caches are not contiguous (num_blocks, block_size, Hkv, D) pools"
    rows = bs * hkv
    if not 16 <= rows <= MAX_BOX_ROWS or rows & (rows - 1):
        return f"block_size * Hkv = {rows} is not a power of two in [16, {MAX_BOX_ROWS}]"
    if not (16 <= d <= 256 and d & (d - 1) == 0):
        return f"head dim {d} is not a power of two in [16, 256]"
    if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16:
        return "a base pointer is not 16-byte aligned"
    if (nb + 1) * rows >= 2**31:
        return "the pool has more rows than TMA coordinates address"
    return None


def heads_config(block_size: int, hkv: int, head_dim: int, element_size: int, shared_per_sm: int) -> tuple[int, int]:
    """(num_warps, num_stages) by default: 4 warps, and 3 stages where two buffers of a step's K and V plus
    about 16 KiB fit an SM's shared memory, else 2 (a box of 32 tokens x 8 heads at D=128 needs 280 KiB at 3).
    At 4 warps the compiled kernel holds 255 registers a thread (results/aot_resources_paged_heads_sm90.txt),
    yet on the H200 (4, 3) was the fastest of warps {4, 8} x stages {2, 3} at every B >= 16 and L
    measured with 16-token blocks; 8 warps, the first default, was slower at every point and split count
    (results/paged_decode_heads_bs16_h200.json)."""
    step = 2 * block_size * hkv * head_dim * element_size
    if step + 16384 > shared_per_sm:
        raise ValueError(f"one step of block_size * Hkv = {block_size * hkv} rows needs {step + 16384} bytes of "
                         f"shared memory; an SM has {shared_per_sm}")
    return 4, (3 if 2 * step + 16384 <= shared_per_sm else 2)


def default_heads_splits(batch: int, max_len: int, block_size: int, device) -> int:
    """About one program per SM: batch * splits up to the SM count, each split at least one block."""
    if INTERPRETED:
        return 1
    return max(1, min(_num_sms(device) // batch, math.ceil(max_len / block_size)))


def paged_attention_heads(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None,
                          validate: bool = True, num_splits: int | None = None, num_warps: int | None = None,
                          num_stages: int | None = None) -> torch.Tensor:
    """Decode attention over a paged cache, every KV head of a block in one TMA box per step; same signature as
    the NumPy reference, plus ``num_splits`` (programs per sequence; None: ``default_heads_splits``) and the
    kernel's ``num_warps`` / ``num_stages`` (None: ``heads_config``). Caches this kernel cannot read raise
    (``heads_unsupported`` says why). ``validate=False`` skips the host check of the table, as in
    ``paged_attention``; an entry outside the pool is still never read."""
    B, Hq, Hkv, D, block_size, num_blocks = decode_dims(q, k_cache, v_cache, block_table, seq_lens, validate)
    why = heads_unsupported(k_cache, v_cache)
    if why:
        raise ValueError(f"paged_attention_heads cannot read these caches: {why}")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    max_len = block_table.shape[1] * block_size
    splits = num_splits or default_heads_splits(B, max_len, block_size, q.device)
    split_len, splits = split_plan(max_len, splits, block_size)
    direct = splits == 1
    out = torch.empty((B, Hq, D), device=q.device, dtype=out_dtype)
    if direct:
        m = l = o = out
    else:
        m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        o = torch.empty((B, Hq, splits, D), device=q.device, dtype=torch.float32)
    rows = num_blocks * block_size * Hkv
    if HOST_DESCRIPTORS:
        k_desc, v_desc = (TensorDescriptor(c, [rows, D], [D, 1], [block_size * Hkv, D]) for c in (k_cache, v_cache))
    else:
        k_desc = v_desc = None
        if not INTERPRETED:
            _ensure_allocator()
    qc = q if q.stride(-1) == 1 else q.contiguous()
    if INTERPRETED:
        launch = {"num_warps": 1}
    else:
        warps, stages = heads_config(block_size, Hkv, D, k_cache.element_size(), _shared_per_sm(q.device))
        launch = {"num_warps": num_warps or warps, "num_stages": num_stages or stages}
    _paged_heads_kernel[(B, splits)](
        qc, k_cache, v_cache, k_desc, v_desc, block_table, seq_lens, m, l, o, out, scale * 1.4426950408889634,
        split_len, qc.stride(0), qc.stride(1), block_table.stride(0), block_table.shape[1], splits, num_blocks, Hq,
        BLOCK_SIZE=block_size, HKV=Hkv, GROUP=Hq // Hkv, HQ_PAD=max(16, next_power_of_2(Hq)), HEAD_DIM=D,
        DIRECT=direct, IEEE=q.dtype == torch.float32, **launch)
    if not direct:
        _merge_splits_kernel[(B * Hq,)](m, l, o, out, splits, HEAD_DIM=D, BLOCK_D=D,
                                        SPLITS_PAD=max(2, next_power_of_2(splits)),
                                        num_warps=1 if INTERPRETED else 4)
    return out


__all__ = ["HOST_DESCRIPTORS", "MAX_BOX_ROWS", "default_heads_splits", "heads_config", "heads_unsupported",
           "paged_attention_heads"]
