"""A Llama-style decoder in NumPy: the float32 reference forward pass.

Parts, in order: token embedding -> n_layers x [RMSNorm -> grouped-query
self-attention with RoPE -> residual -> RMSNorm -> SwiGLU MLP -> residual]
-> final RMSNorm -> LM head.

Two hooks make this the model every later chapter reuses:

* ``attn_fn`` -- any function with ``standard_attention``'s signature and
  layout ``(q, k, v, causal, scale)``. The FlashAttention and paged kernels are
  swapped in here.
* ``cache`` -- any object with ``length``, ``write(layer, k, v)`` and
  ``advance(n)`` (see :mod:`minillm.kvcache`). With a cache, ``forward`` only
  computes the new positions and attends against everything cached so far.

Weight matrices are stored (in_features, out_features) so that ``x @ W`` is the
projection, in NumPy and in PyTorch alike (see :mod:`minillm.torch_model`).
"""
from __future__ import annotations

import json
import zipfile
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .attention import standard_attention
from .tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = VOCAB_SIZE
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: int = 2
    d_ff: int = 640
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"ModelConfig.{name} must be an integer >= 1, got {v!r}")
        for name, what in (("rope_theta", "RoPE's base"), ("norm_eps", "RMSNorm's epsilon, rms_norm_eps in HF")):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(v) or v <= 0:
                raise ValueError(f"ModelConfig.{name} ({what}) must be a finite number > 0, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.d_head % 2:
            raise ValueError(f"RoPE needs an even head dim, got {self.d_head}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name and shape; the checkpoint and both forwards use these names."""
        d, hd = self.d_model, self.d_head
        shapes: dict[str, tuple[int, ...]] = {"tok_emb": (self.vocab_size, d)}
        for i in range(self.n_layers):
            p = f"layers.{i}."
            shapes |= {
                p + "attn_norm": (d,),
                p + "wq": (d, self.n_heads * hd),
                p + "wk": (d, self.n_kv_heads * hd),
                p + "wv": (d, self.n_kv_heads * hd),
                p + "wo": (self.n_heads * hd, d),
                p + "mlp_norm": (d,),
                p + "w_gate": (d, self.d_ff),
                p + "w_up": (d, self.d_ff),
                p + "w_down": (self.d_ff, d),
            }
        shapes |= {"norm": (d,), "lm_head": (d, self.vocab_size)}
        return shapes

    def n_params(self) -> int:
        return int(sum(np.prod(s) for s in self.param_shapes().values()))


# Llama-3.2-1B's shape (its published config.json: 16 layers, d_model 2048, 32 query and 8 KV heads, d_ff 8192,
# a 128,256-token vocabulary, rope_theta 500,000), with the 2,048-token context the book's GPU runs use. The model
# ties its input and output embeddings; minillm keeps a separate lm_head of the same shape, so a step reads the
# same bytes. Chapters 8 to 11 and the benchmarks use it as "the 1B shape".
LLAMA_1B = ModelConfig(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8, d_ff=8192,
                       max_seq_len=2048, rope_theta=500000.0)

def init_params(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights (GPT-2 style init: N(0, 0.02), residual outputs scaled down by depth)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in config.param_shapes().items():
        if name.endswith("norm"):
            out[name] = np.ones(shape, np.float32)
        else:
            std = 0.02 / np.sqrt(2 * config.n_layers) if name.endswith(("wo", "w_down")) else 0.02
            out[name] = rng.normal(0.0, std, shape).astype(np.float32)
    return out


# --------------------------------------------------------------------------- ops counting


@dataclass
class StepOps:
    """Work done by one forward call, counted from the shapes actually computed.

    attn_rows       query rows pushed through attention (per layer and head)
    score_elements  entries of Q K^T computed, summed over every layer and head
    proj_flops      2*m*k*n over every weight matmul (QKV, output, MLP, LM head)
    """

    attn_rows: int = 0
    score_elements: int = 0
    proj_flops: int = 0

    def __add__(self, other: "StepOps") -> "StepOps":
        return StepOps(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, int, int]:
        return (self.attn_rows, self.score_elements, self.proj_flops)

    def count_matmul(self, m: int, k: int, n: int) -> None:
        """Count one weight matmul, an (m, k) activation times a (k, n) weight: 2*m*k*n FLOPs."""
        # BEGIN SOLUTION
        self.proj_flops += 2 * m * k * n
        # END SOLUTION

    def count_attention(self, batch: int, n_heads: int, n_queries: int, n_keys: int) -> None:
        """Count one layer's attention: every head scores each of ``n_queries`` rows against ``n_keys`` keys."""
        # BEGIN SOLUTION
        self.score_elements += batch * n_heads * n_queries * n_keys
        # END SOLUTION


def _linear(x: np.ndarray, w: np.ndarray, ops: StepOps | None) -> np.ndarray:
    if ops is not None:
        ops.count_matmul(x.size // x.shape[-1], w.shape[0], w.shape[1])
    return x @ w


# --------------------------------------------------------------------------- building blocks


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope_tables(positions: np.ndarray, d_head: int, theta: float, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables, shape (N, d_head/2), for the given absolute positions (computed in float64, then ``dtype``)."""
    inv_freq = theta ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate pairs (x[i], x[i + D/2]) by position-dependent angles ("rotate half" form).

    x: (B, H, N, D); cos, sin: (N, D/2).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


# --------------------------------------------------------------------------- the model


def check_token_ids(ids, vocab_size: int) -> np.ndarray:
    """Return ids as an int64 array, or raise a clear error for non-integer / out-of-vocab ids."""
    arr = np.asarray(ids)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{arr.min()}, {arr.max()}]")
    return arr.astype(np.int64, copy=False)


def check_prompt_ids(prompt_ids, vocab_size: int) -> list[int]:
    """A prompt as a list of ints, or a clear error: text instead of ids, empty, not 1-D, out of vocabulary."""
    if isinstance(prompt_ids, (str, bytes)):
        raise TypeError("prompt_ids must be token ids; encode text with ByteTokenizer first")
    if np.size(prompt_ids) == 0:
        raise ValueError("prompt is empty: a decoder needs at least one token to condition on")
    ids = check_token_ids(prompt_ids, vocab_size)
    if ids.ndim != 1:
        raise ValueError(f"prompt_ids must be 1-D, got shape {ids.shape}")
    return [int(t) for t in ids]


@dataclass
class Model:
    """The NumPy reference model. ``forward`` is pure given (params, ids, cache).

    It computes in float32 (``dtype``), as the GPU models do. ``astype(np.float64)`` gives the same model in
    float64: a chapter that needs the model's exact probabilities (to compare two samplers' distributions, say)
    uses it, because float32 results differ in their last bits from one CPU to another (BLAS kernels and SIMD
    ``exp`` are chosen by CPU feature) and float64's differences are a billion times smaller.
    """

    config: ModelConfig
    params: dict[str, np.ndarray]
    attn_fn: object = field(default=standard_attention, repr=False)
    meta: dict = field(default_factory=dict, repr=False)
    dtype: object = np.float32

    def __post_init__(self):
        expected = self.config.param_shapes()
        missing = expected.keys() - self.params.keys()
        extra = self.params.keys() - expected.keys()
        if missing or extra:
            raise ValueError(f"parameter names do not match the config: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}")
        for name, shape in expected.items():
            if tuple(self.params[name].shape) != shape:
                raise ValueError(f"{name} has shape {self.params[name].shape}, config expects {shape}")
        if np.dtype(self.dtype) not in (np.float32, np.float64):
            raise ValueError(f"Model computes in float32 or float64, got dtype {self.dtype!r}")
        self.dtype = np.dtype(self.dtype)
        self.params = {k: np.asarray(v, dtype=self.dtype) for k, v in self.params.items()}

    def astype(self, dtype) -> "Model":
        """The same model computing in ``dtype`` (float32 or float64); the parameters are copied."""
        return Model(self.config, dict(self.params), self.attn_fn, dict(self.meta), dtype)

    def new_cache(self, batch: int = 1, capacity: int | None = None):
        from .kvcache import KVCache

        return KVCache.allocate(self.config, batch=batch, capacity=capacity, dtype=self.dtype)

    def forward(self, ids, cache=None, ops: StepOps | None = None, return_hidden: bool = False):
        """Logits for every input position.

        ids: (N,) or (B, N) integer array. Returns (N, V) or (B, N, V) in the model's dtype (float32).
        With ``cache``, the ids are the *new* positions starting at
        ``cache.length``; their K/V are written into the cache.
        With ``return_hidden=True`` it returns ``(logits, hidden)``: ``hidden`` (N, d_model) or
        (B, N, d_model) is the final hidden state, the residual stream after the last RMSNorm, so that
        ``logits == hidden @ params["lm_head"]``. Medusa-style heads (:mod:`minillm.medusa`) read it.
        """
        cfg = self.config
        ids = check_token_ids(ids, cfg.vocab_size)
        squeeze = ids.ndim == 1
        if squeeze:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids must be (N,) or (B, N) with N >= 1, got shape {ids.shape}")
        B, N = ids.shape
        start = cache.length if cache is not None else 0
        if start + N > cfg.max_seq_len:
            raise ValueError(f"positions {start}..{start + N - 1} exceed max_seq_len={cfg.max_seq_len}")
        cos, sin = rope_tables(np.arange(start, start + N), cfg.d_head, cfg.rope_theta, self.dtype)
        P = self.params
        hd = cfg.d_head

        def heads(t: np.ndarray, n_heads: int) -> np.ndarray:  # (B, N, H*hd) -> (B, H, N, hd)
            return t.reshape(B, N, n_heads, hd).transpose(0, 2, 1, 3)

        x = P["tok_emb"][ids]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            h = rms_norm(x, P[p + "attn_norm"], cfg.norm_eps)
            q = apply_rope(heads(_linear(h, P[p + "wq"], ops), cfg.n_heads), cos, sin)
            k = apply_rope(heads(_linear(h, P[p + "wk"], ops), cfg.n_kv_heads), cos, sin)
            v = heads(_linear(h, P[p + "wv"], ops), cfg.n_kv_heads)
            if cache is not None:
                k, v = cache.write(layer, k, v)  # views of all cached positions
            attend = getattr(cache, "attend", None)  # a paged cache reads K/V through its block tables
            a = attend(layer, q, k, v) if attend is not None else self.attn_fn(q, k, v, causal=True)
            if ops is not None:
                ops.count_attention(B, cfg.n_heads, N, start + N)
            x = x + _linear(a.transpose(0, 2, 1, 3).reshape(B, N, cfg.n_heads * hd), P[p + "wo"], ops)
            h = rms_norm(x, P[p + "mlp_norm"], cfg.norm_eps)
            gated = silu(_linear(h, P[p + "w_gate"], ops)) * _linear(h, P[p + "w_up"], ops)
            x = x + _linear(gated, P[p + "w_down"], ops)
        if cache is not None:
            cache.advance(N)
        if ops is not None:
            ops.attn_rows += B * N
        hidden = rms_norm(x, P["norm"], cfg.norm_eps)
        logits = _linear(hidden, P["lm_head"], ops)
        if return_hidden:
            return (logits[0], hidden[0]) if squeeze else (logits, hidden)
        return logits[0] if squeeze else logits


    def forward_ragged(self, ids, positions, slot_mapping, block_tables, context_lens, cu_seqlens_q,
                       k_pool, v_pool, ops: StepOps | None = None, attn_fn=None,
                       logits_rows=None) -> np.ndarray:
        """One serving step: the new tokens of S sequences, flat, against a paged K/V pool.

        ids, positions, slot_mapping  (T,)     token, its absolute position, the pool slot its K/V goes to
                                               (slot = block * block_size + offset; -1 = padding, not written)
        block_tables (S, max_blocks) int32, context_lens (S,) int32 (new tokens included),
        cu_seqlens_q (S+1,) int32              sequence s owns rows cu_seqlens_q[s]:cu_seqlens_q[s+1]
        k_pool, v_pool  (n_layers, num_blocks, block_size, Hkv, D), written in place

        Returns the logits of ``logits_rows`` (default: each sequence's last new token), shape (len, V), computed
        in the model's dtype (attention runs in the pools' dtype: float64 pools for a float64-exact step).
        ``attn_fn`` has :func:`minillm.paged.attention.paged_varlen_attention`'s signature.
        """
        if attn_fn is None:
            from .paged.attention import paged_varlen_attention as attn_fn
        cfg = self.config
        ids = check_token_ids(ids, cfg.vocab_size)
        positions = np.asarray(positions)
        slots = np.asarray(slot_mapping, np.int64)
        T = ids.shape[0] if ids.ndim == 1 else -1
        if T < 1 or positions.shape != (T,) or slots.shape != (T,):
            raise ValueError(f"ids, positions and slot_mapping must be (T,) with T >= 1, got "
                             f"{ids.shape}, {positions.shape}, {slots.shape}")
        if positions.min() < 0 or positions.max() >= cfg.max_seq_len:
            raise ValueError(f"positions must lie in [0, {cfg.max_seq_len}), got [{positions.min()}, {positions.max()}]")
        n_slots = k_pool.shape[1] * k_pool.shape[2]
        if slots.max() >= n_slots or slots.min() < -1:
            raise ValueError(f"slot_mapping must lie in [-1, {n_slots}), got [{slots.min()}, {slots.max()}]")
        cos, sin = rope_tables(positions, cfg.d_head, cfg.rope_theta, self.dtype)
        P, hd, H, Hkv = self.params, cfg.d_head, cfg.n_heads, cfg.n_kv_heads
        keep = slots >= 0

        def rope(t):   # (T, heads, hd): apply_rope's layout is (..., N, D) with the tables (N, D/2)
            return apply_rope(t.transpose(1, 0, 2), cos, sin).transpose(1, 0, 2)

        x = P["tok_emb"][ids]
        for layer in range(cfg.n_layers):
            p = f"layers.{layer}."
            h = rms_norm(x, P[p + "attn_norm"], cfg.norm_eps)
            q = rope(_linear(h, P[p + "wq"], ops).reshape(T, H, hd))
            k = rope(_linear(h, P[p + "wk"], ops).reshape(T, Hkv, hd))
            v = _linear(h, P[p + "wv"], ops).reshape(T, Hkv, hd)
            kf = k_pool[layer].reshape(n_slots, Hkv, hd)   # views: writing them writes the pool
            vf = v_pool[layer].reshape(n_slots, Hkv, hd)
            kf[slots[keep]] = k[keep]
            vf[slots[keep]] = v[keep]
            a = attn_fn(q.astype(k_pool.dtype), k_pool[layer], v_pool[layer], block_tables, context_lens,
                        cu_seqlens_q)
            x = x + _linear(np.asarray(a, self.dtype).reshape(T, H * hd), P[p + "wo"], ops)
            h = rms_norm(x, P[p + "mlp_norm"], cfg.norm_eps)
            gated = silu(_linear(h, P[p + "w_gate"], ops)) * _linear(h, P[p + "w_up"], ops)
            x = x + _linear(gated, P[p + "w_down"], ops)
        if ops is not None:
            lens, cu = np.asarray(context_lens, np.int64), np.asarray(cu_seqlens_q, np.int64)
            qlen = np.diff(cu)
            # counted as forward() counts them: every new row against the whole context (masked ones included)
            ops.score_elements += int(cfg.n_layers * H * np.sum(qlen * lens))
            ops.attn_rows += T
        rows = np.asarray(cu_seqlens_q, np.int64)[1:] - 1 if logits_rows is None else np.asarray(logits_rows)
        return _linear(rms_norm(x[rows], P["norm"], cfg.norm_eps), P["lm_head"], ops)


# --------------------------------------------------------------------------- checkpoints

WEIGHTS_DIR = Path(__file__).parent / "weights"


def save_checkpoint(path, config: ModelConfig, params: dict[str, np.ndarray], meta: dict | None = None) -> Path:
    """Write an .npz checkpoint: one float16 array per parameter, plus two JSON strings.

    Format (readable with nothing but NumPy, no pickle):
      ``<param name>``  float16 array, shape from ``ModelConfig.param_shapes()``
      ``__config__``    0-d unicode array holding ``json.dumps(asdict(config))``
      ``__meta__``      0-d unicode array holding training metadata (command, device, loss, ...)
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, dtype=np.float16) for k, v in params.items()}
    arrays["__config__"] = np.array(json.dumps(asdict(config)))
    arrays["__meta__"] = np.array(json.dumps(meta or {}))
    np.savez(path, **arrays)
    return path


class CheckpointError(ValueError):
    """A checkpoint, Medusa-heads or training-log file that exists but cannot be used. The message names the
    file and what is wrong: not an .npz archive, truncated, an entry missing, pickled objects, bad JSON, ..."""


def read_npz(path, what: str = "checkpoint") -> dict[str, np.ndarray]:
    """Every array of an .npz file, read with ``allow_pickle=False``, in the file's order.

    Raises :class:`CheckpointError` naming the file when it is not a complete .npz archive (empty, not a zip,
    truncated, a bad CRC), when an entry is not a NumPy array, or when an entry is an object array (pickled
    Python objects: loading those can run arbitrary code, and no minillm file contains one).
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a directory, not a .npz {what}")
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != b"PK\x03\x04":
        why = "the file is empty" if not head else "it does not start with the zip signature (corrupt, or not an .npz)"
        raise CheckpointError(f"{path} is not a valid .npz {what}: {why}")
    arrays = {}
    try:
        with np.load(path, allow_pickle=False) as f:
            for key in f.files:
                try:
                    value = f[key]
                except ValueError as e:
                    if "allow_pickle" not in str(e):
                        raise
                    raise CheckpointError(f"{path}: entry {key!r} contains object arrays (pickled Python objects); "
                                          f"a {what} holds only numeric arrays and JSON strings, and loading pickles "
                                          f"can run arbitrary code, so it is refused") from None
                if not isinstance(value, np.ndarray):
                    raise CheckpointError(f"{path}: entry {key!r} is not a NumPy array, so this is not a .npz {what}")
                arrays[key] = value
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError, ValueError, zlib.error) as e:
        raise CheckpointError(f"{path} is not a valid .npz {what}: it is truncated or corrupt "
                              f"({type(e).__name__}: {e})") from e
    return arrays


def read_json_entry(path, arrays: dict[str, np.ndarray], key: str) -> dict:
    """The JSON object stored as the 0-d string entry ``key`` of an .npz (``__config__``, ``__meta__``)."""
    value = arrays[key]
    if value.shape != () or value.dtype.kind != "U":
        raise CheckpointError(f"{path}: entry {key!r} must be a 0-d string holding JSON, got a {value.dtype} "
                              f"array of shape {value.shape}")
    try:
        obj = json.loads(str(value))
    except ValueError as e:
        raise CheckpointError(f"{path}: entry {key!r} is not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: entry {key!r} must hold a JSON object, got {type(obj).__name__}")
    return obj


def load_checkpoint(path) -> tuple[ModelConfig, dict[str, np.ndarray], dict]:
    """Read a checkpoint written by :func:`save_checkpoint`: (config, float32 params, meta).

    A file that is not one raises :class:`CheckpointError` (a ``ValueError``) naming the file and the
    problem: not a valid .npz (empty, truncated, corrupt), object arrays, a missing or invalid
    ``__config__``, or parameters that do not match the config. ``__meta__`` is optional ({} without it).
    """
    path = Path(path)
    arrays = read_npz(path, "checkpoint")
    if "__config__" not in arrays:
        hint = ""
        if "w" in arrays:
            try:
                target = read_json_entry(path, arrays, "__meta__").get("target") if "__meta__" in arrays else None
            except CheckpointError:
                target = None
            hint = (f"; it holds Medusa heads{f' for the {target!r} model' if target else ''} (an entry 'w'), "
                    f"not a model: load those with minillm.medusa.load_medusa"
                    f"{f', and the model with load_model({target!r})' if target else ''}")
        raise CheckpointError(f"{path} is missing the '__config__' entry (the ModelConfig as JSON), so it is "
                              f"not a minillm model checkpoint{hint}")
    fields = read_json_entry(path, arrays, "__config__")
    try:
        config = ModelConfig(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: '__config__' is not a valid ModelConfig ({e})") from None
    meta = read_json_entry(path, arrays, "__meta__") if "__meta__" in arrays else {}
    params = {k: v for k, v in arrays.items() if not k.startswith("__")}
    expected = config.param_shapes()
    missing, extra = sorted(expected.keys() - params.keys()), sorted(params.keys() - expected.keys())
    if missing or extra:
        raise CheckpointError(f"{path}: its parameters do not match its '__config__': missing {missing[:5]}, "
                              f"unexpected {extra[:5]}")
    for name, shape in expected.items():
        a = params[name]
        if a.dtype.kind not in "fiu":
            raise CheckpointError(f"{path}: parameter {name!r} has dtype {a.dtype}, not a real number type")
        if a.shape != tuple(shape):
            raise CheckpointError(f"{path}: parameter {name!r} has shape {a.shape}, its '__config__' says {shape}")
    return config, {k: v.astype(np.float32) for k, v in params.items()}, meta


def shipped_models() -> list[str]:
    """Names of the shipped model checkpoints, for :func:`load_model` (not the Medusa heads files beside them,
    which hold no model: :func:`minillm.medusa.load_medusa` reads those)."""
    names = []
    for p in sorted(WEIGHTS_DIR.glob("*.npz")):
        try:
            with np.load(p, allow_pickle=False) as f:
                if "__config__" in f.files:
                    names.append(p.stem)
        except Exception:                       # a broken file is no model to offer
            continue
    return names


def load_model(name: str = "tiny", attn_fn=standard_attention) -> Model:
    """Load a shipped checkpoint ("tiny" or "draft") or a path to an .npz file. No network."""
    path = Path(name) if str(name).endswith(".npz") else WEIGHTS_DIR / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint {path}; shipped models: {shipped_models()}")
    config, params, meta = load_checkpoint(path)
    return Model(config, params, attn_fn=attn_fn, meta=meta)


def load_training_log(name: str = "tiny") -> dict[str, list[float]]:
    """The training log shipped next to a checkpoint ("tiny" or "draft"), as ``python -m minillm.train`` wrote it.

    ``name`` may also be a path: a ``..._log.json`` file, or a checkpoint ``.npz`` whose ``<stem>_log.json``
    sits next to it (where the training CLIs write it).
    Keys: ``step`` and ``train_loss`` (one batch's loss, every few steps), ``val_step`` and
    ``val_loss`` (held-out loss at each evaluation), ``seconds`` (wall time at each logged step).
    Losses are cross-entropy in nats per byte. A file that is not such a log raises :class:`CheckpointError`.
    """
    if str(name).endswith(".json"):
        path = Path(name)
    elif str(name).endswith(".npz"):
        path = Path(name).with_name(Path(name).stem + "_log.json")
    else:
        path = WEIGHTS_DIR / f"{name}_log.json"
    if not path.exists():
        shipped = sorted(p.name.removesuffix("_log.json") for p in WEIGHTS_DIR.glob("*_log.json"))
        raise FileNotFoundError(f"no training log {path.name}; shipped logs: {shipped}")
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:             # JSONDecodeError and UnicodeDecodeError both are
        raise CheckpointError(f"{path} is not a valid training log: not UTF-8 JSON, truncated or corrupt "
                              f"({type(e).__name__}: {e})") from None
    if not isinstance(log, dict):
        raise CheckpointError(f"{path} is not a training log: it holds a JSON {type(log).__name__}, not an object")
    missing = {"step", "train_loss", "val_step", "val_loss"} - set(log)
    if missing or len(log["step"]) != len(log["train_loss"]) or len(log["val_step"]) != len(log["val_loss"]):
        raise CheckpointError(f"{path} is not a training log: missing {sorted(missing)} or mismatched lengths")
    return log
