import numpy as np
import pytest

torch = pytest.importorskip("torch")

from minillm.attention import standard_attention  # noqa: E402
from minillm.decode import naive_decode  # noqa: E402
from minillm.decode import cached_decode  # noqa: E402
from minillm.torch_model import TorchDecodeAdapter, TorchModel, sdpa_attention  # noqa: E402

from .conftest import SMALL  # noqa: E402

# Stated tolerance: both forwards are float32; differences come only from summation order.
LOGIT_ATOL = 1e-4


def test_torchmodel_logits_match_numpy_reference(tiny_model, rng):
    runner = TorchDecodeAdapter(TorchModel.from_numpy(tiny_model.config, tiny_model.params), device="cpu")
    ids = rng.integers(0, 256, (2, 200))
    np.testing.assert_allclose(runner.forward(ids), tiny_model.forward(ids), atol=LOGIT_ATOL, rtol=0)


def test_torchmodel_state_dict_names_match_checkpoint(small_model):
    m = TorchModel.from_numpy(SMALL, small_model.params)
    assert set(m.state_dict()) == set(SMALL.param_shapes())
    back = m.numpy_params()
    assert all(np.array_equal(back[k], small_model.params[k]) for k in back)


@pytest.mark.parametrize("nq,nk", [(1, 7), (4, 4), (3, 9)])
def test_sdpa_attention_bottom_right_causal_matches_reference(nq, nk, rng):
    q = rng.normal(size=(1, 4, nq, 16)).astype(np.float32)
    k, v = rng.normal(size=(2, 1, 2, nk, 16)).astype(np.float32)
    got = sdpa_attention(*(torch.from_numpy(t) for t in (q, k, v)), causal=True).numpy()
    np.testing.assert_allclose(got, standard_attention(q, k, v, causal=True), atol=1e-5)


def test_torchrunner_cached_decode_matches_numpy(tiny_model):
    runner = TorchDecodeAdapter(TorchModel.from_numpy(tiny_model.config, tiny_model.params), device="cpu")
    prompt = list(b"import sys\n")
    assert cached_decode(runner, prompt, 40).tokens == cached_decode(tiny_model, prompt, 40).tokens
    assert naive_decode(runner, prompt, 10).tokens == naive_decode(tiny_model, prompt, 10).tokens


@pytest.mark.gpu
def test_torchrunner_cuda_greedy_matches_numpy(tiny_model):
    runner = TorchDecodeAdapter(TorchModel.from_numpy(tiny_model.config, tiny_model.params), device="cuda")
    prompt = list(b"def main():\n")
    assert cached_decode(runner, prompt, 64).tokens == cached_decode(tiny_model, prompt, 64).tokens
