"""A distributed conjugate-gradient solve whose reductions go through pyar.

    mpirun -n 4 python examples/conjugate_gradient.py --n 4096

The symmetric positive definite matrix A (n x n) is split by columns: rank r
holds A[:, cols_r] and the matching piece of every vector.  A matrix-vector
product is then a sum over ranks of A[:, cols_r] @ p_r — one all-reduce of an
n-vector per iteration — and each dot product is a local partial sum followed
by an all-reduce.  The answer is checked against numpy.linalg.solve on the
whole matrix.
"""
import argparse

import numpy as np
from mpi4py import MPI

import pyar


def spd_matrix(n, seed=7):
    """A well-conditioned SPD matrix every rank can build identically."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, n)) / np.sqrt(n)
    return q @ q.T + np.eye(n) * 2.0


class DeviceSum:
    """All-reduces host float32 vectors through one registered device buffer."""

    def __init__(self, comm, length, stream):
        self.comm = comm
        self.stream = stream
        self.buffer = pyar.empty((length,), np.float32, stream=stream, ipc=True)
        comm.register(self.buffer)

    def __call__(self, values):
        self.buffer.set(np.ascontiguousarray(values, dtype=np.float32), stream=self.stream)
        self.comm.allreduce(self.buffer, out=self.buffer, stream=self.stream)
        self.comm.synchronize(self.stream)
        return self.buffer.get()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--tol", type=float, default=1e-5)
    parser.add_argument("--max-iter", type=int, default=500)
    args = parser.parse_args()

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    n = args.n
    a = spd_matrix(n)
    b = np.random.default_rng(11).standard_normal(n)
    cols = np.array_split(np.arange(n), size)[rank]
    a_cols = a[:, cols].astype(np.float32)

    with pyar.Communicator(world) as comm:
        stream = pyar.Stream()
        vector_sum = DeviceSum(comm, n, stream)
        scalar_sum = DeviceSum(comm, 4, stream)  # padded: one 16-byte vector

        def dot(u, v):
            return float(scalar_sum(np.array([u @ v, 0, 0, 0], np.float32))[0])

        x = np.zeros(len(cols), np.float32)
        r = b[cols].astype(np.float32)
        p = r.copy()
        rr = dot(r, r)
        norm_b = np.sqrt(dot(b[cols].astype(np.float32), b[cols].astype(np.float32)))
        iterations = 0
        while iterations < args.max_iter and np.sqrt(rr) > args.tol * norm_b:
            ap = vector_sum(a_cols @ p)[cols]          # (A p) restricted to my columns
            alpha = rr / dot(p, ap)
            x += alpha * p
            r -= alpha * ap
            rr_next = dot(r, r)
            p = r + (rr_next / rr) * p
            rr = rr_next
            iterations += 1
        stream.close()

    solution = np.concatenate(world.allgather(x)).astype(np.float64)
    if rank == 0:
        exact = np.linalg.solve(a, b)
        error = np.linalg.norm(solution - exact) / np.linalg.norm(exact)
        print(f"CG on {size} ranks: n={n}, {iterations} iterations, relative error vs "
              f"numpy.linalg.solve {error:.2e}")
        ok = error < 1e-3
        print("OK" if ok else "FAILED")
    else:
        ok = None
    raise SystemExit(0 if world.bcast(ok) else 1)


if __name__ == "__main__":
    main()
