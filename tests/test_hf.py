"""minillm <-> Hugging Face LlamaForCausalLM conversion (minillm.hf).

The NumPy half (names, transposes, config mapping, error checks) runs everywhere. The half that
builds a real ``LlamaForCausalLM`` skips unless transformers (and torch) are installed.
"""
import dataclasses
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest

from minillm.hf import (from_hf_config, hf_config_kwargs, hf_state_dict, name_map,
                        params_from_hf_state_dict)
from minillm.model import ModelConfig, init_params

from .conftest import SMALL

# fp32 logits of HF vs the NumPy reference on the tiny model. Measured max |diff| ~1.5e-5 on logits of
# magnitude ~15 (CPU, transformers 5.24, eager and sdpa alike): summation-order noise only.
LOGIT_ATOL = 1e-4
N_GREEDY = 64


# --------------------------------------------------------------------------- pure NumPy


def test_state_dict_round_trip_is_exact():
    params = init_params(SMALL, seed=7)
    sd = hf_state_dict(SMALL, params)
    assert len(sd) == len(params) == 3 + 9 * SMALL.n_layers
    back = params_from_hf_state_dict(SMALL, sd)
    assert back.keys() == params.keys()
    for k in params:
        assert back[k].dtype == np.float32
        np.testing.assert_array_equal(back[k], params[k])


def test_state_dict_names_and_layouts():
    params = init_params(SMALL, seed=1)
    sd = hf_state_dict(SMALL, params)
    d, hd = SMALL.d_model, SMALL.d_head
    assert sd["model.embed_tokens.weight"].shape == (SMALL.vocab_size, d)
    assert sd["lm_head.weight"].shape == (SMALL.vocab_size, d)           # nn.Linear: (out, in)
    assert sd["model.layers.1.self_attn.q_proj.weight"].shape == (SMALL.n_heads * hd, d)
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (SMALL.n_kv_heads * hd, d)
    assert sd["model.layers.0.mlp.down_proj.weight"].shape == (d, SMALL.d_ff)
    assert sd["model.layers.0.post_attention_layernorm.weight"].shape == (d,)
    np.testing.assert_array_equal(sd["model.layers.1.mlp.gate_proj.weight"], params["layers.1.w_gate"].T)
    np.testing.assert_array_equal(sd["model.norm.weight"], params["norm"])
    # x @ W (minillm) == x @ W_hf.T (nn.Linear)
    x = np.random.default_rng(0).normal(size=(3, d)).astype(np.float32)
    np.testing.assert_allclose(x @ params["layers.0.wq"], x @ sd["model.layers.0.self_attn.q_proj.weight"].T,
                               rtol=1e-5, atol=1e-6)
    # the state dict owns its arrays: editing it does not touch the model
    sd["model.norm.weight"][0] = 123.0
    assert params["norm"][0] == 1.0
    assert {hf for hf, _ in name_map(SMALL).values()} == sd.keys()


def test_state_dict_ignores_rotary_buffers():
    sd = hf_state_dict(SMALL, init_params(SMALL))
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.zeros(SMALL.d_head // 2, np.float32)
    sd["model.rotary_emb.inv_freq"] = np.zeros(SMALL.d_head // 2, np.float32)
    params_from_hf_state_dict(SMALL, sd)


def test_state_dict_bad_inputs_raise():
    params = init_params(SMALL)
    sd = hf_state_dict(SMALL, params)

    missing = dict(sd)
    del missing["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"1 missing \['model.layers.1.mlp.up_proj.weight'\]"):
        params_from_hf_state_dict(SMALL, missing)

    extra = dict(sd, **{"model.layers.2.self_attn.q_proj.weight": sd["model.layers.0.self_attn.q_proj.weight"]})
    with pytest.raises(ValueError, match=r"1 extra \['model.layers.2.self_attn.q_proj.weight'\]"):
        params_from_hf_state_dict(SMALL, extra)

    biased = dict(sd, **{"model.layers.0.self_attn.q_proj.bias": np.zeros(SMALL.d_model, np.float32)})
    with pytest.raises(ValueError, match="extra"):
        params_from_hf_state_dict(SMALL, biased)

    untransposed = dict(sd, **{"model.layers.0.mlp.down_proj.weight": params["layers.0.w_down"]})
    with pytest.raises(ValueError, match="down_proj.weight has shape"):
        params_from_hf_state_dict(SMALL, untransposed)

    with pytest.raises(ValueError, match="missing"):
        hf_state_dict(SMALL, {k: v for k, v in params.items() if k != "lm_head"})
    with pytest.raises(ValueError, match="wk has shape"):
        hf_state_dict(SMALL, dict(params, **{"layers.0.wk": params["layers.0.wq"]}))
    with pytest.raises(ValueError, match="missing"):   # params for a different config
        hf_state_dict(dataclasses.replace(SMALL, n_layers=3), params)


def test_config_kwargs():
    tiny = ModelConfig()
    kw = hf_config_kwargs(tiny)
    assert kw["vocab_size"] == 259 and kw["hidden_size"] == 256 and kw["intermediate_size"] == 640
    assert kw["num_hidden_layers"] == 6 and kw["num_attention_heads"] == 8 and kw["num_key_value_heads"] == 2
    assert kw["head_dim"] == 32 and kw["hidden_act"] == "silu" and kw["max_position_embeddings"] == 512
    assert kw["rope_theta"] == 10000.0 and kw["rms_norm_eps"] == 1e-5
    assert not kw["attention_bias"] and not kw["mlp_bias"] and not kw["tie_word_embeddings"]
    assert (kw["bos_token_id"], kw["eos_token_id"], kw["pad_token_id"]) == (256, 257, 258)
    # a vocabulary that is not the ByteTokenizer's gets no special ids rather than wrong ones
    assert hf_config_kwargs(dataclasses.replace(tiny, vocab_size=300))["eos_token_id"] is None
    # and back
    ns = SimpleNamespace(model_type="llama", **kw)
    assert from_hf_config(ns) == tiny


def test_configs_hf_cannot_express_raise():
    with pytest.raises(TypeError, match="ModelConfig"):
        hf_config_kwargs({"d_model": 64})
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="rope_theta"):
            hf_config_kwargs(dataclasses.replace(SMALL, rope_theta=bad))
    with pytest.raises(ValueError, match="rms_norm_eps"):
        hf_config_kwargs(dataclasses.replace(SMALL, norm_eps=-1e-5))

    # A ModelConfig that grows a feature plain Llama lacks converts only while that feature is off.
    @dataclasses.dataclass(frozen=True)
    class Windowed(ModelConfig):
        sliding_window: int | None = None

    hf_config_kwargs(Windowed(d_model=64, n_heads=4))
    with pytest.raises(ValueError, match="sliding_window=128"):
        hf_config_kwargs(Windowed(d_model=64, n_heads=4, sliding_window=128))
    with pytest.raises(ValueError, match="sliding_window"):
        hf_state_dict(Windowed(sliding_window=128), init_params(ModelConfig()))


def test_hf_configs_minillm_cannot_express_raise():
    good = dict(hf_config_kwargs(SMALL), model_type="llama")
    assert from_hf_config(SimpleNamespace(**good)) == SMALL
    cases = {
        "model_type": ("mistral", "model_type"),
        "hidden_act": ("gelu", "hidden_act"),
        "attention_bias": (True, "attention_bias"),
        "mlp_bias": (True, "mlp_bias"),
        "head_dim": (32, "head_dim=32"),
        "rope_scaling": ({"rope_type": "llama3", "factor": 8.0}, "rope_type='llama3'"),
    }
    for field, (value, msg) in cases.items():
        with pytest.raises(ValueError, match=msg):
            from_hf_config(SimpleNamespace(**dict(good, **{field: value})))
    # transformers >= 5 keeps theta and the rope type in rope_parameters
    v5 = dict(good, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    assert from_hf_config(SimpleNamespace(**v5)).rope_theta == 500.0
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        from_hf_config(SimpleNamespace(**dict(good, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4})))


def test_importing_hf_module_needs_only_numpy():
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        sys.modules["transformers"] = None
        import minillm.hf as hf
        from minillm.model import ModelConfig, init_params
        c = ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=48)
        p = init_params(c)
        assert hf.params_from_hf_state_dict(c, hf.hf_state_dict(c, p)).keys() == p.keys()
        assert not any(k.startswith(("torch", "transformers")) and sys.modules[k] is not None for k in sys.modules)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


# --------------------------------------------------------------------------- against transformers


@pytest.fixture(scope="module")
def hf_tiny(tiny_model):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from minillm.hf import to_hf

    return to_hf(tiny_model)


PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_numpy_reference(tiny_model, attn):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from minillm import ByteTokenizer
    from minillm.hf import to_hf

    hf = to_hf(tiny_model, attn_implementation=attn)
    ids = ByteTokenizer().encode(PROMPT, bos=True)
    ref = tiny_model.forward(np.array(ids))
    with torch.no_grad():
        out = hf(torch.tensor([ids])).logits[0].float().numpy()
    assert out.shape == ref.shape
    diff = np.abs(out - ref).max()
    assert diff < LOGIT_ATOL, f"max |logit diff| {diff:.3g} (scale {np.abs(ref).max():.3g})"
    np.testing.assert_array_equal(out.argmax(-1), ref.argmax(-1))


def test_greedy_tokens_match_cached_decode(tiny_model, hf_tiny):
    import torch

    from minillm import ByteTokenizer, cached_decode

    ids = ByteTokenizer().encode(PROMPT, bos=True)
    ours = cached_decode(tiny_model, ids, N_GREEDY).new_tokens
    with torch.no_grad():
        out = hf_tiny.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                               attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    theirs = out[0, len(ids):].tolist()
    eos = hf_tiny.config.eos_token_id
    if eos in ours:   # HF stops at EOS; cached_decode does not
        ours = ours[:ours.index(eos) + 1]
    assert theirs == ours
    assert len(theirs) == N_GREEDY or theirs[-1] == eos


def test_from_hf_inverts_to_hf_exactly(tiny_model, hf_tiny):
    from minillm.hf import from_hf

    back = from_hf(hf_tiny)
    assert back.config == tiny_model.config
    assert back.params.keys() == tiny_model.params.keys()
    for k, v in tiny_model.params.items():
        assert back.params[k].dtype == np.float32
        np.testing.assert_array_equal(back.params[k], v)


def test_to_hf_accepts_config_and_params_and_dtype(small_model):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from minillm.hf import from_hf, to_hf, to_hf_config

    cfg = to_hf_config(SMALL)
    assert from_hf_config(cfg) == SMALL
    hf = to_hf((SMALL, small_model.params), dtype=torch.bfloat16)
    assert hf.model.embed_tokens.weight.dtype == torch.bfloat16
    assert not hf.training
    back = from_hf(hf)   # bf16 -> float32: equal to the bf16-rounded weights
    for k, v in small_model.params.items():
        assert back.params[k].dtype == np.float32
        np.testing.assert_array_equal(back.params[k], torch.from_numpy(v).bfloat16().float().numpy())
    with pytest.raises(TypeError, match="to_hf takes"):
        to_hf(small_model.params)


def test_from_hf_rejects_unsupported_llama(small_model):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minillm.hf import from_hf, hf_config_kwargs

    cfg = transformers.LlamaConfig(**dict(hf_config_kwargs(SMALL), attention_bias=True))
    with pytest.raises(ValueError, match="attention_bias"):
        from_hf(transformers.LlamaForCausalLM(cfg))


def test_from_hf_tied_embeddings(small_model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from minillm.hf import from_hf, hf_config_kwargs

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**dict(hf_config_kwargs(SMALL),
                                                                       tie_word_embeddings=True))).eval()
    m = from_hf(hf)
    np.testing.assert_array_equal(m.params["lm_head"], m.params["tok_emb"].T)
    ids = np.arange(10)
    with torch.no_grad():
        out = hf(torch.from_numpy(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(m.forward(ids), out, atol=LOGIT_ATOL, rtol=0)
