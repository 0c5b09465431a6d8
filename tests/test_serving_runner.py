"""The runners' step-cost model: which weights one step reads and multiplies by."""
import numpy as np

from minillm.model import LLAMA_1B, Model, ModelConfig, StepOps, init_params
from minillm.serving import StepCost


def test_step_cost_for_model_reads_the_lm_head_and_not_the_embedding_table():
    """minillm's LM head is its own matrix, so a step reads it (d x V) but only a few rows of the input
    embedding table: the weights read are every parameter but that table. For the Llama-3.2-1B shape this
    is 1,235,814,400 parameters -- the published count of that model, whose head is its (tied) embedding."""
    cost = StepCost.for_model(LLAMA_1B)
    read = LLAMA_1B.n_params() - LLAMA_1B.vocab_size * LLAMA_1B.d_model
    assert read == 1_235_814_400 == StepCost.params_read_per_step(LLAMA_1B)
    assert cost.weight_bytes == 2 * read and cost.flops_per_token == 2 * read
    assert StepCost.for_model(LLAMA_1B, bytes_per_param=1).weight_bytes == read


def test_step_cost_flops_per_token_equal_the_models_own_matmul_count():
    """One decode token through the NumPy model: its counted weight-matmul FLOPs (QKV, output, MLP and LM
    head; the embedding lookup is no matmul) equal the cost model's FLOPs per token, up to the RMSNorm
    weights, which are scales, not matmuls."""
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, max_seq_len=32)
    model = Model(cfg, init_params(cfg, seed=0))
    cache = model.new_cache(batch=1, capacity=8)
    model.forward(np.array([[1, 2, 3]]), cache=cache)
    ops = StepOps()
    model.forward(np.array([[4]]), cache=cache, ops=ops)
    norms = (2 * cfg.n_layers + 1) * cfg.d_model
    assert ops.proj_flops == StepCost.for_model(cfg).flops_per_token - 2 * norms


def test_step_cost_seconds_for_charges_causal_attention_pairs():
    """A chunk of n new tokens over a context of ctx positions (new ones included) scores n * ctx - n (n - 1) / 2
    (new token, position) pairs, as causal attention does: a decode its whole context, a whole prompt of L tokens
    L (L + 1) / 2, not L^2. Compute-bound settings (no memory time, no matmul FLOPs) expose the attention term."""
    cost = StepCost(weight_bytes=0.0, kv_bytes_per_token=0.0, flops_per_token=0.0, attn_flops_per_context_token=1.0,
                    flops=1.0)
    assert cost.seconds_for([1], [10]) == 10              # a decode sees all 10 positions
    assert cost.seconds_for([4], [10]) == 7 + 8 + 9 + 10  # a 4-token chunk after 6 cached tokens
    assert cost.seconds_for([8], [8]) == 8 * 9 / 2         # a whole 8-token prompt
    assert cost.seconds_for([1, 4], [10, 10]) == 10 + 34   # sequences add up
