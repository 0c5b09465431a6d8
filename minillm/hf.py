"""Convert between minillm checkpoints and Hugging Face ``transformers.LlamaForCausalLM``, both ways.

minillm's model *is* a Llama: RMSNorm, grouped-query attention with RoPE in the
"rotate half" form, a SwiGLU MLP, no biases, and an LM head that is not tied to
the embedding. So conversion is only renaming and transposing (minillm -> HF)::

    tok_emb                  model.embed_tokens.weight
    layers.i.attn_norm       model.layers.i.input_layernorm.weight
    layers.i.wq wk wv wo     model.layers.i.self_attn.{q,k,v,o}_proj.weight    (transposed)
    layers.i.mlp_norm        model.layers.i.post_attention_layernorm.weight
    layers.i.w_gate up down  model.layers.i.mlp.{gate,up,down}_proj.weight     (transposed)
    norm                     model.norm.weight
    lm_head                  lm_head.weight                                    (transposed)

minillm stores a weight (in_features, out_features) and computes ``x @ W``;
``torch.nn.Linear`` stores (out_features, in_features) and computes ``x @ W.T``.
No permutation of the q/k rows is needed: HF Llama applies RoPE in the same
rotate-half form (pairs ``(x[i], x[i + D/2])``), which ``tests/test_hf.py``
checks numerically against the NumPy forward.

:func:`hf_state_dict` and :func:`params_from_hf_state_dict` are pure NumPy.
:func:`to_hf_config`, :func:`to_hf` and :func:`from_hf` import torch and
transformers inside the function, so ``import minillm`` still needs only NumPy.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .model import Model, ModelConfig
from .tokenizer import BOS, EOS, PAD, VOCAB_SIZE

# minillm suffix -> (HF suffix, transposed?)
_LAYER_MAP = {
    "attn_norm": ("input_layernorm.weight", False),
    "wq": ("self_attn.q_proj.weight", True),
    "wk": ("self_attn.k_proj.weight", True),
    "wv": ("self_attn.v_proj.weight", True),
    "wo": ("self_attn.o_proj.weight", True),
    "mlp_norm": ("post_attention_layernorm.weight", False),
    "w_gate": ("mlp.gate_proj.weight", True),
    "w_up": ("mlp.up_proj.weight", True),
    "w_down": ("mlp.down_proj.weight", True),
}
_TOP_MAP = {
    "tok_emb": ("model.embed_tokens.weight", False),
    "norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
# Buffers some transformers versions put in the state dict; derived from the config, never weights.
_DERIVED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.original_inv_freq")

# The ModelConfig fields this converter knows how to express in a LlamaConfig.
_KNOWN_FIELDS = {"vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_seq_len",
                 "rope_theta", "norm_eps"}


def name_map(config: ModelConfig) -> dict[str, tuple[str, bool]]:
    """minillm parameter name -> (HF state-dict key, whether the array is transposed)."""
    out: dict[str, tuple[str, bool]] = {}
    for name in config.param_shapes():
        if name.startswith("layers."):
            _, i, suffix = name.split(".", 2)
            if suffix not in _LAYER_MAP:
                raise ValueError(f"HF LlamaForCausalLM has no weight for minillm parameter {name!r}")
            hf, t = _LAYER_MAP[suffix]
            out[name] = (f"model.layers.{i}.{hf}", t)
        elif name in _TOP_MAP:
            out[name] = _TOP_MAP[name]
        else:
            raise ValueError(f"HF LlamaForCausalLM has no weight for minillm parameter {name!r}")
    return out


# --------------------------------------------------------------------------- configs


def _check_expressible(config: ModelConfig) -> None:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"expected a minillm ModelConfig, got {type(config).__name__}")
    # A field added to ModelConfig later (qk-norm, sliding window, tied embeddings, ...) is fine at its
    # default, where the model is still a plain Llama; any other value has no LlamaConfig equivalent here.
    for f in dataclasses.fields(config):
        if f.name in _KNOWN_FIELDS:
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if getattr(config, f.name) != default:
            raise ValueError(f"HF LlamaForCausalLM cannot express ModelConfig.{f.name}="
                             f"{getattr(config, f.name)!r}; only the default ({default!r}) converts")
    if not (math.isfinite(config.rope_theta) and config.rope_theta > 0):
        raise ValueError(f"HF Llama needs a finite rope_theta > 0, got {config.rope_theta}")
    if not (math.isfinite(config.norm_eps) and config.norm_eps >= 0):
        raise ValueError(f"HF Llama needs a finite rms_norm_eps >= 0, got {config.norm_eps}")


def hf_config_kwargs(config: ModelConfig) -> dict:
    """The ``transformers.LlamaConfig`` keyword arguments for ``config`` (pure Python, no transformers)."""
    _check_expressible(config)
    byte_vocab = config.vocab_size == VOCAB_SIZE  # the ByteTokenizer's specials are real ids here
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.d_head,
        hidden_act="silu",
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=float(config.norm_eps),
        rope_theta=float(config.rope_theta),  # transformers >= 5 moves it into rope_parameters itself
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        pretraining_tp=1,
        bos_token_id=BOS if byte_vocab else None,
        eos_token_id=EOS if byte_vocab else None,
        pad_token_id=PAD if byte_vocab else None,
    )


def to_hf_config(config: ModelConfig):
    """A ``transformers.LlamaConfig`` describing the same architecture as ``config``."""
    from transformers import LlamaConfig

    return LlamaConfig(**hf_config_kwargs(config))


def _rope_of(hf_config) -> tuple[float, str]:
    """(rope_theta, rope_type) across transformers versions (4.x: rope_theta/rope_scaling; 5.x: rope_parameters)."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"]), str(params.get("rope_type", params.get("type", "default")))
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    return float(hf_config.rope_theta), str(scaling.get("rope_type", scaling.get("type", "default")))


def from_hf_config(hf_config) -> ModelConfig:
    """The ModelConfig for a ``LlamaConfig``; raises ValueError for what minillm's model cannot run."""
    problems = []
    model_type = getattr(hf_config, "model_type", None)
    if model_type != "llama":
        problems.append(f"model_type={model_type!r} (only 'llama' converts)")
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        problems.append(f"hidden_act={act!r} (minillm's MLP is SwiGLU: silu)")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(hf_config, flag, False):
            problems.append(f"{flag}=True (minillm has no biases)")
    n_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
    if head_dim * n_heads != hf_config.hidden_size:
        problems.append(f"head_dim={head_dim} with {n_heads} heads != hidden_size={hf_config.hidden_size} "
                        "(minillm's head dim is d_model // n_heads)")
    theta, rope_type = _rope_of(hf_config)
    if rope_type != "default":
        problems.append(f"rope_type={rope_type!r} (minillm implements plain RoPE only)")
    if problems:
        raise ValueError("this HF config cannot be expressed as a minillm ModelConfig: " + "; ".join(problems))
    return ModelConfig(
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(hf_config, "num_key_value_heads", None) or n_heads,
        d_ff=hf_config.intermediate_size,
        max_seq_len=hf_config.max_position_embeddings,
        rope_theta=theta,
        norm_eps=float(hf_config.rms_norm_eps),
    )


# --------------------------------------------------------------------------- state dicts (pure NumPy)


def _check_keys(what: str, got, expected) -> None:
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise ValueError(f"{what} does not match the config: {len(missing)} missing {missing[:5]}, "
                         f"{len(extra)} extra {extra[:5]}")


def hf_state_dict(config: ModelConfig, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """minillm params -> HF Llama state dict (NumPy arrays, dtype kept, linear weights transposed)."""
    _check_expressible(config)
    shapes = config.param_shapes()
    _check_keys("params", params.keys(), shapes.keys())
    out = {}
    for name, (key, transpose) in name_map(config).items():
        a = np.asarray(params[name])
        if a.shape != shapes[name]:
            raise ValueError(f"{name} has shape {a.shape}, config expects {shapes[name]}")
        out[key] = np.ascontiguousarray(a.T) if transpose else a.copy()
    return out


def params_from_hf_state_dict(config: ModelConfig, sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """HF Llama state dict (NumPy arrays) -> minillm params (float32, (in, out) layout).

    Rotary ``inv_freq`` buffers, which some transformers versions save, are ignored; any other missing
    or extra key is an error.
    """
    shapes = config.param_shapes()
    nmap = name_map(config)
    weights = {k: v for k, v in sd.items() if not k.endswith(_DERIVED_SUFFIXES)}
    _check_keys("HF state dict", weights.keys(), [key for key, _ in nmap.values()])
    out = {}
    for name, (key, transpose) in nmap.items():
        a = np.asarray(weights[key])
        want = shapes[name][::-1] if transpose else shapes[name]
        if a.shape != want:
            raise ValueError(f"{key} has shape {a.shape}, expected {want} for {name} {shapes[name]}")
        out[name] = np.ascontiguousarray(a.T if transpose else a, dtype=np.float32)
    return out


# --------------------------------------------------------------------------- models (torch + transformers)


def _config_and_params(model_or_config_and_params):
    m = model_or_config_and_params
    if isinstance(m, Model):
        return m.config, m.params
    if isinstance(m, tuple) and len(m) == 2:
        return m
    if hasattr(m, "config") and hasattr(m, "numpy_params"):  # minillm.torch_model.TorchModel
        return m.config, m.numpy_params()
    raise TypeError("to_hf takes a minillm Model, a TorchModel or a (ModelConfig, params) tuple, "
                    f"got {type(m).__name__}")


def to_hf(model_or_config_and_params, dtype=None, device="cpu", attn_implementation=None):
    """Build a ``transformers.LlamaForCausalLM`` holding the same weights, in eval mode.

    ``dtype`` is a torch dtype (default float32). ``attn_implementation`` ("eager", "sdpa", ...) is
    passed to transformers; None keeps its default.
    """
    import torch
    from transformers import LlamaForCausalLM

    config, params = _config_and_params(model_or_config_and_params)
    dtype = torch.float32 if dtype is None else dtype
    hf_cfg = to_hf_config(config)
    if attn_implementation is not None:
        hf_cfg._attn_implementation = attn_implementation
    sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32))
          for k, v in hf_state_dict(config, params).items()}
    hf = LlamaForCausalLM(hf_cfg)             # float32; its random init is overwritten next
    hf.load_state_dict(sd, strict=True)       # strict: every weight filled, nothing left over
    # Cast the weights only: the RoPE inv_freq buffer stays float32, as from_pretrained leaves it.
    for p in hf.parameters():
        p.data = p.data.to(device=device, dtype=dtype)
    return hf.to(device).eval()


def from_hf(hf_model) -> Model:
    """A minillm ``Model`` (float32 NumPy params) from a ``LlamaForCausalLM``."""
    import torch

    config = from_hf_config(hf_model.config)
    sd = {k: v.detach().to("cpu", torch.float32).numpy() for k, v in hf_model.state_dict().items()}
    if getattr(hf_model.config, "tie_word_embeddings", False):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]  # the untied head starts as a copy
    params = params_from_hf_state_dict(config, sd)
    meta = {"converted_from": type(hf_model).__name__}
    return Model(config, params, meta=meta)
