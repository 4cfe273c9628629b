"""Whether the MPI library under mpi4py takes GPU device pointers in the calls
pyar's rail makes (pyar/comm/rail.py: float32 ``Iallgather`` and
``Ireduce_scatter_block`` with SUM), and in a blocking ``Allreduce`` and
``Reduce_scatter_block`` for comparison.

Each rank fills its buffers with random integer-valued float32 (exact in any
summation order) from a seed of its own, hands MPI the raw device address
(``MPI.buffer.fromaddress``, as a rail would), copies the result back and
compares it exactly with a float64 reference built from every rank's seed.

Run under mpirun with 2 or more ranks, e.g.
    mpirun -n 2 python3 scripts/check_cuda_aware_mpi.py
Device memory comes from CuPy when importable, else from pyar
(``pyar.empty(..., ipc=True)``: cuMemAlloc memory, which Open MPI's smcuda BTL
can map with CUDA IPC; pyar's default stream-ordered pool memory cannot be).
``--memory host`` runs the same checks on numpy buffers (no GPU needed).
Each operation prints START before it and PASS/FAIL after it, flushed, so a
crash inside MPI shows which operation it was; ``--ops`` runs a subset.
Exit status 0 only when every operation asked for passed on every rank.
"""
import argparse
import ctypes
import os
import sys
import time

import numpy as np
from mpi4py import MPI

OPS = ("iallgather", "ireduce_scatter_block", "allreduce", "reduce_scatter_block")
ELEMENTS = 1 << 20  # per-rank block of float32: past every eager limit, so the rendezvous path runs
# The MCA parameters that decide where device buffers go (mpirun --mca sets them so).
SETTINGS = tuple(f"OMPI_MCA_{name}"
                 for name in ("opal_cuda", "btl", "pml", "coll", "mpi_common_cuda"))
WAIT = 60.0  # seconds a non-blocking call may take before the check gives up on it


def say(comm, text):
    if comm.Get_rank() == 0:
        print(text, flush=True)


def rank_data(rank, count):
    """Rank ``rank``'s input: integer-valued float32, so every sum is exact."""
    rng = np.random.default_rng(1000 + rank)
    return rng.integers(-1000, 1000, count).astype(np.float32)


class HostMemory:
    name = "host (numpy)"

    def to_buffer(self, host):
        return host.copy()

    def address(self, buffer):
        return buffer.ctypes.data

    def to_host(self, buffer):
        return buffer.copy()

    def synchronize(self):
        pass


class CupyMemory:
    name = "device (CuPy)"

    def __init__(self, ordinal):
        import cupy
        self.cupy = cupy
        cupy.cuda.Device(ordinal).use()

    def to_buffer(self, host):
        return self.cupy.asarray(host)

    def address(self, buffer):
        return buffer.data.ptr

    def to_host(self, buffer):
        return self.cupy.asnumpy(buffer)

    def synchronize(self):
        self.cupy.cuda.Device().synchronize()


class PyarMemory:
    name = "device (pyar, ipc=True)"

    def __init__(self, ordinal):
        import pyar
        self.pyar = pyar
        self.ordinal = ordinal
        pyar.set_device(ordinal)

    def to_buffer(self, host):
        buffer = self.pyar.empty(host.shape, host.dtype, ipc=True)
        buffer.set(host)
        return buffer

    def address(self, buffer):
        return buffer.ptr

    def to_host(self, buffer):
        return buffer.get()

    def synchronize(self):
        self.pyar.Device(self.ordinal).synchronize()


def device_memory(node_rank):
    try:
        import cupy
    except ImportError:
        try:
            import pyar
        except ImportError:
            raise SystemExit("neither CuPy nor pyar is importable: no way to allocate "
                             "device memory (or run with --memory host)") from None
        count = pyar.get_device_count()
        return PyarMemory(node_rank % count) if count else None
    count = cupy.cuda.runtime.getDeviceCount()
    return CupyMemory(node_rank % count) if count else None


def mpi_view(memory, buffer, count):
    """The buffer as mpi4py sees it: a raw address and byte length, float32
    (mpi4py derives each call's counts from the length)."""
    return [MPI.buffer.fromaddress(memory.address(buffer), count * 4), MPI.FLOAT]


def finish(request):
    """Wait for ``request`` at most WAIT seconds; False if it did not complete."""
    deadline = time.monotonic() + WAIT
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-4)
    return True


def run_op(op, comm, memory):
    """(expected, got) for ``op`` on this rank, both numpy arrays."""
    size, rank = comm.Get_size(), comm.Get_rank()
    everyone = [rank_data(r, size * ELEMENTS).astype(np.float64) for r in range(size)]
    mine = rank_data(rank, size * ELEMENTS)
    total = np.sum(everyone, axis=0)
    if op == "iallgather":
        send = memory.to_buffer(mine[:ELEMENTS])
        expected = np.concatenate([data[:ELEMENTS] for data in everyone])
    else:
        send = memory.to_buffer(mine)
        expected = total if op == "allreduce" else total[rank * ELEMENTS:(rank + 1) * ELEMENTS]
    receive = memory.to_buffer(np.full(expected.shape, np.nan, np.float32))
    memory.synchronize()
    send_view = mpi_view(memory, send, ELEMENTS if op == "iallgather" else size * ELEMENTS)
    receive_view = mpi_view(memory, receive, expected.size)
    if op == "iallgather":
        done = finish(comm.Iallgather(send_view, receive_view))
    elif op == "ireduce_scatter_block":
        done = finish(comm.Ireduce_scatter_block(send_view, receive_view, op=MPI.SUM))
    elif op == "allreduce":
        done = comm.Allreduce(send_view, receive_view, op=MPI.SUM) is None
    else:
        done = comm.Reduce_scatter_block(send_view, receive_view, op=MPI.SUM) is None
    if not done:
        raise TimeoutError(f"{op} did not complete within {WAIT} s")
    memory.synchronize()
    return expected, memory.to_host(receive).astype(np.float64)


def mismatch(expected, got):
    """None when equal, else a description of the first difference."""
    wrong = np.flatnonzero(expected != got)  # NaN (never written) is unequal too
    if wrong.size == 0:
        return None
    i = wrong[0]
    return f"{wrong.size} of {expected.size} elements differ, first at {i}: " \
           f"expected {expected[i]}, got {got[i]}"


def control_catches_corruption():
    """The comparison must flag a single wrong element (its positive control)."""
    reference = rank_data(0, 16).astype(np.float64)
    corrupted = reference.copy()
    corrupted[7] += 1.0
    return mismatch(reference, reference) is None and mismatch(reference, corrupted) is not None


def library_facts():
    process = ctypes.CDLL(None)
    query = getattr(process, "MPIX_Query_cuda_support", None)
    answer = "absent" if query is None else str(query())
    version = MPI.Get_library_version().strip("\x00 \n").splitlines()[0]
    return version, answer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", choices=("device", "host"), default="device")
    parser.add_argument("--ops", default=",".join(OPS),
                        help=f"comma-separated subset of {','.join(OPS)}")
    args = parser.parse_args()
    ops = args.ops.split(",")
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        parser.error(f"unknown operations {unknown}; choose from {OPS}")

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        print("run with at least 2 ranks (mpirun -n 2 ...)", file=sys.stderr)
        return 2
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if args.memory == "host":
        memory = HostMemory()
    else:
        memory = device_memory(node.Get_rank())
    if not comm.allreduce(memory is not None, op=MPI.LAND):
        say(comm, "no GPU visible on some rank: nothing to check with --memory device")
        return 2
    version, query = library_facts()
    say(comm, f"library: {version}")
    say(comm, f"MPIX_Query_cuda_support(): {query}")
    settings = {k[len("OMPI_MCA_"):]: v for k, v in sorted(os.environ.items())
                if k.startswith(SETTINGS)}
    say(comm, f"ranks: {comm.Get_size()}, buffers: {memory.name}, "
              f"{ELEMENTS} float32 per block, MCA settings: {settings}")
    if not control_catches_corruption():
        say(comm, "FAIL the comparison does not catch a corrupted element")
        return 1

    failures = 0
    for op in ops:
        say(comm, f"START {op}")
        comm.Barrier()
        try:
            problem = mismatch(*run_op(op, comm, memory))
        except Exception as exc:  # noqa: BLE001 - any rank's error is reported, then all abort
            print(f"rank {comm.Get_rank()}: {op} raised {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            comm.Abort(1)
        problems = comm.gather(problem, root=0)
        if comm.Get_rank() == 0:
            bad = [(r, p) for r, p in enumerate(problems) if p is not None]
            for r, p in bad:
                print(f"  rank {r}: {p}", flush=True)
            print(f"{'FAIL' if bad else 'PASS'} {op}", flush=True)
        failures += comm.bcast(len(bad) if comm.Get_rank() == 0 else None, root=0) > 0
    say(comm, f"{len(ops) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
