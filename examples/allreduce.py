"""Sum a random array across MPI ranks with pyar, check it, time it.

    mpirun -n 4 python examples/allreduce.py --size 16M --dtype bfloat16

Without a GPU (or without kernels for it, or with ranks sharing an NVIDIA GPU
and no MPS) it says so once and exits with status 1.  Each rank draws its own random input; the result is checked against a float64
sum of every rank's input computed through MPI on the host, and every rank's
result must be bitwise identical.
"""
import argparse
import hashlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import diagnostics
from pyar.bench.sizes import parse_size

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Relative error allowed against the float64 sum: a few units in the last
# place of the output format, scaled by the number of additions.
TOLERANCE = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1.6e-2}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("16M"), help="bytes")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()

    world = MPI.COMM_WORLD
    diagnostics.exit_unless_ready(world)
    rank = world.Get_rank()
    dtype = np.dtype(DTYPES[args.dtype])
    count = max(1, args.size // dtype.itemsize)
    host = np.random.default_rng(rank).standard_normal(count).astype(dtype)

    with pyar.Communicator(world) as comm:
        stream = pyar.Stream()
        x = pyar.asarray(host, stream=stream)
        y = comm.allreduce(x, stream=stream)
        comm.synchronize(stream)
        result = y.get().astype(np.float64)

        reference = np.empty(count, np.float64)
        world.Allreduce(host.astype(np.float64), reference, op=MPI.SUM)
        scale = np.abs(reference).max() or 1.0
        error = float(np.abs(result - reference).max() / scale)
        digest = hashlib.sha256(y.get().tobytes()).hexdigest()
        identical = len(set(world.allgather(digest))) == 1

        start, stop = pyar.Event(), pyar.Event()
        start.record(stream)
        for _ in range(args.iters):
            comm.allreduce(x, out=y, stream=stream)
        stop.record(stream)
        comm.synchronize(stream)
        micros = start.elapsed_time(stop) * 1e3 / args.iters
        micros = world.allreduce(micros, op=MPI.MAX)
        ok = error <= TOLERANCE[args.dtype] and identical
        if rank == 0:
            algbw = count * dtype.itemsize / micros / 1e3
            print(f"pyar all-reduce of {count} x {dtype} on {comm.world} ranks "
                  f"({pyar.Device(comm.device).name}, {pyar.platform()})")
            print(f"  max relative error vs float64: {error:.2e} "
                  f"(tolerance {TOLERANCE[args.dtype]:.0e}); identical on every rank: {identical}")
            print(f"  {micros:.1f} us per call, algbw {algbw:.1f} GB/s, "
                  f"busbw {algbw * 2 * (comm.world - 1) / comm.world:.1f} GB/s")
            print("  OK" if ok else "  FAILED")
        stream.close()
    raise SystemExit(0 if world.allreduce(ok, op=MPI.LAND) else 1)


if __name__ == "__main__":
    main()
