"""Launching a compiled Triton kernel with less host work than ``kernel[grid](...)``.

Every ``kernel[grid](*args)`` call runs Triton's JIT front door on the host: it binds the
arguments, asks Triton's C++ code how to specialize each one (an integer equal to 1 becomes a
constant, one divisible by 16 gets an alignment hint, a pointer aligned to 16 bytes another),
turns the options into a cache key, looks the compiled kernel up, and only then launches it.
For a kernel with thirty integer arguments (strides) that is tens of microseconds per launch,
comparable to the kernel itself at short sequence lengths: at N=1K a training step of attention
was host-bound on the H200 (benchmarks/results/attention_step_host_h200.json).

``fast_launch`` keeps the compiled kernel per *specialization class* of the arguments, computed in
plain Python from the same rules, and calls its launcher directly on later calls. The first call
of a class goes through ``kernel[grid]`` unchanged (compiling or finding the kernel, raising its
errors), so a class that Triton would compile differently can never share an entry: two argument
lists share one when every integer agrees on (== 1, % 16 == 0, its integer type), every tensor on
(dtype, 16-byte alignment of its data pointer), every host ``TensorDescriptor`` on (dtype, box shape),
every float, bool and None on its type, and the constexpr keywords are equal. ``tests/test_kernels_launch.py`` checks that partition against
Triton's own specialization function.

The fast path is off in the interpreter, for Triton versions it was not checked on
(``CHECKED_TRITON``), and while a launch hook is installed (profilers such as proton install them; ``hooks_off``);
``FAST_LAUNCH = False`` turns it off (the benchmarks flip it to measure what it saves). What it
skips besides the binder: Triton's check that global variables a kernel reads have not changed
since it was compiled (the kernels here read none that change); kernels with pre-run hooks, autotuners
and heuristics wrappers always take the JIT path.

``bind`` goes one step further for a caller that repeats a launch with new tensors and everything else
the same: the ``Bound`` it returns checks only the tensors' classes and calls the launcher
(flash_attention's plans keep them). A host ``TensorDescriptor`` among the bound arguments, over the bound
tensor ``over`` names, is rebased on every call onto the tensor passed in that place, which must have
the bound one's shape and strides (the descriptor's extents were made from them): the launcher encodes
the TMA descriptor from base, shape and strides on each launch. That encoding, in the Python wrapper
Triton 3.6 puts around its C launcher (``wrap_handle_tensordesc``), took 88 of the forward's 242 us per
training step under cProfile, with four descriptors (results/attention_step_hostdesc_kernels39_h200.json),
and kept the N=1K training step host-bound; so a Bound calls the C launcher itself and keeps each
descriptor's encoding per tensor address (``DESC_CACHE``; the caching allocator hands the same addresses back step after step), made by Triton's
own ``make_tensordesc_arg`` (``_unwrapped`` finds the C launcher; where Triton is built otherwise the
wrapper runs as before).
"""
from __future__ import annotations

import torch
import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from . import INTERPRETED

try:  # Triton 3.6's encoding of one host descriptor for its launcher (None: Bound keeps Triton's wrapper)
    from triton.backends.nvidia.driver import make_tensordesc_arg
except ImportError:  # pragma: no cover
    make_tensordesc_arg = None

try:  # (Triton before 3.4 has no knobs module: the fast path is then off)
    from triton import knobs
except ImportError:  # pragma: no cover
    knobs = None

FAST_LAUNCH = True
CHECKED_TRITON = ("3.6.",)  # the versions whose specialization rules _arg_class mirrors (checked by a test)
_SUPPORTED = INTERPRETED is False and knobs is not None and triton.__version__.startswith(CHECKED_TRITON)
_I32 = (-2**31, 2**31)
_entries: dict = {}  # (kernel, device, argument classes, constexpr items, Triton's debug and instrumentation
# knobs) -> (launcher, function, metadata, tail, compiled kernel), or _JIT_ONLY
stats = {"fast": 0, "slow": 0, "bound": 0, "encoded": 0}  # launches that skipped the binder (through fast_launch,
# and through a Bound), those that went through it, and host descriptors a Bound encoded (cache misses)


def _arg_class(a):
    """What Triton's specialization sees of one argument (see the module docstring)."""
    t = type(a)
    if t is int:
        if not -2**63 <= a < 2**64:  # Triton rejects these; the launcher would wrap them
            raise TypeError(f"integer argument {a} does not fit 64 bits")
        return (a == 1, a % 16 == 0, _I32[0] <= a < _I32[1], a >= 2**63)
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if t is float or t is bool or a is None:
        return t
    if t is TensorDescriptor:  # a host descriptor: Triton keys it by its dtype and box alone (the launcher
        # turns its base, shape and strides into the TMA descriptor on every launch)
        return (t, a.base.dtype, tuple(a.block_shape))
    raise TypeError(f"no fast launch for an argument of type {t.__name__}")


def hooks_off() -> bool:
    """True when no launch hook is installed. Triton 3.6 keeps the hooks as (normally empty) chains, not
    None, and calls them on every launch through the JIT; the fast path calls none."""
    if knobs is None:
        return False
    return all(h is None or not getattr(h, "calls", True)
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def arg_classes(args) -> tuple:
    return tuple([_arg_class(a) for a in args])


def tensor_classes(tensors) -> list:
    """``_arg_class`` of each tensor, inline (a Bound checks its tensors with it on every call)."""
    return [(t.dtype, t.data_ptr() % 16 == 0) for t in tensors]


_JIT_ONLY = object()  # the entry of a class that always goes through kernel[grid]


def _with_base(desc, base):
    """A copy of a host descriptor over ``base``, without TensorDescriptor's checks (they ran on the original, and
    the callers keep what they checked: a Bound's class check the dtype and alignment, its layout check the rest)."""
    d = object.__new__(TensorDescriptor)
    d.__dict__.update(desc.__dict__)
    d.base = base
    return d


DESC_CACHE = 1024  # encoded descriptors a Bound keeps per descriptor parameter, one per tensor address (one plan
# serves every layer of a model with the same shapes, each layer's tensors at addresses of their own); past it the
# oldest is dropped


def _unwrapped(run):
    """(C launcher, cooperative, pdl, indices of the descriptor parameters, their metadata) of a compiled
    kernel's launcher built as Triton 3.6 builds it: a ``CudaLauncher`` whose ``launch`` is the closure
    ``wrap_handle_tensordesc`` makes around the C launcher. None for anything else (another Triton or
    backend, descriptors Triton did not lower to TMA maps, a kernel that needs scratch memory)."""
    inner = getattr(run, "launch", None)
    if (make_tensordesc_arg is None or type(run).__name__ != "CudaLauncher"
            or getattr(run, "global_scratch_size", 1) != 0 or getattr(run, "profile_scratch_size", 1) != 0
            or getattr(inner, "__closure__", None) is None):
        return None
    cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in inner.__closure__)))
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys() or not cells["tensordesc_meta"] \
            or any(m is None for m in cells["tensordesc_meta"]):
        return None
    return (cells["launcher"], run.launch_cooperative_grid, run.launch_pdl, frozenset(cells["tensordesc_indices"]),
            list(cells["tensordesc_meta"]))


def _entry(kernel, compiled, n_args: int, constexprs: dict):
    """What a later call of the class needs: the launcher and the kernel's remaining parameters' values.
    A constexpr parameter passed positionally would be classed by its type alone (True and False, say,
    in one class), and a runtime parameter passed by keyword by its value, so a kernel called either way
    keeps going through the JIT, as does anything but a plain JITFunction without pre-run hooks."""
    if not isinstance(kernel, JITFunction) or kernel.pre_run_hooks or compiled is None:
        return _JIT_ONLY  # (an autotuner or heuristics wrapper, hooks to run, a launch a cache hook skipped)
    if any(i < n_args for i in kernel.constexprs):
        return _JIT_ONLY
    if any(not p.is_constexpr for p in kernel.params[n_args:]):
        return _JIT_ONLY  # a runtime argument by keyword would be keyed by its value
    names = kernel.arg_names[n_args:]  # the kernel's remaining parameters, in signature order
    defaults = {p.name: p.default for p in kernel.params if p.has_default}
    tail = tuple(constexprs[n] if n in constexprs else defaults[n] for n in names)
    return compiled.run, compiled.function, compiled.packed_metadata, tail, compiled


def _key(kernel, device, args, constexprs: dict) -> tuple:
    """The class of one launch (raises TypeError for an argument type the classes do not cover)."""
    # the compile options Triton reads from its knobs on every call belong to the class too
    return (kernel, device, arg_classes(args), tuple(constexprs.items()), knobs.runtime.debug,
            knobs.compilation.instrumentation_mode)


def fast_path_on() -> bool:
    """Whether launches may skip the binder now: the switch, a checked compiled Triton, no launch hooks."""
    return FAST_LAUNCH and _SUPPORTED and hooks_off()


def fast_launch(kernel, grid: tuple, *args, **constexprs):
    """``kernel[grid](*args, **constexprs)``; returns the compiled kernel, as that does.

    ``args`` are the kernel's leading parameters, positionally; ``constexprs`` the rest by name
    (constexpr parameters and the options num_warps / num_stages). Repeated calls whose arguments
    fall in one specialization class launch the kernel compiled for the first without Triton's
    binder."""
    return _launch(kernel, grid, args, constexprs)[0]


def _launch(kernel, grid: tuple, args: tuple, constexprs: dict):
    """``fast_launch``, returning (compiled kernel, the class's entry or None, device or None)."""
    if not fast_path_on() or callable(grid):
        stats["slow"] += 1
        return kernel[grid](*args, **constexprs), None, None
    device = driver.active.get_current_device()
    try:
        key = _key(kernel, device, args, constexprs)
        entry = _entries.get(key)
    except TypeError:  # an argument type the classes do not cover, or an unhashable constexpr
        stats["slow"] += 1
        return kernel[grid](*args, **constexprs), None, None
    if entry is None or entry is _JIT_ONLY:
        stats["slow"] += 1
        compiled = kernel[grid](*args, **constexprs)
        if entry is None:
            entry = _entries[key] = _entry(kernel, compiled, len(args), constexprs)
        return compiled, entry, device
    run, function, metadata, tail, compiled = entry
    g = (*grid, 1, 1)
    run(g[0], g[1], g[2], driver.active.get_current_stream(device), function, metadata, None, None, None,
        *args, *tail)
    stats["fast"] += 1
    return compiled, entry, device


class Bound:
    """One launch with its grid, scalar arguments and constexprs fixed; ``bound(*tensors)`` repeats it with
    other tensors in the kernel's leading (tensor) parameters. Made by ``bind``.

    A call whose tensors fall in the class the launch was bound with (dtype and 16-byte alignment of
    each), made while the fast path is on, on the device it was bound on, with Triton's debug and
    instrumentation knobs as they were, goes to the compiled launcher directly: no binder, and no
    classing of the scalars, which cannot change. Any other call goes through ``fast_launch`` with the
    full argument list, as an unbound launch would."""

    __slots__ = ("kernel", "grid", "scalars", "constexprs", "compiled", "device", "classes", "knobs", "launch",
                 "descs", "raw", "encoded")

    def __init__(self, kernel, grid, n_tensors: int, args: tuple, constexprs: dict, compiled, entry, device,
                 over: tuple = ()):
        self.kernel, self.grid, self.constexprs, self.compiled = kernel, grid, constexprs, compiled
        self.scalars, self.device = args[n_tensors:], device
        self.classes = tensor_classes(args[:n_tensors])
        # host descriptors (each over the tensor ``over`` names): (place among the scalars, tensor index, the
        # descriptor without its base, the tensor's shape and strides). The Bound keeps no reference to the bound
        # call's tensors: a plan would keep them alive, and with an output the autograd graph it carries, whose
        # leaves' gradient accumulators, made on the stream of that first call, broke the CUDA-graph capture of
        # later training steps while the Bound held them (results/graph_capture*_h200.json; with no tensor kept,
        # the same steps captured: graph_capture_kept_h200.json)
        scalars = list(self.scalars)
        descs = []
        for i, j in zip([i for i, a in enumerate(scalars) if isinstance(a, TensorDescriptor)], over):
            scalars[i] = _with_base(scalars[i], None)
            descs.append((i, j, scalars[i], tuple(args[j].shape), args[j].stride()))
        self.scalars, self.descs = tuple(scalars), tuple(descs)
        self.knobs = (knobs.runtime.debug, knobs.compilation.instrumentation_mode) if knobs is not None else None
        self.launch = self.raw = None
        self.encoded = [{} for _ in self.descs]  # per descriptor: tensor address -> its encoding for the launcher
        if entry is not None and entry is not _JIT_ONLY:
            run, function, metadata, tail, _ = entry
            g = (*grid, 1, 1)
            self.launch = run, (g[0], g[1], g[2]), (function, metadata, None, None, None), (*self.scalars, *tail)
            if self.descs:
                self.raw = self._raw_plan(run, function, metadata, (g[0], g[1], g[2]), n_tensors, tail)

    def _raw_plan(self, run, function, metadata, grid3, n_tensors: int, tail: tuple):
        """How a call reaches the C launcher with its descriptors encoded here: (launcher, the arguments before
        the kernel's, the kernel's arguments after the tensors as pieces: a tuple of fixed values or the index
        of a descriptor in self.descs, each descriptor's metadata), or None (Triton's wrapper then runs)."""
        raw = _unwrapped(run)
        if raw is None:
            return None
        launcher, coop, pdl, indices, meta = raw
        places = {n_tensors + i: k for k, (i, *_rest) in enumerate(self.descs)}  # kernel parameter -> descriptor
        if set(places) != set(indices):
            return None
        order = sorted(indices)  # Triton's metadata lists the descriptors in parameter order
        metas = [meta[order.index(n_tensors + i)] for i, *_rest in self.descs]
        pieces, fixed = [], []
        for p, value in enumerate((*self.scalars, *tail), start=n_tensors):
            if p in places:
                pieces += [tuple(fixed), places[p]]
                fixed = []
            else:
                fixed.append(value)
        pieces.append(tuple(fixed))
        return launcher, (*grid3, None, function, coop, pdl, None, None, metadata, None, None, None), tuple(pieces), metas

    def _raw_call(self, tensors) -> None:
        """The launch through the C launcher, each descriptor's encoding made once per tensor address."""
        launcher, head, pieces, metas = self.raw
        args = list(head)
        args[3] = driver.active.get_current_stream(self.device)
        args += tensors
        for piece in pieces:
            if type(piece) is tuple:
                args += piece
                continue
            t = self._descriptor_tensor(self.descs[piece], tensors)
            cache = self.encoded[piece]
            enc = cache.get(t.data_ptr())
            if enc is None:
                enc = tuple(make_tensordesc_arg(_with_base(self.descs[piece][2], t), metas[piece]))
                if len(cache) >= DESC_CACHE:
                    del cache[next(iter(cache))]  # the oldest (dicts keep insertion order)
                cache[t.data_ptr()] = enc
                stats["encoded"] += 1
            args += enc
        launcher(*args)

    @staticmethod
    def _descriptor_tensor(entry, tensors):
        """This call's tensor in a descriptor's place, checked against the layout the descriptor was made for."""
        i, j, desc, shape, strides = entry
        t = tensors[j]
        if t.shape != shape or t.stride() != strides:
            raise ValueError(f"a bound launch's host descriptor was made over a tensor of shape {shape} and "
                             f"strides {strides}; this call passes {tuple(t.shape)}, {t.stride()} in its place")
        return t

    def _rebase(self, tensors, values: tuple) -> tuple:
        """``values`` (the scalars, then anything after them) with each bound descriptor made anew over this call's
        tensor in its place (through TensorDescriptor, whose checks run: this is the path of calls outside the
        bound class, a misaligned tensor among them)."""
        values = list(values)
        for entry in self.descs:
            i, desc = entry[0], entry[2]
            values[i] = TensorDescriptor(self._descriptor_tensor(entry, tensors), desc.shape, desc.strides,
                                         desc.block_shape, desc.padding)
        return tuple(values)

    def __call__(self, *tensors):
        L = self.launch  # (None unless the fast path was on and the launch had a fast entry when bound)
        if (L is not None and FAST_LAUNCH and hooks_off()
                and tensor_classes(tensors) == self.classes
                and (knobs.runtime.debug, knobs.compilation.instrumentation_mode) == self.knobs
                and driver.active.get_current_device() == self.device):
            if self.raw is not None:
                self._raw_call(tensors)
            else:
                run, head, rest, tail = L
                if self.descs:
                    tail = self._rebase(tensors, tail)
                run(*head, driver.active.get_current_stream(self.device), *rest, *tensors, *tail)
            stats["bound"] += 1
            return self.compiled
        scalars = self._rebase(tensors, self.scalars) if self.descs else self.scalars
        return fast_launch(self.kernel, self.grid, *tensors, *scalars, **self.constexprs)


def bind(kernel, grid: tuple, n_tensors: int, *args, over: tuple = (), **constexprs) -> Bound:
    """``fast_launch(kernel, grid, *args, **constexprs)``, and a ``Bound`` that repeats it: the first
    ``n_tensors`` arguments are the ones a later call passes anew (they must be the only tensors). Host
    TensorDescriptors among the rest are allowed when ``over`` names, for each in order, the index of the
    bound tensor it was made over (its base itself, not a view of it; tensors may alias, hence the index):
    a replay rebases it onto the tensor passed in that place."""
    tensors, rest = args[:n_tensors], args[n_tensors:]
    if not all(isinstance(a, torch.Tensor) for a in tensors) or any(isinstance(a, torch.Tensor) for a in rest):
        raise TypeError("bind: tensors must come first, all of them in the first n_tensors arguments")
    descs = [a for a in rest if isinstance(a, TensorDescriptor)]
    if len(descs) != len(over) or not all(type(d) is TensorDescriptor and 0 <= j < n_tensors and d.base is tensors[j]
                                          for d, j in zip(descs, over)):
        raise TypeError("bind: each host TensorDescriptor must be made over one of the first n_tensors arguments "
                        "itself (not a view of it), named by its index in over=, in order: a replay rebases it "
                        "onto the tensor passed in that place")
    compiled, entry, device = _launch(kernel, grid, args, constexprs)
    return Bound(kernel, grid, n_tensors, args, constexprs, compiled, entry, device, tuple(over))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host. ``triton.cdiv`` does the same, but in Triton 3.6 it is a ConstexprFunction,
    and each call from Python goes through Triton's JIT wrapper (microseconds, several per attention call)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), for the host; see ``cdiv``."""
    return 1 << (n - 1).bit_length()


def clear() -> None:
    """Forget every remembered kernel (Triton's own cache keeps them compiled)."""
    _entries.clear()
