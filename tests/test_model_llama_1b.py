"""minillm.model.LLAMA_1B: the 1B shape chapters 8 to 11 and the benchmarks share (Llama-3.2-1B's config.json)."""
from minillm.model import LLAMA_1B, ModelConfig


def test_llama_1b_is_the_published_shape():
    assert isinstance(LLAMA_1B, ModelConfig)
    assert (LLAMA_1B.vocab_size, LLAMA_1B.d_model, LLAMA_1B.n_layers, LLAMA_1B.n_heads, LLAMA_1B.n_kv_heads,
            LLAMA_1B.d_ff, LLAMA_1B.rope_theta) == (128256, 2048, 16, 32, 8, 8192, 500000.0)
    assert LLAMA_1B.d_head == 64
    # what a decode step reads besides the input embedding: the figure tests/test_serving_runner.py pins
    assert LLAMA_1B.n_params() - LLAMA_1B.vocab_size * LLAMA_1B.d_model == 1_235_814_400


def test_llama_1b_matches_the_server_shape():
    from minillm.serve import SHAPES

    assert ModelConfig(**SHAPES["llama1b"]) == LLAMA_1B
