import sys

import numpy as np
import pytest

from minillm.model import Model, ModelConfig, init_params


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_plans():
    """flash_attention's launch plans cache the host's decisions per call key: every test starts and ends
    without any, so that a test that patches a decision sees it made (nothing to do where the module is not
    imported: it is only imported with torch and triton)."""
    fa = sys.modules.get("minillm.kernels.flash_attention")
    if fa is not None:
        fa.clear_plans()
    yield
    fa = sys.modules.get("minillm.kernels.flash_attention")
    if fa is not None:
        fa.clear_plans()


SMALL = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=128)


@pytest.fixture(scope="session")
def small_model() -> Model:
    """A random-weight model: fast, and enough to test every mechanism."""
    return Model(SMALL, init_params(SMALL, seed=3))


@pytest.fixture(scope="session")
def tiny_model() -> Model:
    """The shipped, trained checkpoint."""
    from minillm import load_model

    return load_model("tiny")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
