"""Assignment 4, public tests: the traffic formula and the counting simulator agree."""
import numpy as np

from minillm.hardware import flash_attention_traffic, simulate_tiled_attention
from oracles import standard_attention


def test_flash_attention_traffic_formula():
    t = flash_attention_traffic(1024, 64, 128, 64, dtype_bytes=2)
    vec = 1024 * 64 * 2
    assert t["q_tiles"] == 8
    assert t["components"] == {"read_q": vec, "read_k": 8 * vec, "read_v": 8 * vec, "write_o": vec}
    assert t["total"] == 18 * vec


def test_simulated_tiled_attention_output_and_bytes(rng):
    n, d = 32, 8
    q, k, v = (rng.normal(size=(n, d)) for _ in range(3))
    o, counter = simulate_tiled_attention(q, k, v, block_m=8, block_n=16)
    ref = standard_attention(q[None, None], k[None, None], v[None, None])[0, 0]
    np.testing.assert_allclose(o, ref, rtol=1e-10, atol=1e-12)
    assert counter.components == flash_attention_traffic(n, d, 8, 16, dtype_bytes=8)["components"]
