"""pyar.Communicator: the fastest correct sum across the GPUs of one node."""
import ctypes
import functools
import os
import weakref

import ml_dtypes
import numpy as np

from pyar import _hip, _kernels, diagnostics
from pyar.array import DeviceArray, asarray, empty
from pyar.comm import _eager, algorithms, exchange, layout, rmsnorm, shards, topology
from pyar.comm import inter_node as inter_node_path
from pyar.comm.errors import CollectiveTimeout, MismatchError, PeerAccessError
from pyar.comm.registry import BufferRegistry
from pyar.comm.resources import Resources

DEFAULT_MAX_SIZE = 64 << 20
DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 1e6  # the kernels count nanoseconds in 64 bits; 11 days is plenty
MAX_WORLD = 8

_KERNEL_TYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(ml_dtypes.bfloat16): "bf16",
}
# Host-visible error record the kernels write (uint32 words): [0] failed
# (timeout or mismatch), [1 + r] rank r never arrived, [9] the call's sequence
# number, [10] the ranks' call signatures disagree, [11 + 2r] and [12 + 2r]
# the low and high words of rank r's signature.
_FAILED, _MISSING, _CALL, _MISMATCH, _SIGNATURES = 0, 1, 9, 10, 11
_ERROR_WORDS = 28
_CALL_LOG = 4096
# one_shot/two_shot kernels (src/kernels/allreduce.cu): input table, in_offset,
# the input to stage (0: read the table as it is), out, state, n, timeout_ns,
# signature, call.
_ALLREDUCE_TYPES = ("ptr", "uint64", "ptr", "ptr", "ptr", "uint64", "uint64", "uint64", "uint32")
# reduce_scatter/all_gather kernels (src/kernels/shards.cu): input table,
# in_offset, in_stride, out, state, n, shard, first, count, timeout_ns,
# signature, call.
_SHARD_TYPES = ("ptr", "uint64", "uint64", "ptr", "ptr", "uint64", "uint64", "uint64",
                "uint64", "uint64", "uint64", "uint32")
_FLOAT32 = np.dtype(np.float32)


def _env_flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def resolve_timeout(timeout):
    """Seconds: ``timeout``, else $PYAR_TIMEOUT, else the default; checked."""
    timeout = float(os.environ.get("PYAR_TIMEOUT", DEFAULT_TIMEOUT)
                    if timeout is None else timeout)
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds, got {timeout}")
    return timeout


def _host_step(name):
    """Names the method's MPI steps in the CollectiveTimeout they raise; a
    timeout there fails the communicator like one in a kernel."""
    def wrap(method):
        @functools.wraps(method)
        def named(self, *args, **kwargs):
            try:
                with self._node.step(name):
                    return method(self, *args, **kwargs)
            except CollectiveTimeout as exc:
                self._failure = self._failure or exc
                raise
        return named
    return wrap


class Communicator(_eager.EagerCalls):
    """A custom all-reduce over the ranks of ``mpi_comm``, one GPU each.

    Collective: every rank of ``mpi_comm`` constructs it together.  ``device``
    defaults to the node-local rank modulo the visible devices; several
    ranks may share one GPU (under MPS).  ``max_size`` is the scratch buffer
    in bytes (larger messages go in chunks); ``timeout`` bounds every wait
    for peers, in seconds (default ``PYAR_TIMEOUT`` or 300).  ``node_size``
    (default ``PYAR_RANKS_PER_NODE``, else the whole node) is the number of
    ranks per IPC domain; over several domains the constructor returns a
    pyar.comm.hierarchical.HierarchicalCommunicator.  ``kernels``
    names a directory of code objects built from src/kernels (allreduce,
    allreduce_rmsnorm and shards, named like the shipped ones) to use instead
    of them.  ``gpu_sharers``: how many ranks use this rank's GPU when they
    are more than this communicator's (HierarchicalCommunicator's domains of
    one node: their spinning kernels share the GPU's slots; _block_cap).
    ``debug`` (default ``PYAR_DEBUG``) checks before each call that all ranks
    passed the same arguments; without it the kernels still compare every
    rank's call at their start barrier and raise MismatchError.
    ``inter_node`` (default ``PYAR_INTER_NODE``) picks the data path between
    IPC domains ("auto", "host", "device": pyar.comm.inter_node); over one
    domain it is checked and has nothing to pick.

    Calls on one communicator must be ordered with respect to each other
    (one stream, or streams the caller synchronizes), like NCCL's.

    A call whose signature (arrays, algorithm, stream) was seen before
    replays the launches planned the first time, without checking its
    arguments again (pyar/comm/_eager.pyx says when it does check again).
    """

    def __new__(cls, mpi_comm=None, device=None, max_size=DEFAULT_MAX_SIZE, timeout=None, *,
                node_size=None, **options):
        """A communicator over ranks of several IPC domains (nodes, or
        ``node_size`` / PYAR_RANKS_PER_NODE groups: pyar.comm.domains) is a
        HierarchicalCommunicator; over one domain, this class, no detour.
        (Without ``mpi_comm``: a bare instance, for tests.)"""
        if cls is Communicator and mpi_comm is not None:
            split = exchange.ipc_split(mpi_comm, 2 * resolve_timeout(timeout), node_size)
            split.free()
            if split.rail is not None:
                from pyar.comm.hierarchical import HierarchicalCommunicator
                return HierarchicalCommunicator(mpi_comm, device, max_size, timeout,
                                                node_size=node_size, **options)
        return super().__new__(cls)

    def __init__(self, mpi_comm, device=None, max_size=DEFAULT_MAX_SIZE, timeout=None, *,
                 node_size=None, kernels=None, debug=None, gpu_sharers=None, inter_node=None):
        inter_node_path.requested(inter_node)
        if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size <= 0:
            raise ValueError(f"max_size must be a positive int (bytes), got {max_size!r}")
        timeout = resolve_timeout(timeout)
        self._closed = True  # until construction completes
        # Host-side steps wait twice the timeout: pyar/comm/bounded.py says why.
        self._node = exchange.node_local(mpi_comm, 2 * timeout, node_size)
        self.rank = self._node.Get_rank()
        self.world = self._node.Get_size()
        self.timeout = timeout
        self._timeout_ns = int(timeout * 1e9)
        self.debug = _env_flag("PYAR_DEBUG") if debug is None else bool(debug)
        self.max_size = -(-max_size // layout.PACK_BYTES) * layout.PACK_BYTES
        # One receive segment of the lamport kernels: the most a lamport call takes.
        self._lamport_bytes = min(algorithms.LAMPORT_SEGMENT_BYTES, self.max_size)
        self._resources = None
        self._registry = None
        self._calls = 0
        self._call_log = {}
        self._failure = None
        self._captures = weakref.WeakSet()  # closed with the communicator
        self._functions = {}
        self._kernel_dir = kernels
        self._row_kernels = None
        self._unfused_sums = None  # the unfused path's sum array when there is no out
        self._gpu_sharers = gpu_sharers
        self._shared_gpu = False  # every rank shares its GPU (set on connecting)
        try:
            if self.world > MAX_WORLD:
                raise ValueError(f"pyar all-reduces among at most {MAX_WORLD} ranks of one "
                                 f"node, this communicator has {self.world}")
            # Different sizes or timeouts would give ranks different chunkings.
            exchange.check_agreement(self._node, "max_size and timeout",
                                     (self.max_size, timeout))
            self.device = exchange.run_everywhere(self._node, self._select_device, device)
            self._resources = Resources(self.device)
            if self.world > 1:
                self._connect()
        except BaseException:
            if self._resources is not None:
                self._resources.release()
            self._node.Free()
            raise
        self._finalizer = weakref.finalize(self, Resources.release, self._resources)
        self._closed = False

    # --- construction -------------------------------------------------------

    def _select_device(self, device):
        if device is None:
            device = self.rank % _hip.get_device_count()
        _hip.set_device(device)
        return int(device)

    def _connect(self):
        node = self._node
        self._module, self._layout, self._row_kernels = exchange.run_everywhere(
            node, self._load_kernels)
        lay = self._layout
        self._scratch_offset = lay.signal_bytes
        self._partial_offset = lay.signal_bytes + self.max_size
        # The lamport kernels' receive region follows the two-shot scratch:
        # per rank its call counters, then two slots of a segment per rank.
        self._lamport_offset = self._partial_offset + self.max_size
        bus_ids = node.allgather(exchange.run_everywhere(node, self._bus_id))
        exchange.run_everywhere(node, diagnostics.require_mps, bus_ids)
        exchange.run_everywhere(node, topology.enable_peer_access, self.device, self.rank,
                                bus_ids)
        exported = exchange.run_everywhere(node, self._allocate)
        handles = node.allgather(exported)
        exchange.run_everywhere(node, self._map_peers, handles, bus_ids)
        self._registry = exchange.run_everywhere(node, BufferRegistry, node, self._resources)
        sharing = self._gpu_sharers or topology.ranks_sharing(bus_ids, self.rank)
        # Every rank must pick the same fused variant: the shared-GPU table
        # only when every rank shares its GPU.
        self._shared_gpu = exchange.agree_min(node, sharing) > 1
        self._max_blocks = exchange.agree_min(node, exchange.run_everywhere(
            node, self._block_cap, sharing, self._allreduce_functions()))
        self._max_shard_blocks = exchange.agree_min(node, exchange.run_everywhere(
            node, self._block_cap, sharing, self._shard_functions()))
        # Per fused kernel: their register use, and so their occupancy,
        # differs by variant and dtype by up to 2x.
        caps = node.allgather(exchange.run_everywhere(node, self._fused_block_caps, sharing))
        self._max_fused_blocks = {key: min(cap[key] for cap in caps) for key in caps[0]}
        node.Barrier()  # every rank's signals are zeroed before anyone's first call

    def _load_module(self, name):
        if self._kernel_dir is None:
            return _kernels.load(name, self.device)
        return _hip.Module.from_file(os.path.join(self._kernel_dir, _kernels.file_name(name)))

    def _load_kernels(self):
        _hip.set_device(self.device)
        module = self._load_module("allreduce")
        found = layout.KernelLayout(module)
        if self.world > found.max_ranks:
            raise ValueError(f"the kernels support {found.max_ranks} ranks, not {self.world}")
        self._shards_module = self._load_module("shards")
        return module, found, rmsnorm.RowKernels(self._load_module("allreduce_rmsnorm"))

    def _allocate(self):
        res = self._resources
        region = layout.lamport_region(self.world, self._lamport_bytes, self._layout.max_blocks)
        self._buffer = res.device_memory(self._lamport_offset + len(region), uncached=True)
        _hip.memset(self._buffer.ptr, 0, self._layout.signal_bytes)
        _hip.memcpy_htod(self._buffer.ptr + self._lamport_offset, region)
        self._error = res.pinned_memory(4 * _ERROR_WORDS)
        # A ctypes view, not a buffer export, so the memory can be freed later.
        self._error_words = (ctypes.c_uint32 * _ERROR_WORDS).from_address(self._error.ptr)
        ctypes.memset(self._error.ptr, 0, 4 * _ERROR_WORDS)
        self._error_ptr = self._error.ptr
        self._state = res.device_memory(len(layout.pack_state([], [], 0, 0, 0)))
        self._staged_table = res.device_memory(layout.TABLE_BYTES)
        return _hip.ipc_get_handle(self._buffer.ptr)

    def _map_peers(self, handles, bus_ids):
        bases = [self._buffer.ptr if r == self.rank else self._open_peer(r, h, bus_ids)
                 for r, h in enumerate(handles)]
        state = layout.pack_state(bases, [b + self._partial_offset for b in bases],
                                  self._error.ptr, self.rank, self.world)
        _hip.memcpy_htod(self._state.ptr, state)
        _hip.memcpy_htod(self._staged_table.ptr,
                         layout.pack_table([b + self._scratch_offset for b in bases]))

    def _open_peer(self, peer_rank, handle, bus_ids):
        try:
            return self._resources.peers.open(handle)
        except _hip.HipError as exc:
            if bus_ids[peer_rank] == bus_ids[self.rank]:
                raise
            raise PeerAccessError(self.rank, bus_ids[self.rank], peer_rank, bus_ids[peer_rank],
                                  f"mapping its memory failed ({exc})") from exc

    def _bus_id(self):
        return _hip.Device(self.device).pci_bus_id

    def _block_cap(self, sharing, functions):
        """Blocks per call of ``functions`` such that every rank's blocks fit on
        the GPU at once: with half of its block slots left to other kernels,
        and, where ranks share the GPU, at most one block per multiprocessor
        over all of them.

        Blocks spin on peers, so a block that cannot become resident because
        spinning blocks hold the slots it needs waits until the timeout; the
        ``sharing`` ranks on one GPU divide its slots.  Dividing all of them
        is not enough: with every slot spoken for, a rank's collective can
        queue behind one of its own small kernels (a copy, a fill, the
        caller's work) that finds no room beside the peers' spinning blocks.
        That was seen on the H200 at 3 and 4 ranks under MPS and vanished
        with half the slots.  Half is not enough either when a kernel's
        occupancy is high: MPS may keep blocks of different processes off one
        multiprocessor, and a grid spreads over as many multiprocessors as it
        has blocks.  At 3 ranks, kernels of 40 registers (3 blocks a
        multiprocessor, so 66 blocks a rank) left two ranks' spinning blocks
        on all 132 multiprocessors of the H200, and the third rank's kernel
        started only when they gave up, every time; 44 blocks a rank never
        did.  A rank alone on its GPU competes with no spinning peer there and
        may use every slot.
        """
        dev = _hip.Device(self.device)
        sms = dev.multiprocessor_count
        occupancy = min(f.max_active_blocks_per_multiprocessor(self._layout.threads)
                        for f in functions)
        slots = sms * occupancy
        per_rank = slots if sharing == 1 else max(1, min(slots // (2 * sharing), sms // sharing))
        return min(self._layout.max_blocks, sms, per_rank)

    def _allreduce_functions(self):
        return [self._function(algo, dtype)
                for algo in algorithms.ALGORITHMS for dtype in _KERNEL_TYPES]

    def _fused_block_caps(self, sharing):
        """Per (variant, dtype): the block cap over every row kernel of it
        (quantization kinds, packs per thread), in blocks of the all-reduce's
        threads; rmsnorm.row_launch scales it to a call's block size."""
        caps = {}
        for variant in algorithms.FUSED_VARIANTS + (algorithms.SPLIT, algorithms.LAMPORT):
            for dtype in _KERNEL_TYPES:
                per_thread = ((1,) if variant == algorithms.LAMPORT else
                              self._row_kernels.layout.packs_per_thread_choices(dtype.itemsize))
                caps[(variant, dtype)] = self._block_cap(sharing, [
                    self._fused_function(variant, dtype, code, p)
                    for code in rmsnorm.KERNEL_KINDS for p in per_thread])
        return caps

    def _fused_function(self, variant, dtype, quant_code, packs_per_thread):
        """The spinning kernel of a fused variant (split's first kernel, the
        same for every quantization kind)."""
        split = variant == algorithms.SPLIT
        key = ("rmsnorm", variant, dtype, 0 if split else quant_code & 0xF, packs_per_thread)
        function = self._functions.get(key)
        if function is None:
            if split:
                name = (f"pyar_allreduce_rmsnorm_split_{rmsnorm.DTYPES[dtype]}_"
                        f"p{packs_per_thread}_w{self.world}")
                types = rmsnorm.SPLIT_TYPES
            else:
                geometry = rmsnorm.RowLaunch(packs_per_thread, 0, 0)
                name = (f"pyar_allreduce_rmsnorm_{variant.replace('stage', '_stage')}_"
                        f"{rmsnorm.kernel_suffix(dtype, quant_code, geometry)}_w{self.world}")
                types = (rmsnorm.LAMPORT_TYPES if variant == algorithms.LAMPORT
                         else rmsnorm.FUSED_TYPES)
            function = self._row_kernels.function(name, types)
            self._functions[key] = function
        return function

    def _function(self, algo, dtype):
        key = (algo, dtype)
        function = self._functions.get(key)
        if function is None:
            name = f"pyar_allreduce_{algo.replace('shot', '_shot')}_{_KERNEL_TYPES[dtype]}_w{self.world}"
            function = self._module.get_function(name, _ALLREDUCE_TYPES)
            self._functions[key] = function
        return function

    def _shard_functions(self):
        return ([self._shard_function("reduce_scatter", d, o)
                 for d in _KERNEL_TYPES for o in _reduce_scatter_outputs(d)]
                + [self._shard_function("all_gather", d, d) for d in _KERNEL_TYPES])

    def _shard_function(self, operation, dtype, out_dtype):
        key = (operation, dtype, out_dtype)
        function = self._functions.get(key)
        if function is None:
            types = _KERNEL_TYPES[dtype]
            if operation == "reduce_scatter":
                types += "_" + _KERNEL_TYPES[out_dtype]
            function = self._shards_module.get_function(
                f"pyar_{operation}_{types}_w{self.world}", _SHARD_TYPES)
            self._functions[key] = function
        return function

    # --- state ----------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def _check_usable(self):
        if self._closed:
            raise ValueError("communicator is closed")
        if self._failure is not None:
            raise self._failure
        if self._node.failure is not None:
            raise self._node.failure

    def _check_kernel_failure(self):
        """Raise what a kernel recorded, once and from then on: MismatchError
        when the ranks' call signatures disagreed at a start barrier, else
        CollectiveTimeout naming the ranks that never arrived."""
        words = self._error_words if self.world > 1 else None
        if words is None or not words[_FAILED]:
            return
        number = int(words[_CALL])
        call = (self._replayed_call(number) or self._call_log.get(number % _CALL_LOG)
                or "a collective")
        if words[_MISMATCH]:
            calls = "; ".join(
                f"rank {r}: " + layout.describe_signature(
                    words[_SIGNATURES + 2 * r] | words[_SIGNATURES + 2 * r + 1] << 32)
                for r in range(self.world))
            self._failure = MismatchError(
                f"{call} on rank {self.rank}: the ranks called different collectives "
                f"({calls}); no rank read another's data, and the communicator is now "
                "closed to further calls")
        else:
            missing = [r for r in range(self.world) if words[_MISSING + r]]
            self._failure = CollectiveTimeout(call, missing, self.rank, self.timeout,
                                              sequence=number)
        raise self._failure

    def synchronize(self, stream=None):
        """Wait for this rank's calls on ``stream``; raise CollectiveTimeout if
        one of them gave up waiting for a peer, MismatchError if the ranks
        called different collectives."""
        self._check_usable()
        _hip.as_stream(stream).synchronize()
        self._check_kernel_failure()

    # --- arrays -----------------------------------------------------------------

    def _device_array(self, x, what, stream=None):
        """``x`` as a DeviceArray; a foreign array's producer orders its
        pending work before ``stream``, where the call's kernels read and
        write it (the DLPack and array-interface contract)."""
        if isinstance(x, np.ndarray):
            raise TypeError(f"{what} is a host (numpy) array; copy it to the GPU with "
                            "pyar.asarray first")
        given = x
        if not isinstance(x, DeviceArray):
            x = asarray(x, stream=stream)
        if x.dtype not in _KERNEL_TYPES:
            raise TypeError(f"{what} has dtype {x.dtype}; all-reduce supports "
                            f"{', '.join(str(d) for d in _KERNEL_TYPES)}")
        if x.size and x.device != self.device:
            raise ValueError(f"{what} lives on device {x.device}, this communicator on "
                             f"device {self.device}")
        if given is not x:
            self._foreign.remember(given, x)  # recognized by the next call's replay
        return x

    def _output(self, x, out, stream):
        """The all-reduce's output: like ``x``; ``x`` itself for in place."""
        given = out
        out = self._checked_output(out, x.shape, (x.dtype,), stream, " like the input")
        if given is not None and out.ptr != x.ptr and _overlap(out, x):
            raise ValueError("out partially overlaps the input; pass the input itself "
                             "(in place) or a separate array")
        return out

    def _checked_output(self, out, shape, dtypes, stream, like="", any_shape=False):
        """``out`` checked to have ``shape`` (with ``any_shape``: as many
        elements) and one of ``dtypes``, and to be writable and aligned; a new
        array of ``shape`` and ``dtypes[0]`` when None."""
        if out is None:
            # Ordered on the call's stream, the null stream included: dropping
            # the result frees it there, without waiting for the device.
            return empty(shape, dtypes[0], stream=_hip.as_stream(stream))
        out = self._device_array(out, "out", stream)
        fits = out.size == int(np.prod(shape)) if any_shape else out.shape == shape
        if not fits or out.dtype not in dtypes:
            elements = f" ({int(np.prod(shape))} elements)" if any_shape else ""
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected "
                             f"{shape}{elements} and {' or '.join(map(str, dtypes))}{like}")
        if out.readonly:
            raise ValueError("out is a read-only array")
        if out.size and out.ptr % layout.PACK_BYTES:
            raise ValueError(f"out is not {layout.PACK_BYTES}-byte aligned "
                             f"(address {out.ptr:#x})")
        return out

    # --- collectives ------------------------------------------------------------

    @_host_step("register")
    def register(self, x):
        """Exchange ``x``'s IPC handle once (collective), so that later
        all-reduces of ``x`` read it in place instead of staging a copy.

        Every rank registers its own buffer of the same size, and every rank
        must then pass its registered buffer to the same calls.  The
        communicator keeps the buffer alive until it is closed or
        ``unregister(x)`` lets go of it: dropped while registered, it is not
        freed, so no peer ever reads another buffer at its address through
        a stale mapping.

        Memory from the stream-ordered pool (``pyar.empty`` and friends
        without ``ipc=True``) cannot be shared between processes and is refused.
        """
        self._check_usable()
        x = self._device_array(x, "x")
        if x.ptr % layout.PACK_BYTES:
            raise ValueError(f"a registered buffer must be {layout.PACK_BYTES}-byte aligned "
                             f"(address {x.ptr:#x})")
        if x.stream_ordered:
            raise ValueError("x comes from the stream-ordered pool, whose memory other "
                             "processes cannot map; allocate buffers to register with "
                             "ipc=True (pyar.empty(shape, dtype, ipc=True))")
        if self.world == 1:
            return
        self._registry.register(x)
        self._forget_plans()  # calls on x now read it in place

    @_host_step("unregister")
    def unregister(self, x):
        """Undo ``register(x)`` (collective, bounded like it): later calls on
        ``x`` stage it again, and the communicator no longer keeps it alive.

        Every rank unregisters its own registered buffer of the same size.
        Each waits for the work it queued on the device (so no kernel of it
        still reads a peer's buffer) and unmaps the peers' buffers; no rank
        returns before every rank has, so the buffer may be freed as soon as
        this returns.  Refused while a graph captured with ``capture()``
        that read ``x`` in place is still open (close it first); graphs
        captured with plain ``pyar.capture`` that read it must be closed too.
        Not during a capture.
        """
        self._check_usable()
        x = self._device_array(x, "x")
        if self.world == 1:
            return
        exchange.run_everywhere(self._node, self._refuse_captured, x)
        self._forget_plans()  # calls on x are planned again, staged
        self._registry.unregister(x)

    def _refuse_captured(self, x):
        if not self._registry.captured(x):
            return
        graphs = [g for g in self._captures if g.executable is not None
                  or (not g.stream.closed and g.stream.is_capturing)]
        if graphs:
            raise ValueError(f"x is read in place by graphs captured with this communicator, "
                             f"and {len(graphs)} of its graphs are still open or capturing; "
                             "close them (graph.close()) before unregister(x)")

    @_host_step("register_graph_buffers")
    def register_graph_buffers(self):
        """Collective: exchange the handles of the unregistered inputs that
        captured all-reduces read in place, so the captured graphs can run.

        ``capture()`` calls it when its block ends.  Every rank must have
        captured the same collectives in the same order.
        """
        self._check_usable()
        if self.world > 1:
            self._registry.exchange_deferred()
            self._forget_plans()

    def capture(self, stream, mode="global"):
        """``with comm.capture(stream) as graph:`` -- pyar.capture plus
        register_graph_buffers() when the block ends (collectively: if the
        block raised on any rank, every rank raises).  ``close()`` closes the
        graph too: replaying it afterwards raises instead of reading freed
        memory.  (Graphs captured with plain ``pyar.capture`` must be closed
        before the communicator.)"""
        return _CollectiveCapture(self, stream, mode)

    @_host_step("the exchange at the end of a capture")
    def _finish_capture(self, failed):
        failures = self._node.allgather(failed)
        if any(failures):
            if self.world > 1:
                self._registry.discard_deferred()
            if not failed:
                ranks = [r for r, f in enumerate(failures) if f]
                raise RuntimeError(f"the capture failed on rank(s) {ranks}; its graph is "
                                   "discarded on every rank")
            return
        self.register_graph_buffers()

    def allreduce(self, x, out=None, algo="auto", stream=None):
        """Sum ``x`` over all ranks into ``out`` (a new array if None; ``x``
        itself for in place), queued on ``stream``.  Returns ``out`` as a pyar
        DeviceArray: itself, or a view of a CuPy/PyTorch ``out`` (whose own
        object holds the sum too).

        Asynchronous like a kernel launch; ``synchronize()`` waits and reports
        a peer that never arrived as CollectiveTimeout.  A new ``out`` comes
        from the stream-ordered pool on ``stream``.
        """
        replayed = self._replay_allreduce(x, out, algo, stream)
        if replayed is not None:
            return replayed
        given = x, out, algo
        self._check_usable()
        x, out, algo, registered = self._prepared(
            "allreduce", "all-reduce (elements, dtype, algorithm, registered input)",
            lambda x, out, algo, registered: (x.size, str(x.dtype), algo, registered is not None),
            self._prepare, x, out, algo, stream)
        if x.size == 0:
            return out
        return self._queue_planned("allreduce", given[:2], given[2:], stream, x, out,
                                   lambda: self._allreduce_steps(x, out, algo, registered))

    def _prepared(self, kind, what, agreement, prepare, *args):
        """``prepare(*args)``: the call's checked arguments.  Under PYAR_DEBUG
        it runs on every rank together, so that a rank whose arguments are
        wrong raises on every rank instead of leaving peers waiting, and the
        ranks' ``agreement(*prepared)`` must be equal (MismatchError naming
        ``what`` if not), before any launch."""
        if not (self.debug and self.world > 1):
            return prepare(*args)
        with self._node.step(f"{kind} (PYAR_DEBUG check)"):
            prepared = exchange.run_everywhere(self._node, prepare, *args)
            exchange.check_agreement(self._node, f"the {what}", agreement(*prepared))
        return prepared

    def _prepare(self, x, out, algo, stream):
        """The call's arrays, algorithm and input table (None: staged)."""
        algorithms.validate(algo)
        x = self._device_array(x, "x", stream)
        out = self._output(x, out, stream)
        if self.world == 1 or x.size == 0:
            return x, out, algo, None
        registered = self._input_table(x, stream)
        return x, out, self._plan(x, out, algo, registered is not None), registered

    def _input_table(self, x, stream):
        """The registered table peers read ``x`` through, or None (staged)."""
        source = _hip.as_stream(stream)
        if source.handle and source.is_capturing and not x.stream_ordered:
            # Recorded, not staged: the graph reads x in place once the ranks
            # have exchanged its handle (register_graph_buffers).  Pool
            # memory cannot be exchanged, so a capture stages it.
            return self._registry.defer(x)
        return self._registry.lookup(x.ptr, x.nbytes)

    def _plan(self, x, out, algo, registered):
        in_place_registered = registered and out.ptr == x.ptr
        if algo == "auto":
            algo = algorithms.choose(x.nbytes, self.world)
            # One-shot writes its output while peers still read its input.
            return "twoshot" if in_place_registered else algo
        if algo == "oneshot" and in_place_registered:
            raise ValueError("algo='oneshot' cannot write in place over a registered input "
                             "(peers are still reading it); use 'twoshot' or 'auto'")
        return algo

    def _allreduce_steps(self, x, out, algo, registered):
        """The copies and launches of one all-reduce, chunk by chunk."""
        function = self._function(algo, x.dtype)
        itemsize = x.dtype.itemsize
        lanes = layout.PACK_BYTES // itemsize
        threads = self._layout.threads
        chunk = self.max_size // itemsize
        for first in range(0, x.size, chunk):
            count = min(chunk, x.size - first)
            offset = first * itemsize
            table, in_offset, stage_from, copy = self._chunk_input(x, offset, count * itemsize,
                                                                  registered)
            if copy is not None:
                yield copy
            packs = count // lanes
            work = packs if algo == "oneshot" else -(-packs // self.world)
            blocks = min(self._max_blocks, max(1, -(-work // threads)))
            signature = layout.signature(algo, count, x.dtype, registered is not None,
                                         more=first + count < x.size)
            yield ("kernel", function, blocks, threads,
                   (table, in_offset, stage_from, out.ptr + offset, self._state.ptr, count,
                    self._timeout_ns, signature), "allreduce", f"({algo}, {count} x {x.dtype})")

    def _run_step(self, step, stream):
        """Queue one step of a collective (``_allreduce_steps`` and the
        like); a kernel's last argument is its call number, a local kernel
        (one that waits for no peer) has none."""
        if step[0] == "copy":
            _, dst, src, nbytes = step
            _hip.memcpy_dtod(dst, src, nbytes, stream)
            return
        if step[0] == "local":
            _, function, grid, block, args = step
            function.launch(grid, block, args, stream=stream)
            return
        _, function, grid, block, args, kind, details = step
        function.launch(grid, block, (*args, self._next_call(kind, details)), stream=stream)

    def _chunk_input(self, x, offset, nbytes, registered):
        """(input table, pack offset, input to stage, copy step) of one chunk's
        kernel: the registered buffer read in place; or the chunk staged into
        this rank's scratch buffer (which the staged table names on every
        rank) by the kernel itself, before its start barrier (the address to
        stage from; no copy step); or, for an input that is not 16-byte
        aligned (the kernel copies whole packs), by a copy step queued before
        the kernel, which then stages nothing."""
        if registered is not None:
            return registered, offset // layout.PACK_BYTES, 0, None
        if (x.ptr + offset) % layout.PACK_BYTES == 0:
            return self._staged_table.ptr, 0, x.ptr + offset, None
        return self._staged_table.ptr, 0, 0, ("copy", self._buffer.ptr + self._scratch_offset,
                                              x.ptr + offset, nbytes)

    def _next_call(self, kind, details):
        """The 32-bit sequence number the kernel reports on timeout; the log
        turns it back into a description of the call."""
        call = self._calls & 0xFFFFFFFF
        self._call_log[call % _CALL_LOG] = f"{kind} call {self._calls} {details}"
        self._checked_call(call)
        self._calls += 1
        return call

    # --- reduce-scatter and all-gather --------------------------------------------

    def reduce_scatter(self, x, out=None, stream=None):
        """Sum ``x`` over all ranks and return this rank's shard of the sum
        (1-D), queued on ``stream``; asynchronous like ``allreduce``.

        Shards (pyar/comm/shards.py): with L = 16 // x.itemsize and n =
        x.size, ``shard = L * ceil(n / (L * world))`` and rank r gets elements
        ``[min(n, r * shard), min(n, (r + 1) * shard))`` of the flattened sum:
        contiguous, in rank order, the last shards shorter or empty.  Sums run
        in float32 in rank order, so every rank's shard holds the bits an
        ``allreduce`` of ``x`` would.  ``out`` (a new array if None) has that
        many elements and x's dtype, or float32 for a float16/bfloat16 ``x``:
        the sums unrounded.  It must not overlap ``x``.  Inputs are staged,
        registered or captured like ``allreduce``'s.
        """
        replayed = self._replay_shards("reduce_scatter", x, out, (), stream)
        if replayed is not None:
            return replayed
        given = x, out
        self._check_usable()
        x, out, registered = self._prepared(
            "reduce_scatter", "reduce_scatter (elements, dtype, output dtype, registered input)",
            lambda x, out, registered: (x.size, str(x.dtype), str(out.dtype),
                                        registered is not None),
            self._prepare_reduce_scatter, x, out, stream)
        if x.size == 0:
            return out
        return self._queue_planned("reduce_scatter", given, (), stream, x, out,
                                   lambda: self._reduce_scatter_steps(x, out, registered))

    def _prepare_reduce_scatter(self, x, out, stream):
        """The call's arrays and input table (None: staged)."""
        x = self._device_array(x, "x", stream)
        length = shards.length(x.size, self.world, x.dtype.itemsize, self.rank)
        dtypes = _reduce_scatter_outputs(x.dtype)
        if self.world == 1 and x.dtype != _FLOAT32:
            dtypes = (x.dtype,)  # no widening kernel runs in a world of one
        out = self._checked_output(out, (length,), dtypes, stream,
                                   f" (this rank's shard of {x.size} elements)")
        if _overlap(out, x):
            raise ValueError("out overlaps the input x; reduce_scatter needs a separate "
                             "array")
        if self.world == 1 or x.size == 0:
            return x, out, None
        return x, out, self._input_table(x, stream)

    def _reduce_scatter_steps(self, x, out, registered):
        """The copies and launches of one reduce_scatter, a run of every
        shard per launch.  Staged: the run of shard q goes to scratch element
        q * count, where every rank's kernel reads the run of its own shard."""
        n, itemsize, world = x.size, x.dtype.itemsize, self.world
        shard = shards.shard_size(n, world, itemsize)
        function = self._shard_function("reduce_scatter", x.dtype, out.dtype)
        signature = layout.signature("reduce_scatter", n, x.dtype, registered is not None,
                                     int(out.dtype != x.dtype))
        most = shards.chunk_elements(self.max_size // itemsize // world, itemsize)
        scratch = self._buffer.ptr + self._scratch_offset
        for first, count in shards.chunks(n, world, itemsize, most):
            if registered is not None:
                table, in_offset, in_stride = registered, first, shard
            elif count == shard:  # the whole shards: the scratch holds x as it is
                table, in_offset, in_stride = self._staged_table.ptr, 0, count
                yield ("copy", scratch, x.ptr, x.nbytes)
            else:
                table, in_offset, in_stride = self._staged_table.ptr, 0, count
                for q in range(world):
                    run = shards.run_length(n, world, itemsize, q, first, count)
                    if run:
                        yield ("copy", scratch + q * count * itemsize,
                               x.ptr + (q * shard + first) * itemsize, run * itemsize)
            yield ("kernel", function, self._shard_blocks(count, itemsize),
                   self._layout.threads,
                   (table, in_offset, in_stride, out.ptr + first * out.dtype.itemsize,
                    self._state.ptr, n, shard, first, count, self._timeout_ns, signature),
                   "reduce_scatter", f"({n} x {x.dtype} to {out.dtype}, shard elements "
                   f"{first}..{first + count})")

    def all_gather(self, x, out=None, stream=None, n=None):
        """Concatenate every rank's shard ``x`` in rank order into the whole
        array of ``n`` elements, on every rank; returns ``out`` (a DeviceArray,
        as ``allreduce`` does), queued on ``stream`` and asynchronous like
        ``allreduce``.

        ``x`` is this rank's shard under the rule of ``reduce_scatter``
        (pyar/comm/shards.py): with L = 16 // x.itemsize, ``shard = L *
        ceil(n / (L * world))``, rank r's shard is elements ``[min(n, r *
        shard), min(n, (r + 1) * shard))``.  Shard lengths alone do not tell n,
        so pass ``out`` (n elements of x's dtype, any shape) or ``n`` (a new
        1-D ``out``).  ``x`` may be this rank's shard of ``out`` itself (in
        place); no other overlap.  Inputs are staged, registered or captured
        like ``allreduce``'s; a registered or captured input is read in place
        only when every shard has the same length (n a multiple of
        L * world), else staged.
        """
        replayed = self._replay_shards("all_gather", x, out, (n,), stream)
        if replayed is not None:
            return replayed
        given = x, out
        self._check_usable()
        x, out, registered = self._prepared(
            "all_gather", "all_gather (elements, dtype, registered input)",
            lambda x, out, registered: (out.size, str(x.dtype), registered is not None),
            self._prepare_all_gather, x, out, stream, n)
        if out.size == 0:
            return out
        return self._queue_planned("all_gather", given, (n,), stream, x, out,
                                   lambda: self._all_gather_steps(x, out, registered))

    def _prepare_all_gather(self, x, out, stream, n):
        """The call's arrays and input table (None: staged)."""
        x = self._device_array(x, "x", stream)
        itemsize = x.dtype.itemsize
        if n is None:
            if out is None:
                raise TypeError("all_gather needs out= or n= (the whole array's element "
                                "count), which the shard lengths do not tell")
            out = self._device_array(out, "out", stream)
            n = out.size
        elif isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        n = int(n)
        start, end = shards.bounds(n, self.world, itemsize, self.rank)
        if x.size != end - start:
            raise ValueError(
                f"x has {x.size} elements; rank {self.rank}'s shard of {n} elements on "
                f"{self.world} ranks has {end - start} (elements {start}..{end}: shards of "
                f"{shards.shard_size(n, self.world, itemsize)} in rank order, the last "
                "shorter or empty)")
        out = self._checked_output(out, (n,), (x.dtype,), stream, any_shape=True)
        if x.size and out.ptr + start * itemsize != x.ptr and _overlap(out, x):
            raise ValueError(f"out overlaps the input x; pass a separate array or, in "
                             f"place, x at this rank's shard of out ({start * itemsize} "
                             "bytes in)")
        shard = shards.shard_size(n, self.world, itemsize)
        if self.world == 1 or n == 0 or n != self.world * shard:
            return x, out, None  # uneven shards: their buffers differ in size, so staged
        return x, out, self._input_table(x, stream)

    def _all_gather_steps(self, x, out, registered):
        """The copies and launches of one all_gather, a run of every shard per
        launch.  Staged: this rank's run goes to scratch element 0."""
        n, itemsize, world = out.size, x.dtype.itemsize, self.world
        shard = shards.shard_size(n, world, itemsize)
        function = self._shard_function("all_gather", x.dtype, x.dtype)
        signature = layout.signature("all_gather", n, x.dtype, registered is not None)
        most = shards.chunk_elements(self.max_size // itemsize, itemsize)
        scratch = self._buffer.ptr + self._scratch_offset
        for first, count in shards.chunks(n, world, itemsize, most):
            if registered is not None:
                table, in_offset = registered, first
            else:
                table, in_offset = self._staged_table.ptr, 0
                run = shards.run_length(n, world, itemsize, self.rank, first, count)
                if run:
                    yield ("copy", scratch, x.ptr + first * itemsize, run * itemsize)
            yield ("kernel", function, self._shard_blocks(count, itemsize),
                   self._layout.threads,
                   (table, in_offset, 0, out.ptr, self._state.ptr, n, shard, first, count,
                    self._timeout_ns, signature),
                   "all_gather", f"({n} x {x.dtype}, shard elements {first}..{first + count})")

    def _shard_blocks(self, count, itemsize):
        """Blocks of a reduce_scatter/all_gather launch covering ``count``
        elements of each shard: a thread per pack, within the cap."""
        packs = -(-count // shards.lanes(itemsize))
        return min(self._max_shard_blocks, max(1, -(-packs // self._layout.threads)))

    def _queue_planned(self, kind, given, rest, stream, x, out, plan):
        """Queue a checked call's steps, ``plan()`` (a world of one copies
        ``x`` into ``out`` instead), and remember them for its signature
        (``given``: its x and out as passed); returns ``out``."""
        if self.world == 1:
            steps = [("copy", out.ptr, x.ptr, x.nbytes)] if out.ptr != x.ptr else []
        else:
            self._check_kernel_failure()
            steps = list(plan())
        for step in steps:
            self._run_step(step, stream)
        fresh = None if given[1] is not None else (
            out.shape, out.dtype, out.nbytes, (out.ptr, out.ptr + out.nbytes))
        self._remember(kind, given, rest, stream, steps, fresh, out.dtype)
        return out

    # --- fused all-reduce + RMSNorm ---------------------------------------------

    def allreduce_rmsnorm(self, x, residual, weight, eps=1e-6, out=None, residual_out=None,
                          stream=None, *, quant=None, group_size=128, fp8_dtype=None,
                          quantized=None, scales=None, algo="auto"):
        """Sum ``x`` (tokens, hidden) over all ranks, add ``residual``, RMSNorm
        with ``weight`` (hidden,), optionally quantize -- in one kernel.

        ``r = sum(x) + residual`` goes to ``residual_out`` (``residual`` itself
        when None: in place); ``y = r / sqrt(mean(r**2) + eps) * weight`` to
        ``out`` (a new array when None and no ``quant``).  Sums run in float32
        in rank order, so every rank gets the same bits for the same residual
        and weight; r is rounded to the dtype before y is computed from it.

        ``quant``: None, "fp8_per_token", "fp8_per_group" (``group_size``
        elements per scale) or "mxfp4" (OCP MX: E2M1 codes two per byte, even
        index in the low nibble, one E8M0 scale per 32); ``fp8_dtype`` defaults
        to float8_e4m3fnuz on gfx94x and float8_e4m3fn elsewhere.  The
        definitions are those of ``pyar.quant``, which also dequantizes.  With
        ``quant`` the normed output is written only when ``out`` is given.

        ``algo``: "auto", "onestage" (every rank reads all peers' rows),
        "twostage" (reduce-scatter pushing the sums to every rank, then every
        rank norms), "split" (two-stage as two kernels: the reduce-scatter
        pushing the sums, then the norms on the whole GPU; what "auto" runs
        past the fused crossover), "lamport" (one-stage without barriers: every
        rank stores its rows into every rank's receive slot and norms from its
        own; what "auto" runs for small inputs, up to
        ``algorithms.LAMPORT_MAX_BYTES``; rows up to 16 KiB and inputs up to
        min(1 MiB, max_size) only; a -0.0 that every rank passes sums to +0.0)
        or "unfused" (the all-reduce, then add + RMSNorm (+ quantization) as a
        separate kernel).
        Eager, on registered inputs and under graph capture like
        ``allreduce``.  Returns FusedOutputs(out, residual_out, quantized,
        scales) (None where not written), DeviceArrays as ``allreduce`` returns
        ``out``.
        """
        arrays = (x, residual, weight, out, residual_out, quantized, scales)
        scalars = (eps, quant, group_size, fp8_dtype, algo)
        replayed = self._replay_rmsnorm(arrays, scalars, stream)
        if replayed is not None:
            return rmsnorm.FusedOutputs._make(replayed)
        self._check_usable()
        call, algo, registered = self._prepared(
            "allreduce_rmsnorm", "allreduce_rmsnorm (tokens, hidden, dtype, quantization, "
            "algorithm, registered input)",
            lambda call, algo, registered: (*call.agreement_key(), algo, registered is not None),
            self._prepare_rmsnorm, x, residual, weight, eps, out, residual_out, stream, quant,
            group_size, fp8_dtype, quantized, scales, algo)
        if call.tokens == 0:
            return call.outputs()
        if self.world == 1:
            self._row_kernels.add_rmsnorm(call, stream, self._local_blocks())
            return call.outputs()
        self._check_kernel_failure()
        steps = self._launch_rmsnorm(call, algo, registered, stream)
        outputs = call.outputs()
        # Replayed only when every output is an argument: a new array per
        # call would need its own allocation and address in the plan.
        returns = tuple(-1 if a is None else next((i for i, b in enumerate(arrays) if b is a), None)
                        for a in outputs)
        if None not in returns:
            self._remember("allreduce_rmsnorm", arrays, scalars, stream, steps, returns=returns)
        return outputs

    def _local_blocks(self):
        return _hip.Device(self.device).multiprocessor_count * 2

    def _prepare_rmsnorm(self, x, residual, weight, eps, out, residual_out, stream, quant,
                         group_size, fp8_dtype, quantized, scales, algo):
        algorithms.validate_fused(algo)
        if self._row_kernels is None:  # a world of one loads them on first use
            self._row_kernels = rmsnorm.RowKernels(self._load_module("allreduce_rmsnorm"))
        call = rmsnorm.RowCall(x, residual, weight, eps, out, residual_out, quant, group_size,
                               fp8_dtype, quantized, scales, stream, self.device,
                               self._row_kernels.layout)
        row_bytes = call.hidden * call.x.dtype.itemsize
        if row_bytes > self.max_size:
            raise ValueError(f"a row of {row_bytes} bytes does not fit the communicator's "
                             f"scratch buffer (max_size {self.max_size})")
        if algo == algorithms.LAMPORT:  # refused alike at every world size
            refusal = self._lamport_refusal(call.x.nbytes, row_bytes)
            if refusal:
                raise ValueError(f"algo='lamport' {refusal}")
        if self.world == 1 or call.tokens == 0:
            return call, algo, None
        if algo == "auto":
            algo = self._choose_fused(call.x.nbytes, row_bytes)
        if algo == algorithms.LAMPORT:
            return call, algo, None  # peers never read x: nothing to register
        return call, algo, self._input_table(call.x, stream)

    def _lamport_refusal(self, nbytes, row_bytes):
        """Why the lamport kernels cannot take an input of ``nbytes`` in rows
        of ``row_bytes``, or None when they can."""
        widest = self._row_kernels.layout.max_row_threads * layout.PACK_BYTES
        if row_bytes > widest:
            return (f"takes rows up to {widest} bytes (one 16-byte pack per thread), "
                    f"got {row_bytes}")
        if nbytes > self._lamport_bytes:
            return (f"takes inputs up to {self._lamport_bytes} bytes (its receive slots), "
                    f"got {nbytes}")
        return None

    def _choose_fused(self, nbytes, row_bytes):
        """What ``algo="auto"`` runs for an input of ``nbytes`` in rows of ``row_bytes``."""
        return algorithms.choose_fused(nbytes, self.world, self._shared_gpu, row_bytes,
                                       self._lamport_refusal(nbytes, row_bytes) is None)

    def _launch_rmsnorm(self, call, algo, registered, stream):
        """Queue the fused call's steps; returns them, for its plan."""
        steps = (self._unfused_steps(call, registered, stream) if algo == algorithms.UNFUSED
                 else list(self._rmsnorm_steps(call, algo, registered)))
        for step in steps:
            self._run_step(step, stream)
        return steps

    def _rmsnorm_steps(self, call, algo, registered):
        """The copies and launches of one fused allreduce_rmsnorm, chunk by
        chunk.  Split's second kernel follows its first on the same stream
        (in a captured graph too: both are steps), reading the sums from this
        rank's gather buffer, which the next chunk's first kernel fills again
        only after every rank's start barrier (the proof at split_reduce),
        and writing nothing once a first kernel of this rank failed (the
        Signal's failure word: a failed call leaves stale sums there)."""
        dtype = call.x.dtype
        if algo == algorithms.LAMPORT:
            yield self._lamport_step(call)
            return
        row_bytes = call.hidden * dtype.itemsize
        chunk = self.max_size // row_bytes
        for first in range(0, call.tokens, chunk):
            count = min(chunk, call.tokens - first)
            offset = first * row_bytes
            table, in_offset, stage_from, copy = self._chunk_input(
                call.x, offset, count * row_bytes, registered)
            if copy is not None:
                yield copy
            function, geometry = self._fused_launch(algo, dtype, count, call.hidden,
                                                    call.quant_code)
            details = f"({algo}, {count} x {call.hidden} {dtype})"
            signature = layout.signature(algo, count * call.hidden, dtype,
                                         registered is not None, call.quant_code & 0xF,
                                         more=first + count < call.tokens)
            if algo != algorithms.SPLIT:
                yield ("kernel", function, geometry.blocks, geometry.threads,
                       (table, in_offset, stage_from, count, *call.row_args(first, count),
                        self._state.ptr, self._timeout_ns, signature), "allreduce_rmsnorm",
                       details)
                continue
            yield ("kernel", function, geometry.blocks, geometry.threads,
                   (table, in_offset, stage_from, count, call.hidden, self._state.ptr,
                    self._timeout_ns, signature), "allreduce_rmsnorm", details)
            yield ("local", *self._row_kernels.add_rmsnorm_launch(
                call, self._buffer.ptr + self._partial_offset, first, count,
                self._local_blocks(), self._buffer.ptr + self._layout.failed_offset))

    def _lamport_step(self, call):
        """The one launch of a lamport call (it fits one slot: _prepare_rmsnorm)."""
        dtype = call.x.dtype
        function, geometry = self._fused_launch(algorithms.LAMPORT, dtype, call.tokens,
                                                call.hidden, call.quant_code)
        signature = layout.signature(algorithms.LAMPORT, call.tokens * call.hidden, dtype,
                                     False, call.quant_code & 0xF)
        return ("kernel", function, geometry.blocks, geometry.threads,
                (call.x.ptr, call.tokens, *call.row_args(0, call.tokens), self._state.ptr,
                 self._buffer.ptr + self._lamport_offset,
                 self._lamport_offset - self._partial_offset,
                 self._lamport_bytes // layout.PACK_BYTES, self._timeout_ns, signature),
                "allreduce_rmsnorm", f"(lamport, {call.tokens} x {call.hidden} {dtype})")

    def _fused_launch(self, algo, dtype, tokens, hidden, quant_code):
        """The fused kernel and its rmsnorm.RowLaunch for ``tokens`` rows."""
        geometry = self._row_kernels.launch(tokens, hidden, dtype,
                                            self._max_fused_blocks[(algo, dtype)],
                                            self._layout.max_blocks, self._layout.threads)
        return self._fused_function(algo, dtype, quant_code, geometry.packs_per_thread), geometry

    def _unfused_steps(self, call, registered, stream):
        """The same outputs from the separate steps: the all-reduce's (into
        ``out``, or the communicator's sum array when only quantized output
        is wanted), then add + RMSNorm (+ quantization) on this GPU, in place
        over the sum (a row's sums are loaded before its y is stored)."""
        s = call.out if call.out is not None else self._unfused_sums_like(call.x, stream)
        algo = self._plan(call.x, s, "auto", registered is not None)
        return [*self._allreduce_steps(call.x, s, algo, registered),
                ("local", *self._row_kernels.add_rmsnorm_launch(
                    call, s.ptr, 0, call.tokens, self._local_blocks()))]

    def _unfused_sums_like(self, x, stream):
        """The communicator's sum array, viewed as ``x``.  Kept, not freed
        after the call: its kernels are still queued, and plans name it.
        Calls are ordered on one stream, so the next call may reuse it."""
        if self._unfused_sums is None or self._unfused_sums.nbytes < x.nbytes:
            self._forget_plans()  # before the array they name goes
            self._unfused_sums = empty((x.nbytes,), np.uint8, stream=stream)
        return DeviceArray.from_pointer(self._unfused_sums.ptr, x.shape, x.dtype,
                                        owner=self._unfused_sums, device=self.device)

    # --- teardown ---------------------------------------------------------------

    @_host_step("close")
    def close(self):
        """Release GPU memory and peer mappings (collective: peers unmap this
        rank's memory before it is freed).  Later calls raise.

        Bounded by the timeout: after a failure (a CollectiveTimeout or a
        MismatchError seen before), this rank's kernels still waiting for
        peers give up at once, a peer that never closes is expected, and
        close() returns once twice the timeout has passed, its resources
        released; otherwise such a peer makes it raise CollectiveTimeout
        naming it, after releasing this rank's resources all the same.
        ``abort`` says how the surviving ranks go on without a lost one."""
        if self._closed:
            return
        failed_before = self._failure is not None or self._node.failure is not None
        self._stop(give_up=failed_before)
        try:
            self._resources.close_mappings()
            self._node.Barrier()
        except CollectiveTimeout:
            if not failed_before:
                raise
        finally:
            self._resources.free()
            self._registry = None  # lets go of the registered buffers
            self._node.Free()

    def abort(self):
        """Give up on the peers at once: no collective step, no wait for them.

        Closes the graphs captured with ``capture()``, makes this rank's
        kernels still waiting for peers stop waiting, waits for them (a
        millisecond once they see it), unmaps the peers' memory and frees
        this rank's; the communicator is closed afterwards.  Peers in or
        entering a collective with this rank raise CollectiveTimeout naming
        it within their timeout (twice that in a host-side step such as
        ``register``), and their close() returns within twice the timeout.
        Its MPI communicator is left allocated: freeing one is collective.

        Going on without a lost rank (aborted, hung, or dead): every
        survivor closes (or aborts) its communicator, then builds a new one
        over a communicator of the survivors, on the same GPUs.  Make it with
        ``Create_group``, in which only the group's ranks take part, not with
        ``Split``, which is collective over the whole parent and would wait
        for the lost rank forever::

            survivors = mpi_comm.Get_group().Excl(lost_ranks)
            comm = pyar.Communicator(mpi_comm.Create_group(survivors))
        """
        if self._closed:
            return
        self._stop(give_up=True)
        try:
            self._resources.close_mappings()
        finally:
            self._resources.free()
            self._registry = None
            self._node.abandon()

    def _stop(self, give_up):
        """Refuse further calls and close the captured graphs; with
        ``give_up``, this rank's kernels still waiting for peers stop (they
        read the failed word of the error record)."""
        self._closed = True
        self._forget_plans()
        self._finalizer.detach()
        if give_up and self.world > 1:
            self._error_words[0] = 1
        for graph in list(self._captures):
            graph.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"device {self.device}"
        return f"<pyar.Communicator rank {self.rank} of {self.world}, {state}>"


def _reduce_scatter_outputs(dtype):
    """reduce_scatter's output dtypes for input ``dtype``: its own, and
    float32 (unrounded sums) for a 16-bit one."""
    return (dtype,) if dtype == _FLOAT32 else (dtype, _FLOAT32)


def _overlap(a, b):
    return a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


class _CollectiveCapture(_hip.capture):
    def __init__(self, comm, stream, mode):
        comm._check_usable()
        super().__init__(stream, mode)
        self._comm = comm
        comm._captures.add(self)

    def __exit__(self, exc_type, exc, tb):
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            self._comm._finish_capture(failed=exc_type is not None)
        return False
