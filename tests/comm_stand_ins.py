"""Stand-ins for the parts of a node communicator, so the CPU tier runs the
planner and the whole call path without a GPU.

* ``geometry()`` is a plan.NodeGeometry with made-up, 16-byte-aligned
  addresses (nothing is dereferenced);
* ``RecordingModule`` stands in for a loaded code object and records the
  functions asked of it (a real kernels.KernelSet over it shows which
  entry points the host looks up, and how often);
* ``RecordingKernels`` stands in for a kernels.KernelSet: each entry point
  it hands out is a ``RecordingFunction`` that keeps its ``launch`` calls,
  named as the real one is (kernels.allreduce_name and friends);
* ``assemble()`` builds a real NodeCommunicator over them with
  ``NodeCommunicator.assemble``: a node stand-in for the bounded MPI
  communicator, a connection stand-in holding the geometry, the kernels, a
  registry stand-in and a real error record (ctypes words the test may
  write, as a kernel would), and a resources stand-in;
* ``RecordingSequence`` records what a plan is compiled from and each
  replay; the ``sequences`` fixture makes the communicator compile into it
  (it replaces the LaunchSequence the per-call path uses);
* arrays are ``DeviceArray.from_pointer`` on made-up addresses with
  ``device`` given, which makes no GPU call;
* the ``capturing`` fixture stands in for created streams and whether
  they capture, ``captured_graph()`` for a graph a ``comm.capture()`` block
  left open.
"""
import contextlib
import ctypes
import types

import ml_dtypes
import numpy as np
import pytest

import pyar
from pyar import _hip
from pyar.comm import _eager, algorithms, kernels
from pyar.comm.communicator import NodeCommunicator
from pyar.comm.plan import NodeGeometry

F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
BF16 = np.dtype(ml_dtypes.bfloat16)

STATE, STAGED_TABLE, BUFFER = 0x5200_0000_0000, 0x5100_0000_0000, 0x5000_0000_0000
SIGNAL_BYTES = 0x1000
# The LL region, past the lamport region (its address is all a plan reads).
LL_REGION = 0x5000_4000_0000


def geometry(world=4, rank=0, max_size=4096, **overrides):
    """A NodeGeometry of ``world`` ranks whose buffer starts at BUFFER: the
    signals, then ``max_size`` bytes of scratch, of partial buffer, then the
    lamport region and, at LL_REGION, the LL region (the layout of
    pyar.comm.connection)."""
    scratch = BUFFER + SIGNAL_BYTES
    fields = dict(
        world=world, rank=rank, max_size=max_size, threads=512, max_blocks=256,
        allreduce_blocks=3, shard_blocks=3,
        fused_blocks={(variant, dtype): 16
                      for variant in (*algorithms.FUSED_VARIANTS, algorithms.SPLIT,
                                      algorithms.LAMPORT)
                      for dtype in kernels.DTYPE_NAMES},
        local_blocks=264, shared_gpu=False, state=STATE, staged_table=STAGED_TABLE,
        scratch=scratch, partial=scratch + max_size, failed_word=BUFFER + 0x800,
        lamport_region=scratch + 2 * max_size,
        lamport_bytes=min(algorithms.LAMPORT_SEGMENT_BYTES, max_size),
        ll_region=LL_REGION, ll_bytes=min(algorithms.LL_MAX_BYTES, max_size), timeout_ns=10**9)
    fields.update(overrides)
    return NodeGeometry(**fields)


class RecordingFunction:
    """A loaded kernel that records its launches: (grid, block, args, stream)."""

    def __init__(self, name="kernel", argtypes=kernels.ALLREDUCE_ARGS):
        self.name, self.argtypes = name, tuple(argtypes)
        self.launches = []

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        self.launches.append((grid, block, tuple(args), stream))

    def max_active_blocks_per_multiprocessor(self, threads):
        return 2


class RecordingModule:
    """A loaded code object (pyar._hip.Module) that records each function
    asked of it: ``requests`` holds (name, argument types) in order."""

    def __init__(self):
        self.requests = []

    def get_function(self, name, argtypes=()):
        self.requests.append((name, tuple(argtypes)))
        return RecordingFunction(name, argtypes)


class RecordingKernels:
    """A KernelSet of recording functions for ``world`` ranks; ``rows`` is
    the row kernels' stand-in (fused calls need one).  ``functions`` maps
    each entry point's name to its function."""

    def __init__(self, world=4, rows=None):
        self.world, self.rows = world, rows
        self.functions = {}

    def _get(self, name, argtypes):
        if name not in self.functions:
            self.functions[name] = RecordingFunction(name, argtypes)
        return self.functions[name]

    def allreduce(self, algo, dtype):
        return self._get(kernels.allreduce_name(algo, dtype, self.world),
                         kernels.allreduce_args(algo))

    def shard(self, operation, dtype, out_dtype):
        return self._get(kernels.shard_name(operation, dtype, out_dtype, self.world),
                         kernels.SHARD_ARGS)

    def fused(self, variant, dtype, quant_code, packs_per_thread):
        return self._get(kernels.fused_name(variant, dtype, quant_code, packs_per_thread,
                                            self.world), kernels.fused_args(variant))

    def launches(self):
        """Every launch of every function, as (name, grid, block, args)."""
        return [(name, *launch[:3]) for name, f in self.functions.items()
                for launch in f.launches]


class RecordingSequence:
    """What a plan is compiled from (``steps``) and each replay (``runs``)."""
    made = []

    def __init__(self):
        self.steps, self.runs = [], []
        RecordingSequence.made.append(self)

    def add_copy(self, dst, src, size, out_offset=None):
        self.steps.append(("copy", dst, src, size, out_offset))

    def add_kernel(self, function, grid, block, args=(), shared_mem=0, *, call_arg=None,
                   out_args=None):
        self.steps.append(("kernel", function, grid, block, args, call_arg, out_args))

    def run(self, stream, first_call=0, out=0):
        self.runs.append((stream, first_call, out))


@pytest.fixture
def sequences(monkeypatch):
    """The plans of communicators assembled from here on compile into
    RecordingSequence; returns its list of made sequences."""
    monkeypatch.setattr(_eager, "LaunchSequence", RecordingSequence)
    RecordingSequence.made.clear()
    return RecordingSequence.made


@pytest.fixture
def copies(monkeypatch):
    """The device-to-device copies the communicator queues: (dst, src, nbytes)."""
    queued = []
    monkeypatch.setattr(_hip, "memcpy_dtod",
                        lambda dst, src, nbytes, stream=None: queued.append((dst, src, nbytes)))
    return queued


class NodeStandIn:
    """The bounded MPI communicator of a domain, for one rank: its steps
    never wait; ``failure`` is what a failed host-side step left."""

    def __init__(self, world=4, rank=0):
        self.world, self.rank = world, rank
        self.failure = None
        self.freed = self.abandoned = False

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.world

    def step(self, name):
        return contextlib.nullcontext()

    def allgather(self, value):
        return [value] * self.world

    def Barrier(self):  # noqa: N802
        pass

    def Free(self):  # noqa: N802
        self.freed = True

    def abandon(self):
        self.abandoned = True


class RegistryStandIn:
    """The buffer registry: ``tables`` maps (address, nbytes) to a table."""

    def __init__(self):
        self.tables = {}
        self.deferred = []

    def lookup(self, address, nbytes):
        return self.tables.get((address, nbytes))

    def defer(self, array):
        self.deferred.append(array)
        return 0x5300_0000_0000 + 64 * len(self.deferred)

    def exchange_deferred(self):
        pass

    def discard_deferred(self):
        pass

    def captured(self, array):
        return False


class ResourcesStandIn:
    """What close() and abort() release; ``steps`` records the order."""

    def __init__(self):
        self.steps = []

    def close_mappings(self):
        self.steps.append("close_mappings")

    def free(self):
        self.steps.append("free")

    def release(self):
        self.steps.append("release")


def error_record():
    """A zeroed host-visible error record, as the kernels write it."""
    return (ctypes.c_uint32 * kernels.ERROR_WORDS)()


def assemble(world=4, rank=0, max_size=4096, *, kernels_=None, rows=None, registry=None,
             words=None, node=None, resources=None, debug=False, timeout=1.0, device=0,
             **geometry_overrides):
    """A NodeCommunicator of ``world`` ranks over stand-ins (a world of one
    has no connection).  Its parts are reachable through the returned
    namespace-free objects the caller passed in, or as ``comm.kernels``
    and ``comm.geometry``."""
    node = node or NodeStandIn(world, rank)
    resources = resources or ResourcesStandIn()
    connection = None
    if world > 1:
        words = error_record() if words is None else words
        connection = types.SimpleNamespace(
            geometry=geometry(world, rank, max_size, **geometry_overrides),
            kernels=kernels_ or RecordingKernels(world, rows),
            registry=registry or RegistryStandIn(),
            error_words=words, error_ptr=ctypes.addressof(words))
    elif rows is not None:
        connection = types.SimpleNamespace(geometry=None,
                                           kernels=types.SimpleNamespace(rows=rows),
                                           registry=None, error_words=None, error_ptr=0)
    return NodeCommunicator.assemble(node, connection, resources, device=device,
                                     max_size=max_size, timeout=timeout, debug=debug)


def array(address, shape=(1000,), dtype=F16, owner=None, readonly=False, device=0):
    """A device array at a made-up ``address`` (no GPU call)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    return pyar.DeviceArray.from_pointer(address, shape, dtype, owner=owner, device=device,
                                         readonly=readonly)


# --- streams and graphs ------------------------------------------------------------

@pytest.fixture
def capturing(monkeypatch):
    """Created streams (int handles) without a GPU: the handles put into the
    returned set capture, as the per-call path asks
    (_eager.stream_is_capturing) and as the checks ask
    (pyar._hip.as_stream(handle).is_capturing); every other stream does not."""
    handles = set()
    monkeypatch.setattr(_eager, "stream_is_capturing", lambda handle: handle in handles)
    as_stream = _hip.as_stream

    def stream(obj):
        if type(obj) is int and obj:
            return types.SimpleNamespace(handle=obj, closed=False,
                                         is_capturing=obj in handles)
        return as_stream(obj)

    monkeypatch.setattr(_hip, "as_stream", stream)
    return handles


class ExecutableStandIn:
    """An instantiated graph; ``closed`` once its capture closes it."""

    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def captured_graph(comm, stream=0x1234):
    """``comm.capture(stream)`` as its ``with`` block leaves it, without a
    GPU call: its graph instantiated (an ExecutableStandIn), its stream no
    longer capturing.  The communicator closes it when it closes."""
    graph = comm.capture(stream)
    graph.executable = ExecutableStandIn()
    graph.stream = types.SimpleNamespace(handle=stream, closed=False, is_capturing=False)
    return graph
