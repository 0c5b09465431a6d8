"""Multi-head Latent Attention (DeepSeek-V2/V3), NumPy reference.

MLA shrinks the KV cache by caching, per token and layer, one small latent
vector ``c_kv`` (width ``kv_lora_rank``) plus one rotary key ``k_rope`` shared by
every head, instead of full per-head K and V:

    c_kv   = x @ W_DKV                     (B, N, c)        cached
    k_rope = rope(x @ W_KR)                (B, N, d_rope)   cached (after RoPE)
    K_nope = c_kv @ W_UK   per head        (B, H, T, d_nope)
    V      = c_kv @ W_UV   per head        (B, H, T, d_v)
    k_h    = [K_nope_h, k_rope]            q_h = [q_nope_h, rope(q_rope_h)]

RoPE is "decoupled": it lives in its own ``d_rope`` columns, because a
position-dependent rotation between ``W_UK`` and the query would stop ``W_UK``
from being folded into the query (the absorbed path below).

Two execution paths compute the same function:

* :func:`mla_attention_decompress` expands every cached latent to per-head K/V
  and runs ordinary attention -- the readable definition.
* :func:`mla_attention_absorbed` never builds K or V: ``W_UK`` is folded into the
  query and ``W_UV`` into the output, so attention runs directly over the
  latents. This is how decoding reads only the small cache.

Simplifications against the papers (each keeps the math of the attention itself
unchanged): no low-rank query compression (``W_Q`` is one full matrix), no
RMSNorm on the latent, and ``W_DKV``/``W_KR`` are separate matrices (DeepSeek
fuses them into one projection of width ``c + d_rope``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import causal_mask, standard_attention
from .kvcache import CacheFull
from .model import apply_rope, rope_tables


@dataclass(frozen=True)
class MLAConfig:
    d_model: int
    n_heads: int
    kv_lora_rank: int   # c: width of the cached latent
    qk_nope_dim: int    # per-head query/key columns without RoPE
    qk_rope_dim: int    # decoupled rotary columns; one key shared by all heads
    v_head_dim: int
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in ("d_model", "n_heads", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"MLAConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.qk_rope_dim % 2:
            raise ValueError(f"RoPE needs an even qk_rope_dim, got {self.qk_rope_dim}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_dim + self.qk_rope_dim

    def param_shapes(self) -> dict[str, tuple[int, int]]:
        d, h, c = self.d_model, self.n_heads, self.kv_lora_rank
        return {
            "W_DKV": (d, c),
            "W_KR": (d, self.qk_rope_dim),
            "W_UK": (c, h * self.qk_nope_dim),
            "W_UV": (c, h * self.v_head_dim),
            "W_Q": (d, h * self.qk_head_dim),  # per head: [nope columns | rope columns]
            "W_O": (h * self.v_head_dim, d),
        }


def init_mla_params(cfg: MLAConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights, N(0, 1/fan_in): activations stay O(1), so softmax is not trivially flat."""
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0.0, shape[0] ** -0.5, shape).astype(np.float32)
            for name, shape in cfg.param_shapes().items()}


def mla_cache_bytes_per_token(cfg: MLAConfig, dtype_bytes: int = 2) -> int:
    """Cache bytes per token for one layer: the latent plus the shared rotary key.

    Compare standard multi-head attention: 2 * n_heads * head_dim per token.
    """
    return (cfg.kv_lora_rank + cfg.qk_rope_dim) * int(dtype_bytes)


class MLACache:
    """Preallocated per-layer MLA cache: latent (B, capacity, c) and k_rope (B, capacity, d_rope)."""

    def __init__(self, latent: np.ndarray, k_rope: np.ndarray):
        if latent.ndim != 3 or k_rope.ndim != 3 or latent.shape[:2] != k_rope.shape[:2]:
            raise ValueError(f"latent (B, T, c) and k_rope (B, T, d_rope) must share (B, T), "
                             f"got {latent.shape} and {k_rope.shape}")
        self.latent, self.k_rope = latent, k_rope
        self.length = 0

    @classmethod
    def allocate(cls, cfg: MLAConfig, batch: int = 1, capacity: int = 128, dtype=np.float32) -> "MLACache":
        if batch < 1 or capacity < 1:
            raise ValueError(f"batch and capacity must be >= 1, got {batch}, {capacity}")
        return cls(np.zeros((batch, capacity, cfg.kv_lora_rank), dtype),
                   np.zeros((batch, capacity, cfg.qk_rope_dim), dtype))

    @property
    def batch(self) -> int:
        return int(self.latent.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.latent.shape[1])

    def append(self, c_kv: np.ndarray, k_rope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store new positions; return views of every cached position. Raises CacheFull before writing."""
        n = c_kv.shape[1]
        if c_kv.shape != (self.batch, n, self.latent.shape[2]) or k_rope.shape != (self.batch, n, self.k_rope.shape[2]):
            raise ValueError(f"expected c_kv (B={self.batch}, n, {self.latent.shape[2]}) and k_rope "
                             f"(B, n, {self.k_rope.shape[2]}), got {c_kv.shape} and {k_rope.shape}")
        end = self.length + n
        if end > self.capacity:
            raise CacheFull(f"MLA cache holds {self.capacity} positions; {self.length} used, {n} more requested")
        self.latent[:, self.length:end] = c_kv
        self.k_rope[:, self.length:end] = k_rope
        self.length = end
        return self.views()

    def views(self) -> tuple[np.ndarray, np.ndarray]:
        return self.latent[:, :self.length], self.k_rope[:, :self.length]

    @property
    def nbytes(self) -> int:
        """Bytes reserved for the whole capacity, read off the arrays."""
        return int(self.latent.nbytes + self.k_rope.nbytes)

    @property
    def bytes_per_token(self) -> int:
        return self.nbytes // (self.capacity * self.batch)


def _project_and_cache(params, cfg: MLAConfig, x, cache: MLACache, start_pos):
    """Shared front half: queries for the new tokens, and the whole cache (new tokens appended).

    Returns q_nope (B,H,N,d_nope), q_rope (B,H,N,d_rope) already rotated,
    and float32 views latent (B,T,c), k_rope (B,T,d_rope).
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 3 or x.shape[2] != cfg.d_model or x.shape[1] < 1:
        raise ValueError(f"x must be (B, N>=1, d_model={cfg.d_model}), got {x.shape}")
    start = cache.length if start_pos is None else int(start_pos)
    if start != cache.length:  # positions and cache contents must not drift apart
        raise ValueError(f"start_pos={start} but the cache already holds {cache.length} positions")
    B, N, _ = x.shape
    H, dn, dr = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim
    cos, sin = rope_tables(np.arange(start, start + N), dr, cfg.rope_theta)

    q = (x @ params["W_Q"]).reshape(B, N, H, dn + dr).transpose(0, 2, 1, 3)
    q_nope, q_rope = q[..., :dn], apply_rope(q[..., dn:], cos, sin)
    c_new = x @ params["W_DKV"]
    k_rope_new = apply_rope((x @ params["W_KR"])[:, None], cos, sin)[:, 0]  # one "head", shared
    latent, k_rope = cache.append(c_new, k_rope_new)
    return q_nope, q_rope, latent.astype(np.float32), k_rope.astype(np.float32)


def _output(params, o: np.ndarray) -> np.ndarray:
    B, H, N, dv = o.shape
    return o.transpose(0, 2, 1, 3).reshape(B, N, H * dv) @ params["W_O"]


def mla_attention_decompress(params, cfg: MLAConfig, x, cache: MLACache, start_pos: int | None = None) -> np.ndarray:
    """MLA by decompressing every cached latent into per-head K and V. Returns (B, N, d_model)."""
    q_nope, q_rope, latent, k_rope = _project_and_cache(params, cfg, x, cache, start_pos)
    B, T, _ = latent.shape
    H, dv = cfg.n_heads, cfg.v_head_dim
    k_nope = (latent @ params["W_UK"]).reshape(B, T, H, cfg.qk_nope_dim).transpose(0, 2, 1, 3)
    v = (latent @ params["W_UV"]).reshape(B, T, H, dv).transpose(0, 2, 1, 3)
    k = np.concatenate([k_nope, np.broadcast_to(k_rope[:, None], (B, H, T, cfg.qk_rope_dim))], axis=-1)
    q = np.concatenate([q_nope, q_rope], axis=-1)
    # standard_attention wants K and V of one width; zero columns change no score and
    # add only zero output columns (vLLM pads V the same way for its attention kernels).
    width = max(cfg.qk_head_dim, dv)

    def pad(t):
        return np.pad(t, [(0, 0)] * 3 + [(0, width - t.shape[-1])])

    o = standard_attention(pad(q), pad(k), pad(v), causal=True, scale=cfg.qk_head_dim ** -0.5)
    return _output(params, o[..., :dv])


def mla_attention_absorbed(params, cfg: MLAConfig, x, cache: MLACache, start_pos: int | None = None) -> np.ndarray:
    """MLA with W_UK folded into the query and W_UV into the output: attention over the latents.

    q_nope_h . (W_UK_h^T c) == (q_nope_h W_UK_h^T) . c, so each head's query moves into
    latent space (width c) and the scores read the cache directly. Seen from the
    cache, this is multi-query attention with a single shared head whose key is
    [c, k_rope] (width c + d_rope) and whose value is c alone (width c): the value
    is the first c columns of the key, so it costs no storage of its own.
    """
    q_nope, q_rope, latent, k_rope = _project_and_cache(params, cfg, x, cache, start_pos)
    H, c = cfg.n_heads, cfg.kv_lora_rank
    w_uk = params["W_UK"].reshape(c, H, cfg.qk_nope_dim).transpose(1, 0, 2)   # (H, c, d_nope)
    w_uv = params["W_UV"].reshape(c, H, cfg.v_head_dim).transpose(1, 0, 2)    # (H, c, d_v)

    q_lat = q_nope @ w_uk.transpose(0, 2, 1)                                  # (B, H, N, c)
    s = (q_lat @ latent[:, None].swapaxes(-1, -2)
         + q_rope @ k_rope[:, None].swapaxes(-1, -2)) * np.float32(cfg.qk_head_dim ** -0.5)  # (B, H, N, T)
    s = np.where(causal_mask(s.shape[-2], s.shape[-1]), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))   # every row sees >= 1 key: max is finite
    p /= p.sum(axis=-1, keepdims=True)
    o_lat = p @ latent[:, None]                                               # (B, H, N, c)
    # Per head back out of latent space. (A deployment folds W_UV into W_O once, offline.)
    return _output(params, o_lat @ w_uv)
