import numpy as np
import pytest

from minillm.attention import standard_attention
from minillm.paged.attention import gather_kv, paged_attention, paged_varlen_attention


def random_paged(rng, B=3, Hq=8, Hkv=2, D=16, block_size=16, lens=(1, 17, 40), num_blocks=20, dtype=np.float32):
    """A pool with each sequence's blocks scattered at random physical positions."""
    max_blocks = max(-(-n // block_size) for n in lens) + 1
    perm = rng.permutation(num_blocks)
    table = np.zeros((B, max_blocks), np.int32)
    used = 0
    for b, n in enumerate(lens):
        k = -(-n // block_size)
        table[b, :k] = perm[used:used + k]
        used += k
    kc = rng.normal(size=(num_blocks, block_size, Hkv, D)).astype(dtype)
    vc = rng.normal(size=(num_blocks, block_size, Hkv, D)).astype(dtype)
    q = rng.normal(size=(B, Hq, D)).astype(dtype)
    return q, kc, vc, table, np.array(lens, np.int32)


@pytest.mark.parametrize("block_size", [8, 16, 32, 128])
def test_paged_attention_matches_contiguous_attention(block_size, rng):
    q, kc, vc, table, lens = random_paged(rng, block_size=block_size, lens=(1, 9, 130), num_blocks=40)
    out = paged_attention(q, kc, vc, table, lens)
    for b, n in enumerate(lens):
        k, v = gather_kv(kc, vc, table, int(n), b)
        want = standard_attention(q[b][None, :, None], k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None])
        np.testing.assert_allclose(out[b], want[0, :, 0], atol=1e-6)


def test_gather_kv_follows_block_table(rng):
    _, kc, vc, table, lens = random_paged(rng, block_size=4, lens=(6,), B=1)
    k, _ = gather_kv(kc, vc, table, 6, 0)
    np.testing.assert_array_equal(k[5], kc[table[0, 1], 1])


@pytest.mark.parametrize("mutate,match", [
    (lambda a: a.__setitem__(3, np.array([[0, 99, 0]], np.int32).repeat(3, 0)), "outside the pool"),
    (lambda a: a.__setitem__(4, np.array([1, 17, 400], np.int32)), "table covers"),
    (lambda a: a.__setitem__(4, np.array([0, 17, 40], np.int32)), ">= 1"),
    (lambda a: a.__setitem__(3, a[3].astype(np.int64)), "int32"),
    (lambda a: a.__setitem__(0, a[0].astype(np.float16)), "share a dtype"),
    (lambda a: a.__setitem__(0, a[0][:, :3]), "multiple"),
])
def test_paged_attention_rejects_bad_input(mutate, match, rng):
    args = list(random_paged(rng))
    mutate(args)
    with pytest.raises(ValueError, match=match):
        paged_attention(*args)


# -- paged_varlen_attention: ragged prefill chunks and decodes ---------------------------------------------

def _ragged_case(rng, qlens, ctx, block_size=4, hq=4, hkv=2, d=8, dtype=np.float32):
    """A pool holding S sequences in scattered blocks; returns the kernel inputs and the contiguous K/V."""
    S = len(qlens)
    need = [-(-c // block_size) for c in ctx]
    nb = sum(need) + 3
    perm = rng.permutation(nb)
    k_cache = rng.normal(size=(nb, block_size, hkv, d)).astype(dtype)
    v_cache = rng.normal(size=(nb, block_size, hkv, d)).astype(dtype)
    tables = np.zeros((S, max(need)), np.int32)
    at = 0
    for s in range(S):
        tables[s, :need[s]] = perm[at:at + need[s]]
        at += need[s]
    cu = np.concatenate([[0], np.cumsum(qlens)]).astype(np.int32)
    q = rng.normal(size=(int(cu[-1]), hq, d)).astype(dtype)
    return q, k_cache, v_cache, tables, np.asarray(ctx, np.int32), cu


@pytest.mark.parametrize("qlens,ctx,bs", [([1, 1, 1], [5, 9, 1], 4), ([7, 1, 3], [7, 12, 20], 4),
                                          ([5, 13], [9, 13], 8), ([1, 16, 2], [33, 40, 2], 16)])
def test_paged_varlen_attention_matches_causal_attention_per_sequence(rng, qlens, ctx, bs):
    q, kc, vc, tables, lens, cu = _ragged_case(rng, qlens, ctx, block_size=bs)
    out = paged_varlen_attention(q, kc, vc, tables, lens, cu)
    for s in range(len(qlens)):
        k, v = gather_kv(kc, vc, tables, ctx[s], s)
        qs = q[cu[s]:cu[s + 1]]
        # queries sit at the end of the context: causal with Nq <= Nk is bottom-right aligned
        ref = standard_attention(qs.transpose(1, 0, 2)[None], k.transpose(1, 0, 2)[None],
                                 v.transpose(1, 0, 2)[None], causal=True)[0].transpose(1, 0, 2)
        np.testing.assert_allclose(out[cu[s]:cu[s + 1]], ref, rtol=1e-5, atol=1e-5)


def test_paged_varlen_attention_with_one_token_each_is_decode_attention(rng):
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [1, 1, 1, 1], [3, 8, 17, 1])
    np.testing.assert_allclose(paged_varlen_attention(q, kc, vc, tables, lens, cu),
                               paged_attention(q, kc, vc, tables, lens), rtol=1e-6, atol=1e-6)


# bad ragged batches, as mutations of _ragged_case(rng, [1, 1, 2], [4, 8, 2]); the Triton kernel's test reuses them
BAD_BATCHES = [
    (lambda a: a.update(cu=np.array([0, 2, 1, 4], np.int32)), "cu_seqlens_q must rise"),
    (lambda a: a.update(cu=np.array([0, 1, 2, 5], np.int32)), "cu_seqlens_q must rise"),
    (lambda a: a.update(lens=np.array([4, 8, 1], np.int32)), "context of only"),
    (lambda a: a.update(cu=np.array([0, 1, 2, 4], np.int64)), "int32"),
    (lambda a: a.update(tables=a["tables"] + 100), "outside the pool"),
    (lambda a: a.update(q=a["q"][:2]), "every sequence needs"),
    (lambda a: a.update(lens=np.array([4, 8, 200], np.int32)), "table covers"),
    (lambda a: a.update(q=a["q"][:, :3]), "multiple"),
]


@pytest.mark.parametrize("mutate,match", BAD_BATCHES)
def test_paged_varlen_attention_rejects_bad_batches(rng, mutate, match):
    q, kc, vc, tables, lens, cu = _ragged_case(rng, [1, 1, 2], [4, 8, 2])
    a = dict(q=q, tables=tables, lens=lens, cu=cu)
    mutate(a)
    with pytest.raises(ValueError, match=match):
        paged_varlen_attention(a["q"], kc, vc, a["tables"], a["lens"], a["cu"])


@pytest.mark.parametrize("which,name", [(0, "q"), (1, "k_cache"), (2, "v_cache")])
def test_paged_attention_rejects_non_floating_dtypes(which, name, rng):
    """All-integer inputs used to pass (they share a dtype) and return an integer output, silently."""
    q, kc, vc, table, lens = random_paged(rng)
    ints = [np.rint(a * 4).astype(np.int64) for a in (q, kc, vc)]
    with pytest.raises(ValueError, match="q must have a floating-point dtype, got int64"):
        paged_attention(*ints, table, lens)
    args = [q, kc, vc]
    args[which] = ints[which]
    with pytest.raises(ValueError, match=f"{name} must have a floating-point dtype"):
        paged_attention(*args, table, lens)


def test_paged_varlen_attention_rejects_non_floating_dtypes(rng):
    q, kc, vc, table, lens = random_paged(rng, lens=(3, 5, 9))
    cu = np.array([0, 1, 2, 3], np.int32)
    ints = [np.rint(a * 4).astype(np.int32) for a in (q, kc, vc)]
    with pytest.raises(ValueError, match="q must have a floating-point dtype, got int32"):
        paged_varlen_attention(*ints, table, lens, cu)
