"""The benchmark harness and its results (issue 33 item 2): one command, one results file per suite per GPU,
each record with its own meta, an index generated from them, and nothing committed twice. No GPU needed."""
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the harness is a checkout's package (not in the wheel)

bench = importlib.import_module("benchmarks.bench")
SUITES = ("hardware", "flash", "paged", "serving", "speculative", "composed", "serving_client", "batch_invariant")


def _harness(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_the_harness_lists_its_suites():
    assert tuple(bench.SUITES) == SUITES
    run = _harness()
    assert run.returncode == 0, run.stderr
    for suite in SUITES:
        assert re.search(rf"^  {suite} ", run.stdout, re.M), run.stdout
    assert _harness("nope").returncode == 2


@pytest.mark.parametrize("suite", SUITES)
def test_each_suite_imports_without_a_gpu_and_names_its_record(suite):
    module = importlib.import_module(f"benchmarks.{suite}")
    assert callable(module.main)
    name = bench.record_name(module, [])
    assert isinstance(name, str) and name


def test_suites_name_the_records_the_chapters_read():
    name = lambda suite, *argv: bench.record_name(importlib.import_module(f"benchmarks.{suite}"), list(argv))
    assert name("flash") == "flash_attention" and name("paged") == "paged_attention"
    assert name("hardware") == "hardware" and name("hardware", "--part", "launch") == "launch_overhead"
    assert name("composed") == "composed" and name("composed", "--study") == "composed_bf16"
    assert name("speculative") == "speculative" and name("speculative", "--parts", "engine") == "speculative_engine"


@pytest.mark.parametrize("suite", ["hardware", "flash", "paged"])
def test_help_works_for_a_suite(suite):
    run = _harness(suite, "--help")
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"python -m benchmarks {suite}" in run.stdout and "--record" in run.stdout and "--out" in run.stdout


def test_the_harness_runs_as_a_folder_from_anywhere(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks"), "hardware", "--help"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--part" in run.stdout


def test_results_are_one_file_per_suite_per_gpu_with_every_record_meta():
    files = sorted(p.name for p in RESULTS.iterdir())
    assert len(files) < 40, files
    assert not [f for f in files if not re.fullmatch(r"(README|INDEX)\.md|[a-z]+(_[a-z]+)*_[a-z]\d+\.json", f)], files
    assert not [f for f in files if re.search(r"kernels\d|round\d|run\d|20\d\d|_v\d|\.(txt|log)$", f)], files
    assert bench.check_results() == []
    for path in RESULTS.glob("*.json"):
        for name, record in json.loads(path.read_text())["records"].items():
            meta = record["meta"]
            assert all(meta.get(k) for k in ("gpu", "torch", "triton", "date")), (path.name, name)
            assert meta.get("command") or meta.get("commands"), (path.name, name)


def test_the_index_is_current():
    assert (RESULTS / bench.INDEX).read_text() == bench.index_text(), "run: python -m benchmarks index"
    assert _harness("index", "--check").returncode == 0


def test_check_results_finds_a_record_without_meta_and_a_stray_file(tmp_path):
    good = {"suite": "flash", "gpu": "NVIDIA H200", "records": {"r": {"meta": {
        "gpu": "NVIDIA H200", "torch": "2", "triton": "3", "date": "2026-01-01", "command": "python -m benchmarks flash"}}}}
    (tmp_path / "flash_h200.json").write_text(json.dumps(good))
    assert bench.check_results(tmp_path) == []
    good["records"]["bad"] = {"meta": {"gpu": "NVIDIA H200", "date": "2026-01-01"}}
    (tmp_path / "flash_h200.json").write_text(json.dumps(good))
    (tmp_path / "flash_attention_kernels9_h200.json").write_text(json.dumps({"meta": {}, "rows": []}))
    problems = bench.check_results(tmp_path)
    assert any("record bad" in p for p in problems) and any("kernels9" in p for p in problems), problems


def test_save_record_replaces_one_record_and_keeps_the_others(tmp_path):
    common = importlib.import_module("benchmarks._common")
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2", "triton": "3", "date": "2026-01-01", "command": "x"}
    common.save_record("paged", "a", {"meta": meta, "rows": [1]}, tmp_path)
    path = common.save_record("paged", "b", {"meta": meta, "rows": [2]}, tmp_path)
    common.save_record("paged", "a", {"meta": meta, "rows": [3]}, tmp_path)
    assert path.name == "paged_h100.json"
    doc = json.loads(path.read_text())
    assert doc["gpu"] == meta["gpu"] and {k: r["rows"] for k, r in doc["records"].items()} == {"a": [3], "b": [2]}
    with pytest.raises(ValueError, match="meta"):
        common.save_record("paged", "c", {"meta": {"gpu": "NVIDIA H200"}}, tmp_path)
    assert common.gpu_tag("NVIDIA H200") == "h200" and common.gpu_tag("NVIDIA A100-SXM4-80GB") == "a100"


def test_no_results_file_is_committed_twice_and_the_session_script_is_short():
    tracked = subprocess.run(["git", "ls-files", "minillm/results", "benchmarks"], cwd=ROOT, capture_output=True,
                             text=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    assert not [f for f in tracked if f.startswith("minillm/results/")]
    session = (ROOT / "benchmarks" / "gpu_session.sh").read_text()
    assert len(session.splitlines()) < 200
    scripts = {f.removeprefix("benchmarks/") for f in tracked if f.startswith("benchmarks/") and f.endswith(".py")}
    assert {f"{m}.py" for m in ("__init__", "__main__", "bench", "_common", "kernel_defaults_ab", *SUITES)} <= scripts
    # the scripts the suites replaced, and the studies that import removed internals (under the archive tag)
    gone = {"hardware_bench", "flash_attention_bench", "paged_attention_bench", "serving_bench", "speculative_bench",
            "composed_bench", "launch_overhead", "aot_resources", "autograd_handoff", "check_forward_repeats",
            "check_graph_capture", "check_interpreter_vs_compiled", "check_ws_lse", "flash_attention_bwd_bench",
            "flash_attention_ratio_study", "flash_attention_split_study", "flash_attention_step_study",
            "flash_attention_tune", "host_breakdown", "paged_decode_study", "profile_attention_step"}
    assert not scripts & {f"{m}.py" for m in gone}, scripts & {f"{m}.py" for m in gone}


NOTEBOOKS = [ROOT / "intro.ipynb", *sorted((ROOT / "chapters").glob("*.ipynb")), *sorted((ROOT / "appendix").glob("*.ipynb"))]


def test_every_record_a_chapter_names_exists():
    from minillm.book import load_result

    calls = set()
    for nb in NOTEBOOKS:
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] == "code":
                src = "".join(cell["source"])
                calls |= set(re.findall(r"""load_result\(["']([\w.]+)["'], ["']([\w]+)["']\)""", src))
                assert not re.search(r"""load_result\(["'][\w.]+["']\)""", src), f"{nb.name}: a whole file read"
    assert len(calls) > 20  # (the pattern still finds the chapters' and lab pages' reads)
    for name, record in sorted(calls):
        assert load_result(name, record)["meta"], (name, record)


def test_static_greedy_matches_cached_decode_in_every_row():
    """The gpt-fast-style baseline of the serving suite computes the model (else its speed means nothing): its
    greedy tokens equal the NumPy cached decoder's, float32, in each row of a batch of 3."""
    torch = pytest.importorskip("torch")
    from benchmarks._static_decode import StaticDecoder, static_greedy
    from minillm import load_model
    from minillm.decode import cached_decode
    from minillm.torch_model import TorchModel

    tiny = load_model("tiny")
    prompt = list(b"def main(argv):\n")
    want = list(cached_decode(tiny, prompt, 24).tokens[len(prompt):])
    got, _ = static_greedy(TorchModel.from_numpy(tiny.config, tiny.params), prompt, 24, batch=1)
    assert got == want
    dec = StaticDecoder(TorchModel.from_numpy(tiny.config, tiny.params), 3, len(prompt) + 1)
    with torch.inference_mode():
        for i, t in enumerate(prompt):
            nxt = dec(torch.full((3,), t), torch.tensor([i]))
    assert nxt.tolist() == [want[0]] * 3


def test_serving_client_smoke_serves_every_request_at_every_rate(tmp_path):
    """The serving_client suite end to end on CPU: a real server process, a real HTTP client, a record with
    each rate's client-side percentiles for every request sent."""
    pytest.importorskip("fastapi")
    from benchmarks import serving_client

    out = tmp_path / "sc.json"
    assert serving_client.main(["--smoke", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert [r["rate"] for r in record["rates"]] == [4.0, float("inf")]
    for r in record["rates"]:
        assert r["completed"] == record["meta"]["num_prompts"] and r["failed"] == 0
        assert 0 < r["ttft"]["median"] <= r["e2e"]["median"]


def test_archive_commit_holds_the_removed_kernels():
    """The READMEs name the commit of the archive tag; it is in main's history and holds what the consolidation
    removed (the private launcher, the rejected paged kernel, the study results)."""
    import shutil
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    commit = re.search(r"archive/kernel-experiments`, commit `([0-9a-f]{7,40})`", readme).group(1)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True)  # noqa: E731
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone")
    files = git("ls-tree", "-r", "--name-only", commit).stdout.split()
    assert {"minillm/kernels/launch.py", "minillm/kernels/paged_heads.py",
            "benchmarks/results/flash_attention_tune_oneloop_h200.json"} <= set(files), commit
    assert commit in (ROOT / "benchmarks" / "results" / "README.md").read_text()
