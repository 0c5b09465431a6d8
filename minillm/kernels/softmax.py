"""Row softmax in Triton, online across column tiles (chapter 5).

One program owns one row. Pass 1 streams the row in BLOCK-wide tiles keeping the
running max m and the rescaled sum l (the online algorithm), so a row may be far
wider than one tile. Pass 2 streams it again and writes exp(x - m) / l. Two reads
and one write per element, whatever the row width.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import INTERPRETED  # noqa: F401  (sets TRITON_INTERPRET on CPU before the kernel is defined)
from .common import next_power_of_2

SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _online_softmax_kernel(x_ptr, y_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    # BEGIN SOLUTION
    row = tl.program_id(0)
    x_row = x_ptr + row * x_stride
    y_row = y_ptr + row * y_stride
    cols = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max
    l = tl.zeros([BLOCK], tl.float32)                 # per-lane rescaled sum
    for start in tl.range(0, n_cols, BLOCK):
        x = tl.load(x_row + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # lanes that have seen only -inf keep l = 0 (avoid exp(-inf - -inf) = nan)
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.exp(m - m_new))
        p = tl.where(m_new == float("-inf"), 0.0, tl.exp(x - m_new))
        l = l * alpha + p
        m = m_new
    # fold the per-lane statistics into one (m, l) for the row: the same merge, across lanes
    m_row = tl.max(m, axis=0)
    scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_row))
    l_row = tl.sum(l * scale, axis=0)
    inv_l = tl.where(l_row > 0, 1.0 / l_row, 0.0)
    m_safe = tl.where(m_row == float("-inf"), 0.0, m_row)
    for start in tl.range(0, n_cols, BLOCK):
        mask = start + cols < n_cols
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m_safe) * inv_l
        tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    # END SOLUTION


def softmax(x: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """Softmax over the last axis; same contract as ``minillm.softmax.safe_softmax``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED:
        raise ValueError(f"unsupported dtype {x.dtype}; supported: {SUPPORTED}")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"softmax needs a non-empty last axis, got shape {tuple(x.shape)}")
    if x.device.type != "cuda" and not INTERPRETED:
        raise ValueError(f"tensor is on {x.device}; compiled Triton kernels need a CUDA tensor")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty_like(rows)
    block = min(block, next_power_of_2(rows.shape[1]))
    block = max(block, 16)
    _online_softmax_kernel[(rows.shape[0],)](rows, y, rows.shape[1], rows.stride(0), y.stride(0), BLOCK=block)
    return y.reshape(x.shape)
