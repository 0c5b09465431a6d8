"""Re-execute chapter notebooks in place so their stored outputs match the code (strict nbval checks them).

    python tools/execute_notebooks.py chapters/*.ipynb
"""
import os
import sys
from pathlib import Path

# One BLAS thread per kernel: on a shared 2-core machine threaded BLAS oversubscribes and a timing cell can run
# past the limit (the stored outputs do not depend on it: nbval checks them with the default threads).
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import nbformat
from nbclient import NotebookClient

for name in sys.argv[1:]:
    path = Path(name)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    print(f"executed {path}")
