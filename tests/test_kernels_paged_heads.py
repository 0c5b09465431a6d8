"""The all-heads paged decode kernel (one TMA box per block for every KV head) against the NumPy reference."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from minillm.kernels import paged_heads as ph  # noqa: E402
from minillm.kernels.paged_attention import paged_attention  # noqa: E402
from minillm.kernels.paged_heads import heads_unsupported, paged_attention_heads  # noqa: E402
from minillm.paged.attention import paged_attention as paged_reference  # noqa: E402

from .test_kernels_paged_attention import dirty_past_the_ends, poisoned_pool, to_torch  # noqa: E402
from .test_paged_attention import random_paged  # noqa: E402


@pytest.mark.parametrize("host_desc", [False, True])
@pytest.mark.parametrize("hq,hkv,block_size,num_splits", [(8, 2, 16, 1), (8, 2, 16, 3), (8, 2, 8, 2), (4, 4, 4, 1),
                                                          (16, 8, 16, 2)])
def test_paged_attention_heads_matches_reference(hq, hkv, block_size, num_splits, host_desc, rng, monkeypatch):
    """GQA and MHA, one split and several, lengths of one token, a block's worth, across splits and ending inside
    a block: the reference's numbers and the v1 kernel's."""
    monkeypatch.setattr(ph, "HOST_DESCRIPTORS", host_desc)
    arrays = random_paged(rng, Hq=hq, Hkv=hkv, D=32, block_size=block_size, lens=(1, 13, 150, 64), B=4,
                          num_blocks=200 // block_size + 60)
    args = to_torch(arrays, torch.float32)
    got = paged_attention_heads(*args, num_splits=num_splits).cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(*arrays), atol=2e-5)
    np.testing.assert_allclose(got, paged_attention(*args).cpu().numpy(), atol=2e-5)


def test_paged_attention_heads_ignores_what_lies_past_a_sequence(rng):
    """Slots past a sequence's end in its last block may hold NaN and Inf: masked scores, zeroed values."""
    (q, kc, vc, table, lens), (dirty_k, dirty_v) = dirty_past_the_ends(rng)
    got = paged_attention_heads(*to_torch((q, dirty_k, dirty_v, table, lens), torch.float32)).cpu().numpy()
    np.testing.assert_allclose(got, paged_reference(q, kc, vc, table, lens), atol=2e-5)


@pytest.mark.parametrize("host_desc", [False, True])
def test_paged_attention_heads_never_reads_outside_the_pool(host_desc, rng, monkeypatch):
    """Table entries outside the pool (negative, past its end, past a sequence's end) are never read: finite output
    with NaN and Inf in a block no table names (block 0, where a clamped entry would land), and v1's numbers."""
    monkeypatch.setattr(ph, "HOST_DESCRIPTORS", host_desc)
    q, kc, vc, table, bad, lens = poisoned_pool(rng)
    args = to_torch((q, kc, vc, bad, lens), torch.float32)
    out = paged_attention_heads(*args, validate=False).cpu().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, paged_attention(*args, validate=False).cpu().numpy(), atol=2e-5)


def test_paged_attention_heads_rejects_what_it_cannot_read(rng):
    """A head-major pool (a permuted view), a box of more than 256 rows, a head dim TMA cannot box: clear errors."""
    q, kc, vc, table, lens = to_torch(random_paged(rng, Hq=4, Hkv=2, D=16, block_size=16, lens=(5, 40), B=2,
                                                   num_blocks=10), torch.float32)
    kh, vh = (c.transpose(1, 2).contiguous().transpose(1, 2) for c in (kc, vc))
    with pytest.raises(ValueError, match="not contiguous"):
        paged_attention_heads(q, kh, vh, table, lens)
    big = torch.zeros(4, 256, 2, 16)
    assert "512" in heads_unsupported(big, big)
    odd = torch.zeros(4, 16, 2, 24)
    assert "head dim 24" in heads_unsupported(odd, odd)
    with pytest.raises(ValueError, match="num_splits"):
        paged_attention_heads(q, kc, vc, table, lens, num_splits=0)


def test_heads_config_stages_by_shared_memory():
    """An H200 SM (228 KiB): 16 tokens x 8 heads at D=128, bf16 is 64 KiB a step, so 3 stages; 32 x 8 is 128 KiB,
    so 2; a step that cannot fit once raises."""
    assert ph.heads_config(16, 8, 128, 2, 228 * 1024) == (4, 3)
    assert ph.heads_config(32, 8, 128, 2, 228 * 1024) == (4, 2)
    with pytest.raises(ValueError, match="shared memory"):
        ph.heads_config(64, 8, 128, 2, 228 * 1024)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_attention_heads_gpu_matches_reference(dtype, rng):
    """Compiled, at the study's shape (GQA 32/8, D=128, 16-token blocks), split and not."""
    lens = tuple(int(x) for x in rng.integers(1, 3000, size=6))
    arrays = random_paged(rng, B=6, Hq=32, Hkv=8, D=128, block_size=16, lens=lens,
                          num_blocks=sum(-(-n // 16) for n in lens) + 8)
    args = to_torch(arrays, dtype)
    q, kc, vc, table, ln = (a.astype(np.float32).astype(np.float64) if a.dtype == np.float32 else a for a in arrays)
    if dtype == torch.bfloat16:
        q, kc, vc = (torch.from_numpy(x).to(dtype).double().numpy() for x in (q, kc, vc))
    else:
        q, kc, vc = (x.astype(np.float16).astype(np.float64) for x in (q, kc, vc))
    want = paged_reference(q, kc, vc, table, ln)
    for splits in (None, 1):
        got = paged_attention_heads(*args, num_splits=splits).double().cpu().numpy()
        np.testing.assert_allclose(got, want, atol=2e-2 if dtype == torch.bfloat16 else 4e-3)
