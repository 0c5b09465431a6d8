"""minillm/kernels/paged_prefill.py against the NumPy reference minillm.paged.attention.paged_varlen_attention."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")  # sets TRITON_INTERPRET on CPU before triton is imported

from minillm.kernels.paged_prefill import paged_varlen_attention  # noqa: E402
from minillm.paged.attention import gather_kv, paged_attention as decode_reference  # noqa: E402
from minillm.paged.attention import paged_varlen_attention as reference  # noqa: E402

from .test_paged_attention import BAD_BATCHES, _ragged_case  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# max |kernel - float64 reference on the same (rounded) inputs|; fp16 rounds P to fp16 before P @ V
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# a mixed batch: a decode, an odd prefill chunk whose start (37) falls inside a block, a decode
# deep in its context, a first chunk (whole prompt, context = q_len), a chunk of 2 starting at 7
MIXED = dict(qlens=[1, 13, 1, 5, 2], ctx=[9, 50, 70, 5, 9])


def to_torch(arrays, dtype=torch.float32):
    q, kc, vc, tables, lens, cu = arrays
    return [torch.from_numpy(x).to(DEVICE).to(dtype) for x in (q, kc, vc)] + \
           [torch.from_numpy(x).to(DEVICE) for x in (tables, lens, cu)]


def expected(arrays, dtype=torch.float32):
    """The float64 reference on the inputs as the kernel sees them (rounded to dtype)."""
    q, kc, vc, tables, lens, cu = arrays
    seen = [torch.from_numpy(x).to(dtype).double().numpy() for x in (q, kc, vc)]
    return reference(*seen, tables, lens, cu)


def run(arrays, dtype=torch.float32, **kw):
    return paged_varlen_attention(*to_torch(arrays, dtype), **kw).double().cpu().numpy()


@pytest.mark.parametrize("block_size", [8, 16, 32, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_varlen_attention_mixed_batch_matches_reference(block_size, dtype, rng):
    arrays = _ragged_case(rng, **MIXED, block_size=block_size, hq=8, hkv=2, d=32)
    np.testing.assert_allclose(run(arrays, dtype), expected(arrays, dtype), atol=TOL[dtype])


@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (8, 2), (12, 4), (16, 1)])
def test_paged_varlen_attention_gqa_ratios(hq, hkv, rng):
    """Group sizes 1, 2, 4, 3 (not a power of two: rows of the tile go unused) and 16 (one token per tile)."""
    arrays = _ragged_case(rng, [3, 1, 11], [3, 20, 27], block_size=8, hq=hq, hkv=hkv, d=16)
    np.testing.assert_allclose(run(arrays), expected(arrays), atol=TOL[torch.float32])


@pytest.mark.parametrize("d", [16, 24, 64, 128])
def test_paged_varlen_attention_head_dims(d, rng):
    """Powers of two 16..128, and 24, padded to 32 inside the kernel."""
    arrays = _ragged_case(rng, [1, 6], [17, 21], block_size=16, hq=4, hkv=2, d=d)
    np.testing.assert_allclose(run(arrays), expected(arrays), atol=TOL[torch.float32])


@pytest.mark.parametrize("qlens,ctx,bs", [([1, 1, 1], [5, 9, 1], 8), ([7, 1, 3], [7, 12, 20], 8),
                                          ([5, 13], [9, 13], 8), ([1, 16, 2], [33, 40, 2], 16),
                                          ([17], [61], 16), ([31, 33], [40, 33], 32)])
def test_paged_varlen_attention_chunk_shapes(qlens, ctx, bs, rng):
    """The reference tests' batches, and chunks longer than one query tile starting mid-block."""
    arrays = _ragged_case(rng, qlens, ctx, block_size=bs, hq=2, hkv=1, d=16)
    np.testing.assert_allclose(run(arrays), expected(arrays), atol=TOL[torch.float32])


@pytest.mark.parametrize("config", [(16, 16, 1, 1), (32, 16, 1, 1), (16, 64, 1, 1), (64, 32, 1, 1)])
def test_paged_varlen_attention_tiles_span_pages(config, rng):
    """A key tile may cover several 8-token pages or part of a 128-token one; query tiles of 4..32 tokens."""
    for bs in (8, 128):
        arrays = _ragged_case(rng, [1, 21, 9], [30, 150, 9], block_size=bs, hq=4, hkv=2, d=16)
        np.testing.assert_allclose(run(arrays, config=config), expected(arrays), atol=TOL[torch.float32])


def test_paged_varlen_attention_with_one_token_each_is_decode_attention(rng):
    q, kc, vc, tables, lens, cu = arrays = _ragged_case(rng, [1, 1, 1, 1], [3, 8, 17, 1], block_size=8, d=16)
    np.testing.assert_allclose(run(arrays), decode_reference(q, kc, vc, tables, lens), atol=TOL[torch.float32])


def test_paged_varlen_attention_ignores_nans_in_unwritten_slots(rng):
    """Slots past a sequence's context and blocks no table uses hold NaN (as a torch.empty pool may):
    the masked tiles must not load them, since 0 * NaN = NaN."""
    q, kc, vc, tables, lens, cu = arrays = _ragged_case(rng, **MIXED, block_size=16, d=16)
    bs = kc.shape[1]
    written = np.zeros(kc.shape[:2], bool)
    for s, n in enumerate(lens):
        for pos in range(n):
            written[tables[s, pos // bs], pos % bs] = True
    kc[~written] = np.nan
    vc[~written] = np.nan
    got = run(arrays)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, reference(q, kc, vc, tables, lens, cu), atol=TOL[torch.float32])


def test_paged_varlen_attention_bfloat16_upcast_in_interpreter(rng):
    arrays = _ragged_case(rng, **MIXED, block_size=16, d=16)
    out = paged_varlen_attention(*to_torch(arrays, torch.bfloat16))
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.double().cpu().numpy(), expected(arrays, torch.bfloat16),
                               atol=TOL[torch.bfloat16])


def test_paged_varlen_attention_scale(rng):
    q, kc, vc, tables, lens, cu = arrays = _ragged_case(rng, [2, 1], [5, 9], d=16)
    np.testing.assert_allclose(run(arrays, scale=0.3), reference(q, kc, vc, tables, lens, cu, scale=0.3), atol=2e-5)


@pytest.mark.parametrize("mutate,match", BAD_BATCHES)   # the NumPy reference's cases
def test_paged_varlen_attention_rejects_bad_batches(mutate, match, rng):
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [1, 1, 2], [4, 8, 2])
    a = dict(q=q, tables=tables, lens=lens, cu=cu)
    mutate(a)
    with pytest.raises(ValueError, match=match):
        reference(a["q"], kc, vc, a["tables"], a["lens"], a["cu"])  # the same error as the reference
    with pytest.raises(ValueError, match=match):
        paged_varlen_attention(*to_torch((a["q"], kc, vc, a["tables"], a["lens"], a["cu"])))


def test_paged_varlen_attention_rejects_mismatched_dtypes_and_numpy(rng):
    args = to_torch(_ragged_case(rng, [1, 2], [4, 8]))
    args[1] = args[1].half()
    with pytest.raises(ValueError, match="dtype"):
        paged_varlen_attention(*args)
    with pytest.raises(TypeError, match="torch.Tensor"):
        paged_varlen_attention(*_ragged_case(rng, [1, 2], [4, 8]))


def test_paged_varlen_attention_max_seqlen_q(rng):
    arrays = _ragged_case(rng, **MIXED, block_size=8, d=16)
    args = to_torch(arrays)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        paged_varlen_attention(*args, max_seqlen_q=12)  # the longest chunk has 13
    np.testing.assert_array_equal(paged_varlen_attention(*args, max_seqlen_q=40).cpu().numpy(),
                                  paged_varlen_attention(*args).cpu().numpy())  # extra programs do nothing


def test_paged_varlen_attention_unvalidated_matches_validated_with_wide_table(rng):
    """validate=False reads nothing back: the grid is sized by T - S + 1 and a wide table's padding is never read."""
    q, kc, vc, tables, lens, cu = _ragged_case(rng, **MIXED, block_size=8, d=16)
    wide = np.concatenate([tables, np.full((tables.shape[0], 5), -1, np.int32)], axis=1)
    args = to_torch((q, kc, vc, wide, lens, cu))
    fast = paged_varlen_attention(*args, validate=False)
    np.testing.assert_array_equal(fast.cpu().numpy(), paged_varlen_attention(*args).cpu().numpy())
    np.testing.assert_array_equal(fast.cpu().numpy(),
                                  paged_varlen_attention(*args, validate=False, max_seqlen_q=13).cpu().numpy())
    np.testing.assert_allclose(fast.cpu().numpy(), reference(q, kc, vc, tables, lens, cu), atol=2e-5)


def test_paged_varlen_attention_unvalidated_never_reads_outside_the_pool(rng):
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [1, 4, 3], [1, 17, 30], block_size=8, d=16)
    bad = tables.copy()
    bad[2, 1] = 10_000_000  # far outside the pool: dereferencing it would fault or read garbage
    bad[1, 0] = -5
    bad_lens = lens.copy()
    bad_lens[1] = 1_000  # past what the table can address
    out = run((q, kc, vc, bad, bad_lens, cu), validate=False)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], reference(q, kc, vc, tables, lens, cu)[0], atol=2e-5)  # untouched row


# -- compiled, on a GPU --------------------------------------------------------------------------------------

def _large_case(rng, block_size=16):
    """Decodes deep in long contexts, a 1000-token first chunk, and chunks starting mid-block."""
    return _ragged_case(rng, [1, 1000, 1, 77, 300, 1], [1, 1000, 2000, 500, 333, 4097], block_size=block_size,
                        hq=32, hkv=8, d=128)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block_size", [16, 128])
def test_paged_varlen_attention_gpu_float32_matches_reference(block_size, rng):
    arrays = _large_case(rng, block_size)
    np.testing.assert_allclose(run(arrays), expected(arrays), atol=1e-4)
    np.testing.assert_array_equal(run(arrays, validate=False, max_seqlen_q=1000), run(arrays))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_varlen_attention_gpu_tolerance_rule(dtype, rng):
    """Compiled, bf16/fp16: error vs float64 <= 2x (+eps) that of SDPA's same-precision math on the gathered cache."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arrays = _large_case(rng)
    q, kc, vc, tables, lens, cu = arrays
    got = run(arrays, dtype)
    want = expected(arrays, dtype)
    err_kernel = np.abs(got - want).max()
    tq, tk, tv = (torch.from_numpy(t).to(dtype).double().numpy() for t in (q, kc, vc))  # as the kernel saw them
    err_math = 0.0
    for s, n in enumerate(lens):
        lo, hi = int(cu[s]), int(cu[s + 1])
        k, v = (torch.from_numpy(t.transpose(1, 0, 2).copy())[None].to(DEVICE, dtype)
                for t in gather_kv(tk, tv, tables, int(n), s))
        qs = torch.from_numpy(tq[lo:hi].transpose(1, 0, 2).copy())[None].to(DEVICE, dtype)
        mask = (torch.arange(n)[None, :] <= (n - (hi - lo) + torch.arange(hi - lo))[:, None]).to(DEVICE)
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qs, k, v, attn_mask=mask,
                                                                 enable_gqa=True)
        err_math = max(err_math, float(np.abs(o[0].transpose(0, 1).double().cpu().numpy() - want[lo:hi]).max()))
    assert err_kernel <= 2 * err_math + 1e-3, (err_kernel, err_math)
