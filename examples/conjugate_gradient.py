"""A distributed conjugate-gradient solve with its data on the GPUs and every
reduction through pyar.

    mpirun -n 4 python examples/conjugate_gradient.py --n 4096

Written as a GPU HPC code is: the matrix and the vectors live in device
memory, CuPy does the local algebra, and pyar does every sum across ranks.
The symmetric positive definite matrix A (n x n) is split by columns: rank r
holds A[:, cols_r] and the matching piece of every vector.  A matrix-vector
product is a sum over ranks of A[:, cols_r] @ p_r -- one all-reduce of an
n-vector per iteration -- and each dot product is a local partial sum
followed by an all-reduce of one scalar.  CuPy's kernels and pyar's
collectives share one stream, so nothing waits for the GPU except the two
scalars per iteration that decide the step length.  The answer is checked
against numpy.linalg.solve on the whole matrix.

Needs CuPy (``pip install cupy-cuda12x`` on NVIDIA, ``cupy-rocm-6-0`` or
similar on ROCm); without it, or without a GPU, it says so and exits with 1.
"""
import argparse
import sys

import numpy as np
from mpi4py import MPI

import pyar
from pyar import diagnostics


def spd_matrix(n, seed=7):
    """A well-conditioned SPD matrix every rank can build identically."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, n)) / np.sqrt(n)
    return q @ q.T + np.eye(n) * 2.0


def import_cupy(world):
    """CuPy, or every rank exits with status 1 after rank 0 said why."""
    try:
        import cupy
        error = None
    except ImportError as exc:
        cupy, error = None, exc
    if any(world.allgather(error is not None)):
        if world.Get_rank() == 0:
            print(f"conjugate_gradient.py keeps its matrix on the GPU with CuPy, which is not "
                  f"installed ({error}); install it (NVIDIA: `pip install cupy-cuda12x`, "
                  "ROCm: a cupy-rocm wheel) and run again", file=sys.stderr)
        raise SystemExit(1)
    return cupy


class Sum:
    """All-reduces a registered device buffer in place, on the solver's stream."""

    def __init__(self, cupy, comm, length, stream):
        self.comm = comm
        self.stream = stream
        self.values = cupy.zeros(length, cupy.float32)   # CuPy's view
        self.shared = pyar.asarray(self.values)          # pyar's view of the same memory
        comm.register(self.shared)

    def __call__(self):
        self.comm.allreduce(self.shared, out=self.shared, stream=self.stream)
        return self.values


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--max-iter", type=int, default=500)
    args = parser.parse_args()

    world = MPI.COMM_WORLD
    diagnostics.exit_unless_ready(world)
    cupy = import_cupy(world)
    rank, size = world.Get_rank(), world.Get_size()
    n = args.n
    a = spd_matrix(n)
    b = np.random.default_rng(11).standard_normal(n)
    cols = np.array_split(np.arange(n), size)[rank]
    lo, hi = int(cols[0]), int(cols[-1]) + 1

    with pyar.Communicator(world) as comm:
        cupy.cuda.Device(comm.device).use()
        stream = pyar.Stream()
        with cupy.cuda.ExternalStream(stream.handle):
            a_cols = cupy.asarray(a[:, lo:hi], cupy.float32)
            product = Sum(cupy, comm, n, stream)         # A p, summed over ranks
            scalar = Sum(cupy, comm, 4, stream)          # a dot product (one 16-byte pack)

            def dot(u, v):
                scalar.values[:1] = cupy.dot(u, v)
                return float(scalar()[0])                # the one wait for the GPU

            x = cupy.zeros(hi - lo, cupy.float32)
            r = cupy.asarray(b[lo:hi], cupy.float32)
            p = r.copy()
            rr = dot(r, r)
            norm_b = np.sqrt(dot(r, r))
            iterations = 0
            while iterations < args.max_iter and np.sqrt(rr) > args.tol * norm_b:
                cupy.matmul(a_cols, p, out=product.values)
                ap = product()[lo:hi]                    # (A p) restricted to my columns
                alpha = rr / dot(p, ap)
                x += alpha * p
                r -= alpha * ap
                rr_next = dot(r, r)
                p = r + (rr_next / rr) * p
                rr = rr_next
                iterations += 1
            mine = cupy.asnumpy(x)
        stream.close()

    solution = np.concatenate(world.allgather(mine)).astype(np.float64)
    if rank == 0:
        exact = np.linalg.solve(a, b)
        error = np.linalg.norm(solution - exact) / np.linalg.norm(exact)
        print(f"CG on {size} ranks (matrix and vectors on the GPU, CuPy + pyar): n={n}, "
              f"{iterations} iterations, relative error vs numpy.linalg.solve {error:.2e}")
        ok = error < 1e-3
        print("OK" if ok else "FAILED")
    else:
        ok = None
    raise SystemExit(0 if world.bcast(ok) else 1)


if __name__ == "__main__":
    main()
