"""The decode step's elementwise work in three Triton kernels (chapter 8).

At batch 1 a decode step of the 1B model reads 2.5 GB of weights in a handful of matrix-vector products, and
around them runs a long tail of tiny elementwise operations: RMSNorm in float32 is six kernels (cast, square,
mean, rsqrt, two multiplies), RoPE on q and k another dozen, the K/V writes, SiLU and its product, the residual
adds. Each moves a few kilobytes and costs a launch's worth of GPU time even replayed from a CUDA graph. Fused:

* :func:`rms_norm` ``(x, w, eps, residual=None)``: ``s = x + residual`` (rounded to x's dtype, as torch adds),
  then ``(s / rms(s)).to(dtype) * w`` with the sum of squares in float32: one program per row, one read of the
  row, so a row's bits do not depend on the other rows (chapter 11's ``rmsnorm_bi`` is this kernel). Returns
  ``h`` or ``(h, s)``;
* :func:`rope_kv_write` ``(qkv, cos, sin, slot_mapping, k_cache, v_cache, n_heads, n_kv_heads)``: the fused QKV
  projection's rows (T, (H + 2 Hkv) D) in, RoPE ("rotate half", ``minillm.model.apply_rope``) on the q and k
  heads, k and v stored into the paged caches at their slots, q returned (T, H, D);
* :func:`silu_mul` ``(gate_up)``: ``silu(gate) * up`` of the fused gate/up projection (T, 2F) -> (T, F).

Each rounds where the torch model's unfused ops round (every bf16 op rounds its result), so the fused and unfused
steps agree to the last bit except for the order of RMSNorm's sum. References: ``minillm.torch_model``'s
``rms_norm``, ``rotate_half`` and ``F.silu(gate) * up`` (tests compare them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRETED, check_placement, check_tensors
from .common import cdiv, next_power_of_2

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check(**named) -> None:
    check_tensors(**named)
    for name, t in named.items():
        if t.is_floating_point() and t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {t.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(**named)


# ---- RMSNorm, with the residual add before it ----------------------------------------------------------------
@triton.jit
def _rms_norm_kernel(X, R, W, Y, S, D, sx, sr, sy, ss, eps, BLOCK_D: tl.constexpr, RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x = tl.load(X + row * sx + cols, mask=ok, other=0.0)
    if RESIDUAL:  # the sum rounded to x's dtype first, as `x + r` rounds in torch
        x = (x.to(tl.float32) + tl.load(R + row * sr + cols, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(S + row * ss + cols, x, mask=ok)
    x = x.to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)   # the whole row in one reduction of a fixed shape
    y = (x * r).to(Y.dtype.element_ty).to(tl.float32)  # rounded to x's dtype, then times w: the model's rms_norm
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * sy + cols, (y * w).to(Y.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim of x (..., D) with weight w (D,), after adding ``residual`` (x's shape) if given:
    ``h`` without a residual, ``(h, x + residual)`` with one."""
    check = dict(x=x, w=w) if residual is None else dict(x=x, w=w, residual=residual)
    _check(**check)
    D = x.shape[-1]
    if w.shape != (D,):
        raise ValueError(f"w must be ({D},), got {tuple(w.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
                         f"{residual.dtype}")
    x2 = x.reshape(-1, D)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    w = w.to(x.dtype).contiguous()
    out = torch.empty((x2.shape[0], D), device=x.device, dtype=x.dtype)
    r2 = s = out
    if residual is not None:
        r2 = residual.reshape(-1, D)
        r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
        s = torch.empty_like(out)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, r2, w, out, s, D, x2.stride(0), r2.stride(0), out.stride(0),
                                         s.stride(0), float(eps), BLOCK_D=next_power_of_2(D),
                                         RESIDUAL=residual is not None, num_warps=1 if INTERPRETED else 4)
    h = out.reshape(x.shape)
    return h if residual is None else (h, s.reshape(x.shape))


# ---- RoPE on q and k, k and v into the paged caches ----------------------------------------------------------
@triton.jit
def _rope_kv_kernel(QKV, COS, SIN, SLOTS, Q, KC, VC, s_qkv, s_cs, s_q, s_slot, H, HKV,
                    HEAD_DIM: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)                  # [0, H): a q head; [H, H + HKV): a k head; then a v head
    half = HEAD_DIM // 2
    i = tl.arange(0, HALF_PAD)
    ok = i < half
    src = QKV + t * s_qkv + h * HEAD_DIM
    lo = tl.load(src + i, mask=ok, other=0.0)
    hi = tl.load(src + half + i, mask=ok, other=0.0)
    dt = lo.dtype
    if h < H + HKV:                       # rotate half, each product and sum rounded as torch rounds them
        c = tl.load(COS + t * s_cs + i, mask=ok, other=0.0).to(dt).to(tl.float32)
        s = tl.load(SIN + t * s_cs + i, mask=ok, other=0.0).to(dt).to(tl.float32)
        a, b = lo.to(tl.float32), hi.to(tl.float32)
        lo_new = ((a * c).to(dt).to(tl.float32) - (b * s).to(dt).to(tl.float32)).to(dt)
        hi_new = ((b * c).to(dt).to(tl.float32) + (a * s).to(dt).to(tl.float32)).to(dt)
        lo, hi = lo_new, hi_new
    if h < H:
        dst = Q + t * s_q + h * HEAD_DIM
        tl.store(dst + i, lo.to(Q.dtype.element_ty), mask=ok)
        tl.store(dst + half + i, hi.to(Q.dtype.element_ty), mask=ok)
    else:
        slot = tl.load(SLOTS + t).to(tl.int64)
        if h < H + HKV:
            dst = KC + slot * s_slot + (h - H) * HEAD_DIM
            tl.store(dst + i, lo.to(KC.dtype.element_ty), mask=ok)
            tl.store(dst + half + i, hi.to(KC.dtype.element_ty), mask=ok)
        else:
            dst = VC + slot * s_slot + (h - H - HKV) * HEAD_DIM
            tl.store(dst + i, lo.to(VC.dtype.element_ty), mask=ok)
            tl.store(dst + half + i, hi.to(VC.dtype.element_ty), mask=ok)


def rope_kv_write(qkv, cos, sin, slot_mapping, k_cache, v_cache, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """RoPE and the K/V cache write of one layer in one launch. qkv (T, (H + 2 Hkv) D): each token's q, k, v heads
    side by side (the fused projection's output); cos, sin (T, D/2) float32 tables of each token's position;
    slot_mapping (T,) the flat slot of each token in the caches (num_blocks, block_size, Hkv, D), contiguous.
    Writes the rotated k and the v of token t at slot_mapping[t]; returns the rotated q (T, H, D) in the
    caches' dtype. Slots are not checked against the pool (the runner's are valid by construction)."""
    _check(qkv=qkv, cos=cos, sin=sin, slot_mapping=slot_mapping, k_cache=k_cache, v_cache=v_cache)
    T = qkv.shape[0]
    H, Hkv = int(n_heads), int(n_kv_heads)
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must be one (num_blocks, block_size, Hkv, D) shape and dtype, got "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache and v_cache must be contiguous (a slot is Hkv * D elements)")
    D = k_cache.shape[-1]
    if k_cache.shape[2] != Hkv or D % 2:
        raise ValueError(f"caches have {k_cache.shape[2]} KV heads of dim {D}; expected {Hkv} heads of an even dim")
    if qkv.dim() != 2 or qkv.shape[1] != (H + 2 * Hkv) * D or qkv.stride(1) != 1:
        raise ValueError(f"qkv must be (T, {(H + 2 * Hkv) * D}) with a contiguous last dim, got {tuple(qkv.shape)}")
    if cos.shape != (T, D // 2) or sin.shape != (T, D // 2) or cos.dtype != torch.float32 \
            or sin.dtype != torch.float32:
        raise ValueError(f"cos and sin must be float32 ({T}, {D // 2}), got {tuple(cos.shape)} {cos.dtype}, "
                         f"{tuple(sin.shape)} {sin.dtype}")
    if slot_mapping.shape != (T,) or slot_mapping.is_floating_point():
        raise ValueError(f"slot_mapping must be integer ({T},), got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    cos, sin = cos.contiguous(), sin.contiguous()
    q = torch.empty((T, H, D), device=qkv.device, dtype=k_cache.dtype)
    if T:
        _rope_kv_kernel[(T, H + 2 * Hkv)](qkv, cos, sin, slot_mapping.contiguous(), q, k_cache, v_cache,
                                          qkv.stride(0), cos.stride(0), q.stride(0), Hkv * D, H, Hkv,
                                          HEAD_DIM=D, HALF_PAD=next_power_of_2(max(D // 2, 1)),
                                          num_warps=1)
    return q


# ---- SiLU(gate) * up -----------------------------------------------------------------------------------------
@triton.jit
def _silu_mul_kernel(GU, OUT, F, s_gu, s_out, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    g = tl.load(GU + t * s_gu + cols, mask=ok, other=0.0)
    u = tl.load(GU + t * s_gu + F + cols, mask=ok, other=0.0)
    g32 = g.to(tl.float32)
    act = (g32 / (1.0 + tl.exp(-g32))).to(g.dtype).to(tl.float32)     # F.silu rounds to the dtype
    tl.store(OUT + t * s_out + cols, (act * u.to(tl.float32)).to(OUT.dtype.element_ty), mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` for gate_up (T, 2F) = [gate | up] (the fused projection's output): (T, F)."""
    _check(gate_up=gate_up)
    if gate_up.dim() != 2 or gate_up.shape[1] % 2 or gate_up.stride(1) != 1:
        raise ValueError(f"gate_up must be (T, 2F) with a contiguous last dim, got {tuple(gate_up.shape)}")
    T, F = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((T, F), device=gate_up.device, dtype=gate_up.dtype)
    block = 128 if INTERPRETED else 1024
    if T:
        _silu_mul_kernel[(T, cdiv(F, block))](gate_up, out, F, gate_up.stride(0), out.stride(0), BLOCK=block,
                                              num_warps=1 if INTERPRETED else 4)
    return out
