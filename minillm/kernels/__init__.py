"""Triton kernels. Each has the signature and layout of its NumPy reference.

Importing this package imports torch and triton. Without a CUDA GPU, kernels run
in Triton's interpreter on CPU tensors. Triton reads TRITON_INTERPRET when each
``@triton.jit`` function is defined -- including its own standard library at
``import triton`` -- so it is set here, before triton is imported. (Importing
triton yourself first, on a machine without CUDA, leaves the kernels unusable;
the check below says so instead of failing later with an obscure error.)
"""
import os
import re
import sys

import numpy as np
import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        raise ImportError("no CUDA GPU: set TRITON_INTERPRET=1 before importing triton, "
                          "or import minillm.kernels before triton")
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402,F401

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

FIXED_INTERPRETER = (3, 7)  # the first Triton whose interpreter runs with NumPy 2.4 (triton-lang/triton#9172)


def _major_minor(version: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def interpreter_problem(triton_version: str, numpy_version: str):
    """Why Triton's interpreter cannot run these kernels with these versions, or None when it can.

    Triton's interpreter holds every scalar (a kernel argument, ``tl.program_id``, anything computed from them)
    as a one-element NumPy array, and a Python ``range`` over a scalar asks it for ``int(array)``. NumPy 2.4 made
    that conversion of a 1-d array an error (it had warned since 1.25), and Triton fixed its interpreter in 3.7
    (triton-lang/triton#9171). Every kernel here loops over a runtime bound (``tl.range(lo, hi, BLOCK)``: the
    keys of a row, the blocks of a sequence), which cannot be written without one and keep the compiled loop
    (``tl.range`` is what Triton pipelines), so with Triton < 3.7 and NumPy >= 2.4 no kernel runs on CPU.
    Compiled kernels on a GPU do not use the interpreter and work with any NumPy."""
    if _major_minor(triton_version) >= FIXED_INTERPRETER or _major_minor(numpy_version) < (2, 4):
        return None
    return (f"Triton {triton_version}'s CPU interpreter cannot run with NumPy {numpy_version} (it converts "
            f"one-element arrays to Python ints, which NumPy 2.4 made an error; fixed in Triton 3.7, "
            f"triton-lang/triton#9171). Without a GPU, install minillm's [cpu] extra (pip install "
            f"'triton>=3.7'), or keep this Triton and pip install 'numpy<2.4'.")


if INTERPRETED and (_problem := interpreter_problem(triton.__version__, np.__version__)):
    raise ImportError(_problem)


def check_tensors(**named) -> None:
    """TypeError unless every argument is a torch.Tensor (the kernels take torch tensors, never arrays)."""
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_placement(**named) -> None:
    """ValueError unless the tensors share one device, and that device is CUDA (or the interpreter runs)."""
    devices = [t.device for t in named.values()]
    if len(set(devices)) != 1:
        raise ValueError(f"{', '.join(named)} must be on one device, got {', '.join(map(str, devices))}")
    if devices[0].type != "cuda" and not INTERPRETED:
        raise ValueError(f"tensors are on {devices[0]}; compiled Triton kernels need CUDA tensors")
