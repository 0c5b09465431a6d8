import numpy as np
import pytest

from minillm.decode import cached_decode
from minillm.paged.model_cache import PagedModelCache
from minillm.paged.allocator import OutOfBlocks
from minillm.tokenizer import ByteTokenizer

from .conftest import SMALL

PROMPTS = ["import os\n", "class Node:\n    def __init__(self, value):\n"]


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_paged_model_cache_greedy_matches_contiguous_cache(tiny_model, prompt, block_size):
    ids = ByteTokenizer().encode(prompt)
    cache = PagedModelCache.allocate(tiny_model.config, num_blocks=64, block_size=block_size)
    paged = cached_decode(tiny_model, ids, 40, cache=cache)
    contiguous = cached_decode(tiny_model, ids, 40)
    assert paged.tokens == contiguous.tokens
    np.testing.assert_allclose(np.stack(paged.logits), np.stack(contiguous.logits), atol=1e-4)
    assert len(cache.tables[0]) == -(-(len(ids) + 39) // block_size)  # grew only on block boundaries


def test_paged_model_cache_release_returns_every_block(small_model):
    cache = PagedModelCache.allocate(SMALL, num_blocks=8, block_size=4)
    cached_decode(small_model, [1, 2, 3], 10, cache=cache)
    assert cache.allocator.num_free == 8 - 3
    cache.release()
    assert cache.allocator.num_free == 8 and cache.length == 0


def test_paged_model_cache_out_of_blocks_is_clear_and_changes_nothing(small_model):
    cache = PagedModelCache.allocate(SMALL, num_blocks=2, block_size=4)
    with pytest.raises(OutOfBlocks, match="blocks needed"):
        cached_decode(small_model, [1] * 9, 2, cache=cache)
    assert cache.allocator.num_free == 2 and cache.length == 0


@pytest.mark.parametrize("n", [-1, 1.5, True, "2"])
def test_paged_model_cache_advance_rejects_anything_but_a_count(n):
    cache = PagedModelCache.allocate(SMALL, num_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="advance"):
        cache.advance(n)
    assert cache.length == 0


def test_paged_model_cache_rejects_mismatched_pools():
    from minillm.paged.allocator import BlockAllocator

    with pytest.raises(ValueError, match="pools"):
        PagedModelCache(np.zeros((1, 2, 4, 1, 8)), np.zeros((1, 3, 4, 1, 8)), BlockAllocator(2, 4))


def test_paged_model_cache_with_triton_kernels_matches_numpy(tiny_model):
    torch = pytest.importorskip("torch")
    pytest.importorskip("minillm.kernels")
    from minillm.kernels.flash_attention import flash_attention
    from minillm.kernels.paged_attention import paged_attention
    from minillm.paged.allocator import BlockAllocator
    from minillm.torch_model import TorchDecodeAdapter, TorchModel

    cfg = tiny_model.config
    device = "cuda" if torch.cuda.is_available() else "cpu"
    runner = TorchDecodeAdapter(TorchModel.from_numpy(cfg, tiny_model.params), device=device)
    shape = (cfg.n_layers, 16, 16, cfg.n_kv_heads, cfg.d_head)
    cache = PagedModelCache(torch.zeros(shape, device=device), torch.zeros(shape, device=device), BlockAllocator(16, 16),
                            paged_fn=paged_attention, dense_fn=flash_attention,
                            index=lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device))
    ids = ByteTokenizer().encode("def main():\n")
    assert cached_decode(runner, ids, 24, cache=cache).tokens == cached_decode(tiny_model, ids, 24).tokens
