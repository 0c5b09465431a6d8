"""The GPU runner: the torch model over paged bf16 pools, the Triton paged kernels, CUDA graphs for decode.

Per step it copies the step's metadata to the device, runs ``TorchModel.forward_ragged`` and samples on
the device; the only host sync is reading the sampled tokens back. Attention:

* a step of decodes only (one new token per sequence) uses the split-K decode kernel
  (``minillm.kernels.paged_attention``), replayed from a CUDA graph captured for the padded batch size;
* a step with prefill chunks uses the varlen kernel (``minillm.kernels.paged_prefill``), eagerly;
* ``attention="torch"`` swaps both for a gather + SDPA baseline (slow; for checking).

The pools have one extra block past the block manager's: padded graph rows write their K/V there.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..torch_model import TorchModel, torch_varlen_attention
from .batch import StepBatch
from .runner import sampling_arrays

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """``minillm.sampling.mix32`` on int64 tensors (the low 32 bits of a wrapped product are exact)."""
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _M32
    x = ((x ^ (x >> 15)) * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def counter_uniform(seed: torch.Tensor, step: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``minillm.sampling.counter_uniform`` on the device: the same bits, so the same uniforms."""
    seed = (seed.long() & _M32)[:, None]
    step = (step.long() & _M32)[:, None]
    ids = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)[None, :]
    h = _mix32(_mix32(_mix32(seed ^ 0x9E3779B9) ^ step) ^ ids)
    h = _mix32(h ^ ((seed * 0x85EBCA6B) & _M32))
    return (h.double() + 0.5) / 2.0**32


def sample_on_device(logits, temperature, top_k, top_p, seed, step) -> torch.Tensor:
    """``minillm.sampling.sample_batch`` on the device, every row at once, no host sync.

    Float64 like the NumPy version, so both pick the same token from the same logits (up to ties).
    """
    z = logits.double()
    S, V = z.shape
    greedy = z.argmax(dim=1)
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).double()
    z = z / t[:, None]
    zs, order = torch.sort(z, dim=1, descending=True, stable=True)
    k = torch.where((top_k <= 0) | (top_k >= V), torch.full_like(top_k, V), top_k)
    kth = zs.gather(1, (k - 1)[:, None])
    ps = torch.softmax(zs, dim=1)
    before = torch.cumsum(ps, dim=1) - ps
    drop_sorted = (before >= top_p[:, None].double()) & (top_p[:, None] < 1)
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    z = torch.where((z < kth) | drop, torch.full_like(z, -torch.inf), z)
    g = -torch.log(-torch.log(counter_uniform(seed, step, V)))
    return torch.where(temperature > 0, (z + g).argmax(dim=1), greedy)


class TorchRunner:
    def __init__(self, model, num_blocks: int, block_size: int, device=None, dtype=torch.bfloat16,
                 attention: str = "triton", cuda_graphs: bool = True, max_graph_batch: int = 256):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        if not isinstance(model, TorchModel):
            model = TorchModel.from_numpy(model.config, model.params)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        cfg = self.config = model.config
        self.block_size, self.num_blocks = int(block_size), int(num_blocks)
        shape = (cfg.n_layers, self.num_blocks + 1, self.block_size, cfg.n_kv_heads, cfg.d_head)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=self.device)
        self.trash_slot = self.num_blocks * self.block_size
        self.max_blocks = -(-cfg.max_seq_len // self.block_size)
        if attention == "triton":
            from ..kernels.paged_attention import paged_attention as decode_kernel
            from ..kernels.paged_prefill import paged_varlen_attention as varlen_kernel
            self._decode = lambda q, kc, vc, bt, cl, cu: decode_kernel(q, kc, vc, bt, cl, validate=False)
            self._varlen = lambda q, kc, vc, bt, cl, cu: varlen_kernel(q, kc, vc, bt, cl, cu, validate=False)
        elif attention == "torch":
            self._decode = self._varlen = torch_varlen_attention
        else:
            raise ValueError(f"attention must be 'triton' or 'torch', got {attention!r}")
        self.use_graphs = cuda_graphs and self.device.type == "cuda" and attention == "triton"
        self.graph_sizes = [b for b in (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256) if b <= max_graph_batch]
        self._graphs: dict[int, tuple] = {}
        self.last_logits: torch.Tensor | None = None
        self.step_times: list[float] = []

    # -- metadata to the device --------------------------------------------------------------------------
    def _tensors(self, batch: StepBatch):
        dev = self.device
        as_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dev, dt, non_blocking=True)  # noqa: E731
        return (as_t(batch.input_ids, torch.long), as_t(batch.positions, torch.long),
                as_t(batch.slot_mapping, torch.long), as_t(batch.block_tables, torch.int32),
                as_t(batch.context_lens, torch.int32), as_t(batch.cu_seqlens_q, torch.int32))

    def _sampling(self, batch: StepBatch):
        t, k, p, seed, step = sampling_arrays(batch)
        dev = self.device
        return (torch.from_numpy(t).to(dev), torch.from_numpy(k).to(dev), torch.from_numpy(p).to(dev),
                torch.from_numpy(seed).to(dev), torch.from_numpy(step).to(dev))

    # -- CUDA graphs for decode steps ----------------------------------------------------------------------
    def _graph(self, n: int):
        """The graph for a padded decode batch of n rows, with its static input and output tensors."""
        if n in self._graphs:
            return self._graphs[n]
        dev = self.device
        st = dict(ids=torch.zeros(n, dtype=torch.long, device=dev),
                  pos=torch.zeros(n, dtype=torch.long, device=dev),
                  slots=torch.full((n,), self.trash_slot, dtype=torch.long, device=dev),
                  tables=torch.full((n, self.max_blocks), self.num_blocks, dtype=torch.int32, device=dev),
                  lens=torch.ones(n, dtype=torch.int32, device=dev),
                  cu=torch.arange(n + 1, dtype=torch.int32, device=dev))
        run = lambda: self.model.forward_ragged(st["ids"], st["pos"], st["slots"], st["tables"], st["lens"],  # noqa: E731
                                                st["cu"], self.k_pool, self.v_pool, self._decode)
        s = torch.cuda.Stream(device=dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):          # compile the kernels and warm up outside the capture
                run()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        pool = next(iter(self._graphs.values()))[0].pool() if self._graphs else None
        with torch.cuda.graph(g, pool=pool):
            out = run()
        self._graphs[n] = (g, st, out)
        return self._graphs[n]

    @torch.inference_mode()
    def capture_graphs(self, max_batch: int) -> None:
        """Capture every padded decode size up to ``max_batch`` (largest first, so they share one pool)."""
        for n in sorted((b for b in self.graph_sizes if b <= max_batch), reverse=True):
            self._graph(n)

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> np.ndarray:
        S = len(batch.seqs)
        decode_only = batch.num_tokens == S
        if self.use_graphs and decode_only and S <= self.graph_sizes[-1]:
            n = next(b for b in self.graph_sizes if b >= S)
            g, st, out = self._graph(n)
            ids, pos, slots, tables, lens, _ = self._tensors(batch)
            st["ids"][:S].copy_(ids)
            st["pos"][:S].copy_(pos)
            st["slots"][:S].copy_(slots)
            st["slots"][S:].fill_(self.trash_slot)
            st["tables"][:S, :tables.shape[1]].copy_(tables)
            st["lens"][:S].copy_(lens)
            st["lens"][S:].fill_(1)
            g.replay()
            logits = out[:S]
        else:
            ids, pos, slots, tables, lens, cu = self._tensors(batch)
            attn = self._decode if decode_only else self._varlen
            logits = self.model.forward_ragged(ids, pos, slots, tables, lens, cu, self.k_pool, self.v_pool, attn,
                                               logits_idx=(cu[1:] - 1).long())
        self.last_logits = logits
        if all(s.params.greedy for s in batch.seqs):
            tokens = logits.argmax(dim=1)          # the common case: no sort over the vocabulary
        else:
            tokens = sample_on_device(logits, *self._sampling(batch))
        return tokens.cpu().numpy()

    def now(self) -> float:
        return time.perf_counter()
