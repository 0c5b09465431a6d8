"""The baseline the engine's small-batch decode is held against (issue 36): gpt-fast's recipe over the same weights.

A static KV cache per layer, (B, Hkv, max_len, D), written in place at the step's position; torch SDPA over the
whole cache with a mask up to the position; the fused Q/K/V and gate/up products of ``TorchModel``; greedy
argmax on the device; the next step fed from the device (no host sync per token). ``compile=True`` wraps the
step in ``torch.compile(mode="reduce-overhead", fullgraph=True)``: Inductor fuses the elementwise work (RMSNorm,
RoPE, SiLU) into few kernels and replays the step from a CUDA graph, as gpt-fast does.

The engine carries what this loop does not: paging, a scheduler, ragged batches, sampling parameters, preemption.
The comparison asks what those cost per token at batch 1, 8 and 64.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from minillm.torch_model import TorchModel, rms_norm, rotate_half


class StaticDecoder(nn.Module):
    """One decode step of ``model`` over a static cache of ``batch`` rows and ``max_len`` positions."""

    def __init__(self, model: TorchModel, batch: int, max_len: int):
        super().__init__()
        cfg = model.config
        if not model.fused:
            model.fuse_projections()
        self.model = model
        p = next(model.parameters())
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.d_head)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=p.dtype, device=p.device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=p.dtype, device=p.device), persistent=False)
        self.register_buffer("arange", torch.arange(max_len, device=p.device), persistent=False)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """ids (B,) long, pos (1,) long (every row at the same position) -> the greedy next ids (B,)."""
        m, cfg = self.model, self.model.config
        B, H, Hkv, hd = ids.shape[0], cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        cos, sin = m.rope_at(pos)                                  # (1, hd/2)
        mask = (self.arange <= pos)[None, None, None, :]           # keys 0..pos
        x = m.tok_emb[ids]                                         # (B, d)
        for i, blk in enumerate(m.layers):
            h = rms_norm(x, blk.attn_norm, cfg.norm_eps)
            q, k, v = (h @ blk.wqkv).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
            q = rotate_half(q.view(B, H, hd), cos, sin)[:, :, None]          # (B, H, 1, hd)
            k = rotate_half(k.view(B, Hkv, hd), cos, sin)[:, :, None]
            self.k_cache[i].index_copy_(2, pos, k.to(self.k_cache.dtype))
            self.v_cache[i].index_copy_(2, pos, v.view(B, Hkv, 1, hd).to(self.v_cache.dtype))
            a = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask, enable_gqa=True)
            x = x + a.reshape(B, H * hd) @ blk.wo
            h = rms_norm(x, blk.mlp_norm, cfg.norm_eps)
            gate, up = (h @ blk.w_gate_up).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ blk.w_down
        return (rms_norm(x, m.norm, cfg.norm_eps) @ m.lm_head).argmax(dim=-1)


class StaticLoop:
    """The baseline's greedy loop over one prompt (the same prompt in every row): the prompt fed one token at a time
    at construction (untimed), then ``run()`` decodes ``n_tokens`` from there, as often as asked. Each run writes
    the same cache positions again, so runs are repeats of one measurement and give the same tokens."""

    @torch.inference_mode()
    def __init__(self, model: TorchModel, prompt: list[int], n_tokens: int, batch: int = 1, compile: bool = False):
        self.dec = StaticDecoder(model, batch, len(prompt) + n_tokens)
        self.step = torch.compile(self.dec, mode="reduce-overhead", fullgraph=True) if compile else self.dec
        self.dev, self.batch, self.start, self.n_tokens = self.dec.k_cache.device, batch, len(prompt), n_tokens
        for i, t in enumerate(prompt):
            nxt = self.step(torch.full((batch,), t, device=self.dev, dtype=torch.long), torch.tensor([i], device=self.dev))
        self.first = nxt.clone()

    @torch.inference_mode()
    def run(self) -> tuple[list[int], float]:
        """(the greedy tokens of row 0, the mean seconds per decode step over the ``n_tokens - 1`` steps after the
        first token): wall clock with one sync at the end, tokens/s as gpt-fast reports it."""
        cuda = self.dev.type == "cuda"
        nxt = self.first.clone()
        out = [nxt[:1].clone()]
        if cuda:
            torch.cuda.synchronize(self.dev)
        t0 = time.perf_counter()
        for j in range(self.n_tokens - 1):                         # each step fed from the device: no host sync
            nxt = self.step(nxt.clone(), torch.tensor([self.start + j], device=self.dev))
            out.append(nxt[:1].clone())
        if cuda:
            torch.cuda.synchronize(self.dev)
        per_step = (time.perf_counter() - t0) / max(self.n_tokens - 1, 1)
        return [int(t) for t in torch.cat(out).tolist()], per_step


def static_greedy(model: TorchModel, prompt: list[int], n_tokens: int, batch: int = 1, compile: bool = False,
                  timed: bool = False) -> tuple[list[int], float | None]:
    """Greedy tokens of ``prompt`` (the same prompt in every row) and, with ``timed``, the mean seconds per decode
    step (one ``StaticLoop`` run)."""
    tokens, per_step = StaticLoop(model, prompt, n_tokens, batch, compile).run()
    return tokens, per_step if timed else None
