"""The node communicator: the fastest correct sum across the GPUs of one IPC
domain.  It owns what the domain's ranks share (the connection: kernels,
memory, peers, buffer registry) and runs every collective through one path:
replay a plan seen before, else check, plan, queue and remember
(pyar/comm/operations.py describes each collective)."""
import functools
import os
import weakref

import numpy as np

from pyar import _hip
from pyar.array import DeviceArray, empty
from pyar.comm import _eager, exchange, operations
from pyar.comm.connection import Connection, load_module, select_device
from pyar.comm.errors import CollectiveTimeout, MismatchError
from pyar.comm.kernels import CALL, FAILED, MISMATCH, MISSING, PACK_BYTES, SIGNATURES
from pyar.comm.layout import describe_signature
from pyar.comm.plan import Copy
from pyar.comm.resources import Resources
from pyar.comm.row_kernels import FusedOutputs, RowKernels

DEFAULT_MAX_SIZE = 64 << 20
DEFAULT_TIMEOUT = 300.0
MAX_TIMEOUT = 1e6  # the kernels count nanoseconds in 64 bits; 11 days is plenty
MAX_WORLD = 8
_CALL_LOG = 4096


def env_flag(name, default=False):
    """Whether $``name`` is set to something other than 0, false or no;
    ``default`` when it is unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in ("0", "false", "no")


def resolve_timeout(timeout):
    """Seconds: ``timeout``, else $PYAR_TIMEOUT, else the default; checked."""
    timeout = float(os.environ.get("PYAR_TIMEOUT", DEFAULT_TIMEOUT)
                    if timeout is None else timeout)
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT:g}] seconds, got {timeout}")
    return timeout


def check_max_size(max_size):
    if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size <= 0:
        raise ValueError(f"max_size must be a positive int (bytes), got {max_size!r}")


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


class NodeCommunicator(_eager.PlanCache):
    """A custom all-reduce over the ranks of one IPC domain, one GPU each.

    Made by ``pyar.Communicator(mpi_comm, ...)`` (pyar/comm/factory.py,
    which documents the arguments) over ``node``, the domain's bounded
    MPI communicator (pyar.comm.bounded.BoundedComm), which it frees when
    it closes.  Calls on one communicator must be ordered with respect to
    each other (one stream, or streams the caller synchronizes), like
    NCCL's.  A call whose signature (arrays, algorithm, stream) was seen
    before replays the launches planned the first time, without checking
    its arguments again (pyar/comm/_eager.pyx says when it does check again).
    """

    def __init__(self, node, device=None, max_size=DEFAULT_MAX_SIZE, timeout=DEFAULT_TIMEOUT,
                 *, kernels=None, debug=None, gpu_sharers=None):
        self._closed = True  # until construction completes
        world, resources, connection = node.Get_size(), None, None
        max_size = -(-max_size // PACK_BYTES) * PACK_BYTES
        try:
            if world > MAX_WORLD:
                raise ValueError(f"pyar all-reduces among at most {MAX_WORLD} ranks of one "
                                 f"node, this communicator has {world}")
            # Different sizes or timeouts would give ranks different chunkings,
            # and PYAR_AUTO_LL different algorithms for one "auto" call.
            auto_ll = env_flag("PYAR_AUTO_LL", default=True)
            exchange.check_agreement(node, "max_size, timeout and PYAR_AUTO_LL",
                                     (max_size, timeout, auto_ll))
            device = exchange.run_everywhere(node, select_device, node.Get_rank(), device)
            resources = Resources(device)
            if world > 1:
                connection = Connection(node, resources, device, max_size, int(timeout * 1e9),
                                        kernels, gpu_sharers, auto_ll)
        except BaseException:
            if resources is not None:
                resources.release()
            node.Free()
            raise
        self._assemble(node, connection, resources, device, max_size, timeout, debug, kernels)

    @classmethod
    def assemble(cls, node, connection, resources, *, device, max_size, timeout, debug=False,
                 kernels=None):
        """A communicator over a domain whose ranks are already connected:
        ``node`` (a pyar.comm.bounded.BoundedComm, or an object with its
        methods), ``connection`` (a pyar.comm.connection.Connection, or an
        object with its attributes; None in a world of one) and
        ``resources`` (the pyar.comm.resources.Resources that close() and
        abort() release).  Construction connects and then assembles; tests
        and tools that connect the ranks their own way assemble directly."""
        self = cls.__new__(cls)
        self._assemble(node, connection, resources, device, max_size, timeout, debug, kernels)
        return self

    def _assemble(self, node, connection, resources, device, max_size, timeout, debug,
                  kernel_dir):
        self._node, self._resources, self.device = node, resources, device
        self.rank, self.world = node.Get_rank(), node.Get_size()
        self.max_size, self.timeout = max_size, timeout
        self.debug = env_flag("PYAR_DEBUG") if debug is None else bool(debug)
        self._kernel_dir = kernel_dir
        self.geometry = self.kernels = self._registry = self._row_kernels = None
        if connection is not None:
            self.geometry, self.kernels = connection.geometry, connection.kernels
            self._registry = connection.registry
            self._error_words, self._error_ptr = connection.error_words, connection.error_ptr
            self._row_kernels = getattr(self.kernels, "rows", None)
        self._calls = 0
        self._call_log = {}
        self._failure = None
        self._captures = weakref.WeakSet()  # closed with the communicator
        self._sums = None  # the unfused path's sum array when a call has no out
        self._finalizer = weakref.finalize(self, Resources.release, resources)
        self._closed = False

    @property
    def closed(self):
        return self._closed

    def load_module(self, name):
        """Code object ``name`` of this communicator's kernels, on its device."""
        return load_module(name, self.device, self._kernel_dir)

    def _rows(self):
        """The row kernels (a world of one loads them on first use)."""
        if self._row_kernels is None:
            self._row_kernels = RowKernels(self.load_module("allreduce_rmsnorm"))
        return self._row_kernels

    def _local_blocks(self):
        return _hip.Device(self.device).multiprocessor_count * 2

    # --- state ----------------------------------------------------------------

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
        if words is None or not words[FAILED]:
            return
        number = int(words[CALL])
        call = (self._replayed_call(number) or self._call_log.get(number % _CALL_LOG)
                or "a collective")
        if words[MISMATCH]:
            calls = "; ".join(
                f"rank {r}: " + describe_signature(
                    words[SIGNATURES + 2 * r] | words[SIGNATURES + 2 * r + 1] << 32)
                for r in range(self.world))
            self._failure = MismatchError(
                f"{call} on rank {self.rank}: the ranks called different collectives "
                f"({calls}); no rank read another's data, and the communicator is now "
                "closed to further calls")
        else:
            missing = [r for r in range(self.world) if words[MISSING + r]]
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

    # --- registration and capture ------------------------------------------------

    @_host_step("register")
    def register(self, x):
        """Exchange ``x``'s IPC handle once (collective), so that later
        calls on ``x`` read it in place instead of staging a copy
        (pyar.comm.protocol says more)."""
        self._check_usable()
        x = operations.input_array(self, x, "x", None)
        if x.ptr % PACK_BYTES:
            raise ValueError(f"a registered buffer must be {PACK_BYTES}-byte aligned "
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
        """Undo ``register(x)`` (collective, bounded like it)."""
        self._check_usable()
        x = operations.input_array(self, x, "x", None)
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
        captured collectives read in place, so the captured graphs can run."""
        self._check_usable()
        if self.world > 1:
            self._registry.exchange_deferred()
            self._forget_plans()

    def capture(self, stream, mode="global"):
        """``with comm.capture(stream) as graph:`` -- pyar.capture plus
        register_graph_buffers() when the block ends."""
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

    def _input_table(self, x, stream):
        """The registered table peers read ``x`` through, or None (staged)."""
        source = _hip.as_stream(stream)
        if source.handle and source.is_capturing and not x.stream_ordered:
            # Recorded, not staged: the graph reads x in place once the ranks
            # have exchanged its handle (register_graph_buffers).  Pool
            # memory cannot be exchanged, so a capture stages it.
            return self._registry.defer(x)
        return self._registry.lookup(x.ptr, x.nbytes)

    # --- collectives ----------------------------------------------------------------

    def allreduce(self, x, out=None, algo="auto", stream=None):
        """Sum ``x`` over all ranks into ``out``; see pyar.comm.protocol."""
        replayed = self._replay_allreduce(x, out, algo, stream)
        if replayed is not None:
            return replayed
        return self._call(operations.AllReduce(x, out, algo), stream)

    def reduce_scatter(self, x, out=None, stream=None):
        """This rank's shard of the sum of ``x``; see pyar.comm.protocol."""
        replayed = self._replay_shards("reduce_scatter", x, out, (), stream)
        if replayed is not None:
            return replayed
        return self._call(operations.ReduceScatter(x, out), stream)

    def all_gather(self, x, out=None, stream=None, n=None):
        """Every rank's shard ``x`` concatenated; see pyar.comm.protocol."""
        replayed = self._replay_shards("all_gather", x, out, (n,), stream)
        if replayed is not None:
            return replayed
        return self._call(operations.AllGather(x, out, n), stream)

    def allreduce_rmsnorm(self, x, residual, weight, eps=1e-6, out=None, residual_out=None,
                          stream=None, *, quant=None, group_size=128, fp8_dtype=None,
                          quantized=None, scales=None, algo="auto"):
        """All-reduce + residual add + RMSNorm (+ quantization) in one kernel;
        see pyar.comm.protocol."""
        arrays = (x, residual, weight, out, residual_out, quantized, scales)
        scalars = (eps, quant, group_size, fp8_dtype, algo)
        replayed = self._replay_rmsnorm(arrays, scalars, stream)
        if replayed is not None:
            return FusedOutputs._make(replayed)
        return self._call(operations.AllReduceRMSNorm(arrays, scalars), stream)

    def _call(self, op, stream):
        """Check, plan, queue and remember one call that was not replayed."""
        self._check_usable()
        self._prepare(op, stream)
        if op.empty:
            return op.result()
        if self.world == 1:
            steps = op.alone(self)
        else:
            self._check_kernel_failure()
            steps = op.steps(self)
        for step in steps:
            self._queue(step, stream)
        if op.replayable(self.world):
            self._remember(op.kind, op.key_arrays, op.key_rest, stream, steps,
                           *op.plan_output())
        return op.result()

    def _prepare(self, op, stream):
        """``op.prepare``: the call's checks.  Under PYAR_DEBUG they run on
        every rank together, so that a rank whose arguments are wrong raises
        on every rank instead of leaving peers waiting, and the ranks'
        ``op.agreement()`` must be equal (MismatchError naming ``op.what`` if
        not), before any launch."""
        if not (self.debug and self.world > 1):
            op.prepare(self, stream)
            return
        with self._node.step(f"{op.kind} (PYAR_DEBUG check)"):
            exchange.run_everywhere(self._node, op.prepare, self, stream)
            exchange.check_agreement(self._node, f"the {op.what}", op.agreement())

    def _queue(self, step, stream):
        """Queue one Copy or Launch; a spinning kernel's last argument is its
        call number."""
        if type(step) is Copy:
            _hip.memcpy_dtod(step.dst, step.src, step.nbytes, stream)
        elif step.kind is None:
            step.function.launch(step.grid, step.block, step.args, stream=stream)
        else:
            step.function.launch(step.grid, step.block,
                                 (*step.args, self._next_call(step.kind, step.details)),
                                 stream=stream)

    def _next_call(self, kind, details):
        """The 32-bit sequence number the kernel reports on timeout; the log
        turns it back into a description of the call."""
        call = self._calls & 0xFFFFFFFF
        self._call_log[call % _CALL_LOG] = f"{kind} call {self._calls} {details}"
        self._checked_call(call)
        self._calls += 1
        return call

    def _sums_like(self, x, stream):
        """The communicator's sum array, viewed as ``x``.  Kept, not freed
        after the call: its kernels are still queued, and plans name it.
        Calls are ordered on one stream, so the next call may reuse it."""
        if self._sums is None or self._sums.nbytes < x.nbytes:
            self._forget_plans()  # before the array they name goes
            self._sums = empty((x.nbytes,), np.uint8, stream=stream)
        return DeviceArray.from_pointer(self._sums.ptr, x.shape, x.dtype, owner=self._sums,
                                        device=self.device)

    # --- teardown ---------------------------------------------------------------

    @_host_step("close")
    def close(self):
        """Release GPU memory and peer mappings (collective: peers unmap this
        rank's memory before it is freed); see pyar.comm.protocol."""
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
        """Give up on the peers at once: no collective step, no wait for them;
        see pyar.comm.protocol."""
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
            self._error_words[FAILED] = 1
        for graph in list(self._captures):
            graph.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"device {self.device}"
        return f"<pyar.Communicator rank {self.rank} of {self.world}, {state}>"


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
