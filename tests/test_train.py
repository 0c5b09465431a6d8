import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minillm
from minillm.model import WEIGHTS_DIR, load_model, load_training_log
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


def test_train_rejects_bad_arguments_before_training():
    from minillm.train import train

    cfg = PRESETS["draft"]
    ok = dict(steps=1, batch=1, seq_len=8, lr=1e-3, device="cpu", max_minutes=None, eval_every=1, seed=0,
              corpus_limit=1, progress=False)
    for bad, match in [(dict(steps=0), "steps must be an integer >= 1"), (dict(batch=0), "batch must be"),
                       (dict(seq_len=0), "seq_len must be"), (dict(seq_len=513), "exceeds the model's max_seq_len"),
                       (dict(eval_every=0), "eval_every must be"), (dict(lr=0.0), "lr must be"),
                       (dict(max_minutes=-1.0), "max_minutes must be")]:
        with pytest.raises(ValueError, match=match):
            train(cfg, **{**ok, **bad})


def test_load_corpus_needs_two_files_and_train_enough_tokens(tmp_path):
    from minillm.train import CorpusError, train

    (tmp_path / "a.py").write_text("x = 1\n")
    with pytest.raises(CorpusError, match="at least 2 .py files"):
        load_corpus(tmp_path)
    (tmp_path / "b.py").write_text("y = 2\n")
    with pytest.raises(CorpusError, match="fewer than seq_len \\+ 2"):
        train(PRESETS["draft"], steps=1, batch=1, seq_len=64, lr=1e-3, device="cpu", max_minutes=None,
              eval_every=1, seed=0, corpus_limit=None, corpus_root=tmp_path, progress=False)


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
    """A copy of the minillm package, as a wheel install would lay it out, for a CLI subprocess to import:
    a test that a CLI leaves the package's checkpoints alone cannot damage the real ones even when it fails."""
    site = tmp_path / "site"
    shutil.copytree(Path(minillm.__file__).parent, site / "minillm", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _run_cli(module: str, args: list[str], cwd: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


TINY_RUN = ["--preset", "draft", "--steps", "1", "--batch", "1", "--seq-len", "8", "--eval-every", "1",
            "--device", "cpu", "--no-progress"]


def test_main_default_out_goes_to_runs_and_leaves_the_shipped_checkpoints(tmp_path, installed):
    weights = installed / "minillm" / "weights"
    before, real_before = _digests(weights), _digests(WEIGHTS_DIR)
    work = tmp_path / "work"
    _write_corpus(work / "corpus")
    proc = _run_cli("minillm.train", [*TINY_RUN, "--corpus-root", "corpus"], work, installed)
    assert proc.returncode == 0, proc.stderr
    assert "wrote runs/draft-" in proc.stdout
    assert _digests(weights) == before and _digests(WEIGHTS_DIR) == real_before
    ckpts = sorted((work / "runs").glob("draft-*.npz"))
    assert len(ckpts) == 1 and re.fullmatch(r"draft-\d{8}-\d{6}\.npz", ckpts[0].name)
    model = load_model(ckpts[0])
    assert model.config == PRESETS["draft"] and model.meta["steps"] == 1
    assert load_training_log(ckpts[0])["val_step"] == [1]


def test_main_refuses_out_inside_the_package_without_overwrite(tmp_path, installed):
    weights = installed / "minillm" / "weights"
    before = _digests(weights)
    work = tmp_path / "work"
    _write_corpus(work / "corpus")
    for out in (weights / "draft.npz", weights / "fresh.npz"):
        proc = _run_cli("minillm.train", [*TINY_RUN, "--corpus-root", "corpus", "--out", str(out)], work, installed)
        assert proc.returncode == 2
        assert "inside the installed minillm package" in proc.stderr and "--overwrite" in proc.stderr
        assert "training draft" not in proc.stdout
    assert _digests(weights) == before


def _main_error(capsys, argv) -> str:
    """Run ``minillm.train.main(argv)`` in this process; it must exit with a usage error before training."""
    from minillm.train import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and "training" not in out
    return err


@pytest.mark.parametrize("flag, value, message", [
    ("--steps", "0", "argument --steps: must be an integer >= 1, got '0'"),
    ("--batch", "0", "argument --batch: must be an integer >= 1, got '0'"),
    ("--seq-len", "0", "argument --seq-len: must be an integer >= 1, got '0'"),
    ("--seq-len", "513", "argument --seq-len: 513 exceeds the draft preset's max_seq_len 512"),
    ("--max-minutes", "-1", "argument --max-minutes: must be a finite number > 0, got '-1'"),
    ("--max-minutes", "0", "argument --max-minutes: must be a finite number > 0, got '0'"),
    ("--lr", "nan", "argument --lr: must be a finite number > 0, got 'nan'"),
    ("--eval-every", "0", "argument --eval-every: must be an integer >= 1"),
    ("--seed", "-1", "argument --seed: must be an integer >= 0"),
    ("--corpus-limit", "0", "argument --corpus-limit: must be an integer >= 1"),
    ("--device", "tpu9", "argument --device: unknown device 'tpu9'"),
])
def test_main_rejects_bad_arguments_with_clear_messages(tmp_path, capsys, flag, value, message):
    out = tmp_path / "x.npz"
    err = _main_error(capsys, [*TINY_RUN, "--corpus-root", _write_corpus(tmp_path / "corpus"), "--out", out,
                               flag, value])
    assert message in err
    assert not out.exists()


def test_main_rejects_a_missing_corpus_root_and_a_bad_out_name(tmp_path, capsys):
    err = _main_error(capsys, [*TINY_RUN, "--corpus-root", tmp_path / "nope", "--out", tmp_path / "x.npz"])
    assert "argument --corpus-root: must be an existing folder" in err
    err = _main_error(capsys, [*TINY_RUN, "--corpus-root", _write_corpus(tmp_path / "c"), "--out", tmp_path / "x"])
    assert "--out must end in .npz" in err and not (tmp_path / "x").exists()


def test_main_refuses_to_replace_an_existing_file_without_overwrite(tmp_path, capsys):
    from minillm.train import main

    corpus = _write_corpus(tmp_path / "corpus")
    out = tmp_path / "mine.npz"
    out.write_bytes(b"keep me")
    err = _main_error(capsys, [*TINY_RUN, "--corpus-root", corpus, "--out", out])
    assert f"{out} already exists; pass --overwrite" in err and out.read_bytes() == b"keep me"
    out.unlink()
    (tmp_path / "mine_log.json").write_text("keep me too")      # the log it would write next to it counts as well
    err = _main_error(capsys, [*TINY_RUN, "--corpus-root", corpus, "--out", out])
    assert "mine_log.json already exists" in err and not out.exists()
    main([*TINY_RUN, "--corpus-root", str(corpus), "--out", str(out), "--overwrite"])
    assert load_model(out).meta["steps"] == 1 and load_training_log(out)["val_step"] == [1]


def test_main_help_shows_every_default(capsys):
    from minillm.train import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    blocks = re.split(r"\n  (?=-)", text.split("options:", 1)[1])[1:]
    options = {b.split()[0]: " ".join(b.split()) for b in blocks}
    assert len(options) == 15 and "--out" in options and "--overwrite" in options
    missing = [name for name, block in options.items() if name != "-h," and "(default:" not in block]
    assert not missing
    assert "(default: 20000)" in options["--steps"] and "(default: 64)" in options["--batch"]
    assert "./runs/<preset>-<YYYYmmdd-HHMMSS>.npz" in options["--out"]
