"""minillm/kernels/launch.py: the fast launch path must launch exactly what kernel[grid] would.

On CPU: the argument classes against Triton's own specialization function (no GPU needed), and the
interpreter path. On a GPU: outputs and gradients with the fast path equal, bit for bit, those with
it off, a repeated call skips the binder, and an argument in another class compiles its own kernel.
"""
import itertools
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")  # sets TRITON_INTERPRET on CPU before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from minillm.kernels import launch  # noqa: E402

if not triton.__version__.startswith(launch.CHECKED_TRITON):  # the fast path is off there; its internals differ
    pytest.skip(f"launch's fast path mirrors Triton {launch.CHECKED_TRITON}, not {triton.__version__}",
                allow_module_level=True)
from minillm.kernels.flash_attention import flash_attention  # noqa: E402
from minillm.kernels.softmax import softmax  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _triton_classes(values):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    return [native_specialize_impl(backend, a, False, True, True) for a in values]


def _arguments():
    buf = torch.empty(64)
    ints = [0, 1, 2, 3, 15, 16, 17, 32, 48, 1024, 1023, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
            -2**31, -2**31 - 1, 2**62, 2**63, 2**63 + 16, 2**64 - 1, -2**63]
    tensors = [buf, buf[1:], buf[4:], buf[3:], buf.to(torch.float16), buf.to(torch.float16)[8:],
               buf.to(torch.float16)[1:], buf.to(torch.bfloat16), buf.to(torch.int32), buf.to(torch.int64)[1:]]
    from triton.tools.tensor_descriptor import TensorDescriptor

    x, y = torch.zeros(64, 128, dtype=torch.bfloat16), torch.zeros(128, 128, dtype=torch.bfloat16)
    descs = [TensorDescriptor(x, [64, 128], [128, 1], [16, 128]), TensorDescriptor(y, [128, 128], [128, 1], [16, 128]),
             TensorDescriptor(x, [60, 128], [128, 1], [16, 128]), TensorDescriptor(x, [64, 128], [128, 1], [32, 128]),
             TensorDescriptor(x.half(), [64, 128], [128, 1], [16, 128]), TensorDescriptor(x[8:], [56, 128], [128, 1],
                                                                                         [16, 128]),
             TensorDescriptor(x.view(-1), [8192], [1], [64])]
    return ints + tensors + descs + [0.5, 1.0, 3.0, True, False, None]


def test_arg_classes_partition_like_triton():
    """Two arguments share a class exactly when Triton specializes them alike (checked on every pair)."""
    values = _arguments()
    ours = [launch._arg_class(a) for a in values]
    theirs = _triton_classes(values)
    for (i, a), (j, b) in itertools.combinations(enumerate(values), 2):
        assert (ours[i] == ours[j]) == (theirs[i] == theirs[j]), (repr(a)[:40], repr(b)[:40], theirs[i], theirs[j])


def test_bind_rejects_host_descriptors_over_unnamed_tensors():
    """A host TensorDescriptor holds one tensor's address: a Bound rebases it only onto the bound tensor ``over``
    names, so one not named, named wrongly, or made over a view (whose base is not the bound tensor) is refused."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    x, y = torch.zeros(16, 16), torch.zeros(16, 16)
    d = TensorDescriptor(x, [16, 16], [16, 1], [16, 16])
    for tensors, over in [((x,), ()), ((x, y), (1,)), ((x,), (1,)), ((x,), (0, 0))]:
        with pytest.raises(TypeError, match="TensorDescriptor"):
            launch.bind(None, (1,), len(tensors), *tensors, d, over=over)
    with pytest.raises(TypeError, match="TensorDescriptor"):
        launch.bind(None, (1,), 1, x, TensorDescriptor(x.view(256), [256], [1], [16]), over=(0,))


@triton.jit
def _twice_rows(X, Y, X_DESC, Y_DESC, BLOCK: tl.constexpr):
    """Y = 2 X, one (BLOCK, 16) tile per program, through host descriptors (X and Y only name the tensors)."""
    r = tl.program_id(0) * BLOCK
    Y_DESC.store([r, 0], X_DESC.load([r, 0]) * 2)


def _twice_descs(x, y):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor(x, list(x.shape), list(x.stride()), [16, 16]),
            TensorDescriptor(y, list(y.shape), list(y.stride()), [16, 16]))


def test_bind_rebases_host_descriptors_onto_each_calls_tensors():
    """A Bound with host descriptors, called with new tensors, reads and writes those (not the bound ones, which
    stay alive and unchanged), also when the bound call passed one tensor in both places (in place); a tensor
    of another shape in a descriptor's place is refused."""
    g = torch.Generator(device=DEVICE).manual_seed(3)
    x0 = torch.randn(64, 16, device=DEVICE, generator=g)
    y0 = torch.zeros_like(x0)
    b = launch.bind(_twice_rows, (4,), 2, x0, y0, *_twice_descs(x0, y0), over=(0, 1), BLOCK=16)
    torch.testing.assert_close(y0, 2 * x0, atol=0, rtol=0)
    assert (b.raw is not None) == (DEVICE == "cuda")  # compiled (Triton 3.6): through the C launcher itself
    x1, y1 = torch.randn(64, 16, device=DEVICE, generator=g), torch.zeros(64, 16, device=DEVICE)
    keep = y0.clone()
    b(x1, y1)
    torch.testing.assert_close(y1, 2 * x1, atol=0, rtol=0)
    assert torch.equal(y0, keep)
    with pytest.raises(ValueError, match="shape"):
        b(torch.randn(32, 16, device=DEVICE), torch.zeros(32, 16, device=DEVICE))

    z = torch.randn(64, 16, device=DEVICE, generator=g)
    dz = _twice_descs(z, z)
    inplace = launch.bind(_twice_rows, (4,), 2, z, z, *dz, over=(0, 1), BLOCK=16)
    x2, y2 = torch.randn(64, 16, device=DEVICE, generator=g), torch.zeros(64, 16, device=DEVICE)
    inplace(x2, y2)  # two tensors now: each descriptor follows its own place
    torch.testing.assert_close(y2, 2 * x2, atol=0, rtol=0)


def test_arg_class_rejects_unknown_types():
    with pytest.raises(TypeError, match="no fast launch"):
        launch._arg_class(np.int64(3))


def test_hooks_off_by_default_and_on_with_a_hook():
    """The fast path is taken only without launch hooks: Triton's default (empty chains) counts as none."""
    from triton import knobs

    assert launch.hooks_off()
    hook = knobs.runtime.launch_enter_hook

    def noop(_):
        return None
    if hasattr(hook, "add"):
        hook.add(noop)
        try:
            assert not launch.hooks_off()
        finally:
            hook.remove(noop)
        assert launch.hooks_off()


def test_host_cdiv_and_next_power_of_2_match_triton():
    import triton

    for a in range(1, 300):
        assert launch.next_power_of_2(a) == triton.next_power_of_2(a)
        for b in (1, 3, 16, 64, 128):
            assert launch.cdiv(a, b) == triton.cdiv(a, b)


def _toy_kernel(X, Y, n, scale, BLOCK: tl.constexpr, FLAG: tl.constexpr = False, MODE: tl.constexpr = 2):
    pass


def test_entry_tail_in_signature_order_with_defaults():
    """A later call passes the positional arguments, then every remaining parameter in signature order:
    the constexprs given by name and the defaults of those not given (options such as num_warps are not
    parameters and are left out)."""
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_toy_kernel)
    compiled = types.SimpleNamespace(run="run", function="fn", packed_metadata="meta")
    entry = launch._entry(kernel, compiled, 4, {"MODE": 3, "BLOCK": 64, "num_warps": 4})
    assert entry[:4] == ("run", "fn", "meta", (64, False, 3))


def test_entry_runtime_keyword_keeps_the_jit():
    """n passed by keyword (a runtime parameter) would be keyed by its value: the JIT path for such calls."""
    from triton.runtime.jit import JITFunction

    compiled = types.SimpleNamespace(run="run", function="fn", packed_metadata="meta")
    assert launch._entry(JITFunction(_toy_kernel), compiled, 2, {"n": 3, "scale": 1.0, "BLOCK": 16}) \
        is launch._JIT_ONLY


def test_arg_class_rejects_integers_past_64_bits():
    for a in (2**64, -2**63 - 1):
        with pytest.raises(TypeError, match="64 bits"):
            launch._arg_class(a)


def test_entry_positional_constexpr_keeps_the_jit():
    """BLOCK passed positionally would be classed by its type alone: such calls never take the fast path."""
    from triton.runtime.jit import JITFunction

    kernel = JITFunction(_toy_kernel)
    compiled = types.SimpleNamespace(run="run", function="fn", packed_metadata="meta")
    assert launch._entry(kernel, compiled, 5, {}) is launch._JIT_ONLY


def test_fast_launch_interpreter_goes_through_jit():
    if DEVICE == "cuda":
        pytest.skip("the interpreter path")
    before = dict(launch.stats)
    x = torch.randn(3, 40)
    np.testing.assert_allclose(softmax(x).numpy(), torch.softmax(x, -1).numpy(), atol=1e-6)
    assert launch.stats["slow"] == before["slow"] + 1 and launch.stats["fast"] == before["fast"]
    assert not launch._SUPPORTED


def _training(q, k, v, do, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = flash_attention(q, k, v, causal=causal)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,n", [(64, 256), (128, 384)])
def test_fast_launch_matches_jit_training_gpu(monkeypatch, d, n, causal):
    from minillm.kernels import flash_attention as fa

    monkeypatch.setattr(fa, "PLANS", False)  # fast_launch's own path (plans replay through Bound instead)
    g = torch.Generator(device="cuda").manual_seed(d + n)
    q, k, v, do = (torch.randn(2, 4, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    slow = _training(q, k, v, do, causal)
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    _training(q, k, v, do, causal)  # fills the entries
    before = dict(launch.stats)
    fast = _training(q, k, v, do, causal)
    assert launch.stats["fast"] >= before["fast"] + 3 and launch.stats["slow"] == before["slow"]
    for a, b in zip(slow, fast):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_fast_launch_new_class_compiles_its_own_gpu(monkeypatch):
    """A misaligned pointer (a view one element in) is another class: it launches through the JIT first."""
    from minillm.kernels import flash_attention as fa

    monkeypatch.setattr(fa, "PLANS", False)  # fast_launch's own path
    g = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randn(3 * 2 * 4 * 100 * 64 + 1, device="cuda", dtype=torch.float16, generator=g)
    aligned = buf[:-1].view(3, 2, 4, 100, 64)
    shifted = buf[1:].view(3, 2, 4, 100, 64)
    assert shifted.data_ptr() % 16 != 0
    for q, k, v in (aligned, shifted):  # fills the entry of each class: each through the JIT once
        before = dict(launch.stats), len(launch._entries)
        flash_attention(q, k, v)
        assert launch.stats["slow"] == before[0]["slow"] + 1 and len(launch._entries) == before[1] + 1
    before = dict(launch.stats)
    outs = [flash_attention(q, k, v) for q, k, v in (aligned, shifted)]
    assert launch.stats["fast"] == before["fast"] + 2 and launch.stats["slow"] == before["slow"]
    for (q, k, v), o in zip((aligned, shifted), outs):
        want = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / 8, -1) @ v.float()
        torch.testing.assert_close(o.float(), want, atol=2e-3, rtol=0)


@pytest.mark.gpu
def test_fast_launch_paged_decode_matches_jit_gpu(monkeypatch):
    from minillm.kernels.paged_attention import paged_attention

    g = torch.Generator(device="cuda").manual_seed(1)
    B, Hq, Hkv, D, bs, blocks = 3, 8, 2, 64, 16, 40
    q = torch.randn(B, Hq, D, device="cuda", dtype=torch.float16, generator=g)
    kc, vc = (torch.randn(blocks, bs, Hkv, D, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
    table = torch.randperm(blocks, device="cuda", generator=g)[: B * 12].view(B, 12).to(torch.int32)
    lens = torch.tensor([5, 100, 190], device="cuda", dtype=torch.int32)
    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    slow = paged_attention(q, kc, vc, table, lens)
    monkeypatch.setattr(launch, "FAST_LAUNCH", True)
    paged_attention(q, kc, vc, table, lens)
    before = launch.stats["fast"]
    assert torch.equal(paged_attention(q, kc, vc, table, lens), slow) and launch.stats["fast"] > before


def test_every_kernel_takes_runtime_parameters_then_constexprs():
    """The layout the fast path needs (positional runtime arguments, constexprs by name after them)."""
    from triton.runtime.jit import JITFunction

    from minillm.kernels import flash_attention, paged_attention, paged_prefill, softmax

    kernels = [getattr(m, n) for m in (flash_attention, paged_attention, paged_prefill, softmax) for n in dir(m)
               if type(getattr(m, n)).__name__ in ("InterpretedFunction", "JITFunction")
               and (n.endswith("kernel") or n.endswith("_tma") or n.startswith("_bwd_pre") or "_v2" in n)]
    launched = {k.__name__ if hasattr(k, "__name__") else k.fn.__name__ for k in kernels}
    assert {"_fwd_kernel", "_fwd_kernel_tma", "_bwd_kernel_v2", "_paged_decode_kernel", "_varlen_kernel",
            "_online_softmax_kernel"} <= launched
    for k in kernels:
        flags = [p.is_constexpr for p in JITFunction(k.fn).params]
        assert flags == sorted(flags), k.fn.__name__


def test_bind_rejects_tensors_past_n_tensors():
    from minillm.kernels.flash_attention import _bwd_preprocess_v2

    t = torch.empty(4)
    with pytest.raises(TypeError, match="tensors must come first"):
        launch.bind(_bwd_preprocess_v2, (1, 1), 2, t, t, t, 4, 1)
    with pytest.raises(TypeError, match="tensors must come first"):
        launch.bind(_bwd_preprocess_v2, (1, 1), 3, t, t, 4, 1)


def test_tensor_classes_match_arg_class():
    """Bound's inline class of a tensor is _arg_class's, for every tensor the partition test uses."""
    tensors = [a for a in _arguments() if isinstance(a, torch.Tensor)]
    assert launch.tensor_classes(tensors) == [launch._arg_class(t) for t in tensors]


def _preprocess_inputs(g, n=200, d=64, offset=0):
    """(O, dO, LSE) for the backward's preprocess kernel, O and dO ``offset`` elements into their buffers."""
    o, do = (torch.randn(2 * 3 * n * d + offset, device="cuda", dtype=torch.float16, generator=g)[offset:]
             .view(2, 3, n, d) for _ in range(2))
    return o, do, torch.randn(2, 3, n, device="cuda", generator=g)


def _preprocess(launcher, o, do, lse, *extra):
    from minillm.kernels.flash_attention import _bwd_preprocess_v2

    delta, lse2 = torch.empty_like(lse), torch.empty_like(lse)
    B, H, N, D = o.shape
    launcher(_bwd_preprocess_v2, (launch.cdiv(N, 64), B * H), *extra, o, do, lse, delta, lse2, N, H,
             *o.stride()[:3], *do.stride()[:3], HEAD_DIM=D, BLOCK_D=D, BLOCK_M=64)
    return delta, lse2


@pytest.mark.gpu
def test_bind_repeats_the_launch_with_new_tensors_gpu(monkeypatch):
    """A Bound called with other tensors of the bound class launches what fast_launch would, bit for bit,
    through the launcher alone; a misaligned tensor, or the fast path switched off, goes the long way."""
    g = torch.Generator(device="cuda").manual_seed(5)
    first, second = _preprocess_inputs(g), _preprocess_inputs(g)
    bound = []
    _preprocess(lambda *a, **kw: bound.append(launch.bind(*a, **kw)), *first, 5)
    b = bound[0]
    want = _preprocess(launch.fast_launch, *second)
    delta, lse2 = torch.empty_like(second[2]), torch.empty_like(second[2])
    before = dict(launch.stats)
    assert b(*second, delta, lse2) is b.compiled
    assert launch.stats["bound"] == before["bound"] + 1 and launch.stats["slow"] == before["slow"]
    assert torch.equal(delta, want[0]) and torch.equal(lse2, want[1])

    o, do, lse = _preprocess_inputs(g, offset=1)  # O and dO one element in: another class
    assert o.data_ptr() % 16 != 0
    want = (o.float() * do.float()).sum(-1)
    before = dict(launch.stats)
    b(o, do, lse, delta, lse2)
    assert launch.stats["bound"] == before["bound"]
    torch.testing.assert_close(delta, want, atol=1e-3, rtol=1e-3)

    monkeypatch.setattr(launch, "FAST_LAUNCH", False)
    before = dict(launch.stats)
    b(*second, delta, lse2)
    assert launch.stats["slow"] == before["slow"] + 1 and launch.stats["bound"] == before["bound"]


def _fake_cuda_launcher(monkeypatch, encodings):
    """A launcher built as Triton 3.6 builds a CudaLauncher (its ``launch`` the closure that Triton's
    ``wrap_handle_tensordesc`` makes) around a C launcher that records its arguments; descriptors encoded by a
    stand-in for ``make_tensordesc_arg`` (which needs a GPU) that records each encoding."""
    from triton.backends.nvidia import driver as nv

    def encode(desc, meta):
        encodings.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr(), tuple(desc.block_shape), meta["tag"]), *desc.shape, *desc.strides]
    monkeypatch.setattr(nv, "make_tensordesc_arg", encode)
    monkeypatch.setattr(launch, "make_tensordesc_arg", encode)
    monkeypatch.setattr(launch, "driver", types.SimpleNamespace(active=types.SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 7)))
    recorded = []
    signature = {"X": "*fp32", "Y": "*fp32", "n": "i32", "X_DESC": "tensordesc<fp32[16,16]>",
                 "Y_DESC": "tensordesc<fp32[16,16]>", "BLOCK": "constexpr"}
    CudaLauncher = type("CudaLauncher", (), {})  # (the name _unwrapped checks)
    run = CudaLauncher()
    run.launch = nv.wrap_handle_tensordesc(lambda *a: recorded.append(a), signature, [{"tag": "x"}, {"tag": "y"}])
    run.global_scratch_size = run.profile_scratch_size = 0
    run.launch_cooperative_grid, run.launch_pdl, run.num_ctas = False, True, 1
    run.global_scratch_align = run.profile_scratch_align = 1
    return run, recorded


def _raw_bound(run, x0, y0):
    """A Bound of ``_twice_rows``' signature over x0, y0 and their host descriptors, launching through ``run``."""
    return launch.Bound(None, (4,), 2, (x0, y0, 64, *_twice_descs(x0, y0)), {"BLOCK": 16}, None,
                        (run, "fn", "meta", (16,), None), 0, over=(0, 1))


def test_bound_raw_launch_passes_what_tritons_wrapper_would(monkeypatch):
    """A Bound with host descriptors calls the C launcher itself, with exactly the arguments Triton's own
    descriptor wrapper would pass for the same call (each descriptor as its encoding, shape and strides), and
    encodes a descriptor once per tensor address: a repeated call reuses it, a tensor elsewhere gets its own."""
    from triton.backends.nvidia import driver as nv

    encodings = []
    run, recorded = _fake_cuda_launcher(monkeypatch, encodings)
    x0, y0 = torch.zeros(64, 16), torch.zeros(64, 16)
    b = _raw_bound(run, x0, y0)
    assert b.raw is not None
    x1, y1 = torch.zeros(64, 16), torch.zeros(64, 16)
    b(x1, y1)
    ours = recorded.pop()
    d1 = b._rebase((x1, y1), b.scalars)  # what the wrapper gets: descriptors over this call's tensors
    nv.CudaLauncher.__call__(run, 4, 1, 1, 7, "fn", "meta", None, None, None, x1, y1, *d1, 16)  # Triton's own path
    assert ours == recorded.pop()
    assert ours[13] is x1 and ours[14] is y1 and ours[15] == 64 and ours[16] == ("map", x1.data_ptr(), (16, 16), "x")
    n = len(encodings)
    b(x1, y1)  # the same addresses: no encoding
    assert len(encodings) == n and recorded.pop() == ours
    y2 = torch.zeros(64, 16)
    b(x1, y2)  # a new address for Y only
    assert encodings[n:] == [y2.data_ptr()]
    with pytest.raises(ValueError, match="shape"):
        b(torch.zeros(32, 16), y2)


def test_bound_keeps_no_reference_to_the_bound_tensors():
    """A Bound made with host descriptors holds none of the first call's tensors (a plan would keep them alive, and
    an autograd output's graph with them): once the caller drops them they are freed, and later calls still work."""
    import gc
    import weakref

    x0 = torch.randn(64, 16, device=DEVICE)
    y0 = torch.zeros_like(x0)
    b = launch.bind(_twice_rows, (4,), 2, x0, y0, *_twice_descs(x0, y0), over=(0, 1), BLOCK=16)
    refs = [weakref.ref(x0), weakref.ref(y0)]
    del x0, y0
    gc.collect()
    assert all(r() is None for r in refs)
    x1, y1 = torch.randn(64, 16, device=DEVICE), torch.zeros(64, 16, device=DEVICE)
    b(x1, y1)
    torch.testing.assert_close(y1, 2 * x1, atol=0, rtol=0)


def test_bound_raw_launch_keeps_no_reference_to_any_calls_tensors(monkeypatch):
    """The same through the C-launcher path (a launcher built as Triton 3.6 builds one): neither the bound call's
    tensors nor a replayed call's stay referenced by the Bound once the caller drops them."""
    import gc
    import weakref

    run, recorded = _fake_cuda_launcher(monkeypatch, [])
    x0, y0 = torch.zeros(64, 16), torch.zeros(64, 16)
    b = _raw_bound(run, x0, y0)
    assert b.raw is not None
    x1, y1 = torch.zeros(64, 16), torch.zeros(64, 16)
    b(x1, y1)
    refs = [weakref.ref(t) for t in (x0, y0, x1, y1)]
    del x0, y0, x1, y1
    recorded.clear()  # (the fake launcher's record of the call holds them)
    gc.collect()
    assert all(r() is None for r in refs)


def test_bound_raw_launch_keeps_an_encoding_per_address_across_layers(monkeypatch):
    """One plan serves every layer of a model with the same shapes: cycling through 40 layers' tensors for three
    steps encodes each descriptor once per address; past DESC_CACHE addresses the oldest encoding is dropped."""
    encodings = []
    run, recorded = _fake_cuda_launcher(monkeypatch, encodings)
    x0, y0 = torch.zeros(64, 16), torch.zeros(64, 16)
    b = _raw_bound(run, x0, y0)
    layers = [(torch.zeros(64, 16), torch.zeros(64, 16)) for _ in range(40)]
    for _ in range(3):
        for x, y in layers:
            b(x, y)
    assert len(encodings) == 2 * len(layers) and len(recorded) == 3 * len(layers)
    monkeypatch.setattr(launch, "DESC_CACHE", 4)
    b.encoded = [{} for _ in b.descs]
    for x, y in layers[:6]:
        b(x, y)
    assert [list(c) for c in b.encoded] == [[x.data_ptr() for x, _ in layers[2:6]],  # the two oldest dropped
                                            [y.data_ptr() for _, y in layers[2:6]]]


def test_unwrapped_refuses_other_launchers(monkeypatch):
    """The C launcher is taken out of Triton's wrapper only when the wrapper is the one Triton 3.6 builds."""
    run, _ = _fake_cuda_launcher(monkeypatch, [])
    assert launch._unwrapped(run) is not None
    run.global_scratch_size = 128  # a kernel that needs scratch memory: Triton's wrapper allocates it
    assert launch._unwrapped(run) is None
    run.global_scratch_size = 0
    assert launch._unwrapped(types.SimpleNamespace(**vars(run))) is None  # not a CudaLauncher
    run.launch = lambda *a: None  # no closure
    assert launch._unwrapped(run) is None
