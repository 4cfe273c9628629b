"""Connecting the ranks of a node without a GPU (tier a): the block caps of
the spinning kernels (pyar.comm.kernels.block_cap, and the caps a
Connection agrees on), peer access between the ranks' GPUs
(pyar.comm.topology), and a peer mapping that fails becoming a
PeerAccessError.

A Connection (pyar.comm.connection) is built for real over stand-ins: the
node's exchange is a stand-in that hands every rank's bus id and memory
handle back, the loaded code objects are stand-ins whose layout globals the
monkeypatched ``memcpy_dtoh`` reads and whose functions report a set
occupancy, and the HIP calls that would allocate, copy or look at a GPU are
monkeypatched module functions.
"""
import collections
import ctypes
import struct
import types

import pytest

pytest.importorskip("mpi4py")

import pyar  # noqa: E402
from pyar import _hip, diagnostics  # noqa: E402
from pyar.comm import algorithms, connection, kernels, layout, topology  # noqa: E402
from pyar.comm.errors import PeerAccessError  # noqa: E402
from tests.comm_stand_ins import NodeStandIn  # noqa: E402

BUS = ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0"]
MULTIPROCESSORS = 132
THREADS, MAX_BLOCKS = 512, 128


# --- block caps ------------------------------------------------------------------------

CAPS = [
    (1, 3, 128),  # alone on the GPU: every slot, within the layout's 128 blocks
    (2, 2, 66),   # half the slots, 132 // 4 = 66: one block per multiprocessor in all
    (2, 3, 66),   # half the slots would be 99: two ranks' grids on 198 multiprocessors
    (3, 2, 44),
    (3, 3, 44),   # 66 a rank starved the third rank on the H200
    (4, 2, 33),
    (8, 2, 16),
    (8, 1, 8),    # half the slots is the tighter bound
]


@pytest.mark.parametrize("sharing, occupancy, cap", CAPS)
def test_spinning_blocks_of_ranks_sharing_a_gpu_fit_one_a_multiprocessor(sharing, occupancy,
                                                                         cap):
    assert kernels.block_cap(MULTIPROCESSORS, occupancy, MAX_BLOCKS, sharing) == cap


# --- a Connection over stand-ins ---------------------------------------------------------

PeerHandle = collections.namedtuple("PeerHandle", "rank")


class PeerNode(NodeStandIn):
    """Rank ``rank`` of a node whose ranks use the GPUs ``bus_ids``: the
    exchange of bus ids and of memory handles gives every rank's own; any
    other value is the same on every rank."""

    def __init__(self, bus_ids, rank):
        super().__init__(len(bus_ids), rank)
        self.bus_ids = bus_ids

    def allgather(self, value):
        if value == self.bus_ids[self.rank]:
            return list(self.bus_ids)
        if isinstance(value, PeerHandle):
            return [PeerHandle(r) for r in range(self.world)]
        return super().allgather(value)

    def allreduce(self, value, op=None):
        return value


class OccupancyFunction:
    """A kernel whose occupancy (blocks per multiprocessor) a test sets."""

    def __init__(self, name, blocks):
        self.name, self.blocks = name, blocks

    def max_active_blocks_per_multiprocessor(self, threads):
        assert threads == THREADS
        return self.blocks


class ModuleStandIn:
    """A loaded code object: its layout global (``words``, uint64) and
    functions of occupancy ``occupancy(name)``."""

    def __init__(self, global_name, words, occupancy):
        self.global_name = global_name
        self.data = ctypes.create_string_buffer(struct.pack(f"<{len(words)}Q", *words))
        self.occupancy = occupancy

    def get_global(self, name):
        assert name == self.global_name, name
        return ctypes.addressof(self.data), len(self.data.raw)

    def get_function(self, name, argtypes=()):
        return OccupancyFunction(name, self.occupancy(name))


class ResourcesStandIn:
    """Made-up device addresses; the pinned error record is host memory the
    Connection writes; ``open_peer(handle)`` maps a peer's memory."""

    def __init__(self, open_peer):
        self.peers = types.SimpleNamespace(open=open_peer)
        self.pinned = []
        self.next_address = 0x6000_0000_0000

    def device_memory(self, size, uncached=False):
        memory = types.SimpleNamespace(ptr=self.next_address)
        self.next_address += -(-size // 4096) * 4096 + 4096
        return memory

    def pinned_memory(self, size):
        memory = ctypes.create_string_buffer(size)
        self.pinned.append(memory)
        return types.SimpleNamespace(ptr=ctypes.addressof(memory))


def _layout_words():
    """pyar_allreduce_layout: signal_bytes, max_blocks, max_ranks, state_bytes,
    threads, failed_offset."""
    return (0x1000, MAX_BLOCKS, 8, len(layout.pack_state([], [], 0, 0, 0)), THREADS, 0x800)


def connect(monkeypatch, bus_ids, rank=0, *, open_peer=None, occupancy=lambda name: 2,
            gpu_sharers=None, max_size=1 << 16):
    """A Connection of rank ``rank`` on a node whose ranks use ``bus_ids``."""
    modules = {
        "allreduce": ModuleStandIn("pyar_allreduce_layout", _layout_words(), occupancy),
        "shards": ModuleStandIn(None, (), occupancy),
        "allreduce_rmsnorm": ModuleStandIn("pyar_rmsnorm_layout", (16384, 1024, 32, 0),
                                           occupancy),
    }
    monkeypatch.setattr(connection, "load_module", lambda name, device, kernel_dir=None:
                        modules[name])
    monkeypatch.setattr(_hip, "memcpy_dtoh",
                        lambda dst, src, stream=None: dst.__setitem__(
                            slice(None), ctypes.string_at(src, len(dst))))
    for name in ("set_device", "memset", "memcpy_htod"):
        monkeypatch.setattr(_hip, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(_hip, "ipc_get_handle", lambda ptr: PeerHandle(rank))
    monkeypatch.setattr(_hip, "Device", lambda device: types.SimpleNamespace(
        pci_bus_id=bus_ids[rank], multiprocessor_count=MULTIPROCESSORS))
    monkeypatch.setattr(diagnostics, "require_mps", lambda bus_ids: None)
    monkeypatch.setattr(topology, "enable_peer_access", lambda device, rank, bus_ids: None)
    resources = ResourcesStandIn(open_peer or (lambda handle: 0x7000_0000_0000 + handle.rank))
    return connection.Connection(PeerNode(bus_ids, rank), resources, 0, max_size, 10**9,
                                 gpu_sharers=gpu_sharers)


@pytest.mark.parametrize("sharing, occupancy, cap", CAPS)
def test_a_connection_caps_blocks_by_its_least_resident_kernel(monkeypatch, sharing, occupancy,
                                                              cap):
    """Every kernel of a kind fits at the cap: the one of the lowest occupancy
    counts (here each kind's float16 kernels, one block fewer than the rest)."""
    def lowest_for_float16(name):
        return occupancy if "_f16" in name else occupancy + 1

    conn = connect(monkeypatch, BUS[:2], occupancy=lowest_for_float16, gpu_sharers=sharing)
    assert conn.geometry.allreduce_blocks == conn.geometry.shard_blocks == cap
    fused = {(algorithms.FUSED_VARIANTS[0], kernels.FLOAT32),
             (algorithms.LAMPORT, kernels.FLOAT32)}
    assert {conn.geometry.fused_blocks[key] for key in fused} == {
        kernels.block_cap(MULTIPROCESSORS, occupancy + 1, MAX_BLOCKS, sharing)}
    assert conn.geometry.shared_gpu == (sharing > 1)


# --- peer access between the ranks' GPUs -------------------------------------------


class _FakeGpus:
    """The devices a process is shown, by bus id, and which pairs reach each other."""

    def __init__(self, shown, unreachable=()):
        self.shown = shown
        self.unreachable = {frozenset(pair) for pair in unreachable}
        self.enabled = []
        gpus = self

        class Device:
            def __init__(self, ordinal):
                self.ordinal = ordinal
                self.pci_bus_id = gpus.shown[ordinal]

            def can_access_peer(self, peer):
                return frozenset((self.pci_bus_id, gpus.shown[peer])) not in gpus.unreachable

            def enable_peer_access(self, peer):
                gpus.enabled.append((self.pci_bus_id, gpus.shown[peer]))

        self.Device = Device

    def get_device_count(self):
        return len(self.shown)


def _with_gpus(monkeypatch, gpus):
    monkeypatch.setattr(topology, "_hip", gpus)
    return gpus


def test_peer_access_enabled_once_per_other_gpu(monkeypatch):
    gpus = _with_gpus(monkeypatch, _FakeGpus(BUS))
    # Ranks 0 and 1 share GPU 0; ranks 2, 3, 4 are on GPUs 1, 2, 3 (rank 4 shares with 3).
    bus_ids = [BUS[0], BUS[0], BUS[1], BUS[2], BUS[2]]
    topology.enable_peer_access(0, 1, bus_ids)
    assert gpus.enabled == [(BUS[0], BUS[1]), (BUS[0], BUS[2])]
    assert topology.ranks_sharing(bus_ids, 1) == 2 and topology.ranks_sharing(bus_ids, 2) == 1


def test_one_shared_gpu_needs_no_peer_access(monkeypatch):
    gpus = _with_gpus(monkeypatch, _FakeGpus(BUS[:1], unreachable=[(BUS[0], BUS[0])]))
    topology.enable_peer_access(0, 2, [BUS[0]] * 4)
    assert gpus.enabled == []


def test_a_pair_without_peer_access_is_named(monkeypatch):
    gpus = _with_gpus(monkeypatch, _FakeGpus(BUS, unreachable=[(BUS[1], BUS[3])]))
    with pytest.raises(PeerAccessError) as raised:
        topology.enable_peer_access(1, 1, BUS)  # rank 1 on GPU 1
    error = raised.value
    assert (error.rank, error.bus_id, error.peer_rank, error.peer_bus_id) == (
        1, BUS[1], 3, BUS[3])
    assert "rank 1" in str(error) and "rank 3" in str(error) and BUS[3] in str(error)
    assert gpus.enabled == [(BUS[1], BUS[0]), (BUS[1], BUS[2])]  # those before it


def test_gpus_this_process_is_not_shown_are_left_to_the_mapping(monkeypatch):
    # CUDA_VISIBLE_DEVICES per rank: this process sees its own GPU only.
    gpus = _with_gpus(monkeypatch, _FakeGpus([BUS[2]], unreachable=[(BUS[2], BUS[0])]))
    topology.enable_peer_access(0, 2, BUS)
    assert gpus.enabled == []


def _refuse(refused):
    """A peer mapping that fails for the handles of ranks ``refused``."""
    def open_peer(handle):
        if handle.rank in refused:
            raise pyar.HipError(217, "hipErrorPeerAccessUnsupported", "hipIpcOpenMemHandle",
                                "peer access is not supported")
        return 0x7000_0000_0000 + handle.rank
    return open_peer


def test_a_failed_peer_mapping_becomes_a_peer_access_error(monkeypatch):
    bus_ids = [BUS[0], BUS[0], BUS[1]]  # ranks 0 and 1 share a GPU
    with pytest.raises(PeerAccessError, match="rank 2") as raised:
        connect(monkeypatch, bus_ids, open_peer=_refuse({2}))
    assert isinstance(raised.value.__cause__, pyar.HipError)
    assert (raised.value.rank, raised.value.bus_id, raised.value.peer_rank,
            raised.value.peer_bus_id) == (0, BUS[0], 2, BUS[1])
    # A peer on this rank's own GPU is not a peer-access problem: the error stays.
    with pytest.raises(pyar.HipError):
        connect(monkeypatch, bus_ids, open_peer=_refuse({1}))
