"""Buffer lifetime without a GPU (tier a): unregister's order of steps and
bookkeeping, the plans it makes the per-call path forget, and read-only
imports refused as outputs.

The registry runs for real over stand-ins: a node communicator of one rank
that records its barriers, resources that record the device wait, and peer
mappings (the real PeerMappings) opened from made-up handles of two peers.
The communicator is assembled over that registry and node with the
stand-ins of tests/comm_stand_ins.py (recording kernels, plans compiled into
a recording sequence, copies recorded).  Nothing is dereferenced;
tests/gpu/test_buffers_gpu.py runs the same on the GPU.
"""
import contextlib
import types
import weakref

import numpy as np
import pytest

pytest.importorskip("mpi4py")

import pyar  # noqa: E402
from pyar import _hip  # noqa: E402
from pyar.array import device_array  # noqa: E402
from pyar.comm import registry, resources  # noqa: E402
from pyar.comm.errors import CollectiveTimeout, MismatchError  # noqa: E402
from tests.comm_stand_ins import array, assemble, captured_graph  # noqa: E402
from tests.comm_stand_ins import sequences  # noqa: E402,F401 - a fixture
from tests.readonly_exports import DLPackExport, InterfaceExport, JaxLikeExport  # noqa: E402
from tests.test_eager_cpu import X, Y, checked  # noqa: E402
from tests.test_eager_cpu import comm, copies, words  # noqa: E402,F401 - fixtures

PEERS = 2  # made-up peers whose handles this rank maps


class Node:
    """A node communicator that records its barriers; ``fail`` makes the
    next barrier time out as a peer that never came would.  A communicator
    over it has four ranks; its exchanges answer for this rank alone (the
    peers' handles are made up: ``register`` below)."""

    def __init__(self, events):
        self.events = events
        self.failure = None
        self.fail = False

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return 0

    def Get_size(self):  # noqa: N802
        return 4

    def allgather(self, value):
        return [value]

    def Barrier(self):  # noqa: N802
        if self.fail:
            raise CollectiveTimeout("unregister (host-side exchange)", (1,), 0, 1.0)
        self.events.append("barrier")

    def step(self, name):
        return contextlib.nullcontext()


class Mapping:
    """An IpcMapping stand-in that records its closing."""

    def __init__(self, handle, events):
        self.base = 0x9000_0000_0000 + 0x1000_0000 * handle.handle[0]
        self.handle, self.events = handle, events

    def close(self):
        self.events.append(("unmap", self.handle.handle[0]))


class Memory:
    """Distinct device addresses for the registry's tables, never dereferenced."""
    next_address = 1 << 44

    def __init__(self, size):
        self.ptr = Memory.next_address
        Memory.next_address += -(-size // 4096) * 4096


@pytest.fixture
def events():
    return []


@pytest.fixture
def node(events):
    return Node(events)


@pytest.fixture
def buffers(monkeypatch, events, node):
    """A BufferRegistry whose peers export allocations 1 and 2 (handle byte 0)."""
    monkeypatch.setattr(resources._hip, "ipc_open", lambda handle: Mapping(handle, events))
    monkeypatch.setattr(registry._hip, "memcpy_htod", lambda dst, data: None)
    res = types.SimpleNamespace(device_memory=Memory, peers=resources.PeerMappings(),
                                synchronize=lambda: events.append("synchronize"))
    return registry.BufferRegistry(node, res)


def peer_handles(allocation, offset):
    """What the peers would send for a buffer ``offset`` bytes into their
    allocation number ``allocation``."""
    return [_hip.IpcHandle(bytes([allocation + p]) * 64, offset, 1 << 20) for p in range(PEERS)]


def register(buffers, x, allocation, offset=0):
    """register(x) with the handle exchange answered by the made-up peers."""
    entries = [(x.ptr, x.nbytes, buffers._new_table(capturing=False))]
    buffers._arrays[(x.ptr, x.nbytes)] = x
    buffers._fill(entries, [["mine"], *[[h] for h in peer_handles(allocation, offset)]])
    buffers._tables[(x.ptr, x.nbytes)] = entries[0][2]


class Owner:
    """What owns a buffer's memory (weakly referable)."""


def device_buffer(address, count=1024):
    return pyar.DeviceArray.from_pointer(address, (count,), np.float32, owner=Owner(),
                                         device=0)


def test_unregister_waits_then_unmaps_then_waits_for_every_rank(buffers, events):
    x = device_buffer(X)
    register(buffers, x, allocation=1)
    table = buffers.lookup(x.ptr, x.nbytes)
    assert table is not None and events == []
    owner = weakref.ref(x._owner)
    buffers.unregister(x)
    # This rank's kernels may read the peers' x: the device wait comes before
    # any unmapping, and the barrier after every one of them.
    assert events == ["synchronize", ("unmap", 1), ("unmap", 2), "barrier"]
    assert buffers.lookup(x.ptr, x.nbytes) is None  # calls on x are staged again
    del x
    assert owner() is None  # no longer kept alive
    assert buffers._free[-1] == table  # never captured: its table is reused


def test_a_peer_allocation_shared_by_two_buffers_stays_mapped_for_the_other(buffers, events):
    a, b = device_buffer(X), device_buffer(Y)
    register(buffers, a, allocation=1, offset=0)
    register(buffers, b, allocation=1, offset=4096)  # the same peer allocations
    buffers.unregister(a)
    assert events == ["synchronize", "barrier"]  # b still reads through them
    buffers.unregister(b)
    assert events[2:] == ["synchronize", ("unmap", 1), ("unmap", 2), "barrier"]


def test_unregistering_what_is_not_registered_is_refused(buffers, events):
    x = device_buffer(X)
    with pytest.raises(ValueError, match="not registered"):
        buffers.unregister(x)
    register(buffers, x, allocation=1)
    buffers.unregister(x)
    with pytest.raises(ValueError, match="unregistered already"):
        buffers.unregister(x)
    assert events.count("synchronize") == 1


def test_ranks_disagreeing_on_unregister_raise_mismatch(buffers, node):
    x = device_buffer(X)
    register(buffers, x, allocation=1)
    node.allgather = lambda value: [value, (value[0] + 4, value[1])]
    with pytest.raises(MismatchError, match="unregistered buffer"):
        buffers.unregister(x)
    assert buffers.lookup(x.ptr, x.nbytes) is not None  # nothing was undone


def test_a_peer_that_never_unregisters_leaves_the_buffer_alive(buffers, events, node):
    x = device_buffer(X)
    register(buffers, x, allocation=1)
    node.fail = True
    with pytest.raises(CollectiveTimeout):
        buffers.unregister(x)
    # Not read in place any more, but the peer may still map it: kept.
    assert buffers.lookup(x.ptr, x.nbytes) is None
    assert buffers._arrays[(x.ptr, x.nbytes)] is x


def test_a_captured_buffers_table_is_never_handed_out_again(buffers):
    x = device_buffer(X)
    register(buffers, x, allocation=1)
    assert buffers.defer(x) == buffers.lookup(x.ptr, x.nbytes)  # a capture reads it
    assert buffers.captured(x)
    table = buffers.lookup(x.ptr, x.nbytes)
    buffers.unregister(x)
    assert table not in buffers._free and not buffers.captured(x)


# --- the communicator's unregister and the per-call path's plans -------------------

@pytest.fixture
def registered_comm(sequences, copies, buffers, node):
    """A communicator over the real registry above and its node."""
    return assemble(world=4, node=node, registry=buffers)


def test_unregister_sends_replayed_calls_back_to_staging(registered_comm, sequences, copies,
                                                         monkeypatch):
    comm = registered_comm
    monkeypatch.setattr(registry._hip, "ipc_get_handle",
                        lambda ptr: _hip.IpcHandle(b"\1" * 64, 0, 1 << 20))
    x, y = array(X), array(Y)
    comm.register(x)
    comm.allreduce(x, out=y)
    comm.allreduce(x, out=y)  # replayed, read in place: nothing to stage
    assert len(sequences[0].runs) == 1
    assert checked(comm)[-1][3][2] == 0
    comm.unregister(x)
    comm.allreduce(x, out=y)
    assert len(checked(comm)) == 2  # planned again ...
    (_, _, _, args), = checked(comm)[-1:]
    assert args[:3] == (comm.geometry.staged_table, 0, X)  # ... staged by the kernel
    assert copies == []


def test_unregister_is_refused_while_a_graph_that_read_it_is_open(registered_comm, buffers):
    comm = registered_comm
    x = array(X)
    register(buffers, x, allocation=1)
    buffers.defer(x)  # a capture read x in place
    graph = captured_graph(comm)
    with pytest.raises(ValueError, match="still open or capturing"):
        comm.unregister(x)
    assert buffers.lookup(x.ptr, x.nbytes) is not None
    graph.close()
    comm.unregister(x)
    assert buffers.lookup(x.ptr, x.nbytes) is None


# --- read-only imports ---------------------------------------------------------------

READ_ONLY_EXPORTS = {
    "dlpack-flag": lambda: DLPackExport(Y, (1000,), np.float16),
    "interface-bit": lambda: InterfaceExport(Y, (1000,), np.float16),
    "jax": lambda: JaxLikeExport(Y, (1000,), np.float16),
}


@pytest.mark.parametrize("kind", READ_ONLY_EXPORTS)
def test_read_only_imports_are_read_only_arrays(kind):
    view = pyar.asarray(READ_ONLY_EXPORTS[kind]())
    assert view.readonly and view.ptr == Y
    with pytest.raises(ValueError, match="read-only"):
        view.fill(0)


def test_writable_exports_stay_writable():
    assert not pyar.asarray(DLPackExport(Y, (1000,), np.float16, readonly=False)).readonly
    assert not pyar.asarray(InterfaceExport(Y, (1000,), np.float16, readonly=False)).readonly


@pytest.mark.parametrize("kind", READ_ONLY_EXPORTS)
def test_read_only_imports_are_refused_as_outputs(comm, sequences, kind, monkeypatch):
    # The interface names no device: the view asks the pointer, on device 0 here.
    monkeypatch.setattr(device_array, "pointer_device", lambda ptr: 0)
    x, y = array(X), array(Y)
    comm.allreduce(x, out=y)  # planned with a writable output at the same address
    launches = len(checked(comm))
    with pytest.raises(ValueError, match="out is a read-only array"):
        comm.allreduce(x, out=READ_ONLY_EXPORTS[kind]())
    assert len(checked(comm)) == launches and len(sequences[0].runs) == 0
    # As an input it is only read: accepted.
    comm.allreduce(READ_ONLY_EXPORTS[kind](), out=array(X))
    assert len(checked(comm)) == launches + 1
