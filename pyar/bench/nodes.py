"""python -m pyar.bench --node-size K: the all-reduce across IPC domains of K
ranks (nodes; on one machine, simulated ones), against the MPI host round
trip over every rank measured in the same run.

Per size: "mpi/host" (the baseline: device-to-host copy, mpi4py Allreduce,
copy back); "hier:allgather" and "hier:reduce_scatter", the hierarchical
all-reduce on the host data path with each inter-node method of
pyar.comm.rail ("auto" picks the first at 2 nodes, the second beyond: these
rows are the measurement behind that choice); and the domain's own
collectives, "reduce_scatter" (16-bit inputs to float32 shards, as the
hierarchical path calls it) and "all_gather", with bus bandwidth over the
domain's ranks.  When the MPI library is GPU-aware on every rank
(pyar.diagnostics.mpi_gpu_awareness), also "hier:device", the device data
path (pyar.comm.inter_node: MPI all-gathers the device shards, pyar's kernel
adds them), and the baseline "mpi/device": mpi4py Allreduce handed the
device buffers themselves (float32 only: MPI has no 16-bit floating-point
type to sum).  Every hierarchical and MPI row's result is checked exactly
(the 'wrong' column); the domain rows are not.
"""
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from pyar.bench import exact, measure, report
from pyar.bench.host_mpi import HostRoundTrip
from pyar.bench.points import points
from pyar.comm import shards
from pyar.comm.hierarchical import HierarchicalCommunicator

LEGEND = ("mpi/host: the sum through the host over every rank (device-to-host copy, mpi4py "
          "Allreduce, copy back); hier:METHOD: pyar across the nodes, the domain's "
          "reduce-scatter, the rail's sum by METHOD on pinned host copies, the domain's "
          "all-gather; hier:device: the same with the shards' device pointers handed to MPI "
          "(all-gather) and summed by pyar's rail kernel; mpi/device: mpi4py Allreduce on "
          "the device buffers (float32; device rows only where MPI is GPU-aware); "
          "vs_mpi: its time over mpi/host (below 1: faster than it); "
          "reduce_scatter / all_gather: the domain's collectives alone, bus bandwidth over "
          "its ranks; wrong: elements that differ from the exact sum, all ranks "
          "(- unchecked)")
METHODS = ("allgather", "reduce_scatter")


def points_per_size(local_world, on_device=False, dtype=np.float32):
    device_rows = (1 + (np.dtype(dtype) == np.float32)) if on_device else 0
    return 1 + len(METHODS) + (2 if local_world > 1 else 0) + device_rows


def measures_device_path(comm, mpi):
    """Whether the device rows run: the MPI library is GPU-aware on every
    rank (collective over ``mpi``)."""
    return mpi.allreduce(comm.gpu_aware_mpi is True, op=MPI.LAND)


def sweep(args, comm, mpi, largest, show, on_device=False):
    """Time every size's rows; ``show(row)`` gets each as it is measured.
    ``comm`` takes the host data path; ``on_device`` adds the device rows."""
    dtype = np.dtype(args.dtype_value)
    world, local = comm.world, comm.local
    stream = _hip.Stream()
    # Plain device allocations (ipc=True): what MPI can map when handed them.
    x = pyar.empty((largest // dtype.itemsize,), dtype, stream=stream, ipc=True)
    y = pyar.empty_like(x, ipc=True)
    device_comm = device_x = None
    if on_device:
        device_comm = HierarchicalCommunicator(
            mpi, max_size=comm.max_size, timeout=comm.timeout, node_size=local.world,
            inter_node="device")
        # Its own copy of the input to register: two communicators of one
        # process would each map the peers' export of the same allocation.
        device_x = pyar.empty_like(x, ipc=True)
    x.set(exact.exact_inputs(x.size, mpi.Get_rank()).astype(dtype), stream=stream)
    if device_x is not None:
        _hip.memcpy_dtod(device_x.ptr, x.ptr, x.nbytes, stream)
    host = HostRoundTrip(mpi, x.size, dtype)
    lo, hi = shards.bounds(x.size, local.world, dtype.itemsize, local.rank)
    shard_buffer = pyar.empty((hi - lo,), np.float32, stream=stream)
    gathered_in = pyar.empty((hi - lo,), dtype, stream=stream)
    rows = []
    for count, moved, iterations, src, dst, expected in points(args, x, y, largest, world):

        def timed(call):
            return measure.time_per_call(mpi, call, iterations, args.warmup, stream)

        _hip.memset(dst.ptr, 0, dst.nbytes, stream)  # a stale right answer cannot pass
        baseline = timed(host.call(src.ptr, dst.ptr, count, stream))
        rows.append(report.row(moved, count, args.dtype, "mpi", "host", baseline,
                               2 * (world - 1) / world, _wrong(args, mpi, dst, expected, stream)))
        show(rows[-1])
        comm.register(src)
        hierarchical = [(comm, method, src) for method in METHODS]
        if device_comm is not None:
            device_src = measure.prefix(device_x, count)
            device_comm.register(device_src)
            hierarchical.append((device_comm, "allgather", device_src))
        for runs, method, source in hierarchical:
            runs.rail_method = method
            _hip.memset(dst.ptr, 0, dst.nbytes, stream)
            seconds = timed(lambda: runs.allreduce(source, out=dst, stream=stream))
            runs.synchronize(stream)
            name = "hier:device" if runs is device_comm else f"hier:{method}"
            rows.append(report.row(moved, count, args.dtype, name, "registered",
                                   seconds, 2 * (world - 1) / world,
                                   _wrong(args, mpi, dst, expected, stream)))
            rows[-1]["vs_mpi"] = seconds / baseline
            show(rows[-1])
        if device_comm is not None and dtype == np.float32:
            _hip.memset(dst.ptr, 0, dst.nbytes, stream)
            seconds = timed(_mpi_on_device(mpi, src, dst, stream))
            rows.append(report.row(moved, count, args.dtype, "mpi", "device", seconds,
                                   2 * (world - 1) / world,
                                   _wrong(args, mpi, dst, expected, stream)))
            rows[-1]["vs_mpi"] = seconds / baseline
            show(rows[-1])
        if local.world > 1:
            rows.extend(_domain_rows(args, local, src, dst, shard_buffer, gathered_in, timed, moved,
                                     stream))
            for row in rows[-2:]:
                show(row)
    comm.rail_method = "auto"
    if device_comm is not None:
        device_comm.close()
    stream.close()
    return rows


def _mpi_on_device(mpi, src, dst, stream):
    """One mpi4py Allreduce of float32 ``src`` into ``dst``, handed their
    device addresses, once ``stream``'s work on them is done."""
    nbytes = src.nbytes
    send = [MPI.buffer.fromaddress(src.ptr, nbytes), MPI.FLOAT]
    receive = [MPI.buffer.fromaddress(dst.ptr, nbytes), MPI.FLOAT]

    def run_once():
        stream.synchronize()
        mpi.Allreduce(send, receive, op=MPI.SUM)

    return run_once


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


def heading(comm, on_device=False):
    """The shape and the inter-node data paths, for the table's title."""
    aware = {True: "GPU-aware", False: "not GPU-aware", None: "GPU-awareness unknown"}[
        comm.gpu_aware_mpi]
    paths = "pinned host memory and device pointers" if on_device else "pinned host memory"
    return (f"{comm.domains} nodes x {comm.local.world} ranks, inter-node step through "
            f"{paths} (MPI {aware})")
