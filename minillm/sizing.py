"""KV-cache and weight sizing for real models, from their published configs.

Two formulas cover every model here:

* grouped-query attention (MHA and MQA are the cases Hkv = H and Hkv = 1)
  caches one K and one V vector of ``d_head`` numbers per KV head, per token,
  per layer: ``2 * B * T * L * Hkv * D * bytes``;
* multi-head latent attention (DeepSeek V2/V3, Kimi K2) caches one compressed
  latent of ``kv_lora_rank`` numbers plus one shared RoPE key of
  ``qk_rope_dim`` numbers per token per layer, for all heads together:
  ``B * T * L * (r + d_rope) * bytes``.

``MODELS`` holds the published geometry of a few well-known models;
``PAGE_INPUTS`` and ``page_table`` reproduce a source page's own table so that
the chapter can show where it follows from its formula and where it does not.
``capacity`` puts the pieces together: how many sequences of a given length
fit on one or more GPUs once the weights and a workspace reserve are paid for.
GPU memory comes from the book's one GPU registry, ``minillm.hardware.GPUS``
(``GPUSpec.memory_bytes``: what the device reports, in bytes).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple

from .hardware import GPUS

GIB = 1024**3  # what the page divides by, and what nvidia-smi reports in
GB = 10**9  # what parameter counts use; GPU vendors' "GB" is only a label (minillm.hardware.GPUS)

# Bytes per element. 4-bit formats pack two elements per byte, hence 0.5.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4,
    "fp16": 2, "float16": 2, "bf16": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
    "int4": 0.5, "fp4": 0.5,
}


def dtype_bytes(name_or_number) -> float:
    """Bytes per element for a dtype name (``"bf16"``) or a positive number (``2``)."""
    if isinstance(name_or_number, str):
        key = name_or_number.strip().lower()
        if key in DTYPE_BYTES:
            return DTYPE_BYTES[key]
    # bool is an int subclass; True as "1 byte" is almost certainly a mistake
    elif isinstance(name_or_number, numbers.Real) and not isinstance(name_or_number, bool):
        if math.isfinite(name_or_number) and name_or_number > 0:
            return name_or_number
    raise ValueError(f"unknown dtype {name_or_number!r}: use a positive number of bytes "
                     f"or one of {sorted(DTYPE_BYTES)}")


# The size functions take an argument called ``dtype_bytes`` (the name the
# formulas use), which shadows the helper inside them.
_bytes_per_element = dtype_bytes


def _positive_int(name: str, value) -> int:
    """``value`` as an int if it is a whole number >= 1; a ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    # whole floats are accepted so that a notebook can write n_tokens=32e3
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _bytes(n_elements: int, per_element: float) -> int:
    # Packed 4-bit storage still occupies whole bytes, so round a half byte up.
    return math.ceil(n_elements * per_element)


def gqa_kv_bytes(n_tokens, n_layers, n_kv_heads, d_head, dtype_bytes=2, batch=1) -> int:
    """KV-cache bytes for MHA/GQA/MQA: one K and one V per KV head, per token, per layer."""
    # BEGIN SOLUTION
    sizes = {name: _positive_int(name, v) for name, v in
             dict(n_tokens=n_tokens, n_layers=n_layers, n_kv_heads=n_kv_heads, d_head=d_head, batch=batch).items()}
    elements = 2 * math.prod(sizes.values())
    return _bytes(elements, _bytes_per_element(dtype_bytes))
    # END SOLUTION


def mla_kv_bytes(n_tokens, n_layers, kv_lora_rank, qk_rope_dim, dtype_bytes=2, batch=1) -> int:
    """KV-cache bytes for MLA: the compressed latent plus the decoupled RoPE key, shared by all heads."""
    # BEGIN SOLUTION
    n_tokens, n_layers, batch = (_positive_int(n, v) for n, v in
                                 (("n_tokens", n_tokens), ("n_layers", n_layers), ("batch", batch)))
    width = _positive_int("kv_lora_rank", kv_lora_rank) + _positive_int("qk_rope_dim", qk_rope_dim)
    return _bytes(batch * n_tokens * n_layers * width, _bytes_per_element(dtype_bytes))
    # END SOLUTION


ATTENTION_KINDS = ("MHA", "GQA", "MQA", "MLA")


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a published config that decide cache and weight sizes."""

    name: str
    family: str
    attention: str  # one of ATTENTION_KINDS
    n_params_b: float  # total parameters, in billions (all experts, for MoE models)
    n_layers: int
    n_heads: int
    n_kv_heads: int | None  # None for MLA, which has no per-head K/V in its cache
    d_head: int  # for MLA: the no-RoPE query/key and the value head dim
    kv_lora_rank: int | None
    qk_rope_dim: int | None
    max_context: int
    source: str
    note: str = ""
    sliding_window: int | None = None  # every layer attends to at most this many past tokens
    checkpoint_dtype: str = "bf16"  # the dtype of the published weights

    def cached_tokens(self, n_tokens) -> int:
        """Tokens a cache must hold for a sequence of ``n_tokens``: all of them, or at most the sliding window
        (a rolling cache drops what no layer can attend to any more)."""
        n_tokens = _positive_int("n_tokens", n_tokens)
        return n_tokens if self.sliding_window is None else min(n_tokens, self.sliding_window)

    def __post_init__(self):
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"{self.name}: attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")
        for field in ("n_layers", "n_heads", "d_head", "max_context"):
            _positive_int(f"{self.name}: {field}", getattr(self, field))
        if self.sliding_window is not None:
            _positive_int(f"{self.name}: sliding_window", self.sliding_window)
        if self.checkpoint_dtype not in DTYPE_BYTES:
            raise ValueError(f"{self.name}: checkpoint_dtype must be one of {sorted(DTYPE_BYTES)}, "
                             f"got {self.checkpoint_dtype!r}")
        params = self.n_params_b
        if isinstance(params, bool) or not isinstance(params, numbers.Real) or not params > 0:
            raise ValueError(f"{self.name}: n_params_b must be a positive number, got {self.n_params_b!r}")
        if self.attention == "MLA":
            if self.kv_lora_rank is None or self.qk_rope_dim is None or self.n_kv_heads is not None:
                raise ValueError(f"{self.name}: MLA needs kv_lora_rank and qk_rope_dim, and n_kv_heads=None")
            _positive_int(f"{self.name}: kv_lora_rank", self.kv_lora_rank)
            _positive_int(f"{self.name}: qk_rope_dim", self.qk_rope_dim)
            return
        if self.n_kv_heads is None or self.kv_lora_rank is not None or self.qk_rope_dim is not None:
            raise ValueError(f"{self.name}: {self.attention} needs n_kv_heads, and no kv_lora_rank/qk_rope_dim")
        _positive_int(f"{self.name}: n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        # The label is derived from the head counts, so a mislabelled entry is a typo somewhere.
        expected = "MHA" if self.n_kv_heads == self.n_heads else "MQA" if self.n_kv_heads == 1 else "GQA"
        if self.attention != expected:
            raise ValueError(f"{self.name}: {self.n_heads} heads sharing {self.n_kv_heads} KV heads is {expected}, "
                             f"not {self.attention}")

    def kv_bytes(self, n_tokens, dtype_bytes=2, batch=1) -> int:
        """Cache bytes for ``batch`` sequences of ``n_tokens`` tokens each."""
        if self.attention == "MLA":
            return mla_kv_bytes(n_tokens, self.n_layers, self.kv_lora_rank, self.qk_rope_dim, dtype_bytes, batch)
        return gqa_kv_bytes(n_tokens, self.n_layers, self.n_kv_heads, self.d_head, dtype_bytes, batch)

    def kv_bytes_per_token(self, dtype_bytes=2) -> int:
        return self.kv_bytes(1, dtype_bytes)

    def mha_kv_bytes_per_token(self, dtype_bytes=2) -> int:
        """Bytes per token if every query head cached its own K and V (multi-head attention).

        For GQA/MQA models: ``2 * L * H * d_head``. For MLA models each head's key is its no-RoPE
        part plus the RoPE part (``d_head + qk_rope_dim``) while its value has ``d_head`` numbers
        only (V carries no rotary part): ``L * H * (2 * d_head + qk_rope_dim)``.
        """
        if self.attention == "MLA":
            elements = self.n_layers * self.n_heads * (2 * self.d_head + self.qk_rope_dim)
            return _bytes(elements, _bytes_per_element(dtype_bytes))
        return gqa_kv_bytes(1, self.n_layers, self.n_heads, self.d_head, dtype_bytes)

    def weight_bytes(self, dtype_bytes) -> int:
        """Bytes to hold every parameter at ``dtype_bytes`` (ignores quantization scales)."""
        return round(self.n_params_b * GB * _bytes_per_element(dtype_bytes))


def _hf(repo: str) -> str:
    return f"{repo} config.json on Hugging Face"


def _gqa(name, family, n_params_b, n_layers, n_heads, n_kv_heads, d_head, max_context, source, note="", **extra):
    kind = "MHA" if n_kv_heads == n_heads else "MQA" if n_kv_heads == 1 else "GQA"
    return ModelSpec(name, family, kind, n_params_b, n_layers, n_heads, n_kv_heads, d_head, None, None,
                     max_context, source, note, **extra)


def _mla(name, family, n_params_b, n_layers, n_heads, d_head, kv_lora_rank, qk_rope_dim, max_context, source, note="",
         **extra):
    return ModelSpec(name, family, "MLA", n_params_b, n_layers, n_heads, None, d_head, kv_lora_rank, qk_rope_dim,
                     max_context, source, note, **extra)


_SPECS = [
    _gqa("Llama 2 7B", "Llama 2", 6.74, 32, 32, 32, 128, 4096, _hf("meta-llama/Llama-2-7b-hf"),
         "full multi-head attention: the same geometry as Llama 3.1 8B without the KV-head sharing"),
    _gqa("Llama 2 70B", "Llama 2", 69.0, 80, 64, 8, 128, 4096, _hf("meta-llama/Llama-2-70b-hf")),
    _gqa("Llama 3.1 8B", "Llama 3.1", 8.03, 32, 32, 8, 128, 131072, _hf("meta-llama/Llama-3.1-8B")),
    _gqa("Llama 3.1 70B", "Llama 3.1", 70.6, 80, 64, 8, 128, 131072, _hf("meta-llama/Llama-3.1-70B")),
    _gqa("Llama 3.1 405B", "Llama 3.1", 405.9, 126, 128, 8, 128, 131072, _hf("meta-llama/Llama-3.1-405B"),
         "8 KV heads in the published config (num_key_value_heads: 8)"),
    _gqa("Qwen 2.5 72B", "Qwen 2.5", 72.7, 80, 64, 8, 128, 131072, _hf("Qwen/Qwen2.5-72B-Instruct"),
         "the Instruct config.json has max_position_embeddings 32768; the model card gives 131072 with YaRN "
         "rope scaling, which is the context used here"),
    _gqa("Mistral 7B v0.1", "Mistral", 7.24, 32, 32, 8, 128, 32768, _hf("mistralai/Mistral-7B-v0.1"),
         "config max_position_embeddings 32768; attention uses a 4096-token sliding window (sliding_window: "
         "4096), so a rolling cache is capped at 4096 tokens", sliding_window=4096),
    _gqa("Mistral Large 2 123B", "Mistral", 123.0, 88, 96, 8, 128, 131072,
         _hf("mistralai/Mistral-Large-Instruct-2407")),
    _gqa("Falcon 7B", "Falcon", 6.92, 32, 71, 1, 64, 2048, _hf("tiiuae/falcon-7b"),
         "multi-query attention; marketed as 7B, 6.92B counted from the config (hidden 4544, vocab 65024, "
         "tied embeddings)"),
    _mla("DeepSeek V2 236B", "DeepSeek", 236.0, 60, 128, 128, 512, 64, 131072, _hf("deepseek-ai/DeepSeek-V2"),
         "MoE, 21B active; 128K context per the paper (config max_position_embeddings 163840, YaRN); "
         "qk_nope_head_dim = v_head_dim = 128"),
    _mla("DeepSeek V3 671B", "DeepSeek", 671.0, 61, 128, 128, 512, 64, 163840, _hf("deepseek-ai/DeepSeek-V3"),
         "MoE, 37B active; 671B main model (the Hugging Face checkpoint is 685B with the multi-token-prediction "
         "module); qk_nope_head_dim = v_head_dim = 128; weights published in FP8 (e4m3, 128x128 block scales)",
         checkpoint_dtype="fp8"),
    _mla("Kimi K2 1T", "Kimi", 1040.0, 61, 64, 128, 512, 64, 131072, _hf("moonshotai/Kimi-K2-Instruct"),
         "MoE, 32B active; '1T' in the name, 1.04T in the technical report; DeepSeek V3's MLA geometry "
         "with half the heads; weights published in FP8 (block-quantized, as DeepSeek V3)",
         checkpoint_dtype="fp8"),
]
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in _SPECS}

# The source page's inputs. They match the published configs except for
# Llama 3.1 405B, where the page uses 16 KV heads and the config has 8.
PAGE_INPUTS: dict[str, dict[str, int]] = {
    "Llama 3.1 8B": dict(n_layers=32, n_kv_heads=8, d_head=128),
    "Llama 3.1 70B": dict(n_layers=80, n_kv_heads=8, d_head=128),
    "Llama 3.1 405B": dict(n_layers=126, n_kv_heads=16, d_head=128),
    "Qwen 2.5 72B": dict(n_layers=80, n_kv_heads=8, d_head=128),
    "Mistral Large 2 123B": dict(n_layers=88, n_kv_heads=8, d_head=128),
    "DeepSeek V3 671B": dict(n_layers=61, kv_lora_rank=512, qk_rope_dim=64),
    "Kimi K2 1T": dict(n_layers=61, kv_lora_rank=512, qk_rope_dim=64),
}
# What the page prints for 32,000 tokens in fp16, in GiB.
PAGE_PRINTED_GIB: dict[str, float] = {
    "Llama 3.1 8B": 3.91, "Llama 3.1 70B": 9.77, "Llama 3.1 405B": 30.79, "Qwen 2.5 72B": 9.77,
    "Mistral Large 2 123B": 10.74, "DeepSeek V3 671B": 2.10, "Kimi K2 1T": 2.10,
}


class PageRow(NamedTuple):
    name: str
    computed_gib: float  # the page's formula applied to the page's own inputs
    printed_gib: float  # what the page shows
    published_gib: float  # the same formula applied to the published config

    @property
    def printed_matches_computed(self) -> bool:
        return round(self.computed_gib, 2) == self.printed_gib

    @property
    def inputs_match_published(self) -> bool:
        return math.isclose(self.computed_gib, self.published_gib)


def page_table(n_tokens=32_000) -> list[PageRow]:
    """One row per model on the page: recomputed, printed and published-config cache sizes (fp16, GiB)."""
    rows = []
    for name, inputs in PAGE_INPUTS.items():
        sizer = mla_kv_bytes if "kv_lora_rank" in inputs else gqa_kv_bytes
        computed = sizer(n_tokens, dtype_bytes=2, **inputs) / GIB
        published = MODELS[name].kv_bytes(n_tokens, dtype_bytes=2) / GIB
        rows.append(PageRow(name, computed, PAGE_PRINTED_GIB[name], published))
    return rows


def kv_bytes_per_gpu(model: ModelSpec, n_tokens, n_gpus, dtype_bytes=2, batch=1) -> int:
    """Cache bytes each of ``n_gpus`` tensor-parallel GPUs holds for ``batch`` sequences of ``n_tokens``.

    Tensor parallelism splits attention by head, so each GPU keeps the K and V of its own KV heads:
    ``ceil(n_kv_heads / n_gpus)`` of them. With fewer KV heads than GPUs (MQA on two GPUs, or 8 KV heads
    on 16) a head is copied onto several GPUs. MLA's latent is one "head" shared by all query heads, so
    every GPU holds all of it.
    """
    n_gpus = _positive_int("n_gpus", n_gpus)
    if model.attention == "MLA":
        return model.kv_bytes(n_tokens, dtype_bytes, batch)
    heads_here = -(-model.n_kv_heads // n_gpus)
    return gqa_kv_bytes(n_tokens, model.n_layers, heads_here, model.d_head, dtype_bytes, batch)


@dataclass(frozen=True)
class Capacity:
    """How memory on ``n_gpus`` GPUs splits into weights, reserve and KV cache."""

    model_name: str
    gpu_name: str
    n_gpus: int
    context_len: int
    weight_dtype: str
    cache_dtype: str
    tensor_parallel: bool  # cache split by KV head over the GPUs (False: the GPUs pool their memory)
    gpu_bytes: int  # all GPUs together
    weight_bytes: int
    reserve_bytes: int
    free_for_cache_bytes: int  # negative when the weights and reserve do not fit
    kv_bytes_per_sequence: int  # one sequence's cache
    kv_footprint_per_sequence: int  # what one sequence occupies on all GPUs together, copies included
    max_sequences: int
    fits_weights: bool  # weights fit beside the reserve
    within_max_context: bool  # context_len <= the model's published max_context

    @property
    def kv_copies(self) -> float:
        """How many times each cached number is stored: 1 when pooled or when the KV heads split evenly."""
        return self.kv_footprint_per_sequence / self.kv_bytes_per_sequence

    def summary(self) -> str:
        def gib(n):
            return f"{n / GIB:.1f} GiB"

        head = (f"{self.model_name} on {self.n_gpus}x {self.gpu_name} ({gib(self.gpu_bytes)}), "
                f"{self.context_len:,}-token sequences: weights {gib(self.weight_bytes)} ({self.weight_dtype}) "
                f"+ reserve {gib(self.reserve_bytes)}")
        if not self.fits_weights:
            tail = f"; weights do not fit (short by {gib(-self.free_for_cache_bytes)})"
        else:
            copies = (f", stored {self.kv_copies:g} times under tensor parallelism" if self.kv_copies > 1 else "")
            tail = (f" leave {gib(self.free_for_cache_bytes)} for the cache at {gib(self.kv_bytes_per_sequence)} "
                    f"per sequence ({self.cache_dtype}{copies}): {self.max_sequences} sequence(s)")
        if not self.within_max_context:
            tail += " [context longer than the model's published maximum]"
        return head + tail


def capacity(model, gpu, context_len, weight_dtype="bf16", cache_dtype="fp16", activation_reserve=0.10,
             n_gpus=1, tensor_parallel=False) -> Capacity:
    """Sequences of ``context_len`` tokens whose KV cache fits after weights and reserve.

    ``model``: a ModelSpec or a name in MODELS. ``gpu``: a name in ``minillm.hardware.GPUS`` (its
    ``memory_bytes``, what the device reports) or bytes per GPU.
    ``activation_reserve``: the fraction of GPU memory held back for activations and workspace.
    The weights are assumed spread evenly over ``n_gpus``. The cache:

    * ``tensor_parallel=False``: the GPUs act as one pool, every cached number stored once. That is what
      data-parallel attention achieves (each GPU holds whole sequences), and what tensor parallelism
      achieves when the KV heads divide evenly among the GPUs;
    * ``tensor_parallel=True``: every sequence is split by KV head over all GPUs (``kv_bytes_per_gpu``),
      so MQA on several GPUs and MLA store copies: an MLA latent is held by every GPU.

    ``max_sequences`` is computed whatever the context; ``within_max_context`` says whether the model
    can take sequences that long at all.
    """
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known models: {sorted(MODELS)}")
        model = MODELS[model]
    elif not isinstance(model, ModelSpec):
        raise ValueError(f"model must be a ModelSpec or a name in MODELS, got {model!r}")
    if isinstance(gpu, str):
        if gpu not in GPUS:
            raise ValueError(f"unknown gpu {gpu!r}; known GPUs: {sorted(GPUS)}")
        gpu_name, per_gpu = gpu, GPUS[gpu].memory_bytes
    else:
        per_gpu = _positive_int("gpu (bytes)", gpu)
        gpu_name = f"{per_gpu / GIB:.1f} GiB GPU"
    context_len = _positive_int("context_len", context_len)
    n_gpus = _positive_int("n_gpus", n_gpus)
    if isinstance(activation_reserve, bool) or not isinstance(activation_reserve, numbers.Real) \
            or not 0 <= activation_reserve < 1:
        raise ValueError(f"activation_reserve must be a fraction in [0, 1), got {activation_reserve!r}")
    if not isinstance(tensor_parallel, bool):
        raise ValueError(f"tensor_parallel must be True or False, got {tensor_parallel!r}")

    gpu_bytes = per_gpu * n_gpus
    weight_bytes = model.weight_bytes(weight_dtype)
    reserve_bytes = round(gpu_bytes * activation_reserve)
    free = gpu_bytes - reserve_bytes - weight_bytes
    per_sequence = model.kv_bytes(context_len, cache_dtype)
    footprint = (n_gpus * kv_bytes_per_gpu(model, context_len, n_gpus, cache_dtype) if tensor_parallel
                 else per_sequence)
    return Capacity(
        model_name=model.name, gpu_name=gpu_name, n_gpus=n_gpus, context_len=context_len,
        weight_dtype=str(weight_dtype), cache_dtype=str(cache_dtype), tensor_parallel=tensor_parallel,
        gpu_bytes=gpu_bytes, weight_bytes=weight_bytes, reserve_bytes=reserve_bytes,
        free_for_cache_bytes=free, kv_bytes_per_sequence=per_sequence, kv_footprint_per_sequence=footprint,
        max_sequences=max(0, free // footprint), fits_weights=free >= 0,
        within_max_context=context_len <= model.max_context,
    )
