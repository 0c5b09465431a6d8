"""FlashAttention in Triton: forward and backward, same contract as minillm.attention.flash_attention.

Layout (torch SDPA's): q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), Hq % Hkv == 0.
``causal=True`` is bottom-right aligned: query i sees keys j <= i + Nk - Nq.
Rows that see no key return zeros (and lse = -inf).

Forward, one program per (query tile, batch x head), FlashAttention-2 loop order:

    load Q_i once
    for each key tile j (stopping at the causal diagonal):
        S = Q_i K_j^T * scale            (registers, never HBM)
        m_new = max(m, rowmax(S)); alpha = exp(m - m_new)
        P = exp(S - m_new); l = l * alpha + rowsum(P)
        acc = acc * alpha + P V_j
    O_i = acc / l;  lse_i = m + log(l)

Exponentials use exp2 with log2(e) folded into the scale (one multiply fewer per
score). GQA is an index map: query head h reads K/V head h // (Hq / Hkv), so K
and V are never repeated in memory. Head dims that are not powers of two are
padded to the next one inside the kernel with masked loads.

Backward recomputes P from Q, K and the saved lse (P is never stored): programs that
own a key tile accumulate dK, dV (over every query head of a GQA group), programs that
own a query tile accumulate dQ (in v5, the key-tile programs add dQ by atomics instead).

Every version of both stays in this module, selectable, so that one benchmark can time
them side by side (chapter 6 lists what each bought): forward v1 (pointer loads, the loop
above) and v2-v5 (TMA tensor descriptors, warp specialization, a persistent grid; see the
note above _fwd_inner_tma; compiled, the warp-specialized v3/v5 drop an lse stored through
pointers, so they store it through a tensor descriptor, see WS_LSE_STORE); backward v1 (two kernels, per-query-head buffers)
and v2-v5 (one launch; TMA tile loads; two launches; dQ by atomics). ``fwd_plan`` and
``bwd_plan`` pick the measured defaults.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..attention import check_attention_inputs
from . import INTERPRETED, check_placement, check_tensors
from .launch import bind, cdiv, fast_launch, fast_path_on, next_power_of_2

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
LOG2E = 1.4426950408889634
last_forward_kernel = None  # the compiled forward of the latest call: its n_regs/n_spills/shared feed the tune report
last_forward_constexprs: dict = {}  # the constexprs the latest forward call launched with (its first launch for v6;
# the bound launch's own dict, to read only)
last_backward_kernel = None  # the same for backward v2


def check_inputs(q, k, v) -> None:
    check_tensors(q=q, k=k, v=v)
    # the layout rules are the NumPy reference's; only tensor-specific checks follow
    D = check_attention_inputs(q, k, v)[-1]
    if D > MAX_HEAD_DIM:
        raise ValueError(f"unsupported head dim {D}: at most {MAX_HEAD_DIM}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(q=q, k=k, v=v)


@triton.jit
def _load_tile(ptrs, in_rows, in_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """tl.load with only the masks a tile needs: interior tiles of a power-of-two head dim load unmasked."""
    if CHECK_ROWS:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=in_rows & in_cols, other=0.0)
        else:
            x = tl.load(ptrs, mask=in_rows, other=0.0)
    else:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=in_cols, other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b on the tensor cores (or in exact fp32 for fp32 inputs)."""
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _causal_order(NUM_M, BH, GROUP_HEADS):
    """(query tile, batch x head) of this program of a causal (NUM_M, BH) grid, heaviest first by groups of
    GROUP_HEADS heads. The hardware starts programs in order, x fastest; program i of a group of g heads takes
    tile NUM_M - 1 - i // g of head i % g, so every head of the group starts its last (largest) tile before
    any starts a smaller one, and the grid ends on the one-tile diagonals instead of on whole heads.
    GROUP_HEADS = 1 is one head at a time, the order before; the last group may hold fewer heads."""
    linear = tl.program_id(1) * NUM_M + tl.program_id(0)
    per_group = GROUP_HEADS * NUM_M
    group = linear // per_group
    r = linear - group * per_group
    g = tl.minimum(GROUP_HEADS, BH - group * GROUP_HEADS)
    return NUM_M - 1 - r // g, group * GROUP_HEADS + r % g


@triton.jit
def _key_range(m0, Nk, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full, hi) for the query tile starting at row m0: key tiles [0, full) are valid for every row of
    the tile and run unmasked; [full, hi) need masks (the causal diagonal, and the ragged last tile when
    Nk is not a multiple of BLOCK_N). Causal: query i sees keys j <= i + offset."""
    full = (Nk // BLOCK_N) * BLOCK_N
    hi = Nk
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Nk, m0 + BLOCK_M + offset), 0)
        first_row_sees = tl.maximum(m0 + offset + 1, 0)  # keys the tile's first row sees
        full = tl.minimum(full, (first_row_sees // BLOCK_N) * BLOCK_N)
    return full, hi


@triton.jit
def _normalize(acc, l, m):
    """The forward's epilogue: O = acc / l and the natural-log LSE (m is in log2 units); a row that saw
    no key gets zeros and lse = -inf."""
    l_safe = tl.where(l > 0, l, 1.0)
    return acc / l_safe[:, None], tl.where(l > 0, (m + tl.log2(l_safe)) / 1.4426950408889634, float("-inf"))


@triton.jit
def _fwd_inner(acc, l, m, q, k_base, v_base, rows, dims, lo, hi, Nk, offset, skn, svn, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PAD_D: tl.constexpr, IEEE: tl.constexpr):
    """Key tiles [lo, hi) against one query tile. MASKED=False is the hot loop: every score is valid,
    so there is no mask to build and no row can still have max -inf."""
    # BEGIN SOLUTION
    dmask = dims < HEAD_DIM
    for start in tl.range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_k = cols < Nk
        kt = _load_tile(k_base + cols[None, :] * skn + dims[:, None], in_k[None, :], dmask[:, None],
                        MASKED, PAD_D)  # K^T tile, (BLOCK_D, BLOCK_N)
        if IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        if MASKED:
            valid = in_k[None, :]
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + offset)
            s = tl.where(valid, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            p = tl.exp2(s - m_shift[:, None])
        else:
            m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
            m_shift = m_new
            p = tl.exp2(s * qk_scale - m_shift[:, None])  # scale and shift in one FMA
        alpha = tl.exp2(m - m_shift)  # exp2(-inf) = 0: nothing to rescale yet
        l = l * alpha + tl.sum(p, axis=1)
        vt = _load_tile(v_base + cols[:, None] * svn + dims[None, :], in_k[:, None], dmask[None, :],
                        MASKED, PAD_D)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p.to(vt.dtype), vt, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(vt.dtype), vt, acc)  # accumulate in place: the MMA adds into acc
        m = m_new
    return acc, l, m
    # END SOLUTION


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP, GROUP_HEADS,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    if CAUSAL:  # the last query tiles have the most keys: start them first so no SM idles at the end
        pid_m, bh = _causal_order(tl.num_programs(0), tl.num_programs(1), GROUP_HEADS)
    b = (bh // H).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    h = bh % H
    hk = h // GROUP  # GQA: the shared K/V head
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :],
                mask=(rows[:, None] < Nq) & (dims[None, :] < HEAD_DIM), other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offset = Nk - Nq  # bottom-right alignment
    full, hi = _key_range(pid_m * BLOCK_M, Nk, offset, BLOCK_M, BLOCK_N, CAUSAL)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    acc, l, m = _fwd_inner(acc, l, m, q, k_base, v_base, rows, dims, 0, full, Nk, offset, skn, svn, qk_scale,
                           HEAD_DIM, BLOCK_N, False, CAUSAL, PAD_D, IEEE)
    acc, l, m = _fwd_inner(acc, l, m, q, k_base, v_base, rows, dims, full, hi, Nk, offset, skn, svn, qk_scale,
                           HEAD_DIM, BLOCK_N, True, CAUSAL, PAD_D, IEEE)
    o, lse = _normalize(acc, l, m)
    tl.store(O + b * sob + h * soh + rows[:, None] * son + dims[None, :], o.to(O.dtype.element_ty),
             mask=(rows[:, None] < Nq) & (dims[None, :] < HEAD_DIM))
    tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)


@triton.jit
def _fwd_resume_kernel(Q, K, V, O, LSE, OP, qk_scale, Nq, Nk, H, GROUP,
                       sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       FIRST_M: tl.constexpr, FIRST_N: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr):
    """The second launch of the causal v6: the masked key tiles of each query tile (the diagonal), resumed from
    the partial O (OP, same strides as O) and the LSE that the first launch stored for the unmasked tiles
    [0, full), ``full`` as the first launch's FIRST_M x FIRST_N tiles set it; this launch's own BLOCK_M rows
    lie inside one of those tiles. (o, lse) is an online-softmax state of its own: with m = lse in log2 units
    and l = 1, acc = o satisfies acc / l = o and m + log2(l) = lse, so the loop goes on as if it had never
    stopped; a row that saw no key yet (lse = -inf) starts empty."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    tile = (rows[:, None] < Nq) & (dims[None, :] < HEAD_DIM)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], mask=tile, other=0.0)
    offsets = b * sob + h * soh + rows[:, None] * son + dims[None, :]
    acc = tl.load(OP + offsets, mask=tile, other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=float("-inf"))
    m = lse * 1.4426950408889634
    l = tl.where(lse == float("-inf"), 0.0, 1.0)
    offset = Nk - Nq
    full = _key_range((m0 // FIRST_M) * FIRST_M, Nk, offset, FIRST_M, FIRST_N, True)[0]
    hi = _key_range(m0, Nk, offset, BLOCK_M, BLOCK_N, True)[1]
    acc, l, m = _fwd_inner(acc, l, m, q, K + b * skb + hk * skh, V + b * svb + hk * svh, rows, dims, full, hi,
                           Nk, offset, skn, svn, qk_scale, HEAD_DIM, BLOCK_N, True, True, PAD_D, IEEE)
    o, lse = _normalize(acc, l, m)
    tl.store(O + offsets, o.to(O.dtype.element_ty), mask=tile)
    tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)


# ---------------------------------------------------------------------------------------------
# Forward v2-v5: the same FlashAttention-2 loop, fed by the Hopper tensor-memory accelerator (TMA).
#
# * v2: Q, K, V and O move through in-kernel tensor descriptors (tl.make_tensor_descriptor), one per
#   (batch, head): a tile load is one TMA copy from HBM straight to shared memory, issued by one thread,
#   instead of every thread computing addresses and moving its part through registers. The descriptor
#   knows the tensor's extent, so rows past the end read as zeros and stores past it are dropped: no
#   load masks at all (the scores of a ragged last key tile are still masked).
# * v3: v2 with warp specialization (tl.range(..., warp_specialize=True)): the compiler splits the
#   program into a producer warp group that only issues TMA loads and consumer warp groups that do the
#   math, handing tiles over through shared-memory barriers. Non-causal only: with 4 warps, Triton
#   3.6 failed to compile the causal kernel's two loops specialized (as triton#9728 reports) and,
#   with the loops merged into one masked loop, returned NaNs on the H200; with 8 warps both forms
#   were right but slower than v1 (results/flash_attention_tune_h200.json, _causal_ws_h200.json).
#   One masked loop with its mask built inside the loop from scalars (v9 / v10, since reverted) was
#   right with 4 warps, but 3-7% slower than v2 with host descriptors at 4K-8K; masking behind a branch,
#   or with host descriptors, it failed to compile (results/flash_attention_tune_oneloop*_h200.json).
#   So a causal call of v3 / v5 runs v2 / v4.
# * v4: v2 with a persistent grid: one program per SM (times the occupancy) loops over the tiles,
#   heaviest first when causal, so no SM idles in a last partial wave.
# * v5: v4 with warp specialization on the persistent loop.
# * v6: the causal v3 in two launches. The first runs only the unmasked key tiles of each query tile
#   (PART=1): one loop, which warp specialization compiles causal too, and stores the partial O (float32,
#   SPLIT_PARTIAL_FP32) and the LSE of the keys seen so far (through the descriptor store). The second,
#   _fwd_resume_kernel, runs the masked diagonal tiles from that state, on smaller tiles (RESUME_CONFIG).
#   Non-causal calls of v6 are v3.
# * The causal v2 / v4 in one key loop (CAUSAL_DIAG_BRANCH, the default): the tiles the diagonal crosses are masked
#   behind a branch inside the loop instead of in a second loop, so the K/V pipeline does not drain before the
#   diagonal. It pays where one program fills an SM (128 x 128 tiles: +4.3-6.4% at 8K) and is what let 128 x 128 tiles
#   take 2K-4K and v2 take 16K from v6 (results/flash_attention_diag_branch*_h200.json).
# * Tried on v2 / v4 and reverted (commit f276f0d): FA4's lazy rescale, where a row keeps its running max until a
#   tile passes it by more than 8 (log2 units) and the accumulator is rescaled only when some row moved. The
#   branch needs a reduction over the whole tile each step; it ran at 0.62-0.67x the default's speed at causal d=128
#   1K-4K (64 x 64 tiles) and 0.95-0.97x at 8K and at d=64 (results/flash_attention_lazy_h200.json, _lazy64_).
# ---------------------------------------------------------------------------------------------

@triton.jit
def _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, lo, hi, Nk, offset, qk_scale, mask_from,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                   WS: tl.constexpr, BRANCH: tl.constexpr = False):
    """_fwd_inner with the K and V tiles loaded through descriptors (rows past Nk read as zeros); ``kv_row`` is
    the first row of this (batch, KV head) in the descriptors' view (0 for per-head descriptors). ``BRANCH``
    (CAUSAL_DIAG_BRANCH): one loop over every key tile, the tiles from ``mask_from`` masked behind a branch."""
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start = tl.multiple_of(start, BLOCK_N)
        kt = k_desc.load([kv_row + start, 0]).T  # K^T tile, (BLOCK_D, BLOCK_N), a view of the shared-memory copy
        s = _mma(q, kt, tl.zeros([q.shape[0], BLOCK_N], tl.float32), IEEE)
        if BRANCH:
            if start >= mask_from:  # the diagonal (and a ragged last tile): scores past it become -inf
                cols = start + tl.arange(0, BLOCK_N)
                s = tl.where((cols[None, :] < Nk) & (cols[None, :] <= rows[:, None] + offset), s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # (a row that has seen no key yet)
            p = tl.exp2(s * qk_scale - m_shift[:, None])
        elif MASKED:
            cols = start + tl.arange(0, BLOCK_N)
            valid = cols[None, :] < Nk
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + offset)
            s = tl.where(valid, s * qk_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_shift[:, None])
        else:
            m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
            m_shift = m_new
            p = tl.exp2(s * qk_scale - m_shift[:, None])
        alpha = tl.exp2(m - m_shift)
        l = l * alpha + tl.sum(p, axis=1)
        v = v_desc.load([kv_row + start, 0])
        acc = _mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m = m_new
    return acc, l, m


@triton.jit
def _fwd_tile_tma(pid_m, bh, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
                  sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC, LSE_DESC,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, EVEN_N: tl.constexpr, IEEE: tl.constexpr, WS: tl.constexpr,
                  LSE_STORE: tl.constexpr = 0, PART: tl.constexpr = 0, DIAG_BRANCH: tl.constexpr = False):
    """One query tile of one (batch, head): descriptors, the two key loops, the epilogue. The descriptors come
    from the host (Q_DESC...: over the flattened (B * heads * N, D) tensors, whose rows of one head start at
    head * N; ``TMA_HOST_DESCRIPTORS``) or are built here per (batch, head), every tile. ``LSE_STORE``:
    0 stores the LSE through pointers built from the row offsets computed before the loop, 1 through
    offsets recomputed after it, 2 through a 1-D tensor descriptor, the only one of the three that warp
    specialization keeps (see WS_LSE_STORE); 0 and 1 stay for benchmarks/check_ws_lse.py. ``PART`` 1 (v6):
    the unmasked key tiles only, one loop, which warp specialization compiles causal too; O and the LSE
    it stores are those of the keys seen so far, and _fwd_resume_kernel adds the masked tiles."""
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = h // GROUP
    if Q_DESC is None:
        q_desc = tl.make_tensor_descriptor(Q + b * sqb + h * sqh, shape=[Nq, HEAD_DIM], strides=[sqn, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        k_desc = tl.make_tensor_descriptor(K + b * skb + hk * skh, shape=[Nk, HEAD_DIM], strides=[skn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        v_desc = tl.make_tensor_descriptor(V + b * svb + hk * svh, shape=[Nk, HEAD_DIM], strides=[svn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        o_desc = tl.make_tensor_descriptor(O + b * sob + h * soh, shape=[Nq, HEAD_DIM], strides=[son, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        q_row = 0
        kv_row = 0
    else:  # the host checked: contiguous tensors, Nq % BLOCK_M == Nk % BLOCK_N == 0 (no tile crosses a head)
        q_desc = Q_DESC
        k_desc = K_DESC
        v_desc = V_DESC
        o_desc = O_DESC
        q_row = bh * Nq
        kv_row = ((bh // H) * (H // GROUP) + hk) * Nk  # int32, as descriptor coordinates must be
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    q = q_desc.load([q_row + m0, 0])
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offset = Nk - Nq
    full, hi = _key_range(m0, Nk, offset, BLOCK_M, BLOCK_N, CAUSAL)
    if DIAG_BRANCH and CAUSAL and PART == 0 and not WS:  # one loop, the masked tiles behind a branch
        acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, 0, hi, Nk, offset, qk_scale, full,
                                   BLOCK_N, False, CAUSAL, IEEE, False, True)
    else:
        acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, 0, full, Nk, offset, qk_scale, 0,
                                   BLOCK_N, False, CAUSAL, IEEE, WS)
        if PART == 0 and (CAUSAL or not EVEN_N):  # a non-causal call with Nk % BLOCK_N == 0 compiles one loop only
            acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, full, hi, Nk, offset, qk_scale, 0,
                                       BLOCK_N, True, CAUSAL, IEEE, False)
    o, lse = _normalize(acc, l, m)
    o_desc.store([q_row + m0, 0], o.to(O.dtype.element_ty))
    if LSE_STORE == 2:
        if LSE_DESC is None:
            lse_desc = tl.make_tensor_descriptor(LSE + bh * Nq, shape=[Nq], strides=[1], block_shape=[BLOCK_M])
            lse_desc.store([m0], lse)
        else:
            LSE_DESC.store([q_row + m0], lse)
    elif LSE_STORE == 1:
        rows_out = m0 + tl.arange(0, BLOCK_M)
        tl.store(LSE + bh * Nq + rows_out, lse, mask=rows_out < Nq)
    else:
        tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)


@triton.jit
def _fwd_kernel_tma(Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP, GROUP_HEADS, NUM_M_TILES, NUM_TILES,
                    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC,
                    LSE_DESC,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, EVEN_N: tl.constexpr, IEEE: tl.constexpr, WS: tl.constexpr,
                    PERSISTENT: tl.constexpr, LSE_STORE: tl.constexpr = 0, PART: tl.constexpr = 0,
                    DIAG_BRANCH: tl.constexpr = False):
    if PERSISTENT:
        # tile t: causal runs the last (heaviest) query tiles of every head first; non-causal keeps the
        # tiles of one head together, so the programs running at once share its K and V in L2
        for t in tl.range(tl.program_id(0), NUM_TILES, tl.num_programs(0), warp_specialize=WS):
            if CAUSAL:
                pid_m = NUM_M_TILES - 1 - t // (NUM_TILES // NUM_M_TILES)
                bh = t % (NUM_TILES // NUM_M_TILES)
            else:
                pid_m = t % NUM_M_TILES
                bh = t // NUM_M_TILES
            _fwd_tile_tma(pid_m, bh, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
                          sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                          Q_DESC, K_DESC, V_DESC, O_DESC, LSE_DESC,
                          HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, EVEN_N, IEEE, False, LSE_STORE, PART,
                          DIAG_BRANCH)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        if CAUSAL:
            pid_m, bh = _causal_order(tl.num_programs(0), tl.num_programs(1), GROUP_HEADS)
        _fwd_tile_tma(pid_m, bh, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
                      sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                      Q_DESC, K_DESC, V_DESC, O_DESC, LSE_DESC,
                      HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, EVEN_N, IEEE, WS, LSE_STORE, PART, DIAG_BRANCH)


def _blocks(D: int, dtype, interpreted: bool = INTERPRETED, impl: str = "v1", causal: bool = False,
            n: int = 4096) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of one forward version; small tiles in the interpreter.

    The 16-bit rows are the winners of benchmarks/flash_attention_tune.py on the H200 (bf16, B=4, H=32,
    N=1K and 4K; results/flash_attention_tune_h200.json): 64x64 tiles win up to N=1K and for causal
    D=64, where more, smaller programs fill the SMs; the TMA versions hold fewer registers and take
    128x128 tiles, except the persistent v4, for which 128x128 ran out of shared memory, and v2 at D=128
    causal from HOST_DESC_MIN_N to HOST_DESC_SMALL_TILES_BELOW keys, 64x64 (measured with host descriptors, as
    the default runs it there; an explicit v2 with in-kernel descriptors gets them too). Warp
    specialization is only correct with the tiles it was checked with: with (128, 64, 4 warps,
    3 stages) it returned NaNs. fp32 tiles are twice the bytes, so they keep
    smaller pipelines that fit in shared memory (and only v1 was measured in fp32).
    """
    if interpreted:
        return 16, 16, 1, 1
    if dtype == torch.float32:
        return (128, 64, 4, 3) if D <= 64 else (128, 64, 8, 1) if D <= 128 else (64, 32, 8, 1)
    if D > 128:
        return 64, 32, 8, 1
    if impl in WS_IMPLS:
        return 128, 128, 4, 2
    if impl == "v4":
        return (128, 64, 4, 3) if D <= 64 else (128, 64, 8, 3)
    if impl == "v2" and D == 128 and causal and HOST_DESC_MIN_N <= n < HOST_DESC_SMALL_TILES_BELOW:
        return 64, 64, 4, 3
    if impl == "v2":
        return (128, 128, 4, 3) if D <= 64 else (128, 128, 8, 3)
    if n <= 1024 or (D <= 64 and causal):
        return 64, 64, 4, 3
    if D <= 64:
        return 128, 64, 4, 3
    return (128, 64, 8, 3) if causal else (128, 128, 8, 3)


def fwd_plan(D: int, dtype, causal: bool, nq: int, nk: int, interpreted: bool = INTERPRETED,
             need_lse: bool = True) -> tuple[str, int]:
    """(version, programs per SM) the forward runs by default, from the same H200 sweep.

    v5, the persistent warp-specialized version, only where it was measured and checked: D=128,
    non-causal, query and key lengths multiples of 128 (warp specialization returned NaNs with other
    tiles, and causal it failed to compile with 4 warps and was slower than v1 with 8). Training and
    ``return_lse`` get it only while the LSE goes through the descriptor store (WS_LSE_STORE = 2):
    through pointers, Triton 3.6 drops that store under warp specialization
    (results/forward_repeats_lse_h200.json, ws_lse_h200.json). D<=64 non-causal past N=1K: v2, TMA.
    D=128 causal from HOST_DESC_MIN_N queries and keys (multiples of 128): v2 with host descriptors
    (``host_descriptors_pay``), and from SPLIT_MIN_N the two-launch v6. Everything else: v1. fp32 and the
    interpreter: v1.
    """
    if interpreted or dtype == torch.float32 or D > 128:
        return "v1", 1
    if D == 128 and not causal and nq % 128 == 0 and nk % 128 == 0 and (not need_lse or WS_LSE_STORE == 2):
        return "v5", 1
    if D <= 64 and not causal and nk > 1024:
        return "v2", 1
    if _causal_128_grid(D, causal, nq, nk) and min(nq, nk) >= SPLIT_MIN_N and WS_LSE_STORE == 2:
        return "v6", 1
    if host_descriptors_pay("v2", D, causal, nq, nk):
        return "v2", 1
    return "v1", 1


# Where the forward makes its TMA descriptors on the host by default (TMA_HOST_DESCRIPTORS aside): v2 at D=128,
# causal, from HOST_DESC_MIN_N queries and keys (measured with Nq = Nk only: a short query block over a long cache
# keeps v1), both lengths multiples of 128. At 4K, on the H200 and with 128 x 128 tiles, host
# descriptors made v2 6% faster and put it 3% ahead of v1 (results/flash_attention_tune_hostdesc128_h200.json);
# with the descriptors built in the kernel v2 ran behind v1, so a call the host path cannot take runs v1. At 1K and
# 2K, on 64 x 64 tiles, v2 with host descriptors ran 5.2 / 6.0% ahead of v1 from CUDA graphs
# (results/flash_attention_tune_oneloop_h200.json) and 5.3-6.8% eagerly in two runs
# (results/flash_attention_tune_hostdesc_short_e1_h200.json, _e2_); below 1K it was not measured. Training calls
# (which need the LSE) took the path only from 2K for a while: a host-descriptor call then kept no launch plan and went
# through Triton's descriptor wrapper, and the short training step, bound by the host, ran 16% slower eagerly at 1K
# (results/flash_attention_hostlse_1024_h200.json against _4096_); plans alone did not help (_hostplan_1024_ against
# _2048_). With launch.Bound encoding the descriptors once per address, the 1K step took 0.486 ms against 0.489 with
# v1 eagerly and 0.478 against 0.484 from CUDA graphs (_hostraw_1024_ against _2048_, two processes); in one process
# over 5 rounds (4 from graphs; results/flash_attention_step_study_h200.json) the step took 1.1% less time than with v1
# at 1K from graphs and 2.2-2.5% less at 2K (after the capture fix, every round captured: 1.4%, and 2.6-3.2%;
# _step_study_kernels48_), while eagerly at 1K it was host-bound and its rounds spread past any difference;
# inference ran 5.5-7.6% faster than v1 at 1K and 2K, eagerly and from graphs (_hostraw_inference_). So one
# threshold again, for every call.
HOST_DESC_MIN_N = 1024
# ... and its tiles there: 64 x 64 (4 warps, 3 stages) below this many keys, 128 x 128 (8 warps) from it. Side by
# side in one process, 64 x 64 ran 1.6 / 4.1% faster from CUDA graphs and 2.9% eagerly at 4K, tied at 8K (-0.2 to
# +1.1%), and at 16K tied from graphs (-0.3 / +0.4%) but lost 11.8% eagerly
# (results/flash_attention_hostdesc_tiles_h200.json; 4K and 16K first in _tune_hostdesc_tiles_h200.json).
# (_blocks gives v2 these tiles there with descriptors built in the kernel too, which was not measured.) That was 8K
# while the diagonal ran in a second loop. With it behind a branch in one loop (CAUSAL_DIAG_BRANCH), 128 x 128 tiles
# ran 1.6 / 5.2% (eager / graphs) faster at 2K than the two-loop 64 x 64 default, and 1.5 / 5.4% at 4K, medians of 7
# rounds (results/flash_attention_diag_branch128_h200.json), where 64 x 64 with the branch ran +0.4 / +0.4% at 4K
# (_diag_branch2_): so 128 x 128 from 2K. (The spread of those rounds is wide: -7.0 to +15.0%.)
HOST_DESC_SMALL_TILES_BELOW = 2048
# The causal forward's order (_causal_order): heads are taken in groups of about this many programs (whole heads,
# at least one), each group heaviest tile first. A group that spans the grid would order it globally, but then
# every head's K and V are read at once and L2 holds fewer of them; one head at a time (1 here) leaves the grid's
# end on whole heads of mixed tiles, SMs idle behind the largest. 512: about two waves of two programs per SM on 132.
CAUSAL_GROUP_PROGRAMS = 512


def causal_group_heads(num_m: int, bh: int) -> int:
    """Heads per group of the causal order: about CAUSAL_GROUP_PROGRAMS programs, within [1, bh]."""
    return max(1, min(bh, -(-CAUSAL_GROUP_PROGRAMS // num_m)))


def _causal_128_grid(D: int, causal: bool, nq: int, nk: int) -> bool:
    """Where the causal D=128 defaults past v1 were measured: both lengths multiples of 128."""
    return D == 128 and causal and nq % 128 == 0 and nk % 128 == 0


def host_descriptors_pay(impl: str, D: int, causal: bool, nq: int, nk: int) -> bool:
    return impl == "v2" and _causal_128_grid(D, causal, nq, nk) and min(nq, nk) >= HOST_DESC_MIN_N


# How the warp-specialized forwards (v3, v5) store the log-sum-exp (``_fwd_tile_tma``'s LSE_STORE). Through
# pointers (0), with the row offsets of the key loop or (1) recomputed after it, Triton 3.6 drops the store
# under warp specialization; through a 1-D tensor descriptor (2) it is written (results/ws_lse_h200.json:
# 0 of 16 calls wrong, against 16 of 16 for 0 and 1). With 0 here, fwd_plan never gives v5 to a call that
# needs the LSE, and an explicit v3/v5 there runs v2/v4.
WS_LSE_STORE = 2
# The TMA versions' descriptors: made once per call on the host (over the flattened tensors) where the tensors are
# contiguous and the tiles divide the lengths, instead of four or five per tile in the kernel. True forces them for
# every TMA call; False (the default) makes them only where host_descriptors_pay grants them. A plan's replay
# rebases the first call's descriptors onto its own tensors (launch.bind's ``over``).
TMA_HOST_DESCRIPTORS = False
FWD_IMPLS = ("v1", "v2", "v3", "v4", "v5", "v6")  # v1 pointers; v2 TMA; v3 TMA + warp specialization;
# v4/v5 persistent; v6: v3 in two launches when causal
WS_IMPLS = ("v3", "v5", "v6")  # the warp-specialized versions
SPLIT_IMPLS = {"v6": "v3"}  # the two-launch causal version, and what it is non-causal
NO_WS = {"v3": "v2", "v5": "v4", "v6": "v2"}  # what runs when warp specialization cannot
# Where fwd_plan gives v6 (D=128, causal, both lengths multiples of 128): from this many queries and keys. Side by
# side from CUDA graphs (results/flash_attention_split_study_h200.json) v6 took 17.0 ms at 16K against 18.1 for
# the default before it (v2 with host descriptors), tied at 8K and lost at 4K, where its first launch alone took
# as long as the whole default call. That was 16K. v2 with the diagonal behind a branch (CAUSAL_DIAG_BRANCH) then ran
# 4.4 / 4.0% (eager / graphs) faster than v6 at 16K, every one of 5 rounds ahead
# (results/flash_attention_diag_branch16k_h200.json; with the other new defaults against the old ones in
# _ratio_study_kernels51_, +2.2 / +0.2%), so v6 starts past it; at 32K neither was measured.
SPLIT_MIN_N = 32768
# The causal v2 / v4 (no warp specialization) in one key loop: the tiles the diagonal crosses masked behind a branch
# inside it, so the pipeline that loads K and V runs on through the diagonal instead of draining before a second,
# masked loop. Compiled for sm_90 the one loop is pipelined as the first of the two was (140 registers and 112 KiB
# at 64 x 64: results/aot_resources_fwd_branch_sm90.txt). Beside the two loops and cuDNN in interleaved rounds
# (results/flash_attention_diag_branch_h200.json, _diag_branch2_), it gained most where one program fills an SM
# (128 x 128 tiles at 8K: +4.3 / +6.4% and +5.6 / +4.8% eager / graphs, every round ahead) and little where two
# programs share one and hide each other's drain (64 x 64 at 4K: +0.3 / -0.4% and +0.4 / +0.4%); +2.3 / +1.5% at
# 1K. False: the two loops.
CAUSAL_DIAG_BRANCH = True
# v6's second launch: (BLOCK_M, BLOCK_N, num_warps, num_stages). Its query tiles must divide the first launch's.
# The fastest of six settings at 4K and, within 1%, at 16K (results/flash_attention_split_study_h200.json): four
# warps on 64 x 64 tiles read the diagonal at close to HBM speed, where 128 x 128 with 8 warps spilled.
RESUME_CONFIG = (64, 64, 4, 2)
# v6's first launch writes O in float32 to a scratch buffer (True; twice O's bytes at 16 bits, for the call) or in
# O's own dtype into O (False; 3% faster at 16K): rounded
# to bf16 there, the partial O put v6 outside the tolerance rule at 1024 queries over 3072 keys
# (results/kernel_tests_kernels22.txt)
SPLIT_PARTIAL_FP32 = True
last_forward_impl = None  # the forward version the latest call ran (a TMA version can fall back to v1, see _forward)
_fwd_fallen_back: set = set()  # (impl, D, dtype, causal, tiles, even_n) whose compile failed once: they run v1


def _tma_ok(*tensors) -> bool:
    """In-kernel tensor descriptors need 16-byte aligned base pointers and row strides (and so do the
    per-(batch, head) bases the kernel adds to them); anything else runs the pointer version."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any(st <= 0 or st * size % 16 for st in t.stride()[:3]):
            return False  # (a broadcast dimension, stride 0, goes through pointer loads too)
    return True


def _torch_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """tl.make_tensor_descriptor writes its 128-byte descriptor to global scratch memory that Triton
    asks the host for through triton.set_allocator; hand it torch memory on the current device. The
    allocator lives in a context variable, so each thread (autograd runs the backward on its own)
    needs it set; one the caller set is left alone."""
    from triton.runtime._allocation import NullAllocator, _allocator

    if isinstance(_allocator.get(), NullAllocator):
        triton.set_allocator(_torch_scratch)


def _num_sms(device) -> int:
    return 4 if INTERPRETED else torch.cuda.get_device_properties(device).multi_processor_count


# Plans: what the host decided for one call (version, tiles, grid, fallbacks) and the bound launches that
# carried it out, kept per call key (every input's shape, strides, dtype and 16-byte alignment, the device,
# the options, and the globals the decisions read), so that a later call with the same key only allocates
# its outputs and calls the launchers (launch.Bound). Planned: calls with the fast path on, inputs whose
# last stride is 1, and no explicit config / programs_per_sm / lse_store (the benchmarks' sweeps); the
# first call of a key always runs the decisions. A replay repeats the tiles the first call chose even if a
# later call of another key has since changed a shared choice (_bwd_config_chosen, _fwd_fallen_back): both
# are correct, but not necessarily the same bits. At N=1K a training step was host-bound, and this Python
# ran on autograd's device thread (results/autograd_handoff_h200.json).
PLANS = True  # the switch (benchmarks turn it off to measure what plans save)
# The module settings the forward's decisions read (fwd_plan, host_descriptors_pay, _blocks, causal_group_heads and
# _forward itself). A forward plan is keyed by their values, so setting one (a benchmark's --fa-set, a test's
# monkeypatch) makes the next call of every shape decide again; a setting left out would replay stale plans
# (tests/test_kernels_flash_attention.py checks this list against the names those functions read).
PLAN_SETTINGS = ("WS_LSE_STORE", "TMA_HOST_DESCRIPTORS", "CAUSAL_GROUP_PROGRAMS", "HOST_DESC_MIN_N",
                 "HOST_DESC_SMALL_TILES_BELOW", "RESUME_CONFIG", "SPLIT_PARTIAL_FP32", "SPLIT_MIN_N",
                 "CAUSAL_DIAG_BRANCH")
_plans: dict = {}
MAX_PLANS = 1024  # past this many keys (varying shapes) the cache starts over


def _layout(*tensors) -> tuple:
    return tuple((t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0) for t in tensors)


def _remember(key, plan) -> None:
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    _plans[key] = plan


def clear_plans() -> None:
    """Forget every plan: the next call of each key decides again (tests that patch the decisions call it)."""
    _plans.clear()


class _Chain:
    """v6's two bound launches run as one: called with (q, k, v, o, lse), it makes the partial-O buffer (float32,
    or o itself) and runs both; ``compiled`` and ``constexprs`` are the first's, the ones ``last_forward_kernel``
    and ``last_forward_constexprs`` report."""
    __slots__ = ("first", "second", "compiled", "constexprs", "fp32")

    def __init__(self, first, second, fp32: bool):
        self.first, self.second, self.compiled, self.fp32 = first, second, first.compiled, fp32
        self.constexprs = first.constexprs

    def __call__(self, q, k, v, o, lse):
        part = torch.empty_like(o, dtype=torch.float32) if self.fp32 else o
        self.first(q, k, v, part, lse)
        self.second(q, k, v, o, lse, part)
        return self.compiled


def _forward(q, k, v, causal: bool, scale: float, config: tuple[int, int, int, int] | None = None,
             impl: str | None = None, programs_per_sm: int | None = None, need_lse: bool = True,
             lse_store: int | None = None):
    """Launch a forward version (FWD_IMPLS; None: ``fwd_plan``'s); ``config`` = (BLOCK_M, BLOCK_N,
    num_warps, num_stages) overrides ``_blocks``' table (benchmarks/flash_attention_tune.py sweeps it);
    ``programs_per_sm`` sizes the persistent grid of v4/v5. Returns (o, lse); lse is None when
    ``need_lse`` is False and a warp-specialized version ran with a pointer store, which it drops.

    A TMA version runs v1 instead when the tensors' rows are not 16-byte aligned (``_tma_ok``), and,
    with the default tiles, when Triton fails to compile it for the shape (its warp-specialization
    pass fails on some ragged shapes); causal calls of v3 / v5 run v2 / v4, and so do calls that need
    the log-sum-exp when it cannot go through the descriptor store (Nq % 4 != 0, or WS_LSE_STORE != 2:
    compiled with warp specialization, Triton 3.6 drops an LSE stored through pointers);
    ``last_forward_impl`` says what ran. An explicit ``config``
    is never replaced: its errors propagate (the tune sweep records them). ``lse_store`` picks how the
    TMA versions store the LSE (see WS_LSE_STORE, the default for v3/v5 when Nq % 4 == 0; 0, 1, 2 for
    benchmarks/check_ws_lse.py); a warp-specialized run with a pointer store (0, 1) hands back its LSE
    buffer only when ``lse_store`` was asked for, so that the check can see whether it was written.
    """
    global last_forward_kernel, last_forward_impl, last_forward_constexprs
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    plan_key = None
    if (PLANS and config is None and programs_per_sm is None and lse_store is None and fast_path_on()
            and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1):
        g = globals()
        plan_key = ("fwd", _layout(q, k, v), q.device, causal, scale, impl, need_lse, *[g[n] for n in PLAN_SETTINGS])
    o = torch.empty_like(q)
    lse = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    plan = _plans.get(plan_key) if plan_key is not None else None
    if plan is not None and (plan[0] == "v1" or o.data_ptr() % 16 == 0):  # (a TMA version needs o aligned too)
        ran, bound, keep_lse = plan  # a call seen before: the same launch, new tensors
        if ran != "v1" and not INTERPRETED:
            _ensure_allocator()
        last_forward_kernel, last_forward_impl = bound(q, k, v, o, lse), ran
        last_forward_constexprs = bound.constexprs
        return o, (lse if keep_lse else None)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        o = torch.empty_like(q)
    host_desc = TMA_HOST_DESCRIPTORS
    if impl is None:
        impl, per_sm = fwd_plan(D, q.dtype, causal, Nq, Nk, need_lse=need_lse)
        programs_per_sm = programs_per_sm or per_sm
        if config is None and host_descriptors_pay(impl, D, causal, Nq, Nk):
            host_desc = True  # (the host path needs contiguous tensors: else v1, below)
            if not all(t.is_contiguous() for t in (q, k, v)):
                impl = "v1"
    if impl not in FWD_IMPLS:
        raise ValueError(f"unknown forward impl {impl!r}; choose one of {FWD_IMPLS}")
    if impl != "v1" and not _tma_ok(q, k, v, o):
        impl = "v1"
    if not causal and impl in SPLIT_IMPLS:  # nothing to split: v6 is v3
        impl = SPLIT_IMPLS[impl]
    if causal and impl in ("v3", "v5"):  # causal warp specialization in one launch: wrong results or no compile
        impl = NO_WS[impl]
    asked = lse_store is not None
    if not asked:  # the descriptor store needs 16-byte aligned rows of the LSE: Nq % 4 == 0
        lse_store = WS_LSE_STORE if impl in WS_IMPLS and Nq % 4 == 0 else 0
    # a pointer store is dropped under warp specialization (see WS_LSE_STORE); v6 resumes from the LSE
    if lse_store != 2 and impl in WS_IMPLS and (need_lse or impl in SPLIT_IMPLS):
        impl = NO_WS[impl]
    block_d = max(16, next_power_of_2(D))
    args = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])

    def launch(impl, cfg):
        bm, bn, warps, stages = cfg
        n_m = cdiv(Nq, bm)
        group_heads = causal_group_heads(n_m, B * Hq) if causal else 1  # (non-causal: one specialization)
        common = dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
                      IEEE=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
        if impl == "v1":
            return bind(_fwd_kernel, (n_m, B * Hq), 5, q, k, v, o, lse, scale * LOG2E, Nq, Nk, Hq,
                        Hq // k.shape[1], group_heads, *args, PAD_D=block_d != D, **common)
        if not INTERPRETED:
            _ensure_allocator()
        persistent = impl in ("v4", "v5")
        tiles = n_m * B * Hq
        grid = (min(tiles, _num_sms(q.device) * (programs_per_sm or 1)),) if persistent else (n_m, B * Hq)
        descs = (None,) * 5  # (v6 warp-specializes, which Triton 3.6 does with in-kernel descriptors only)
        if (host_desc and impl not in SPLIT_IMPLS and all(t.is_contiguous() for t in (q, k, v, o))
                and Nq % bm == 0 and Nk % bn == 0):
            descs = (TensorDescriptor(q, [B * Hq * Nq, D], [D, 1], [bm, block_d]),
                     TensorDescriptor(k, [k.shape[0] * k.shape[1] * Nk, D], [D, 1], [bn, block_d]),
                     TensorDescriptor(v, [v.shape[0] * v.shape[1] * Nk, D], [D, 1], [bn, block_d]),
                     TensorDescriptor(o, [B * Hq * Nq, D], [D, 1], [bm, block_d]),
                     TensorDescriptor(lse, [B * Hq * Nq], [1], [bm]) if lse_store == 2 else None)
        more = dict(EVEN_N=Nk % bn == 0, WS=impl in WS_IMPLS, PERSISTENT=persistent, LSE_STORE=lse_store,
                    **common)
        if causal and CAUSAL_DIAG_BRANCH and impl in ("v2", "v4") and scale > 0:
            more["DIAG_BRANCH"] = True  # (it masks before scaling: -inf times a zero scale would be NaN)
        tail = (scale * LOG2E, Nq, Nk, Hq, Hq // k.shape[1], group_heads, n_m, tiles, *args, *descs)
        if impl in SPLIT_IMPLS:  # the unmasked tiles warp-specialized, then the diagonal resumed from O and LSE
            fp32 = SPLIT_PARTIAL_FP32 and o.dtype != torch.float32
            part = torch.empty_like(o, dtype=torch.float32) if fp32 else o
            if part.stride() != o.stride():
                raise RuntimeError("v6: the partial O must have O's strides")
            first = bind(_fwd_kernel_tma, grid, 5, q, k, v, part, lse, *tail, PART=1, **more)
            rm, rn, rw, rs = (min(bm, 16), min(bn, 16), 1, 1) if INTERPRETED else RESUME_CONFIG
            if bm % rm:
                rm = bm
            second = bind(_fwd_resume_kernel, (cdiv(Nq, rm), B * Hq), 6, q, k, v, o, lse, part, scale * LOG2E, Nq,
                          Nk, Hq, Hq // k.shape[1], *args, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=rm, BLOCK_N=rn,
                          FIRST_M=bm, FIRST_N=bn, PAD_D=block_d != D, IEEE=q.dtype == torch.float32,
                          num_warps=rw, num_stages=rs)
            return _Chain(first, second, fp32)
        # (host descriptor i is over tensor i of (q, k, v, o, lse): a replay rebases it onto that call's tensor)
        return bind(_fwd_kernel_tma, grid, 5, q, k, v, o, lse, *tail, over=tuple(i for i, d in enumerate(descs) if d is not None),
                    **more)

    cfg = config or _blocks(D, q.dtype, impl=impl, causal=causal, n=Nk)
    key = (impl, D, q.dtype, causal, cfg, Nk % cfg[1] == 0, lse_store, CAUSAL_DIAG_BRANCH)  # ragged: another loop
    if impl != "v1" and config is None and key in _fwd_fallen_back:
        impl, cfg = "v1", _blocks(D, q.dtype, causal=causal, n=Nk)
    try:
        bound = launch(impl, cfg)
    except Exception as e:  # noqa: BLE001  (only a compile failure of a TMA version with default tiles)
        from triton.runtime.errors import OutOfResources

        if config is not None or impl == "v1" or not (isinstance(e, OutOfResources) or "PassManager" in str(e)):
            raise
        _fwd_fallen_back.add(key)
        impl = "v1"
        bound = launch(impl, _blocks(D, q.dtype, causal=causal, n=Nk))
    last_forward_kernel, last_forward_impl, last_forward_constexprs = bound.compiled, impl, bound.constexprs
    keep_lse = not (impl in WS_IMPLS and lse_store != 2 and not asked)
    if plan_key is not None and o.data_ptr() % 16 == 0:  # (a misaligned o is not the key's usual case)
        _remember(plan_key, (impl, bound, keep_lse))
    return o, (lse if keep_lse else None)


@triton.jit
def _bwd_preprocess(O, DO, DELTA, Nq, H, sob, soh, son, sdb, sdh, sdn,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < Nq) & (dims[None, :] < HEAD_DIM)
    o = tl.load(O + b * sob + h * soh + rows[:, None] * son + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * Nq + rows, tl.sum(o * do, axis=1), mask=rows < Nq)


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, Nq, Nk, H, GROUP,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sgb, sgh, sgn,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    # One program per (key tile, batch x query head); dK/dV are per query head, summed over the group outside.
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    h = bh % H
    hk = h // GROUP
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    kv_mask = (cols[:, None] < Nk) & dmask[None, :]
    k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    offset = Nk - Nq
    lo = 0
    if CAUSAL:  # query rows above the diagonal of this key tile see none of it
        lo = tl.maximum(0, pid_n * BLOCK_N - offset)
        lo = (lo // BLOCK_M) * BLOCK_M
    for start in tl.range(lo, Nq, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        q_mask = (rows[:, None] < Nq) & dmask[None, :]
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dims[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=float("-inf"))
        delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        else:
            s = tl.dot(q, tl.trans(k)) * sm_scale
        valid = (cols[None, :] < Nk) & (rows[:, None] < Nq) & (lse[:, None] > float("-inf"))
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None] + offset)
        p = tl.where(valid, tl.exp(s - tl.where(lse > float("-inf"), lse, 0.0)[:, None]), 0.0)
        if IEEE:
            dv += tl.dot(tl.trans(p), do.to(tl.float32), input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        if IEEE:
            dk += tl.dot(tl.trans(ds), q.to(tl.float32), input_precision="ieee")
        else:
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    out = b * sgb + h * sgh + cols[:, None] * sgn + dims[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, Nq, Nk, H, GROUP,
                   sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, IEEE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    h = bh % H
    hk = h // GROUP
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    q_mask = (rows[:, None] < Nq) & dmask[None, :]
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dims[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=float("-inf"))
    delta = tl.load(DELTA + bh * Nq + rows, mask=rows < Nq, other=0.0)
    lse_safe = tl.where(lse > float("-inf"), lse, 0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offset = Nk - Nq
    hi = Nk
    if CAUSAL:
        hi = tl.minimum(Nk, (pid_m + 1) * BLOCK_M + offset)
    for start in tl.range(0, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < Nk) & dmask[None, :]
        k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + dims[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k)) * sm_scale
            dp = tl.dot(do, tl.trans(v))
        valid = (cols[None, :] < Nk) & (lse[:, None] > float("-inf"))
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None] + offset)
        p = tl.where(valid, tl.exp(s - lse_safe[:, None]), 0.0)
        ds = p * (dp - delta[:, None])
        if IEEE:
            dq += tl.dot(ds, k.to(tl.float32), input_precision="ieee")
        else:
            dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=q_mask)


def _backward_v1(q, k, v, o, lse, do, causal: bool, scale: float):
    """Backward v1: a dK/dV kernel per query head (fp32 buffers summed over the GQA group) and a dQ kernel."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    block_d = max(16, next_power_of_2(D))
    bm, bn = (16, 16) if INTERPRETED else (64, 64) if D <= 128 else (32, 32)
    ieee = q.dtype == torch.float32
    delta = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    fast_launch(_bwd_preprocess, (cdiv(Nq, bm), B * Hq), o, do, delta, Nq, Hq, *o.stride()[:3],
                *do.stride()[:3], HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm)
    dq = torch.empty_like(q)
    # dK/dV per query head (GQA sums them into the shared K/V head below)
    dk_h = torch.empty((B, Hq, Nk, D), device=q.device, dtype=torch.float32 if group > 1 else k.dtype)
    dv_h = torch.empty_like(dk_h)
    common = dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, IEEE=ieee,
                  num_warps=1 if INTERPRETED else 4)
    fast_launch(
        _bwd_dkdv_kernel, (cdiv(Nk, bn), B * Hq), q, k, v, do, lse, delta, dk_h, dv_h, scale, Nq, Nk, Hq, group,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *dk_h.stride()[:3], **common)
    fast_launch(
        _bwd_dq_kernel, (cdiv(Nq, bm), B * Hq), q, k, v, do, lse, delta, dq, scale, Nq, Nk, Hq, group,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], **common)
    if group > 1:
        dk = dk_h.view(B, Hkv, group, Nk, D).sum(2).to(k.dtype)
        dv = dv_h.view(B, Hkv, group, Nk, D).sum(2).to(v.dtype)
    else:
        dk, dv = dk_h, dv_h
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# Backward v2: the structure of Triton tutorial 06 and torch's flex_attention backward template.
#
# * One launch does all the work: programs [0, NUM_KV_TILES) of grid dim 0 own one key tile of one
#   KV head and accumulate its dK, dV over every query head of the GQA group (no fp32 per-query-head
#   buffers, no .sum afterwards); the programs after them own one query tile of one query head and
#   accumulate dQ.
# * The dK/dV side computes the transposed tiles directly, S^T = K Q^T, dP^T = V dO^T, from Q^T
#   loaded through transposed pointers, so the register tensors are never transposed (dV += P^T dO
#   and dK += dS^T Q are then plain MMAs).
# * The preprocess step stores the LSE in log2 units (and +inf for a row that sees no key, which
#   makes its P exactly 0 with no special case), so P = exp2(S * scale * log2(e) - lse2): one FMA
#   and one exp2 per score. (The factor rides in that FMA rather than in a pre-scaled K, as tutorial
#   06 does it: the same instruction count, without rounding K * scale back to 16 bits.)
# * Only tiles that cross the causal diagonal or hang over the end of the sequence build masks;
#   the interior tiles run unmasked, as in the forward. A ragged key tile needs no score mask on
#   the dK/dV side (its extra columns are never stored) and one on the dQ side (where they would
#   be summed into dQ).
# ---------------------------------------------------------------------------------------------

@triton.jit
def _bwd_preprocess_v2(O, DO, LSE, DELTA, LSE2, Nq, H, sob, soh, son, sdb, sdh, sdn,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(O * dO); lse2 = lse * log2(e), with +inf for a row that sees no key."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < Nq) & (dims[None, :] < HEAD_DIM)
    o = tl.load(O + b * sob + h * soh + rows[:, None] * son + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dims[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * Nq + rows, tl.sum(o * do, axis=1), mask=rows < Nq)
    lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=0.0)
    tl.store(LSE2 + bh * Nq + rows, tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634),
             mask=rows < Nq)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, lo, hi, Nq, offset,
                    sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASK_CAUSAL: tl.constexpr, CHECK_ROWS: tl.constexpr,
                    PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr, DQ_ATOMIC: tl.constexpr,
                    WS: tl.constexpr = False, LSE_DESC: tl.constexpr = False):
    """Query tiles [lo, hi) of each of the GROUP query heads against one key tile: dV += P^T dO, dK += dS^T Q
    (unscaled). One flat loop over (head, tile): a loop over heads around the tile loop spilled registers.
    With TMA, q_src and do_src are (GROUP, Nq, D) descriptors (rows past Nq read as zeros); otherwise
    pointers to the group's first head. LSE_DESC: lse2_base and delta_base are (GROUP, Nq) descriptors too,
    so that every load of the loop is a TMA copy; WS warp-specializes the loop (backward v6).

    DQ_ATOMIC (backward v5) also adds this key tile's share of dQ, sm_scale * dS K, into a float32
    buffer: 1 by pointer atomics (dq_src points at the group's first head), 2 by TMA reductions
    (dq_src a (GROUP, Nq, D) descriptor). The tiles are visited starting ``shift`` tiles in, so that the
    programs of one head, which all add into the same dQ rows, start on different rows."""
    dmask = dims < HEAD_DIM
    n_tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M  # >= 0: hi > lo - BLOCK_M in every call
    for it in tl.range(0, n_tiles * GROUP, warp_specialize=WS):
        g = it // n_tiles
        t = it - g * n_tiles
        if DQ_ATOMIC > 0:
            t = (t + shift) % n_tiles
        r0 = lo + t * BLOCK_M
        rows = r0 + tl.arange(0, BLOCK_M)
        in_q = rows < Nq
        if TMA:
            qt = tl.reshape(q_src.load([g, r0, 0]), [BLOCK_M, BLOCK_D]).T
        else:
            qt = _load_tile(q_src + g * sqh + rows[None, :] * sqn + dims[:, None], in_q[None, :], dmask[:, None],
                            CHECK_ROWS, PAD_D)  # Q^T tile, (BLOCK_D, BLOCK_M)
        if LSE_DESC:
            lse2 = tl.reshape(lse2_base.load([g, r0]), [BLOCK_M])
            delta = tl.reshape(delta_base.load([g, r0]), [BLOCK_M])
        elif CHECK_ROWS:
            lse2 = tl.load(lse2_base + g * Nq + rows, mask=in_q, other=float("inf"))
            delta = tl.load(delta_base + g * Nq + rows, mask=in_q, other=0.0)
        else:
            lse2 = tl.load(lse2_base + g * Nq + rows)
            delta = tl.load(delta_base + g * Nq + rows)
        st = _mma(k, qt, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), IEEE)  # S^T, (BLOCK_N, BLOCK_M)
        pt = tl.exp2(st * qk_scale - lse2[None, :])
        if MASK_CAUSAL:
            pt = tl.where(cols[:, None] <= rows[None, :] + offset, pt, 0.0)
        if TMA:
            do = tl.reshape(do_src.load([g, r0, 0]), [BLOCK_M, BLOCK_D])
        else:
            do = _load_tile(do_src + g * sdh + rows[:, None] * sdn + dims[None, :], in_q[:, None], dmask[None, :],
                            CHECK_ROWS, PAD_D)  # (BLOCK_M, BLOCK_D)
        dv = _mma(pt.to(do.dtype), do, dv, IEEE)
        dpt = _mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), IEEE)  # dP^T
        dst = pt * (dpt - delta[None, :])
        dk = _mma(dst.to(qt.dtype), tl.trans(qt), dk, IEEE)
        if DQ_ATOMIC > 0:
            dq = _mma(tl.trans(dst.to(k.dtype)), k, tl.zeros([BLOCK_M, BLOCK_D], tl.float32), IEEE) * sm_scale
            if DQ_ATOMIC == 2:
                dq_src.atomic_add([g, r0, 0], tl.reshape(dq, [1, BLOCK_M, BLOCK_D]))
            else:
                tl.atomic_add(dq_src + g * sdqh + rows[:, None] * sdqn + dims[None, :], dq,
                              mask=in_q[:, None] & dmask[None, :], sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, rows, dims, lo, hi, Nk, offset, skn, svn, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr):
    """Key tiles [lo, hi) against one query tile: dQ += dS K (unscaled). With TMA, k_src and v_src are
    (Nk, D) descriptors; otherwise pointers."""
    dmask = dims < HEAD_DIM
    for start in tl.range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_k = cols < Nk
        if TMA:
            kt = k_src.load([start, 0]).T
            vt = v_src.load([start, 0]).T
        else:
            kt = _load_tile(k_src + cols[None, :] * skn + dims[:, None], in_k[None, :], dmask[:, None], MASKED,
                            PAD_D)
            vt = _load_tile(v_src + cols[None, :] * svn + dims[:, None], in_k[None, :], dmask[:, None], MASKED,
                            PAD_D)
        s = _mma(q, kt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
        p = tl.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            valid = in_k[None, :]
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + offset)
            p = tl.where(valid, p, 0.0)
        dp = _mma(do, vt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
        ds = p * (dp - delta[:, None])
        dq = _mma(ds.to(kt.dtype), tl.trans(kt), dq, IEEE)
    return dq


@triton.jit
def _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                   sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                   DQ, sdqb, sdqh, sdqn,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr,
                   DQ_ATOMIC: tl.constexpr, ROTATE: tl.constexpr, ONE_LOOP: tl.constexpr = False):
    """dK, dV of key tile pid of KV head hk, summed over the GROUP query heads that share it; with
    DQ_ATOMIC, also this tile's share of dQ, added into DQ (float32, zeroed by the caller).

    ONE_LOOP (backward v6; needs TMA and Nq a multiple of BLOCK_M1): one warp-specialized loop over every
    query tile the key tile meets, the causal mask applied to each of them, instead of three loops (the
    diagonal band, the unmasked interior, the ragged last tile): Triton 3.6 warp-specializes a kernel of
    one loop on sm_90, and fails to compile one with several (results/aot_resources_bwd_v6_sm90.txt)."""
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    offset = Nk - Nq  # bottom-right alignment: query i sees keys j <= i + offset
    n0 = pid * BLOCK_N1
    cols = n0 + tl.arange(0, BLOCK_N1)
    kv_mask = (cols[:, None] < Nk) & dmask[None, :]
    if TMA:  # straight to shared memory, where the MMAs read them: no registers held for K and V
        k = tl.make_tensor_descriptor(K + b * skb + hk * skh, shape=[Nk, HEAD_DIM], strides=[skn, 1],
                                      block_shape=[BLOCK_N1, BLOCK_D]).load([n0, 0])
        v = tl.make_tensor_descriptor(V + b * svb + hk * svh, shape=[Nk, HEAD_DIM], strides=[svn, 1],
                                      block_shape=[BLOCK_N1, BLOCK_D]).load([n0, 0])
    else:
        k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + dims[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N1, BLOCK_D], tl.float32)
    full_q = (Nq // BLOCK_M1) * BLOCK_M1  # query tiles below this need no row mask
    lo = 0
    mid = 0
    if CAUSAL:
        # rows >= n0 - offset see the tile's first key; rows >= n0 + BLOCK_N1 - 1 - offset see all of it
        lo = (tl.maximum(n0 - offset, 0) // BLOCK_M1) * BLOCK_M1
        mid = tl.minimum(tl.cdiv(tl.maximum(n0 + BLOCK_N1 - 1 - offset, 0), BLOCK_M1) * BLOCK_M1, Nq)
    tail = full_q  # the ragged last query tile, unless the diagonal band already covered it
    if CAUSAL:
        tail = tl.maximum(mid, full_q)
    h0 = hk * GROUP  # the group's first query head; the inner loops step through all GROUP of them
    if TMA:
        q_src = tl.make_tensor_descriptor(Q + b * sqb + h0 * sqh, shape=[GROUP, Nq, HEAD_DIM], strides=[sqh, sqn, 1],
                                          block_shape=[1, BLOCK_M1, BLOCK_D])
        do_src = tl.make_tensor_descriptor(DO + b * sdb + h0 * sdh, shape=[GROUP, Nq, HEAD_DIM],
                                           strides=[sdh, sdn, 1], block_shape=[1, BLOCK_M1, BLOCK_D])
    else:
        q_src = Q + b * sqb + h0 * sqh
        do_src = DO + b * sdb + h0 * sdh
    lse2_base = LSE2 + (b * Hq + h0) * Nq
    delta_base = DELTA + (b * Hq + h0) * Nq
    if DQ_ATOMIC == 2:
        dq_src = tl.make_tensor_descriptor(DQ + b * sdqb + h0 * sdqh, shape=[GROUP, Nq, HEAD_DIM],
                                           strides=[sdqh, sdqn, 1], block_shape=[1, BLOCK_M1, BLOCK_D])
    else:
        dq_src = DQ + b * sdqb + h0 * sdqh
    shift = pid if ROTATE else 0
    if ONE_LOOP:
        lse2_src = tl.make_tensor_descriptor(lse2_base, shape=[GROUP, Nq], strides=[Nq, 1], block_shape=[1, BLOCK_M1])
        delta_src = tl.make_tensor_descriptor(delta_base, shape=[GROUP, Nq], strides=[Nq, 1],
                                              block_shape=[1, BLOCK_M1])
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_src, delta_src, cols, dims, lo, Nq,
                                 Nq, offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                                 HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, False, PAD_D, IEEE, TMA, DQ_ATOMIC,
                                 WS=True, LSE_DESC=True)
    else:
        dk, dv = _bwd_dkdv_loops(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, lo, mid, full_q,
                                 tail, Nq, offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale,
                                 shift, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, PAD_D, IEEE, TMA, DQ_ATOMIC)
    tl.store(DK + b * sdkb + hk * sdkh + cols[:, None] * sdkn + dims[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * sdvb + hk * sdvh + cols[:, None] * sdvn + dims[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _bwd_dkdv_loops(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, lo, mid, full_q, tail, Nq, offset,
                    sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                    CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr,
                    DQ_ATOMIC: tl.constexpr):
    """v2-v5's three loops over the query tiles of one key tile: the diagonal band (causal), the unmasked
    interior, the ragged last tile."""
    if CAUSAL:  # the diagonal band: causal mask and row mask
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, lo, mid,
                                 Nq, offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                                 HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, True, True, PAD_D, IEEE, TMA, DQ_ATOMIC)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, mid, full_q,
                             Nq, offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                             HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, False, False, PAD_D, IEEE, TMA, DQ_ATOMIC)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, tail, Nq,
                             Nq, offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, dq_src, sdqh, sdqn, sm_scale, shift,
                             HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, False, True, PAD_D, IEEE, TMA, DQ_ATOMIC)
    return dk, dv


@triton.jit
def _bwd_dq_tile(j, b, hk, Q, K, V, DO, LSE2, DELTA, DQ, sm_scale, qk_scale, Nq, Nk, Hq, GROUP, NUM_Q_TILES,
                 sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdqb, sdqh, sdqn,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
                 CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr):
    """dQ of query tile j % NUM_Q_TILES of query head j // NUM_Q_TILES of KV head hk's group."""
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    offset = Nk - Nq
    g = j // NUM_Q_TILES
    pid_m = j % NUM_Q_TILES
    if CAUSAL:  # the last query tiles see the most keys: start them first
        pid_m = NUM_Q_TILES - 1 - pid_m
    h = hk * GROUP + g
    bh = b * Hq + h
    rows = pid_m * BLOCK_M2 + tl.arange(0, BLOCK_M2)
    in_q = rows < Nq
    q_mask = in_q[:, None] & dmask[None, :]
    if TMA:
        m0 = pid_m * BLOCK_M2
        q = tl.make_tensor_descriptor(Q + b * sqb + h * sqh, shape=[Nq, HEAD_DIM], strides=[sqn, 1],
                                      block_shape=[BLOCK_M2, BLOCK_D]).load([m0, 0])
        do = tl.make_tensor_descriptor(DO + b * sdb + h * sdh, shape=[Nq, HEAD_DIM], strides=[sdn, 1],
                                       block_shape=[BLOCK_M2, BLOCK_D]).load([m0, 0])
    else:
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dims[None, :], mask=q_mask, other=0.0)
    lse2 = tl.load(LSE2 + bh * Nq + rows, mask=in_q, other=float("inf"))
    delta = tl.load(DELTA + bh * Nq + rows, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_M2, BLOCK_D], tl.float32)
    full, hi = _key_range(pid_m * BLOCK_M2, Nk, offset, BLOCK_M2, BLOCK_N2, CAUSAL)
    if TMA:
        k_src = tl.make_tensor_descriptor(K + b * skb + hk * skh, shape=[Nk, HEAD_DIM], strides=[skn, 1],
                                          block_shape=[BLOCK_N2, BLOCK_D])
        v_src = tl.make_tensor_descriptor(V + b * svb + hk * svh, shape=[Nk, HEAD_DIM], strides=[svn, 1],
                                          block_shape=[BLOCK_N2, BLOCK_D])
    else:
        k_src = K + b * skb + hk * skh
        v_src = V + b * svb + hk * svh
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, rows, dims, 0, full, Nk, offset, skn, svn,
                       qk_scale, HEAD_DIM, BLOCK_M2, BLOCK_N2, False, CAUSAL, PAD_D, IEEE, TMA)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_src, v_src, rows, dims, full, hi, Nk, offset, skn, svn,
                       qk_scale, HEAD_DIM, BLOCK_M2, BLOCK_N2, True, CAUSAL, PAD_D, IEEE, TMA)
    tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqn + dims[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=q_mask)


@triton.jit
def _bwd_kernel_v2(Q, K, V, DO, LSE2, DELTA, DQ, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, Hkv, GROUP,
                   NUM_KV_TILES, NUM_Q_TILES,
                   sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                   sdqb, sdqh, sdqn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                   IEEE: tl.constexpr, TMA: tl.constexpr, SIDE: tl.constexpr, DQ_ATOMIC: tl.constexpr = 0,
                   ROTATE: tl.constexpr = False, ONE_LOOP: tl.constexpr = False):
    """SIDE 0: one launch, programs [0, NUM_KV_TILES) do dK/dV and the rest dQ; SIDE 1 / 2: a launch
    that compiles only the dK/dV side / only the dQ side (each then gets its own warps and stages);
    SIDE 1 with DQ_ATOMIC: the dK/dV side adds dQ by atomics and there is no dQ side (v5); SIDE 1 with
    ONE_LOOP: the dK/dV side in one warp-specialized loop (v6)."""
    pid = tl.program_id(0)
    bhk = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    hk = bhk % Hkv
    if SIDE == 1:
        _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                       sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                       DQ, sdqb, sdqh, sdqn, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, PAD_D, IEEE, TMA,
                       DQ_ATOMIC, ROTATE, ONE_LOOP)
    elif SIDE == 2:
        _bwd_dq_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DQ, sm_scale, qk_scale, Nq, Nk, Hq, GROUP, NUM_Q_TILES,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdqb, sdqh, sdqn,
                     HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, PAD_D, IEEE, TMA)
    else:
        if pid < NUM_KV_TILES:
            _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                           sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn,
                           sdvb, sdvh, sdvn, DQ, sdqb, sdqh, sdqn, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL,
                           PAD_D, IEEE, TMA, 0, False)
        else:
            _bwd_dq_tile(pid - NUM_KV_TILES, b, hk, Q, K, V, DO, LSE2, DELTA, DQ, sm_scale, qk_scale, Nq, Nk, Hq,
                         GROUP, NUM_Q_TILES, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                         sdqb, sdqh, sdqn, HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, PAD_D, IEEE, TMA)


def _bwd_blocks(D: int, dtype, interpreted: bool = INTERPRETED, impl: str = "v2") -> tuple[int, ...]:
    """(BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages) for backward v2-v5, plus the dQ
    launch's (num_warps, num_stages) for v4, or whether the query tiles' order is rotated per program
    for v5 (which has no dQ side: its M2, N2 are unused).

    M1 x N1 is the dK/dV side's (query, key) tile, M2 x N2 the dQ side's. The 16-bit rows up to
    D=128 start from flex_attention's sm90 defaults and are the winners of the sweeps on the H200
    (results/flash_attention_bwd_h200.json, bf16, N=4096); at D=64 small tiles with 4 warps win, most
    of all when the two sides are launched apart (v4), and in one launch (v2, v3) 32 x 64 / 64 x 32
    with 4 warps took 12-19% less time than flex's 8-warp tile at N=4K and 16-21% less at N=1K
    (results/flash_attention_bwd_sweep_h200.json, flash_attention_bwd_n1k_h200.json). fp32 tiles are
    twice the bytes, so they get smaller tiles and no pipelining.
    """
    if interpreted:
        return 16, 16, 16, 16, 1, 1
    if dtype == torch.float32:
        return (32, 64, 64, 32, 4, 1) if D <= 128 else (16, 32, 32, 16, 4, 1)
    if impl == "v5":  # (M1, N1, -, -, warps, stages, rotate): one side; FA3's 64 x 128 tile to start from
        return (64, 128, 64, 128, 8, 2, 1) if D <= 128 else (32, 64, 32, 64, 8, 1, 1)
    if impl == "v6" and D <= 128:  # (M1, N1, M2, N2, warps, stages, dQ warps, stages): the dK/dV side's 4 warps become a
        # producer and two consumer warp groups (12 warps) that compile without spilling at 64 x 128 and 2 stages
        # (results/aot_resources_bwd_v6_sm90.txt); the dQ launch as v4's. Not timed yet: a starting point
        return (64, 128, 128, 64, 4, 2, 8, 3) if D > 64 else (64, 128, 64, 64, 4, 2, 4, 3)
    if D <= 64 and impl == "v4":
        return 32, 64, 64, 64, 4, 3, 4, 3
    if D <= 64:  # v2, v3
        return 32, 64, 64, 32, 4, 3
    if D <= 128:
        return 64, 128, 128, 64, 8, 3
    return 32, 64, 64, 32, 8, 1


def bwd_plan(D: int, dtype, causal: bool = False, n: int = 4096, interpreted: bool = INTERPRETED) -> str:
    """The backward version run by default, from the H200 runs (bf16, B=4, H=32): v4 (TMA, two
    launches) at D<=64 and v3 (TMA, one launch) at D<=128, where they won at N=4K. Over at most 1K
    queries v2 (pointer loads, one launch): causal at D=128 fwd+bwd took 0.61 ms with it against 0.75
    ms with v3 (results/flash_attention_n1k_recheck_h200.json and its _kernels3_ predecessor); at
    D<=64, with its 4-warp tile, the backward alone took 0.20 ms causal and 0.30 ms non-causal against
    v4's 0.25 and 0.36 (results/flash_attention_bwd_n1k_h200.json); non-causal at D=128 the step
    replayed from a CUDA graph took 0.69 ms against v3's 0.73 (flash_attention_n1k_graphs_h200.json).
    v5 (dQ by atomics) lost to v3/v4 at every measured point (results/flash_attention_bwd_v5_h200.json)
    and is never the default. fp32, D>128 and the interpreter, where TMA was not measured, run v2 too."""
    if interpreted or dtype == torch.float32 or D > 128 or n <= 1024:
        return "v2"
    return "v4" if D <= 64 else "v3"


# Smaller configs tried in order when a table entry does not fit the GPU (OutOfResources: shared memory
# or registers); the first that launches is remembered per (head dim, dtype) and recorded below.
_BWD_FALLBACKS = ((64, 64, 64, 64, 4, 2), (32, 64, 64, 32, 4, 1), (16, 32, 32, 16, 4, 1))
_bwd_config_chosen: dict = {}
_tma_reduce_failed: set = set()  # (head dim, dtype) whose TMA reduction of dQ failed to compile once
_one_loop_failed: set = set()  # (head dim, dtype, causal) whose warp-specialized dK/dV loop (v6) failed to compile
last_backward_config = None  # the (M1, N1, M2, N2, warps, stages) backward v2 last ran with
last_backward_path = None  # ("tma" or "pointers", "split" or "one launch"[, how v5 added dQ / v6's one loop]) of the latest v2-v6 call


class _OneLoopFailed(Exception):
    """v6's warp-specialized dK/dV launch failed to compile or launch (not for lack of memory)."""


def _backward_v2(q, k, v, o, lse, do, causal: bool, scale: float, config=None, tma: bool = False,
                 split: bool = False, dq_atomic: bool = False, one_loop: bool = False):
    """One preprocess launch and one backward launch (``split``: two, one per side, each compiled alone).
    ``tma`` loads the streamed tiles (Q, dO on the dK/dV side; K, V on the dQ side) through tensor
    descriptors. ``dq_atomic`` (v5): the dK/dV side alone, adding each tile's share of dQ into a
    zeroed float32 buffer (by TMA reductions when ``tma`` holds on a GPU, else by pointer atomics),
    cast to dQ's dtype at the end; the order of those float32 additions varies from run to run, so
    dQ is not bit-reproducible. ``one_loop`` (v6, with ``tma`` and ``split``): the dK/dV launch runs one
    warp-specialized loop (``_bwd_dkdv_tile``'s ONE_LOOP) where the query length is a multiple of its query
    tile and the dtype 16-bit (in the interpreter any dtype), else v4's three loops with v4's tiles; a Triton
    that cannot compile it also gets v4's, remembered per (head dim, dtype, causal) (with an explicit
    ``config`` the error propagates instead). ``config`` = _bwd_blocks' tuple,
    plus (num_warps, num_stages) of the dQ launch when split, overrides the table (and then an
    OutOfResources error propagates: the tune sweep records it)."""
    global last_backward_kernel, last_backward_config, last_backward_path
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    group = Hq // Hkv
    plan_key = plan = None
    if PLANS and config is None and fast_path_on() and all(t.stride(-1) == 1 for t in (q, k, v, o, do)):
        plan_key = ("bwd", _layout(q, k, v, o, do, lse), q.device, causal, scale, tma, split, dq_atomic, one_loop)
        plan = _plans.get(plan_key)
    if plan is None:
        q, k, v, o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, o, do))
        tma = tma and _tma_ok(q, k, v, do)
    else:
        tma = plan[3][0] == "tma"  # what the first call of the key found
    if tma and not INTERPRETED:
        _ensure_allocator()
    delta = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
    lse2 = torch.empty_like(delta)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32) if dq_atomic else torch.empty_like(q)
    if plan is not None:  # a call seen before: the same launches, new tensors
        pre, mains, last_backward_config, last_backward_path = plan
        pre(o, do, lse, delta, lse2)
        last_backward_kernel = [bound(q, k, v, do, lse2, delta, dq, dk, dv) for bound in mains][0]
        return (dq.to(q.dtype) if dq_atomic else dq), dk, dv
    block_d = max(16, next_power_of_2(D))
    pre_m = 16 if INTERPRETED else 64
    pre = bind(_bwd_preprocess_v2, (cdiv(Nq, pre_m), B * Hq), 5, o, do, lse, delta, lse2, Nq, Hq,
               *o.stride()[:3], *do.stride()[:3], HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=pre_m)
    # v5 adds dQ into float32 by atomics; a TMA reduction that fails to compile falls back to pointer atomics
    reduce = 0 if not dq_atomic else 2 if tma and not INTERPRETED and (D, q.dtype) not in _tma_reduce_failed else 1
    # v6's one warp-specialized dK/dV loop: TMA, two launches, and a dtype and Triton that were seen to compile it
    one_loop = (one_loop and tma and split and not dq_atomic and (D, q.dtype, causal) not in _one_loop_failed
                and (INTERPRETED or q.dtype in (torch.float16, torch.bfloat16)))
    if one_loop:  # whole query tiles only (no row masks in the one loop); else v4's loops, tiles and key
        m1 = (config or _bwd_config_chosen.get((D, q.dtype, tma, split, dq_atomic, True),
                                               _bwd_blocks(D, q.dtype, impl="v6")))[0]
        one_loop = Nq % m1 == 0

    def runs_one_loop(cfg) -> bool:  # a fallback candidate's query tile may not divide Nq: that one runs v4's loops
        return one_loop and Nq % cfg[0] == 0

    from triton.runtime.errors import OutOfResources

    def launch(cfg):
        m1, n1, m2, n2, warps, stages = cfg[:6]
        n_kv, n_q = cdiv(Nk, n1), cdiv(Nq, m2)
        args = (q, k, v, do, lse2, delta, dq, dk, dv, scale, scale * LOG2E, Nq, Nk, Hq, Hkv, group, n_kv, n_q,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
                *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3])
        common = dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2,
                      CAUSAL=causal, PAD_D=block_d != D, IEEE=q.dtype == torch.float32, TMA=tma)
        if dq_atomic:
            rotate = bool(cfg[6]) if len(cfg) >= 7 else True
            return [bind(_bwd_kernel_v2, (n_kv, B * Hkv), 9, *args, SIDE=1, DQ_ATOMIC=reduce, ROTATE=rotate,
                         num_warps=warps, num_stages=stages, **common)]
        if not split:
            return [bind(_bwd_kernel_v2, (n_kv + n_q * group, B * Hkv), 9, *args, SIDE=0, num_warps=warps,
                         num_stages=stages, **common)]
        warps2, stages2 = cfg[6:8] if len(cfg) >= 8 else (warps, stages)
        ol = {"ONE_LOOP": True} if runs_one_loop(cfg) else {}  # every query tile whole: no row masks
        try:
            side1 = bind(_bwd_kernel_v2, (n_kv, B * Hkv), 9, *args, SIDE=1, num_warps=warps, num_stages=stages,
                         **ol, **common)
        except OutOfResources:
            raise
        except Exception as e:  # noqa: BLE001
            if ol and not isinstance(e, getattr(torch, "OutOfMemoryError", MemoryError)):
                raise _OneLoopFailed(f"{type(e).__name__}: {e}") from e
            raise
        return [side1,
                bind(_bwd_kernel_v2, (n_q * group, B * Hkv), 9, *args, SIDE=2, num_warps=warps2, num_stages=stages2,
                     **common)]

    if config is not None:
        candidates = [tuple(config)]
    else:
        key = (D, q.dtype, tma, split, dq_atomic, one_loop)
        impl = "v5" if dq_atomic else "v6" if one_loop else "v4" if split else "v3" if tma else "v2"
        candidates = [_bwd_config_chosen.get(key, _bwd_blocks(D, q.dtype, impl=impl))]
        candidates += [c for c in _BWD_FALLBACKS if c != candidates[0]]
    for i, cfg in enumerate(candidates):
        try:
            mains = launch(cfg)
        except OutOfResources:
            if i == len(candidates) - 1:
                raise
            continue
        except _OneLoopFailed:  # v6's loop does not compile here: v4's loops (an explicit config: the error)
            if config is not None:
                raise
            _one_loop_failed.add((D, q.dtype, causal))
            return _backward_v2(q, k, v, o, lse, do, causal, scale, config, tma, split, dq_atomic, one_loop)
        except Exception:  # noqa: BLE001  (a TMA reduction that does not compile: pointer atomics instead)
            if reduce != 2:
                raise
            _tma_reduce_failed.add((D, q.dtype))
            return _backward_v2(q, k, v, o, lse, do, causal, scale, config, tma, split, dq_atomic, one_loop)
        if config is None:
            _bwd_config_chosen[key] = cfg
        last_backward_kernel, last_backward_config = mains[0].compiled, cfg
        last_backward_path = ("tma" if tma else "pointers", "split" if split else "one launch")
        if runs_one_loop(cfg):
            last_backward_path += ("one warp-specialized loop",)
        if dq_atomic:
            last_backward_path += ("tma reduce" if reduce == 2 else "pointer atomics",)
        if plan_key is not None:
            _remember(plan_key, (pre, mains, cfg, last_backward_path))
        return (dq.to(q.dtype) if dq_atomic else dq), dk, dv


# v1: per-query-head dK/dV buffers; v2: one launch, GQA in the kernel; v3: v2 with TMA tile loads;
# v4: v3 in two launches (dK/dV, then dQ), each side compiled alone with its own registers;
# v5: v3's dK/dV side alone, adding dQ by atomics (FA2/FA3's way): 5 matmuls per tile pair instead of 7;
# v6: v4 with the dK/dV side in one warp-specialized loop (a producer warp and two consumer warp groups)
BWD_IMPLS = ("v1", "v2", "v3", "v4", "v5", "v6")


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, impl: str | None = None):
    impl = impl or bwd_plan(q.shape[-1], q.dtype, causal, q.shape[2])
    if impl == "v1":
        return _backward_v1(q, k, v, o, lse, do, causal, scale)
    return _backward_v2(q, k, v, o, lse, do, causal, scale, tma=impl in ("v3", "v4", "v5", "v6"),
                        split=impl in ("v4", "v6"), dq_atomic=impl == "v5", one_loop=impl == "v6")


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, fwd_impl, bwd_impl):
        o, lse = _forward(q, k, v, causal, scale, impl=fwd_impl)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.bwd_impl = causal, scale, bwd_impl
        # backward has no term for a gradient of the lse: marked non-differentiable, it comes back with
        # requires_grad=False (a constant to autograd, as the indices of torch.max are), and no zero
        # gradient is materialized for it on every step
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.bwd_impl)
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
                    fwd_impl: str | None = None, bwd_impl: str | None = None):
    """softmax(q k^T * scale) v without materializing the scores; differentiable in q, k and v.

    ``fwd_impl`` / ``bwd_impl`` pick a version of the forward (FWD_IMPLS) and of the backward
    (BWD_IMPLS); None takes the measured defaults, ``fwd_plan`` and ``bwd_plan``. Every
    version computes the same function; the old ones stay so that the benchmarks can compare them
    in one process (chapter 6 lists what each one bought). The TMA versions need 16-byte aligned
    rows and run the pointer version otherwise.

    With ``return_lse`` the log-sum-exp comes back non-differentiable (``requires_grad=False``): the
    backward has no term for it, so autograd treats it as a constant.

    bfloat16 in Triton's interpreter (no CUDA) is upcast to float32 for the computation and the
    result cast back to bfloat16, because the interpreter computes bf16 ``tl.dot`` wrongly
    (triton #11584). Compiled on a GPU, bf16 runs natively.
    """
    check_inputs(q, k, v)
    if fwd_impl is not None and fwd_impl not in FWD_IMPLS:
        raise ValueError(f"unknown fwd_impl {fwd_impl!r}; choose one of {FWD_IMPLS}")
    if bwd_impl is not None and bwd_impl not in BWD_IMPLS:
        raise ValueError(f"unknown bwd_impl {bwd_impl!r}; choose one of {BWD_IMPLS}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:
        q, k, v = q.float(), k.float(), v.float()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o, lse = _FlashAttention.apply(q, k, v, bool(causal), scale, fwd_impl, bwd_impl)
    else:  # inference: no autograd node, whose host cost is not small next to a short kernel
        o, lse = _forward(q, k, v, bool(causal), scale, impl=fwd_impl, need_lse=return_lse)
    if INTERPRETED and o.dtype != out_dtype:
        o = o.to(out_dtype)
    return (o, lse) if return_lse else o
