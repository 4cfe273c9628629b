"""The baseline every pyar.bench run measures: what an mpirun program does
without pyar.  Copy the device array to the host, ``Allreduce`` it with
mpi4py, copy the sum back -- the path for MPI libraries that are not
GPU-aware (Open MPI as Debian and Ubuntu ship it).

MPI has no 16-bit floating-point types, so float16 and bfloat16 are widened
to float32 on the host for the reduction and narrowed back, as a program
would; that conversion is part of the baseline's time."""
import numpy as np
from mpi4py import MPI

from pyar import _hip


class HostRoundTrip:
    """Host buffers for messages up to ``largest_count`` elements of ``dtype``."""

    def __init__(self, mpi, largest_count, dtype):
        self.mpi = mpi
        self.dtype = np.dtype(dtype)
        self.host = np.empty(largest_count, self.dtype)
        self.wide = None if self.dtype == np.float32 else np.empty(largest_count, np.float32)

    def call(self, src, dst, count, stream):
        """A function doing one round trip of ``count`` elements, ``src`` to
        ``dst`` (device addresses), queued on and waiting for ``stream``."""
        host = self.host[:count]
        raw = host.view(np.uint8)  # the buffer protocol knows no bfloat16
        wide = None if self.wide is None else self.wide[:count]
        mpi = self.mpi

        def run_once():
            _hip.memcpy_dtoh(raw, src, stream)
            stream.synchronize()
            if wide is None:
                mpi.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            else:
                np.copyto(wide, host, casting="unsafe")
                mpi.Allreduce(MPI.IN_PLACE, wide, op=MPI.SUM)
                np.copyto(host, wide, casting="unsafe")
            _hip.memcpy_htod(dst, raw, stream)

        return run_once
