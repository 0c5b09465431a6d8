"""The GPU runner: the torch model over paged bf16 pools, the Triton paged kernels, CUDA graphs for every step.

Per step it copies the step's metadata to the device, runs ``TorchModel.forward_ragged`` and samples on
the device (:mod:`minillm.torch_sampling`, NumPy's samplers in torch); the only host sync is reading the
sampled tokens back. ``prepare`` (what ``LLM(runner="torch")`` calls at startup) captures the CUDA graphs of
every decode batch size and mixed-step token bucket the scheduler can produce. Attention:

* a step of decodes only (one new token per sequence) uses the split-K decode kernel
  (``minillm.kernels.paged_attention``), replayed from a CUDA graph captured for the padded batch size;
* a step with prefill chunks uses the varlen kernel (``minillm.kernels.paged_prefill``), replayed from a
  CUDA graph captured for the padded token count where one was captured (``prepare``), else eagerly;
* ``attention="torch"`` swaps both for a gather + SDPA baseline (slow; for checking);
* ``batch_invariant=True`` (chapter 11) runs every step, decode or mixed, through the batch-invariant kernels
  of ``minillm.kernels.batch_invariant``: one attention path with a fixed split size, and every matmul and
  RMSNorm with a reduction order fixed per row, so a sequence's logits have the same bits whatever else is in
  the batch (and whatever graph bucket pads it); CUDA graphs as usual.

On a GPU the step's elementwise work (the residual adds with RMSNorm, RoPE with the K/V cache writes, SiLU with
its product) runs in the fused Triton kernels of ``minillm.kernels.fused`` (``fused_ops``; chapter 8).

The pools have one extra block past the block manager's: padded graph rows write their K/V there.
"""
from __future__ import annotations

import gc
import time

import numpy as np
import torch

from .. import torch_sampling
from ..torch_model import TorchModel, torch_varlen_attention
from .batch import StepBatch
from .runner import check_engine_fit, sampling_arrays

class TorchRunner:
    def __init__(self, model, num_blocks: int, block_size: int, device=None, dtype=torch.bfloat16,
                 attention: str = "triton", cuda_graphs: bool = True, max_graph_batch: int = 256,
                 batch_invariant: bool = False, fused_ops: bool | None = None):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.dtype = dtype
        if not isinstance(model, TorchModel):
            model = TorchModel.from_numpy(model.config, model.params)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        self.model.fuse_projections()
        cfg = self.config = model.config
        self.block_size, self.num_blocks = int(block_size), int(num_blocks)
        shape = (cfg.n_layers, self.num_blocks + 1, self.block_size, cfg.n_kv_heads, cfg.d_head)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=self.device)
        self.trash_slot = self.num_blocks * self.block_size
        self.max_blocks = -(-cfg.max_seq_len // self.block_size)
        self.batch_invariant = bool(batch_invariant)
        # the elementwise work in three Triton kernels (minillm.kernels.fused): by default on a GPU with the
        # Triton attention; on CPU they would run in the interpreter (tests pass fused_ops=True)
        self.fused_ops = (self.device.type == "cuda" and attention == "triton") if fused_ops is None \
            else bool(fused_ops)
        if batch_invariant and attention != "triton":
            raise ValueError("batch_invariant=True runs its own Triton kernels: leave attention='triton'")
        if batch_invariant:
            from ..kernels.batch_invariant import attention_bi
            self._decode = self._varlen = lambda q, kc, vc, bt, cl, cu: attention_bi(q, kc, vc, bt, cl, cu,
                                                                                      validate=False)
        elif attention == "triton":
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
        self._graphs: dict[tuple, tuple] = {}
        self._graph_pool = None
        self.mixed_seqs = self.spec_tokens = 0
        self.mixed_buckets: list[int] = []
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

    # -- CUDA graphs ---------------------------------------------------------------------------------------
    # Decode-only steps replay a graph per padded batch size (the split-K decode kernel). Steps with prefill
    # chunks replay a graph per padded token count: the batch is padded to ``mixed_seqs`` sequences and a
    # bucket of tokens, the extra rows write to the spare block and their outputs are dropped, and the varlen
    # kernel's grid depends only on those two sizes, so one graph serves every step that fits its bucket.
    # The static buffers of a graph are views into two flat device tensors (int64: ids, positions, slots, logits
    # rows; int32: block tables, lengths, cu_seqlens), each with a pinned host twin: a step's metadata is written
    # into the host twins with NumPy and crosses in two copies, not a dozen small copies and fills.
    _I64 = ("ids", "pos", "slots", "last")
    _I32 = ("tables", "lens", "cu")

    def _static(self, n_tok: int, n_seq: int, n_rows: int | None = None) -> dict:
        n_rows = n_seq if n_rows is None else n_rows
        sizes = dict(ids=n_tok, pos=n_tok, slots=n_tok, last=n_rows, tables=n_seq * self.max_blocks, lens=n_seq,
                     cu=n_seq + 1)
        st = {"host": {}, "pairs": [], "copied": None}
        pin = self.device.type == "cuda"
        for names, dtype in ((self._I64, torch.long), (self._I32, torch.int32)):
            n = sum(sizes[k] for k in names)
            dev, host = torch.empty(n, dtype=dtype, device=self.device), torch.empty(n, dtype=dtype, pin_memory=pin)
            st["pairs"].append((host, dev))
            for k, d, h in zip(names, dev.split([sizes[k] for k in names]), host.split([sizes[k] for k in names])):
                st[k], st["host"][k] = d, h.numpy()
        st["tables"] = st["tables"].view(n_seq, self.max_blocks)
        st["host"]["tables"] = st["host"]["tables"].reshape(n_seq, self.max_blocks)
        h = st["host"]
        h["ids"][:], h["pos"][:], h["slots"][:], h["last"][:] = 0, 0, self.trash_slot, 0
        h["tables"][:], h["lens"][:], h["cu"][:] = self.num_blocks, 1, np.arange(n_seq + 1)
        self._upload(st)
        return st

    def _upload(self, st: dict) -> None:
        for host, dev in st["pairs"]:
            dev.copy_(host, non_blocking=True)
        if self.device.type == "cuda":  # the host twins are written again only once these copies are done
            st["copied"] = torch.cuda.Event()
            st["copied"].record()

    def _forward_static(self, st: dict, attn):
        return self.model.forward_ragged(st["ids"], st["pos"], st["slots"], st["tables"], st["lens"], st["cu"],
                                         self.k_pool, self.v_pool, attn, logits_rows=st["last"],
                                         batch_invariant=self.batch_invariant, fused_ops=self.fused_ops)

    def _fill(self, st: dict, batch, input_ids=None) -> int:
        """Copy a step into padded static buffers; padding sequences take 1 token each, the last takes the rest."""
        S, T = batch.num_seqs, batch.num_tokens
        n_tok, n_seq = st["ids"].shape[0], st["lens"].shape[0]
        if st["copied"] is not None:
            st["copied"].synchronize()
        h = st["host"]
        for k, a, pad in (("ids", batch.input_ids, 0), ("pos", batch.positions, 0),
                          ("slots", batch.slot_mapping, self.trash_slot)):
            h[k][:T], h[k][T:] = a, pad
        h["tables"][:] = self.num_blocks         # past each table's end: the spare block
        h["tables"][:S, :batch.block_tables.shape[1]] = batch.block_tables
        pad_q = np.ones(n_seq - S, np.int64)
        if n_seq > S:
            pad_q[-1] = n_tok - T - (n_seq - S - 1)
        h["cu"][0] = 0
        h["cu"][1:] = np.cumsum(np.concatenate([batch.num_new, pad_q]))
        h["lens"][:S], h["lens"][S:] = batch.context_lens, pad_q
        rows = batch.logits_rows                 # each sequence's last row, or all rows of a speculating one
        h["last"][:len(rows)], h["last"][len(rows):] = rows, 0
        self._upload(st)
        if input_ids is not None:                # a draft model's own tokens, already on the device
            st["ids"][:T].copy_(input_ids)
        return len(rows)

    def _capture(self, key, n_tok: int, n_seq: int, attn):
        dev = self.device
        st = self._static(n_tok, n_seq, self.mixed_rows if key[0] == "mixed" else n_seq)
        gc.collect()    # a dead runner's graphs must not be destroyed by the collector during this capture
        s = torch.cuda.Stream(device=dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):          # compile the kernels and warm up outside the capture
                self._forward_static(st, attn)
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._graph_pool):
            out = self._forward_static(st, attn)
        self._graph_pool = g.pool()
        self._graphs[key] = (g, st, out)
        return self._graphs[key]

    def _decode_graph(self, n: int):
        return self._graphs.get(("decode", n)) or self._capture(("decode", n), n, n, self._decode)

    def _decode_graph_for(self, n_seqs: int):
        """The decode graph of the smallest captured size that holds ``n_seqs`` sequences, or None."""
        if not self.use_graphs or n_seqs > self.graph_sizes[-1]:
            return None
        return self._decode_graph(next(b for b in self.graph_sizes if b >= n_seqs))

    def _mixed_graph(self, n_tok: int):
        return self._graphs.get(("mixed", n_tok)) or self._capture(("mixed", n_tok), n_tok, self.mixed_seqs,
                                                                    self._varlen)

    @property
    def mixed_rows(self) -> int:
        """Logits rows a mixed graph returns: one per sequence, or 1 + k for each speculating one."""
        return self.mixed_seqs * (1 + self.spec_tokens)

    def token_buckets(self, max_tokens: int) -> list[int]:
        """Padded token counts for mixed steps: powers of two and their midpoints, up to max_tokens."""
        out, b = [], 16
        while not out or out[-1] < max_tokens:
            out += [b, b + b // 2]
            b *= 2
        return [x for x in out if x < max_tokens] + [max_tokens]

    @torch.inference_mode()
    def capture_graphs(self, max_num_seqs: int, max_num_batched_tokens: int | None = None,
                       num_speculative_tokens: int = 0) -> None:
        """Capture every decode size up to ``max_num_seqs`` and, with a token budget, every mixed-step bucket
        (largest first, so all graphs share one memory pool). Speculative verify steps replay the mixed
        graphs, which then return up to 1 + k logits rows per sequence."""
        if not self.use_graphs:
            return
        self.mixed_seqs, self.spec_tokens = max_num_seqs, num_speculative_tokens
        if max_num_batched_tokens is not None:
            # a mixed step has at least one sequence with 2+ tokens, so it pads to more than max_num_seqs tokens
            self.mixed_buckets = [b for b in self.token_buckets(max_num_batched_tokens + max_num_seqs)
                                  if b > max_num_seqs]
            for n in sorted(self.mixed_buckets, reverse=True):
                self._mixed_graph(n)
        for n in sorted((b for b in self.graph_sizes if b <= max_num_seqs), reverse=True):
            self._decode_graph(n)

    @torch.inference_mode()
    def logits(self, batch, input_ids=None) -> torch.Tensor:
        """The logits rows ``batch.logits_rows`` of one ragged forward (a StepBatch or a RaggedStep), from a
        CUDA graph where one fits. ``input_ids``: a device tensor to use instead of ``batch.input_ids`` (a
        draft model feeds its own last tokens without a trip through the host)."""
        S, T = batch.num_seqs, batch.num_tokens
        decode_only = T == S
        graph = self._decode_graph_for(S) if decode_only else None
        if (graph is None and self.use_graphs and self.mixed_buckets and S <= self.mixed_seqs
                and len(batch.logits_rows) <= self.mixed_rows):
            need = T + self.mixed_seqs - S
            n_tok = next((b for b in self.mixed_buckets if b >= need), None)
            if n_tok is not None:
                graph = self._mixed_graph(n_tok)
        if graph is not None:
            g, st, out = graph
            R = self._fill(st, batch, input_ids)
            g.replay()
            return out[:R]
        ids, pos, slots, tables, lens, cu = self._tensors(batch)
        if input_ids is not None:
            ids = input_ids
        attn = self._decode if decode_only else self._varlen
        rows = torch.from_numpy(batch.logits_rows).to(self.device)
        return self.model.forward_ragged(ids, pos, slots, tables, lens, cu, self.k_pool, self.v_pool, attn,
                                         logits_rows=rows, batch_invariant=self.batch_invariant,
                                         fused_ops=self.fused_ops)

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> np.ndarray:
        logits = self.last_logits = self.logits(batch)
        if all(s.params.greedy for s in batch.seqs):
            tokens = logits.argmax(dim=1)          # the common case: no sort over the vocabulary
        elif batch.num_draft_tokens:
            drafts = torch.from_numpy(batch.row_drafts()).to(self.device)
            tokens = torch_sampling.verify_batch(logits, drafts, batch.draft_probs, *self._sampling(batch))
        else:
            tokens = torch_sampling.sample_batch(logits, *self._sampling(batch))
        return tokens.cpu().numpy()

    # -- as a draft model (minillm.serving.draft.DraftModelProposer) --------------------------------------
    @torch.inference_mode()
    def decode_chain(self, batch, input_ids, n_passes: int, sample):
        """``n_passes`` decode passes over ``batch``'s sequences (one new token each), each feeding the tokens
        ``sample(logits, i)`` drew from the previous one: a draft model's k - 1 decode passes.

        The first pass runs ``batch`` with ``input_ids`` (device tensor); each later one advances every
        sequence's position, length and slot by one on the device, so no metadata crosses from the host
        between passes (the slots stay inside blocks the scheduler allocated for the drafts). Replays the
        decode graph when one fits, else runs the same buffers eagerly. Returns [(tokens, extra)] per pass.
        """
        S, bs = batch.num_seqs, self.block_size
        graph = self._decode_graph_for(S)
        if graph is not None:
            g, st, out = graph
        else:
            st = self._static(S, S)
        self._fill(st, batch, input_ids)
        outs, tok = [], None
        for i in range(n_passes):
            if i:
                st["ids"][:S].copy_(tok)
                st["pos"][:S] += 1
                st["lens"][:S] += 1
                p = st["pos"][:S]
                st["slots"][:S] = st["tables"][:S].gather(1, (p // bs)[:, None])[:, 0].long() * bs + p % bs
            if graph is not None:
                g.replay()
                logits = out[:S]
            else:
                logits = self._forward_static(st, self._decode)[:S]
            tok, extra = sample(logits, i)
            outs.append((tok, extra))
        return outs

    @torch.inference_mode()
    def draft(self, logits, temperature, top_k, top_p, seeds, steps, want_probs: bool = True):
        if not (np.asarray(temperature) > 0).any():
            return logits.argmax(dim=1), None
        dev = self.device
        args = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in (temperature, top_k, top_p, seeds, steps)]
        return torch_sampling.draft_batch(logits, *args, want_probs=want_probs)

    def zeros(self, rows: int, cols: int) -> torch.Tensor:
        return torch.zeros(rows, cols, dtype=torch.float64, device=self.device)

    def index(self, idx: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(idx, np.int64)).to(self.device)

    @staticmethod
    def host(x) -> np.ndarray:
        return x.cpu().numpy()

    @torch.inference_mode()
    def execute_padded(self, batch: StepBatch, n_tok: int, n_seq: int) -> np.ndarray:
        """The graph path's padding without a graph (eager, any device): for testing the padding on CPU."""
        S = batch.num_seqs
        st = self._static(n_tok, n_seq, n_seq * (1 + max(len(d) for d in batch.drafts)))
        R = self._fill(st, batch)
        attn = self._decode if batch.num_tokens == S and n_tok == n_seq else self._varlen
        logits = self._forward_static(st, attn)[:R]
        self.last_logits = logits
        return logits.argmax(dim=1).cpu().numpy()

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def prepare(self, config) -> None:
        """Capture the CUDA graphs every step of a scheduler with ``config`` can replay (:meth:`capture_graphs`):
        what ``LLM(runner="torch")`` does at startup. A no-op without graphs (CPU, ``cuda_graphs=False``)."""
        self.capture_graphs(config.max_num_seqs, config.max_num_batched_tokens, config.num_speculative_tokens)

    def check_engine(self, num_blocks: int, block_size: int, max_model_len: int) -> None:
        check_engine_fit(self, self.num_blocks, self.block_size, self.config.max_seq_len, num_blocks, block_size,
                         max_model_len)      # the pool's extra block is the padded rows' trash, not the engine's
