"""The course assignments: which graded functions each one covers, its tests, points and time estimate.

Adding an assignment (the scheduler step, the rejection sampler, ...) takes three things:
``# BEGIN SOLUTION`` / ``# END SOLUTION`` around the graded bodies in the package, one
:class:`Assignment` entry below, and two test files ``tests/aNN_public.py`` and
``tests/aNN_grader.py`` next to this module. The generator refuses a marker that no entry
claims, and an entry whose function has no marker.

The grader decides from values (``tests/replay.py``): the tests run on the student's code in a child process that
records what every graded function returns, and again in a trusted process that replays those values. A test
must therefore reach the student's code only through the graded functions (or, for a Triton kernel, through
its launcher, listed in ``launchers``), and an object it inspects afterwards must be plain data or an instance
of a class importable from the package or a test module (not a class defined inside a test function).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """One function (or method: ``Class.method``) whose marked region the student writes."""

    path: str        # relative to the package root, e.g. "decode.py"
    qualname: str    # "naive_decode", "KVCache.write"
    hint: str        # goes into the stub's NotImplementedError and the handout
    stretch: bool = False  # optional: its tests earn bonus points, outside the maximum

    @property
    def module(self) -> str:
        return "minillm." + self.path[:-3].replace("/", ".")


@dataclass(frozen=True)
class Assignment:
    number: int
    title: str
    chapter: str                # the chapter file (no suffix) the assignment follows
    goal: str
    parts: tuple[Part, ...]
    hours: tuple[int, int]      # time estimate, low and high, in hours
    done: str                   # what "done" means
    gpu_task: str = ""          # a benchmark on a real GPU: an extension, never graded
    needs_triton: bool = False  # some tests run a Triton kernel (in the interpreter on CPU)
    builds_on: tuple[int, ...] = ()  # earlier assignments whose code its tests run through (the engine needs the
                                     # allocator and the decoder): their solutions stay in its "alone" check
    reveals: tuple[tuple[str, str], ...] = ()  # (path, qualname) of given code that would hand out this assignment's
                                               # solution: stubbed in every tree (student or grading) that stubs it
    forbid: tuple[str, ...] = ()     # names its bodies may not use (a given helper that does the graded step)
    launchers: tuple[tuple[str, str], ...] = ()  # (path, qualname) of the given functions that launch its graded
                                                 # Triton kernels: the grader records their results in the child
                                                 # and replays them where it decides (a kernel cannot be wrapped)

    @property
    def replay_calls(self) -> list[str]:
        """``module:qualname`` of every call whose results the child records and the trusted process replays."""
        mod = lambda path: "minillm." + path[:-3].replace("/", ".")  # noqa: E731
        return [f"{mod(p.path)}:{p.qualname}" for p in self.parts] + [f"{mod(p)}:{q}" for p, q in self.launchers]

    @property
    def files(self) -> list[str]:
        """The source files with this assignment's graded parts, relative to a student tree (what it hands in)."""
        return sorted({f"minillm/{p.path}" for p in self.parts})

    @property
    def public_tests(self) -> str:
        return f"a{self.number:02d}_public.py"

    @property
    def grader_tests(self) -> str:
        return f"a{self.number:02d}_grader.py"

    @property
    def label(self) -> str:
        """The book's cross-reference target: ``{ref}`assignment-3``` links to the instructors page."""
        return f"assignment-{self.number}"

    @property
    def slug(self) -> str:
        return f"assignment-{self.number:02d}"


ASSIGNMENTS: dict[int, Assignment] = {a.number: a for a in (
    Assignment(
        1, "Naive decode and the op counter", "chapters/01_naive_decode",
        "Write the decoder with no memory -- it re-runs the whole sequence at every step -- and the two "
        "counters that make its quadratic cost visible.",
        (Part("model.py", "StepOps.count_matmul", "add the FLOPs of an (m, k) @ (k, n) matmul to proj_flops"),
         Part("model.py", "StepOps.count_attention",
              "add the score-matrix entries of one layer (every head, every query row, every key) to score_elements"),
         Part("decode.py", "naive_decode",
              "validate with check_decode_args, then at each step run model.forward on all tokens so far, "
              "sample from the last row and record it with its StepOps and time")),
        (2, 3),
        "Every token equals the greedy choice of a full forward pass, and the counters give "
        "N(N+1)/2 attention rows for N steps.",
        "Time naive_decode for growing N on a GPU with the torch model and fit the quadratic."),
    Assignment(
        2, "The preallocated KV cache: prefill and decode step", "chapters/02_kv_cache",
        "Fill a preallocated cache left to right, roll it back, and split generation into one prefill pass "
        "and one cached step per token.",
        (Part("kvcache.py", "KVCache.write",
              "raise CacheFull if the new positions do not fit; else slice-assign k, v after self.length and "
              "return views of positions [0, length + n)"),
         Part("kvcache.py", "KVCache.truncate", "check n with _check_truncate, then move self.length back"),
         Part("decode.py", "prefill", "one model.forward over the prompt as a batch of one, with the cache"),
         Part("decode.py", "decode_step", "one model.forward of the single token, with the cache")),
        (2, 3),
        "prefill + decode_step reproduce the logits of a full forward pass at every step, and the "
        "cache raises CacheFull instead of growing.",
        "Measure tokens/s of cached vs naive decode on a GPU at a few sequence lengths."),
    Assignment(
        3, "The memory tax: GQA/MLA sizing and fp8/int8 quantization", "chapters/03_memory_tax",
        "Count KV-cache bytes for grouped-query and latent attention, and shrink the cache with fp8 and int8.",
        (Part("sizing.py", "gqa_kv_bytes",
              "validate every size with _positive_int, then 2 (K and V) x tokens x layers x KV heads x d_head "
              "x batch elements, at _bytes_per_element(dtype_bytes), rounded up with _bytes"),
         Part("sizing.py", "mla_kv_bytes",
              "the latent (kv_lora_rank) plus the RoPE key (qk_rope_dim), per token and layer, shared by all heads"),
         Part("quant.py", "quantize_fp8",
              "choose a scale that maps amax to FP8_E4M3_MAX (per tensor, or per row with per_token), check it, "
              "encode x / scale with fp8_e4m3_encode"),
         Part("quant.py", "dequantize_fp8", "decode the codes and multiply by the scale"),
         Part("quant.py", "quantize_int8", "one scale per row = amax / 127 (use _symmetric_scale), round, clip"),
         Part("quant.py", "dequantize_int8", "check the dtype is int8, then multiply by the scale")),
        (2, 4),
        "Byte counts match the formulas for any dtype, and round trips stay within half a quantization step.",
        "Run attention on an fp8 KV cache on a GPU and measure the decode speedup over bf16."),
    Assignment(
        4, "The tiled-attention traffic counter", "chapters/04_hbm_vs_sram",
        "Predict, then count, the HBM bytes a fused tiled attention kernel moves.",
        (Part("hardware.py", "flash_attention_traffic",
              "Q read and O written once; K and V read once per query tile (ceil(n / block_m) tiles)"),
         Part("hardware.py", "simulate_tiled_attention",
              "loop over query tiles and key tiles, load each tile through the TrafficCounter, keep a running "
              "(m, l, acc) on chip and store each finished output tile once")),
        (2, 3),
        "The simulated output equals standard attention and the counted bytes equal the formula.",
        "Profile a fused attention kernel with Nsight Compute and compare its DRAM bytes to the formula."),
    Assignment(
        5, "Online softmax: the merge and a Triton row softmax", "chapters/05_online_softmax",
        "Stream a row in tiles keeping a running max and normalizer; merge partial attention results; "
        "write the same algorithm as a Triton kernel.",
        (Part("softmax.py", "online_max_and_normalizer",
              "for each tile: new max, rescale l by exp(m_old - m_new) (0 while m is -inf), add the tile's sum"),
         Part("softmax.py", "merge", "rescale both partials to the larger max and add their l and o"),
         Part("kernels/softmax.py", "_online_softmax_kernel",
              "one program per row: pass 1 keeps per-lane running (m, l) over BLOCK-wide tiles, fold the lanes, "
              "pass 2 writes exp(x - m) / l")),
        (3, 5),
        "The online statistics and the merged partials equal a one-shot softmax, including -inf entries and "
        "huge logits; the kernel matches NumPy in the interpreter.",
        "Benchmark the kernel against torch.softmax on a GPU for row widths 1k-64k (target: within 10% of "
        "torch at 8k columns).", needs_triton=True,
        reveals=(("explorables/__init__.py", "online_softmax_steps"),),
        launchers=(("kernels/softmax.py", "softmax"),)),
    Assignment(
        6, "FlashAttention: tiled forward in NumPy and Triton (backward as a stretch)",
        "chapters/06_flash_attention",
        "Write the FlashAttention forward twice -- vectorized NumPy tiles, then the Triton inner loop -- "
        "with causal masks, GQA and the log-sum-exp; optionally the backward pass.",
        (Part("attention.py", "flash_attention",
              "validate with check_attention_inputs; for each query tile stream key tiles with a running "
              "(m, l, acc); causal tiles past the diagonal are skipped; also return the log-sum-exp"),
         Part("kernels/flash_attention.py", "_fwd_inner",
              "for key tiles [lo, hi): load K^T, s = q @ kt, mask if MASKED (ragged tile, causal), update "
              "(m, l, acc) with exp2 (qk_scale is in log2 units)"),
         Part("attention.py", "flash_attention_backward",
              "recompute P tile by tile from q, k and lse; delta = rowsum(dO * O); dV += P^T dO, "
              "dS = P * (dO V^T - delta), dQ += dS K * scale, dK += dS^T Q * scale", stretch=True)),
        (5, 8),
        "The NumPy and Triton forwards match standard attention for odd lengths, GQA, causal masks with "
        "Nq != Nk, tiny blocks and huge logits.",
        "Benchmark the Triton forward against torch's scaled_dot_product_attention on a GPU at N = 1k-16k "
        "(target: at least 70% of its throughput at N = 4096, bf16, d = 128). Then load K and V through "
        "tensor descriptors (tl.make_tensor_descriptor), as chapter 6's Hopper forward does, and time your two "
        "versions side by side (median of many launches after a warm-up, as chapter 6 measures).",
        needs_triton=True,
        reveals=(("kernels/flash_hopper.py", "_fwd_inner_tma"), ("kernels/flash_hopper.py", "_fwd_resume_kernel"),
                 ("kernels/flash_backward.py", "_bwd_dq_inner"), ("kernels/batch_invariant.py", "_step")),
        forbid=("softmax_step",), launchers=(("kernels/flash_attention.py", "flash_attention"),)),
    Assignment(
        7, "Paged attention: block allocator, copy-on-write and the paged decode kernel",
        "chapters/07_paged_attention",
        "Hand out fixed-size blocks with reference counts, share them between forked sequences with "
        "copy-on-write, and read K/V through a block table in a Triton decode kernel.",
        (Part("paged/allocator.py", "BlockAllocator.allocate",
              "pop the front of the free list (OutOfBlocks if empty) and give it refcount 1"),
         Part("paged/allocator.py", "BlockAllocator.incref", "only a block in use can gain an owner"),
         Part("paged/allocator.py", "BlockAllocator.decref",
              "drop one reference; at zero the block goes to the back of the free list; a free block is a "
              "double free"),
         Part("paged/allocator.py", "BlockAllocator.free", "only an unshared block may be freed"),
         Part("paged/cache.py", "PagedKVCache.fork", "share every block of the source (incref) in a new table"),
         Part("paged/cache.py", "PagedKVCache.append",
              "copy a shared (or cached) partly filled last block first, check the pool has every block needed "
              "before changing anything, take new blocks at block boundaries, write K/V, update seq_lens"),
         Part("kernels/paged_attention.py", "_paged_decode_kernel",
              "one program per (sequence, KV head, split): walk its tokens in TILE steps, find each token's "
              "physical block in the table, keep a running (m, l, acc) for the query heads of the group "
              "(m in log2 units) and leave it in m, l, acc for _finish_split below, which stores it or writes the output"),
         Part("kernels/paged_attention.py", "_decode_step_tma",
              "one block of v3 (PagedConfig(tma=True)): its table entry, the box of its K and V at the block-and-head's "
              "element offset (row = offset // ss, column = offset % ss), the online-softmax step; an entry "
              "outside the pool points past the descriptor (zeros) and weighs nothing, and MASKED masks scores "
              "past end and zeroes those value rows",
              stretch=True),
         Part("kernels/paged_attention.py", "_host_descriptors",
              "v3's two descriptors, made on the host (triton.tools.tensor_descriptor.TensorDescriptor) over the "
              "pools' 2-D views: rows one slot apart (stride ss), as many as the pool holds, (block_size, head_dim) "
              "boxes", stretch=True),
         Part("kernels/paged_attention.py", "_decode_loop_tma",
              "v3 of the loop: the split's full blocks unmasked, one block per step, then its last block masked if "
              "it runs past end",
              stretch=True)),
        (5, 8),
        "The allocator keeps its invariants under random operation sequences, forks copy exactly one block "
        "on write, and the kernel matches the NumPy paged reference.",
        "Benchmark the paged decode kernel against contiguous decode attention on a GPU (target: within "
        "15% at block size 16, batch 16, 4k tokens).", needs_triton=True,
        reveals=(("kernels/paged_prefill.py", "_varlen_inner"), ("kernels/batch_invariant.py", "_attention_kernel"),
                 ("kernels/flash_hopper.py", "_fwd_inner_tma")),
        launchers=(("kernels/paged_attention.py", "paged_attention"),)),
    Assignment(
        8, "The scheduler step: token budget, chunked prefill, preemption", "chapters/08_continuous_batching",
        "Write the step that makes continuous batching work: which sequences run next and how many of their "
        "tokens, under a token budget and a block pool that can run out.",
        (Part("serving/scheduler.py", "Scheduler._chunk",
              "the pending tokens, capped by the budget left and, while prefilling, by max_prefill_chunk"),
         Part("serving/scheduler.py", "Scheduler._preempt",
              "free the blocks, num_computed = 0, status WAITING, count it, put it at the FRONT of the queue "
              "(and give back a static-batching slot)"),
         Part("serving/scheduler.py", "Scheduler.schedule",
              "running sequences first in admission order (decode = 1 token, or a prefill chunk); while "
              "bm.can_grow fails, preempt the LAST running sequence (possibly this one); then admit waiting "
              "requests FCFS with match_prefix, while budget and max_num_seqs allow (static batching: only when "
              "the last batch finished); then speculative drafts from _draft with the budget and free blocks "
              "left (a draft never preempts); set memory_limited, count num_steps, build the StepBatch")),
        (4, 6),
        "Every request's greedy tokens equal the simple decoder's, under tight budgets, tiny pools that force "
        "preemption, prefix sharing and static batching; no step exceeds its budget or sequence cap; no block "
        "leaks.",
        "Serve the chapter's chat trace on a GPU with the torch runner and compare continuous with static "
        "batching (chapter 8 prints the book's measured ratio).",
        builds_on=(1, 2, 7)),
    Assignment(
        9, "The rejection sampler of speculative decoding", "chapters/09_speculative_decoding",
        "Accept or reject k draft tokens so that the emitted tokens follow the target's distribution "
        "exactly, whatever the drafter proposed.",
        (Part("speculative.py", "residual", "normalize(max(p - q, 0)); None when it has no mass"),
         Part("sampling.py", "verify_probs",
              "the rule on probability rows, randomness supplied: trial t keeps drafts[t] when "
              "u_accept[t] * q(d) < p(d) (row rows[t]); each rejected trial gets resample(r, group, trials) from "
              "the unnormalized residual max(p - q, 0) of its row (one-hot q when q is None: p with d zeroed), "
              "each distinct residual computed once"),
         Part("speculative.py", "verify",
              "validate shapes and token ids; draw u (N, k) and one u_next per trial from rng; run verify_probs "
              "on rows 0..k-1 with an inverse-CDF resample (sample_probs); n_accepted = the first rejection; "
              "all accepted: a bonus draw from p_k with sample_probs; vectorize over N independent trials")),
        (3, 5),
        "The first emitted token passes a chi-square goodness-of-fit test against p for sampled, one-hot and "
        "greedy drafts (and a biased sampler fails it); p == q accepts everything; bad input raises.",
        "Time a draft round and a verify step of the draft model and of prompt lookup on a GPU (LLM(..., "
        "num_speculative_tokens=..., speculative_model=...) with the torch runner) and explain from those "
        "times why prompt lookup beats the draft model at batch 1 (chapter 9 prints the book's recorded times).",
        reveals=(("torch_sampling.py", "verify_batch"),)),
    Assignment(
        10, "Batch invariance: a fixed reduction order for RMSNorm and a fixed split size for attention",
        "chapters/11_batch_invariance",
        "Make a row's result a function of that row alone: an RMSNorm whose sum of squares adds in one fixed "
        "order whatever the batch, and split-K attention cut at a fixed split SIZE and merged in order, so a "
        "row computes the same bits alone, in any batch, as a decode, a verify or a prefill row.",
        (Part("batch_invariant.py", "rmsnorm_reference",
              "the sum of squares in a float32 accumulator (the result type of float32 and x's dtype), block "
              "elements at a time in order: each block's sum of squares in float64, rounded once, added to the "
              "accumulator and rounded again; then r = 1 / sqrt(ss / D + eps) rounded to the accumulator type, "
              "y = x * r rounded to x's dtype, times w, back to x's dtype"),
         Part("batch_invariant.py", "split_bounds_by_size",
              "cuts every size keys: 0, size, 2*size, ..., n ([0, 0] for n = 0); size < 1 is a ValueError"),
         Part("batch_invariant.py", "attend_pieces",
              "for each non-empty piece [lo, hi): scores in float64 times scale, the piece's max, exp, its l and "
              "o rounded to acc_t once; merge into the running (m, l, o) left to right: rescale both by exp(m_old "
              "- m_new) and exp(m_piece - m_new) (0 while nothing is merged), in acc_t; return o / l")),
        (2, 4),
        "A row's RMSNorm and attention output are bit-identical alone and inside batches of any size and "
        "composition (and a decode row equals the same row inside a prefill chunk), close to float64, and the "
        "RMSNorm's bits are those of its stated order: a float32 accumulator, one block at a time.",
        "Run chapter 11's batch-invariant Triton kernels (rmsnorm_bi, attention_bi) compiled on a GPU in bf16: "
        "check a row alone against the same row in batches of 1-64 bit for bit, and time them against the "
        "default kernels (chapter 11 prints the book's recorded cost of the mode)."),
)}


def get(number) -> Assignment:
    """The assignment with this number, or a clear error naming the known ones."""
    try:
        n = int(number)
    except (TypeError, ValueError):
        n = None
    if n is None or isinstance(number, bool) or n not in ASSIGNMENTS or str(number).strip() != str(n):
        known = ", ".join(str(k) for k in sorted(ASSIGNMENTS))
        raise AssignmentError(f"unknown assignment {number!r}; the assignments are {known}")
    return ASSIGNMENTS[n]


class AssignmentError(Exception):
    """A usage error of the generator or the grader: unknown assignment, missing files, bad markers."""
