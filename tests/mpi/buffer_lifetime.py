"""Registered buffers' lifetime and read-only outputs on real ranks.

Modes:
  unregister  (2 and 4 ranks) for fp32 and bf16:
              - a registered buffer x is all-reduced twice into the same out
                (the second call replays its plan), then, with a random rank
                delayed by a spin kernel, ROUNDS more registered calls are
                queued and unregister(x) follows at once, without a host
                sync: it must wait for them before unmapping (every result
                checked afterwards);
              - after unregister the communicator no longer holds x (a weak
                reference to its memory dies with the last user reference),
                x is freed, and a buffer of the same size is allocated (at the
                same address on the ranks listed in the row) with new random
                data: its all-reduce into the same out (the signature the plan
                was cached under) sums the new data; then it is registered
                itself and summed again in place of the old.
              - a buffer a comm.capture() graph reads in place: unregister is
                refused on every rank while the graph is open, and accepted
                once it is closed.
  keepalive   (2 ranks) a registered buffer dropped without unregister stays
              alive (its memory is not freed until close()), so a new buffer
              of the same size gets another address and sums correctly; after
              close() the old memory is gone.
  readonly    (2 ranks) device memory exported read-only by a producer
              (a versioned DLPack capsule with READ_ONLY, the array
              interface's read-only bit, a JAX-like array that marks nothing):
              refused as allreduce's out and allreduce_rmsnorm's out/residual
              on every rank with nothing written; accepted (and summed
              correctly) as an input.

Every result is checked against the float64 reference of every rank's
random input (tests/mpi/checked_sums.py).

Usage: buffer_lifetime.py unregister | keepalive | readonly
"""
import gc
import weakref

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar.array import DeviceArray, _dlpack
from allreduce_common import bits, run
from checked_sums import RandomSum
from tests.gpu_kernels import GpuTestKernels
from tests.readonly_exports import DLPackExport, InterfaceExport, JaxLikeExport

N = (1 << 18) + 5
ROUNDS = 20
DELAY_US = 2000


def expect_sum(sc, comm, y, data, stream, what):
    comm.synchronize(stream)
    bad = data.wrong(y.get(stream=stream))
    sc.check(bad == 0, f"{what}: {bad} of {N} elements beyond the float64 reference's bound")
    return bad


class Allocation:
    """Device memory for a buffer to register, owned by an object a weak
    reference can watch: it is freed when this object goes."""

    def __init__(self, nbytes):
        self.memory = pyar.DeviceMemory(nbytes)


def registrable(host, stream):
    """A copy of ``host`` in hipMalloc memory (registrable), and a weak
    reference to what owns that memory."""
    owner = Allocation(host.nbytes)
    x = DeviceArray.from_pointer(owner.memory.ptr, host.shape, host.dtype, owner=owner,
                                 device=owner.memory.device, stream=stream)
    x.set(host)
    return x, weakref.ref(owner)


def not_registered(sc, comm, x, what):
    """Check that ``x`` is no longer registered: unregistering it again
    (collective, every rank alike) is refused as never registered."""
    sc.expect_raises(ValueError, lambda: comm.unregister(x), what,
                     contains=("not registered",))


def unregister_mode(sc):
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    kernels = GpuTestKernels(comm.device)
    stream = pyar.Stream()
    wrong = calls = 0
    reused = []
    for d, dtype in enumerate((np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))):
        data = RandomSum(dtype, N, sc.rank, sc.world, d, 0)
        x, memory = registrable(data.mine, stream)
        out = pyar.empty((N,), dtype, stream=stream)
        comm.register(x)
        for call in range(2):
            comm.allreduce(x, out=out, stream=stream)
            wrong += expect_sum(sc, comm, out, data, stream, f"{dtype.name} registered {call}")
            calls += 1
        # Queued, not waited for: unregister must let them finish first.
        outs = [pyar.empty((N,), dtype, stream=stream) for _ in range(ROUNDS)]
        delayed = np.random.default_rng([d, 1]).integers(0, sc.world, ROUNDS)
        for r in range(ROUNDS):
            if delayed[r] == sc.rank:
                kernels.spin(DELAY_US, stream=stream)
            comm.allreduce(x, out=outs[r], stream=stream)
        comm.unregister(x)
        for r in range(ROUNDS):
            wrong += expect_sum(sc, comm, outs[r], data, stream,
                                f"{dtype.name} call {r} queued before unregister")
        calls += ROUNDS
        not_registered(sc, comm, x, f"{dtype.name}: x is still read in place after unregister")
        address = x.ptr
        del x
        gc.collect()
        sc.check(memory() is None, f"{dtype.name}: the communicator still keeps x alive")

        fresh = RandomSum(dtype, N, sc.rank, sc.world, d, 2)
        x, _ = registrable(fresh.mine, stream)
        reused.append(x.ptr == address)
        comm.allreduce(x, out=out, stream=stream)  # the signature of the cached plan
        wrong += expect_sum(sc, comm, out, fresh, stream,
                            f"{dtype.name}: a new buffer where an unregistered one was")
        comm.register(x)
        comm.allreduce(x, out=out, stream=stream)
        wrong += expect_sum(sc, comm, out, fresh, stream, f"{dtype.name}: the new one registered")
        comm.unregister(x)
        calls += 2

    # A graph reading a registered buffer in place holds it.
    data = RandomSum(np.float32, N, sc.rank, sc.world, 9)
    x = pyar.asarray(data.mine, stream=stream, ipc=True)
    out = pyar.empty((N,), np.float32, stream=stream)
    comm.register(x)
    with comm.capture(stream) as graph:
        comm.allreduce(x, out=out, stream=stream)
    graph.replay()
    wrong += expect_sum(sc, comm, out, data, stream, "the graph's replay")
    calls += 1
    sc.expect_raises(ValueError, lambda: comm.unregister(x), "unregister under an open graph",
                     contains=("still open",))
    graph.close()
    comm.unregister(x)
    not_registered(sc, comm, x, "unregister after graph.close()")
    comm.close()
    everywhere = sc.mpi.allgather(reused)
    sc.report(test="unregister", calls=calls, wrong=sc.sum(wrong),
              address_reused=[[r for r, same in enumerate(everywhere) if same[i]]
                              for i in range(len(reused))],
              failed_checks=sc.sum(sc.failures))


def keepalive_mode(sc):
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    stream = pyar.Stream()
    data = RandomSum(np.float32, N, sc.rank, sc.world, 0)
    x, memory = registrable(data.mine, stream)
    comm.register(x)
    wrong = expect_sum(sc, comm, comm.allreduce(x, stream=stream), data, stream, "registered")
    address = x.ptr
    del x
    gc.collect()
    sc.check(memory() is not None, "a registered buffer dropped without unregister was freed")
    fresh = RandomSum(np.float32, N, sc.rank, sc.world, 1)
    y = pyar.asarray(fresh.mine, stream=stream, ipc=True)
    sc.check(y.ptr != address, "a new buffer took the address of a registered one still alive")
    wrong += expect_sum(sc, comm, comm.allreduce(y, stream=stream), fresh, stream,
                        "a new buffer beside a dropped registered one")
    comm.close()
    gc.collect()
    sc.check(memory() is None, "the dropped registered buffer outlived close()")
    sc.report(test="keepalive", calls=2, wrong=sc.sum(wrong), failed_checks=sc.sum(sc.failures))


def read_only_exports(memory, shape, dtype, device):
    kind = _dlpack.kDLROCM if pyar.platform() == "hip" else _dlpack.kDLCUDA
    return {
        "dlpack-flag": DLPackExport(memory.ptr, shape, dtype, device=(kind, device),
                                    owner=memory),
        "interface-bit": InterfaceExport(memory.ptr, shape, dtype, owner=memory),
        "jax": JaxLikeExport(memory.ptr, shape, dtype, device=(kind, device), owner=memory),
    }


def readonly_mode(sc):
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    stream = pyar.Stream()
    x = pyar.asarray(RandomSum(np.float32, N, sc.rank, sc.world, 0).mine, stream=stream)
    target = pyar.asarray(np.full(N, 7.0, np.float32), stream=stream)
    stream.synchronize()
    refused = wrong = 0
    for name, export in read_only_exports(target, (N,), np.float32, comm.device).items():
        view = pyar.asarray(export, stream=stream)
        sc.check(view.readonly and view.ptr == target.ptr, f"{name}: not a read-only view")
        error = sc.expect_raises(ValueError, lambda: comm.allreduce(x, out=export, stream=stream),
                                 f"{name} as out", contains=("read-only",))
        refused += error is not None
        y = comm.allreduce(export, stream=stream)  # only read: accepted
        comm.synchronize(stream)
        exact = np.array_equal(bits(y.get(stream=stream)),
                               bits(np.full(N, 7.0 * sc.world, np.float32)))
        sc.check(exact, f"{name} as an input: wrong sum")
        wrong += not exact
    sc.check(np.array_equal(bits(target.get(stream=stream)), bits(np.full(N, 7.0, np.float32))),
             "a read-only output was written")

    tokens, hidden = 8, 1024
    rows = pyar.asarray(np.ones((tokens, hidden), np.float16), stream=stream)
    weight = pyar.asarray(np.ones(hidden, np.float16), stream=stream)
    held = pyar.asarray(np.full((tokens, hidden), 3.0, np.float16), stream=stream)
    stream.synchronize()
    for name, export in read_only_exports(held, (tokens, hidden), np.float16,
                                          comm.device).items():
        residual = pyar.empty((tokens, hidden), np.float16, stream=stream)
        for what, call in (
                ("out", lambda: comm.allreduce_rmsnorm(rows, residual, weight, out=export,
                                                       stream=stream)),
                ("residual updated in place", lambda: comm.allreduce_rmsnorm(
                    rows, export, weight, stream=stream))):
            error = sc.expect_raises(ValueError, call, f"allreduce_rmsnorm: {name} as {what}",
                                     contains=("read-only",))
            refused += error is not None
    comm.synchronize(stream)
    sc.check(np.array_equal(held.get(stream=stream), np.full((tokens, hidden), 3.0, np.float16)),
             "a read-only allreduce_rmsnorm output was written")
    comm.close()
    sc.report(test="readonly", refused=sc.sum(refused), wrong=sc.sum(wrong),
              failed_checks=sc.sum(sc.failures))


def main(sc):
    {"unregister": unregister_mode, "keepalive": keepalive_mode,
     "readonly": readonly_mode}[sc.argv[0]](sc)


if __name__ == "__main__":
    run("buffer_lifetime", main)
