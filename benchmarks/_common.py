"""What every suite records and how it times, in one place so the results files agree: the ``meta`` block,
the timers, the attention providers the suites compare, and the results files (one per suite per GPU).

Imports without a GPU (torch and triton are imported where a function needs them).
"""
from __future__ import annotations

import datetime
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

# The keys every record's meta carries (a record made by hand may say "commands": one per step).
REQUIRED_META = ("gpu", "torch", "triton", "date")


def command() -> str:
    """The command line as the harness was called (``python -m benchmarks SUITE ...``)."""
    return " ".join(["python -m benchmarks", *sys.argv[1:]])


def run_meta(**extra) -> dict:
    """The ``meta`` block of a record: GPU, versions, date, the command line, and extras."""
    import torch
    try:
        import triton
    except ImportError:  # the hardware suite's device part runs without it
        triton = None

    info = {"torch": torch.__version__, "triton": getattr(triton, "__version__", None), "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "command": command()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return {**info, **extra}


def median_ms(fn, **kwargs) -> float:
    """Median milliseconds per call (do_bench's default is the mean, which one slow outlier moves)."""
    import triton.testing

    return triton.testing.do_bench(fn, return_mode="median", **kwargs)


def median_ms_cudagraph(fn) -> float:
    """Median milliseconds per call, replayed from a CUDA graph (no host launch cost in the time)."""
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, return_mode="median")


def write_results(path, meta: dict, rows: list) -> None:
    """Write ``{"meta": meta, "rows": rows}`` to ``path`` (nothing when ``path`` is empty). The suites call it
    after every row, so a run cut short keeps what it measured."""
    if path:
        Path(path).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


def keep_earlier(path, result: dict, keys: tuple[str, ...]) -> dict:
    """``--append``: ``result`` with the lists at ``keys`` of the record already at ``path`` put first, and its
    command kept before this one's (one record, several processes: one per model, say)."""
    if path and Path(path).exists() and Path(path).stat().st_size:
        earlier = json.loads(Path(path).read_text())
        for key in keys:
            result[key] = earlier.get(key, []) + result.get(key, [])
        result["meta"]["command"] = f"{earlier['meta']['command']} && {result['meta']['command']}"
    return result


def warm_up_gpu(seconds: float) -> None:
    """Busy the GPU with bf16 matmuls for ``seconds``: the first call timed in a fresh process ran 1.7x slower
    than the same call after a warm-up (flash_h200.json, records flash_attention_cold_start and
    flash_attention_n1k_recheck_kernels3)."""
    import time

    import torch

    if seconds <= 0:
        return
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()


# ---- providers: the attention implementations the suites time against minillm's ----

SDPA_BACKENDS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")  # FA2, cuDNN, memory-efficient


def sdpa_provider(name: str, q, k, v, causal: bool = False, gqa: bool = False):
    """A call of PyTorch's SDPA pinned to one backend (``sdpa_flash`` / ``sdpa_cudnn`` / ``sdpa_efficient``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[name]

    def run():
        with sdpa_kernel(backend):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)
    return run


def flex_provider(q, k, v, causal: bool):
    """torch.compile'd flex_attention (one compile per shape; never a fallback to eager)."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    for knob in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    torch._functorch.config.donated_buffer = False  # its backward is called more than once per graph
    compiled = torch.compile(flex_attention)
    mask = None
    if causal:
        n = q.shape[2]
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=q.device)
    return lambda: compiled(q, k, v, block_mask=mask)


# ---- results files: benchmarks/results/<suite>_<gpu>.json = {"suite", "gpu", "records": {name: record}} ----

def gpu_tag(gpu: str) -> str:
    """The short name of a GPU in a results file's name: "NVIDIA H200" -> "h200", "NVIDIA H100 80GB HBM3" -> "h100"."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", gpu)
    if not m:
        raise ValueError(f"no model name in GPU name {gpu!r}")
    return m.group(1).lower()


def save_record(suite: str, name: str, record: dict, folder: Path = RESULTS) -> Path:
    """Put ``record`` (``{"meta": ..., data}``) into its suite's file for the GPU its meta names, replacing a record
    of the same name (the one before it stays in git history); the other records are kept."""
    missing = [k for k in REQUIRED_META if k not in record.get("meta", {})]
    if missing:
        raise ValueError(f"record {name!r} has no {missing} in its meta")
    path = Path(folder) / f"{suite}_{gpu_tag(record['meta']['gpu'])}.json"
    doc = json.loads(path.read_text()) if path.exists() else {"suite": suite, "gpu": record["meta"]["gpu"],
                                                                 "records": {}}
    doc["records"][name] = record
    doc["records"] = dict(sorted(doc["records"].items()))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
