import numpy as np
import pytest

from minillm.attention import standard_attention
from minillm.paged.attention import gather_kv, paged_attention


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
