"""Medusa-style draft heads (chapter 9): the drafter reads the target's own hidden state.

A Medusa head is a small block on top of the *target*: no second model, no second token stream. Head j
(j = 0..K-1) reads the target's final hidden state h_t at position t -- the residual stream after the last
RMSNorm, the vector the LM head turns into the logits of token t+1 -- and predicts token t+2+j through one
residual block and the target's own, frozen, LM head (Medusa-1, Cai et al. 2024):

    logits_j = (h_t + SiLU(h_t @ W_j)) @ lm_head          W_j: (d_model, d_model), zero at initialisation

So with W_j = 0 every head starts as the target's next-token prediction, and training only learns how far
ahead to look. The target's own row at t already gives token t+1; the heads draft t+2 .. t+K+1.

How that fits :func:`minillm.speculative.speculative_decode`: at the start of a round the context ends with
the token the last verify pass emitted (the bonus or resampled token, at position L-1, L = len(context)),
and that pass computed the target's row for the token before it, position L-2, whose LM head produced it.
The heads on h_{L-2} draft positions L, L+1, ..., exactly the k slots the loop verifies. Draft i is sampled
from q_i = the shaped softmax of head i's logits (one-hot at temperature 0), and ``propose`` returns those
rows, so the acceptance test is the unchanged min(1, p/q) rule and the output is exactly the target's.

Cost: in Medusa the verify pass itself hands over h_{L-2}. ``speculative_decode`` only sees the target's
logits, so :class:`MedusaDrafter` recomputes the hidden states with its *own* forward pass of the target on
its own KV cache (the tokens the target accepted since the last round). That doubles the target work on
this CPU; it changes nothing about acceptance, which is what this module measures.

    OPENBLAS_NUM_THREADS=1 python -m minillm.medusa --train --windows 2048 --steps 2000 --threads 2 \
        --out minillm/weights/medusa_tiny.npz --overwrite
                                              # the shipped heads (CPU, a few minutes), see train_medusa
(without --out the heads go to ./runs/medusa_<target>-<YYYYmmdd-HHMMSS>.npz; writing inside the minillm
package or over an existing file needs --overwrite)
(one BLAS thread: NumPy computes the frozen target's hidden states, and busy-waiting BLAS threads slow that
down badly on a shared machine; the command and thread settings are recorded in the heads' metadata.)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .model import WEIGHTS_DIR, CheckpointError, Model, load_checkpoint, read_json_entry, read_npz, silu
from .speculative import sample_probs, to_probs


# --------------------------------------------------------------------------- the heads


@dataclass
class MedusaHeads:
    """K residual heads sharing the target's LM head. ``w``: (K, d_model, d_model) float32."""

    w: np.ndarray
    meta: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        w = np.asarray(self.w, np.float32)
        if w.ndim != 3 or w.shape[0] < 1 or w.shape[1] != w.shape[2]:
            raise ValueError(f"Medusa weights must be (K, d, d) with K >= 1, got shape {w.shape}")
        if not np.all(np.isfinite(w)):
            raise ValueError("Medusa weights contain non-finite values")
        self.w = w

    @property
    def n_heads(self) -> int:
        return int(self.w.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.w.shape[1])

    def logits(self, hidden, lm_head) -> np.ndarray:
        """Every head's logits from hidden states: (..., d) -> (..., K, V), with logits_j = (h + SiLU(h W_j)) @ lm_head."""
        h = np.asarray(hidden, np.float32)
        lm_head = np.asarray(lm_head, np.float32)
        if h.ndim < 1 or h.shape[-1] != self.d_model:
            raise ValueError(f"hidden must end in d_model={self.d_model}, got shape {h.shape}")
        if lm_head.ndim != 2 or lm_head.shape[0] != self.d_model:
            raise ValueError(f"lm_head must be (d_model={self.d_model}, V), got shape {lm_head.shape}")
        z = h[..., None, :] + silu(np.einsum("...d,kde->...ke", h, self.w))   # (..., K, d)
        return z @ lm_head

    def save(self, path) -> Path:
        """An .npz readable with NumPy alone: ``w`` (float16) and ``__meta__`` (a JSON string)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, w=self.w.astype(np.float16), __meta__=np.array(json.dumps(self.meta)))
        return path


def load_medusa(name: str = "medusa_tiny") -> MedusaHeads:
    """Load shipped heads (``"medusa_tiny"``, trained on the tiny model) or a path to an .npz file.

    A file that is not a heads file raises :class:`minillm.model.CheckpointError` (a ``ValueError``) naming
    it and the problem: not a valid .npz (empty, truncated, corrupt), object arrays, no array ``w``, a bad
    ``__meta__``, or ``w`` of the wrong shape.
    """
    path = Path(name) if str(name).endswith(".npz") else WEIGHTS_DIR / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(f"no Medusa heads at {path}; train them with `python -m minillm.medusa --train`")
    arrays = read_npz(path, "Medusa heads file")
    if "w" not in arrays:
        hint = "; it is a model checkpoint: load it with minillm.model.load_model" if "__config__" in arrays else ""
        raise CheckpointError(f"{path} holds no Medusa weights (no array 'w'){hint}")
    meta = read_json_entry(path, arrays, "__meta__") if "__meta__" in arrays else {}
    if arrays["w"].dtype.kind not in "fiu":
        raise CheckpointError(f"{path}: 'w' has dtype {arrays['w'].dtype}, not a real number type")
    try:
        return MedusaHeads(arrays["w"].astype(np.float32), meta)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


# --------------------------------------------------------------------------- the drafter


class MedusaDrafter:
    """Drafts k <= K tokens from the target's hidden state at the second-to-last context position.

    The drafter interface of :func:`~minillm.speculative.speculative_decode` (start / propose / rollback /
    max_proposal). ``propose`` runs the target over the context tokens its private cache lacks (all but the
    last), takes the final hidden state of position L-2 and applies heads 0..k-1: head j drafts position L+j.
    This recomputation stands in for reading the hidden state off the verify pass, as Medusa does (see the
    module docstring): it costs a target pass per round here, and is counted in ``target_passes``.
    A one-token context has no position L-2: no proposal, the round is a plain target step.
    """

    def __init__(self, target: Model, heads: MedusaHeads):
        if heads.d_model != target.config.d_model:
            raise ValueError(f"Medusa heads are for d_model={heads.d_model}, the target has "
                             f"d_model={target.config.d_model}")
        self.target, self.heads = target, heads
        self.vocab_size = target.config.vocab_size
        self.cache = None
        self.hidden = None          # final hidden state of position cache.length - 1 (None: not computed)
        self.calls = 0              # rounds in which the heads drafted
        self.target_passes = 0      # the drafter's own target forwards (free in a real Medusa)

    def start(self, prompt) -> None:
        self.cache = self.target.new_cache(batch=1, capacity=self.target.config.max_seq_len)
        self.hidden = None

    def max_proposal(self, context_len: int) -> int:
        return self.heads.n_heads if context_len >= 2 else 0

    def propose(self, context, k: int, rng, params):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        k = min(int(k), self.max_proposal(len(context)))
        if k <= 0:
            return [], None
        if self.cache is None:
            raise RuntimeError("call start(prompt) before propose")
        need = len(context) - 1                 # the cache must hold positions 0..L-2
        if self.cache.length > need or (self.cache.length == need and self.hidden is None):
            self.cache.truncate(need - 1)       # recompute the last position to get its hidden state
            self.hidden = None
        if self.cache.length < need:
            _, h = self.target.forward(np.asarray([context[self.cache.length:need]]), cache=self.cache,
                                       return_hidden=True)
            self.target_passes += 1
            self.hidden = h[0, -1]
        self.calls += 1
        q = to_probs(self.heads.logits(self.hidden, self.target.params["lm_head"])[:k], params)
        tokens = [sample_probs(q[i], rng.random()) for i in range(k)]
        return tokens, q

    def rollback(self, n_valid: int) -> None:
        """Keep what the first ``n_valid`` context tokens determine. The cache stops at L-2 < n_valid, so this
        only matters for a caller that rolls back further than speculative_decode ever does."""
        if self.cache is not None and n_valid < self.cache.length:
            self.cache.truncate(n_valid)
            self.hidden = None


# --------------------------------------------------------------------------- training (torch, CPU is enough)


def head_targets(windows: np.ndarray, n_heads: int, seq_len: int) -> np.ndarray:
    """Labels for every head: position t of a window is trained to predict token t+2+j with head j.

    windows: (B, seq_len + n_heads + 1) tokens; returns (B, seq_len, n_heads).
    """
    windows = np.asarray(windows)
    if windows.ndim != 2 or windows.shape[1] < seq_len + n_heads + 1:
        raise ValueError(f"windows must be (B, >= seq_len + n_heads + 1 = {seq_len + n_heads + 1}), got {windows.shape}")
    return np.stack([windows[:, 2 + j:2 + j + seq_len] for j in range(n_heads)], axis=-1)


def hidden_states(target: Model, windows: np.ndarray, seq_len: int, chunk: int = 16) -> np.ndarray:
    """The frozen target's final hidden states over the first seq_len tokens of each window: (B, seq_len, d)."""
    out = [target.forward(np.asarray(windows[i:i + chunk, :seq_len], np.int64), return_hidden=True)[1]
           for i in range(0, len(windows), chunk)]
    return np.concatenate(out).astype(np.float32)


def train_medusa(target: str = "tiny", n_heads: int = 3, steps: int = 600, batch: int = 2048,
                 n_windows: int = 768, val_windows: int = 64, seq_len: int = 128, lr: float = 3e-3,
                 seed: int = 0, corpus_root=None, corpus_limit: int | None = None, eval_every: int = 100,
                 max_minutes: float | None = None, progress: bool = True):
    """Train K Medusa heads on a frozen target; returns (MedusaHeads, log).

    Data: ``n_windows`` random windows of the target's own training split (:func:`minillm.train.load_corpus`,
    the standard library; validation windows from its validation split). The frozen target's hidden states
    are computed once, with the NumPy forward the drafter uses, then the heads train on random batches of
    positions: AdamW on the mean over heads of the cross-entropy of head j against the token j+2 ahead, with
    :func:`minillm.train.lr_at`'s warmup and cosine schedule. The log has the keys of the model logs
    (``step``, ``train_loss``, ``val_step``, ``val_loss``, ``seconds``) plus per-head validation loss and
    top-1 accuracy (``val_loss_per_head``, ``val_acc_per_head``) and ``meta``.
    """
    import torch
    import torch.nn.functional as F

    from .model import load_model
    from .train import CorpusError, load_corpus, lr_at

    if n_heads < 1 or steps < 1 or batch < 1 or n_windows < 1 or val_windows < 1 or seq_len < 1 or eval_every < 1:
        raise ValueError("n_heads, steps, batch, n_windows, val_windows, seq_len and eval_every must all be >= 1")
    if not (np.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if max_minutes is not None and not (np.isfinite(max_minutes) and max_minutes > 0):
        raise ValueError(f"max_minutes must be None or a finite number > 0, got {max_minutes!r}")
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = load_model(target)
    if seq_len > model.config.max_seq_len:
        raise ValueError(f"seq_len {seq_len} exceeds the target's max_seq_len {model.config.max_seq_len}")
    train_tok, val_tok, corpus = load_corpus(corpus_root, limit_bytes=corpus_limit)
    span = seq_len + n_heads + 1
    for split, tok in (("train", train_tok), ("validation", val_tok)):
        if tok.size <= span:
            raise CorpusError(f"the {split} split has {tok.size} tokens, not more than seq_len + n_heads + 1 = "
                              f"{span}: use a shorter seq_len or a larger corpus")

    def windows(tokens, n, gen):
        starts = gen.integers(0, tokens.size - span, size=n)
        return np.stack([tokens[s:s + span] for s in starts]).astype(np.int64)

    w_train, w_val = windows(train_tok, n_windows, rng), windows(val_tok, val_windows, np.random.default_rng(1234))
    h_train = torch.from_numpy(hidden_states(model, w_train, seq_len).reshape(-1, model.config.d_model))
    y_train = torch.from_numpy(head_targets(w_train, n_heads, seq_len).reshape(-1, n_heads))
    h_val = torch.from_numpy(hidden_states(model, w_val, seq_len).reshape(-1, model.config.d_model))
    y_val = torch.from_numpy(head_targets(w_val, n_heads, seq_len).reshape(-1, n_heads))
    hidden_seconds = time.perf_counter() - t_start
    if progress:
        print(f"hidden states of {h_train.shape[0]:,} train and {h_val.shape[0]:,} val positions "
              f"in {hidden_seconds:.0f} s", flush=True)

    lm_head = torch.from_numpy(model.params["lm_head"])                 # frozen
    d = model.config.d_model
    w = torch.zeros(n_heads, d, d, requires_grad=True)
    opt = torch.optim.AdamW([w], lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    def head_logits(h):                                                 # (N, d) -> (N, K, V)
        return (h[:, None, :] + F.silu(torch.einsum("nd,kde->nke", h, w))) @ lm_head

    def ce_per_head(h, y):
        logits = head_logits(h)
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(-1, n_heads).mean(0), logits

    log = {"step": [], "train_loss": [], "val_step": [], "val_loss": [], "seconds": [],
           "val_loss_per_head": [], "val_acc_per_head": []}

    @torch.no_grad()
    def evaluate(step):
        losses, accs = [], []
        for i in range(0, h_val.shape[0], 4096):
            ce, logits = ce_per_head(h_val[i:i + 4096], y_val[i:i + 4096])
            n = logits.shape[0]
            losses.append(ce * n)
            accs.append((logits.argmax(-1) == y_val[i:i + 4096]).float().sum(0))
        loss = (torch.stack(losses).sum(0) / h_val.shape[0]).tolist()
        acc = (torch.stack(accs).sum(0) / h_val.shape[0]).tolist()
        log["val_step"].append(step)
        log["val_loss"].append(float(np.mean(loss)))
        log["val_loss_per_head"].append(loss)
        log["val_acc_per_head"].append(acc)
        return loss, acc

    evaluate(0)                         # step 0: every head is the target's next-token prediction
    t0 = time.perf_counter()
    step = 0
    while True:
        frac = max(step / steps, (time.perf_counter() - t0) / (60 * max_minutes) if max_minutes else 0.0)
        if frac >= 1.0 and step > 0:    # at least one step, whatever the budget
            break
        frac = min(frac, 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(frac, lr, warmup=0.05)
        idx = torch.from_numpy(rng.integers(0, h_train.shape[0], size=batch))
        ce, _ = ce_per_head(h_train[idx], y_train[idx])
        loss = ce.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0 or step == 1:
            log["step"].append(step)
            log["train_loss"].append(float(loss.item()))
            log["seconds"].append(time.perf_counter() - t0)
        if step % eval_every == 0:
            vl, va = evaluate(step)
            if progress:
                print(f"step {step}: val loss per head {np.round(vl, 3).tolist()}, "
                      f"top-1 {np.round(va, 3).tolist()}", flush=True)
    if log["val_step"][-1] != step:
        evaluate(step)
    meta = {
        "command": "python -m minillm.medusa " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv and sys.argv[0].endswith("medusa.py") else "minillm.medusa.train_medusa(...)",
        "target": target, "n_heads": n_heads, "steps": step, "batch": batch, "n_windows": n_windows,
        "val_windows": val_windows, "seq_len": seq_len, "peak_lr": lr, "seed": seed,
        "train_positions": int(h_train.shape[0]), "val_positions": int(h_val.shape[0]),
        "device": "cpu", "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ},
        "hidden_state_seconds": round(hidden_seconds, 1), "train_seconds": round(time.perf_counter() - t0, 1),
        "seconds": round(time.perf_counter() - t_start, 1),
        "final_val_loss_per_head": [round(x, 4) for x in log["val_loss_per_head"][-1]],
        "final_val_acc_per_head": [round(x, 4) for x in log["val_acc_per_head"][-1]],
        "initial_val_acc_per_head": [round(x, 4) for x in log["val_acc_per_head"][0]],
        "loss_unit": "nats per byte", "corpus": corpus, "date": time.strftime("%Y-%m-%d"),
        "formula": "logits_j = (h + SiLU(h @ w[j])) @ lm_head; head j predicts the token j+2 ahead",
    }
    log["meta"] = meta
    return MedusaHeads(w.detach().numpy().copy(), meta), log


def main(argv=None) -> None:
    from .train import (CorpusError, DefaultsHelpFormatter, check_out, corpus_folder, default_out, log_path_for,
                        nonnegative_int, positive_float, positive_int)

    ap = argparse.ArgumentParser(prog="python -m minillm.medusa", formatter_class=DefaultsHelpFormatter,
                                 description="Train Medusa-style heads on a frozen shipped model (CPU).")
    ap.add_argument("--train", action="store_true", help="train and write the heads (the only action)")
    ap.add_argument("--target", default="tiny", help="the frozen model: a shipped name or a path to an .npz checkpoint")
    ap.add_argument("--heads", type=positive_int, default=3, help="number of heads K")
    ap.add_argument("--steps", type=positive_int, default=600, help="optimizer steps (at most)")
    ap.add_argument("--batch", type=positive_int, default=2048, help="positions per step")
    ap.add_argument("--windows", type=positive_int, default=768, help="training windows of the corpus")
    ap.add_argument("--seq-len", type=positive_int, default=128, help="positions per window")
    ap.add_argument("--lr", type=positive_float, default=3e-3, help="peak learning rate")
    ap.add_argument("--seed", type=nonnegative_int, default=0, help="seed for the windows and the batches")
    ap.add_argument("--max-minutes", type=positive_float, default=None,
                    help="wall-clock budget for the head training (default: none, --steps alone)")
    ap.add_argument("--corpus-root", type=corpus_folder, default=None,
                    help="folder of .py files (default: this Python's stdlib)")
    ap.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=None,
                    help="heads path, ending in .npz; the log goes next to it as <stem>_log.json "
                         "(default: ./runs/medusa_<target>-<YYYYmmdd-HHMMSS>.npz)")
    ap.add_argument("--overwrite", action="store_true",
                    help="allow --out to replace an existing file or to point inside the minillm package "
                         "(the shipped heads)")
    ap.add_argument("--no-progress", action="store_true", help="no progress messages")
    args = ap.parse_args(argv)
    if not args.train:
        ap.error("nothing to do: pass --train")
    target_path = Path(args.target) if args.target.endswith(".npz") else WEIGHTS_DIR / f"{args.target}.npz"
    if not target_path.is_file():
        shipped = sorted(p.stem for p in WEIGHTS_DIR.glob("*.npz") if not p.stem.startswith("medusa"))
        ap.error(f"argument --target: no checkpoint {target_path}; shipped models: {shipped}")
    try:
        target_config = load_checkpoint(target_path)[0]
    except CheckpointError as e:
        ap.error(f"argument --target: {e}")
    if args.seq_len > target_config.max_seq_len:
        ap.error(f"argument --seq-len: {args.seq_len} exceeds the target's max_seq_len {target_config.max_seq_len}")
    out = args.out or default_out(f"medusa_{target_path.stem}")
    problem = check_out(out, args.overwrite)
    if problem:
        ap.error(problem)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        heads, log = train_medusa(args.target, n_heads=args.heads, steps=args.steps, batch=args.batch,
                                  n_windows=args.windows, seq_len=args.seq_len, lr=args.lr, seed=args.seed,
                                  corpus_root=args.corpus_root, max_minutes=args.max_minutes,
                                  progress=not args.no_progress)
    except CorpusError as e:
        ap.error(str(e))
    heads.save(out)
    log_path = log_path_for(out)
    log_path.write_text(json.dumps(log))
    print(json.dumps(log["meta"], indent=1))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB) and {log_path}")


if __name__ == "__main__":
    main()
