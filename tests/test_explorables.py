"""minillm.explorables: the offline widgets' data, their plain-text fallback, and their JavaScript run in
Node against the Python references (minillm.softmax, minillm.paged, minillm.sizing)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from minillm import explorables
from minillm.paged.cache import PagedKVCache
from minillm.hardware import GPUS
from minillm.sizing import MODELS, capacity
from minillm.softmax import online_max_and_normalizer

SCRIPT = [["add", "A"], ["append", "A", 6], ["add", "B"], ["append", "B", 3], ["fork", "A", "C"],
          ["append", "C", 1], ["release", "B"], ["append", "A", 3]]


def test_online_softmax_steps_end_at_the_reference_max_and_sum():
    x = np.random.default_rng(1).normal(size=37) * 4
    steps = explorables.online_softmax_steps(x, 5)
    m, l = online_max_and_normalizer(x, 5)
    assert len(steps) == 8
    assert steps[-1]["m"] == pytest.approx(float(m)) and steps[-1]["l"] == pytest.approx(float(l), rel=1e-6)
    assert steps[0]["rescale"] == 0.0 and all(0 < s["rescale"] <= 1 for s in steps[1:])


@pytest.mark.parametrize("scores, tile", [([], 4), ([[1.0, 2.0]], 1), ([1.0, np.inf], 1), ([1.0], 0), ([1.0], 1.5)])
def test_online_softmax_steps_bad_input_raises(scores, tile):
    with pytest.raises(ValueError):
        explorables.online_softmax_steps(scores, tile)


def test_replay_paged_script_forks_then_copies_on_write():
    states = explorables.replay_paged_script(12, 4, SCRIPT)
    assert states[4]["C"] == states[4]["A"] == [0, 1]  # fork shares both blocks
    assert states[5]["C"][0] == 0 and states[5]["C"][1] != 1  # C's write copied the shared partial block
    assert states[-1] == {"A": [0, 1, 4], "C": [0, 3]}


@pytest.mark.parametrize("op", [["grow", "A"], ["append", "A"], "add A", []])
def test_replay_paged_script_bad_operation_raises(op):
    with pytest.raises(ValueError, match="bad operation"):
        explorables.replay_paged_script(4, 2, [["add", "A"], op])


def test_sizing_explorable_unknown_model_raises():
    with pytest.raises(ValueError, match="unknown model"):
        explorables.sizing_explorable("GPT-5")


def test_explorables_without_anywidget_print_instead(monkeypatch, capsys):
    monkeypatch.setattr(explorables._base, "_anywidget", lambda: None)
    assert explorables.online_softmax_explorable([1.0, 3.0, 2.0], 2) is None
    assert explorables.paged_allocator_explorable(12, 4, SCRIPT) is None
    assert explorables.sizing_explorable("Llama 3.1 8B", context=8_000, gpu="H100 SXM", n_gpus=1) is None
    out = capsys.readouterr().out
    assert out.count("anywidget is not installed") == 3
    assert "tile 1: m 3.00 -> 3.00" in out and "A: [0, 1, 4]  C: [0, 3]" in out
    assert capacity("Llama 3.1 8B", "H100 SXM", 8_000).summary() in out


def test_import_minillm_explorables_needs_no_anywidget():
    code = ("import sys; sys.modules['anywidget'] = None\n"
            "import minillm, minillm.explorables as e\n"
            "assert e.online_softmax_explorable([0.5, 1.0], 1) is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_explorables_save_the_arrays_their_javascript_reads():
    pytest.importorskip("anywidget")
    w = explorables.online_softmax_explorable(np.array([0.5, -1.0, 2.0]), 2)
    assert w.scores == [0.5, -1.0, 2.0] and w.tile == 2 and "export default" in w._esm
    w = explorables.paged_allocator_explorable(12, 4, SCRIPT)
    assert w.script == SCRIPT and w.expected == {"A": [0, 1, 4], "C": [0, 3]}
    w = explorables.sizing_explorable()
    assert [m["name"] for m in w.models] == list(MODELS)
    assert w.gpus == {name: g.memory_bytes for name, g in GPUS.items()}
    assert repr(w) == "<SizingExplorable: an offline explorable>"  # what nbval compares: no model id


# -- the JavaScript itself, in Node, against the Python references ---------------------------------------
NODE_DRIVER = """
const [softmax, pool, sizing] = await Promise.all(process.argv.slice(2).map((p) => import(p)));
const input = JSON.parse(await new Promise((ok) => { let s = ""; process.stdin.on("data", (d) => (s += d)); process.stdin.on("end", () => ok(s)); }));
const p = pool.makePool(input.num_blocks, input.block_size);
const tables = input.script.map((op) => { p.apply(op); return Object.fromEntries(Object.entries(p.seqs).map(([k, s]) => [k, [...s.table]])); });
const sizes = input.models.map((m) => ({ perToken: sizing.kvBytes(m, 1, 2, 1), mha: sizing.mhaBytesPerToken(m, 2),
  cap: sizing.capacity(m, input.gpu_bytes, 2, 32000, 2, 1, 0.1) }));
console.log(JSON.stringify({ steps: softmax.steps(input.scores, input.tile).map((s) => [s.m, s.l]), tables, free: p.free, sizes }));
"""


@pytest.fixture(scope="module")
def node_results(tmp_path_factory):
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (make book installs it for npm)")
    folder = tmp_path_factory.mktemp("esm")
    paths = []
    for name, src in (("softmax", explorables._SOFTMAX_JS), ("pool", explorables._ALLOCATOR_JS),
                      ("sizing", explorables._SIZING_JS)):
        (folder / f"{name}.mjs").write_text(src)
        paths.append((folder / f"{name}.mjs").as_uri())
    (folder / "driver.mjs").write_text(NODE_DRIVER)
    x = np.random.default_rng(2).normal(size=23) * 5
    models = [{f: getattr(m, f) for f in explorables._MODEL_FIELDS} for m in MODELS.values()]
    inp = {"scores": x.tolist(), "tile": 4, "num_blocks": 12, "block_size": 4, "script": SCRIPT,
           "models": models, "gpu_bytes": GPUS["H100 SXM"].memory_bytes}
    res = subprocess.run([node, str(folder / "driver.mjs"), *paths], input=json.dumps(inp), capture_output=True,
                         text=True, check=True, timeout=60)
    return inp, json.loads(res.stdout)


def test_online_softmax_javascript_matches_python(node_results):
    inp, res = node_results
    want = explorables.online_softmax_steps(inp["scores"], inp["tile"])
    assert len(res["steps"]) == len(want)
    for (m, l), s in zip(res["steps"], want):
        assert m == pytest.approx(s["m"], rel=1e-12) and l == pytest.approx(s["l"], rel=1e-12)


def test_paged_allocator_javascript_matches_paged_kv_cache(node_results):
    _, res = node_results
    assert res["tables"] == explorables.replay_paged_script(12, 4, SCRIPT)
    cache = PagedKVCache(n_layers=1, n_kv_heads=1, d_head=1, num_blocks=12, block_size=4)
    for op in SCRIPT:
        if op[0] == "add":
            cache.add_sequence(op[1])
        elif op[0] == "append":
            cache.append(op[1], np.zeros((1, op[2], 1, 1)), np.zeros((1, op[2], 1, 1)))
        elif op[0] == "fork":
            cache.fork(op[1], op[2])
        else:
            cache.release(op[1])
    assert res["free"] == cache.allocator.free_blocks()


def test_sizing_javascript_matches_sizing(node_results):
    _, res = node_results
    for got, m in zip(res["sizes"], MODELS.values()):
        assert got["perToken"] == m.kv_bytes_per_token(2) and got["mha"] == m.mha_kv_bytes_per_token(2)
        cap = capacity(m, "H100 SXM", 32_000, weight_dtype="bf16", cache_dtype="fp8", n_gpus=2)
        assert (got["cap"]["per"], got["cap"]["fit"], got["cap"]["free"]) == (
            cap.kv_bytes_per_sequence, cap.max_sequences, cap.free_for_cache_bytes), m.name
