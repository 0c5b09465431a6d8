"""minillm/kernels/paged_attention.py against the NumPy reference and against SDPA on the gathered cache."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")  # sets TRITON_INTERPRET on CPU before triton is imported

from minillm.kernels import INTERPRETED  # noqa: E402
from minillm.kernels import paged_attention as pa  # noqa: E402
from minillm.kernels.paged_attention import PagedConfig, paged_attention, paged_decode  # noqa: E402
from minillm.paged.attention import gather_kv, paged_attention as paged_reference  # noqa: E402

from .test_paged_attention import random_paged  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def to_torch(arrays, dtype):
    q, kc, vc, table, lens = arrays
    return [torch.from_numpy(x).to(DEVICE).to(dtype) for x in (q, kc, vc)] + \
           [torch.from_numpy(x).to(DEVICE) for x in (table, lens)]


@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_paged_attention_kernel_matches_reference(block_size, dtype, rng):
    arrays = random_paged(rng, Hq=8, Hkv=2, D=32, block_size=block_size, lens=(1, 13, 150), num_blocks=60)
    got = paged_attention(*to_torch(arrays, dtype)).double().cpu().numpy()
    q, kc, vc, table, lens = arrays
    want = paged_reference(q.astype(np.float64) if dtype == torch.float32 else q.astype(np.float16).astype(np.float64),
                           kc.astype(np.float16).astype(np.float64) if dtype == torch.float16 else kc.astype(np.float64),
                           vc.astype(np.float16).astype(np.float64) if dtype == torch.float16 else vc.astype(np.float64),
                           table, lens)
    np.testing.assert_allclose(got, want, atol=TOL[dtype])


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7])
def test_paged_attention_kernel_split_k_merge_is_exact(num_splits, rng):
    arrays = random_paged(rng, Hq=4, Hkv=1, D=16, block_size=16, lens=(200, 33), B=2, num_blocks=30)
    got = paged_attention(*to_torch(arrays, torch.float32), num_splits=num_splits).cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(*arrays), atol=2e-5)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (8, 2), (8, 1), (12, 4)])
def test_paged_attention_kernel_gqa_matches_sdpa_on_gathered_cache(hq, hkv, rng):
    arrays = random_paged(rng, Hq=hq, Hkv=hkv, D=64, block_size=16, lens=(5, 47), B=2, num_blocks=12)
    got = paged_attention(*to_torch(arrays, torch.float32))
    q, kc, vc, table, lens = arrays
    for b, n in enumerate(lens):
        k, v = (torch.from_numpy(t.transpose(1, 0, 2).copy())[None] for t in gather_kv(kc, vc, table, int(n), b))
        want = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q[b])[None, :, None], k, v,
                                                                enable_gqa=hq != hkv)
        torch.testing.assert_close(got[b].cpu(), want[0, :, 0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_attention_kernel_head_major_view_matches_contiguous_pool(num_splits, rng):
    """A pool stored (num_blocks, Hkv, block_size, D) -- one KV head's tokens of a block side by side -- and
    passed as its permuted (num_blocks, block_size, Hkv, D) view gives the contiguous pool's numbers: the
    kernel reads the block, slot and head strides it is given (no copy)."""
    q, kc, vc, table, lens = to_torch(random_paged(rng, Hq=8, Hkv=2, D=32, block_size=16, lens=(1, 13, 150),
                                                   num_blocks=60), torch.float32)
    kh, vh = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (kc, vc))
    assert kh.stride(1) == kh.shape[-1] and not kh.is_contiguous()
    want = paged_attention(q, kc, vc, table, lens, num_splits=num_splits)
    got = paged_attention(q, kh, vh, table, lens, num_splits=num_splits)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_paged_attention_kernel_strided_head_dim_matches_reference(rng):
    """Caches whose head dim is not contiguous are read correctly (copied first), not silently misread."""
    arrays = random_paged(rng, Hq=4, Hkv=2, D=16, block_size=8, lens=(9, 30), B=2, num_blocks=12)
    q, kc, vc, table, lens = to_torch(arrays, torch.float32)
    ks, vs = (c.transpose(2, 3).contiguous().transpose(2, 3) for c in (kc, vc))
    assert ks.stride(-1) != 1
    got = paged_attention(q, ks, vs, table, lens).double().cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(*arrays), atol=2e-5)


def test_paged_attention_kernel_bfloat16_upcast_in_interpreter(rng):
    arrays = random_paged(rng, D=32)
    out = paged_attention(*to_torch(arrays, torch.bfloat16))
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.double().cpu().numpy(), paged_reference(*arrays), atol=TOL[torch.bfloat16] * 3)


def test_paged_attention_kernel_rejects_out_of_pool_table(rng):
    q, kc, vc, table, lens = random_paged(rng)
    table[2, 0] = 10_000
    with pytest.raises(ValueError, match="outside the pool"):
        paged_attention(*to_torch((q, kc, vc, table, lens), torch.float32))


def test_paged_attention_kernel_rejects_mismatched_dtypes(rng):
    args = to_torch(random_paged(rng), torch.float32)
    args[1] = args[1].half()
    with pytest.raises(ValueError, match="dtype"):
        paged_attention(*args)


def test_paged_attention_kernel_unvalidated_matches_validated_with_wide_table(rng):
    """validate=False (no host sync) on a table far wider than the sequences: the extra splits are empty."""
    q, kc, vc, table, lens = random_paged(rng, lens=(1, 17, 40), num_blocks=20)
    wide = np.concatenate([table, np.zeros((table.shape[0], 9), np.int32)], axis=1)
    args = to_torch((q, kc, vc, wide, lens), torch.float32)
    fast = paged_attention(*args, validate=False, num_splits=4)
    np.testing.assert_array_equal(fast.cpu().numpy(), paged_attention(*args, num_splits=4).cpu().numpy())
    np.testing.assert_allclose(fast.cpu().numpy(), paged_reference(q, kc, vc, table, lens), atol=2e-5)


def test_paged_attention_kernel_unvalidated_never_reads_outside_the_pool(rng):
    q, kc, vc, table, lens = random_paged(rng, lens=(1, 17, 40), num_blocks=20)
    bad = table.copy()
    bad[2, 1] = 10_000_000  # far outside the pool: dereferencing it would fault or read garbage
    bad[1, 0] = -5
    out = paged_attention(*to_torch((q, kc, vc, bad, lens), torch.float32), validate=False).cpu().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], paged_reference(q, kc, vc, table, lens)[0], atol=2e-5)  # untouched row


@pytest.mark.parametrize("tile,block_size", [(64, 16), (32, 8), (16, 128), (128, 16)])
def test_paged_attention_kernel_tile_spans_blocks(tile, block_size, rng):
    """A loop step may cover several small blocks (read through the table token by token) or part of a big one."""
    arrays = random_paged(rng, Hq=4, Hkv=2, D=16, block_size=block_size, lens=(3, 70, 200), num_blocks=40)
    got = paged_attention(*to_torch(arrays, torch.float32), config=PagedConfig(tile=tile, num_splits=2)).cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(*arrays), atol=2e-5)


@pytest.mark.parametrize("block_size,num_splits", [(16, 1), (16, 3), (32, 2), (64, 1), (16, 7)])
def test_paged_attention_kernel_tma_loop_matches_pipelined_loop(block_size, num_splits, rng):
    """v3 (one block per step, copied by TMA; its descriptors built in the kernel or on the host) against v1
    with the same tile and the reference: lengths of one token, a block's worth, across splits and ending
    inside a block, so both the unmasked steps and the masked last one run."""
    arrays = random_paged(rng, Hq=8, Hkv=2, D=32, block_size=block_size, lens=(1, 13, 150, 64), B=4,
                          num_blocks=80)
    args = to_torch(arrays, torch.float32)
    v3, info = paged_decode(*args, config=PagedConfig(num_splits=num_splits, tma=True, tile=block_size))
    assert info.loop == "v3"
    v1, info = paged_decode(*args, config=PagedConfig(tile=block_size, num_splits=num_splits, tma=False))
    assert info.loop == "v1"
    v3, v1 = v3.cpu().numpy(), v1.cpu().numpy()
    np.testing.assert_allclose(v3, paged_reference(*arrays), atol=2e-5)
    if INTERPRETED:  # the same operations in the same order: the same numbers
        np.testing.assert_array_equal(v3, v1)
    else:
        np.testing.assert_allclose(v3, v1, atol=2e-5)


def test_paged_attention_kernel_tma_loop_reads_a_head_major_pool(rng):
    """v3 reads a (num_blocks, Hkv, block_size, D) pool through its permuted view: each block of one head is
    one box there too."""
    args = to_torch(random_paged(rng, Hq=8, Hkv=4, D=32, block_size=16, lens=(7, 100), B=2, num_blocks=20),
                    torch.float32)
    q, kc, vc, table, lens = args
    kh, vh = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (kc, vc))
    assert pa.tma_unsupported(kh, vh, 16) is None
    config = PagedConfig(num_splits=2, tma=True)
    got = paged_attention(q, kh, vh, table, lens, config=config)
    torch.testing.assert_close(got, paged_attention(q, kc, vc, table, lens, config=config), atol=0, rtol=0)


def dirty_past_the_ends(rng):
    """A clean paged case (16-token blocks) and its caches with NaN K and Inf V in every slot past a sequence's end
    in its last block: (q, kc, vc, table, lens), (dirty_k, dirty_v)."""
    q, kc, vc, table, lens = random_paged(rng, Hq=4, Hkv=2, D=16, block_size=16, lens=(5, 40), B=2, num_blocks=10)
    dirty_k, dirty_v = kc.copy(), vc.copy()
    for b, n in enumerate(lens):
        last = table[b, (n - 1) // 16]
        dirty_k[last, n % 16 or 16:] = np.nan
        dirty_v[last, n % 16 or 16:] = np.inf
    return (q, kc, vc, table, lens), (dirty_k, dirty_v)


def poisoned_pool(rng):
    """A paged case whose pool has a block 0 of NaN K and Inf V that no table entry names, and a copy of its table
    with entries outside the pool: inside sequence 2, at sequence 1's start (negative), and past sequence 0's one
    token. Returns (q, kc, vc, table, bad, lens)."""
    q, kc, vc, table, lens = random_paged(rng, lens=(1, 17, 40), num_blocks=20)
    kc = np.concatenate([np.full_like(kc[:1], np.nan), kc])
    vc = np.concatenate([np.full_like(vc[:1], np.inf), vc])
    table = table + 1
    bad = table.copy()
    bad[2, 1] = 10_000_000
    bad[1, 0] = -5
    bad[0, 1:] = 2**31 - 1
    return q, kc, vc, table, bad, lens


def test_paged_attention_kernel_tma_loop_ignores_what_lies_past_a_sequence(rng):
    """Slots past a sequence's end in its last block may hold anything, NaN included: v3 masks their scores
    and zeroes their values, so the output is the reference's."""
    (q, kc, vc, table, lens), (dirty_k, dirty_v) = dirty_past_the_ends(rng)
    got = paged_attention(*to_torch((q, dirty_k, dirty_v, table, lens), torch.float32), config=PagedConfig(tma=True)).cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(q, kc, vc, table, lens), atol=2e-5)


def test_paged_attention_kernel_tma_loop_never_reads_outside_the_pool(rng):
    """An entry outside the pool, inside or past a sequence, is never dereferenced (its box lies past the
    descriptor, and its scores are masked): finite numbers even with NaN and Inf in a block no table uses (block
    0, where a clamped entry would land), the untouched sequence's right ones, and v1's numbers for the others."""
    q, kc, vc, table, bad, lens = poisoned_pool(rng)
    args = to_torch((q, kc, vc, bad, lens), torch.float32)
    out = paged_attention(*args, validate=False, config=PagedConfig(tma=True)).cpu().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], paged_reference(q, kc, vc, table, lens)[0], atol=2e-5)
    # the bad blocks inside sequences 1 and 2 weigh nothing, as in v1 (which masks them token by token)
    v1 = paged_attention(*args, validate=False, config=PagedConfig(tma=False, tile=16)).cpu().numpy()
    np.testing.assert_allclose(out, v1, atol=2e-5)


def test_paged_attention_kernel_tma_rejects_a_head_outermost_pool(rng):
    """A pool stored (Hkv, num_blocks, block_size, D) and passed as its permuted view has rows one slot apart, but
    a head's block lies outside its block's rows: tma=True raises, and the default reads it with v1, correctly."""
    arrays = random_paged(rng, Hq=4, Hkv=2, D=16, block_size=16, lens=(5, 40), B=2, num_blocks=10)
    q, kc, vc, table, lens = to_torch(arrays, torch.float32)
    kh, vh = (c.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for c in (kc, vc))
    assert "inside its block" in pa.tma_unsupported(kh, vh, 16)
    with pytest.raises(ValueError, match="inside its block"):
        paged_attention(q, kh, vh, table, lens, config=PagedConfig(tma=True))
    np.testing.assert_allclose(paged_attention(q, kh, vh, table, lens).cpu().numpy(), paged_reference(*arrays),
                               atol=2e-5)


@pytest.mark.parametrize("shape,why", [((10, 8, 2, 16), "block size 8"), ((10, 16, 2, 24), "head dim 24")])
def test_paged_attention_kernel_tma_rejects_what_it_cannot_read(shape, why, rng):
    """tma=True on caches TMA cannot read raises and says why; the default (tma=None) runs v1 there."""
    nb, bs, hkv, d = shape
    arrays = random_paged(rng, Hq=4, Hkv=hkv, D=d, block_size=bs, lens=(5, 30), B=2, num_blocks=nb)
    args = to_torch(arrays, torch.float32)
    with pytest.raises(ValueError, match=why):
        paged_attention(*args, config=PagedConfig(tma=True))
    out, info = paged_decode(*args)
    np.testing.assert_allclose(out.cpu().numpy(), paged_reference(*arrays), atol=2e-5)
    assert info.loop == "v1"


@pytest.mark.parametrize("batch,block_size,stages", [(16, 128, 3), (32, 128, 2), (32, 64, 3), (16, 64, 3),
                                                     (64, 64, 2), (64, 16, 3)])
def test_tma_config_fewer_stages_only_where_all_programs_then_fit(batch, block_size, stages):
    """On an H200 (132 SMs, 228 KiB of shared memory each), bf16, Hkv=8, D=128: 3 stages unless the programs need
    more than one wave there (B=32 with 128-token blocks: two programs of 136 KiB per SM do not fit)."""
    assert pa.tma_config(batch, 8, 132, block_size, 128, 2, 228 * 1024) == (pa.TMA_CONFIG[0], stages)


@pytest.mark.parametrize("tile,max_len,want", [(128, 1024, 1), (128, 16384, 1), (64, 1024, 1), (64, 4096, 2)])
def test_tma_splits_from_the_study(tile, max_len, want):
    assert pa.tma_splits(tile, max_len) == want


@pytest.mark.parametrize("knob,why", [({"tile": 48}, "tile"), ({"num_warps": 3}, "num_warps"),
                                      ({"num_warps": 0}, "num_warps"), ({"num_stages": 0}, "num_stages"),
                                      ({"tma": "yes"}, "tma must be"), ({"num_splits": 0}, "num_splits")])
def test_paged_config_rejects_bad_knobs(knob, why):
    with pytest.raises(ValueError, match=why):
        PagedConfig(**knob)


def test_paged_attention_kernel_tma_step_is_one_block(rng):
    args = to_torch(random_paged(rng, lens=(5, 30), B=2, block_size=16), torch.float32)
    with pytest.raises(ValueError, match="one block"):
        paged_attention(*args, config=PagedConfig(tma=True, tile=32))


@pytest.mark.parametrize("num_warps,num_stages", [(None, None), (2, 1), (8, 4)])
def test_paged_attention_kernel_launch_knobs_keep_results(num_warps, num_stages, rng):
    """num_warps / num_stages change how the compiled kernel runs (the interpreter ignores them), never what it returns."""
    arrays = random_paged(rng, Hq=8, Hkv=2, D=32, block_size=16, lens=(5, 90), B=2, num_blocks=20)
    got = paged_attention(*to_torch(arrays, torch.float16), config=PagedConfig(num_warps=num_warps, num_stages=num_stages))
    want = paged_attention(*to_torch(arrays, torch.float16))
    np.testing.assert_allclose(got.double().cpu().numpy(), want.double().cpu().numpy(), atol=TOL[torch.float16])


def test_decode_config_is_within_2_percent_of_the_best_swept_config():
    """Against the recorded H200 sweep (warps x stages at each batch and length): the configuration the
    table picks for every swept (B, L) runs within 2% of the fastest one there."""
    from minillm.book import load_result

    rows = [r for r in load_result("paged_h200.json", "paged_decode_study")["rows"] if r.get("part") == "sweep" and r.get("tbps")]
    points = sorted({(r["B"], r["L"]) for r in rows})
    assert len(points) >= 9
    for B, L in points:
        at = {(r["num_warps"], r["num_stages"]): r["tbps"] for r in rows if (r["B"], r["L"]) == (B, L)}
        chosen = pa.decode_config(B, 8, L)
        assert chosen in at, (B, L, chosen)
        assert at[chosen] >= 0.98 * max(at.values()), (B, L, chosen, at)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_paged_attention_kernel_empty_sequences_give_nan(num_splits, rng):
    """seq_len 0 (only without the host check): 0 / 0 from the merge, and the other rows are untouched."""
    q, kc, vc, table, lens = random_paged(rng, B=4, lens=(0, 17, 0, 40), num_blocks=12)
    args = to_torch((q, kc, vc, table, lens), torch.float32)
    got = paged_attention(*args, validate=False, num_splits=num_splits).double().cpu().numpy()
    assert np.isnan(got[[0, 2]]).all()
    keep = [1, 3]
    np.testing.assert_allclose(got[keep], paged_reference(q[keep], kc, vc, table[keep], lens[keep]), atol=2e-5)


@pytest.mark.parametrize("batch,hkv,block_size,want", [(16, 8, 128, True), (16, 8, 64, True), (9, 8, 64, True),
                                                       (16, 8, 16, False), (8, 8, 128, False), (17, 8, 128, True),
                                                       (32, 8, 64, True), (33, 8, 128, True), (34, 8, 128, False),
                                                       (64, 8, 128, False), (1, 8, 128, False)])
def test_tma_rule_one_program_per_sm_with_big_blocks(batch, hkv, block_size, want):
    """The default's rule on a 132-SM GPU: v3 where batch * Hkv alone fills more than half the SMs and at most
    twice all of them, with blocks of 64 tokens or more; never in the interpreter."""
    assert pa.tma_rule(batch, hkv, block_size, 132) is want
    if INTERPRETED:
        assert pa.prefers_tma(batch, hkv, block_size, "cpu") is False


def test_paged_attention_num_splits_is_the_config_field(rng):
    arrays = random_paged(rng, Hq=4, Hkv=1, D=16, block_size=16, lens=(200, 33), B=2, num_blocks=30)
    args = to_torch(arrays, torch.float32)
    _, info = paged_decode(*args, config=PagedConfig(num_splits=3, tile=16))
    assert info.splits == 3
    torch.testing.assert_close(paged_attention(*args, num_splits=3, config=PagedConfig(tile=16)),
                               paged_attention(*args, config=PagedConfig(num_splits=3, tile=16)), atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_attention_kernel_gpu_tolerance_rule(dtype, tma, rng):
    """Compiled, bf16/fp16, both decode loops: error vs float64 <= 2x (+eps) that of SDPA's same-precision
    math on the gathered cache."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    arrays = random_paged(rng, B=3, Hq=32, Hkv=8, D=128, block_size=16, lens=(1, 300, 1000), num_blocks=200)
    q, kc, vc, table, lens = arrays
    got = paged_attention(*to_torch(arrays, dtype), config=PagedConfig(tma=tma)).double().cpu().numpy()
    tq, tk, tv = (torch.from_numpy(t.astype(np.float64)).to(dtype).double().numpy() for t in (q, kc, vc))
    want = paged_reference(tq, tk, tv, table, lens)
    err_math = 0.0
    for b, n in enumerate(lens):
        k, v = (torch.from_numpy(t.transpose(1, 0, 2).copy())[None].to(DEVICE, dtype)
                for t in gather_kv(tk, tv, table, int(n), b))
        qb = torch.from_numpy(tq[b])[None, :, None].to(DEVICE, dtype)
        with sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qb, k, v, enable_gqa=True)
        err_math = max(err_math, float(np.abs(o[0, :, 0].double().cpu().numpy() - want[b]).max()))
    assert np.abs(got - want).max() <= 2 * err_math + 1e-3, (np.abs(got - want).max(), err_math)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_paged_attention_kernel_gpu_default_runs_tma_with_one_program_per_kv_head(rng):
    """Compiled: with a batch whose B * Hkv fills more than half the SMs (up to twice all of them) and 64-token
    blocks, the default runs v3 and matches the reference; tma=False on the same call runs v1, and so do an
    explicit tile and a batch past twice the SMs."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    hkv = 4

    def case(batch):
        lens = tuple(int(x) for x in rng.integers(1, 300, size=batch))
        return random_paged(rng, B=batch, Hq=8, Hkv=hkv, D=64, block_size=64, lens=lens,
                            num_blocks=sum(-(-n // 64) for n in lens) + 4)

    for batch, config, loop in ((sms // hkv, None, "v3"), (sms // hkv, PagedConfig(tma=False), "v1"),
                                (sms // hkv, PagedConfig(tile=64), "v1"), (2 * sms // hkv, None, "v3"),
                                (2 * sms // hkv + 1, None, "v1")):
        arrays = case(batch)
        got, info = paged_decode(*to_torch(arrays, torch.float16), config=config)
        assert info.loop == loop
        q, kc, vc, table, ln = (a.astype(np.float16).astype(np.float64) if a.dtype == np.float32 else a
                                for a in arrays)
        np.testing.assert_allclose(got.double().cpu().numpy(), paged_reference(q, kc, vc, table, ln),
                                   atol=TOL[torch.float16])
