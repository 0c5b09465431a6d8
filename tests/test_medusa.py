"""Medusa-style heads (chapter 9): the formula, the shipped weights, and the drafter inside speculative_decode."""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm import ByteTokenizer, cached_decode, speculative_decode
from minillm.medusa import MedusaDrafter, MedusaHeads, head_targets, load_medusa, train_medusa
from minillm.model import WEIGHTS_DIR, CheckpointError, load_training_log, silu
from minillm.speculative import SpecParams, to_probs
from minillm.studies.speculation import held_out_source

from .conftest import SMALL

TOK = ByteTokenizer()
PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        ",
    "    if value is None:\n        raise ValueError(",
]
N_NEW = 40


@pytest.fixture(scope="module")
def heads():
    return load_medusa("medusa_tiny")


@pytest.fixture(scope="module")
def greedy_refs(tiny_model):
    return {p: cached_decode(tiny_model, TOK.encode(p), N_NEW).tokens for p in PROMPTS}


# --------------------------------------------------------------------------- the heads


def test_medusa_heads_logits_follow_the_residual_formula(rng):
    w = rng.normal(0, 0.1, (3, 8, 8)).astype(np.float32)
    lm_head = rng.normal(size=(8, 11)).astype(np.float32)
    h = rng.normal(size=(5, 8)).astype(np.float32)
    out = MedusaHeads(w).logits(h, lm_head)
    assert out.shape == (5, 3, 11)
    for j in range(3):
        np.testing.assert_allclose(out[:, j], (h + silu(h @ w[j])) @ lm_head, rtol=1e-5, atol=1e-5)
    assert MedusaHeads(w).logits(h[0], lm_head).shape == (3, 11)


def test_medusa_heads_zero_weights_are_the_target_lm_head(tiny_model):
    ids = TOK.encode(PROMPTS[0])
    logits, hidden = tiny_model.forward(np.asarray(ids), return_hidden=True)
    zero = MedusaHeads(np.zeros((2, tiny_model.config.d_model, tiny_model.config.d_model)))
    out = zero.logits(hidden, tiny_model.params["lm_head"])
    for j in range(2):
        np.testing.assert_allclose(out[:, j], logits, rtol=1e-5, atol=1e-4)


def test_medusa_heads_reject_bad_input(rng):
    with pytest.raises(ValueError, match="K, d, d"):
        MedusaHeads(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="K, d, d"):
        MedusaHeads(np.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match="non-finite"):
        MedusaHeads(np.full((1, 4, 4), np.nan))
    heads = MedusaHeads(np.zeros((2, 4, 4)))
    with pytest.raises(ValueError, match="d_model=4"):
        heads.logits(np.zeros(5), np.zeros((4, 7)))
    with pytest.raises(ValueError, match="lm_head"):
        heads.logits(np.zeros(4), np.zeros((5, 7)))
    with pytest.raises(FileNotFoundError, match="--train"):
        load_medusa("no_such_heads")


def test_medusa_heads_save_load_roundtrip(tmp_path, rng):
    heads = MedusaHeads(rng.normal(size=(2, 6, 6)), meta={"note": "x"})
    back = load_medusa(heads.save(tmp_path / "h.npz"))
    np.testing.assert_allclose(back.w, heads.w, rtol=1e-3, atol=1e-3)     # stored as float16
    assert back.meta == {"note": "x"}


def test_head_targets_align_head_j_with_the_token_j_plus_2_ahead():
    windows = np.arange(2 * 10).reshape(2, 10)
    y = head_targets(windows, n_heads=3, seq_len=6)
    assert y.shape == (2, 6, 3)
    for t in range(6):
        assert list(y[1, t]) == [windows[1, t + 2], windows[1, t + 3], windows[1, t + 4]]
    with pytest.raises(ValueError, match="seq_len"):
        head_targets(windows, n_heads=3, seq_len=7)


def test_load_medusa_shipped_weights_and_log(heads, tiny_model):
    assert heads.n_heads == 3 and heads.d_model == tiny_model.config.d_model
    meta = heads.meta
    assert meta["command"].startswith("python -m minillm.medusa --train")
    assert meta["target"] == "tiny" and meta["seconds"] > 0
    log = load_training_log("medusa_tiny")
    assert log["val_step"][-1] == meta["steps"]
    assert log["train_loss"][-1] < log["train_loss"][0]
    # training helped every head: top-1 accuracy on validation text rose from the untrained (W = 0) heads
    assert all(a > b for a, b in zip(log["val_acc_per_head"][-1], log["val_acc_per_head"][0]))
    json.dumps(meta)
    assert (WEIGHTS_DIR / "medusa_tiny.npz").stat().st_size < 1_000_000


# --------------------------------------------------------------------------- the drafter


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_medusa_drafter_greedy_matches_cached_decode(tiny_model, heads, greedy_refs, k):
    for prompt in PROMPTS:
        drafter = MedusaDrafter(tiny_model, heads)
        res = speculative_decode(tiny_model, drafter, TOK.encode(prompt), N_NEW, k)
        assert res.tokens == greedy_refs[prompt], (k, prompt)
        assert sum(res.emitted) == N_NEW
        assert max(res.proposed) == min(k, heads.n_heads)         # k above K is clipped to K
        assert res.draft_calls == drafter.calls > 0


def test_medusa_drafter_reads_the_hidden_state_of_the_token_before_the_last(tiny_model):
    # With W = 0 every head is the target's LM head, so on h_{L-2} each draft is the target's greedy choice
    # for position L-1 -- which is the context's last token when that token was decoded greedily.
    zero = MedusaHeads(np.zeros((3, tiny_model.config.d_model, tiny_model.config.d_model)))
    prompt = TOK.encode(PROMPTS[2])
    ctx = cached_decode(tiny_model, prompt, 5).tokens
    drafter = MedusaDrafter(tiny_model, zero)
    drafter.start(ctx)
    tokens, q = drafter.propose(ctx, 3, np.random.default_rng(0), SpecParams())
    assert tokens == [ctx[-1]] * 3
    assert q.shape == (3, tiny_model.config.vocab_size) and np.all(q.max(axis=1) == 1.0)   # one-hot when greedy
    # after a rollback and a longer context it recomputes only what it lacks and stays aligned
    ctx2 = cached_decode(tiny_model, prompt, 9).tokens
    drafter.rollback(len(ctx) + 1)
    tokens2, _ = drafter.propose(ctx2, 2, np.random.default_rng(0), SpecParams())
    assert tokens2 == [ctx2[-1]] * 2 and drafter.cache.length == len(ctx2) - 1


def test_medusa_drafter_proposes_the_requested_k_with_head_distributions(tiny_model, heads):
    ctx = TOK.encode(PROMPTS[1])
    params = SpecParams(temperature=0.8, top_k=20)
    drafter = MedusaDrafter(tiny_model, heads)
    drafter.start(ctx)
    _, hidden = tiny_model.forward(np.asarray(ctx[:-1]), return_hidden=True)
    expect = to_probs(heads.logits(hidden[-1], tiny_model.params["lm_head"]), params)
    for k in (1, 2, 3):
        tokens, q = drafter.propose(ctx, k, np.random.default_rng(k), params)
        assert len(tokens) == k and q.shape == (k, tiny_model.config.vocab_size)
        np.testing.assert_allclose(q, expect[:k], atol=1e-6)
        assert all(q[i, t] > 0 for i, t in enumerate(tokens))            # each draft sampled from its q row
    assert drafter.propose(ctx[:1], 3, np.random.default_rng(0), params) == ([], None)   # no position L-2
    assert drafter.propose(ctx, 0, np.random.default_rng(0), params) == ([], None)


def test_medusa_drafter_sampled_decode_runs_exactly_n_new(tiny_model, heads):
    res = speculative_decode(tiny_model, MedusaDrafter(tiny_model, heads), TOK.encode(PROMPTS[3]), 30, 3,
                             SpecParams(temperature=1.0), seed=1)
    assert len(res.new_tokens) == 30 and all(0 <= t < tiny_model.config.vocab_size for t in res.new_tokens)
    assert all(a <= p <= 3 for a, p in zip(res.accepted, res.proposed))


def test_medusa_drafter_accepts_some_drafts_on_held_out_source(tiny_model, heads):
    prompt = held_out_source(1, n_bytes=200, seed=0)[0]
    res = speculative_decode(tiny_model, MedusaDrafter(tiny_model, heads), prompt, 48, 3)
    assert res.acceptance_rate > 0 and res.tokens_per_call > 1
    assert max(res.proposed) == 3


def test_medusa_drafter_rejects_bad_input(tiny_model, heads):
    with pytest.raises(ValueError, match="d_model"):
        MedusaDrafter(tiny_model, MedusaHeads(np.zeros((2, SMALL.d_model, SMALL.d_model))))
    drafter = MedusaDrafter(tiny_model, heads)
    with pytest.raises(RuntimeError, match="start"):
        drafter.propose(TOK.encode("ab"), 2, np.random.default_rng(0), SpecParams())
    drafter.start([1, 2])
    with pytest.raises(ValueError, match="k must be"):
        drafter.propose(TOK.encode("ab"), -1, np.random.default_rng(0), SpecParams())
    with pytest.raises(ValueError, match="k"):
        speculative_decode(tiny_model, drafter, TOK.encode("ab"), 4, 0)


# --------------------------------------------------------------------------- training


def test_train_medusa_small_run_on_a_tiny_corpus(tmp_path):
    pytest.importorskip("torch")
    for i in range(3):
        (tmp_path / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(40)))
    heads, log = train_medusa(n_heads=2, steps=5, batch=64, n_windows=4, val_windows=2, seq_len=16,
                              corpus_root=tmp_path, eval_every=5, progress=False)
    assert heads.w.shape == (2, 256, 256) and np.abs(heads.w).sum() > 0
    assert log["val_step"] == [0, 5] and len(log["val_acc_per_head"][0]) == 2
    assert log["meta"]["steps"] == 5 and log["meta"]["corpus"]["files"] == 3
    with pytest.raises(ValueError, match=">= 1"):
        train_medusa(n_heads=0, corpus_root=tmp_path, progress=False)


# --------------------------------------------------------------------------- unreadable heads files


def test_load_medusa_truncated_random_and_empty_files(tmp_path, rng):
    data = (WEIGHTS_DIR / "medusa_tiny.npz").read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(cut))} is not a valid .npz Medusa heads file: "
                                              "it is truncated or corrupt"):
        load_medusa(cut)
    noise = tmp_path / "noise.npz"
    noise.write_bytes(rng.integers(0, 256, 2048, dtype=np.uint8).tobytes())
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(noise))} is not a valid .npz.*zip signature"):
        load_medusa(noise)
    noise.write_bytes(b"")
    with pytest.raises(CheckpointError, match="the file is empty"):
        load_medusa(noise)


def test_load_medusa_missing_w_object_array_and_bad_shape(tmp_path):
    path = tmp_path / "h.npz"
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(WEIGHTS_DIR / 'draft.npz'))} holds no Medusa "
                                              "weights.*load_model"):
        load_medusa(WEIGHTS_DIR / "draft.npz")
    np.savez(path, w=np.array([{"x": 1}], dtype=object))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: entry 'w' contains object arrays"):
        load_medusa(path)
    np.savez(path, w=np.zeros((4, 4), np.float16))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(path))}: Medusa weights must be \\(K, d, d\\)"):
        load_medusa(path)
    np.savez(path, w=np.zeros((1, 4, 4), np.float16), __meta__=np.array("{not json"))
    with pytest.raises(CheckpointError, match="'__meta__' is not valid JSON"):
        load_medusa(path)
    assert issubclass(CheckpointError, ValueError)


# --------------------------------------------------------------------------- the command line


def _write_corpus(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        (root / f"m{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x + {j}\n" for j in range(40)))
    return root


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture
def installed(tmp_path):
    """A copy of the minillm package for a CLI subprocess to import (see tests/test_train.py)."""
    site = tmp_path / "site"
    shutil.copytree(Path(minillm.__file__).parent, site / "minillm", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _run_medusa(args, cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "minillm.medusa", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


TINY_RUN = ["--train", "--heads", "2", "--steps", "2", "--batch", "8", "--windows", "2", "--seq-len", "8",
            "--threads", "1", "--no-progress"]


def test_main_default_out_goes_to_runs_and_leaves_the_shipped_heads(tmp_path, installed):
    pytest.importorskip("torch")
    weights = installed / "minillm" / "weights"
    before, real_before = _digests(weights), _digests(WEIGHTS_DIR)
    work = tmp_path / "work"
    _write_corpus(work / "corpus")
    proc = _run_medusa([*TINY_RUN, "--corpus-root", "corpus"], work, installed)
    assert proc.returncode == 0, proc.stderr
    assert "wrote runs/medusa_tiny-" in proc.stdout
    assert _digests(weights) == before and _digests(WEIGHTS_DIR) == real_before
    out = sorted((work / "runs").glob("medusa_tiny-*.npz"))
    assert len(out) == 1 and re.fullmatch(r"medusa_tiny-\d{8}-\d{6}\.npz", out[0].name)
    assert load_medusa(out[0]).n_heads == 2 and load_training_log(out[0])["val_step"][-1] == 2


def test_main_refuses_out_inside_the_package_without_overwrite(tmp_path, installed):
    weights = installed / "minillm" / "weights"
    before = _digests(weights)
    work = tmp_path / "work"
    _write_corpus(work / "corpus")
    for out in (weights / "medusa_tiny.npz", weights / "fresh.npz"):
        proc = _run_medusa([*TINY_RUN, "--corpus-root", "corpus", "--out", out], work, installed)
        assert proc.returncode == 2
        assert "inside the installed minillm package" in proc.stderr and "--overwrite" in proc.stderr
    assert _digests(weights) == before


@pytest.mark.parametrize("flag, value, message", [
    ("--heads", "0", "argument --heads: must be an integer >= 1, got '0'"),
    ("--steps", "0", "argument --steps: must be an integer >= 1, got '0'"),
    ("--batch", "0", "argument --batch: must be an integer >= 1, got '0'"),
    ("--windows", "0", "argument --windows: must be an integer >= 1, got '0'"),
    ("--seq-len", "0", "argument --seq-len: must be an integer >= 1, got '0'"),
    ("--seq-len", "513", "argument --seq-len: 513 exceeds the target's max_seq_len 512"),
    ("--max-minutes", "-1", "argument --max-minutes: must be a finite number > 0, got '-1'"),
    ("--lr", "0", "argument --lr: must be a finite number > 0, got '0'"),
    ("--threads", "0", "argument --threads: must be an integer >= 1"),
    ("--target", "no_such_model", "argument --target: no checkpoint"),
    ("--target", "medusa_tiny", "argument --target: .* is missing the '__config__' entry"),
])
def test_main_rejects_bad_arguments_with_clear_messages(tmp_path, capsys, flag, value, message):
    from minillm.medusa import main

    out = tmp_path / "h.npz"
    with pytest.raises(SystemExit) as exc:
        main([*TINY_RUN, "--corpus-root", str(_write_corpus(tmp_path / "corpus")), "--out", str(out), flag, value])
    assert exc.value.code == 2 and re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_main_refuses_to_replace_an_existing_file_without_overwrite(tmp_path, capsys):
    from minillm.medusa import main

    out = tmp_path / "h.npz"
    out.write_bytes(b"keep me")
    with pytest.raises(SystemExit) as exc:
        main([*TINY_RUN, "--corpus-root", str(_write_corpus(tmp_path / "corpus")), "--out", str(out)])
    assert exc.value.code == 2 and f"{out} already exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_bytes() == b"keep me"


def test_main_help_shows_every_default(capsys):
    from minillm.medusa import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])[1:]
    options = {b.split()[0]: " ".join(b.split()) for b in blocks}
    assert len(options) == 16 and "--out" in options and "--overwrite" in options
    assert not [name for name, block in options.items() if name != "-h," and "(default:" not in block]
    assert "(default: 600)" in options["--steps"] and "(default: tiny)" in options["--target"]
    assert "./runs/medusa_<target>-<YYYYmmdd-HHMMSS>.npz" in options["--out"]
