"""The flash-attention backward: P recomputed from Q, K and the saved LSE (never stored), the structure of Triton
tutorial 06 and torch's flex_attention backward template. Versions (``flash_dispatch.bwd_plan`` picks):

* v2: one launch does all the work: programs [0, NUM_KV_TILES) of grid dim 0 own one key tile of one KV head and
  accumulate its dK, dV over every query head of the GQA group (no per-query-head buffers, no sum afterwards);
  the programs after them own one query tile of one query head and accumulate dQ. Pointer loads.
* v3: v2 with the streamed tiles (Q, dO on the dK/dV side; K, V on the dQ side) loaded through tensor
  descriptors (TMA);
* v4: v3 in two launches, one per side, each compiled alone with its own registers, warps and stages.

The dK/dV side computes the transposed tiles directly, S^T = K Q^T, dP^T = V dO^T, from Q^T loaded through
transposed pointers, so no register tensor is transposed (dV += P^T dO and dK += dS^T Q are plain MMAs). The
preprocess stores the LSE in log2 units (+inf for a row that sees no key, which makes its P exactly 0), so
P = exp2(S * scale * log2(e) - lse2): one FMA and one exp2 per score. Only tiles that cross the causal diagonal
or hang over the end of the sequence build masks; a ragged key tile needs no score mask on the dK/dV side (its
extra columns are never stored) and one on the dQ side (where they would be summed into dQ).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .common import LOG2E, CachedLaunch, cdiv, key_range, load_tile, mma, next_power_of_2, use_torch_allocator
from .flash_dispatch import BWD_FALLBACK_TILES, BwdPlan


@triton.jit
def _bwd_preprocess(O, DO, LSE, DELTA, LSE2, Nq, H, sob, soh, son, sdb, sdh, sdn,
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
                    sqh, sqn, sdh, sdn, GROUP, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    MASK_CAUSAL: tl.constexpr, CHECK_ROWS: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr,
                    TMA: tl.constexpr):
    """Query tiles [lo, hi) of each of the GROUP query heads against one key tile: dV += P^T dO, dK += dS^T Q
    (unscaled). One flat loop over (head, tile): a loop over heads around the tile loop spilled registers.
    With TMA, q_src and do_src are (GROUP, Nq, D) descriptors (rows past Nq read as zeros); otherwise pointers
    to the group's first head."""
    dmask = dims < HEAD_DIM
    n_tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M  # >= 0: hi > lo - BLOCK_M in every call
    for it in tl.range(0, n_tiles * GROUP):
        g = it // n_tiles
        t = it - g * n_tiles
        r0 = lo + t * BLOCK_M
        rows = r0 + tl.arange(0, BLOCK_M)
        in_q = rows < Nq
        if TMA:
            qt = tl.reshape(q_src.load([g, r0, 0]), [BLOCK_M, BLOCK_D]).T
        else:
            qt = load_tile(q_src + g * sqh + rows[None, :] * sqn + dims[:, None], in_q[None, :], dmask[:, None],
                           CHECK_ROWS, PAD_D)  # Q^T tile, (BLOCK_D, BLOCK_M)
        if CHECK_ROWS:
            lse2 = tl.load(lse2_base + g * Nq + rows, mask=in_q, other=float("inf"))
            delta = tl.load(delta_base + g * Nq + rows, mask=in_q, other=0.0)
        else:
            lse2 = tl.load(lse2_base + g * Nq + rows)
            delta = tl.load(delta_base + g * Nq + rows)
        st = mma(k, qt, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), IEEE)  # S^T, (BLOCK_N, BLOCK_M)
        pt = tl.exp2(st * qk_scale - lse2[None, :])
        if MASK_CAUSAL:
            pt = tl.where(cols[:, None] <= rows[None, :] + offset, pt, 0.0)
        if TMA:
            do = tl.reshape(do_src.load([g, r0, 0]), [BLOCK_M, BLOCK_D])
        else:
            do = load_tile(do_src + g * sdh + rows[:, None] * sdn + dims[None, :], in_q[:, None], dmask[None, :],
                           CHECK_ROWS, PAD_D)  # (BLOCK_M, BLOCK_D)
        dv = mma(pt.to(do.dtype), do, dv, IEEE)
        dpt = mma(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), IEEE)  # dP^T
        dst = pt * (dpt - delta[None, :])
        dk = mma(dst.to(qt.dtype), tl.trans(qt), dk, IEEE)
    return dk, dv


@triton.jit
def _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                   sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                   CAUSAL: tl.constexpr, PAD_D: tl.constexpr, IEEE: tl.constexpr, TMA: tl.constexpr):
    """dK, dV of key tile pid of KV head hk, summed over the GROUP query heads that share it, in three loops over
    the query tiles: the diagonal band (causal mask and row mask), the unmasked interior, the ragged last tile."""
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
    if CAUSAL:  # the diagonal band: causal mask and row mask
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, lo, mid, Nq,
                                 offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1,
                                 True, True, PAD_D, IEEE, TMA)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, mid, full_q, Nq,
                             offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1,
                             False, False, PAD_D, IEEE, TMA)
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_src, do_src, lse2_base, delta_base, cols, dims, tail, Nq, Nq,
                             offset, sqh, sqn, sdh, sdn, GROUP, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1,
                             False, True, PAD_D, IEEE, TMA)
    tl.store(DK + b * sdkb + hk * sdkh + cols[:, None] * sdkn + dims[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * sdvb + hk * sdvh + cols[:, None] * sdvn + dims[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_mask)


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
            kt = load_tile(k_src + cols[None, :] * skn + dims[:, None], in_k[None, :], dmask[:, None], MASKED,
                            PAD_D)
            vt = load_tile(v_src + cols[None, :] * svn + dims[:, None], in_k[None, :], dmask[:, None], MASKED,
                            PAD_D)
        s = mma(q, kt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
        p = tl.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            valid = in_k[None, :]
            if CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + offset)
            p = tl.where(valid, p, 0.0)
        dp = mma(do, vt, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), IEEE)
        ds = p * (dp - delta[:, None])
        dq = mma(ds.to(kt.dtype), tl.trans(kt), dq, IEEE)
    return dq


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
    full, hi = key_range(pid_m * BLOCK_M2, Nk, offset, BLOCK_M2, BLOCK_N2, CAUSAL)
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
def _bwd_kernel(Q, K, V, DO, LSE2, DELTA, DQ, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, Hkv, GROUP,
                NUM_KV_TILES, NUM_Q_TILES,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                sdqb, sdqh, sdqn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr, CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
                IEEE: tl.constexpr, TMA: tl.constexpr, SIDE: tl.constexpr):
    """SIDE 0: one launch, programs [0, NUM_KV_TILES) do dK/dV and the rest dQ; SIDE 1 / 2: a launch that
    compiles only the dK/dV side / only the dQ side (v4)."""
    pid = tl.program_id(0)
    bhk = tl.program_id(1)
    b = (bhk // Hkv).to(tl.int64)  # offsets pass 2^31 in tensors over 2 G elements
    hk = bhk % Hkv
    if SIDE == 1:
        _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                       sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn,
                       HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, PAD_D, IEEE, TMA)
    elif SIDE == 2:
        _bwd_dq_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DQ, sm_scale, qk_scale, Nq, Nk, Hq, GROUP, NUM_Q_TILES,
                     sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdqb, sdqh, sdqn,
                     HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, PAD_D, IEEE, TMA)
    else:
        if pid < NUM_KV_TILES:
            _bwd_dkdv_tile(pid, b, hk, Q, K, V, DO, LSE2, DELTA, DK, DV, sm_scale, qk_scale, Nq, Nk, Hq, GROUP,
                           sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, sdkb, sdkh, sdkn,
                           sdvb, sdvh, sdvn, HEAD_DIM, BLOCK_D, BLOCK_M1, BLOCK_N1, CAUSAL, PAD_D, IEEE, TMA)
        else:
            _bwd_dq_tile(pid - NUM_KV_TILES, b, hk, Q, K, V, DO, LSE2, DELTA, DQ, sm_scale, qk_scale, Nq, Nk, Hq,
                         GROUP, NUM_Q_TILES, sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn,
                         sdqb, sdqh, sdqn, HEAD_DIM, BLOCK_D, BLOCK_M2, BLOCK_N2, CAUSAL, PAD_D, IEEE, TMA)


_launch_pre, _launch_bwd = CachedLaunch(_bwd_preprocess), CachedLaunch(_bwd_kernel)


def bind(q, k, v, o, lse, do, causal: bool, scale: float, plan: BwdPlan, fallback: bool = True):
    """Compile ``plan`` for tensors like these (a contiguous last dim) and return (tiles, compiled main kernel, run):
    ``run(q, k, v, o, lse, do)`` -> (dq, dk, dv) launches it on tensors of these shapes, strides, dtypes and
    alignment. With ``fallback``, tiles that do not fit the GPU (OutOfResources) are replaced by the first of
    BWD_FALLBACK_TILES that compiles; ``tiles`` are those that did."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    block_d = max(16, next_power_of_2(D))

    def outputs(q, k, v):  # (the plan keeps no tensor of this call)
        delta = torch.empty((B, Hq, Nq), device=q.device, dtype=torch.float32)
        return delta, torch.empty_like(delta), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if plan.tma:
        use_torch_allocator()
    delta, lse2, dq, dk, dv = outputs(q, k, v)
    _, pre = _launch_pre.bind(plan.grids[0], o, do, lse, delta, lse2, Nq, Hq, *o.stride()[:3], *do.stride()[:3],
                              HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=plan.pre_block_m)
    candidates = [plan.tiles] + ([t for t in BWD_FALLBACK_TILES if t != plan.tiles] if fallback else [])
    for i, tiles in enumerate(candidates):
        m1, n1, m2, n2, warps, stages = tiles[:6]
        n_kv, n_q = cdiv(Nk, n1), cdiv(Nq, m2)
        args = (q, k, v, do, lse2, delta, dq, dk, dv, scale, scale * LOG2E, Nq, Nk, Hq, Hkv, Hq // Hkv, n_kv, n_q,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3],
                *dq.stride()[:3], *dk.stride()[:3], *dv.stride()[:3])
        common = dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_M2=m2, BLOCK_N2=n2,
                      CAUSAL=causal, PAD_D=block_d != D, IEEE=q.dtype == torch.float32, TMA=plan.tma)
        try:
            if not plan.split:
                compiled, main = _launch_bwd.bind((n_kv + n_q * (Hq // Hkv), B * Hkv), *args, SIDE=0,
                                                  num_warps=warps, num_stages=stages, **common)
                mains = (main,)
            else:
                warps2, stages2 = tiles[6:8] if len(tiles) >= 8 else (warps, stages)
                compiled, main = _launch_bwd.bind((n_kv, B * Hkv), *args, SIDE=1, num_warps=warps,
                                                  num_stages=stages, **common)
                mains = (main, _launch_bwd.bind((n_q * (Hq // Hkv), B * Hkv), *args, SIDE=2, num_warps=warps2,
                                                num_stages=stages2, **common)[1])
        except OutOfResources:
            if i == len(candidates) - 1:
                raise
            continue
        break

    def run(q, k, v, o, lse, do):
        if plan.tma:  # (the allocator is a context variable: autograd runs the backward on a thread of its own)
            use_torch_allocator()
        delta, lse2, dq, dk, dv = outputs(q, k, v)
        pre(o, do, lse, delta, lse2)
        for main in mains:
            main(q, k, v, do, lse2, delta, dq, dk, dv)
        return dq, dk, dv
    return tuple(tiles), compiled, run
