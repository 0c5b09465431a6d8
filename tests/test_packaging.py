"""Packaging (issue 31, item 5): the wheel and what it holds, the extras a reader installs, and a pip user's
install on a machine without a GPU (NumPy as pip picks it, the kernels in Triton's interpreter).

The last test installs from the package index into a fresh venv; it carries the ``install`` marker, is left
out of plain ``pytest`` runs and is run by ``make install-test`` (part of ``make test``).
"""
import ast
import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
NOTEBOOKS = [ROOT / "intro.ipynb", *sorted((ROOT / "chapters").glob("*.ipynb"))]


def _names(requirements) -> set[str]:
    """The distribution names in a list of requirement strings, normalized."""
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower().replace("_", "-") for r in requirements}


def _code_cells(path: Path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"])
            yield "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))


def _imported(tree) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


# import name -> the distribution that provides it, for every third-party module the chapters import
DISTRIBUTION = {"numpy": "numpy", "torch": "torch", "triton": "triton", "matplotlib": "matplotlib",
                "ipywidgets": "ipywidgets", "anywidget": "anywidget", "traitlets": "traitlets",
                "openai": "openai"}  # chapter 8's client of the server (python -m minillm.serve: fastapi, uvicorn)


def test_notebook_extra_has_what_the_chapters_import_and_no_book_toolchain():
    mods = set()
    for nb in NOTEBOOKS:
        for src in _code_cells(nb):
            mods |= _imported(ast.parse(src))
    for f in (ROOT / "minillm" / "explorables").glob("*.py"):  # anywidget, lazily
        mods |= _imported(ast.parse(f.read_text()))
    third_party = sorted(m for m in mods if m not in sys.stdlib_module_names and m != "minillm")
    unknown = [m for m in third_party if m not in DISTRIBUTION]
    assert not unknown, f"chapters import {unknown}: add them to DISTRIBUTION and to an extra"
    notebook = _names(EXTRAS["notebook"])
    # traitlets comes with ipywidgets and anywidget
    provided = _names(PROJECT["dependencies"]) | _names(EXTRAS["gpu"]) | notebook | {"traitlets"}
    missing = [DISTRIBUTION[m] for m in third_party if DISTRIBUTION[m] not in provided]
    assert not missing, f"the chapters import {missing}, which numpy + [gpu,notebook] does not install"
    assert {"anywidget", "ipykernel"} <= notebook  # the explorables as widgets, a kernel to run them in
    assert not notebook & {"jupyter-book", "sphinx", "myst-nb", "nbval", "selenium"}
    assert notebook <= _names(EXTRAS["book"])  # the book's environment runs the chapters too
    assert _names(EXTRAS["cpu"]) == _names(EXTRAS["gpu"])  # the same packages, another Triton bound


def test_readme_and_intro_point_readers_at_the_notebook_extra():
    intro = "\n".join("".join(c["source"]) for c in json.loads((ROOT / "intro.ipynb").read_text())["cells"])
    for name, text in (("README.md", (ROOT / "README.md").read_text()), ("intro.ipynb", intro)):
        installs = re.findall(r"pip install [^\n`]*\[([a-z,]+)\]", text)
        assert installs, name
        assert not [e for e in installs if "book" in e.split(",")], f"{name} tells readers to install [book]"
        assert any(set(e.split(",")) == {"gpu", "notebook"} for e in installs), name  # Colab, a GPU box
        assert any(set(e.split(",")) == {"cpu", "notebook"} for e in installs), name  # no GPU


def test_interpreter_problem_names_the_versions_that_fail_and_the_cpu_extra_avoids_them():
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        pytest.skip("needs torch and triton")  # (found, not imported: minillm.kernels must import triton first)
    from minillm.kernels import FIXED_INTERPRETER, interpreter_problem

    bad = interpreter_problem("3.6.0", "2.4.6")
    assert "3.6.0" in bad and "2.4.6" in bad and "triton>=3.7" in bad and "numpy<2.4" in bad
    assert interpreter_problem("3.5.1", "2.4.0rc1")
    assert interpreter_problem("3.6.0", "2.5.0")
    for ok in (("3.6.0", "2.3.5"), ("3.6.0", "1.26.4"), ("3.7.0", "2.4.6"), ("3.9.0", "2.5.1"), ("4.0.0", "3.0.0")):
        assert interpreter_problem(*ok) is None, ok
    triton_req = [r for r in EXTRAS["cpu"] if r.startswith("triton")]
    assert [tuple(map(int, re.search(r">=(\d+)\.(\d+)", r).groups())) for r in triton_req] == [FIXED_INTERPRETER]
    assert not [r for r in EXTRAS["gpu"] + EXTRAS["cpu"] if r.startswith("numpy")]  # NumPy is never capped


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_dist_does_not_install_the_book_environment():
    plan = subprocess.run(["make", "-n", "dist", "VENV=/nonexistent-venv"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert "pip wheel" in plan and "-w dist" in plan
    assert "cp benchmarks/results/*.json minillm/results/" in plan  # the results go into the wheel at build time
    assert "requirements.txt" not in plan and "nonexistent-venv" not in plan, plan


def _build_wheel(out: Path) -> Path:
    """The wheel as ``make wheel-test`` builds it: tools/run_from_wheel.py's build_wheel (a copy of the sources, the
    recorded results of benchmarks/results copied into the package)."""
    spec = importlib.util.spec_from_file_location("run_from_wheel", ROOT / "tools" / "run_from_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_wheel(out)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    try:
        version = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        version = (0, 0)
    if version < (77, 0):
        pytest.skip("building without isolation needs setuptools >= 77 here")
    out = tmp_path_factory.mktemp("wheel")
    return _build_wheel(out), out / "src"


def test_wheel_holds_every_package_file_checkpoints_and_recorded_results(wheel):
    path, src = wheel
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    files = {p.relative_to(src).as_posix() for p in (src / "minillm").rglob("*") if p.is_file()}
    assert files - names == set(), "files of the package missing from the wheel"
    for f in ("minillm/weights/tiny.npz", "minillm/weights/draft.npz", "minillm/weights/medusa_tiny.npz",
              "minillm/weights/tiny_log.json"):
        assert f in names
    # the recorded results, committed once in benchmarks/results/, shipped as package data by the build
    recorded = {f"minillm/results/{p.name}" for p in (ROOT / "benchmarks" / "results").glob("*.json")}
    assert len(recorded) >= 6 and recorded <= names, recorded - names
    assert {n for n in names if n.startswith("minillm/results/")} == recorded
    assert any(n.startswith("minillm/data/") for n in names)
    assert any(n.startswith("minillm/assignments/tests/") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "chapters/"))]
    for extra in ("gpu", "cpu", "notebook", "book", "test"):
        assert f"Provides-Extra: {extra}" in meta
    assert re.search(r"Requires-Dist: anywidget[^\n]*extra == \"notebook\"", meta)
    assert re.search(r"Requires-Dist: triton>=3\.7[^\n]*extra == \"cpu\"", meta)


KERNEL_CHECK = """
import sys
from pathlib import Path
import numpy as np, torch
import minillm
assert Path(minillm.__file__).resolve().is_relative_to(Path(sys.prefix).resolve()), minillm.__file__
from minillm.kernels import INTERPRETED  # (before triton: it sets TRITON_INTERPRET without a GPU)
import triton
from minillm.kernels.softmax import softmax
from minillm.softmax import safe_softmax
assert INTERPRETED
x = np.random.default_rng(0).standard_normal((3, 40)).astype(np.float32)
np.testing.assert_allclose(softmax(torch.from_numpy(x), block=16).numpy(), safe_softmax(x), atol=1e-6)
import matplotlib, ipywidgets, ipykernel, anywidget
from minillm.explorables import online_softmax_explorable
assert isinstance(online_softmax_explorable(x[0, :8], tile=4), anywidget.AnyWidget)  # a widget, not text
print("VERSIONS", np.__version__, triton.__version__, torch.__version__)
"""


@pytest.mark.install
def test_cpu_install_from_the_index_runs_a_kernel_in_the_interpreter(wheel, tmp_path):
    """As README.md tells a reader without a GPU: a CPU torch first, then minillm[cpu,notebook]; NumPy is whatever
    pip picks (today's newest, >= 2.4). Fails where the extras give an interpreter that cannot run with it."""
    path, _ = wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    # the CPU torch requirements.txt pins (this index resolves the exact pin to the small CPU build)
    torch_pin = next(line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
                     if line.startswith("torch=="))
    subprocess.run([py, "-m", "pip", "install", "-q", torch_pin], check=True)
    subprocess.run([py, "-m", "pip", "install", "-q", f"{path}[cpu,notebook]"], check=True)
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "TRITON_INTERPRET")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the interpreter, even on a machine with a GPU
    run = subprocess.run([py, "-c", KERNEL_CHECK], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    numpy_version = run.stdout.split("VERSIONS")[1].split()[0]
    assert tuple(int(p) for p in numpy_version.split(".")[:2]) >= (2, 4), run.stdout
