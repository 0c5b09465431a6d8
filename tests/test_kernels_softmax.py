"""minillm/kernels/softmax.py against the NumPy reference (interpreter on CPU, compiled on GPU)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")  # sets TRITON_INTERPRET on CPU before triton is imported

from minillm.kernels.softmax import softmax  # noqa: E402
from minillm.softmax import safe_softmax  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (4, 1000), (2, 3, 33)])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def test_softmax_matches_numpy_reference(shape, dtype, atol):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 5).to(dtype)
    got = softmax(x.to(DEVICE), block=16).cpu().double().numpy()
    np.testing.assert_allclose(got, safe_softmax(x.double().numpy()), atol=atol)


def test_softmax_rows_wider_than_one_tile_and_large_logits():
    x = torch.randn(2, 300, generator=torch.Generator().manual_seed(1)) * 100
    x[1, :150] = float("-inf")  # a partly masked row
    got = softmax(x.to(DEVICE), block=32).cpu().numpy()
    np.testing.assert_allclose(got, safe_softmax(x.numpy()), atol=1e-6)
    assert np.isfinite(got).all()


def test_softmax_fully_masked_row_is_zero():
    x = torch.full((1, 40), float("-inf"))
    assert softmax(x.to(DEVICE), block=16).abs().sum().item() == 0


@pytest.mark.gpu
def test_softmax_bfloat16_on_gpu():
    x = torch.randn(64, 5000, device="cuda", dtype=torch.bfloat16) * 4
    ref = torch.softmax(x.double(), dim=-1)
    assert (softmax(x).double() - ref).abs().max().item() < 1e-2


@pytest.mark.parametrize("bad,exc", [(np.zeros(3), TypeError), (torch.zeros(3, dtype=torch.int32), ValueError),
                                     (torch.zeros(2, 0), ValueError)])
def test_softmax_rejects_bad_input(bad, exc):
    with pytest.raises(exc):
        softmax(bad)
