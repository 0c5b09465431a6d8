"""Run every chapter from an installed wheel, in a folder outside the clone, on a second set of CPU features.

    python tools/run_from_wheel.py chapters/*.ipynb

Builds the wheel from a copy of the sources with the recorded results put into the package, as ``make dist``
does (:func:`build_wheel`; tests/test_packaging.py builds it the same way), installs it (no dependencies: the running environment provides them) into a temporary
folder that goes first on PYTHONPATH, copies only the notebooks into another temporary folder, and runs them
there under strict nbval: every stored output must come out the same. A first cell, inserted in each copy,
checks that ``minillm`` really is the installed copy and that no checkout is next to it.

The run also switches off NumPy's AVX-512, AVX2, FMA3 and F16C code paths (``NPY_DISABLE_CPU_FEATURES``; the
arm64 half-precision ones too, names NumPy does not know on a CPU are ignored) and runs OpenBLAS's Sandy Bridge
kernels (``OPENBLAS_CORETYPE``). So CI checks the stored outputs on two CPU feature sets, the machine's own
(``make notebooks``) and an older x86-64's (here): an output that depends on the SIMD path fails one of them.
Exits non-zero if any cell fails.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]

# NumPy's dispatched x86-64 features above SSE4.2 and arm64's above ASIMD (NumPy ignores the names it does not know)
OLD_CPU = {
    "NPY_DISABLE_CPU_FEATURES": "AVX512_SPR AVX512_ICL AVX512_CNL AVX512_CLX AVX512_SKX AVX512_KNM AVX512_KNL "
                                "AVX512CD AVX512F AVX2 FMA3 F16C ASIMDHP ASIMDDP ASIMDFHM",
    "OPENBLAS_CORETYPE": "Sandybridge",
}


def build_wheel(out: Path) -> Path:
    """The wheel of a copy of the sources under ``out`` (the clone's tree is left alone: no build/, egg-info or
    results copy written there), with ``benchmarks/results/*.json``, committed once, copied into the package as
    ``minillm/results/`` (package data), where ``minillm.book.result_path`` finds them once installed."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "minillm", src / "minillm", ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "*.egg-info", ".ipynb_checkpoints", "results"))
    (src / "minillm" / "results").mkdir()
    for f in (ROOT / "benchmarks" / "results").glob("*.json"):
        shutil.copy(f, src / "minillm" / "results" / f.name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(out / "dist"), str(src)], check=True)
    return next((out / "dist").glob("minillm-*.whl"))


def main(notebooks: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="minillm-wheel-"))
    wheel = build_wheel(work)
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True)
    book = work / "book"
    book.mkdir()
    check = (f"import minillm\nassert minillm.__file__.startswith({str(site)!r}), minillm.__file__\n"
             f"from pathlib import Path\nassert not (Path(minillm.__file__).parents[1] / 'benchmarks').exists()")
    for name in notebooks:
        nb = nbformat.read(name, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(check))
        nbformat.write(nb, book / Path(name).name)
    shutil.copy(ROOT / "nbval_sanitize.cfg", book / "nbval_sanitize.cfg")
    env = dict(os.environ, PYTHONPATH=str(site) + os.pathsep + os.environ.get("PYTHONPATH", ""), **OLD_CPU)
    print(f"strict nbval from {wheel.name} in {book}, with {' '.join(f'{k}={v!r}' for k, v in OLD_CPU.items())}",
          flush=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval", *sorted(p.name for p in book.glob("*.ipynb")),
                           "--nbval-sanitize-with", "nbval_sanitize.cfg", "--nbval-current-env",
                           "--nbval-cell-timeout=1200", "-p", "no:cacheprovider", "--rootdir", str(book)],
                          cwd=book, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
