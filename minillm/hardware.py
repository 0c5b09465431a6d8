"""Chapter 4: the hardware -- what a GPU can move and compute, and what attention asks of it.

Four pieces, NumPy and the standard library only:

* ``GPUSpec`` / ``GPUS``: the book's one registry of GPUs: memory as the device
  reports it, bandwidth and compute from the datasheets, each with its source.
  Chapters 2 to 4 and the sizing of chapter 3 (``minillm.sizing.capacity``) all
  read it.
* A *traffic model*: how many bytes cross between HBM (the big, slow memory)
  and on-chip SRAM for textbook attention versus a tiled, fused
  FlashAttention-2-style kernel. Formulas, not measurements.
* A *counting simulator*: the same two schedules actually run in NumPy on
  (N, d) arrays, with every tile that is "loaded from HBM" or "stored to HBM"
  going through a ``TrafficCounter``. The tests check that the counts equal the
  formulas byte for byte, so the formulas can be trusted in the chapter.
* A *roofline*: arithmetic intensity (FLOP per byte) of matmuls and attention,
  and the FLOP/s a GPU can attain at that intensity.

Sizes are bytes; bandwidths bytes/s; compute FLOP/s. "Dense" means without the
2:4 structured-sparsity doubling that datasheets often headline.

One unit convention for GPU memory: ``GPUSpec.memory_bytes`` is what the device
reports to CUDA (``torch.cuda.get_device_properties(i).total_memory``), in bytes,
and the book prints it in GiB (2**30 bytes, what nvidia-smi reports in). The "80 GB"
of a product name is kept apart, as ``memory_label_gb``: a label, not a byte count
(an "80 GB" H100 reports 79.2 GiB, 85.0e9 bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KiB, MiB, GiB = 1024, 1024**2, 1024**3
GB, TB = 10**9, 10**12   # datasheets quote HBM size and bandwidth in powers of ten

# Bytes per element of the dtypes the book uses. Anything else is a typo, not a new format.
DTYPE_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}


# --------------------------------------------------------------------------- GPUs

@dataclass(frozen=True)
class GPUSpec:
    """One GPU: its memory as the device reports it, and datasheet bandwidth and compute.

    ``memory_bytes`` is the device memory CUDA reports (``cudaDeviceProp::totalGlobalMem``, which
    ``torch.cuda.get_device_properties(i).total_memory`` returns): the most a program can allocate, with
    its source in ``memory_source``. ``memory_label_gb`` is the number in the product's name or datasheet
    headline ("80 GB"), a label and not a byte count; ``memory_label_announced_gb`` is set where the
    part was announced with a different label than it ships with. ``memory_kind`` is the memory
    technology (HBM2e, HBM3, HBM3e, or GDDR6 for the L40S and T4, which have no HBM); ``hbm_bw`` is that
    off-chip memory's datasheet bandwidth, whatever its kind.

    ``sram_per_sm_bytes`` is the combined L1 data cache + shared memory of one SM
    (the physical on-chip SRAM block); ``smem_per_sm_bytes`` is the largest part
    of it a kernel may claim as shared memory (what a tiling kernel can plan on).
    FLOP/s figures are dense tensor-core peaks; ``None`` marks a dtype the tensor
    cores do not support. ``regs_per_sm_bytes`` is one SM's register file: 64K
    32-bit registers on every architecture listed here (CUDA C++ Programming
    Guide, "Technical Specifications per Compute Capability", compute
    capabilities 7.5 to 10.0).
    """

    name: str
    memory_bytes: int
    memory_label_gb: float
    memory_kind: str
    hbm_bw: float
    sm_count: int
    sram_per_sm_bytes: int
    smem_per_sm_bytes: int
    l2_bytes: int
    fp16_flops: float | None
    bf16_flops: float | None
    fp8_flops: float | None
    sources: str
    memory_source: str
    memory_label_announced_gb: float | None = None
    regs_per_sm_bytes: int = 64 * KiB * 4

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Dense tensor-core FLOP/s for ``dtype`` ("fp16", "bf16" or "fp8")."""
        if dtype not in ("fp16", "bf16", "fp8"):
            raise ValueError(f"no tensor-core peak recorded for dtype {dtype!r}; use fp16, bf16 or fp8")
        flops = getattr(self, f"{dtype}_flops")
        if flops is None:
            raise ValueError(f"{self.name} has no {dtype} tensor-core support")
        return flops

    def ridge(self, dtype: str = "bf16") -> float:
        """Ridge point of the roofline: the intensity (FLOP/byte) where compute and bandwidth balance."""
        return self.peak_flops(dtype) / self.hbm_bw

    @property
    def total_sram_bytes(self) -> int:
        return self.sm_count * self.sram_per_sm_bytes


_A100_SRC = ("NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 108 SMs, 192 KB L1/shared per SM "
             "(up to 164 KB shared), 40 MB L2, 312 TFLOP/s dense FP16/BF16, no FP8; ")
_HOPPER_SRC = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): H100 SXM5 132 SMs, 256 KB L1/shared "
               "per SM (up to 228 KB shared), 50 MB L2, 989.4 TFLOP/s dense FP16/BF16, 1978.9 dense FP8; ")

GPUS: dict[str, GPUSpec] = {
    "A100 40GB": GPUSpec(
        "A100 40GB", 42_298_834_944, 40, "HBM2", 1555 * GB, 108, 192 * KiB, 164 * KiB, 40 * MiB, 312e12, 312e12,
        None, _A100_SRC + "NVIDIA A100 datasheet: 40 GB HBM2, 1,555 GB/s (SXM).",
        "deviceQuery on an NVIDIA A100-SXM4-40GB (driver 12.2): 40339 MBytes (42298834944 bytes), "
        "https://github.com/bottlerocket-os/bottlerocket/pull/3873"),
    "A100 80GB": GPUSpec(
        "A100 80GB", 85_100_068_864, 80, "HBM2e", 2039 * GB, 108, 192 * KiB, 164 * KiB, 40 * MiB, 312e12, 312e12,
        None, _A100_SRC + "NVIDIA A100 datasheet: 80 GB HBM2e, 2,039 GB/s (SXM; the PCIe card is 1,935 GB/s).",
        "deviceQuery on an NVIDIA A100-SXM4-80GB (driver 12.5): 81158 MBytes (85100068864 bytes), "
        "github.com/thamada/nvidia-smi gls/A100SXMx4_deviceQuery.py"),
    "H100 SXM": GPUSpec(
        "H100 SXM", 85_045_477_376, 80, "HBM3", 3350 * GB, 132, 256 * KiB, 228 * KiB, 50 * MiB, 989.4e12, 989.4e12,
        1978.9e12, _HOPPER_SRC + "NVIDIA H100 datasheet: 80 GB HBM3, 3.35 TB/s (the datasheet's 1,979/3,958 "
        "TFLOP/s BF16/FP8 are with sparsity).",
        "deviceQuery on an NVIDIA H100 80GB HBM3 (driver 12.7): 81106 MBytes (85045477376 bytes), "
        "github.com/thamada/nvidia-smi nvsim/H100SXMx8_deviceQuery.py"),
    "H200": GPUSpec(
        "H200", 150_109_880_320, 141, "HBM3e", 4800 * GB, 132, 256 * KiB, 228 * KiB, 60 * MiB, 989.4e12, 989.4e12,
        1978.9e12, _HOPPER_SRC + "NVIDIA H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, same compute as H100 SXM "
        "(same GH100 chip). L2 is not the H100 SXM's: 60 MiB (62,914,560 bytes) and 132 SMs as the CUDA device "
        "query (torch.cuda.get_device_properties: L2_cache_size, multi_processor_count) reported on the book's "
        "H200, recorded in benchmarks/results/hardware_h200.json (meta l2_bytes, sm_count).",
        "recorded on this book's H200: total_memory_bytes in benchmarks/results/hardware_h200.json "
        "(torch.cuda.get_device_properties(0).total_memory)"),
    "B200": GPUSpec(
        "B200", round(178.35 * GiB), 180, "HBM3e", 8000 * GB, 148, 256 * KiB, 228 * KiB, 126 * MiB, 2.25e15,
        2.25e15, 4.5e15,
        "NVIDIA DGX/HGX B200 datasheets and Blackwell architecture technical brief (2024): announced with "
        "192 GB HBM3e; shipping DGX B200 lists 1,440 GB for 8 GPUs, i.e. 180 GB each; 8 TB/s, dense BF16/FP16 "
        "~2.25 PFLOP/s and FP8 ~4.5 PFLOP/s (half the sparse headline; varies with the SKU's power limit). "
        "UNCERTAIN, not in an NVIDIA whitepaper table: 148 SMs, 126 MB L2 (both as reported by CUDA device "
        "queries); 228 KB max shared per SM and 256 KB L1/shared per SM from the CUDA Blackwell tuning guide.",
        "device query on an NVIDIA B200, to 0.01 GiB only: it prints 'Total Global Memory: 178.35 GB', "
        "which is GiB (182631 MiB in torch's device properties), https://github.com/pytorch/ao/pull/4002",
        memory_label_announced_gb=192),
    "L40S": GPUSpec(
        "L40S", 47_803_596_800, 48, "GDDR6", 864 * GB, 142, 128 * KiB, 100 * KiB, 96 * MiB, 362.05e12, 362.05e12,
        733e12,
        "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, 142 third-generation RT / fourth-generation tensor "
        "core SMs, 362.05 TFLOP/s dense FP16/BF16 (733 with sparsity), 733 dense FP8 (1,466 with sparsity). "
        "NVIDIA Ada GPU Architecture whitepaper: 128 KB L1/shared per SM (up to 100 KB shared), 96 MB L2 "
        "on the full AD102.",
        "deviceQuery on an NVIDIA L40S (driver 12.4): 45589 MBytes (47803596800 bytes), "
        "github.com/thamada/nvidia-smi nvsim/L40S_deviceQuery.py"),
    "T4": GPUSpec(
        "T4", 15_843_721_216, 16, "GDDR6", 320 * GB, 40, 96 * KiB, 64 * KiB, 4 * MiB, 65e12, None, None,
        "NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TFLOP/s FP16 (mixed precision), no BF16 or FP8 "
        "tensor cores. NVIDIA Turing architecture whitepaper: 40 SMs on the T4 (TU104), 96 KB L1/shared "
        "per SM (up to 64 KB shared), 4 MB L2.",
        "deviceQuery on a Tesla T4 (driver 11.0): 15110 MBytes (15843721216 bytes), "
        "https://chiemon.github.io/2024/12/25/%E6%98%BE%E5%8D%A1%E4%BF%A1%E6%81%AF.html"),
}


def get_gpu(name: str) -> GPUSpec:
    """Look up a GPU in ``GPUS`` by name (case and spaces ignored)."""
    key = str(name).replace(" ", "").lower()
    for spec in GPUS.values():
        if spec.name.replace(" ", "").lower() == key:
            return spec
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")


def _gpu(gpu) -> GPUSpec:
    return gpu if isinstance(gpu, GPUSpec) else get_gpu(gpu)


# --------------------------------------------------------------------------- validation

def _positive_int(name: str, x) -> int:
    # bool is an int in Python; "True tokens" is a bug, not a size.
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be a positive integer, got {x!r}")
    return int(x)


def _dtype_bytes(dtype_bytes) -> int:
    """Accept a dtype name ("bf16") or its size in bytes; anything else is an error."""
    if isinstance(dtype_bytes, str):
        if dtype_bytes not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype_bytes!r}; known: {', '.join(DTYPE_BYTES)}")
        return DTYPE_BYTES[dtype_bytes]
    if isinstance(dtype_bytes, bool) or not isinstance(dtype_bytes, (int, np.integer)) \
            or dtype_bytes not in DTYPE_BYTES.values():
        raise ValueError(f"dtype_bytes must be one of {sorted(set(DTYPE_BYTES.values()))}, got {dtype_bytes!r}")
    return int(dtype_bytes)


# --------------------------------------------------------------------------- traffic model

def standard_attention_traffic(n: int, d: int, dtype_bytes=2) -> dict:
    """HBM traffic of textbook, unfused attention for one head: n queries and keys of width d.

    Three kernels, each reading its inputs from HBM and writing its output back:
    S = Q K^T (reads Q, K; writes S), P = softmax(S) (reads S; writes P),
    O = P V (reads P, V; writes O). S and P are n x n, so four n^2 transfers
    dominate once n >> d. (Eager PyTorch does more: scaling and dtype casts are
    extra kernels, each another round trip of a score matrix.)
    """
    n, d, b = _positive_int("n", n), _positive_int("d", d), _dtype_bytes(dtype_bytes)
    vec, mat = n * d * b, n * n * b
    components = {"read_q": vec, "read_k": vec, "write_s": mat,
                  "read_s": mat, "write_p": mat,
                  "read_p": mat, "read_v": vec, "write_o": vec}
    return {"components": components, "total": sum(components.values()), "score_matrix_bytes": mat}


def flash_attention_traffic(n: int, d: int, block_m: int, block_n: int, dtype_bytes=2) -> dict:
    """HBM traffic of a fused, tiled kernel with the FlashAttention-2 loop order, for one head.

    The outer loop walks ceil(n / block_m) query tiles; each query tile is read
    once, then every K and V tile is streamed past it (block_n rows at a time),
    and the finished output tile is written once. So Q and O cross once, K and V
    once *per query tile*. block_n only sets how K/V are chunked, not how many
    bytes cross. (Training kernels also write a per-row logsumexp for the
    backward pass; inference does not need it and it is not counted.)
    """
    # BEGIN SOLUTION
    n, d, b = _positive_int("n", n), _positive_int("d", d), _dtype_bytes(dtype_bytes)
    block_m, block_n = _positive_int("block_m", block_m), _positive_int("block_n", block_n)
    q_tiles = math.ceil(n / block_m)
    vec = n * d * b
    components = {"read_q": vec, "read_k": q_tiles * vec, "read_v": q_tiles * vec, "write_o": vec}
    return {"components": components, "total": sum(components.values()), "q_tiles": q_tiles,
            "block_m": block_m, "block_n": block_n}
    # END SOLUTION


def compulsory_attention_traffic(n: int, d: int, dtype_bytes=2) -> int:
    """The floor: Q, K, V read once and O written once (4 n d bytes).

    A real GPU gets close to it when the K/V re-reads of concurrent query tiles
    hit in L2 instead of HBM -- something this SRAM-only model does not credit.
    """
    n, d, b = _positive_int("n", n), _positive_int("d", d), _dtype_bytes(dtype_bytes)
    return 4 * n * d * b


def _pow2_floor(x: int) -> int:
    return 1 << (x.bit_length() - 1)


def flash_block_size_for_sram(d: int, sram_bytes: int, dtype_bytes=2) -> tuple[int, int]:
    """(block_m, block_n) from the FlashAttention-1 paper's rule, rounded down to powers of two.

    With M = SRAM size in elements, FA1 (Dao et al. 2022, Algorithm 1) sets
    B_c = ceil(M / 4d) key rows and B_r = min(B_c, d) query rows. We round each
    down to a power of two (kernels tile by warps and powers of two), which also
    makes the fit provable: Q (B_r d), K and V (B_c d each) and S (B_r B_c <= d B_c)
    are each at most M/4 elements, so Q + K + V + S tiles fit in M.
    """
    d, sram_bytes, b = _positive_int("d", d), _positive_int("sram_bytes", sram_bytes), _dtype_bytes(dtype_bytes)
    rows = (sram_bytes // b) // (4 * d)
    if rows < 1:
        raise ValueError(f"{sram_bytes} bytes of SRAM cannot hold even one row of width d={d}")
    block_n = _pow2_floor(rows)
    return min(block_n, _pow2_floor(d)), block_n


def traffic_ratio(n: int, d: int, block_m: int = 128, block_n: int = 128, dtype_bytes=2) -> float:
    """How many times more HBM bytes standard attention moves than the tiled kernel."""
    return (standard_attention_traffic(n, d, dtype_bytes)["total"]
            / flash_attention_traffic(n, d, block_m, block_n, dtype_bytes)["total"])


# --------------------------------------------------------------------------- counting simulator

class TrafficCounter:
    """Counts bytes moved between a pretend HBM (NumPy arrays) and a pretend SRAM (tile copies)."""

    def __init__(self):
        self.reads: dict[str, int] = {}
        self.writes: dict[str, int] = {}

    def load(self, name: str, hbm: np.ndarray, rows=slice(None)) -> np.ndarray:
        """Copy ``hbm[rows]`` "on chip" and count its bytes (at the array's own dtype)."""
        tile = np.array(hbm[rows])          # a copy: on-chip work must not write through to HBM
        self.reads[name] = self.reads.get(name, 0) + tile.nbytes
        return tile

    def store(self, name: str, hbm: np.ndarray, rows, tile: np.ndarray) -> None:
        """Write ``tile`` into ``hbm[rows]`` (cast to the HBM array's dtype) and count the bytes written."""
        hbm[rows] = tile
        self.writes[name] = self.writes.get(name, 0) + hbm[rows].nbytes

    @property
    def components(self) -> dict[str, int]:
        """Same keys as the traffic model: ``read_q``, ``write_s``, ..."""
        return {**{f"read_{k}": v for k, v in self.reads.items()},
                **{f"write_{k}": v for k, v in self.writes.items()}}

    @property
    def total(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())


def _check_2d(q, k, v) -> tuple[int, int, int]:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if getattr(x, "ndim", None) != 2 or min(x.shape) < 1:
            raise ValueError(f"{name} must be a non-empty 2-D (N, d) array, got shape {getattr(x, 'shape', None)}")
    if k.shape != v.shape or q.shape[1] != k.shape[1]:
        raise ValueError(f"shapes q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    return q.shape[0], k.shape[0], q.shape[1]


def _on_chip_dtype(*arrays) -> np.dtype:
    # Kernels accumulate low-precision inputs in fp32; fp64 stays fp64 so tests can be exact.
    return np.result_type(np.float32, *[a.dtype for a in arrays])


def simulate_standard_attention(q, k, v) -> tuple[np.ndarray, TrafficCounter]:
    """Textbook attention with S and P materialized in HBM (at q's dtype), every transfer counted."""
    nq, nk, d = _check_2d(q, k, v)
    c, ct = TrafficCounter(), _on_chip_dtype(q, k, v)
    scale = 1.0 / math.sqrt(d)
    s_hbm = np.empty((nq, nk), q.dtype)
    p_hbm = np.empty((nq, nk), q.dtype)
    o_hbm = np.empty((nq, d), q.dtype)
    # Kernel 1: S = Q K^T * scale
    s = c.load("q", q).astype(ct) @ c.load("k", k).astype(ct).T * scale
    c.store("s", s_hbm, slice(None), s)
    # Kernel 2: P = softmax(S), row by row
    s = c.load("s", s_hbm).astype(ct)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    c.store("p", p_hbm, slice(None), p / p.sum(axis=1, keepdims=True))
    # Kernel 3: O = P V
    o = c.load("p", p_hbm).astype(ct) @ c.load("v", v).astype(ct)
    c.store("o", o_hbm, slice(None), o)
    return o_hbm, c


def simulate_tiled_attention(q, k, v, block_m: int, block_n: int) -> tuple[np.ndarray, TrafficCounter]:
    """FlashAttention-2 loop order with online softmax; only Q, K, V tiles in and O tiles out cross HBM.

    For each query tile we keep a running row max ``m``, running denominator
    ``l`` and unnormalized output ``acc`` on chip. A new K/V tile may raise the
    max; rescaling the old ``l`` and ``acc`` by exp(m_old - m_new) keeps them
    consistent, so no score ever needs to be written out.
    """
    # BEGIN SOLUTION
    nq, nk, d = _check_2d(q, k, v)
    block_m, block_n = _positive_int("block_m", block_m), _positive_int("block_n", block_n)
    c, ct = TrafficCounter(), _on_chip_dtype(q, k, v)
    scale = 1.0 / math.sqrt(d)
    o_hbm = np.empty((nq, d), q.dtype)
    for i0 in range(0, nq, block_m):
        rows = slice(i0, min(i0 + block_m, nq))
        qi = c.load("q", q, rows).astype(ct)
        m = np.full(qi.shape[0], -np.inf, ct)
        l = np.zeros(qi.shape[0], ct)
        acc = np.zeros((qi.shape[0], d), ct)
        for j0 in range(0, nk, block_n):
            cols = slice(j0, min(j0 + block_n, nk))
            kj, vj = c.load("k", k, cols).astype(ct), c.load("v", v, cols).astype(ct)
            s = qi @ kj.T * scale
            m_new = np.maximum(m, s.max(axis=1))
            p = np.exp(s - m_new[:, None])
            correction = np.exp(m - m_new)       # exp(-inf) = 0 on the first tile
            l = correction * l + p.sum(axis=1)
            acc = correction[:, None] * acc + p @ vj
            m = m_new
        c.store("o", o_hbm, rows, acc / l[:, None])
    return o_hbm, c
    # END SOLUTION


# --------------------------------------------------------------------------- roofline

def matmul_intensity(m: int, n: int, k: int, dtype_bytes=2) -> float:
    """FLOP per byte of C (m x n) = A (m x k) B (k x n): 2mnk FLOPs over reading A, B and writing C once."""
    m, n, k, b = (_positive_int("m", m), _positive_int("n", n), _positive_int("k", k), _dtype_bytes(dtype_bytes))
    return 2 * m * n * k / ((m * k + k * n + m * n) * b)


def decode_matmul_intensity(batch: int, d_in: int, d_out: int, dtype_bytes=2) -> float:
    """A weight matmul during decoding: ``batch`` single-token rows times a (d_in, d_out) weight.

    The weight dominates the bytes and is used once per row, so at batch 1 this is
    about 1 FLOP/byte in 16-bit: decoding is bound by bandwidth, not compute.
    """
    return matmul_intensity(batch, d_out, d_in, dtype_bytes)


def prefill_matmul_intensity(tokens: int, d_in: int, d_out: int, dtype_bytes=2) -> float:
    """The same weight matmul during prefill: ``tokens`` prompt rows share each weight load."""
    return matmul_intensity(tokens, d_out, d_in, dtype_bytes)


def attention_intensity(n: int, d: int, dtype_bytes=2, fused: bool = True,
                        block_m: int = 128, block_n: int = 128) -> float:
    """FLOP per byte of one head of attention: 4 n^2 d FLOPs (QK^T and PV) over the traffic model's bytes."""
    flops = 4 * _positive_int("n", n) ** 2 * _positive_int("d", d)
    if fused:
        return flops / flash_attention_traffic(n, d, block_m, block_n, dtype_bytes)["total"]
    return flops / standard_attention_traffic(n, d, dtype_bytes)["total"]


def fused_attention_intensities(n: int, d: int, block_m: int = 128, block_n: int = 128, dtype_bytes=2) -> dict:
    """Arithmetic intensity of one fused attention head against HBM bytes and against L2 bytes.

    A tiled kernel loads every K/V tile once per query tile (``flash_attention_traffic``). On a real
    GPU those loads go to L2; the query tiles of one head run at the same time, so after the first
    miss the re-reads hit L2 and HBM sees about one pass over Q, K, V and O
    (``compulsory_attention_traffic``). So:

    * ``"hbm"``: 4 n^2 d FLOPs over the compulsory 4 n d bytes (what HBM serves),
    * ``"l2"``: the same FLOPs over the tiled schedule's bytes (what L2 serves, re-reads included).

    Also returns both byte counts and the query-tile count.
    """
    flops = 4 * _positive_int("n", n) ** 2 * _positive_int("d", d)
    tiled = flash_attention_traffic(n, d, block_m, block_n, dtype_bytes)
    hbm = compulsory_attention_traffic(n, d, dtype_bytes)
    return {"hbm": flops / hbm, "l2": flops / tiled["total"], "flops": flops,
            "hbm_bytes": hbm, "l2_bytes": tiled["total"], "q_tiles": tiled["q_tiles"]}


def decode_attention_traffic(n: int, d: int, group: int = 1, dtype_bytes=2, fused: bool = True) -> dict:
    """HBM bytes and FLOPs of one decode step of attention for one KV head.

    Decoding has one new query row per query head. Under grouped-query attention ``group`` query heads
    (H_q / H_kv) share the KV head, so they read the same n cached keys and values of width d.
    FLOPs: ``4 * group * n * d`` (q K^T and P V for each query row). Bytes: K and V read once
    (``2 n d``), the group's queries read and outputs written (``2 group d``); without fusion the
    scores S and probabilities P (``group x n`` each) are also written and read back. Either way K and V
    dominate, so the intensity is about ``2 * group / dtype_bytes`` FLOP/byte: ``group`` in 16-bit,
    however long the context.
    """
    n, d, g, b = (_positive_int("n", n), _positive_int("d", d), _positive_int("group", group),
                  _dtype_bytes(dtype_bytes))
    components = {"read_q": g * d * b, "read_k": n * d * b, "read_v": n * d * b, "write_o": g * d * b}
    if not fused:
        components.update(write_s=g * n * b, read_s=g * n * b, write_p=g * n * b, read_p=g * n * b)
    flops = 4 * g * n * d
    total = sum(components.values())
    return {"components": components, "total": total, "flops": flops, "intensity": flops / total}


def decode_attention_intensity(n: int, d: int, group: int = 1, dtype_bytes=2, fused: bool = True) -> float:
    """FLOP per HBM byte of one decode step of attention (``decode_attention_traffic``): about ``group``
    in 16-bit, far below any GPU's ridge, so decode attention is memory bound, fused or not."""
    return decode_attention_traffic(n, d, group, dtype_bytes, fused)["intensity"]


def roofline(gpu, intensity, dtype: str = "bf16"):
    """Attainable FLOP/s at ``intensity`` FLOP/byte: min(compute peak, bandwidth x intensity).

    ``gpu`` is a GPUSpec or a name in GPUS; ``intensity`` a positive number or array.
    """
    spec = _gpu(gpu)
    x = np.asarray(intensity, dtype=float)
    if x.size == 0 or not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"intensity must be positive and finite, got {intensity!r}")
    out = np.minimum(spec.peak_flops(dtype), spec.hbm_bw * x)
    return float(out) if out.ndim == 0 else out


def plot_roofline(ax, gpu, points=(), dtype: str = "bf16", fontsize: float = 9):
    """Draw ``gpu``'s roofline on a log-log ``ax`` and mark measured ``points``.

    ``ax`` is any matplotlib Axes; ``points`` is a sequence of (label,
    intensity FLOP/byte, achieved FLOP/s). Each point gets its own color and
    marker and is named in a two-column legend under the axes, so no label
    overlaps a point or another label, and none runs off the plot (call
    ``fig.tight_layout()`` afterwards to make room for it). Returns ``ax``.
    """
    # ax comes from the caller's matplotlib, so this module itself never imports it.
    spec = _gpu(gpu)
    ridge = spec.ridge(dtype)
    peak = spec.peak_flops(dtype)
    xs = [p[1] for p in points]
    lo = min([ridge / 300, *xs]) / 2
    hi = max([ridge * 30, *xs]) * 2
    grid = np.geomspace(lo, hi, 400)
    ax.plot(grid, roofline(spec, grid, dtype), color="black", lw=2,
            label=f"{spec.name} roof: {spec.hbm_bw / TB:.2f} TB/s, {peak / 1e12:.0f} {dtype} TFLOP/s")
    ax.axvline(ridge, color="gray", ls="--", lw=1, label=f"ridge: {ridge:.0f} FLOP/B")
    markers = "osD^vP*Xh<>"
    for i, (label, x, y) in enumerate(points):
        ax.scatter([x], [y], s=40, zorder=3, marker=markers[i % len(markers)], color=f"C{i % 10}", label=label)
    ys = [p[2] for p in points]
    ax.set_xlim(lo, hi)
    ax.set_ylim(min([peak / 3e3, *ys]) / 2, peak * 3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)", fontsize=fontsize + 1)
    ax.set_ylabel("FLOP/s", fontsize=fontsize + 1)
    ax.tick_params(labelsize=fontsize)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=fontsize, frameon=False)
    return ax
