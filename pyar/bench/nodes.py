"""python -m pyar.bench --node-size K: the all-reduce across IPC domains of K
ranks (nodes; on one machine, simulated ones), against the MPI host round
trip over every rank measured in the same run.

Per size: "mpi/host" (the baseline: device-to-host copy, mpi4py Allreduce,
copy back); "hier:allgather" and "hier:reduce_scatter", the hierarchical
all-reduce with each inter-node method of pyar.comm.rail ("auto" picks the
first at 2 nodes, the second beyond: these rows are the measurement behind
that choice); and the domain's own collectives, "reduce_scatter" (16-bit
inputs to float32 shards, as the hierarchical path calls it) and
"all_gather", with bus bandwidth over the domain's ranks.  Every hierarchical
row's result is checked exactly (the 'wrong' column); the domain rows are not.
"""
import numpy as np

import pyar
from pyar import _hip
from pyar.bench import exact, measure, report
from pyar.bench.host_mpi import HostRoundTrip
from pyar.bench.sizes import doubling
from pyar.comm import shards

LEGEND = ("mpi/host: the sum through the host over every rank (device-to-host copy, mpi4py "
          "Allreduce, copy back); hier:METHOD: pyar across the nodes, the domain's "
          "reduce-scatter, the rail's sum by METHOD on pinned host copies, the domain's "
          "all-gather; vs_mpi: its time over mpi/host (below 1: pyar is faster); "
          "reduce_scatter / all_gather: the domain's collectives alone, bus bandwidth over "
          "its ranks; wrong: elements that differ from the exact sum, all ranks "
          "(- unchecked)")
METHODS = ("allgather", "reduce_scatter")


def points_per_size(local_world):
    return 1 + len(METHODS) + (2 if local_world > 1 else 0)


def sweep(args, comm, mpi, largest, show):
    """Time every size's rows; ``show(row)`` gets each as it is measured."""
    dtype = np.dtype(args.dtype_value)
    world, local = comm.world, comm.local
    stream = _hip.Stream()
    x = pyar.empty((largest // dtype.itemsize,), dtype, stream=stream, ipc=True)
    y = pyar.empty_like(x)
    x.set(exact.exact_inputs(x.size, mpi.Get_rank()).astype(dtype), stream=stream)
    host = HostRoundTrip(mpi, x.size, dtype)
    lo, hi = shards.bounds(x.size, local.world, dtype.itemsize, local.rank)
    shard_buffer = pyar.empty((hi - lo,), np.float32, stream=stream)
    gathered_in = pyar.empty((hi - lo,), dtype, stream=stream)
    rows = []
    for nbytes in doubling(args.min, largest, args.factor):
        count = max(1, nbytes // dtype.itemsize)
        moved = count * dtype.itemsize
        iterations = args.iters or measure.iterations_for(nbytes)
        src, dst = measure.prefix(x, count), measure.prefix(y, count)
        expected = exact.expected_sum(count, world) if args.check else None

        def timed(call):
            return measure.time_per_call(mpi, call, iterations, args.warmup, stream)

        _hip.memset(dst.ptr, 0, dst.nbytes, stream)  # a stale right answer cannot pass
        baseline = timed(host.call(src.ptr, dst.ptr, count, stream))
        rows.append(report.row(moved, count, args.dtype, "mpi", "host", baseline,
                               2 * (world - 1) / world, _wrong(args, mpi, dst, expected, stream)))
        show(rows[-1])
        comm.register(src)
        for method in METHODS:
            comm.rail_method = method
            _hip.memset(dst.ptr, 0, dst.nbytes, stream)
            seconds = timed(lambda: comm.allreduce(src, out=dst, stream=stream))
            comm.synchronize(stream)
            rows.append(report.row(moved, count, args.dtype, f"hier:{method}", "registered",
                                   seconds, 2 * (world - 1) / world,
                                   _wrong(args, mpi, dst, expected, stream)))
            rows[-1]["vs_mpi"] = seconds / baseline
            show(rows[-1])
        if local.world > 1:
            rows.extend(_domain_rows(args, local, src, dst, shard_buffer, gathered_in, timed, moved,
                                     stream))
            for row in rows[-2:]:
                show(row)
    comm.rail_method = "auto"
    stream.close()
    return rows


def _domain_rows(args, local, src, dst, shard_buffer, gathered_in, timed, moved, stream):
    """The domain's reduce-scatter (to float32) and all-gather of ``src``'s size."""
    count = src.size
    lo, hi = shards.bounds(count, local.world, src.dtype.itemsize, local.rank)
    shard = measure.prefix(shard_buffer, hi - lo)
    mine = measure.prefix(gathered_in, hi - lo)
    local.register(src)
    bus = (local.world - 1) / local.world
    rows = []
    for name, call in (
            ("reduce_scatter", lambda: local.reduce_scatter(src, out=shard, stream=stream)),
            ("all_gather", lambda: local.all_gather(mine, out=dst, stream=stream))):
        seconds = timed(call)
        rows.append(report.row(moved, count, args.dtype, name, "registered" if name ==
                               "reduce_scatter" else "staged", seconds, bus))
    local.synchronize(stream)
    return rows


def _wrong(args, mpi, dst, expected, stream):
    return exact.wrong_on_all_ranks(mpi, dst, expected, stream) if args.check else None


def heading(comm):
    """The shape and the inter-node data path, for the table's title."""
    aware = {True: "GPU-aware", False: "not GPU-aware", None: "GPU-awareness unknown"}[
        comm.gpu_aware_mpi]
    return (f"{comm.domains} nodes x {comm.local.world} ranks, inter-node step through "
            f"pinned host memory (MPI {aware})")
