"""Train minillm's models on the Python standard library's own source code.

    python -m minillm.train                          # the "tiny" model, GPU if present
    python -m minillm.train --preset draft           # the small draft model (speculative decoding)
    python -m minillm.train --device cpu --max-minutes 2 --out /tmp/t.npz

The checkpoint goes to ``./runs/<preset>-<YYYYmmdd-HHMMSS>.npz`` (relative to the current directory) unless
``--out`` says otherwise, with its training log next to it (``<stem>_log.json``). Writing inside the
installed minillm package (where the shipped checkpoints live) or over an existing file needs
``--overwrite``; every argument is checked before any training starts.

The corpus is every ``.py`` file under the running interpreter's standard
library: it exists offline on every machine that has Python. Files are split
into train/validation by a hash of their relative path, so the split is stable
across machines. Each file starts with a <bos> token.

The learning-rate schedule is driven by *progress*, the larger of
step/steps and elapsed/max_minutes, so a run with a wall-clock budget still
warms up, decays to its floor and finishes cleanly.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shlex
import sys
import sysconfig
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .model import ModelConfig, init_params, save_checkpoint
from .tokenizer import BOS

PACKAGE_DIR = Path(__file__).resolve().parent   # the installed minillm package: the CLIs never write here unasked

PRESETS = {
    "tiny": ModelConfig(),
    "draft": ModelConfig(d_model=128, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=320),
}


class CorpusError(ValueError):
    """The corpus cannot feed training: no .py files, or too few tokens for one window."""


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def load_corpus(root: Path | None = None, val_fraction: float = 0.02, limit_bytes: int | None = None):
    """Token arrays (uint16) for train and validation, plus a description of the corpus."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CorpusError(f"corpus root {root} is not a folder")
    parts = {"train": [], "val": []}
    n_files = n_bytes = 0
    for path in stdlib_files(root):
        data = path.read_bytes()
        rel = path.relative_to(root).as_posix()
        bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 10_000
        split = "val" if bucket < val_fraction * 10_000 else "train"
        parts[split].append(np.concatenate([[BOS], np.frombuffer(data, np.uint8)]).astype(np.uint16))
        n_files += 1
        n_bytes += len(data)
        if limit_bytes and n_bytes >= limit_bytes:
            break
    if n_files < 2:
        raise CorpusError(f"the corpus needs at least 2 .py files (one held out for validation), found {n_files} "
                          f"under {root}" + (f" within the first {limit_bytes} bytes" if limit_bytes else ""))
    if not parts["val"]:  # tiny corpora (tests): hold out the last file
        parts["val"].append(parts["train"].pop())
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    info = {"root": str(root), "python": platform.python_version(), "files": n_files, "bytes": n_bytes,
            "train_tokens": int(arrays["train"].size), "val_tokens": int(arrays["val"].size)}
    return arrays["train"], arrays["val"], info


def lr_at(progress: float, peak: float, warmup: float = 0.02, floor: float = 0.1) -> float:
    if progress < warmup:
        return peak * progress / warmup
    t = min(1.0, (progress - warmup) / (1 - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def train(config: ModelConfig, *, steps: int, batch: int, seq_len: int, lr: float, device: str,
          max_minutes: float | None, eval_every: int, seed: int, corpus_limit: int | None,
          corpus_root: Path | None = None, progress: bool = True):
    import torch
    import torch.nn.functional as F

    from .torch_model import TorchModel

    try:
        from tqdm import tqdm
    except ImportError:  # the progress bar is a convenience, not a requirement
        tqdm = None

    for name, value in (("steps", steps), ("batch", batch), ("seq_len", seq_len), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not seq_len <= config.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the model's max_seq_len {config.max_seq_len}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if max_minutes is not None and not (math.isfinite(max_minutes) and max_minutes > 0):
        raise ValueError(f"max_minutes must be None or a finite number > 0, got {max_minutes!r}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    dev = torch.device(device)
    train_tok, val_tok, corpus = load_corpus(corpus_root, limit_bytes=corpus_limit)
    for split, tok in (("train", train_tok), ("validation", val_tok)):
        if tok.size < seq_len + 2:
            raise CorpusError(f"the {split} split has {tok.size} tokens, fewer than seq_len + 2 = {seq_len + 2}: "
                              f"use a shorter seq_len or a larger corpus")
    model = TorchModel.from_numpy(config, init_params(config, seed)).to(dev)
    decay = [p for n, p in model.named_parameters() if p.ndim == 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=dev.type == "cuda")
    amp = dict(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    def get_batch(tokens: np.ndarray, n: int, gen) -> tuple:
        starts = gen.integers(0, tokens.size - seq_len - 1, size=n)
        win = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)
        win = torch.from_numpy(win).to(dev, non_blocking=True)
        return win[:, :-1], win[:, 1:]

    @torch.no_grad()
    def val_loss() -> float:
        model.eval()
        gen = np.random.default_rng(1234)  # the same validation windows every time
        losses = []
        for _ in range(8):
            x, y = get_batch(val_tok, batch, gen)
            with torch.autocast(**amp):
                logits = model(x)
            losses.append(F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item())
        model.train()
        return float(np.mean(losses))

    best = {"loss": math.inf, "step": 0, "params": None}

    def record_val() -> float:
        # Keep the weights with the lowest validation loss: a small corpus is easy to overfit.
        vl = val_loss()
        log["val_step"].append(step)
        log["val_loss"].append(vl)
        if vl < best["loss"]:
            best.update(loss=vl, step=step, params=model.numpy_params())
        return vl

    log = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "seconds": []}
    t0 = time.perf_counter()
    bar = tqdm(total=steps, mininterval=5, disable=not progress, file=sys.stdout) if tqdm else None
    step, ema = 0, None
    while True:
        elapsed = time.perf_counter() - t0
        frac = max(step / steps, elapsed / (60 * max_minutes) if max_minutes else 0.0)
        if frac >= 1.0 and step > 0:    # at least one step: never a checkpoint of the untrained init
            break
        frac = min(frac, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, lr)
        x, y = get_batch(train_tok, batch, rng)
        with torch.autocast(**amp):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            li = loss.item()
            ema = li if ema is None else 0.9 * ema + 0.1 * li
            log["step"].append(step)
            log["train_loss"].append(li)
            log["seconds"].append(time.perf_counter() - t0)
            if bar:
                bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr_at(frac, lr):.1e}", refresh=False)
        if step % eval_every == 0:
            record_val()
        if bar:
            bar.update(1)
        elif progress and step % 100 == 0:
            print(f"step {step} loss {ema:.3f}", flush=True)
    if bar:
        bar.close()
    final_val = log["val_loss"][-1] if log["val_step"] and log["val_step"][-1] == step else record_val()
    seconds = time.perf_counter() - t0
    meta = {
        "command": "python -m minillm.train " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "seconds": round(seconds, 1), "steps": step,
        "tokens_seen": step * batch * seq_len, "batch": batch, "seq_len": seq_len, "peak_lr": lr,
        "final_train_loss_ema": round(float(ema), 4), "final_val_loss": round(final_val, 4),
        "kept_step": best["step"], "kept_val_loss": round(best["loss"], 4),
        "loss_unit": "nats per byte", "corpus": corpus, "n_params": config.n_params(),
        "date": time.strftime("%Y-%m-%d"),
    }
    return best["params"], meta, log


def plot_loss(log: dict, path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(log["step"], log["train_loss"], lw=0.8, alpha=0.7, label="train (batch)")
    ax.plot(log["val_step"], log["val_loss"], "o-", ms=3, label="validation")
    ax.set(xlabel="step", ylabel="cross-entropy (nats / byte)", title=title, ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- the command line (shared with medusa)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows every default: "(default: X)" appended, unless the help text already says its default."""

    def _get_help_string(self, action):
        return action.help if "(default:" in (action.help or "") else super()._get_help_string(action)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0 (seeds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (learning rates, minutes)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def corpus_folder(text: str) -> Path:
    """argparse type: an existing folder (the corpus of .py files)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"must be an existing folder of .py files, got {text!r}")
    return path


def default_out(stem: str) -> Path:
    """``runs/<stem>-<YYYYmmdd-HHMMSS>.npz``, relative to the current directory: never inside the package."""
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.npz"


def log_path_for(out: Path) -> Path:
    """Where the training log of checkpoint ``out`` goes: ``<stem>_log.json`` next to it."""
    return out.with_name(out.stem + "_log.json")


def check_out(out: Path, overwrite: bool) -> str | None:
    """Why the CLIs must not write checkpoint ``out`` (and its log), or None if they may.

    Refused: a name not ending in .npz (``np.savez`` would append it), a folder; without ``overwrite``, any
    path inside the installed minillm package (the shipped checkpoints live there, and a wheel install would
    be overwritten) and any existing file. Creates the parent folder, so an unwritable place fails here,
    before training, not after it.
    """
    if out.suffix != ".npz":
        return f"--out must end in .npz, got {str(out)!r}"
    targets = [out, log_path_for(out)]
    for t in targets:
        if t.is_dir():
            return f"--out: {t} is a folder"
    if not overwrite:
        if out.resolve().is_relative_to(PACKAGE_DIR):
            return (f"--out {out} is inside the installed minillm package ({PACKAGE_DIR}), where the shipped "
                    f"checkpoints live; pass --overwrite to write there anyway")
        for t in targets:
            if t.exists():
                return f"--out: {t} already exists; pass --overwrite to replace it, or choose another --out"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out: cannot create the folder {out.parent} ({e})"
    if not os.access(out.parent, os.W_OK):
        return f"--out: the folder {out.parent} is not writable"
    return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m minillm.train", description=__doc__.split("\n\n")[0],
                                 formatter_class=DefaultsHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="which model to train")
    ap.add_argument("--steps", type=positive_int, default=20_000, help="optimizer steps (at most)")
    ap.add_argument("--max-minutes", type=positive_float, default=None,
                    help="wall-clock budget in minutes; the schedule adapts (default: none, --steps alone)")
    ap.add_argument("--batch", type=positive_int, default=64, help="sequences per step")
    ap.add_argument("--seq-len", type=positive_int, default=512, help="tokens per sequence (<= the preset's max_seq_len)")
    ap.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate")
    ap.add_argument("--device", default="auto", help="cuda, cuda:N, cpu, or auto (cuda if available)")
    ap.add_argument("--eval-every", type=positive_int, default=500, help="steps between validation evaluations")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="seed for the init and the batches")
    ap.add_argument("--corpus-root", type=corpus_folder, default=None,
                    help="folder of .py files (default: this Python's stdlib)")
    ap.add_argument("--corpus-limit", type=positive_int, default=None,
                    help="stop reading the corpus after this many bytes (default: none, read it all)")
    ap.add_argument("--out", type=Path, default=None,
                    help="checkpoint path, ending in .npz; the log goes next to it as <stem>_log.json "
                         "(default: ./runs/<preset>-<YYYYmmdd-HHMMSS>.npz)")
    ap.add_argument("--overwrite", action="store_true",
                    help="allow --out to replace an existing file or to point inside the minillm package "
                         "(the shipped checkpoints)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)

    config = PRESETS[args.preset]
    if args.seq_len > config.max_seq_len:
        ap.error(f"argument --seq-len: {args.seq_len} exceeds the {args.preset} preset's max_seq_len "
                 f"{config.max_seq_len}")
    out = args.out or default_out(args.preset)
    problem = check_out(out, args.overwrite)
    if problem:
        ap.error(problem)
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(args.device)
    except RuntimeError:
        ap.error(f"argument --device: unknown device {args.device!r} (cuda, cuda:N, cpu or auto)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"argument --device: {args.device!r}, but torch sees no CUDA GPU")
    print(f"training {args.preset}: {config.n_params():,} parameters on {args.device}; config {asdict(config)}")
    try:
        params, meta, log = train(config, steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                                  device=args.device, max_minutes=args.max_minutes, eval_every=args.eval_every,
                                  seed=args.seed, corpus_limit=args.corpus_limit, corpus_root=args.corpus_root,
                                  progress=not args.no_progress)
    except CorpusError as e:
        ap.error(str(e))
    meta["preset"] = args.preset
    save_checkpoint(out, config, params, meta)
    log_path = log_path_for(out)
    log_path.write_text(json.dumps(log))
    print(json.dumps(meta, indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB) and {log_path}")


if __name__ == "__main__":
    main()
