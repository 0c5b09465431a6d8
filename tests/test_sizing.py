import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm import hardware
from minillm.book import load_result
from minillm.hardware import GPUS
from minillm.sizing import (
    DTYPE_BYTES,
    GB,
    GIB,
    MODELS,
    PAGE_INPUTS,
    PAGE_PRINTED_GIB,
    ModelSpec,
    capacity,
    dtype_bytes,
    gqa_kv_bytes,
    kv_bytes_per_gpu,
    mla_kv_bytes,
    page_table,
)

PAGE_TOKENS = 32_000
# The page's formula on the page's own inputs (fp16, GiB, two decimals).
COMPUTED_FROM_PAGE_INPUTS = {
    "Llama 3.1 8B": 3.91, "Llama 3.1 70B": 9.77, "Llama 3.1 405B": 30.76, "Qwen 2.5 72B": 9.77,
    "Mistral Large 2 123B": 10.74, "DeepSeek V3 671B": 2.09, "Kimi K2 1T": 2.09,
}


def _page_gib(name: str) -> float:
    inputs = PAGE_INPUTS[name]
    sizer = mla_kv_bytes if "kv_lora_rank" in inputs else gqa_kv_bytes
    return sizer(PAGE_TOKENS, dtype_bytes=2, **inputs) / GIB


@pytest.mark.parametrize("name", sorted(COMPUTED_FROM_PAGE_INPUTS))
def test_page_inputs_reproduce_computed_gib(name):
    assert round(_page_gib(name), 2) == COMPUTED_FROM_PAGE_INPUTS[name]


@pytest.mark.parametrize("name", ["Llama 3.1 405B", "DeepSeek V3 671B", "Kimi K2 1T"])
def test_page_printed_gib_differs_from_its_own_formula(name):
    # The page prints 30.79 and 2.10; its formula and inputs give 30.76 and 2.09.
    assert PAGE_PRINTED_GIB[name] != round(_page_gib(name), 2)


def test_page_table_flags_printed_and_input_discrepancies():
    rows = {row.name: row for row in page_table(PAGE_TOKENS)}
    assert set(rows) == set(PAGE_INPUTS)
    assert {n for n, r in rows.items() if not r.printed_matches_computed} == {
        "Llama 3.1 405B", "DeepSeek V3 671B", "Kimi K2 1T"}
    assert {n for n, r in rows.items() if not r.inputs_match_published} == {"Llama 3.1 405B"}
    assert round(rows["Llama 3.1 405B"].published_gib, 2) == 15.38


def test_gqa_kv_bytes_per_token_llama3():
    assert MODELS["Llama 3.1 8B"].kv_bytes_per_token(2) == 128 * 1024 == 131072
    assert MODELS["Llama 3.1 70B"].kv_bytes_per_token(2) == 320 * 1024 == 327680
    assert gqa_kv_bytes(1, 32, 8, 128) == 131072


def test_gqa_kv_bytes_scales_linearly_in_tokens_batch_and_dtype():
    one = gqa_kv_bytes(1, 80, 8, 128, dtype_bytes=2)
    assert gqa_kv_bytes(1000, 80, 8, 128, dtype_bytes=2, batch=3) == 3000 * one
    assert gqa_kv_bytes(1, 80, 8, 128, dtype_bytes="fp8") == one // 2
    assert gqa_kv_bytes(1, 80, 8, 128, dtype_bytes="int4") == one // 4


def test_mla_kv_bytes_counts_latent_plus_rope_key():
    # 61 layers x (512 + 64) numbers x 2 bytes; no factor 2 for K and V, and no head count
    assert mla_kv_bytes(1, 61, 512, 64) == 61 * 576 * 2
    assert MODELS["DeepSeek V3 671B"].kv_bytes_per_token() == 61 * 576 * 2


def test_model_kv_bytes_published_405b_is_half_the_page():
    published = MODELS["Llama 3.1 405B"].kv_bytes(PAGE_TOKENS, dtype_bytes=2)
    assert round(published / GIB, 2) == 15.38
    assert published * 2 == gqa_kv_bytes(PAGE_TOKENS, **PAGE_INPUTS["Llama 3.1 405B"])


def test_models_registry_gqa_kv_heads_divide_heads():
    gqa_like = [m for m in MODELS.values() if m.attention != "MLA"]
    assert gqa_like
    for m in gqa_like:
        assert m.n_heads % m.n_kv_heads == 0, m.name
        assert m.kv_lora_rank is None and m.qk_rope_dim is None, m.name


def test_models_registry_mla_entries_have_latent_dims():
    mla = [m for m in MODELS.values() if m.attention == "MLA"]
    assert {m.name for m in mla} >= {"DeepSeek V2 236B", "DeepSeek V3 671B", "Kimi K2 1T"}
    for m in mla:
        assert m.kv_lora_rank == 512 and m.qk_rope_dim == 64 and m.n_kv_heads is None, m.name


def test_models_registry_attention_labels():
    assert MODELS["Llama 2 7B"].attention == "MHA"
    assert MODELS["Llama 2 7B"].n_kv_heads == MODELS["Llama 2 7B"].n_heads
    assert MODELS["Falcon 7B"].attention == "MQA" and MODELS["Falcon 7B"].n_kv_heads == 1
    assert MODELS["Llama 3.1 405B"].n_kv_heads == 8
    assert all(m.source for m in MODELS.values())


def test_models_registry_page_names_present():
    assert set(PAGE_INPUTS) <= set(MODELS)


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if m.attention == "GQA"])
def test_gqa_kv_bytes_saving_vs_mha_is_head_ratio(name):
    m = MODELS[name]
    mha = gqa_kv_bytes(1, m.n_layers, m.n_heads, m.d_head)
    assert mha == m.kv_bytes_per_token() * (m.n_heads // m.n_kv_heads)


def test_gqa_kv_bytes_llama2_7b_vs_llama31_8b_same_geometry():
    mha, gqa = MODELS["Llama 2 7B"], MODELS["Llama 3.1 8B"]
    assert (mha.n_layers, mha.n_heads, mha.d_head) == (gqa.n_layers, gqa.n_heads, gqa.d_head)
    assert mha.kv_bytes_per_token() == 4 * gqa.kv_bytes_per_token()


@pytest.mark.parametrize("name", [n for n, m in MODELS.items() if m.attention != "MLA"])
def test_mha_kv_bytes_per_token_is_gqa_with_every_head(name):
    m = MODELS[name]
    assert m.mha_kv_bytes_per_token() == gqa_kv_bytes(1, m.n_layers, m.n_heads, m.d_head)
    assert m.mha_kv_bytes_per_token("fp8") * 2 == m.mha_kv_bytes_per_token("fp16")


def test_mha_kv_bytes_per_token_mla_gives_rope_part_to_keys_only():
    ds = MODELS["DeepSeek V3 671B"]
    # K per head: 128 no-RoPE + 64 RoPE; V per head: 128 (no RoPE part)
    assert ds.mha_kv_bytes_per_token() == 61 * 128 * (128 + 64 + 128) * 2 == 4_997_120
    assert round(ds.mha_kv_bytes_per_token() / ds.kv_bytes_per_token()) == 71


def test_model_weight_bytes_70b():
    m = MODELS["Llama 3.1 70B"]
    assert m.weight_bytes("bf16") == 141_200_000_000
    assert m.weight_bytes("fp8") == 70_600_000_000


def test_dtype_bytes_names_and_numbers():
    assert dtype_bytes("bf16") == dtype_bytes("FP16") == 2
    assert dtype_bytes("fp8_e4m3") == 1 and dtype_bytes("fp4") == 0.5 and dtype_bytes("float32") == 4
    assert dtype_bytes(1.5) == 1.5
    assert set(DTYPE_BYTES) >= {"fp32", "fp16", "bf16", "fp8", "int8", "int4"}


@pytest.mark.parametrize("bad", ["fp12", "", 0, -2, True, float("nan"), None])
def test_dtype_bytes_rejects_unknown(bad):
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_bytes(bad)


def test_gqa_kv_bytes_rejects_unknown_dtype_name():
    with pytest.raises(ValueError, match="unknown dtype 'fp6'.*bf16"):
        gqa_kv_bytes(10, 2, 2, 64, dtype_bytes="fp6")


@pytest.mark.parametrize("arg", ["n_tokens", "n_layers", "n_kv_heads", "d_head", "batch"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_gqa_kv_bytes_rejects_bad_sizes(arg, bad):
    kwargs = dict(n_tokens=10, n_layers=2, n_kv_heads=2, d_head=64, batch=1)
    kwargs[arg] = bad
    with pytest.raises(ValueError, match=f"{arg} must be a positive integer"):
        gqa_kv_bytes(**kwargs)


@pytest.mark.parametrize("arg", ["n_tokens", "n_layers", "kv_lora_rank", "qk_rope_dim", "batch"])
def test_mla_kv_bytes_rejects_zero_sizes(arg):
    kwargs = dict(n_tokens=10, n_layers=2, kv_lora_rank=512, qk_rope_dim=64, batch=1)
    kwargs[arg] = 0
    with pytest.raises(ValueError, match=f"{arg} must be a positive integer"):
        mla_kv_bytes(**kwargs)


def test_gqa_kv_bytes_accepts_whole_floats():
    assert gqa_kv_bytes(32e3, 32, 8, 128) == gqa_kv_bytes(32_000, 32, 8, 128)


def _spec(**overrides):
    fields = dict(name="toy", family="toy", attention="GQA", n_params_b=1.0, n_layers=2, n_heads=8,
                  n_kv_heads=2, d_head=64, kv_lora_rank=None, qk_rope_dim=None, max_context=1024,
                  source="made up for a test")
    fields.update(overrides)
    return ModelSpec(**fields)


def test_model_spec_rejects_kv_heads_not_dividing_heads():
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(8\)"):
        _spec(n_kv_heads=3)


@pytest.mark.parametrize("field", ["n_layers", "n_heads", "d_head", "max_context", "n_kv_heads"])
def test_model_spec_rejects_nonpositive_sizes(field):
    with pytest.raises(ValueError, match=f"{field} must be a positive integer"):
        _spec(**{field: 0})


def test_model_spec_rejects_bad_attention_and_params():
    with pytest.raises(ValueError, match="attention must be one of"):
        _spec(attention="SWA")
    with pytest.raises(ValueError, match="is MHA, not GQA"):
        _spec(n_kv_heads=8)
    with pytest.raises(ValueError, match="n_params_b must be a positive number"):
        _spec(n_params_b=0)
    with pytest.raises(ValueError, match="MLA needs kv_lora_rank and qk_rope_dim"):
        _spec(attention="MLA", n_kv_heads=None, kv_lora_rank=512)


def test_capacity_rejects_unknown_model_and_gpu():
    with pytest.raises(ValueError, match="unknown model 'Llama 9'.*Llama 3.1 70B"):
        capacity("Llama 9", "H100 SXM", 1000)
    with pytest.raises(ValueError, match="unknown gpu 'H900'.*H100 SXM"):
        capacity("Llama 3.1 8B", "H900", 1000)


@pytest.mark.parametrize("reserve", [-0.1, 1.0, 1.5])
def test_capacity_rejects_reserve_out_of_range(reserve):
    with pytest.raises(ValueError, match=r"activation_reserve must be a fraction in \[0, 1\)"):
        capacity("Llama 3.1 8B", "H100 SXM", 1000, activation_reserve=reserve)


def test_capacity_rejects_bad_context_and_gpu_count():
    with pytest.raises(ValueError, match="context_len must be a positive integer"):
        capacity("Llama 3.1 8B", "H100 SXM", 0)
    with pytest.raises(ValueError, match="n_gpus must be a positive integer"):
        capacity("Llama 3.1 8B", "H100 SXM", 1000, n_gpus=0)


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(sorted(MODELS)),
    gpu=st.sampled_from(sorted(GPUS)),
    n_gpus=st.integers(1, 16),
    context_len=st.integers(1, 200_000),
    weight_dtype=st.sampled_from(["bf16", "fp8", "int4"]),
    cache_dtype=st.sampled_from(["fp16", "fp8", "fp4"]),
    reserve=st.floats(0, 0.5),
    tensor_parallel=st.booleans(),
)
def test_capacity_max_sequences_is_floor_of_free_over_footprint(
        name, gpu, n_gpus, context_len, weight_dtype, cache_dtype, reserve, tensor_parallel):
    cap = capacity(name, gpu, context_len, weight_dtype, cache_dtype, reserve, n_gpus, tensor_parallel)
    assert cap.gpu_bytes == cap.weight_bytes + cap.reserve_bytes + cap.free_for_cache_bytes
    assert cap.kv_footprint_per_sequence >= cap.kv_bytes_per_sequence
    if not tensor_parallel:
        assert cap.kv_footprint_per_sequence == cap.kv_bytes_per_sequence
    if cap.fits_weights:
        per = cap.kv_footprint_per_sequence
        assert cap.max_sequences * per <= cap.free_for_cache_bytes < (cap.max_sequences + 1) * per
    else:
        assert cap.max_sequences == 0 and cap.free_for_cache_bytes < 0


@pytest.mark.parametrize("gpu,n_gpus", [("H200", 1), ("H100 SXM", 2), ("B200", 1), ("A100 80GB", 4)])
def test_capacity_halving_cache_dtype_at_least_doubles_sequences(gpu, n_gpus):
    fp16 = capacity("Llama 3.1 70B", gpu, 32_000, "fp8", "fp16", n_gpus=n_gpus)
    fp8 = capacity("Llama 3.1 70B", gpu, 32_000, "fp8", "fp8", n_gpus=n_gpus)
    assert fp8.kv_bytes_per_sequence * 2 == fp16.kv_bytes_per_sequence
    assert fp8.max_sequences >= 2 * fp16.max_sequences


def test_capacity_70b_bf16_weights_do_not_fit_one_h100():
    cap = capacity("Llama 3.1 70B", "H100 SXM", 32_000, weight_dtype="bf16")
    assert not cap.fits_weights and cap.max_sequences == 0
    assert "do not fit" in cap.summary()


def test_capacity_accepts_spec_and_gpu_bytes():
    by_name = capacity("Llama 3.1 8B", "H100 SXM", 8192)
    by_value = capacity(MODELS["Llama 3.1 8B"], float(GPUS["H100 SXM"].memory_bytes), 8192)
    assert by_value.max_sequences == by_name.max_sequences > 0
    assert "Llama 3.1 8B" in by_value.summary() and "79.2 GiB GPU" in by_value.summary()


def test_capacity_flags_context_beyond_model_maximum():
    assert not capacity("Llama 2 7B", "H100 SXM", 8192).within_max_context
    assert capacity("Llama 3.1 8B", "H100 SXM", 8192).within_max_context


def test_gpus_memory_is_what_the_device_reports_not_the_decimal_label():
    # An "80 GB" H100 reports 79.2 GiB to CUDA: more than 80e9 bytes, a little less than 80 GiB.
    mem = {name: g.memory_bytes for name, g in GPUS.items()}
    assert 80 * GB < mem["H100 SXM"] < 80 * GIB and round(mem["H100 SXM"] / GIB, 1) == 79.2
    assert 80 * GB < mem["A100 80GB"] < 80 * GIB
    assert 141 * GB < mem["H200"] < 141 * GIB
    assert all(g.memory_source for g in GPUS.values())


def test_gpus_h200_is_the_recorded_device_memory():
    assert GPUS["H200"].memory_bytes == load_result("hardware_h200.json", "hardware")["meta"]["total_memory_bytes"]


def test_capacity_reads_the_one_gpu_registry():
    # Chapters 2-4 once read two registries that disagreed (hardware: 80e9 bytes for an H100, sizing: 85.0e9).
    import minillm.sizing as sizing

    assert not hasattr(sizing, "GPU_MEMORY_SOURCES") and sizing.GPUS is hardware.GPUS
    for name, g in hardware.GPUS.items():
        assert capacity("Llama 3.1 8B", name, 1000).gpu_bytes == g.memory_bytes


def test_sliding_window_caps_the_cached_tokens_and_checkpoint_dtype_is_recorded():
    mistral = MODELS["Mistral 7B v0.1"]
    assert mistral.sliding_window == 4096
    assert mistral.cached_tokens(32_000) == 4096 and mistral.cached_tokens(1000) == 1000
    assert MODELS["Llama 3.1 70B"].cached_tokens(32_000) == 32_000
    assert {n for n, m in MODELS.items() if m.checkpoint_dtype == "fp8"} == {"DeepSeek V3 671B", "Kimi K2 1T"}
    with pytest.raises(ValueError, match="sliding_window"):
        _spec(sliding_window=0)
    with pytest.raises(ValueError, match="checkpoint_dtype"):
        _spec(checkpoint_dtype="fp7")


def test_kv_bytes_per_gpu_splits_kv_heads_and_copies_the_rest():
    l70, falcon, ds = MODELS["Llama 3.1 70B"], MODELS["Falcon 7B"], MODELS["DeepSeek V2 236B"]
    full = l70.kv_bytes(1000)
    assert kv_bytes_per_gpu(l70, 1000, 1) == full
    assert kv_bytes_per_gpu(l70, 1000, 8) * 8 == full      # one KV head per GPU
    assert kv_bytes_per_gpu(l70, 1000, 16) * 8 == full     # still one head per GPU: each head on two GPUs
    assert kv_bytes_per_gpu(falcon, 1000, 2) == falcon.kv_bytes(1000)  # MQA: the single head on both
    assert kv_bytes_per_gpu(ds, 1000, 8) == ds.kv_bytes(1000)          # MLA: the whole latent on every GPU


@pytest.mark.parametrize("n_gpus", [1, 2, 4, 8])
def test_capacity_tensor_parallel_equals_pooled_when_kv_heads_divide(n_gpus):
    pooled = capacity("Llama 3.1 70B", "H200", 32_000, n_gpus=n_gpus)
    tp = capacity("Llama 3.1 70B", "H200", 32_000, n_gpus=n_gpus, tensor_parallel=True)
    assert tp.kv_copies == 1 and tp.max_sequences == pooled.max_sequences


def test_capacity_tensor_parallel_copies_mla_latent_on_every_gpu():
    pooled = capacity("DeepSeek V2 236B", "H200", 32_000, n_gpus=8)
    tp = capacity("DeepSeek V2 236B", "H200", 32_000, n_gpus=8, tensor_parallel=True)
    assert tp.kv_copies == 8 and tp.kv_footprint_per_sequence == 8 * pooled.kv_bytes_per_sequence
    assert tp.max_sequences == pooled.max_sequences // 8 < pooled.max_sequences
    assert "stored 8 times under tensor parallelism" in tp.summary()


def test_capacity_rejects_non_bool_tensor_parallel():
    with pytest.raises(ValueError, match="tensor_parallel must be True or False"):
        capacity("Llama 3.1 8B", "H100 SXM", 1000, tensor_parallel="yes")
