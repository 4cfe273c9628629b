"""Connecting the ranks of one IPC domain: each rank loads the kernels,
allocates and exports its signal and scratch memory, maps every peer's, and
the ranks agree on the block caps; the result is the Connection a node
communicator plans and launches with.

Every step is collective over the domain (a BoundedComm): one that fails on
any rank raises on every rank (exchange.run_everywhere) instead of leaving
the others waiting in the next step.
"""
import ctypes
import os

from pyar import _hip, _kernels, diagnostics
from pyar.comm import algorithms, exchange, fused_plan, layout, plan, topology
from pyar.comm.errors import PeerAccessError
from pyar.comm.kernels import DTYPE_NAMES, ERROR_WORDS, KernelSet, block_cap
from pyar.comm.plan import NodeGeometry
from pyar.comm.registry import BufferRegistry
from pyar.comm.row_kernels import RowKernels


def load_module(name, device, kernel_dir=None):
    """Code object ``name`` (allreduce, allreduce_rmsnorm, shards, rail) on
    ``device``: the shipped one, or the one in ``kernel_dir``."""
    if kernel_dir is None:
        return _kernels.load(name, device)
    return _hip.Module.from_file(os.path.join(kernel_dir, _kernels.file_name(name)))


def select_device(rank, device):
    """This rank's GPU (default: its rank in the domain modulo the visible
    GPUs), made current."""
    if device is None:
        device = rank % _hip.get_device_count()
    _hip.set_device(device)
    return int(device)


class Connection:
    """A rank's share of a connected domain: its ``kernels`` (KernelSet),
    ``geometry`` (plan.NodeGeometry), buffer ``registry``, and the
    host-visible error record the kernels write (``error_words``, a ctypes
    view, and its address ``error_ptr``)."""

    def __init__(self, node, resources, device, max_size, timeout_ns, kernel_dir=None,
                 gpu_sharers=None, auto_ll=False):
        self._node = node
        self._resources = resources
        self._device = device
        self._rank, self._world = node.Get_rank(), node.Get_size()
        self._kernel_dir = kernel_dir
        allreduce_module, self._layout, rows, shards_module = exchange.run_everywhere(
            node, self._load_kernels)
        self.kernels = KernelSet(self._world, allreduce_module, shards_module, rows)
        lay = self._layout
        partial = lay.signal_bytes + max_size
        # The lamport kernels' receive region follows the two-shot scratch:
        # per rank its call counters, then two slots of a segment per rank.
        lamport = partial + max_size
        lamport_bytes = fused_plan.lamport_segment(max_size)
        ll_bytes = plan.ll_segment(max_size)
        bus_ids = node.allgather(exchange.run_everywhere(node, self._bus_id))
        exchange.run_everywhere(node, diagnostics.require_mps, bus_ids)
        exchange.run_everywhere(node, topology.enable_peer_access, device, self._rank, bus_ids)
        handles = node.allgather(exchange.run_everywhere(
            node, self._allocate, lamport, lamport_bytes, ll_bytes))
        exchange.run_everywhere(node, self._map_peers, handles, bus_ids, lay.signal_bytes,
                                partial)
        self.registry = exchange.run_everywhere(node, BufferRegistry, node, resources)
        sharing = gpu_sharers or topology.ranks_sharing(bus_ids, self._rank)
        # Every rank must pick the same fused variant: the shared-GPU table
        # only when every rank shares its GPU.
        shared_gpu = exchange.agree_min(node, sharing) > 1
        allreduce_blocks = exchange.agree_min(node, exchange.run_everywhere(
            node, self._cap, sharing, self.kernels.every_allreduce()))
        shard_blocks = exchange.agree_min(node, exchange.run_everywhere(
            node, self._cap, sharing, self.kernels.every_shard()))
        # Per fused kernel: their register use, and so their occupancy,
        # differs by variant and dtype by up to 2x.
        caps = node.allgather(exchange.run_everywhere(node, self._fused_caps, sharing))
        buffer = self._buffer.ptr
        self.geometry = NodeGeometry(
            world=self._world, rank=self._rank, max_size=max_size, threads=lay.threads,
            max_blocks=lay.max_blocks, allreduce_blocks=allreduce_blocks,
            shard_blocks=shard_blocks,
            fused_blocks={key: min(cap[key] for cap in caps) for key in caps[0]},
            local_blocks=2 * _hip.Device(device).multiprocessor_count, shared_gpu=shared_gpu,
            state=self._state.ptr, staged_table=self._staged_table.ptr,
            scratch=buffer + lay.signal_bytes, partial=buffer + partial,
            failed_word=buffer + lay.failed_offset, lamport_region=buffer + lamport,
            lamport_bytes=lamport_bytes, ll_region=buffer + self._ll_offset, ll_bytes=ll_bytes,
            timeout_ns=timeout_ns,
            auto_ll_bytes=plan.auto_ll_bytes(self._world, ll_bytes, auto_ll))
        node.Barrier()  # every rank's signals are zeroed before anyone's first call

    def _load_kernels(self):
        _hip.set_device(self._device)
        module = load_module("allreduce", self._device, self._kernel_dir)
        found = layout.KernelLayout(module)
        if self._world > found.max_ranks:
            raise ValueError(f"the kernels support {found.max_ranks} ranks, not {self._world}")
        return (module, found,
                RowKernels(load_module("allreduce_rmsnorm", self._device, self._kernel_dir)),
                load_module("shards", self._device, self._kernel_dir))

    def _bus_id(self):
        return _hip.Device(self._device).pci_bus_id

    def _allocate(self, lamport, lamport_bytes, ll_bytes):
        res = self._resources
        region = layout.lamport_region(self._world, lamport_bytes, self._layout.max_blocks)
        # The LL receive region follows the lamport region, zeroed (no LL
        # flag is 0).
        self._ll_offset = lamport + len(region)
        ll_size = layout.ll_region_bytes(self._world, ll_bytes, self._layout.max_blocks)
        self._buffer = res.device_memory(self._ll_offset + ll_size, uncached=True)
        _hip.memset(self._buffer.ptr, 0, self._layout.signal_bytes)
        _hip.memcpy_htod(self._buffer.ptr + lamport, region)
        _hip.memset(self._buffer.ptr + self._ll_offset, 0, ll_size)
        error = res.pinned_memory(4 * ERROR_WORDS)
        # A ctypes view, not a buffer export, so the memory can be freed later.
        self.error_words = (ctypes.c_uint32 * ERROR_WORDS).from_address(error.ptr)
        ctypes.memset(error.ptr, 0, 4 * ERROR_WORDS)
        self.error_ptr = error.ptr
        self._state = res.device_memory(len(layout.pack_state([], [], 0, 0, 0)))
        self._staged_table = res.device_memory(layout.TABLE_BYTES)
        return _hip.ipc_get_handle(self._buffer.ptr)

    def _map_peers(self, handles, bus_ids, scratch, partial):
        bases = [self._buffer.ptr if r == self._rank else self._open_peer(r, h, bus_ids)
                 for r, h in enumerate(handles)]
        state = layout.pack_state(bases, [b + partial for b in bases], self.error_ptr,
                                  self._rank, self._world)
        _hip.memcpy_htod(self._state.ptr, state)
        _hip.memcpy_htod(self._staged_table.ptr, layout.pack_table([b + scratch for b in bases]))

    def _open_peer(self, peer, handle, bus_ids):
        try:
            return self._resources.peers.open(handle)
        except _hip.HipError as exc:
            if bus_ids[peer] == bus_ids[self._rank]:
                raise
            raise PeerAccessError(self._rank, bus_ids[self._rank], peer, bus_ids[peer],
                                  f"mapping its memory failed ({exc})") from exc

    def _cap(self, sharing, functions):
        """block_cap of ``functions`` on this rank's GPU, at their lowest occupancy."""
        occupancy = min(f.max_active_blocks_per_multiprocessor(self._layout.threads)
                        for f in functions)
        return block_cap(_hip.Device(self._device).multiprocessor_count, occupancy,
                         self._layout.max_blocks, sharing)

    def _fused_caps(self, sharing):
        """Per (variant, dtype): the block cap over every row kernel of it
        (quantization kinds, packs per thread), in blocks of the all-reduce's
        threads; row_kernels.row_launch scales it to a call's block size."""
        return {(variant, dtype): self._cap(sharing, self.kernels.every_fused(variant, dtype))
                for variant in algorithms.FUSED_VARIANTS + (algorithms.SPLIT, algorithms.LAMPORT)
                for dtype in DTYPE_NAMES}
