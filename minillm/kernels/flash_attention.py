"""FlashAttention in Triton: forward and backward, same contract as minillm.attention.flash_attention.

Layout (torch SDPA's): q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), Hq % Hkv == 0.
``causal=True`` is bottom-right aligned: query i sees keys j <= i + Nk - Nq.
Rows that see no key return zeros (and lse = -inf).

This module holds the teaching kernel, forward v1: one program per (query tile, batch x head),
FlashAttention-2 loop order, pointer loads:

    load Q_i once
    for each key tile j (stopping at the causal diagonal):
        S = Q_i K_j^T * scale            (registers, never HBM)
        m_new = max(m, rowmax(S)); alpha = exp(m - m_new)
        P = exp(S - m_new); l = l * alpha + rowsum(P)
        acc = acc * alpha + P V_j
    O_i = acc / l;  lse_i = m + log(l)

Exponentials use exp2 with log2(e) folded into the scale (one multiply fewer per score). GQA is an index map:
query head h reads K/V head h // (Hq / Hkv), so K and V are never repeated in memory. Head dims that are not
powers of two are padded to the next one inside the kernel with masked loads.

The rest lives beside it: ``flash_hopper`` (the forward fed by TMA, with its Hopper features), ``flash_backward``
(P recomputed from Q, K and the saved LSE; never stored), ``flash_dispatch`` (which version runs on which tiles:
the measured defaults, overridden by an explicit :class:`FlashConfig`), ``common`` (the pieces they share).
Earlier versions and the studies behind each choice are in the git tag ``archive/kernel-experiments``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..attention import check_attention_inputs
from . import INTERPRETED, check_placement, check_tensors
from . import flash_hopper
from .flash_backward import bind as bind_backward
from .common import LOG2E, CachedLaunch, Memo, last_dim_contiguous, next_power_of_2, num_sms, tma_aligned
from .common import causal_order as _causal_order
from .common import key_range as _key_range
from .common import load_tile as _load_tile
from .common import normalize as _normalize
from .flash_dispatch import DEFAULT, BwdPlan, FlashConfig, FwdPlan, bwd_plan, fwd_plan

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

__all__ = ["FlashConfig", "ForwardInfo", "BackwardInfo", "flash_attention", "flash_forward", "flash_backward"]


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


@dataclass(frozen=True)
class ForwardInfo:
    """What a forward call ran: its plan (version, tiles, grid...) and the compiled kernel of its (first) launch
    (``n_regs``, ``n_spills``, ``metadata.shared``; None in the interpreter)."""
    plan: FwdPlan
    kernel: object = None


@dataclass(frozen=True)
class BackwardInfo:
    """What a backward call ran: its plan, the tiles that launched (a fallback's where the plan's did not fit)
    and the compiled main kernel (the dK/dV side's for v4)."""
    plan: BwdPlan
    tiles: tuple
    kernel: object = None


_launch_fwd = CachedLaunch(_fwd_kernel)
# The host plans of the forward and backward calls, per (config, causal, scale, dtype, device, each tensor's shape,
# strides and 16-byte alignment): what a call decides and compiles from these alone, decided once. An eager call at
# 1K tokens is host-bound: what is left per call is allocation and the launches.
_fwd_plans, _bwd_plans = Memo(), Memo()


def _plan_key(config, causal, scale, *tensors):
    device = -1 if INTERPRETED else torch.cuda.current_device()  # (the compiled kernels load on the current one)
    return (None if config is DEFAULT else config, causal, scale, tensors[0].dtype, device,  # (DEFAULT: no hashing)
            *[(t.shape, t.stride(), t.data_ptr() % 16 == 0) for t in tensors])


def _bind_v1(q, k, v, o, lse, causal: bool, scale: float, plan: FwdPlan):
    B, Hq, Nq, D = q.shape
    block_d = max(16, next_power_of_2(D))
    bm, bn, warps, stages = plan.tiles
    return _launch_fwd.bind(plan.grid, q, k, v, o, lse, scale * LOG2E, Nq, k.shape[2], Hq, Hq // k.shape[1],
                            plan.group_heads, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                            HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, PAD_D=block_d != D,
                            IEEE=q.dtype == torch.float32, num_warps=warps, num_stages=stages)


def _plan_forward(q, k, v, o, lse, causal: bool, scale: float, config: FlashConfig):
    """(ForwardInfo, run(q, k, v, o, lse)) for tensors like these. A TMA version whose compile fails with the table's
    tiles (Triton's warp-specialization pass fails on some ragged shapes; OutOfResources on a smaller GPU) runs v1
    instead; explicit tiles (``config.fwd_tiles``) raise."""
    B, Hq, Nq, D = q.shape
    plan = fwd_plan(B, Hq, Nq, k.shape[2], D, q.dtype, causal, scale, config, sms=num_sms(q.device),
                    contiguous=all(t.is_contiguous() for t in (q, k, v)), aligned=tma_aligned(q, k, v, o))
    if plan.version != "v1":
        try:
            kernel, run = flash_hopper.bind(q, k, v, o, lse, causal, scale, plan, config.split_partial_fp32)
            return ForwardInfo(plan, kernel), run
        except Exception as e:  # noqa: BLE001  (only a compile failure of a TMA version with the table's tiles)
            if config.fwd_tiles is not None or not (isinstance(e, OutOfResources) or "PassManager" in str(e)):
                raise
            plan = fwd_plan(B, Hq, Nq, k.shape[2], D, q.dtype, causal, scale, FlashConfig(fwd="v1"))
    kernel, run = _bind_v1(q, k, v, o, lse, causal, scale, plan)
    return ForwardInfo(plan, kernel), run


def _forward(q, k, v, causal: bool, scale: float, config: FlashConfig = DEFAULT):
    """(o, lse, ForwardInfo) for checked inputs, through the shapes' plan."""
    q, k, v = last_dim_contiguous(q, k, v)
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    key = _plan_key(config, causal, scale, q, k, v)  # (o and lse are new: aligned, their layout q's)
    info, run = _fwd_plans.get(key) or _fwd_plans.put(key, _plan_forward(q, k, v, o, lse, causal, scale, config))
    run(q, k, v, o, lse)
    return o, lse, info


def _plan_backward(q, k, v, o, lse, do, causal: bool, scale: float, config: FlashConfig):
    """(BackwardInfo, run(q, k, v, o, lse, do) -> (dq, dk, dv)) for tensors like these."""
    B, Hq, Nq, D = q.shape
    plan = bwd_plan(B, Hq, k.shape[1], Nq, k.shape[2], D, q.dtype, causal, config, aligned=tma_aligned(q, k, v, do))
    tiles, kernel, run = bind_backward(q, k, v, o, lse, do, causal, scale, plan, fallback=config.bwd_tiles is None)
    return BackwardInfo(plan, tiles, kernel), run


def _backward(q, k, v, o, lse, do, causal: bool, scale: float, config: FlashConfig = DEFAULT):
    q, k, v, o, do = last_dim_contiguous(q, k, v, o, do)
    key = _plan_key(config, causal, scale, q, k, v, o, lse, do)
    info, run = _bwd_plans.get(key) or _bwd_plans.put(key, _plan_backward(q, k, v, o, lse, do, causal, scale, config))
    return (*run(q, k, v, o, lse, do), info)


def _scale(q, scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def flash_forward(q, k, v, causal: bool = False, scale: float | None = None, config: FlashConfig = DEFAULT):
    """The forward alone, no autograd: (o, lse, ForwardInfo). For benchmarks and tests that read what ran."""
    check_inputs(q, k, v)
    return _forward(q, k, v, bool(causal), _scale(q, scale), config)


def flash_backward(q, k, v, o, lse, do, causal: bool = False, scale: float | None = None,
                   config: FlashConfig = DEFAULT):
    """The backward alone: (dq, dk, dv, BackwardInfo) from a forward's o and lse."""
    check_inputs(q, k, v)
    return _backward(q, k, v, o, lse, do, bool(causal), _scale(q, scale), config)


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, config):
        o, lse, _ = _forward(q, k, v, causal, scale, config)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.config = causal, scale, config
        # backward has no term for a gradient of the lse: marked non-differentiable, it comes back with
        # requires_grad=False (a constant to autograd, as the indices of torch.max are), and no zero
        # gradient is materialized for it on every step
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv, _ = _backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, ctx.config)
        return dq, dk, dv, None, None, None


def flash_attention(q, k, v, causal: bool = False, scale: float | None = None, return_lse: bool = False,
                    config: FlashConfig | None = None):
    """softmax(q k^T * scale) v without materializing the scores; differentiable in q, k and v.

    ``config`` (a :class:`FlashConfig`) overrides the measured defaults (``flash_dispatch``): a version, tiles,
    thresholds. Every version computes the same function; the TMA versions need 16-byte aligned rows and run the
    pointer version otherwise.

    With ``return_lse`` the log-sum-exp comes back non-differentiable (``requires_grad=False``): the
    backward has no term for it, so autograd treats it as a constant.

    bfloat16 in Triton's interpreter (no CUDA) is upcast to float32 for the computation and the
    result cast back to bfloat16, because the interpreter computes bf16 ``tl.dot`` wrongly
    (triton #11584). Compiled on a GPU, bf16 runs natively.
    """
    check_inputs(q, k, v)
    config = DEFAULT if config is None else config
    scale = _scale(q, scale)
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:
        q, k, v = q.float(), k.float(), v.float()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        o, lse = _FlashAttention.apply(q, k, v, bool(causal), scale, config)
    else:  # inference: no autograd node, whose host cost is not small next to a short kernel
        o, lse, _ = _forward(q, k, v, bool(causal), scale, config)
    if INTERPRETED and o.dtype != out_dtype:
        o = o.to(out_dtype)
    return (o, lse) if return_lse else o
