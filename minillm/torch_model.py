"""The same model in PyTorch: for training, and for running on a GPU.

Parameter names and layouts are identical to :mod:`minillm.model` (weights are
(in, out) and applied as ``x @ W``), so a NumPy checkpoint loads with no
renaming, and ``TorchModel.state_dict()`` saves straight back to one.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .model import ModelConfig, StepOps, check_token_ids


def sdpa_attention(q, k, v, causal: bool = False, scale: float | None = None):
    """torch SDPA with minillm's bottom-right causal alignment and native GQA."""
    nq, nk = q.shape[2], k.shape[2]
    gqa = q.shape[1] != k.shape[1]
    if not causal or nq == 1:  # a single query row at the end sees every key
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if nq == nk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    # SDPA's is_causal is top-left aligned; build the bottom-right mask explicitly.
    mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(diagonal=nk - nq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.d_model, cfg.d_head
        empty = lambda *s: nn.Parameter(torch.empty(*s))  # noqa: E731 - filled by init or load
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wq, self.wk = empty(d, cfg.n_heads * hd), empty(d, cfg.n_kv_heads * hd)
        self.wv, self.wo = empty(d, cfg.n_kv_heads * hd), empty(cfg.n_heads * hd, d)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.w_gate, self.w_up, self.w_down = empty(d, cfg.d_ff), empty(d, cfg.d_ff), empty(cfg.d_ff, d)


def rotate_half(t, cos, sin):
    """RoPE in the "rotate half" form of ``minillm.model.apply_rope``; cos/sin broadcast against t[..., :D/2]."""
    half = t.shape[-1] // 2
    t1, t2 = t[..., :half], t[..., half:]
    c, s = cos.to(t.dtype), sin.to(t.dtype)
    return torch.cat([t1 * c - t2 * s, t2 * c + t1 * s], dim=-1)


def rms_norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


class TorchModel(nn.Module):
    def __init__(self, config: ModelConfig, attn_fn=sdpa_attention):
        super().__init__()
        self.config = config
        self.attn_fn = attn_fn
        self.tok_emb = nn.Parameter(torch.empty(config.vocab_size, config.d_model))
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.Parameter(torch.ones(config.d_model))
        self.lm_head = nn.Parameter(torch.empty(config.d_model, config.vocab_size))
        half = config.d_head // 2
        inv_freq = config.rope_theta ** (-torch.arange(0, half, dtype=torch.float64) * 2 / config.d_head)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.fused = False          # fuse_projections() was called: each layer has wqkv and w_gate_up

    # ---- weights in and out, in the NumPy checkpoint's names
    @classmethod
    def from_numpy(cls, config: ModelConfig, params: dict[str, np.ndarray], **kw) -> "TorchModel":
        m = cls(config, **kw)
        m.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in params.items()})
        return m

    def numpy_params(self) -> dict[str, np.ndarray]:
        return {k: v.detach().float().cpu().numpy() for k, v in self.state_dict().items()}

    def rope(self, start: int, n: int, device):
        return self.rope_at(torch.arange(start, start + n, device=device))

    def forward(self, ids: torch.Tensor, cache=None, ops: StepOps | None = None) -> torch.Tensor:
        """ids: (B, N) long tensor -> logits (B, N, V). Same semantics as ``Model.forward``."""
        cfg = self.config
        B, N = ids.shape
        start = cache.length if cache is not None else 0
        if start + N > cfg.max_seq_len:
            raise ValueError(f"positions {start}..{start + N - 1} exceed max_seq_len={cfg.max_seq_len}")
        cos, sin = self.rope(start, N, ids.device)
        hd = cfg.d_head

        def rot(t):  # (B, H, N, hd)
            return rotate_half(t, cos, sin)

        def lin(x, w):
            if ops is not None:
                ops.proj_flops += 2 * (x.numel() // x.shape[-1]) * w.shape[0] * w.shape[1]
            return x @ w.to(x.dtype)

        x = self.tok_emb[ids]
        for i, blk in enumerate(self.layers):
            h = rms_norm(x, blk.attn_norm, cfg.norm_eps)
            q = rot(lin(h, blk.wq).view(B, N, cfg.n_heads, hd).transpose(1, 2))
            k = rot(lin(h, blk.wk).view(B, N, cfg.n_kv_heads, hd).transpose(1, 2))
            v = lin(h, blk.wv).view(B, N, cfg.n_kv_heads, hd).transpose(1, 2)
            if cache is not None:
                k, v = cache.write(i, k, v)
            attend = getattr(cache, "attend", None)  # a paged cache reads K/V through its block tables
            a = attend(i, q, k, v) if attend is not None else self.attn_fn(q, k, v, causal=True)
            if ops is not None:
                ops.score_elements += B * cfg.n_heads * N * (start + N)
            x = x + lin(a.transpose(1, 2).reshape(B, N, cfg.n_heads * hd), blk.wo)
            h = rms_norm(x, blk.mlp_norm, cfg.norm_eps)
            x = x + lin(F.silu(lin(h, blk.w_gate)) * lin(h, blk.w_up), blk.w_down)
        if cache is not None:
            cache.advance(N)
        if ops is not None:
            ops.attn_rows += B * N
        return lin(rms_norm(x, self.norm, cfg.norm_eps), self.lm_head)


    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Concatenate each layer's Q/K/V and gate/up weights into one matrix (buffers beside the parameters,
        which stay the checkpoint's). At batch 1 a decode step is a chain of matrix-vector products, and
        fewer, larger ones read the weights closer to the memory bandwidth. Call again after changing weights.

        A second call writes into the same buffers, so their addresses stay put: a CUDA graph captured over this
        model (a ``TorchRunner``'s) reads them by address, and two runners may share one model."""
        for blk in self.layers:
            for name, parts in (("wqkv", (blk.wq, blk.wk, blk.wv)), ("w_gate_up", (blk.w_gate, blk.w_up))):
                fused = torch.cat(parts, dim=1)
                old = getattr(blk, name, None)
                if old is not None and old.shape == fused.shape and old.dtype == fused.dtype \
                        and old.device == fused.device:
                    old.copy_(fused)
                else:
                    blk.register_buffer(name, fused.contiguous(), persistent=False)
        self.fused = True

    def rope_at(self, positions: torch.Tensor):
        """cos/sin tables (T, d_head/2) for arbitrary per-token positions (computed in float64, as NumPy)."""
        ang = positions.to(torch.float64)[:, None] * self.inv_freq.to(positions.device)[None, :]
        return ang.cos().float(), ang.sin().float()

    def forward_ragged(self, ids, positions, slot_mapping, block_tables, context_lens, cu_seqlens_q,
                       k_pool, v_pool, attn_fn, logits_rows=None, batch_invariant: bool = False,
                       fused_ops: bool = False) -> torch.Tensor:
        """``Model.forward_ragged`` in torch: one serving step over a paged pool; returns (rows, V) logits.

        All arguments are tensors on one device; nothing here reads them on the host, so the call can
        be captured in a CUDA graph. ``slot_mapping`` must be valid slots (the runner sends padded rows
        to a spare block). ``attn_fn(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q)``
        is the paged attention to use; ``logits_rows`` the rows to project (default: every row; the NumPy
        model's default is each sequence's last row). ``batch_invariant=True`` runs every matmul and RMSNorm
        through ``minillm.kernels.batch_invariant`` (fixed reduction orders: a row's bits do not depend on the
        other rows); pass its ``attention_bi`` as ``attn_fn`` too (chapter 11). ``fused_ops=True`` (after
        :meth:`fuse_projections`) runs the elementwise work in ``minillm.kernels.fused``'s three Triton kernels:
        the residual add with each RMSNorm, RoPE with the K/V cache write, SiLU with its product (chapter 8).
        """
        if fused_ops:
            return self._forward_ragged_fused(ids, positions, slot_mapping, block_tables, context_lens,
                                              cu_seqlens_q, k_pool, v_pool, attn_fn, logits_rows, batch_invariant)
        cfg = self.config
        T = ids.shape[0]
        if batch_invariant:
            from .kernels.batch_invariant import matmul_bi as mm, rmsnorm_bi as norm
        else:
            mm, norm = torch.matmul, rms_norm
        hd, H, Hkv = cfg.d_head, cfg.n_heads, cfg.n_kv_heads
        cos, sin = self.rope_at(positions)

        def rot(t):  # (T, heads, hd): the tables broadcast over the heads
            return rotate_half(t, cos[:, None], sin[:, None])

        x = self.tok_emb[ids]
        for i, blk in enumerate(self.layers):
            h = norm(x, blk.attn_norm, cfg.norm_eps)
            if self.fused:                    # one product instead of three (fuse_projections)
                q, k, v = mm(h, blk.wqkv).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            else:
                q, k, v = mm(h, blk.wq), mm(h, blk.wk), mm(h, blk.wv)
            q = rot(q.reshape(T, H, hd))
            k = rot(k.reshape(T, Hkv, hd))
            v = v.reshape(T, Hkv, hd)
            k_pool[i].view(-1, Hkv, hd).index_copy_(0, slot_mapping, k.to(k_pool.dtype))
            v_pool[i].view(-1, Hkv, hd).index_copy_(0, slot_mapping, v.to(v_pool.dtype))
            a = attn_fn(q.to(k_pool.dtype), k_pool[i], v_pool[i], block_tables, context_lens, cu_seqlens_q)
            x = x + mm(a.reshape(T, H * hd).to(x.dtype), blk.wo)
            h = norm(x, blk.mlp_norm, cfg.norm_eps)
            if self.fused:
                gate, up = mm(h, blk.w_gate_up).chunk(2, dim=-1)
            else:
                gate, up = mm(h, blk.w_gate), mm(h, blk.w_up)
            x = x + mm(F.silu(gate) * up, blk.w_down)
        if logits_rows is not None:
            x = x[logits_rows]
        return mm(norm(x, self.norm, cfg.norm_eps), self.lm_head)


    def _forward_ragged_fused(self, ids, positions, slot_mapping, block_tables, context_lens, cu_seqlens_q,
                              k_pool, v_pool, attn_fn, logits_rows, batch_invariant: bool) -> torch.Tensor:
        """:meth:`forward_ragged` with ``fused_ops``: the same arithmetic in fewer kernels. Each layer carries the
        residual branch ``r`` to the next norm, which adds it (``x + r``) as it normalizes."""
        from .kernels.fused import rms_norm as norm, rope_kv_write, silu_mul
        if not self.fused:
            raise ValueError("fused_ops=True needs the fused projections: call fuse_projections() first")
        if batch_invariant:
            from .kernels.batch_invariant import matmul_bi as mm
        else:
            mm = torch.matmul
        cfg = self.config
        T = ids.shape[0]
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        cos, sin = self.rope_at(positions)
        x, r = self.tok_emb[ids], None
        for i, blk in enumerate(self.layers):
            h, x = (norm(x, blk.attn_norm, cfg.norm_eps), x) if r is None else \
                norm(x, blk.attn_norm, cfg.norm_eps, residual=r)
            q = rope_kv_write(mm(h, blk.wqkv), cos, sin, slot_mapping, k_pool[i], v_pool[i], H, Hkv)
            a = attn_fn(q, k_pool[i], v_pool[i], block_tables, context_lens, cu_seqlens_q)
            h, x = norm(x, blk.mlp_norm, cfg.norm_eps, residual=mm(a.reshape(T, H * hd).to(x.dtype), blk.wo))
            r = mm(silu_mul(mm(h, blk.w_gate_up)), blk.w_down)
        x = x + r
        if logits_rows is not None:
            x = x[logits_rows]
        return mm(norm(x, self.norm, cfg.norm_eps), self.lm_head)


def torch_varlen_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q):
    """Paged varlen attention in plain torch (gather each sequence, SDPA): the kernels' torch baseline.

    Reads the lengths on the host, so it cannot go in a CUDA graph; the Triton kernels can.
    """
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), context_lens.tolist()
    for s, n in enumerate(lens):
        lo, hi = cu[s], cu[s + 1]
        pos = torch.arange(n, device=q.device)
        phys = block_tables[s].long()[pos // bs]
        k, v = k_cache[phys, pos % bs], v_cache[phys, pos % bs]          # (n, Hkv, D)
        o = sdpa_attention(q[lo:hi].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                           causal=True)
        out[lo:hi] = o[0].transpose(0, 1)
    return out


class TorchDecodeAdapter:
    """A TorchModel behind the NumPy model's interface (token ids in, NumPy logits out, ``new_cache``), so the
    decode loops drive it: ``naive_decode(TorchDecodeAdapter(m), ...)`` and ``cached_decode(...)`` run the exact
    same loops on a GPU (or on CPU torch). Not a serving runner: that is
    :class:`minillm.serving.torch_runner.TorchRunner`, which executes the engine's scheduled steps.
    """

    def __init__(self, model: TorchModel, device=None, dtype=torch.float32):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        self.model = model.to(self.device).eval()
        self.config = model.config

    def new_cache(self, batch: int = 1, capacity: int | None = None):
        from .kvcache import KVCache

        cfg = self.config
        capacity = cfg.max_seq_len if capacity is None else capacity
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, capacity, cfg.d_head)
        mk = lambda: torch.zeros(shape, dtype=self.dtype, device=self.device)  # noqa: E731
        return KVCache(mk(), mk())

    @torch.no_grad()
    def forward(self, ids, cache=None, ops: StepOps | None = None) -> np.ndarray:
        arr = check_token_ids(ids, self.config.vocab_size)
        squeeze = arr.ndim == 1
        t = torch.from_numpy(np.atleast_2d(arr)).to(self.device)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            logits = self.model(t, cache=cache, ops=ops)
        out = logits.float().cpu().numpy()
        return out[0] if squeeze else out
