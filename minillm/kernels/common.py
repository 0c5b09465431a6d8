"""What the attention kernels share: the MMA, the online-softmax step, tile loads and ranges, and the host's
helpers (integer arithmetic, the SM count, the allocator tensor descriptors need, a cached launch)."""
from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import INTERPRETED

LOG2E = 1.4426950408889634


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host (``triton.cdiv`` goes through Triton's JIT wrapper on every call)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), for the host."""
    return 1 << (n - 1).bit_length()


def last_dim_contiguous(*tensors):
    """Each tensor as it is where its last dimension is contiguous (the kernels take every other stride as it
    is), else a contiguous copy."""
    return tuple(t if t.stride(-1) == 1 else t.contiguous() for t in tensors)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_sms(device) -> int:
    """The device's streaming multiprocessors (4 in the interpreter, which has none)."""
    return 4 if INTERPRETED else _sm_count(torch.device(device))


def _torch_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def use_torch_allocator() -> None:
    """Hand Triton torch memory for the scratch space in-kernel tensor descriptors are written to
    (``tl.make_tensor_descriptor``). The allocator lives in a context variable, so it is set on every call that
    launches such a kernel (autograd runs the backward on a thread of its own); this replaces an allocator the
    caller set."""
    if not INTERPRETED:
        triton.set_allocator(_torch_scratch)


def tma_aligned(*tensors) -> bool:
    """Whether TMA can address these (B, H, N, D) tensors: 16-byte aligned base pointers and row strides, the last
    dimension contiguous, no broadcast (stride 0) dimension. Anything else runs pointer loads."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any(st <= 0 or st * size % 16 for st in t.stride()[:3]):
            return False
    return True


class Memo:
    """A bounded memo of host work a call would otherwise redo (compiled kernels, per-shape plans): ``get(key)``, None
    on a miss, and ``put(key, value)``, which drops the oldest entry past ``size`` and returns the value. It never
    changes a result: a miss builds what a hit returns. Safe to share between threads: a ``put`` holds a lock (a
    ``get`` is one dict lookup)."""

    def __init__(self, size: int = 256):
        self.size, self.entries, self._lock = size, {}, threading.Lock()

    def __len__(self):
        return len(self.entries)

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, value):
        with self._lock:  # (without it two threads past ``size`` can both try to drop the same oldest entry)
            while len(self.entries) >= self.size:
                del self.entries[next(iter(self.entries))]
            self.entries[key] = value
        return value


class CachedLaunch:
    """``kernel[grid](*args, **kwargs)`` with Triton's per-call argument binding done once per key.

    Each ``kernel[grid](...)`` binds every argument and asks how to specialize it (an int equal to 1, one divisible
    by 16, a 16-byte aligned pointer...), builds a cache key and looks the compiled kernel up: microseconds per
    launch, the most of an eager call whose kernels are short (decode at batch 1, a training step at 1K tokens).
    Here the first call of a key goes through the public ``kernel.warmup`` (it compiles or finds the kernel:
    Triton's own rules decide) and keeps the compiled kernel; later calls launch it with ``compiled[grid](...)``,
    as Triton's fused-softmax tutorial does. The key holds every int and float argument's value, every tensor's
    dtype and alignment, the keywords and the current device: finer than Triton's specialization, so two calls
    that share a key would get the same compiled kernel. Every parameter is passed (by position, then by
    keyword), none left to its default. In the interpreter the call goes to ``kernel[grid]``. Returns the
    compiled kernel. :meth:`bind` skips even the key, for a caller that keeps a plan per shape."""

    def __init__(self, kernel, size: int = 256):
        self.kernel, self._entries, self._tensor_args = kernel, Memo(size), {}

    def _tensor_positions(self, args) -> list:
        """Which arguments are tensors or host descriptors (they hash by identity), kept per argument types."""
        types = tuple(map(type, args))
        where = self._tensor_args.get(types)
        if where is None:
            where = self._tensor_args[types] = [i for i, a in enumerate(args)
                                                if isinstance(a, (torch.Tensor, TensorDescriptor))]
        return where

    def _entry(self, grid, args, kwargs):
        """(compiled kernel, its launcher on ``grid``, the values of the parameters after ``args``)."""
        seen = list(args)  # what Triton specializes on: the dtype and 16-byte alignment (a descriptor's box too)
        for i in self._tensor_positions(args):
            a = args[i]
            seen[i] = ((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else
                       (a.base.dtype, tuple(a.block_shape), a.base.data_ptr() % 16 == 0))
        key = (torch.cuda.current_device(), grid, *kwargs.items(), *seen)
        entry = self._entries.get(key)
        if entry is None:
            names = self.kernel.arg_names[len(args):]  # the rest, in the kernel's order
            if missing := [n for n in names if n not in kwargs]:
                raise TypeError(f"{self.kernel.__name__}: no value for {', '.join(missing)} (a cached launch "
                                f"takes every parameter, by position or keyword: none by its default)")
            compiled = self.kernel.warmup(*args, grid=grid, **kwargs)
            entry = self._entries.put(key, (compiled, compiled[grid], tuple(kwargs[n] for n in names)))
        return entry

    def __call__(self, grid, *args, **kwargs):
        if INTERPRETED:
            return self.kernel[grid](*args, **kwargs)
        grid = (*grid, 1, 1)[:3]  # the compiled kernel's launcher takes all three
        compiled, runner, rest = self._entry(grid, args, kwargs)
        runner(*args, *rest)
        return compiled

    def bind(self, grid, *args, **kwargs):
        """(compiled kernel, launch), compiled for these arguments but not launched. ``launch(*tensors)`` launches
        it on ``grid`` with new tensors (and host descriptors) in their places, in their order, every other
        argument as given here. The caller vouches that each new tensor has the dtype and 16-byte alignment of
        the one it replaces (a descriptor, its box too): what Triton specialized on, which a plan kept per shape,
        dtype and alignment holds. The compiled kernel is None in the interpreter."""
        where = self._tensor_positions(args)
        template = list(args)
        for i in where:  # no tensor kept
            template[i] = None

        def fill(values):
            filled = template.copy()
            for i, x in zip(where, values):
                filled[i] = x
            return filled
        if INTERPRETED:
            return None, lambda *values: self.kernel[grid](*fill(values), **kwargs)
        grid = (*grid, 1, 1)[:3]
        compiled, runner, rest = self._entry(grid, args, kwargs)
        if where == list(range(len(where))):  # the tensors lead (every kernel here): nothing to fill
            tail = (*args[len(where):], *rest)
            return compiled, lambda *values: runner(*values, *tail)
        return compiled, lambda *values: runner(*fill(values), *rest)


@triton.jit
def load_tile(ptrs, in_rows, in_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
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
def mma(a, b, acc, IEEE: tl.constexpr):
    """acc + a @ b on the tensor cores (or in exact fp32 for fp32 inputs)."""
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    """a @ b on the tensor cores (or in exact fp32 for fp32 inputs), into a fresh fp32 accumulator."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def softmax_step(s, m, l, qk_scale, SCALED: tl.constexpr, SAFE: tl.constexpr):
    """One step of the online softmax over a tile of scores ``s`` (rows x keys); m, the running max, is in log2
    units. Returns (p, alpha, m_new, l_new): the tile's unnormalized probabilities, the factor that rescales what
    was accumulated before, the new max and the new sum.

    SCALED: ``s`` is already multiplied by qk_scale (and masked scores are -inf); else the scale is applied here,
    in the same FMA as the shift. SAFE: a row may not have seen a key yet (max -inf): it is shifted by 0, so that
    its p and alpha are 0 instead of NaN; an unmasked tile needs no such check."""
    if SCALED:
        m_new = tl.maximum(m, tl.max(s, axis=1))
    else:
        m_new = tl.maximum(m, tl.max(s, axis=1) * qk_scale)
    if SAFE:
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_shift = m_new
    if SCALED:
        p = tl.exp2(s - m_shift[:, None])
    else:
        p = tl.exp2(s * qk_scale - m_shift[:, None])
    alpha = tl.exp2(m - m_shift)  # exp2(-inf) = 0: nothing to rescale yet
    return p, alpha, m_new, l * alpha + tl.sum(p, axis=1)


@triton.jit
def causal_order(NUM_M, BH, GROUP_HEADS):
    """(query tile, batch x head) of this program of a causal (NUM_M, BH) grid, heaviest first by groups of
    GROUP_HEADS heads. The hardware starts programs in order, x fastest; program i of a group of g heads takes
    tile NUM_M - 1 - i // g of head i % g, so every head of the group starts its last (largest) tile before
    any starts a smaller one, and the grid ends on the one-tile diagonals instead of on whole heads.
    GROUP_HEADS = 1 is one head at a time; the last group may hold fewer heads."""
    linear = tl.program_id(1) * NUM_M + tl.program_id(0)
    per_group = GROUP_HEADS * NUM_M
    group = linear // per_group
    r = linear - group * per_group
    g = tl.minimum(GROUP_HEADS, BH - group * GROUP_HEADS)
    return NUM_M - 1 - r // g, group * GROUP_HEADS + r % g


@triton.jit
def key_range(m0, Nk, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
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
def normalize(acc, l, m):
    """The forward's epilogue: O = acc / l and the natural-log LSE (m is in log2 units); a row that saw
    no key gets zeros and lse = -inf."""
    l_safe = tl.where(l > 0, l, 1.0)
    return acc / l_safe[:, None], tl.where(l > 0, (m + tl.log2(l_safe)) / 1.4426950408889634, float("-inf"))
