"""Paged decode attention in Triton, flash-decoding style (chapter 7).

Same contract as ``minillm.paged_attention.paged_attention``: q (B, Hq, D); caches
(num_blocks, block_size, Hkv, D); block_table (B, max_blocks) int32; seq_lens (B,) int32.

Grid: (B, Hkv, num_splits). Each program owns one KV head of one sequence and a
contiguous slice of its tokens. It loads every key and value of that slice ONCE and
uses it for the whole group of query heads that share the KV head (GQA), walking
the slice in TILE-token steps: for each token the physical block comes from the
block table, so any block size works (TILE may span several small blocks). It keeps
a running (m, l, acc) and writes an unnormalized partial. The partials of all splits
are then merged through their log-sum-exp -- the merge of chapter 5 -- in one of two
ways (``merge=``): a second launch (``"launch"``), or by the last program of each
(sequence, KV head) to finish, found with an atomic ticket (``"ticket"``). With a single
split the one program normalizes and writes the output itself.

Splitting a long sequence across programs is what keeps the GPU busy at small
batch: with B * Hkv programs alone, a batch of one would use a handful of SMs.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor
try:  # programmatic dependent launch from Python: Triton 3.4 and later
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: pdl= is ignored (_has_pdl says no)
    gdc_launch_dependents = gdc_wait = None

from ..paged.attention import check_paged_inputs
from . import INTERPRETED, check_placement, check_tensors
from .flash_attention import _ensure_allocator, _num_sms
from .launch import cdiv, fast_launch, next_power_of_2

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MERGES = ("launch", "ticket")
DEFAULT_PREFETCH = False  # which decode loop runs unless prefetch= says (v1: False, v2: True)
DEFAULT_TMA = True  # may tma=None pick v3 (TMA copies of whole blocks) where prefers_tma says so? (off: never)
TMA_MIN_BLOCK = 64  # prefers_tma: v3 by default only with blocks of at least this many tokens
TMA_MAX_BLOCKS_PER_STEP = 16  # tile= may give v3 several blocks per step, unrolled: a bound on the code it makes
TMA_CONFIG = (4, 3)  # v3's (num_warps, num_stages) unless the knobs say otherwise; tma_config may take fewer stages
TMA_HOST_DESCRIPTORS = True  # v3's two descriptors made on the host and passed in (else built in every program)
DEFAULT_PDL = False  # merge launched as a programmatic dependent (sm_90+)? the H200 study timed it no faster
DEFAULT_TILE = 64  # tokens per loop step on a GPU unless tile= says (16-token steps left half the bandwidth unused)
DEFAULT_MERGE = "launch"  # how split partials are merged unless merge= says: the H200 study timed "ticket" slower
last_decode_kernel = None  # the compiled decode kernel of the latest call: n_regs / n_spills / metadata.shared
last_decode_loop = None  # the decode loop the latest call ran: "v1", "v2" (prefetch) or "v3" (TMA)
_tickets: dict[torch.device, list[torch.Tensor]] = {}  # merge="ticket": per device, its counters (last is current)
_smem: dict[torch.device, int] = {}  # per device: shared memory per SM (tma_config)
_pdl_ok: dict[torch.device, bool] = {}  # per device: programmatic dependent launch available (sm_90+)


@triton.jit
def _paged_decode_kernel(Q, KC, VC, TABLE, LENS, M_OUT, L_OUT, O_OUT, OUT, TICKETS, qk_scale, split_len,
                         sqb, sqh, skb, sks, skh, svb, svs, svh, stb, max_blocks, num_splits,
                         Hq, Hkv, GROUP, num_blocks, K_DESC, V_DESC, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, GROUP_PAD: tl.constexpr, TILE: tl.constexpr, IEEE: tl.constexpr,
                         SPLITS_PAD: tl.constexpr, DIRECT: tl.constexpr, TICKET: tl.constexpr,
                         PREFETCH: tl.constexpr = False, PDL: tl.constexpr = False,
                         PDL_EARLY: tl.constexpr = False, TMA: tl.constexpr = False):
    if PDL and PDL_EARLY:  # the merge launch may start now: its programs wait (gdc_wait) for this grid's end
        gdc_launch_dependents()
    # BEGIN SOLUTION
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(LENS + b)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    g = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + g                       # the query heads that share KV head hk
    gmask = g < GROUP
    dmask = dims < HEAD_DIM
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    if TMA:  # v3: whole blocks per step (TILE // BLOCK_SIZE of them), copied by the tensor-memory accelerator
        m, l, acc = _decode_loop_tma(q, m, l, acc, KC, VC, K_DESC, V_DESC, TABLE, b, hk, start, end, qk_scale,
                                     skb, sks, skh, svb, svs, svh, stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE,
                                     HEAD_DIM=HEAD_DIM, TILE=TILE, IEEE=IEEE)
    elif PREFETCH:  # v2: the loads run ahead of the math by hand
        m, l, acc = _decode_loop_prefetch(q, m, l, acc, KC, VC, TABLE, b, hk, start, end, qk_scale, skb, sks, skh,
                                          svb, svs, svh, stb, max_blocks, num_blocks, dims, dmask,
                                          BLOCK_SIZE=BLOCK_SIZE, TILE=TILE, IEEE=IEEE)
    else:  # v1: Triton's pipeliner places the loads
        for t0 in tl.range(start, end, TILE):
            pos = t0 + tl.arange(0, TILE)
            pmask = pos < end
            blk = pos // BLOCK_SIZE
            phys = tl.load(TABLE + b * stb + blk, mask=pmask & (blk < max_blocks), other=-1)  # padding is never read
            # an entry outside the pool is never dereferenced, even when the host check was skipped
            pmask = pmask & (phys >= 0) & (phys < num_blocks)
            phys = phys.to(tl.int64)  # block * stride passes 2^31 in pools over 4 GiB
            slot = pos % BLOCK_SIZE
            kmask = pmask[:, None] & dmask[None, :]
            k = tl.load(KC + phys[:, None] * skb + slot[:, None] * sks + hk * skh + dims[None, :], mask=kmask, other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            else:
                s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(pmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            v = tl.load(VC + phys[:, None] * svb + slot[:, None] * svs + hk * svh + dims[None, :], mask=kmask, other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
    # END SOLUTION
    if PDL and not PDL_EARLY:  # the loads are done: the merge launch may start while the partials are stored
        gdc_launch_dependents()
    _finish_split(m, l, acc, M_OUT, L_OUT, O_OUT, OUT, TICKETS, Hq, Hkv, GROUP, num_splits, HEAD_DIM=HEAD_DIM,
                  BLOCK_D=BLOCK_D, GROUP_PAD=GROUP_PAD, SPLITS_PAD=SPLITS_PAD, DIRECT=DIRECT, TICKET=TICKET)


@triton.jit
def _table_entries(TABLE, b, t0, stb, max_blocks, num_blocks, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """The physical block of each of the TILE tokens from position t0 on (int64), and which of them lie in
    the table and point inside the pool; the caller adds the sequence-length mask."""
    # BEGIN SOLUTION
    pos = t0 + tl.arange(0, TILE)
    blk = pos // BLOCK_SIZE
    inside = blk < max_blocks
    phys = tl.load(TABLE + b * stb + blk, mask=inside, other=-1)
    ok = inside & (phys >= 0) & (phys < num_blocks)
    # END SOLUTION
    return phys.to(tl.int64), ok


@triton.jit
def _kv_tile(C, phys, pos, ok, hk, sb, ss, sh, dims, dmask, BLOCK_SIZE: tl.constexpr):
    """The (TILE, BLOCK_D) keys or values of one KV head at positions pos; masked rows read nothing (0)."""
    # BEGIN SOLUTION
    slot = pos % BLOCK_SIZE
    tile = tl.load(C + phys[:, None] * sb + slot[:, None] * ss + hk * sh + dims[None, :],
                   mask=ok[:, None] & dmask[None, :], other=0.0)
    # END SOLUTION
    return tile


@triton.jit
def _decode_loop_prefetch(q, m, l, acc, KC, VC, TABLE, b, hk, start, end, qk_scale, skb, sks, skh, svb, svs, svh,
                          stb, max_blocks, num_blocks, dims, dmask, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                          IEEE: tl.constexpr):
    """v2 of the decode loop: the software pipeline written out by hand.

    v1 leaves the loads to Triton's pipeliner. Because a tile's K/V addresses come from a table load, the
    pipeliner issues the table load for the next tile after this tile's math and waits for the K/V copies
    at the top of the next step, so a program has no load in flight while it computes and pays the table's
    round trip on every step. Here the loads run ahead of the math in registers, where a load only stalls
    when its value is first used: each step first issues the next tile's K and V (their table entries were
    loaded one step earlier) and the table entries of the tile after that, then computes on the current
    tile. The first tiles' table entries are loaded before the sequence length is known (masked by the
    table's width only), so the program's start waits for one round trip, not two, before K and V.
    """
    # BEGIN SOLUTION
    ar = tl.arange(0, TILE)
    phys, ok = _table_entries(TABLE, b, start, stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE, TILE=TILE)
    phys_n, ok_n = _table_entries(TABLE, b, start + TILE, stb, max_blocks, num_blocks, BLOCK_SIZE=BLOCK_SIZE,
                                  TILE=TILE)
    pos = start + ar
    ok = ok & (pos < end)
    k = _kv_tile(KC, phys, pos, ok, hk, skb, sks, skh, dims, dmask, BLOCK_SIZE=BLOCK_SIZE)
    v = _kv_tile(VC, phys, pos, ok, hk, svb, svs, svh, dims, dmask, BLOCK_SIZE=BLOCK_SIZE)
    for t0 in tl.range(start, end, TILE, num_stages=1):  # num_stages=1: the pipeliner keeps out of it
        # issue the loads of the steps ahead before the math of this one (rows past `end` read nothing)
        pos_n = t0 + TILE + ar
        ok_n = ok_n & (pos_n < end)
        k_n = _kv_tile(KC, phys_n, pos_n, ok_n, hk, skb, sks, skh, dims, dmask, BLOCK_SIZE=BLOCK_SIZE)
        v_n = _kv_tile(VC, phys_n, pos_n, ok_n, hk, svb, svs, svh, dims, dmask, BLOCK_SIZE=BLOCK_SIZE)
        phys_nn, ok_nn = _table_entries(TABLE, b, t0 + 2 * TILE, stb, max_blocks, num_blocks,
                                        BLOCK_SIZE=BLOCK_SIZE, TILE=TILE)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
        k, v, ok, phys_n, ok_n = k_n, v_n, ok_n, phys_nn, ok_nn
    # END SOLUTION
    return m, l, acc


@triton.jit
def _block_descriptor(C, num_blocks, sb, ss, sh, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A 2-D tensor descriptor over a cache pool: rows of ``ss`` elements (one slot's stride), as many as the
    pool holds, and (BLOCK_SIZE, HEAD_DIM) boxes: the box at row r, column c is one block of one KV head
    when r, c are that block-and-head's element offset divided by / modulo ``ss`` (see _decode_step_tma; the
    host checks that every block of every head lands in one box, ``tma_unsupported``)."""
    # BEGIN SOLUTION
    desc = tl.make_tensor_descriptor(C, shape=[num_blocks * (sb // ss), ss], strides=[ss, 1],
                                     block_shape=[BLOCK_SIZE, HEAD_DIM])
    # END SOLUTION
    return desc


@triton.jit
def _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, t0, end, qk_scale, sb, ss, sh, stb,
                     max_blocks, num_blocks, BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One block of the v3 loop: its table entry, its K and V boxes by TMA, the online-softmax step. An entry
    outside the pool is never dereferenced: its box is placed past the descriptor's last row, so K and V read
    as zeros, and its scores are masked. MASKED: the block may run past ``end`` (the last of a split), so its scores
    past ``end`` are masked and its value rows there zeroed (a slot past a sequence's end may hold anything)."""
    # BEGIN SOLUTION
    blk = t0 // BLOCK_SIZE
    phys = tl.load(TABLE + b * stb + blk, mask=blk < max_blocks, other=-1)
    ok = (phys >= 0) & (phys < num_blocks)
    # the box's first element in the pool; an entry outside the pool points one block past its end, where
    # every row of the box lies outside the descriptor and TMA reads zeros (never another block's data)
    off = tl.where(ok, phys, num_blocks).to(tl.int64) * sb + hk * sh
    row = (off // ss).to(tl.int32)
    col = (off % ss).to(tl.int32)
    k = k_desc.load([row, col])
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        valid = ((t0 + tl.arange(0, BLOCK_SIZE)) < end) & ok
        s = tl.where(valid[None, :], s, float("-inf"))
    else:
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    v = v_desc.load([row, col])
    if MASKED:
        v = tl.where(valid[:, None], v, 0.0)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    # END SOLUTION
    return m_new, l, acc


@triton.jit
def _decode_loop_tma(q, m, l, acc, KC, VC, K_DESC, V_DESC, TABLE, b, hk, start, end, qk_scale, skb, sks, skh,
                     svb, svs, svh, stb, max_blocks, num_blocks, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                     TILE: tl.constexpr, IEEE: tl.constexpr):
    """v3 of the decode loop: whole cache blocks per step, each block's K and V copied by TMA.

    v1 gathers each tile row by row with per-thread addresses. Here a step is TILE tokens, TILE // BLOCK_SIZE
    whole blocks (one where the tile is the block size), and each block's keys and values are one box of a
    tensor descriptor: a single thread issues each copy, the data lands in shared memory, and Triton's
    pipeliner keeps the next step's copies in flight while this one computes (at 3 stages:
    results/aot_resources_paged_v3_sm90.txt). The default is one block per step; several per step (tile=)
    chain their online-softmax updates block by block and ran slower on the H200. The full steps of the split run unmasked; the last, which may
    run past the sequence's end, masked (``start`` is tile-aligned: a split is whole tiles). The two
    descriptors come from the host (K_DESC, V_DESC: ``TMA_HOST_DESCRIPTORS``) or are built here, by every
    program, in scratch memory.
    """
    # BEGIN SOLUTION
    if K_DESC is None:
        k_desc = _block_descriptor(KC, num_blocks, skb, sks, skh, BLOCK_SIZE=BLOCK_SIZE, HEAD_DIM=HEAD_DIM)
        v_desc = _block_descriptor(VC, num_blocks, svb, svs, svh, BLOCK_SIZE=BLOCK_SIZE, HEAD_DIM=HEAD_DIM)
    else:
        k_desc = K_DESC
        v_desc = V_DESC
    full_end = start + tl.maximum(end - start, 0) // TILE * TILE
    for t0 in tl.range(start, full_end, TILE):
        for j in tl.static_range(TILE // BLOCK_SIZE):
            m, l, acc = _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, t0 + j * BLOCK_SIZE, end,
                                         qk_scale, skb, sks, skh, stb, max_blocks, num_blocks,
                                         BLOCK_SIZE=BLOCK_SIZE, MASKED=False, IEEE=IEEE)
    if full_end < end:  # the last step: blocks wholly past end read their table entries (or none) and weigh nothing
        for j in tl.static_range(TILE // BLOCK_SIZE):
            m, l, acc = _decode_step_tma(q, m, l, acc, k_desc, v_desc, TABLE, b, hk, full_end + j * BLOCK_SIZE,
                                         end, qk_scale, skb, sks, skh, stb, max_blocks, num_blocks,
                                         BLOCK_SIZE=BLOCK_SIZE, MASKED=True, IEEE=IEEE)
    # END SOLUTION
    return m, l, acc


@triton.jit
def _finish_split(m, l, acc, M_OUT, L_OUT, O_OUT, OUT, TICKETS, Hq, Hkv, GROUP, num_splits,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_PAD: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, DIRECT: tl.constexpr, TICKET: tl.constexpr):
    """What a program does with its (m, l, acc) (m in log2 units, GROUP_PAD rows, the padding rows masked).

    DIRECT (one split): normalize and write the output. Otherwise store the unnormalized partial; with
    TICKET, also draw a ticket from the (b, hk) counter: the program that draws num_splits - 1 is the
    last of its group to finish, merges every split's partials (as _merge_splits_kernel does) and
    resets the counter to 0 for the next call (and for CUDA-graph replays).
    """
    b = tl.program_id(0)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, GROUP_PAD)
    dims = tl.arange(0, BLOCK_D)
    heads = hk * GROUP + g
    gmask = g < GROUP
    if DIRECT:
        # as the merge of a single split: o / l (0 / 0 = NaN for an empty sequence, as the merge gives)
        out = acc / tl.where(gmask, l, 1.0)[:, None]
        tl.store(OUT + (b * Hq + heads)[:, None] * HEAD_DIM + dims[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask[:, None] & (dims < HEAD_DIM)[None, :])
    else:
        row = (b * Hq + heads) * num_splits + split
        tl.store(M_OUT + row, m, mask=gmask)
        tl.store(L_OUT + row, l, mask=gmask)
        tl.store(O_OUT + row[:, None] * BLOCK_D + dims[None, :], acc, mask=gmask[:, None])
        if TICKET:
            tl.debug_barrier()  # every thread's partials are stored before the release below publishes them
            ticket = tl.atomic_add(TICKETS + b * Hkv + hk, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:  # every other split of (b, hk) has published its partials
                tl.debug_barrier()
                for i in range(GROUP):
                    # .cg: read from L2, past this SM's L1, which may hold stale lines of the partials
                    _merge_row(M_OUT, L_OUT, O_OUT, OUT, b * Hq + hk * GROUP + i, num_splits, HEAD_DIM=HEAD_DIM,
                               BLOCK_D=BLOCK_D, SPLITS_PAD=SPLITS_PAD, CACHE=".cg")
                tl.store(TICKETS + b * Hkv + hk, 0)  # zeroed for the next call: no memset per call


@triton.jit
def _merge_row(M, L, O, OUT, row, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               SPLITS_PAD: tl.constexpr, CACHE: tl.constexpr):
    """Merge the partials of one (sequence, query head):
    o = sum_s 2^(m_s - m*) o_s / sum_s 2^(m_s - m*) l_s."""
    sp = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, BLOCK_D)
    smask = sp < num_splits
    m = tl.load(M + row * num_splits + sp, mask=smask, other=float("-inf"), cache_modifier=CACHE)
    l = tl.load(L + row * num_splits + sp, mask=smask, other=0.0, cache_modifier=CACHE)
    o = tl.load(O + (row * num_splits + sp)[:, None] * BLOCK_D + dims[None, :], mask=smask[:, None], other=0.0,
                cache_modifier=CACHE)
    m_star = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_star))  # empty splits weigh nothing
    out = tl.sum(o * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    tl.store(OUT + row * HEAD_DIM + dims, out.to(OUT.dtype.element_ty), mask=dims < HEAD_DIM)


@triton.jit
def _merge_splits_kernel(M, L, O, OUT, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                         SPLITS_PAD: tl.constexpr, PDL: tl.constexpr = False):
    """merge="launch": one program per (sequence, query head). With PDL it was launched early, as a
    programmatic dependent of the decode kernel, and first waits until that grid has finished and its
    writes are visible."""
    if PDL:
        gdc_wait()
    _merge_row(M, L, O, OUT, tl.program_id(0), num_splits, HEAD_DIM=HEAD_DIM, BLOCK_D=BLOCK_D,
               SPLITS_PAD=SPLITS_PAD, CACHE="")


def default_splits(batch: int, hkv: int, max_len: int, device) -> int:
    """As many splits as fit in one wave of ~4 programs per SM, never a slice under one 64-token tile.

    From the split sweeps on the H200 (benchmarks/results/paged_attention_h200.json, rows marked
    ``sweep``): at batch 1 the time falls until ~64 splits fill the SMs; at batch 16 (128 programs
    unsplit) 4 splits (512 programs, one wave) beat both 5 and 9, which spill into a second,
    mostly idle wave. Rounding down keeps the grid inside the first wave.
    """
    if INTERPRETED:
        return 1
    return max(1, min((4 * _num_sms(device)) // (batch * hkv), math.ceil(max_len / 64), 128))


def decode_config(batch: int, hkv: int, max_len: int) -> tuple[int, int | None]:
    """The decode kernel's default (num_warps, num_stages) for a batch; None stages: Triton's default.

    From the num_warps x num_stages sweeps on the H200 (benchmarks/results/paged_decode_study_h200.json;
    bf16, Hq=32, Hkv=8, D=128, block size 16, default splits): at B=1, 4 warps with 1 stage were best
    up to L=4K and with 2 stages at L=16K; at B>=16, 2 stages were best, with 2 warps where
    B * L >= 256K tokens (B=16 L=16K, B=64 L>=4K) and 4 warps below (within 1% of 2 warps at
    B=16 L=4K and B=64 L=1K). Batches between 2 and 15, which the sweeps did not time, take the
    B=1 rule. ``hkv`` is unused for now (the sweeps had Hkv=8 only). ``max_len`` is the token
    capacity of the block table, as ``default_splits`` takes it.
    """
    if batch < 16:
        return 4, (1 if max_len <= 4096 else 2)
    return (2 if batch * max_len >= 16 * 16384 else 4), 2


def prefers_tma(batch: int, hkv: int, block_size: int, device) -> bool:
    """Whether a call with tma=None runs v3 (one block per step, copied by TMA), from the H200
    studies (benchmarks/results/paged_decode_tma_*_h200.json; bf16, Hq=32, Hkv=8, D=128, scattered
    table). v3 keeps a whole block in flight while it computes the one before, so one program per (sequence,
    KV head) streams fast enough on its own, and one or two splits (``tma_splits``) need no or one small
    merge. That wins where batch * Hkv alone about fills the SMs once or twice (more than half of them, at
    most twice: B=9 to 33 there) with blocks of 64 tokens or more: at B=12 and 16 (1.01-1.46x v1 with the
    default's own configuration), and at B=32, where v3 ran at 1.03-1.06x v1 with 128-token blocks and
    1.05-1.12x with 64-token ones. At B=64 (four times the programs of B=16) v1, which
    runs one split there too, won or tied; below half the SMs one split leaves SMs idle and v1 splits. With
    16-token blocks a step is too small (v3 ran at 0.54-0.71x v1 at the defaults, its best configuration at
    B >= 16 at most 0.87x), and taking several blocks per step did not help (``tile=``: each block its own box
    ran slower still, paged_decode_tma_steps_bs16_h200.json). The sweeps behind ``decode_config`` hold for v1
    only; v3 runs ``tma_config``'s."""
    if INTERPRETED or not DEFAULT_TMA:
        return False
    return tma_rule(batch, hkv, block_size, _num_sms(device))


def tma_splits(tile: int, max_len: int) -> int:
    """v3's split count where batch * Hkv passes half the SMs, from the same study (host descriptors), by the
    tokens of a step: with 128-token steps (blocks) one split was fastest at every length (one program per
    (sequence, KV head) streams at cuDNN's rate, and nothing is merged); with 64-token steps one split at L=1K
    and two from L=4K on."""
    return 1 if tile >= 128 or max_len < 4096 else 2


def tma_shared_bytes(stages: int, tile: int, head_dim: int, element_size: int) -> int:
    """Shared memory one v3 program holds, as Triton 3.6 compiles it for sm_90: (stages - 1) buffers of a
    step's K and V plus about 8 KiB (72 / 136 KiB at 2 / 3 stages with 128-token steps, D=128, bf16;
    results/aot_resources_paged_v3_sm90.txt lists the compiled numbers this model follows)."""
    return max(stages - 1, 1) * 2 * tile * head_dim * element_size + 8192


def tma_config(batch: int, hkv: int, sms: int, tile: int, head_dim: int, element_size: int,
               shared_per_sm: int) -> tuple[int, int]:
    """v3's (num_warps, num_stages): ``TMA_CONFIG``, with fewer stages only where that is what lets every one of
    the batch * Hkv programs be resident at once (``tma_shared_bytes`` each; ``tile``: tokens per step). At
    B=32 (256 programs on 132 SMs) 128-token blocks at 3 stages fit one program per SM and ran in two waves; at
    2 stages, 1.09x faster at L=1K. 64-token blocks fit three per SM at 3 stages and ran 1.07x faster there
    than at 2 (paged_decode_tma_stages_bs*_h200.json). Raises ValueError for a step too large to fit an SM
    even at 2 stages (one buffer)."""
    warps, stages = TMA_CONFIG
    if tma_shared_bytes(2, tile, head_dim, element_size) > shared_per_sm:
        raise ValueError(f"a v3 step of {tile} tokens needs {tma_shared_bytes(2, tile, head_dim, element_size)} "
                         f"bytes of shared memory; an SM has {shared_per_sm}: pass a smaller tile")
    per_sm = -(-batch * hkv // sms)  # programs each SM must hold for one wave
    while stages > 2 and per_sm * tma_shared_bytes(stages, tile, head_dim, element_size) > shared_per_sm:
        stages -= 1
    return warps, stages


def _shared_per_sm(device) -> int:
    """Shared memory per SM in bytes (asked once per device); 228 KiB (sm_90) where torch does not say."""
    device = torch.device(device)
    if device not in _smem:
        props = torch.cuda.get_device_properties(device)
        _smem[device] = int(getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))
    return _smem[device]


def tma_rule(batch: int, hkv: int, block_size: int, sms: int) -> bool:
    """:func:`prefers_tma`'s rule on a GPU with ``sms`` SMs (the switch and the interpreter aside)."""
    return block_size >= TMA_MIN_BLOCK and sms // 2 < batch * hkv <= 2 * sms


def split_plan(max_len: int, splits: int, tile: int) -> tuple[int, int]:
    """(tokens per split, splits that run) for ``splits`` asked over ``max_len`` tokens: each split is
    rounded up to whole tiles, which can leave fewer splits than asked (the trailing ones empty)."""
    split_len = cdiv(cdiv(max_len, splits), tile) * tile
    return split_len, cdiv(max_len, split_len)


def tma_unsupported(k_cache, v_cache, block_size: int) -> str | None:
    """Why the v3 loop (TMA) cannot read these caches, or None if it can.

    Each block of one KV head must be one (block_size, D) box of a 2-D view of the pool whose rows are one
    slot apart: true of the contiguous (num_blocks, block_size, Hkv, D) pool and of a head-major
    (num_blocks, Hkv, block_size, D) pool passed as its permuted view. TMA also wants 16-byte aligned bases
    and row strides, and Triton's boxes powers of two (the box is the whole head dim: no padding).
    """
    nb, bs, hkv, d = k_cache.shape
    if k_cache.stride() != v_cache.stride():
        return "k_cache and v_cache have different strides"
    sb, ss, sh, sd = k_cache.stride()
    size = k_cache.element_size()
    if sd != 1:
        return "the head dim is not contiguous"
    if not (16 <= bs <= 256 and bs & (bs - 1) == 0):
        return f"block size {bs} is not a power of two in [16, 256]"
    if not (16 <= d <= 256 and d & (d - 1) == 0):
        return f"head dim {d} is not a power of two in [16, 256]"
    if k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16 or ss * size % 16:
        return "a base pointer or the slot stride is not 16-byte aligned"
    if ss <= 0 or sb % ss or any((h * sh) % ss + d > ss or (h * sh) // ss + bs > sb // ss for h in range(hkv)):
        return "a block of one head is not one box of rows one slot apart inside its block"
    if (nb + 1) * (sb // ss) >= 2**31:
        return "the pool has more rows than TMA coordinates address"
    return None


def _host_descriptors(k_cache, v_cache, num_blocks: int, block_size: int, head_dim: int):
    """v3's two descriptors made on the host, as ``_block_descriptor`` builds them in the kernel: 2-D views of the
    pools with rows one slot apart (stride ``ss``), as many rows as the pool holds, (block_size, head_dim) boxes."""
    # BEGIN SOLUTION
    sb, ss = k_cache.stride(0), k_cache.stride(1)
    rows = num_blocks * (sb // ss)
    descs = tuple(TensorDescriptor(c, [rows, ss], [ss, 1], [block_size, head_dim]) for c in (k_cache, v_cache))
    # END SOLUTION
    return descs


def _has_pdl(device) -> bool:
    """Whether kernels on ``device`` can use programmatic dependent launch (sm_90 and up; never in the
    interpreter). Asked once per device."""
    if INTERPRETED or gdc_wait is None:
        return False
    if device not in _pdl_ok:
        _pdl_ok[device] = torch.cuda.get_device_capability(device)[0] >= 9
    return _pdl_ok[device]


def _ticket_counters(device, n: int) -> torch.Tensor:
    """The per-(sequence, KV head) int32 counters of merge="ticket", zeroed once and kept per device.

    The kernel leaves every counter at 0 when it finishes, so no call needs a memset. A buffer that
    is outgrown is kept alive (not freed): a CUDA graph captured with it still points at it.
    Calls that run concurrently on different streams of one device would share counters; don't.
    """
    bufs = _tickets.setdefault(torch.device(device), [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 2 * bufs[-1].numel() if bufs else 256), device=device, dtype=torch.int32))
    return bufs[-1]


def decode_dims(q, k_cache, v_cache, block_table, seq_lens, validate: bool) -> tuple[int, ...]:
    """The checks every paged decode kernel's host code runs first (tensors, shapes, the table when ``validate``,
    dtype, one device); returns (B, Hq, Hkv, D, block_size, num_blocks)."""
    check_tensors(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    dims = check_paged_inputs(q, k_cache, v_cache, block_table, seq_lens, check_table=validate)
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {SUPPORTED_DTYPES}")
    check_placement(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens)
    return dims


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, scale: float | None = None,
                    validate: bool = True, num_splits: int | None = None, tile: int | None = None,
                    num_warps: int | None = None, num_stages: int | None = None,
                    merge: str | None = None, prefetch: bool | None = None,
                    pdl: bool | str | None = None, tma: bool | None = None) -> torch.Tensor:
    """Decode attention over a paged cache; same signature as the NumPy reference, plus tuning knobs:
    ``num_splits`` (programs per sequence and KV head), ``tile`` (tokens per loop step), the decode
    kernel's ``num_warps`` / ``num_stages`` (None: from :func:`decode_config`), and ``merge``, how
    the splits' partials are combined (None: ``DEFAULT_MERGE``): ``"launch"``, a second kernel, one
    program per (sequence, query head); or ``"ticket"``, in the decode kernel itself, by the last
    program of each (sequence, KV head) to finish (an atomic counter tells it that it is the last).
    With one split there is nothing to merge: the program writes the output in both modes.
    ``prefetch`` picks the decode loop (None: ``DEFAULT_PREFETCH``): False, v1, where Triton's pipeliner
    places the loads; True, v2, where each step issues the next tile's loads before its own math
    (``_decode_loop_prefetch``; ``num_stages`` does not apply to its loop). ``pdl`` (None:
    ``DEFAULT_PDL``) launches merge="launch"'s second kernel with programmatic dependent launch on GPUs
    that have it (compute capability 9.0 and up; elsewhere, and in the interpreter, it is ignored): the
    decode kernel's programs let it start once their loads are done (``"early"``: as they begin) and its
    programs wait for the decode grid to finish, so that the second launch's latency can overlap the
    first kernel's work (on the H200 it gained nothing: ``DEFAULT_PDL`` is off). ``tma`` picks v3, where
    each step is one cache block whose K and V are copied whole by TMA (``_decode_loop_tma``; a ``tile`` of
    several blocks gives each step that many, each its own copy, measured slower); None: v3 where :func:`prefers_tma` says so (then with ``tma_splits`` splits and
    :func:`tma_config`'s warps and stages, unless the knobs say otherwise), else v1 or v2.
    ``tma=True`` on caches it cannot read (:func:`tma_unsupported`) raises; the default falls back there.
    Under the default (``tma=None``) an explicit ``tile`` asks for v1's loop, even one equal to the block size.
    ``last_decode_loop`` says which loop ran.

    A sequence of length 0 (possible only with ``validate=False``) gives NaN rows (0 / 0), as the
    merge always has; the NumPy reference rejects it.

    ``validate=True`` checks every table entry that will be read against the pool on the host, which
    copies block_table and seq_lens off the GPU (a sync per call). A caller that builds its own tables
    (the batching engine, the benchmark) passes ``validate=False``; the kernel then still masks any
    entry outside the pool, so it never reads out of bounds, but a bad table gives wrong numbers
    instead of an error.
    """
    B, Hq, Hkv, D, block_size, num_blocks = decode_dims(q, k_cache, v_cache, block_table, seq_lens, validate)
    if D > 256:
        raise ValueError(f"unsupported head dim {D}: at most 256")
    if not 1 <= block_size <= 1024:
        raise ValueError(f"unsupported block size {block_size}")
    out_dtype = q.dtype
    if INTERPRETED and q.dtype == torch.bfloat16:  # the interpreter's bf16 dot is wrong (triton #11584)
        q, k_cache, v_cache = q.float(), k_cache.float(), v_cache.float()
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    group = Hq // Hkv
    # Size the splits from what the block table can hold, not from seq_lens.max(): reading that
    # would stall the host on the GPU every call. Splits past a sequence's end do no work.
    max_len = block_table.shape[1] * block_size
    # the tile is independent of the block size (a tile may span several blocks)
    if tile is not None and (tile < 16 or tile & (tile - 1)):
        raise ValueError(f"tile must be a power of two >= 16, got {tile}")
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two >= 1, got {num_warps}")
    if num_stages is not None and num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if pdl not in (None, False, True, "early"):
        raise ValueError(f"pdl must be None, False, True or 'early', got {pdl!r}")
    if prefetch not in (None, False, True):
        raise ValueError(f"prefetch must be None, False or True, got {prefetch!r}")
    if tma not in (None, False, True):
        raise ValueError(f"tma must be None, False or True, got {tma!r}")
    # the kernel takes the caches' block, slot and head strides as they are (a head-major pool passed as a
    # permuted view runs without a copy) and assumes the head dim is contiguous
    k_cache = k_cache if k_cache.stride(-1) == 1 else k_cache.contiguous()
    v_cache = v_cache if v_cache.stride(-1) == 1 else v_cache.contiguous()
    if tma is None:  # the default's rule, unless the knobs asked for another loop (prefetch) or a tile
        use_tma = prefers_tma(B, Hkv, block_size, q.device) and not prefetch and tile is None
    else:
        use_tma = tma
    if use_tma and prefetch:
        raise ValueError("tma=True and prefetch=True pick two different loops; pass one")
    if use_tma:
        why = tma_unsupported(k_cache, v_cache, block_size)
        if why and tma:
            raise ValueError(f"tma=True cannot read these caches: {why}")
        use_tma = why is None
    if use_tma:
        if tile is not None and not (tile >= block_size and tile // block_size <= TMA_MAX_BLOCKS_PER_STEP):
            raise ValueError(f"with tma=True a step is whole blocks: tile must be the block size {block_size} "
                             f"times a power of two up to {TMA_MAX_BLOCKS_PER_STEP}, got {tile}")
        tile = tile or block_size  # one block per step: several (tile=) ran slower (paged_decode_tma_steps_*)
    tile = tile or (16 if INTERPRETED else DEFAULT_TILE)
    sms = _num_sms(q.device) if use_tma and not INTERPRETED else None  # v3's split count and stages read it
    if num_splits:
        splits = num_splits
    elif sms is not None and B * Hkv > sms // 2:
        # about a program per SM already: one or two splits; past the SMs, one
        splits = tma_splits(tile, max_len) if B * Hkv <= sms else 1
    else:
        splits = default_splits(B, Hkv, max_len, q.device)
    merge = DEFAULT_MERGE if merge is None else merge
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    split_len, splits = split_plan(max_len, splits, tile)
    block_d = max(16, next_power_of_2(D))
    if sms is not None:
        table_warps, table_stages = tma_config(B, Hkv, sms, tile, D, k_cache.element_size(), _shared_per_sm(q.device))
    else:
        table_warps, table_stages = TMA_CONFIG if use_tma else decode_config(B, Hkv, max_len)
    launch = {"num_warps": 1 if INTERPRETED else (num_warps or table_warps)}
    stages = num_stages if num_stages is not None else table_stages
    if stages is not None:
        launch["num_stages"] = stages
    direct = splits == 1  # nothing to merge: the one program writes the output
    ticket = merge == "ticket" and not direct
    splits_pad = max(2, next_power_of_2(splits))
    out = torch.empty((B, Hq, D), device=q.device, dtype=out_dtype)
    if direct:  # no partials to keep (the kernel never touches them)
        m = l = o = out
    else:
        m = torch.empty((B, Hq, splits), device=q.device, dtype=torch.float32)
        l = torch.empty_like(m)
        o = torch.empty((B, Hq, splits, block_d), device=q.device, dtype=torch.float32)
    tickets = _ticket_counters(q.device, B * Hkv) if ticket else out  # out: a placeholder, never touched
    use_pdl = (DEFAULT_PDL if pdl is None else bool(pdl)) and not direct and not ticket and _has_pdl(q.device)
    qc = q if q.stride(-1) == 1 else q.contiguous()
    use_prefetch = (DEFAULT_PREFETCH if prefetch is None else bool(prefetch)) and not use_tma
    k_desc = v_desc = None
    if use_tma and TMA_HOST_DESCRIPTORS:
        k_desc, v_desc = _host_descriptors(k_cache, v_cache, num_blocks, block_size, D)
    elif use_tma and not INTERPRETED:
        _ensure_allocator()  # the descriptors are built in the kernel, in scratch memory from torch
    global last_decode_kernel, last_decode_loop
    last_decode_loop = "v3" if use_tma else "v2" if use_prefetch else "v1"
    last_decode_kernel = fast_launch(
        _paged_decode_kernel, (B, Hkv, splits),
        qc, k_cache, v_cache, block_table, seq_lens, m, l, o, out, tickets, scale * 1.4426950408889634, split_len,
        qc.stride(0), qc.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_table.stride(0),
        block_table.shape[1], splits, Hq, Hkv, group, num_blocks, k_desc, v_desc, BLOCK_SIZE=block_size,
        HEAD_DIM=D, BLOCK_D=block_d, GROUP_PAD=max(16, next_power_of_2(group)), TILE=tile,
        IEEE=q.dtype == torch.float32, SPLITS_PAD=splits_pad, DIRECT=direct, TICKET=ticket,
        PREFETCH=use_prefetch, PDL=use_pdl, PDL_EARLY=use_pdl and pdl == "early", TMA=use_tma, **launch)
    if not direct and not ticket:
        # merge the splits through their log-sum-exp (m is in log2 units, as in the kernel): one launch
        more = {"launch_pdl": True} if use_pdl else {}
        fast_launch(_merge_splits_kernel, (B * Hq,), m, l, o, out, splits, HEAD_DIM=D, BLOCK_D=block_d,
                    SPLITS_PAD=splits_pad, PDL=use_pdl, num_warps=1 if INTERPRETED else 4, **more)
    return out
