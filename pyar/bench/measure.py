"""Timing collectives across ranks: every rank times its own calls with
events, and a call's time is the slowest rank's."""
from mpi4py import MPI

from pyar import _hip
from pyar.array import DeviceArray


def iterations_for(nbytes):
    if nbytes <= 1 << 20:
        return 200
    if nbytes <= 64 << 20:
        return 40
    return 10


def time_per_call(comm, run_once, iterations, warmup, stream):
    """Seconds per call of ``run_once()`` (queued on ``stream``), slowest rank."""
    for _ in range(warmup):
        run_once()
    stream.synchronize()
    comm.Barrier()
    start, stop = _hip.Event(), _hip.Event()
    start.record(stream)
    for _ in range(iterations):
        run_once()
    stop.record(stream)
    stop.synchronize()
    mine = start.elapsed_time(stop) / 1e3 / iterations
    return comm.allreduce(mine, op=MPI.MAX)


def copy_bandwidth(nbytes=1 << 30, iterations=20):
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus
    written: the ceiling for kernels that stream through memory."""
    src = _hip.DeviceMemory(nbytes)
    dst = _hip.DeviceMemory(nbytes)
    stream = _hip.Stream()
    try:
        _hip.memset(src.ptr, 1, nbytes)
        _hip.memcpy_dtod(dst.ptr, src.ptr, nbytes, stream)
        start, stop = _hip.Event().record(stream), _hip.Event()
        for _ in range(iterations):
            _hip.memcpy_dtod(dst.ptr, src.ptr, nbytes, stream)
        stop.record(stream)
        stop.synchronize()
        return 2 * nbytes * iterations / (start.elapsed_time(stop) / 1e3)
    finally:
        stream.close()
        src.free()
        dst.free()


def prefix(array, count):
    """The first ``count`` elements of a 1-D device array (itself when all)."""
    if count == array.size:
        return array
    return DeviceArray.from_pointer(array.ptr, (count,), array.dtype, owner=array,
                                    device=array.device)
