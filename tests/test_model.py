import json
import re

import numpy as np
import pytest

from minillm.model import (
    WEIGHTS_DIR, CheckpointError, Model, ModelConfig, StepOps, apply_rope, init_params, load_checkpoint, load_model,
    load_training_log, rope_tables, save_checkpoint,
)
from minillm.tokenizer import ByteTokenizer

from .conftest import SMALL


def test_modelconfig_rejects_kv_heads_not_dividing_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        ModelConfig(n_heads=8, n_kv_heads=3)


def test_modelconfig_rejects_nonpositive_sizes():
    with pytest.raises(ValueError, match="n_layers"):
        ModelConfig(n_layers=0)


def test_model_rejects_wrong_param_shapes():
    params = init_params(SMALL)
    params["layers.0.wq"] = params["layers.0.wq"][:, :-1]
    with pytest.raises(ValueError, match="layers.0.wq"):
        Model(SMALL, params)


def test_rope_preserves_norm_and_is_relative(rng):
    x = rng.normal(size=(1, 1, 6, 8)).astype(np.float32)
    cos, sin = rope_tables(np.arange(6), 8, 10000.0)
    y = apply_rope(x, cos, sin)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # q.k after RoPE depends only on the distance between positions
    q, k = rng.normal(size=(2, 8)).astype(np.float32)
    def dot(i, j):
        c, s = rope_tables(np.array([i, j]), 8, 10000.0)
        r = apply_rope(np.stack([q, k])[None, None], c, s)[0, 0]
        return r[0] @ r[1]
    assert dot(7, 3) == pytest.approx(dot(14, 10), rel=1e-4)


def test_forward_is_causal(small_model, rng):
    ids = rng.integers(0, 256, 20)
    a = small_model.forward(ids)
    b = small_model.forward(np.concatenate([ids[:10], rng.integers(0, 256, 10)]))
    np.testing.assert_allclose(a[:10], b[:10], atol=1e-6)  # the future cannot leak into the past


def test_forward_batched_equals_unbatched(small_model, rng):
    ids = rng.integers(0, 256, (3, 12))
    batched = small_model.forward(ids)
    for i in range(3):
        np.testing.assert_allclose(batched[i], small_model.forward(ids[i]), atol=1e-5)


def test_forward_counts_ops_from_shapes(small_model):
    ops = StepOps()
    small_model.forward(np.arange(10), ops=ops)
    cfg = SMALL
    assert ops.attn_rows == 10
    assert ops.score_elements == cfg.n_layers * cfg.n_heads * 10 * 10
    n_matmul_params = cfg.n_params() - cfg.vocab_size * cfg.d_model - (2 * cfg.n_layers + 1) * cfg.d_model
    assert ops.proj_flops == 2 * 10 * n_matmul_params


def test_forward_return_hidden_is_the_normed_state_before_lm_head(small_model, rng):
    ids = rng.integers(0, 256, (2, 9))
    logits, hidden = small_model.forward(ids, return_hidden=True)
    assert hidden.shape == (2, 9, SMALL.d_model)
    np.testing.assert_array_equal(logits, small_model.forward(ids))          # the logits do not change
    np.testing.assert_array_equal(hidden @ small_model.params["lm_head"], logits)
    # the final RMSNorm is applied: with its all-ones weight each row's RMS is 1, less the eps (small activations)
    rms = np.sqrt(np.mean(hidden ** 2, axis=-1))
    assert np.all((rms > 0.9) & (rms <= 1.0 + 1e-5))
    # on a cache, and unbatched: the rows of the new positions only
    cache = small_model.new_cache(batch=1, capacity=16)
    small_model.forward(ids[:1, :5], cache=cache)
    lg, h = small_model.forward(ids[0, 5:], cache=cache, return_hidden=True)
    assert h.shape == (4, SMALL.d_model)
    np.testing.assert_allclose(h, hidden[0, 5:], atol=1e-5)
    np.testing.assert_allclose(lg, logits[0, 5:], atol=1e-5)


def test_forward_rejects_too_long_input(small_model):
    with pytest.raises(ValueError, match="max_seq_len"):
        small_model.forward(np.zeros(SMALL.max_seq_len + 1, int))


def test_checkpoint_roundtrip(tmp_path):
    params = init_params(SMALL, seed=5)
    path = save_checkpoint(tmp_path / "m.npz", SMALL, params, {"note": "x"})
    config, loaded, meta = load_checkpoint(path)
    assert config == SMALL and meta == {"note": "x"}
    for k, v in params.items():
        np.testing.assert_array_equal(loaded[k], v.astype(np.float16).astype(np.float32))


def test_load_model_unknown_name_lists_shipped():
    with pytest.raises(FileNotFoundError, match="tiny"):
        load_model("no-such-model")


def test_load_model_shipped_checkpoints_fit_budget():
    from minillm.model import WEIGHTS_DIR

    for name in ("tiny", "draft"):
        path = WEIGHTS_DIR / f"{name}.npz"
        assert path.stat().st_size <= 10 * 1024**2
        m = load_model(name)
        assert m.meta["final_val_loss"] > 0 and m.meta["device"]


def test_load_model_tiny_has_learned_python(tiny_model):
    """Held-out loss far below uniform (ln 259 = 5.56 nats/byte): the model really learned."""
    text = '''def merge(left, right):
    """Merge two sorted lists into one sorted list."""
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result
'''
    ids = np.array(ByteTokenizer().encode(text, bos=True))
    logits = tiny_model.forward(ids[:-1])
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    nll = -logp[np.arange(len(ids) - 1), ids[1:]].mean()
    assert nll < 1.2, nll


def test_load_model_meta_records_training(tiny_model):
    meta = tiny_model.meta
    assert meta["command"].startswith("python -m minillm.train")
    json.dumps(meta)


@pytest.mark.parametrize("name", ["tiny", "draft"])
def test_load_training_log_matches_checkpoint_meta(name):
    log, meta = load_training_log(name), load_model(name).meta
    assert log["val_step"][-1] == meta["steps"]
    assert log["val_loss"][-1] == pytest.approx(meta["final_val_loss"], abs=1e-4)
    if "kept_step" in meta:  # the checkpoint kept is the evaluation with the best held-out loss
        kept = log["val_loss"][log["val_step"].index(meta["kept_step"])]
        assert kept == pytest.approx(meta["kept_val_loss"], abs=1e-4) and kept == min(log["val_loss"])
    assert log["train_loss"][-1] < log["train_loss"][0]


def test_load_training_log_unknown_name_lists_shipped():
    with pytest.raises(FileNotFoundError, match="tiny"):
        load_training_log("no-such-model")


# --------------------------------------------------------------------------- unreadable checkpoints and logs


def _raises_naming(path, match):
    """pytest.raises for a CheckpointError (a ValueError) whose message names ``path`` and matches ``match``."""
    return pytest.raises(CheckpointError, match=f"(?s)^{re.escape(str(path))}.*{match}")


def test_load_checkpoint_truncated_file(tmp_path):
    data = (WEIGHTS_DIR / "draft.npz").read_bytes()
    for n in (len(data) // 2, len(data) - 1, 100):
        path = tmp_path / f"cut{n}.npz"
        path.write_bytes(data[:n])
        with _raises_naming(path, "not a valid .npz checkpoint: it is truncated or corrupt"):
            load_checkpoint(path)
        with _raises_naming(path, "truncated or corrupt"):
            load_model(path)                    # a path string ending in .npz goes through the same check


def test_load_checkpoint_random_bytes_and_empty_file(tmp_path, rng):
    path = tmp_path / "noise.npz"
    path.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    with _raises_naming(path, "not a valid .npz checkpoint: it does not start with the zip signature"):
        load_checkpoint(path)
    path.write_bytes(b"")
    with _raises_naming(path, "not a valid .npz checkpoint: the file is empty"):
        load_checkpoint(path)


def test_load_checkpoint_missing_config(tmp_path):
    params = init_params(SMALL, seed=1)
    path = tmp_path / "noconfig.npz"
    np.savez(path, **params, __meta__=np.array("{}"))
    with _raises_naming(path, "missing the '__config__' entry"):
        load_checkpoint(path)


def test_load_checkpoint_object_array_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "m.npz", SMALL, init_params(SMALL, seed=1))
    with np.load(path) as f:
        arrays = dict(f)
    arrays["embed"] = np.array([{"not": "numbers"}], dtype=object)
    np.savez(path, **arrays)                    # NumPy pickles the object array
    with _raises_naming(path, "entry 'embed' contains object arrays"):
        load_checkpoint(path)


def test_load_checkpoint_config_and_params_must_agree(tmp_path):
    params = init_params(SMALL, seed=1)
    path = tmp_path / "m.npz"
    save_checkpoint(path, SMALL, {k: v for k, v in params.items() if k != "norm"})
    with _raises_naming(path, r"do not match its '__config__': missing \['norm'\]"):
        load_checkpoint(path)
    save_checkpoint(path, SMALL, {**params, "norm": np.zeros(3)})
    with _raises_naming(path, r"'norm' has shape \(3,\)"):
        load_checkpoint(path)
    np.savez(path, **params, __config__=np.array('{"d_model": 64, "n_heads": 3}'))
    with _raises_naming(path, "not a valid ModelConfig"):
        load_checkpoint(path)
    np.savez(path, **params, __config__=np.array('{"d_model": 64'))
    with _raises_naming(path, "'__config__' is not valid JSON"):
        load_checkpoint(path)


def test_load_checkpoint_error_is_a_valueerror_and_meta_is_optional(tmp_path):
    assert issubclass(CheckpointError, ValueError)
    params = init_params(SMALL, seed=1)
    path = tmp_path / "nometa.npz"
    np.savez(path, **params, __config__=np.array(json.dumps(SMALL.__dict__)))
    config, loaded, meta = load_checkpoint(path)
    assert config == SMALL and meta == {} and set(loaded) == set(params)


def test_load_model_medusa_heads_points_to_load_medusa():
    with pytest.raises(CheckpointError, match="missing the '__config__' entry.*load_medusa"):
        load_model("medusa_tiny")


def test_load_training_log_corrupt_or_wrong_json(tmp_path):
    good = (WEIGHTS_DIR / "draft_log.json").read_text()
    path = tmp_path / "run_log.json"
    path.write_text(good[: len(good) // 2])
    with _raises_naming(path, "not a valid training log: not UTF-8 JSON, truncated or corrupt"):
        load_training_log(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with _raises_naming(path, "not a valid training log"):
        load_training_log(path)
    path.write_text("[1, 2]")
    with _raises_naming(path, "holds a JSON list"):
        load_training_log(path)
    path.write_text('{"step": [1]}')
    with _raises_naming(path, "is not a training log: missing"):
        load_training_log(path)


def test_load_training_log_reads_a_path_or_the_log_next_to_a_checkpoint(tmp_path):
    log = {"step": [1], "train_loss": [2.0], "val_step": [1], "val_loss": [2.5], "seconds": [0.1]}
    (tmp_path / "run_log.json").write_text(json.dumps(log))
    assert load_training_log(tmp_path / "run_log.json") == log
    assert load_training_log(str(tmp_path / "run.npz")) == log


def _ragged_inputs(model, seqs, block_size=4, num_blocks=32, seed=0):
    """Pools plus the ragged metadata for sequences given as (tokens, n_cached): the last len-n_cached are new."""
    cfg = model.config
    rng = np.random.default_rng(seed)
    shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.d_head)
    k_pool, v_pool = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    perm = rng.permutation(num_blocks)
    tables, at = [], 0
    for toks, _ in seqs:
        nb = -(-len(toks) // block_size)
        tables.append(perm[at:at + nb])
        at += nb
    bt = np.zeros((len(seqs), max(len(t) for t in tables)), np.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = t
    return k_pool, v_pool, bt


def test_forward_ragged_matches_forward_for_mixed_prefill_chunks_and_decodes(small_model, rng):
    """Three sequences, filled over two ragged steps (prefill chunks of odd sizes, then a mixed step),
    give the same last-token logits as the plain forward over each whole sequence."""
    m, bs = small_model, 4
    seqs = [rng.integers(0, 256, n).tolist() for n in (9, 14, 5)]
    k_pool, v_pool, bt = _ragged_inputs(m, [(s, 0) for s in seqs], block_size=bs)
    splits = [(6, 3), (13, 1), (1, 4)]    # tokens computed in step 1, then step 2 (13+1: step 2 is a decode)

    def step(parts):
        ids, pos, slots, ctx, qlen = [], [], [], [], []
        for i, (lo, hi) in enumerate(parts):
            p = np.arange(lo, hi)
            ids += seqs[i][lo:hi]
            pos.append(p)
            slots.append(bt[i][p // bs].astype(np.int64) * bs + p % bs)
            ctx.append(hi)
            qlen.append(hi - lo)
        cu = np.concatenate([[0], np.cumsum(qlen)]).astype(np.int32)
        return m.forward_ragged(np.array(ids), np.concatenate(pos), np.concatenate(slots), bt,
                                np.array(ctx, np.int32), cu, k_pool, v_pool)

    first = step([(0, a) for a, _ in splits])
    last = step([(a, a + b) for a, b in splits])
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(last[i], m.forward(np.array(s))[-1], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(first[i], m.forward(np.array(s[:splits[i][0]]))[-1], rtol=1e-4, atol=1e-4)


def test_forward_ragged_skips_padding_slots_and_rejects_bad_metadata(small_model):
    m = small_model
    k_pool, v_pool, bt = _ragged_inputs(m, [([1, 2, 3], 0)])
    cu, ctx = np.array([0, 3], np.int32), np.array([3], np.int32)
    slots = bt[0][np.arange(3) // 4].astype(np.int64) * 4 + np.arange(3) % 4
    pad = slots.copy()
    pad[2] = -1                                  # a padded row (CUDA-graph batches): computed, not stored
    m.forward_ragged(np.array([1, 2, 3]), np.arange(3), pad, bt, ctx, cu, k_pool, v_pool)
    flat = k_pool.reshape(m.config.n_layers, -1, m.config.n_kv_heads, m.config.d_head)
    assert np.abs(flat[:, slots[:2]]).sum() > 0 and not np.abs(flat[:, slots[2]]).any()
    m.forward_ragged(np.array([1, 2, 3]), np.arange(3), slots, bt, ctx, cu, k_pool, v_pool)
    before = k_pool.copy()
    with pytest.raises(ValueError, match="slot_mapping"):
        m.forward_ragged(np.array([1, 2, 3]), np.arange(3), slots + 10**6, bt, ctx, cu, k_pool, v_pool)
    with pytest.raises(ValueError, match="positions"):
        m.forward_ragged(np.array([1, 2, 3]), np.arange(3) + 10**4, slots, bt, ctx, cu, k_pool, v_pool)
    with pytest.raises(ValueError, match="token ids"):
        m.forward_ragged(np.array([1, 2, 10**6]), np.arange(3), slots, bt, ctx, cu, k_pool, v_pool)
    np.testing.assert_array_equal(k_pool, before)


def test_model_astype_float64_computes_in_float64_and_matches_float32():
    from minillm.model import load_model

    m32 = load_model("tiny")
    m64 = m32.astype(np.float64)
    ids = np.arange(1, 40) % m32.config.vocab_size
    l32, l64 = m32.forward(ids), m64.forward(ids)
    assert l32.dtype == np.float32 and l64.dtype == np.float64
    assert m32.params["lm_head"].dtype == np.float32  # the original is untouched
    np.testing.assert_allclose(l64, l32, rtol=0, atol=1e-3)
    assert np.abs(l64 - l32).max() > 0  # really a different precision
    cache = m64.new_cache()
    step = np.concatenate([m64.forward(ids[:30], cache=cache), m64.forward(ids[30:], cache=cache)])
    np.testing.assert_allclose(step, l64, rtol=0, atol=1e-9)  # the cache keeps float64 K/V


def test_model_unsupported_dtype_raises():
    from minillm.model import load_model

    with pytest.raises(ValueError, match="float32 or float64"):
        load_model("tiny").astype(np.float16)


# --------------------------------------------------------------------------- config fields and dtypes


@pytest.mark.parametrize("field,bad", [
    ("n_layers", "6"), ("n_layers", 6.0), ("d_ff", 64.5), ("vocab_size", True), ("max_seq_len", np.bool_(True)),
    ("n_heads", -8), ("norm_eps", -1), ("norm_eps", 0.0), ("norm_eps", float("nan")), ("norm_eps", "1e-5"),
    ("rope_theta", 0), ("rope_theta", float("inf")), ("rope_theta", -10000.0), ("rope_theta", True),
])
def test_modelconfig_rejects_wrong_types_and_values(field, bad):
    """These used to be accepted: a string or float size broke later in range(), True counted as 1, and a
    zero or negative rope_theta / norm_eps built a model that computes NaN or nonsense."""
    with pytest.raises(ValueError, match=f"ModelConfig.{field}"):
        ModelConfig(**{field: bad})


def test_modelconfig_accepts_numpy_numbers_and_an_int_rope_theta():
    cfg = ModelConfig(n_layers=np.int64(2), rope_theta=10000, norm_eps=np.float32(1e-6))
    assert cfg.n_layers == 2 and len(cfg.param_shapes()) == 2 * 9 + 3


@pytest.mark.parametrize("field,bad", [("n_layers", "2"), ("n_layers", 2.0), ("norm_eps", -1.0), ("rope_theta", 0)])
def test_load_checkpoint_invalid_stored_config_is_a_checkpoint_error(tmp_path, field, bad):
    """n_layers "2" or 2.0 used to escape as a raw TypeError from param_shapes; norm_eps -1 and rope_theta 0 loaded."""
    params = init_params(SMALL, seed=1)
    path = tmp_path / "m.npz"
    np.savez(path, **params, __config__=np.array(json.dumps({**SMALL.__dict__, field: bad})))
    with _raises_naming(path, f"'__config__' is not a valid ModelConfig .*ModelConfig.{field}"):
        load_checkpoint(path)


def _ragged_whole_prompts(m, prompts, dtype, block_size=4):
    """One ragged prefill step of whole prompts against pools of ``dtype``: the last token's logits of each."""
    k_pool, v_pool, bt = _ragged_inputs(m, [(p, 0) for p in prompts], block_size=block_size)
    k_pool, v_pool = k_pool.astype(dtype), v_pool.astype(dtype)
    pos = np.concatenate([np.arange(len(p)) for p in prompts])
    slots = np.concatenate([bt[i][np.arange(len(p)) // block_size].astype(np.int64) * block_size
                            + np.arange(len(p)) % block_size for i, p in enumerate(prompts)])
    cu = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int32)
    return m.forward_ragged(np.concatenate(prompts), pos, slots, bt, np.array([len(p) for p in prompts], np.int32),
                            cu, k_pool, v_pool)


RAGGED_F64_ATOL = 1e-12   # float64 against float64, only summation order differs (the old float32 tables and cast: 2.5e-7)


def test_forward_ragged_float64_model_is_float64_accurate():
    """A float64 model's ragged forward used float32 RoPE tables and cast attention to float32: ~1e-6 off."""
    m = load_model("tiny").astype(np.float64)
    tok = ByteTokenizer()
    prompts = [tok.encode(s) for s in ("def f(x):\n    return x", "import os\n", "class A(B):")]
    got = _ragged_whole_prompts(m, prompts, np.float64)
    assert got.dtype == np.float64
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(got[i], m.forward(np.array(p))[-1], rtol=0, atol=RAGGED_F64_ATOL)


def test_forward_ragged_float32_model_unchanged():
    """The float32 path keeps float32 tables and outputs (within float32 rounding of the plain forward)."""
    m = load_model("tiny")
    tok = ByteTokenizer()
    prompts = [tok.encode(s) for s in ("def f(x):\n    return x", "import os\n")]
    got = _ragged_whole_prompts(m, prompts, np.float32)
    assert got.dtype == np.float32
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(got[i], m.forward(np.array(p))[-1], rtol=1e-4, atol=1e-4)
