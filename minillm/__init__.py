"""minillm: LLM inference from first principles.

``import minillm`` needs only NumPy. The PyTorch model (``minillm.torch_model``),
the training script (``minillm.train``) and the Triton kernels import torch and
triton themselves, only when you import them.
"""
from .attention import standard_attention
from .decode import DecodeResult, cached_decode, decode_step, naive_decode, prefill
from .kvcache import CacheFull, ConcatKVCache, KVCache
from .model import Model, ModelConfig, StepOps, load_model
from .sampling import TemperatureSampler, greedy
from .speculative import ModelDrafter, NgramDrafter, SpecParams, speculative_decode
from .tokenizer import ByteTokenizer

__version__ = "0.1.0"

__all__ = [
    "ByteTokenizer", "CacheFull", "ConcatKVCache", "DecodeResult", "KVCache", "Model", "ModelConfig",
    "ModelDrafter", "NgramDrafter", "SpecParams", "StepOps", "TemperatureSampler", "cached_decode", "decode_step",
    "greedy", "load_model", "naive_decode", "prefill", "speculative_decode", "standard_attention",
]
