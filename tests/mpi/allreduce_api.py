"""The Communicator's API on the GPU: bad arguments raise on every rank (and
leave the communicator usable), the forms a stream may take, shapes, closing;
on one rank (mpirun -n 1) an all-reduce is a copy and in place a no-op.

Bad arguments, each raised on every rank before anything is launched:
  int32 / float64 input -> TypeError; a numpy (host) input or out -> TypeError;
  out of another shape or dtype -> ValueError; an unknown algo -> ValueError;
  an out that is not 16-byte aligned (a view one element into a buffer) ->
  ValueError; an out partially overlapping the input -> ValueError;
  registering a misaligned buffer -> ValueError; one-shot in place over a
  registered input -> ValueError (world > 1); a closed communicator ->
  ValueError for allreduce, register and synchronize.
Works: a misaligned input (staged), a 2-d array, an empty array, streams given
as a pyar.Stream, an int handle, an object with __cuda_stream__, or None.

Mode "stale-registration" (world > 1): a registered buffer is freed and a new
one of the same size is allocated, typically at the same address; an
all-reduce of the new buffer must sum its contents, not what a peer mapped
when the old one was registered.

Usage: allreduce_api.py [stale-registration]
"""
import numpy as np
from mpi4py import MPI

import pyar
from pyar.array import DeviceArray
from allreduce_common import ALGOS, DTYPES, bits, describe_difference, normal, run


class StreamLike:
    """A foreign stream: only the __cuda_stream__ protocol."""

    def __init__(self, stream):
        self._stream = stream

    def __cuda_stream__(self):
        return (0, self._stream.handle)


def expect_sum(sc, comm, y, want, stream, what):
    """Wait for ``y`` and check it holds exactly ``want``."""
    comm.synchronize(stream)
    got = y.get(stream=stream)
    if got.shape != want.shape:
        sc.check(False, f"{what}: shape {got.shape}, expected {want.shape}")
    elif not np.array_equal(bits(got), bits(want)):
        sc.check(False, f"{what}: {describe_difference(got.reshape(-1), want.reshape(-1))}")


def bad_arguments(sc, comm, stream):
    W = sc.world
    n = 1000
    f32 = np.float32
    x = pyar.asarray(np.ones(n, f32), stream=stream)
    want = np.full(n, W, f32)
    expect_sum(sc, comm, comm.allreduce(x, stream=stream), want, stream, "first call")

    raises = sc.expect_raises
    raises(TypeError, lambda: comm.allreduce(pyar.asarray(np.ones(n, np.int32)), stream=stream),
           "int32 input")
    raises(TypeError, lambda: comm.allreduce(pyar.asarray(np.ones(n, np.float64)),
                                             stream=stream), "float64 input")
    raises(TypeError, lambda: comm.allreduce(np.ones(n, f32), stream=stream), "numpy input")
    raises(TypeError, lambda: comm.allreduce(x, out=np.empty(n, f32), stream=stream),
           "numpy out")
    raises(ValueError, lambda: comm.allreduce(x, out=pyar.empty((n - 1,), f32), stream=stream),
           "out of another shape")
    raises(ValueError, lambda: comm.allreduce(x, out=pyar.empty((n // 2, 2), f32),
                                              stream=stream), "out of another (2-d) shape")
    raises(ValueError, lambda: comm.allreduce(x, out=pyar.empty((n,), np.float16),
                                              stream=stream), "out of another dtype")
    for algo in ("threeshot", None, "ONESHOT"):
        raises(ValueError, lambda: comm.allreduce(x, algo=algo, stream=stream), f"algo={algo!r}")

    # Views into a larger buffer: one element in (misaligned), four in (overlapping).
    big = pyar.empty((2 * n + 8,), f32, stream=stream)
    big.set(np.ones(2 * n + 8, f32), stream=stream)

    def view(elements, count=n):
        return DeviceArray.from_pointer(big.ptr + 4 * elements, (count,), f32, owner=big,
                                        device=big.device, stream=stream)

    raises(ValueError, lambda: comm.allreduce(x, out=view(1), stream=stream),
           "misaligned out", contains=("aligned",))
    raises(ValueError, lambda: comm.allreduce(view(0), out=view(4), stream=stream),
           "partially overlapping out", contains=("overlap",))
    raises(ValueError, lambda: comm.register(view(1)), "registering a misaligned buffer",
           contains=("aligned",))
    # A misaligned input is fine when staged.
    y = pyar.empty((n,), f32, stream=stream)
    expect_sum(sc, comm, comm.allreduce(view(1), out=y, stream=stream), want, stream,
               "misaligned (staged) input")

    if W > 1:
        r = pyar.asarray(np.ones(n, f32), stream=stream, ipc=True)
        comm.register(r)
        raises(ValueError, lambda: comm.allreduce(r, out=r, algo="oneshot", stream=stream),
               "one-shot in place over a registered input")
        # auto picks two-shot for it; two-shot is allowed
        for algo in ("auto", "twoshot"):
            r.set(np.ones(n, f32), stream=stream)
            expect_sum(sc, comm, comm.allreduce(r, out=r, algo=algo, stream=stream), want,
                       stream, f"registered in place, {algo}")
        comm.register(r)  # a second registration of the same buffer is harmless
        r.set(np.ones(n, f32), stream=stream)
        expect_sum(sc, comm, comm.allreduce(r, algo="oneshot", stream=stream), want, stream,
                   "registered twice, one-shot out of place")
        keep_registered.append(r)

    # Shapes: 2-d and empty.
    x2 = pyar.asarray(np.ones((8, 125), f32), stream=stream)
    for algo in ALGOS + ("auto",):
        y2 = comm.allreduce(x2, algo=algo, stream=stream)
        sc.check(y2.shape == (8, 125), f"2-d: out shape {y2.shape}")
        expect_sum(sc, comm, y2, np.full((8, 125), W, f32), stream, f"2-d {algo}")
    z = pyar.empty((0,), f32, stream=stream)
    for algo in ALGOS:
        out = comm.allreduce(z, algo=algo, stream=stream)
        sc.check(out.shape == (0,) and out.dtype == z.dtype, f"empty input: out {out!r}")

    # Streams: a pyar.Stream, its int handle, __cuda_stream__, None (legacy default).
    for form, s in (("Stream", stream), ("int handle", stream.handle),
                    ("__cuda_stream__", StreamLike(stream)), ("None", None)):
        for algo in ALGOS:
            y = pyar.empty((n,), f32, stream=stream)
            stream.synchronize()
            out = comm.allreduce(x, out=y, algo=algo, stream=s)
            comm.synchronize(s)
            sc.check(np.array_equal(y.get(stream=stream), want), f"stream given as {form}, {algo}")
            sc.check(out is y, "allreduce did not return its out")

    # After all those errors the ranks are still in step.
    for dtype in DTYPES:
        xd = pyar.asarray(np.ones(4099, dtype), stream=stream)
        for algo in ALGOS:
            expect_sum(sc, comm, comm.allreduce(xd, algo=algo, stream=stream),
                       np.full(4099, W, dtype), stream, f"after the errors, {dtype.name} {algo}")


keep_registered = []


def single_rank(sc, comm, stream):
    """World size 1: a copy; in place, nothing."""
    for d, dtype in enumerate(DTYPES):
        for n in (1, 7, 4095, (1 << 20) + 3):
            host = normal(dtype, n, 77, d, n)
            x = pyar.asarray(host, stream=stream, ipc=True)
            for algo in ALGOS + ("auto",):
                y = comm.allreduce(x, algo=algo, stream=stream)
                expect_sum(sc, comm, y, host, stream, f"world 1 copy {dtype.name} n={n} {algo}")
                sc.check(y.ptr != x.ptr, "world 1: out of place returned the input")
                same = comm.allreduce(x, out=x, algo=algo, stream=stream)
                sc.check(same is x, "world 1: in place did not return x")
                expect_sum(sc, comm, x, host, stream, f"world 1 in place {dtype.name} n={n}")
            comm.register(x)  # nothing to exchange
            expect_sum(sc, comm, comm.allreduce(x, stream=stream), host, stream,
                       f"world 1 registered {dtype.name} n={n}")


def closed(sc, stream):
    x = pyar.asarray(np.ones(16, np.float32), stream=stream)
    with pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0) as comm:
        sc.check(not comm.closed, "a new communicator says it is closed")
        expect_sum(sc, comm, comm.allreduce(x, stream=stream), np.full(16, sc.world, np.float32),
                   stream, "context-managed communicator")
    sc.check(comm.closed, "the context manager did not close the communicator")
    sc.check("closed" in repr(comm), f"repr of a closed communicator: {comm!r}")
    sc.expect_raises(ValueError, lambda: comm.allreduce(x, stream=stream), "allreduce after close",
                     contains=("closed",))
    sc.expect_raises(ValueError, lambda: comm.register(x), "register after close")
    sc.expect_raises(ValueError, lambda: comm.synchronize(stream), "synchronize after close")
    comm.close()  # twice is fine


def api(sc):
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    sc.check((comm.rank, comm.world) == (sc.rank, sc.world),
             f"rank/world {(comm.rank, comm.world)} != MPI's {(sc.rank, sc.world)}")
    sc.check(comm.max_size == 1 << 20 and comm.timeout == 30.0,
             f"max_size {comm.max_size}, timeout {comm.timeout}")
    sc.check(comm.device == sc.rank % pyar.get_device_count(), f"device {comm.device}")
    sc.check(f"rank {sc.rank} of {sc.world}" in repr(comm), f"repr {comm!r}")
    stream = pyar.Stream()
    bad_arguments(sc, comm, stream)
    if sc.world == 1:
        single_rank(sc, comm, stream)
    comm.close()
    keep_registered.clear()
    closed(sc, stream)
    sc.report(test="api", calls=0, mismatches=sc.sum(sc.failures))


def stale_registration(sc):
    """Free a registered buffer, allocate one of the same size (often at the
    same address), all-reduce it: the result must be the new contents' sum."""
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    stream = pyar.Stream()
    n = 1 << 16
    old = pyar.asarray(np.full(n, 1, np.float32), stream=stream, ipc=True)
    comm.register(old)
    expect_sum(sc, comm, comm.allreduce(old, stream=stream), np.full(n, sc.world, np.float32),
               stream, "registered buffer")
    address = old.ptr
    del old  # frees the memory that peers still have mapped
    new = pyar.asarray(np.full(n, 2, np.float32), stream=stream, ipc=True)
    reused = sc.mpi.allgather(new.ptr == address)
    y = comm.allreduce(new, algo="oneshot", stream=stream)
    comm.synchronize(stream)
    got = y.get(stream=stream)
    want = np.full(n, 2 * sc.world, np.float32)
    sc.check(np.array_equal(got, want),
             f"a new buffer at {'the same' if new.ptr == address else 'another'} address as a "
             f"freed registered one: {describe_difference(got, want)}")
    comm.close()
    sc.report(test="stale-registration", calls=1, mismatches=sc.sum(sc.failures),
              address_reused_on_ranks=[r for r, same in enumerate(reused) if same])


def main(sc):
    if sc.argv and sc.argv[0] == "stale-registration":
        stale_registration(sc)
    else:
        api(sc)


if __name__ == "__main__":
    run("allreduce_api", main)
