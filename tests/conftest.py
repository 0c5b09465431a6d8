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
