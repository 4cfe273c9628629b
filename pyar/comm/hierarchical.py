"""pyar.Communicator across IPC domains (nodes): pyar's kernels inside each
domain, MPI between them.

allreduce(x), in pieces of ``local world * PIECE_SHARD_ELEMENTS`` elements:
1. the domain's reduce_scatter (pyar kernel) of the piece into a float32
   shard per rank (16-bit inputs are summed, not rounded: one rounding in
   all, at the end);
2. the shard summed over the rail (the ranks with this domain rank on
   every domain), the same bits on every rail rank, rounded once to the
   input's dtype, on one of two data paths (pyar.comm.inter_node):
   - "host": copied to pinned host memory, summed by pyar.comm.rail
     (all-gather or reduce-scatter over MPI, added on the host), copied back;
   - "device": MPI all-gathers the device shards straight into a device
     buffer (pyar.comm.rail.gather_on_device), and a pyar kernel adds them in
     domain order (pyar.comm.rail_kernel), the host path's additions in the
     same order, so both paths give the same bits;
3. the domain's all_gather (pyar kernel) into the output.
Every element is summed once, in one order, so every rank of every domain
gets the same bits.  Piece p + 1's reduce-scatter (and copy to the host) is
queued before the host waits for piece p's, so the GPU works on the next
piece while MPI moves this one (double-buffered device and pinned buffers).

"device" is taken only with an MPI library that takes device pointers in
this run (pyar.diagnostics.mpi_gpu_awareness; "auto" stages when unsure):
handing them to one that does not segfaults (Open MPI 4.1.6 as Ubuntu ships
it).  ``inter_node`` says which path a communicator took, ``gpu_aware_mpi``
what the library said.

Limits: a collective that crosses domains cannot be captured in a graph (its
MPI calls run on the host, outside any stream), and each call waits on the
host for its reduce-scatters to finish (the caller's stream holds only the
all-gathers when it returns).
"""
import weakref

import numpy as np
from mpi4py import MPI

from pyar import _hip
from pyar.array import DeviceArray, empty
from pyar.comm import exchange, inter_node as paths, operations, rail, rail_kernel, row_kernels
from pyar.comm import shards
from pyar.comm.bounded import BoundedComm
from pyar.comm.communicator import DEFAULT_MAX_SIZE, DEFAULT_TIMEOUT, NodeCommunicator
from pyar.comm.errors import CollectiveTimeout
from pyar.comm.resources import Resources

PIECE_SHARD_ELEMENTS = 1 << 19  # float32 elements of one rank's shard per piece (2 MiB)


class CaptureError(RuntimeError):
    """A collective that crosses IPC domains was called under graph capture."""


class HierarchicalCommunicator:
    """The all-reduce over ranks of several IPC domains of equal size.

    Built by ``pyar.Communicator(mpi_comm, ...)`` when ``mpi_comm`` spans
    several domains, over its ``split`` (pyar.comm.domains.Split), which it
    then owns.  ``rank`` and ``world`` are the caller's communicator's;
    ``local`` is the NodeCommunicator of this rank's domain, ``domains`` their number and
    ``domain`` this rank's.  ``inter_node`` ("auto", "host" or "device";
    default $PYAR_INTER_NODE, else "auto") picks the inter-node data path
    (pyar.comm.inter_node: "device" raises ValueError on every rank unless
    the MPI library is known to take device pointers); the attribute then
    holds the one taken, "host" or "device".  ``rail_method`` picks the
    inter-node sum (pyar.comm.rail; the device path takes "allgather" only).
    ``timeout`` bounds every wait for peers: the
    kernels' and each inter-node step's alike (a rank whose kernel gave up
    raises instead of coming to the inter-node step, so a peer that is
    missing there longer than a kernel would wait for it has failed); the
    host-side steps (construction, close, PYAR_DEBUG's check) wait twice it
    (pyar/comm/bounded.py says why)."""

    def __init__(self, mpi_comm, split, device=None, max_size=DEFAULT_MAX_SIZE,
                 timeout=DEFAULT_TIMEOUT, *, kernels=None, debug=None, rail_method="auto",
                 inter_node=None):
        self._closed = True  # until construction completes
        wait = 2 * timeout  # host-side steps: pyar/comm/bounded.py says why
        try:
            path, awareness = paths.agree(mpi_comm, inter_node, _hip.platform(), rail_method)
            device, sharers = _device_and_sharers(mpi_comm, device, split.node_rank)
            self._domain_ranks = split.domain.allgather(mpi_comm.Get_rank())
            rail_ranks = split.rail.allgather(mpi_comm.Get_rank())
        except BaseException:
            split.free()
            raise
        made = []  # domains fail or succeed whole: closing what was made is collective
        try:
            # The domain's communicator owns split.domain from here on.
            exchange.run_everywhere(mpi_comm, lambda: made.append(NodeCommunicator(
                BoundedComm(split.domain, wait, "pyar.Communicator()"), device, max_size,
                timeout, kernels=kernels, debug=debug, gpu_sharers=sharers)))
        except BaseException:
            for local in made:
                local.close()
            split.rail.Free()
            raise
        self.local = made[0]
        self.rank = mpi_comm.Get_rank()
        self.world = mpi_comm.Get_size()
        self.domains = split.domains
        self.domain = split.domain_index
        self.device = self.local.device
        self.timeout = self.local.timeout
        self.max_size = self.local.max_size
        self.inter_node = path
        self._rail = rail.Rail(split.rail, timeout, rail_ranks, self.rank, rail_method,
                               on_device=path == "device")
        self.debug = self.local.debug
        # PYAR_DEBUG's agreement check across the domains (the domain's
        # communicator checks its own calls).
        self._everyone = BoundedComm(mpi_comm.Dup(), 2 * timeout) if self.debug else None
        self.gpu_aware_mpi = awareness.aware
        self._failure = None
        self._calls = 0
        self._sums = None  # allreduce_rmsnorm's sum array when there is no out
        self._resources = Resources(self.device)
        self._finalizer = weakref.finalize(self, Resources.release, self._resources)
        self._piece_shard = PIECE_SHARD_ELEMENTS
        self._on_device = path == "device"
        self._rail_sum = rail_kernel.RailSum(self.local.load_module("rail"), self.device) \
            if self._on_device else None
        self._buffers = [self._piece_buffers() for _ in range(2)]
        self._idle = _hip.Stream()  # never used: see _check_local
        self._closed = False

    def _piece_buffers(self):
        """One piece's device shard (float32), device result and pinned host
        buffers (float32 send with the rail's padding, result of any dtype);
        on the device path, instead of the host buffers, the device buffer
        the rail's all-gather fills (plain device allocations, which MPI can
        map: rail_kernel.pitch says why rows are padded)."""
        res = self._resources
        elements = self._piece_shard
        if self._on_device:
            pitch = rail_kernel.pitch(elements)
            return {"shard": res.device_memory(4 * pitch),
                    "result": res.device_memory(4 * elements),
                    "gathered": res.device_memory(4 * pitch * self.domains),
                    "done": _hip.Event(timing=False)}
        # No numpy view of pinned memory outlives a call: it would keep the
        # memory from being freed.
        return {"shard": res.device_memory(4 * elements),
                "result": res.device_memory(4 * elements),
                "send": res.pinned_memory(4 * rail.send_capacity(elements, self.domains)),
                "result_host": res.pinned_memory(4 * elements),
                "done": _hip.Event(timing=False)}

    # --- state ------------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    @property
    def rail_method(self):
        """How the inter-node step sums (pyar.comm.rail); every rank must set
        the same, between calls."""
        return self._rail.method

    @rail_method.setter
    def rail_method(self, method):
        self._rail.method = rail.choose(method, self.domains, self._on_device)

    def _check_usable(self):
        if self._closed:
            raise ValueError("communicator is closed")
        if self._failure is not None:
            raise self._failure

    def _fail(self, exc, what=None):
        """The error to raise for a failed step, the domain's rank numbers
        turned into the caller's and the call named as the caller made it
        (``what``); it fails the communicator."""
        if exc is not self._rail.failure:
            call = exc.call if what is None else f"{what}, in its {exc.call}"
            exc = CollectiveTimeout(call, [self._domain_ranks[r] for r in exc.missing],
                                    self.rank, exc.timeout, exc.late)
        else:  # MPI may still write the buffers: never freed, not even when collected
            self._finalizer.detach()
        self._failure = self._failure or exc
        return exc

    def _check_local(self):
        """Raise what the domain's kernels recorded (a peer that never
        arrived), without waiting for the work queued behind: the local
        communicator's synchronize on a stream that holds nothing."""
        self.local.synchronize(self._idle)

    def synchronize(self, stream=None):
        """Wait for this rank's calls on ``stream``; raise CollectiveTimeout if
        a peer never arrived."""
        self._check_usable()
        try:
            self.local.synchronize(stream)
        except CollectiveTimeout as exc:
            raise self._fail(exc) from None

    def register(self, x):
        """Register ``x`` with the domain's communicator (collective over the
        domain), so that its reduce-scatters read it in place: each piece of
        it, which is what they are given."""
        for piece in self._pieces(x):
            self.local.register(piece)

    def unregister(self, x):
        """Undo ``register(x)`` (collective over the domain, as
        Communicator.unregister)."""
        for piece in self._pieces(x):
            self.local.unregister(piece)

    def _pieces(self, x):
        self._check_usable()
        x = operations.input_array(self.local, x, "x", None).ravel()
        piece = self.local.world * self._piece_shard
        return [_view(x.ptr + first * x.dtype.itemsize, min(piece, x.size - first), x.dtype, x)
                for first in range(0, x.size, piece)]

    def capture(self, stream, mode="global"):
        raise CaptureError(self._capture_message())

    def _capture_message(self):
        return ("a collective across IPC domains cannot be captured in a graph: its "
                "inter-node step is MPI calls on the host, which a graph cannot hold; "
                "capture only collectives of a one-node pyar.Communicator")

    # --- all-reduce ---------------------------------------------------------------

    def allreduce(self, x, out=None, algo="auto", stream=None):
        """Sum ``x`` over every rank into ``out`` (a new array if None; ``x``
        for in place), on ``stream``; returns ``out``.  Returns once the
        inter-node steps are done, with the last all-gathers queued."""
        self._check_usable()
        if algo != "auto":
            raise ValueError(f"algo={algo!r}: across IPC domains the all-reduce has one "
                             "algorithm (reduce-scatter, inter-node sum, all-gather): 'auto'")
        source = _hip.as_stream(stream)
        if source.handle and source.is_capturing:
            raise CaptureError(self._capture_message())
        x = operations.input_array(self.local, x, "x", stream)
        out = operations.allreduce_output(self.local, x, out, stream)
        if self._everyone is not None:
            with self._everyone.step("allreduce (PYAR_DEBUG check)"):
                exchange.check_agreement(self._everyone, "the all-reduce (elements, dtype)",
                                         (x.size, str(x.dtype)))
        if x.size == 0:
            return out
        self._calls += 1
        what = f"allreduce call {self._calls} ({x.size} x {x.dtype})"
        try:
            self._pipeline(x.ravel(), out.ravel(), source, what)
        except CollectiveTimeout as exc:
            raise self._fail(exc, what) from None
        return out

    def _pipeline(self, x, out, stream, what):
        piece = self.local.world * self._piece_shard
        if self._on_device:
            shard, across = self._shard_on_device, self._across_on_device
        else:
            shard, across = self._to_host, self._across_and_back
        queued = None
        for number, first in enumerate(range(0, x.size, piece)):
            count = min(piece, x.size - first)
            step = (self._buffers[number % 2], first, count)
            shard(x, *step, stream)
            if queued is not None:
                across(out, *queued, stream, what)
            queued = step
        across(out, *queued, stream, what)

    def _to_host(self, x, buffers, first, count, stream):
        """Queue the piece's reduce-scatter and the copy of its shard to the host."""
        piece = _view(x.ptr + first * x.dtype.itemsize, count, x.dtype, x)
        lo, hi = shards.bounds(count, self.local.world, x.dtype.itemsize, self.local.rank)
        shard = _view(buffers["shard"].ptr, hi - lo, np.float32, buffers["shard"])
        if self.local.world > 1:
            self.local.reduce_scatter(piece, out=shard, stream=stream)
            _hip.memcpy_dtoh(_host(buffers["send"], hi - lo, np.float32), shard.ptr, stream)
        elif x.dtype == np.float32:
            _hip.memcpy_dtoh(_host(buffers["send"], count, np.float32), piece.ptr, stream)
        else:  # a domain of one rank: its shard is the piece, widened on the host
            _hip.memcpy_dtoh(_host(buffers["result_host"], count, x.dtype).view(np.uint8),
                             piece.ptr, stream)
        buffers["done"].record(stream)

    def _across_and_back(self, out, buffers, first, count, stream, what):
        """Once the piece's shard is on the host: its sum over the rail, the
        copy back and the domain's all-gather into ``out``, queued."""
        buffers["done"].synchronize()
        if self.local.world > 1:
            # Before the views of pinned memory exist: a failure's traceback
            # would keep them, and with them the memory, from being freed.
            self._check_local()
        lo, hi = shards.bounds(count, self.local.world, out.dtype.itemsize, self.local.rank)
        result = _host(buffers["result_host"], hi - lo, out.dtype)
        send = _host(buffers["send"], rail.send_capacity(hi - lo, self.domains), np.float32)
        if self.local.world == 1 and out.dtype != np.float32:
            np.copyto(send[:count], result)
        self._rail.sum(send, result, what)
        target = out.ptr + first * out.dtype.itemsize
        if self.local.world == 1:
            _hip.memcpy_htod(target, result.view(np.uint8), stream)
            return
        shard = _view(buffers["result"].ptr, hi - lo, out.dtype, buffers["result"])
        _hip.memcpy_htod(shard.ptr, result.view(np.uint8), stream)
        self.local.all_gather(shard, out=_view(target, count, out.dtype, out), stream=stream)

    def _shard_on_device(self, x, buffers, first, count, stream):
        """Queue the piece's reduce-scatter into the device shard buffer (a
        domain of one rank: a copy of the piece, in its dtype, since MPI maps
        only plain device allocations and the caller's may be pool memory)."""
        piece = _view(x.ptr + first * x.dtype.itemsize, count, x.dtype, x)
        if self.local.world > 1:
            lo, hi = shards.bounds(count, self.local.world, x.dtype.itemsize, self.local.rank)
            shard = _view(buffers["shard"].ptr, hi - lo, np.float32, buffers["shard"])
            self.local.reduce_scatter(piece, out=shard, stream=stream)
        else:
            _hip.memcpy_dtod(buffers["shard"].ptr, piece.ptr, piece.nbytes, stream)
        buffers["done"].record(stream)

    def _across_on_device(self, out, buffers, first, count, stream, what):
        """Once the piece's shard is ready: MPI's all-gather of the device
        shards over the rail, their sum in domain order by the rail kernel
        (into the all-gather's input, or straight into ``out`` for a domain
        of one rank) and the domain's all-gather, queued."""
        buffers["done"].synchronize()
        if self.local.world > 1:
            self._check_local()
        lo, hi = shards.bounds(count, self.local.world, out.dtype.itemsize, self.local.rank)
        target = out.ptr + first * out.dtype.itemsize
        rows = np.dtype(np.float32) if self.local.world > 1 else out.dtype
        summed = buffers["result"].ptr if self.local.world > 1 else target
        if hi > lo:  # the same on every rank of the rail: it has this domain rank
            self._rail.gather_on_device(
                buffers["shard"].ptr, buffers["gathered"].ptr,
                rail_kernel.pitch(hi - lo) * rows.itemsize, what,
                (buffers["shard"], buffers["gathered"]))
            self._rail_sum.launch(buffers["gathered"].ptr, rows, hi - lo, self.domains, summed,
                                  out.dtype, stream)
        if self.local.world > 1:
            shard = _view(summed, hi - lo, out.dtype, buffers["result"])
            self.local.all_gather(shard, out=_view(target, count, out.dtype, out), stream=stream)

    # --- fused all-reduce + RMSNorm ---------------------------------------------

    def allreduce_rmsnorm(self, x, residual, weight, eps=1e-6, out=None, residual_out=None,
                          stream=None, *, quant=None, group_size=128, fp8_dtype=None,
                          quantized=None, scales=None, algo="auto"):
        """``Communicator.allreduce_rmsnorm`` across domains: the sum by
        ``allreduce`` (into ``out`` when given, else an array the communicator
        keeps), then the residual add + RMSNorm (+ quantization) on this GPU
        (pyar.comm.row_kernels.add_rmsnorm, the same arithmetic as the one-node
        calls after their sum).  ``algo`` must be "auto"."""
        self._check_usable()
        if algo != "auto":
            raise ValueError(f"algo={algo!r}: across IPC domains allreduce_rmsnorm is the "
                             "all-reduce, then add + RMSNorm on each GPU: 'auto'")
        x = operations.input_array(self.local, x, "x", stream)
        sums = out
        if out is None:
            if self._sums is None or self._sums.nbytes < x.nbytes:
                # Kept: its kernels may still be queued; calls are ordered.
                self._sums = empty((x.nbytes,), np.uint8, stream=_hip.as_stream(stream))
            sums = _view(self._sums.ptr, x.size, x.dtype, self._sums).reshape(x.shape)
        self.allreduce(x, out=sums, stream=stream)
        _hip.set_device(self.device)
        return row_kernels.add_rmsnorm(sums, residual, weight, eps, out, residual_out, stream,
                                   quant=quant, group_size=group_size, fp8_dtype=fp8_dtype,
                                   quantized=quantized, scales=scales)

    # --- teardown ---------------------------------------------------------------

    def close(self):
        """Collective: close the domain's communicator (which waits for this
        rank's work), then free the host and device buffers and the rail."""
        if self._end(self.local.close):
            self._rail.free()
            if self._everyone is not None:
                self._everyone.Free()

    def abort(self):
        """Give up at once, with no collective step: the domain's communicator
        aborts (Communicator.abort says what peers see and how survivors go
        on).  The rail's and the PYAR_DEBUG check's MPI communicators stay
        allocated (freeing one is collective), and after a failed inter-node
        step so do the pinned buffers MPI may still write."""
        self._end(self.local.abort)

    def _end(self, end_local):
        """Close or abort (``end_local``) once; whether it ran now."""
        if self._closed:
            return False
        self._closed = True
        self._finalizer.detach()
        try:
            end_local()
        finally:
            self._idle.close()
            if self._rail.failure is None:
                self._resources.release()
            # else kept: an abandoned MPI request may still use the pinned buffers
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        shape = f"{self.domains} domains of {self.local.world}"
        where = "closed" if self._closed else f"device {self.device}"
        return f"<pyar.HierarchicalCommunicator rank {self.rank} of {self.world}, {shape}, {where}>"


def _device_and_sharers(mpi_comm, device, node_rank):
    """This rank's GPU (default: the node's GPUs in turn by node rank, as on
    one node, not by domain rank) and how many ranks of the node use it: the
    domains' kernels spin side by side on a shared GPU, so each domain must
    leave room for the others' (Communicator._block_cap)."""
    def bus_id():
        chosen = node_rank % _hip.get_device_count() if device is None else device
        return chosen, _hip.Device(chosen).pci_bus_id

    device, mine = exchange.run_everywhere(mpi_comm, bus_id)
    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    try:
        return device, node.allgather(mine).count(mine)
    finally:
        node.Free()


def _view(ptr, count, dtype, owner):
    return DeviceArray.from_pointer(ptr, (count,), dtype, owner=owner, device=owner.device)


def _host(pinned, count, dtype):
    """The first ``count`` ``dtype`` elements of pinned memory, as numpy."""
    return np.frombuffer(pinned, dtype, count=count)
