"""Execute every chapter from an installed wheel, in a folder outside the clone (no ../ paths, no checkout).

    python tools/run_from_wheel.py chapters/*.ipynb

Builds the wheel, installs it (no dependencies: the running environment provides them) into a temporary
folder that goes first on PYTHONPATH, copies only the notebooks into another temporary folder, and runs
each there with nbclient. A first cell checks that ``minillm`` really is the installed copy. Exits non-zero
if any chapter raises.
"""
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
work = Path(tempfile.mkdtemp(prefix="minillm-wheel-"))
subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                str(work / "dist"), str(ROOT)], check=True)
wheel = next((work / "dist").glob("minillm-*.whl"))
site = work / "site"
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
               check=True)
book = work / "book"
book.mkdir()
os.environ["PYTHONPATH"] = str(site) + os.pathsep + os.environ.get("PYTHONPATH", "")
check = (f"import minillm\nassert minillm.__file__.startswith({str(site)!r}), minillm.__file__\n"
         f"from pathlib import Path\nassert not (Path(minillm.__file__).parents[1] / 'benchmarks').exists()")
passed, failed = 0, 0
for name in sys.argv[1:]:
    src = Path(name)
    nb = nbformat.read(src, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(check))
    t = time.perf_counter()
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(book)}}).execute()
        passed += 1
        print(f"ok     {src.name} from {wheel.name} ({time.perf_counter() - t:.0f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - report every chapter, then fail
        failed += 1
        print(f"FAILED {src.name}: {type(e).__name__}: {str(e)[-600:]}", flush=True)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
