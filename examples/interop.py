"""CuPy arrays and PyTorch tensors through pyar without a copy.

    mpirun -n 4 python examples/interop.py

pyar reads a CuPy array or a PyTorch tensor where it lies (through
``__cuda_array_interface__`` or DLPack), all-reduces it in place on the
framework's own stream, and the framework sees the sum in the same memory;
an out-of-place result goes back to the framework the same way.  Every step
checks that the device pointer did not change (no copy) and that the sum is
exact.  A framework that is not installed is reported and left out; with
neither, the example exits with status 1.
"""
import sys

import numpy as np
from mpi4py import MPI

import pyar
from pyar import diagnostics
from pyar.bench.exact import exact_inputs, expected_sum

COUNT = 1 << 20


def with_cupy(comm, rank, world):
    import cupy
    cupy.cuda.Device(comm.device).use()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        x = cupy.asarray(exact_inputs(COUNT, rank))
        view = pyar.asarray(x)                                    # no copy: same pointer
        assert view.ptr == x.data.ptr, "pyar copied the CuPy array"
        comm.allreduce(view, out=view, stream=stream.ptr)         # in place, CuPy's stream
        y = comm.allreduce(pyar.asarray(x), stream=stream.ptr)    # out of place
        back = cupy.asarray(y)                                    # no copy back either
        assert back.data.ptr == y.ptr, "CuPy copied pyar's result"
        want = expected_sum(COUNT, world)
        ok = np.array_equal(cupy.asnumpy(x), want) and np.array_equal(
            cupy.asnumpy(back), want * world)
    return ok


def with_torch(comm, rank, world):
    import torch
    torch.cuda.set_device(comm.device)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        t = torch.from_numpy(exact_inputs(COUNT, rank)).to(f"cuda:{comm.device}")
        view = pyar.asarray(t)                                    # DLPack, no copy
        assert view.ptr == t.data_ptr(), "pyar copied the tensor"
        comm.allreduce(view, out=view, stream=stream.cuda_stream)
        y = comm.allreduce(pyar.asarray(t), stream=stream.cuda_stream)
        back = torch.from_dlpack(y)                               # no copy back either
        assert back.data_ptr() == y.ptr, "PyTorch copied pyar's result"
        want = expected_sum(COUNT, world)
        ok = np.array_equal(t.cpu().numpy(), want) and np.array_equal(
            back.cpu().numpy(), want * world)
    return ok


def main():
    world = MPI.COMM_WORLD
    diagnostics.exit_unless_ready(world)
    rank, size = world.Get_rank(), world.Get_size()
    results, missing = {}, {}
    with pyar.Communicator(world) as comm:
        for name, run in (("CuPy", with_cupy), ("PyTorch", with_torch)):
            try:
                __import__({"CuPy": "cupy", "PyTorch": "torch"}[name])
            except ImportError as exc:
                missing[name] = str(exc)
                continue
            results[name] = world.allreduce(bool(run(comm, rank, size)), op=MPI.LAND)
    if rank == 0:
        for name, ok in results.items():
            print(f"{name} through pyar on {size} ranks, in place and out of place, no copies: "
                  f"{'OK' if ok else 'FAILED (wrong sum)'}")
        for name, error in missing.items():
            print(f"{name}: not installed, left out ({error})", file=sys.stderr)
        if not results:
            print("interop.py needs CuPy or PyTorch; neither is installed", file=sys.stderr)
    raise SystemExit(0 if results and all(results.values()) else 1)


if __name__ == "__main__":
    main()
