"""``python -m pyar.bench``: all-reduce latency and bandwidth tables (run it
under mpirun, one rank per GPU or several sharing one GPU under MPS)."""
