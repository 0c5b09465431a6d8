"""minillm.kernels.common: the cached launch (compiled on a GPU; the interpreter's fallback on CPU)."""
import pytest
import torch

import minillm.kernels  # noqa: F401  (before triton)
import triton
import triton.language as tl

from minillm.kernels import INTERPRETED
from minillm.kernels.common import CachedLaunch

DEVICE = "cpu" if INTERPRETED else "cuda"
gpu = pytest.mark.gpu  # (conftest skips these without CUDA)


@triton.jit
def _scaled_copy(X, Y, n, stride, factor, BLOCK: tl.constexpr):
    """y[i] = x[i * stride] * factor for i < n."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i * stride, mask=i < n) * factor, mask=i < n)


def _run(launch, x, n, stride, factor=2.0):
    y = torch.zeros(n, device=x.device, dtype=x.dtype)
    launch((triton.cdiv(n, 16),), x, y, n, stride, factor, BLOCK=16)
    return y


def _want(x, n, stride, factor=2.0):
    return x[: n * stride : stride] * factor


def test_cached_launch_matches_the_kernel_on_new_tensors():
    """Every call reads the tensors it is given: a second call with the same shapes and other data gives the other
    data's result (a launch that kept the first call's pointers would not)."""
    launch = CachedLaunch(_scaled_copy)
    for seed in range(3):
        x = torch.randn(64, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        torch.testing.assert_close(_run(launch, x, 40, 1), _want(x, 40, 1), rtol=0, atol=0)


@pytest.mark.parametrize("n, stride", [(1, 1), (16, 1), (17, 3), (32, 2), (33, 1)])
def test_cached_launch_each_specialization_right(n, stride):
    """Integers Triton specializes (== 1, divisible by 16) and ones it does not, in one launcher, in turn: each
    call's key is its own, so none runs a kernel compiled for another's values."""
    launch = CachedLaunch(_scaled_copy)
    x = torch.randn(128).to(DEVICE)
    torch.testing.assert_close(_run(launch, x, n, stride), _want(x, n, stride), rtol=0, atol=0)
    torch.testing.assert_close(_run(launch, x, 40, 1, 3.0), _want(x, 40, 1, 3.0), rtol=0, atol=0)


@gpu
def test_cached_launch_unaligned_tensor_gets_its_own_kernel():
    """A tensor one element off a 16-byte boundary is keyed apart from an aligned one (Triton compiles aligned
    pointers with vector loads), and both give the right result."""
    launch = CachedLaunch(_scaled_copy)
    base = torch.randn(130, device="cuda")
    for x in (base[:128], base[1:129], base[:128]):
        torch.testing.assert_close(_run(launch, x, 128, 1), _want(x, 128, 1), rtol=0, atol=0)
    assert len(launch._entries) == 2


@gpu
def test_cached_launch_keeps_at_most_size_entries():
    launch = CachedLaunch(_scaled_copy, size=2)
    x = torch.randn(64, device="cuda")
    for n in (17, 18, 19, 17):
        torch.testing.assert_close(_run(launch, x, n, 1), _want(x, n, 1), rtol=0, atol=0)
    assert len(launch._entries) == 2


@gpu
def test_cached_launch_missing_parameter_raises():
    x = torch.randn(64, device="cuda")
    with pytest.raises(TypeError, match="no value for BLOCK"):
        CachedLaunch(_scaled_copy)((4,), x, torch.empty_like(x), 64, 1, 2.0)


@gpu
def test_cached_launch_constexpr_by_position_right():
    """A constexpr passed by position is part of the key as any value is: 16 and 32 each get their kernel."""
    launch = CachedLaunch(_scaled_copy)
    x = torch.randn(64, device="cuda")
    for block in (16, 32, 16):
        y = torch.zeros(40, device="cuda")
        launch((triton.cdiv(40, block),), x, y, 40, 1, 2.0, block)
        torch.testing.assert_close(y, _want(x, 40, 1), rtol=0, atol=0)
    assert len(launch._entries) == 2


@triton.jit
def _scaled_copy_args_first(n, stride, factor, X, Y, BLOCK: tl.constexpr):
    """_scaled_copy with the tensors after the scalars."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i * stride, mask=i < n) * factor, mask=i < n)


def test_cached_launch_bind_launches_on_new_tensors():
    """A bound launch reads the tensors passed to it, in their places, with every other argument as bound: tensors
    first (the kernels' order) and tensors after the scalars."""
    x0 = torch.randn(64).to(DEVICE)
    y0 = torch.zeros(40, device=DEVICE)
    _, lead = CachedLaunch(_scaled_copy).bind((3,), x0, y0, 40, 1, 2.0, BLOCK=16)
    _, trail = CachedLaunch(_scaled_copy_args_first).bind((3,), 40, 1, 3.0, x0, y0, BLOCK=16)
    assert not y0.any()  # bound, not launched
    for seed in range(2):
        x = torch.randn(64, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        y, z = torch.zeros(40, device=DEVICE), torch.zeros(40, device=DEVICE)
        lead(x, y)
        trail(x, z)
        torch.testing.assert_close(y, _want(x, 40, 1), rtol=0, atol=0)
        torch.testing.assert_close(z, _want(x, 40, 1, 3.0), rtol=0, atol=0)


def test_memo_put_concurrent_threads_keep_the_bound():
    """Four threads filling one Memo past its size: no error (before the lock, two threads could both pick the same
    oldest entry to drop, and the second ``del`` raised KeyError), and it never holds more than ``size``."""
    import sys
    import threading

    from minillm.kernels.common import Memo

    memo, errors = Memo(size=8), []

    def fill(t):
        try:
            for i in range(20000):
                memo.put((t, i), i)
                assert len(memo) <= memo.size
        except Exception as e:  # noqa: BLE001  (reported below, from the main thread)
            errors.append(e)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race, if any, shows
    try:
        threads = [threading.Thread(target=fill, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(memo) == memo.size
