"""minillm's benchmark harness (a checkout's tool, not part of the installed package): ``python -m benchmarks``."""
