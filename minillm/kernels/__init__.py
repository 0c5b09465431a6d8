"""Triton kernels. Each has the signature and layout of its NumPy reference.

Importing this package imports torch and triton. Without a CUDA GPU, kernels run
in Triton's interpreter on CPU tensors. Triton reads TRITON_INTERPRET when each
``@triton.jit`` function is defined -- including its own standard library at
``import triton`` -- so it is set here, before triton is imported. (Importing
triton yourself first, on a machine without CUDA, leaves the kernels unusable;
the check below says so instead of failing later with an obscure error.)
"""
import os
import sys

import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        raise ImportError("no CUDA GPU: set TRITON_INTERPRET=1 before importing triton, "
                          "or import minillm.kernels before triton")
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402,F401

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


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
