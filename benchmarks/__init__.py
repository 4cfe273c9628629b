"""Stand-alone benchmark scripts (``python benchmarks/<name>.py``); the
all-reduce benchmark itself is ``python -m pyar.bench``."""
