"""Re-execute chapter notebooks in place so their stored outputs match the code (strict nbval checks them).

    python tools/execute_notebooks.py chapters/*.ipynb
"""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

for name in sys.argv[1:]:
    path = Path(name)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    print(f"executed {path}")
