"""The Hopper forward: the FlashAttention-2 loop of ``flash_attention._fwd_kernel``, fed by the tensor-memory
accelerator (TMA). One kernel; its features are constexprs, in the combinations ``flash_dispatch.fwd_plan`` picks
(v2, v5, v6):

* Q, K, V and O move through tensor descriptors: a tile load is one TMA copy from HBM straight to shared
  memory, issued by one thread. The descriptor knows the tensor's extent, so rows past the end read as zeros and
  stores past it are dropped: no load masks (the scores of a ragged last key tile are still masked). The
  descriptors are made per (batch, head) in the kernel, or once per call on the host over the flattened
  tensors (``Q_DESC``... not None: contiguous tensors whose lengths the tiles divide).
* DIAG_BRANCH (causal): one key loop, the tiles the diagonal crosses masked behind a branch inside it, so the K/V
  pipeline runs on through the diagonal instead of draining before a second, masked loop (+4.3-6.4% at 8K with
  128 x 128 tiles, flash_attention_diag_branch*_h200.json).
* PERSISTENT (v5): one program per SM loops over the tiles (non-causal: the tiles of one head together, so the
  programs running at once share its K and V in L2), its loop warp-specialized (WS): the compiler splits the
  program into a producer warp that only issues TMA loads and consumer warp groups that do the math.
* SPLIT (v6, causal): the first launch runs only the unmasked key tiles, in one warp-specialized loop (Triton
  3.6 failed to warp-specialize the causal kernel's two loops, triton#9728), and stores the partial O and LSE;
  ``_fwd_resume_kernel`` runs the masked diagonal from that state on smaller tiles.
* Warp-specialized programs store the LSE through a 1-D tensor descriptor: through pointers, Triton 3.6 drops
  the store under warp specialization (ws_lse_h200.json: 16 of 16 calls wrong, 0 of 16 through the descriptor).
"""
from __future__ import annotations

import torch
import triton.language as tl
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .common import (LOG2E, CachedLaunch, cdiv, causal_order, key_range, load_tile, mma, next_power_of_2, normalize,
                     softmax_step, use_torch_allocator)
from .flash_dispatch import FwdPlan


@triton.jit
def _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, lo, hi, Nk, offset, qk_scale, mask_from,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr,
                   WS: tl.constexpr, BRANCH: tl.constexpr = False):
    """Key tiles [lo, hi) against one query tile, K and V loaded through descriptors; ``kv_row`` is the first row
    of this (batch, KV head) in the descriptors' view (0 for per-head descriptors). BRANCH: the tiles from
    ``mask_from`` on are masked behind a branch."""
    for start in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start = tl.multiple_of(start, BLOCK_N)
        kt = k_desc.load([kv_row + start, 0]).T  # K^T tile, (BLOCK_D, BLOCK_N), a view of the shared-memory copy
        s = mma(q, kt, tl.zeros([q.shape[0], BLOCK_N], tl.float32), IEEE)
        if BRANCH:
            if start >= mask_from:  # the diagonal (and a ragged last tile): scores past it become -inf
                cols = start + tl.arange(0, BLOCK_N)
                s = tl.where((cols[None, :] < Nk) & (cols[None, :] <= rows[:, None] + offset), s, float("-inf"))
            p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, False, True)
        elif MASKED:
            cols = start + tl.arange(0, BLOCK_N)
            valid = cols[None, :] < Nk
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + offset)
            s = tl.where(valid, s * qk_scale, float("-inf"))
            p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, True, True)
        else:
            p, alpha, m_new, l = softmax_step(s, m, l, qk_scale, False, False)
        v = v_desc.load([kv_row + start, 0])
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], IEEE)
        m = m_new
    return acc, l, m


@triton.jit
def _fwd_tile(pid_m, bh, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
              sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, EVEN_N: tl.constexpr, IEEE: tl.constexpr, WS: tl.constexpr,
              LSE_DESC: tl.constexpr, SPLIT: tl.constexpr, DIAG_BRANCH: tl.constexpr):
    """One query tile of one (batch, head): descriptors, the key loop(s), the epilogue. SPLIT: the unmasked key
    tiles only (one loop); O and the LSE it stores are those of the keys seen so far. LSE_DESC: the LSE is stored
    through a 1-D descriptor."""
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
    full, hi = key_range(m0, Nk, offset, BLOCK_M, BLOCK_N, CAUSAL)
    if DIAG_BRANCH:  # one loop, the masked tiles behind a branch
        acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, 0, hi, Nk, offset, qk_scale, full,
                                   BLOCK_N, False, CAUSAL, IEEE, False, True)
    else:
        acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, 0, full, Nk, offset, qk_scale, 0,
                                   BLOCK_N, False, CAUSAL, IEEE, WS)
        if not SPLIT and (CAUSAL or not EVEN_N):  # a non-causal call with Nk % BLOCK_N == 0 compiles one loop only
            acc, l, m = _fwd_inner_tma(acc, l, m, q, k_desc, v_desc, kv_row, rows, full, hi, Nk, offset, qk_scale, 0,
                                       BLOCK_N, True, CAUSAL, IEEE, False)
    o, lse = normalize(acc, l, m)
    o_desc.store([q_row + m0, 0], o.to(O.dtype.element_ty))
    if LSE_DESC:
        lse_desc = tl.make_tensor_descriptor(LSE + bh * Nq, shape=[Nq], strides=[1], block_shape=[BLOCK_M])
        lse_desc.store([m0], lse)
    else:
        tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)


@triton.jit
def _fwd_kernel_tma(Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP, GROUP_HEADS, NUM_M_TILES, NUM_TILES,
                    sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, EVEN_N: tl.constexpr, IEEE: tl.constexpr, WS: tl.constexpr,
                    PERSISTENT: tl.constexpr, SPLIT: tl.constexpr, DIAG_BRANCH: tl.constexpr):
    if PERSISTENT:  # (non-causal) tile t: the tiles of one head together, sharing its K and V in L2
        for t in tl.range(tl.program_id(0), NUM_TILES, tl.num_programs(0), warp_specialize=WS):
            _fwd_tile(t % NUM_M_TILES, t // NUM_M_TILES, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
                      sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC,
                      HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, EVEN_N, IEEE, False, WS, SPLIT, DIAG_BRANCH)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        if CAUSAL:  # the last query tiles have the most keys: start them first
            pid_m, bh = causal_order(tl.num_programs(0), tl.num_programs(1), GROUP_HEADS)
        _fwd_tile(pid_m, bh, Q, K, V, O, LSE, qk_scale, Nq, Nk, H, GROUP,
                  sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son, Q_DESC, K_DESC, V_DESC, O_DESC,
                  HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, EVEN_N, IEEE, WS, WS, SPLIT, DIAG_BRANCH)


@triton.jit
def _fwd_resume_kernel(Q, K, V, O, LSE, OP, qk_scale, Nq, Nk, H, GROUP,
                       sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sob, soh, son,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       FIRST_M: tl.constexpr, FIRST_N: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr):
    """v6's second launch: the masked key tiles of each query tile (the diagonal), resumed from the partial O (OP,
    same strides as O) and the LSE the first launch stored for the unmasked tiles [0, full), ``full`` as the first
    launch's FIRST_M x FIRST_N tiles set it; this launch's BLOCK_M rows lie inside one of those tiles. (o, lse) is
    an online-softmax state of its own: with m = lse in log2 units and l = 1, acc = o satisfies acc / l = o and
    m + log2(l) = lse, so the loop goes on as if it had never stopped; a row that saw no key (lse = -inf) starts
    empty. Pointer loads: the diagonal is a few tiles per row."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    tile = (rows[:, None] < Nq) & dmask[None, :]
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :], mask=tile, other=0.0)
    offsets = b * sob + h * soh + rows[:, None] * son + dims[None, :]
    acc = tl.load(OP + offsets, mask=tile, other=0.0).to(tl.float32)
    lse = tl.load(LSE + bh * Nq + rows, mask=rows < Nq, other=float("-inf"))
    m = lse * 1.4426950408889634
    l = tl.where(lse == float("-inf"), 0.0, 1.0)
    offset = Nk - Nq
    full = key_range((m0 // FIRST_M) * FIRST_M, Nk, offset, FIRST_M, FIRST_N, True)[0]
    hi = key_range(m0, Nk, offset, BLOCK_M, BLOCK_N, True)[1]
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    for start in tl.range(full, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_k = cols < Nk
        kt = load_tile(k_base + cols[None, :] * skn + dims[:, None], in_k[None, :], dmask[:, None], True, PAD_D)
        s = mma(q, kt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
        s = tl.where(in_k[None, :] & (cols[None, :] <= rows[:, None] + offset), s * qk_scale, float("-inf"))
        p, alpha, m, l = softmax_step(s, m, l, qk_scale, True, True)
        vt = load_tile(v_base + cols[:, None] * svn + dims[None, :], in_k[:, None], dmask[None, :], True, PAD_D)
        acc = mma(p.to(vt.dtype), vt, acc * alpha[:, None], IEEE)
    o, lse = normalize(acc, l, m)
    tl.store(O + offsets, o.to(O.dtype.element_ty), mask=tile)
    tl.store(LSE + bh * Nq + rows, lse, mask=rows < Nq)


_launch_fwd, _launch_resume = CachedLaunch(_fwd_kernel_tma), CachedLaunch(_fwd_resume_kernel)


def bind(q, k, v, o, lse, causal: bool, scale: float, plan: FwdPlan, split_partial_fp32: bool = True):
    """Compile ``plan`` (a TMA version) for tensors like these (a contiguous last dim; o like q, lse (B, Hq, Nq)
    float32) and return (compiled kernel of the first launch, run): ``run(q, k, v, o, lse)`` launches it on tensors
    of these shapes, strides, dtypes and alignment."""
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    bm, bn, warps, stages = plan.tiles
    block_d = max(16, next_power_of_2(D))
    n_m = cdiv(Nq, bm)

    def descriptors(q, k, v, o):  # host descriptors, over the flattened (B * heads * N, D) tensors of each call
        if not plan.host_descriptors:
            return ()
        return (TensorDescriptor(q, [B * Hq * Nq, D], [D, 1], [bm, block_d]),
                TensorDescriptor(k, [k.shape[0] * k.shape[1] * Nk, D], [D, 1], [bn, block_d]),
                TensorDescriptor(v, [v.shape[0] * v.shape[1] * Nk, D], [D, 1], [bn, block_d]),
                TensorDescriptor(o, [B * Hq * Nq, D], [D, 1], [bm, block_d]))

    def partial(o):  # v6's partial O, in float32
        return torch.empty_like(o, dtype=torch.float32) if fp32_partial else o
    use_torch_allocator()
    fp32_partial = plan.split and split_partial_fp32 and o.dtype != torch.float32
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3])
    ieee = q.dtype == torch.float32
    part = partial(o)
    compiled, first = _launch_fwd.bind(
        plan.grid, q, k, v, part, lse, scale * LOG2E, Nq, Nk, Hq, Hq // k.shape[1], plan.group_heads, n_m,
        n_m * B * Hq, *strides, *(descriptors(q, k, v, part) or (None,) * 4), HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm,
        BLOCK_N=bn, CAUSAL=causal, EVEN_N=Nk % bn == 0, IEEE=ieee, WS=plan.warp_specialized,
        PERSISTENT=plan.persistent, SPLIT=plan.split, DIAG_BRANCH=plan.diag_branch, num_warps=warps,
        num_stages=stages)
    resume = None
    if plan.split:
        rm, rn, rw, rs = plan.resume
        resume = _launch_resume.bind(
            (cdiv(Nq, rm), B * Hq), q, k, v, o, lse, part, scale * LOG2E, Nq, Nk, Hq, Hq // k.shape[1],
            *strides, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=rm, BLOCK_N=rn, FIRST_M=bm, FIRST_N=bn,
            PAD_D=block_d != D, IEEE=ieee, num_warps=rw, num_stages=rs)[1]

    def run(q, k, v, o, lse):
        use_torch_allocator()  # (a context variable: set on the thread that launches)
        part = partial(o)
        first(q, k, v, part, lse, *descriptors(q, k, v, part))
        if resume is not None:
            resume(q, k, v, o, lse, part)
    return compiled, run
