import numpy as np
import pytest

from minillm.train import PRESETS, load_corpus, lr_at, stdlib_files

torch = pytest.importorskip("torch")


def test_lr_at_warms_up_then_decays_to_floor():
    assert lr_at(0.0, 1.0) == 0.0
    assert lr_at(0.02, 1.0) == pytest.approx(1.0)
    assert lr_at(1.0, 1.0) == pytest.approx(0.1)
    xs = [lr_at(p, 1.0) for p in np.linspace(0.02, 1, 50)]
    assert all(a >= b for a, b in zip(xs, xs[1:]))


def test_load_corpus_split_is_stable_and_disjoint():
    a_train, a_val, info = load_corpus(limit_bytes=500_000)
    b_train, b_val, _ = load_corpus(limit_bytes=500_000)
    assert np.array_equal(a_train, b_train) and np.array_equal(a_val, b_val)
    assert info["files"] <= len(stdlib_files()) and a_val.size > 0 and a_train.max() <= 256


def test_train_loss_decreases_on_cpu():
    from minillm.model import ModelConfig
    from minillm.train import train

    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=64)
    params, meta, log = train(cfg, steps=60, batch=8, seq_len=64, lr=3e-3, device="cpu", max_minutes=None,
                              eval_every=30, seed=0, corpus_limit=300_000, progress=False)
    assert log["val_loss"][-1] < log["val_loss"][0] < 5.6
    assert set(params) == set(cfg.param_shapes()) and meta["steps"] == 60


def test_presets_draft_is_much_smaller():
    assert PRESETS["draft"].n_params() * 5 < PRESETS["tiny"].n_params()
