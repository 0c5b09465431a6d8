"""minillm.kernels.fused: the decode step's elementwise kernels against the torch model's unfused ops (CPU: the
Triton interpreter in float32 and float16; a GPU: compiled, bf16 too), and the fused forward against the unfused
one, token for token through the engine."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("minillm.kernels")

from minillm.decode import cached_decode  # noqa: E402
from minillm.kernels.fused import rms_norm, rope_kv_write, silu_mul  # noqa: E402
from minillm.serving import LLMEngine, SamplingParams, SchedulerConfig  # noqa: E402
from minillm.serving.torch_runner import TorchRunner  # noqa: E402
from minillm.torch_model import TorchModel, rotate_half, torch_varlen_attention  # noqa: E402
from minillm.torch_model import rms_norm as torch_rms_norm  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# float32: the sums of squares are added in another order (a few ulps); 16-bit: one rounding step apart at most
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=1e-3, atol=1e-3),
       torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}


def _randn(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 96])
def test_rms_norm_matches_the_torch_model(dtype, D):
    x, w = _randn(5, D, dtype=dtype), _randn(D, dtype=dtype, seed=1)
    torch.testing.assert_close(rms_norm(x, w, 1e-5), torch_rms_norm(x, w, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_residual_adds_then_normalizes(dtype):
    x, r, w = _randn(3, 2, 64, dtype=dtype), _randn(3, 2, 64, dtype=dtype, seed=2), _randn(64, dtype=dtype, seed=1)
    h, s = rms_norm(x, w, 1e-6, residual=r)
    assert torch.equal(s, x + r)                    # the sum rounds as torch's add does
    torch.testing.assert_close(h, torch_rms_norm(x + r, w, 1e-6), **TOL[dtype])


def test_rms_norm_rows_do_not_depend_on_the_batch():
    x, w = _randn(9, 64, dtype=torch.float32), _randn(64, dtype=torch.float32, seed=1)
    alone = torch.cat([rms_norm(x[i:i + 1], w, 1e-5) for i in range(9)])
    assert torch.equal(alone, rms_norm(x, w, 1e-5))


def test_rms_norm_rejects_a_residual_of_another_shape():
    x, w = _randn(3, 64, dtype=torch.float32), _randn(64, dtype=torch.float32)
    with pytest.raises(ValueError, match="residual must match"):
        rms_norm(x, w, 1e-5, residual=x[:2])
    with pytest.raises(ValueError, match="w must be"):
        rms_norm(x, w[:32], 1e-5)


def _rope_case(dtype, T=5, H=4, Hkv=2, D=16, blocks=4, bs=4):
    qkv = _randn(T, (H + 2 * Hkv) * D, dtype=dtype)
    pos = torch.tensor([0, 3, 7, 8, 11][:T], device=DEVICE)
    ang = pos.double()[:, None] * (10000.0 ** (-torch.arange(0, D // 2, dtype=torch.float64, device=DEVICE) * 2 / D))
    cos, sin = ang.cos().float(), ang.sin().float()
    slots = torch.tensor([2, 5, 6, 9, 15][:T], device=DEVICE)
    kc = torch.zeros(blocks, bs, Hkv, D, device=DEVICE, dtype=dtype)
    return qkv, cos, sin, slots, kc, torch.zeros_like(kc), H, Hkv, D


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_kv_write_matches_rotate_half_and_the_cache_writes(dtype):
    qkv, cos, sin, slots, kc, vc, H, Hkv, D = _rope_case(dtype)
    T = qkv.shape[0]
    q_ref, k_ref, v_ref = qkv.split([H * D, Hkv * D, Hkv * D], dim=1)
    q_ref = rotate_half(q_ref.reshape(T, H, D), cos[:, None], sin[:, None])
    k_ref = rotate_half(k_ref.reshape(T, Hkv, D), cos[:, None], sin[:, None])
    kc_ref, vc_ref = kc.clone(), vc.clone()
    kc_ref.view(-1, Hkv, D).index_copy_(0, slots, k_ref)
    vc_ref.view(-1, Hkv, D).index_copy_(0, slots, v_ref.reshape(T, Hkv, D))
    q = rope_kv_write(qkv, cos, sin, slots, kc, vc, H, Hkv)
    torch.testing.assert_close(q, q_ref, **TOL[dtype])
    torch.testing.assert_close(kc, kc_ref, **TOL[dtype])
    assert torch.equal(vc, vc_ref)                  # v is copied, not computed
    assert torch.equal(kc.view(-1, Hkv, D)[[0, 1, 3, 4]], torch.zeros(4, Hkv, D, dtype=dtype, device=DEVICE))


def test_rope_kv_write_rejects_mismatched_tables_and_caches():
    qkv, cos, sin, slots, kc, vc, H, Hkv, D = _rope_case(torch.float32)
    with pytest.raises(ValueError, match="cos and sin"):
        rope_kv_write(qkv, cos[:, :4], sin, slots, kc, vc, H, Hkv)
    with pytest.raises(ValueError, match="qkv must be"):
        rope_kv_write(qkv, cos, sin, slots, kc, vc, H + 1, Hkv)
    with pytest.raises(ValueError, match="contiguous"):
        rope_kv_write(qkv, cos, sin, slots, kc.transpose(1, 2), vc.transpose(1, 2), H, Hkv)
    with pytest.raises(TypeError, match="slot_mapping"):
        rope_kv_write(qkv, cos, sin, slots.tolist(), kc, vc, H, Hkv)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_silu_times_up(dtype):
    gu = _randn(3, 2 * 200, dtype=dtype)
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gu), torch.nn.functional.silu(gate) * up, **TOL[dtype])
    with pytest.raises(ValueError, match="gate_up"):
        silu_mul(gu[:, :-1])


def test_forward_ragged_fused_ops_match_the_unfused_forward(small_model):
    m = TorchModel.from_numpy(small_model.config, small_model.params).to(DEVICE).eval()
    m.fuse_projections()
    cfg = m.config
    pool = torch.zeros(cfg.n_layers, 8, 4, cfg.n_kv_heads, cfg.d_head, device=DEVICE)
    t = lambda v, dt=torch.long: torch.tensor(v, dtype=dt, device=DEVICE)  # noqa: E731
    args = (t([5, 6, 7, 8, 9, 3, 4]), t([0, 1, 2, 3, 4, 0, 1]), t([0, 1, 2, 3, 4, 8, 9]),
            t([[0, 1], [2, 3]], torch.int32), t([5, 2], torch.int32), t([0, 5, 7], torch.int32))
    with torch.no_grad():
        pools = [(pool.clone(), pool.clone()) for _ in range(2)]
        plain = m.forward_ragged(*args, *pools[0], torch_varlen_attention, logits_rows=t([4, 6]))
        fused = m.forward_ragged(*args, *pools[1], torch_varlen_attention, logits_rows=t([4, 6]), fused_ops=True)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pools[1][0], pools[0][0], rtol=1e-5, atol=1e-5)   # the same K written
    with pytest.raises(ValueError, match="fuse_projections"):
        TorchModel.from_numpy(cfg, small_model.params).to(DEVICE).forward_ragged(*args, *pools[1], torch_varlen_attention,
                                                                     fused_ops=True)


def test_torch_runner_fused_ops_keep_greedy_tokens(small_model):
    """The engine over the fused forward (CPU: the interpreter) gives cached_decode's greedy tokens."""
    cfg = small_model.config
    runner = TorchRunner(small_model, 24, 8, device=DEVICE, dtype=torch.float32, fused_ops=True)
    assert runner.fused_ops
    eng = LLMEngine(runner, 24, 8, cfg.max_seq_len, cfg.vocab_size, SchedulerConfig(max_num_seqs=2,
                    max_num_batched_tokens=32), enable_prefix_caching=False)
    prompts = [[1, 2, 3, 4, 5], np.arange(10, 21).tolist()]
    outs = eng.generate(prompts, [SamplingParams(max_tokens=6, ignore_eos=True)] * 2, progress=False)
    assert [o.token_ids for o in outs] == [cached_decode(small_model, p, 6).new_tokens for p in prompts]


def test_torch_runner_fused_ops_default_only_on_a_gpu(small_model):
    assert TorchRunner(small_model, 8, 8, device="cpu", dtype=torch.float32).fused_ops is False
