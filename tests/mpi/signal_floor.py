"""pyar.bench's signal floor (latency.SignalFloor: pyar_test_flag_exchange)
under mpirun, all ranks on GPU 0; run by tests/gpu/test_signal_floor_gpu.py.

Usage: signal_floor.py measure|control

measure: every rank times the flag exchange eager and from a graph, as
``--latency --signal-floor`` does, and close() finds no wait that gave up.
control: after a few exchanges the last rank launches one more that its peers
never make, with a timeout of 2 ms: its waits for every peer give up (the
wait is bounded: the launch returns within 100 ms), and close() raises on
every rank (no floor is reported over timeouts).
"""
import os
import sys
import time

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pyar._hip as hip  # noqa: E402
from pyar.bench import latency  # noqa: E402
from tests.mpi_launch import report  # noqa: E402

CONTROL_TIMEOUT_NS = 2_000_000
TIMEOUT_NS = 10_000_000_000


def main():
    mode = sys.argv[1]
    mpi = MPI.COMM_WORLD
    rank, world = mpi.Get_rank(), mpi.Get_size()
    hip.set_device(0)
    stream = hip.Stream()
    floor = latency.SignalFloor(mpi, stream, 20, TIMEOUT_NS)
    row = dict(test="signal-floor", mode=mode, rank=rank, world=world)
    if mode == "measure":
        row.update(eager_us=floor.seconds("eager", 200, 10) * 1e6,
                   graph_us=floor.seconds("graph", 200, 10) * 1e6)
    else:
        row.update(eager_us=floor.seconds("eager", 20, 2) * 1e6)
        if rank == world - 1:
            floor.timeout_ns = CONTROL_TIMEOUT_NS  # the exchanges before it never give up
            start = time.perf_counter()
            floor.launch()
            stream.synchronize()
            row.update(unanswered_ms=(time.perf_counter() - start) * 1e3)
    try:
        floor.close()
        row.update(raised=None)
    except RuntimeError as exc:
        row.update(raised=str(exc))
    stream.close()
    report(**row)


if __name__ == "__main__":
    main()
