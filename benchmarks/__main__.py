"""``python -m benchmarks SUITE ...`` from a checkout's root, or ``python path/to/benchmarks SUITE ...`` anywhere."""
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a folder: import it as the package (its modules' names are common words)
    sys.path[0] = str(Path(__file__).resolve().parents[1])
    from benchmarks.bench import main
else:
    from .bench import main

sys.exit(main())
