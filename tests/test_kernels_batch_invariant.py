"""minillm/kernels/batch_invariant.py: each row's bits are the same alone and inside any batch (torch.equal),
in the interpreter on CPU (fp32, fp16) and compiled on a GPU (bf16, marked gpu); agreement with the NumPy
references of minillm.batch_invariant; and the default kernels' batch dependence the mode removes."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")  # sets TRITON_INTERPRET on CPU before triton is imported

from minillm import batch_invariant as ref  # noqa: E402
from minillm.kernels.batch_invariant import attention_bi, attention_config, matmul_bi, rmsnorm_bi  # noqa: E402
from minillm.paged.attention import paged_varlen_attention  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CPU_DTYPES = [torch.float32, torch.float16]


def _rows(rng, n, k, dtype, scale=1.0):
    return torch.from_numpy(rng.normal(scale=scale, size=(n, k)).astype(np.float32)).to(DEVICE, dtype)


def _assert_row_invariant(fn, rows, row, batches):
    """fn(rows[row:row+1]) equals, bit for bit, the same row's output inside each batch (a list of (others_before,
    others_after) tensors)."""
    alone = fn(rows[row:row + 1])[0]
    for before, after in batches:
        batch = torch.cat([before, rows[row:row + 1], after])
        got = fn(batch)[before.shape[0]]
        assert torch.equal(got, alone), f"row differs at position {before.shape[0]} of a batch of {batch.shape[0]}"


def _batches(rng, k, dtype, sizes, scale=1.0):
    """(before, after) pairs: batches of these sizes with the row at the start, the end and in between."""
    out = []
    for n in sizes:
        others = _rows(rng, n - 1, k, dtype, scale)
        for at in sorted({0, (n - 1) // 2, n - 1}):
            out.append((others[:at], others[at:]))
    return out


# ---- matmul -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("k,n", [(64, 48), (100, 70)])
def test_matmul_bi_row_is_the_same_in_every_batch(dtype, k, n, rng):
    """Batch sizes 2..40 span one to three 16-row tiles; K 100 and N 70 leave ragged last tiles."""
    x = _rows(rng, 5, k, dtype)
    w = _rows(rng, k, n, dtype, scale=k ** -0.5)
    _assert_row_invariant(lambda a: matmul_bi(a, w), x, 2, _batches(rng, k, dtype, [2, 7, 17, 40]))


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_matmul_bi_matches_the_reference(dtype, rng):
    x = _rows(rng, 23, 130, dtype)
    w = _rows(rng, 130, 50, dtype, scale=130 ** -0.5)
    want = ref.matmul_reference(x.float().cpu().numpy(), w.float().cpu().numpy())
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    np.testing.assert_allclose(matmul_bi(x, w).float().cpu().numpy(), want, atol=tol, rtol=tol)


def test_matmul_bi_rejects_bad_inputs():
    with pytest.raises(ValueError, match="x must be"):
        matmul_bi(torch.zeros(3, 4, device=DEVICE), torch.zeros(5, 2, device=DEVICE))
    with pytest.raises(ValueError, match="share one dtype"):
        matmul_bi(torch.zeros(3, 4, device=DEVICE), torch.zeros(4, 2, device=DEVICE, dtype=torch.float16))
    assert matmul_bi(torch.zeros(0, 4, device=DEVICE), torch.zeros(4, 2, device=DEVICE)).shape == (0, 2)


# ---- RMSNorm ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("d", [64, 96])
def test_rmsnorm_bi_row_is_the_same_in_every_batch(dtype, d, rng):
    x = _rows(rng, 4, d, dtype, scale=3.0)
    w = _rows(rng, 1, d, dtype)[0]
    _assert_row_invariant(lambda a: rmsnorm_bi(a, w, 1e-5), x, 1, _batches(rng, d, dtype, [2, 9, 33], scale=3.0))


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_rmsnorm_bi_matches_the_reference_and_the_model(dtype, rng):
    from minillm.torch_model import rms_norm

    x = _rows(rng, 11, 96, dtype, scale=2.0)
    w = _rows(rng, 1, 96, dtype)[0]
    got = rmsnorm_bi(x, w, 1e-5)
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    np.testing.assert_allclose(got.float().cpu().numpy(),
                               ref.rmsnorm_reference(x.cpu().numpy(), w.cpu().numpy(), 1e-5).astype(np.float32),
                               atol=tol, rtol=tol)
    np.testing.assert_allclose(got.float().cpu().numpy(), rms_norm(x, w, 1e-5).float().cpu().numpy(), atol=tol, rtol=tol)
    assert rmsnorm_bi(x.reshape(1, 11, 96), w, 1e-5).shape == (1, 11, 96)


# ---- attention --------------------------------------------------------------------------------------------
class Pool:
    """A paged pool of random K/V; each sequence owns a list of scattered blocks."""

    def __init__(self, rng, num_blocks=80, block_size=8, hq=4, hkv=2, d=16, dtype=torch.float32):
        self.rng, self.bs, self.hq, self.hkv, self.d, self.dtype = rng, block_size, hq, hkv, d, dtype
        shape = (num_blocks, block_size, hkv, d)
        self.k = torch.from_numpy(rng.normal(size=shape).astype(np.float32)).to(DEVICE, dtype)
        self.v = torch.from_numpy(rng.normal(size=shape).astype(np.float32)).to(DEVICE, dtype)
        self.free = list(rng.permutation(num_blocks))

    def seq(self, ctx, q_len, blocks=None):
        """A sequence of ``ctx`` tokens whose last ``q_len`` are new: (blocks, ctx, q rows)."""
        need = -(-ctx // self.bs)
        blocks = blocks if blocks is not None else [int(self.free.pop()) for _ in range(need)]
        q = torch.from_numpy(self.rng.normal(size=(q_len, self.hq, self.d)).astype(np.float32)).to(DEVICE, self.dtype)
        return dict(blocks=blocks, ctx=ctx, q=q)

    def run(self, seqs, width=None, **kw):
        """attention_bi on the ragged batch of ``seqs``; tables ``width`` blocks wide (default: the longest)."""
        width = width or max(len(s["blocks"]) for s in seqs)
        tables = torch.zeros((len(seqs), width), dtype=torch.int32)
        for i, s in enumerate(seqs):
            tables[i, :len(s["blocks"])] = torch.tensor(s["blocks"], dtype=torch.int32)
        qlens = [s["q"].shape[0] for s in seqs]
        cu = torch.tensor(np.concatenate([[0], np.cumsum(qlens)]), dtype=torch.int32)
        lens = torch.tensor([s["ctx"] for s in seqs], dtype=torch.int32)
        args = (torch.cat([s["q"] for s in seqs]), self.k, self.v, tables.to(DEVICE), lens.to(DEVICE), cu.to(DEVICE))
        fn = kw.pop("fn", attention_bi)
        return fn(*args, **kw), cu.tolist(), args


def _target_rows(pool, target, others, at, width=None, **kw):
    seqs = others[:at] + [target] + others[at:]
    out, cu, _ = pool.run(seqs, width, **kw)
    return out[cu[at]:cu[at + 1]]


@pytest.mark.parametrize("dtype", CPU_DTYPES)
@pytest.mark.parametrize("q_len,ctx", [(1, 45), (4, 45), (13, 29), (1, 3)])
def test_attention_bi_rows_are_the_same_in_every_batch(dtype, q_len, ctx, rng):
    """A decode (1 new token), a verify-like chunk (4), a prefill chunk (13, starting inside a block) and a
    short decode, alone and among other sequences of every kind, at the start, middle and end of the batch,
    with tables of different widths (so the number of fixed-size splits differs too)."""
    pool = Pool(rng, dtype=dtype)
    target = pool.seq(ctx, q_len)
    alone = _target_rows(pool, target, [], 0)
    compositions = [
        [pool.seq(9, 1)],
        [pool.seq(70, 1), pool.seq(20, 20), pool.seq(33, 5)],
        [pool.seq(c, q) for c, q in [(2, 1), (41, 7), (16, 1), (64, 2)]],
    ]
    for i, others in enumerate(compositions):
        for at in sorted({0, len(others) // 2, len(others)}):
            width = (None, 12)[(i + at) % 2]
            got = _target_rows(pool, target, others, at, width)
            assert torch.equal(got, alone), f"differs among {len(others)} others at {at}, width {width}"


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_attention_bi_decode_verify_and_prefill_rows_agree_bitwise(dtype, rng):
    """The token at position p computed as a decode (1 new token), as the last row of a verify chunk, as a middle
    row of a longer chunk and as a row of the whole prompt: one path, one arithmetic, the same bits."""
    pool = Pool(rng, dtype=dtype)
    n = 50
    seq = pool.seq(n, 1)
    blocks = seq["blocks"]
    q_all = torch.from_numpy(rng.normal(size=(n, pool.hq, pool.d)).astype(np.float32)).to(DEVICE, dtype)
    p = 37
    results = []
    for first, ctx in [(p, p + 1), (p - 3, p + 1), (p - 10, p + 6), (0, n)]:   # rows first..ctx-1 are new
        s = dict(blocks=blocks, ctx=ctx, q=q_all[first:ctx])
        out, cu, _ = pool.run([pool.seq(12, 3), s], width=8)
        results.append(out[cu[1] + p - first])
    for r in results[1:]:
        assert torch.equal(r, results[0])


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_attention_bi_matches_the_references(dtype, rng):
    pool = Pool(rng, dtype=dtype)
    seqs = [pool.seq(c, q) for c, q in [(45, 1), (29, 13), (3, 1), (64, 4)]]
    out, cu, args = pool.run(seqs)
    as_np = [a.float().cpu().numpy() if a.is_floating_point() else a.cpu().numpy() for a in args]
    _, split, *_ = attention_config(dtype, pool.hq // pool.hkv)
    tol = 2e-5 if dtype == torch.float32 else 3e-3
    got = out.float().cpu().numpy()
    np.testing.assert_allclose(got, ref.attention_reference(*as_np, split_size=split), atol=tol)
    np.testing.assert_allclose(got, paged_varlen_attention(*as_np), atol=tol)


def test_attention_bi_without_validation_and_bad_input(rng):
    pool = Pool(rng)
    seqs = [pool.seq(c, q) for c, q in [(45, 1), (29, 13)]]
    checked, _, args = pool.run(seqs)
    unchecked = attention_bi(*args, validate=False)
    assert torch.equal(checked, unchecked)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        attention_bi(*args, max_seqlen_q=2)


# ---- the defaults this replaces ---------------------------------------------------------------------------
def test_default_decode_kernel_changes_bits_with_its_batch_dependent_split_count(rng):
    """The paged decode kernel's default cuts a sequence's keys into a COUNT of splits chosen from the batch
    (more splits for a smaller batch, to fill the SMs). On an H100-sized GPU (132 SMs) that is a different count
    alone and in a batch of 64, and the same row, run with the two counts, gives different bits (here in the
    interpreter, fp32, where the count is otherwise 1)."""
    from minillm.kernels.paged_attention import paged_attention

    pool = Pool(rng, num_blocks=100, block_size=16, hq=8, hkv=2, d=32)
    s = pool.seq(500, 1)
    alone_splits = ref.gpu_split_count(1, 2, 512, 132)
    batch_splits = ref.gpu_split_count(64, 2, 512, 132)
    assert alone_splits != batch_splits
    (_, _, args) = pool.run([s])
    q, kc, vc, tables, lens, _ = args
    a = paged_attention(q, kc, vc, tables, lens, num_splits=alone_splits)
    b = paged_attention(q, kc, vc, tables, lens, num_splits=batch_splits)
    assert not torch.equal(a, b)
    torch.testing.assert_close(a, b)            # equal up to rounding, not bit for bit
    # the batch-invariant kernel: one answer, alone or among 15 other decodes
    others = [pool.seq(int(c), 1) for c in rng.integers(1, 60, size=15)]
    assert torch.equal(_target_rows(pool, s, [], 0), _target_rows(pool, s, others, 7))


# ---- compiled, bf16 ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k,n", [(256, 384), (2048, 5632)])
def test_gpu_matmul_bi_row_is_the_same_in_every_batch(dtype, k, n, rng):
    x = _rows(rng, 3, k, dtype)
    w = _rows(rng, k, n, dtype, scale=k ** -0.5)
    _assert_row_invariant(lambda a: matmul_bi(a, w), x, 1, _batches(rng, k, dtype, [2, 3, 16, 63, 64, 129, 512, 2048]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("d", [256, 2048])
def test_gpu_rmsnorm_bi_row_is_the_same_in_every_batch(dtype, d, rng):
    x = _rows(rng, 3, d, dtype, scale=3.0)
    w = _rows(rng, 1, d, dtype)[0]
    _assert_row_invariant(lambda a: rmsnorm_bi(a, w, 1e-5), x, 1,
                          _batches(rng, d, dtype, [2, 7, 64, 513, 4096], scale=3.0))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("q_len,ctx", [(1, 3000), (5, 3000), (200, 1500), (1, 17)])
def test_gpu_attention_bi_rows_are_the_same_in_every_batch(dtype, q_len, ctx, rng):
    # room for every sequence below at once: 63 contexts of up to 2,000 tokens and six more (< 5,000 blocks)
    pool = Pool(rng, num_blocks=8192, block_size=16, hq=32, hkv=8, d=128, dtype=dtype)
    target = pool.seq(ctx, q_len)
    alone = _target_rows(pool, target, [], 0)
    for others in ([pool.seq(int(c), 1) for c in rng.integers(1, 2000, size=63)],
                   [pool.seq(700, 300), pool.seq(2500, 1), pool.seq(900, 6)],
                   [pool.seq(int(c), q) for c, q in [(40, 40), (3000, 4), (12, 1)]]):
        for at in (0, len(others)):
            for width in (None, 256):
                assert torch.equal(_target_rows(pool, target, others, at, width), alone)
                assert torch.equal(_target_rows(pool, target, others, at, width, validate=False), alone)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_attention_bi_decode_verify_and_prefill_rows_agree_bitwise(dtype, rng):
    pool = Pool(rng, num_blocks=400, block_size=16, hq=32, hkv=8, d=128, dtype=dtype)
    n, p = 2100, 2050
    seq = pool.seq(n, 1)
    q_all = torch.from_numpy(rng.normal(size=(n, pool.hq, pool.d)).astype(np.float32)).to(DEVICE, dtype)
    results = []
    for first, ctx in [(p, p + 1), (p - 7, p + 1), (p - 300, p + 40), (0, n)]:
        s = dict(blocks=seq["blocks"], ctx=ctx, q=q_all[first:ctx])
        out, cu, _ = pool.run([pool.seq(100, 3), s], width=140)
        results.append(out[cu[1] + p - first])
    for r in results[1:]:
        assert torch.equal(r, results[0])


@pytest.mark.gpu
def test_gpu_default_matmul_is_not_batch_invariant(rng):
    """cuBLAS picks its kernel (tiles, split-K) by M: for some shape and batch size a row's bits change (the
    issue's matmul by M). float32 outputs show every bit (a bf16 output can round a different sum back to the
    same value: on an H100, bf16 at K = N = 2048 gave the same bits for all these M)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    changed = []
    for dtype in (torch.float32, torch.bfloat16):
        for k, n in ((8192, 1024), (4096, 128), (2048, 2048)):
            x = _rows(rng, 1, k, dtype)
            w = _rows(rng, k, n, dtype, scale=k ** -0.5)
            alone = (x @ w)[0]
            changed += [(dtype, k, n, m) for m in (2, 3, 16, 64, 256, 1024, 4096)
                        if not torch.equal((torch.cat([x, _rows(rng, m - 1, k, dtype)]) @ w)[0], alone)]
    assert changed, "cuBLAS gave every row the same bits at every M tried"


_POSITION_DEPENDENT_MATMUL = """
import numpy as np
rng = np.random.default_rng(0)
a, b = rng.normal(size=(16, 64)).astype(np.float32), rng.normal(size=(64, 48)).astype(np.float32)
rows = []
for pos in range(16):
    m = a.copy()
    m[pos] = a[0]
    rows.append(np.matmul(m, b)[pos])
print(any(not np.array_equal(rows[0], r) for r in rows))
"""


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's path (on a GPU the kernels are compiled)")
def test_matmul_bi_row_is_the_same_under_openblas_haswell_kernels():
    """OpenBLAS's Haswell sgemm kernel (the one it picks on, e.g., an AVX-512 AMD EPYC) computes a row differently
    by its place in a 16-row product, so a kernel whose interpreted tl.dot is NumPy's matmul is not row-invariant
    there; the row tests failed on such CPUs. Here they run with that kernel forced, on any CPU that can run it,
    after checking that the kernel really is position-dependent (else the test could not fail)."""
    import os
    import subprocess
    import sys

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as features
    if not (features.get("AVX2") and features.get("FMA3")):
        pytest.skip("this CPU cannot run OpenBLAS's Haswell kernels")
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_NUM_THREADS": "1"}
    premise = subprocess.run([sys.executable, "-c", _POSITION_DEPENDENT_MATMUL], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
    if premise != "True":
        pytest.skip("this NumPy's OpenBLAS computes rows alike whatever their place: nothing to guard against")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                          "matmul_bi_row_is_the_same_in_every_batch or decode_verify_and_prefill_rows_agree"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
