"""HierarchicalCommunicator's own logic under mpirun without a GPU:
tests/test_hierarchical_cpu.py runs it on 6 and 8 ranks.

Its GPU side is replaced by host stand-ins: "device" memory is host memory
(a new output array too), copies are memmove, events are done at once, and
the domain's node communicator is a stand-in whose reduce_scatter and
all_gather follow the shard rule over MPI on the domain (float32 sums in
domain-rank order).  What runs for real: pyar.Communicator's split into
domains and rails and its dispatch, the pieces and their double buffers,
the shard arithmetic, the rail's sums, the rounding, the in-place path, the
argument checks, errors.  With pieces of 64 elements per rank most calls
run many pieces.

Checks, for every node size that divides the world (and leaves several
domains), fp32/fp16/bf16, counts 1, 7, 100, 1001, 2053, out of place and in
place, both rail methods:
- "allgather": bitwise equal to the sum in the documented order (domain
  rank order inside a domain, then domain order, in float32, rounded once);
- "reduce_scatter": within one rounding of the float64 sum;
- every rank's result bitwise identical;
- a call on a capturing stream raises CaptureError; algo other than "auto"
  raises ValueError; with debug=True, different sizes on different domains
  raise MismatchError on every rank;
- the last domain skips a call: every other rank raises CollectiveTimeout
  naming the inter-node step within its wait, and again on the next call;
- register and unregister hand the domain's communicator the same pieces;
  abort() closes through the domain's abort, with no MPI step.

Usage: hierarchical_pipeline_cpu.py
"""
import ctypes
import hashlib
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

from allreduce_common import bits, run

import pyar  # noqa: E402
from pyar.array import DeviceArray  # noqa: E402
from pyar.comm import arguments, hierarchical, shards  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
COUNTS = (1, 7, 100, 1001, 2053)
TIMEOUT = 0.5  # the rail's wait
SLACK = 10.0


def host_view(ptr, count, dtype):
    return np.frombuffer((ctypes.c_uint8 * (count * dtype.itemsize)).from_address(ptr),
                         dtype) if count else np.empty(0, dtype)


def device_array(host):
    """A DeviceArray over host memory (kept alive by the array)."""
    return DeviceArray.from_pointer(host.ctypes.data, host.shape, host.dtype, owner=host,
                                    device=0)


class FakeStream:
    def __init__(self, capturing=False):
        self.handle = 1 if capturing else 0
        self.is_capturing = capturing

    def close(self):
        pass


class FakeEvent:
    def __init__(self, timing=True):
        pass

    def record(self, stream=None):
        return self

    def synchronize(self):
        pass


class FakeDevice:
    def __init__(self, ordinal):
        self.pci_bus_id = "0000:00:00.0"  # one GPU for every rank
        self.multiprocessor_count = 1


class FakeHip:
    Stream = FakeStream
    Event = FakeEvent
    Device = FakeDevice

    @staticmethod
    def platform():
        return "cuda"

    @staticmethod
    def as_stream(stream):
        return stream if isinstance(stream, FakeStream) else FakeStream()

    @staticmethod
    def memcpy_dtoh(dst, src, stream=None):
        view = memoryview(dst).cast("B")
        if view.nbytes:
            ctypes.memmove(np.frombuffer(view, np.uint8).ctypes.data, src, view.nbytes)

    @staticmethod
    def memcpy_htod(dst, src, stream=None):
        view = memoryview(src).cast("B")
        if view.nbytes:
            ctypes.memmove(dst, np.frombuffer(view, np.uint8).ctypes.data, view.nbytes)

    @staticmethod
    def memcpy_dtod(dst, src, size, stream=None):
        ctypes.memmove(dst, src, size)

    @staticmethod
    def set_device(device):
        pass

    @staticmethod
    def get_device_count():
        return 8


class FakeMemory:
    def __init__(self, size):
        self.host = np.zeros(size, np.uint8)
        self.ptr = self.host.ctypes.data
        self.device = 0


class FakeResources:
    def __init__(self, device):
        self.device = device

    def device_memory(self, size):
        return FakeMemory(size)

    def pinned_memory(self, size):
        return bytearray(size)

    def release(self):
        pass


class FakeLocal:
    """The domain's communicator, made as NodeCommunicator is, over ``node``
    (the domain's BoundedComm, which it owns): reduce_scatter / all_gather by
    the shard rule over MPI on the domain, float32 sums in rank order."""
    _foreign = None  # what pyar.comm.operations' argument checks read of a communicator

    def __init__(self, node, device, max_size, timeout, *, kernels, debug, gpu_sharers):
        self.node = node
        self.rank, self.world = node.Get_rank(), node.Get_size()
        # The data moves unbounded, as the kernels' would: a domain is a run
        # of the world's ranks in order (one node).
        me = MPI.COMM_WORLD.Get_rank()
        self.comm = MPI.COMM_WORLD.Split(me // self.world, key=me)
        assert self.comm.Get_rank() == self.rank, "the domain's ranks are not in world order"
        assert device == MPI.COMM_WORLD.Get_rank(), "not the node's GPUs in turn"
        assert gpu_sharers == MPI.COMM_WORLD.Get_size(), "not every rank on the GPU counted"
        self.device, self.max_size, self.timeout = 0, max_size, timeout
        self.debug = bool(debug)
        self.registered = []
        self.aborted = False

    def load_module(self, name):
        return name

    def reduce_scatter(self, x, out, stream):
        lo, hi = shards.bounds(x.size, self.world, x.dtype.itemsize, self.rank)
        assert out.size == hi - lo and out.dtype == np.float32, (out.size, hi - lo, out.dtype)
        everyone = self.comm.allgather(host_view(x.ptr, x.size, x.dtype).copy())
        total = host_view(out.ptr, out.size, out.dtype)
        total[...] = 0
        for part in everyone:
            total += part[lo:hi].astype(np.float32)

    def all_gather(self, x, out, stream):
        lo, hi = shards.bounds(out.size, self.world, out.dtype.itemsize, self.rank)
        assert x.size == hi - lo and x.dtype == out.dtype
        host_view(out.ptr, out.size, out.dtype)[...] = np.concatenate(
            self.comm.allgather(host_view(x.ptr, x.size, x.dtype).copy()))

    def synchronize(self, stream=None):
        pass

    def register(self, x):
        self.registered.append((x.ptr, x.size))

    def unregister(self, x):
        self.registered.remove((x.ptr, x.size))

    def close(self):
        self.comm.Free()
        self.node.Free()

    def abort(self):
        self.aborted = True
        self.node.abandon()


def inputs(dtype, n, rank, key):
    return np.random.default_rng([7, key, rank, n]).standard_normal(n, np.float32).astype(dtype)


def documented_order(sc, comm, dtype, n, key):
    """The sum as the allgather method forms it: float32, domain-rank order
    inside each domain, then domain order; rounded once."""
    k = comm.local.world
    total = np.zeros(n, np.float32)
    for first in range(0, sc.world, k):
        domain = np.zeros(n, np.float32)
        for r in range(first, first + k):
            domain += inputs(dtype, n, r, key).astype(np.float32)
        total += domain
    return total.astype(dtype)


def check_sums(sc, comm, shape):
    calls = 0
    for method in ("allgather", "reduce_scatter"):
        comm.rail_method = method
        for dtype in DTYPES:
            for n in COUNTS:
                key = n * 31 + comm.local.world
                host = inputs(dtype, n, sc.rank, key)
                x = device_array(host.copy())
                y = comm.allreduce(x)
                inplace = device_array(host.copy())
                comm.allreduce(inplace, out=inplace)
                got = host_view(y.ptr, n, dtype)
                what = f"{shape} {method} {dtype} n={n}"
                sc.check(np.array_equal(bits(host_view(inplace.ptr, n, dtype)), bits(got)),
                         f"{what}: in place differs")
                sc.check(np.array_equal(bits(host_view(x.ptr, n, dtype)), bits(host)),
                         f"{what}: the input changed")
                want = documented_order(sc, comm, dtype, n, key)
                if method == "allgather":
                    sc.check(np.array_equal(bits(got), bits(want)),
                             f"{what}: not the documented order's bits")
                else:
                    ulp = np.abs(want.astype(np.float64)) * (2.0 ** -8) + 1e-6
                    sc.check(np.all(np.abs(got.astype(np.float64) - want) <= ulp),
                             f"{what}: off by more than a rounding")
                digest = hashlib.sha256(bits(got).tobytes()).hexdigest()
                sc.check(len(set(sc.mpi.allgather(digest))) == 1, f"{what}: ranks differ")
                calls += 2
    return calls


def check_errors(sc, comm, shape):
    x = device_array(np.ones(8, np.float32))
    sc.expect_raises(hierarchical.CaptureError,
                     lambda: comm.allreduce(x, stream=FakeStream(capturing=True)),
                     f"{shape}: a call on a capturing stream", contains=("cannot be captured",))
    sc.expect_raises(hierarchical.CaptureError, lambda: comm.capture(FakeStream()),
                     f"{shape}: capture()")
    sc.expect_raises(ValueError, lambda: comm.allreduce(x, algo="oneshot"),
                     f"{shape}: algo='oneshot'", contains=("'auto'",))


def check_debug(sc, k):
    """debug=True: ranks on different domains passing different sizes raise
    MismatchError on every rank before anything moves; agreeing calls work."""
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=30.0, node_size=k, debug=True)
    last = sc.world - 1
    x = device_array(np.ones(100 + (sc.rank == last), np.float32))
    sc.expect_raises(pyar.MismatchError, lambda: comm.allreduce(x), "sizes differ (debug)",
                     contains=("100", "101", f"ranks [{last}]"))
    x = device_array(np.ones(100, np.float32))
    y = comm.allreduce(x)
    sc.check(np.array_equal(host_view(y.ptr, 100, np.dtype(np.float32)),
                            np.full(100, sc.world, np.float32)), "debug: wrong sum")
    comm.close()


def check_timeout(sc, k, inter_node="host"):
    """On the ``inter_node`` data path (tests/mpi/inter_node_cpu.py: "device")."""
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=TIMEOUT, node_size=k,
                             inter_node=inter_node)
    sc.check(comm.inter_node == inter_node, f"took the {comm.inter_node!r} path")
    x = device_array(np.ones(100, np.float32))
    y = comm.allreduce(x)
    sc.check(np.array_equal(host_view(y.ptr, 100, np.dtype(np.float32)),
                            np.full(100, sc.world, np.float32)), "wrong sum before the skip")
    sc.mpi.Barrier()
    if comm.domain != comm.domains - 1:
        started = time.monotonic()
        error = sc.expect_raises(CollectiveTimeout, lambda: comm.allreduce(x),
                                 "the last domain skipped a call",
                                 contains=("allreduce call 2", "inter-node step"))
        elapsed = time.monotonic() - started
        sc.check(TIMEOUT * 0.9 <= elapsed < TIMEOUT + SLACK,
                 f"raised after {elapsed:.2f} s")
        again = sc.expect_raises(CollectiveTimeout, lambda: comm.allreduce(x), "the next call")
        sc.check(again is error, "the next call raised another error")
    comm.close()
    sc.check(comm.closed, "not closed")


def check_registration_and_abort(sc, k):
    """register and unregister hand the domain's communicator the same pieces;
    abort() gives up through the domain's abort and closes, with no MPI step
    (the ranks abort at different times here)."""
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=30.0, node_size=k)
    x = device_array(np.ones(1000, np.float32))
    comm.register(x)
    pieces = list(comm.local.registered)
    sc.check(sum(size for _, size in pieces) == x.size and len(pieces) > 1,
             f"registered pieces {pieces}")
    y = comm.allreduce(x, out=x)
    sc.check(np.array_equal(host_view(y.ptr, 1000, np.dtype(np.float32)),
                            np.full(1000, sc.world, np.float32)), "wrong sum, registered")
    comm.unregister(x)
    sc.check(comm.local.registered == [], f"left registered: {comm.local.registered}")
    time.sleep(0.01 * sc.rank)
    comm.abort()
    sc.check(comm.closed and comm.local.aborted, "abort did not close or abort the domain's")
    sc.expect_raises(ValueError, lambda: comm.allreduce(x), "a call after abort",
                     contains=("closed",))
    comm.abort()  # again: nothing to do


def use_stand_ins():
    """HierarchicalCommunicator on the stand-ins, pieces of 64 elements per
    rank; a new output array is host memory."""
    hierarchical._hip = FakeHip
    hierarchical.NodeCommunicator = FakeLocal
    hierarchical.Resources = FakeResources
    hierarchical.PIECE_SHARD_ELEMENTS = 64
    arguments.empty = lambda shape, dtype, stream=None: device_array(np.zeros(shape, dtype))


def main(sc):
    use_stand_ins()
    calls = 0
    sizes = [k for k in range(1, sc.world) if sc.world % k == 0]
    for k in sizes:
        shape = f"{sc.world // k}x{k}"
        comm = pyar.Communicator(MPI.COMM_WORLD, timeout=30.0, node_size=k)
        sc.check((comm.world, comm.rank, comm.domains, comm.local.world) ==
                 (sc.world, sc.rank, sc.world // k, k), f"{shape}: {comm!r}")
        calls += check_sums(sc, comm, shape)
        check_errors(sc, comm, shape)
        comm.close()
    check_registration_and_abort(sc, sizes[-1])
    check_debug(sc, sizes[-1])
    check_timeout(sc, sizes[-1])  # last: the failed rails stay behind
    sc.report(test="hierarchical-pipeline", shapes=len(sizes), calls=calls)


if __name__ == "__main__":
    run("hierarchical_pipeline_cpu", main)
