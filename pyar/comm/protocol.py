"""What every communicator that ``pyar.Communicator`` returns offers: the
one-node communicator (pyar.comm.communicator.NodeCommunicator) and the
one across IPC domains (pyar.comm.hierarchical.HierarchicalCommunicator)
both satisfy ``CommunicatorProtocol``; the one-node communicator also
satisfies ``NodeCommunicatorProtocol``.  The docstrings here are the
reference for each call.
"""
from typing import Any, NamedTuple, Optional, Protocol, runtime_checkable


@runtime_checkable
class CommunicatorProtocol(Protocol):
    """A sum across ranks with pyar's guarantees: every wait bounded
    (CollectiveTimeout), every call checked against the peers' calls
    (MismatchError), no rank reading a buffer another may still rewrite.
    ``rank`` and ``world`` are the caller's MPI communicator's; ``device``
    the GPU this rank runs on; ``timeout`` bounds every wait for peers, in
    seconds; ``max_size`` the scratch buffer per rank in bytes."""
    rank: int
    world: int
    device: int
    timeout: float
    max_size: int
    debug: bool

    @property
    def closed(self) -> bool: ...

    def allreduce(self, x, out=None, algo="auto", stream=None) -> Any:
        """Sum ``x`` over all ranks into ``out`` (a new array if None; ``x``
        itself for in place), queued on ``stream``.  Returns ``out`` as a pyar
        DeviceArray: itself, or a view of a CuPy/PyTorch ``out`` (whose own
        object holds the sum too).

        Asynchronous like a kernel launch; ``synchronize()`` waits and reports
        a peer that never arrived as CollectiveTimeout.  A new ``out`` comes
        from the stream-ordered pool on ``stream``.  ``algo``: "auto",
        "oneshot" (every rank reads every peer's input; latency), "twoshot"
        (reduce-scatter then all-gather; bandwidth), "ll" (every rank pushes
        LL packets into every rank's receive region, no barrier; inputs up to
        algorithms.LL_MAX_BYTES or max_size; "auto" runs it for small inputs
        unless PYAR_AUTO_LL=0) or "ll_twoshot" (forced only: LL packets of
        shards, then of their sums; inputs up to world/2 times LL's)."""

    def allreduce_rmsnorm(self, x, residual, weight, eps=1e-6, out=None, residual_out=None,
                          stream=None, *, quant=None, group_size=128, fp8_dtype=None,
                          quantized=None, scales=None, algo="auto") -> NamedTuple:
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
        separate kernel).  Across IPC domains only "auto", which is the
        all-reduce, then add + RMSNorm on each GPU.
        Eager, on registered inputs and under graph capture like
        ``allreduce``.  Returns FusedOutputs(out, residual_out, quantized,
        scales) (None where not written), DeviceArrays as ``allreduce`` returns
        ``out``."""

    def register(self, x) -> None:
        """Exchange ``x``'s IPC handle once (collective), so that later
        calls on ``x`` read it in place instead of staging a copy.

        Every rank registers its own buffer of the same size, and every rank
        must then pass its registered buffer to the same calls.  The
        communicator keeps the buffer alive until it is closed or
        ``unregister(x)`` lets go of it: dropped while registered, it is not
        freed, so no peer ever reads another buffer at its address through
        a stale mapping.

        Memory from the stream-ordered pool (``pyar.empty`` and friends
        without ``ipc=True``) cannot be shared between processes and is refused."""

    def unregister(self, x) -> None:
        """Undo ``register(x)`` (collective, bounded like it): later calls on
        ``x`` stage it again, and the communicator no longer keeps it alive.

        Every rank unregisters its own registered buffer of the same size.
        Each waits for the work it queued on the device (so no kernel of it
        still reads a peer's buffer) and unmaps the peers' buffers; no rank
        returns before every rank has, so the buffer may be freed as soon as
        this returns.  Refused while a graph captured with ``capture()``
        that read ``x`` in place is still open (close it first); graphs
        captured with plain ``pyar.capture`` that read it must be closed too.
        Not during a capture."""

    def capture(self, stream, mode="global") -> Any:
        """``with comm.capture(stream) as graph:`` -- pyar.capture plus
        register_graph_buffers() when the block ends (collectively: if the
        block raised on any rank, every rank raises).  ``close()`` closes the
        graph too: replaying it afterwards raises instead of reading freed
        memory.  (Graphs captured with plain ``pyar.capture`` must be closed
        before the communicator.)  Across IPC domains a collective cannot be
        captured (its inter-node step runs on the host) and this raises."""

    def synchronize(self, stream=None) -> None:
        """Wait for this rank's calls on ``stream``; raise CollectiveTimeout if
        one of them gave up waiting for a peer, MismatchError if the ranks
        called different collectives."""

    def close(self) -> None:
        """Release GPU memory and peer mappings (collective: peers unmap this
        rank's memory before it is freed).  Later calls raise.

        Bounded by the timeout: after a failure (a CollectiveTimeout or a
        MismatchError seen before), this rank's kernels still waiting for
        peers give up at once, a peer that never closes is expected, and
        close() returns once twice the timeout has passed, its resources
        released; otherwise such a peer makes it raise CollectiveTimeout
        naming it, after releasing this rank's resources all the same.
        ``abort`` says how the surviving ranks go on without a lost one."""

    def abort(self) -> None:
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
            comm = pyar.Communicator(mpi_comm.Create_group(survivors))"""

    def __enter__(self) -> "CommunicatorProtocol": ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class NodeCommunicatorProtocol(CommunicatorProtocol, Protocol):
    """The collectives of a communicator within one IPC domain."""

    def reduce_scatter(self, x, out=None, stream=None) -> Any:
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
        registered or captured like ``allreduce``'s."""

    def all_gather(self, x, out=None, stream=None, n: Optional[int] = None) -> Any:
        """Concatenate every rank's shard ``x`` in rank order into the whole
        array of ``n`` elements, on every rank; returns ``out`` (a DeviceArray,
        as ``allreduce`` does), queued on ``stream`` and asynchronous like
        ``allreduce``.

        ``x`` is this rank's shard under the rule of ``reduce_scatter``.
        Shard lengths alone do not tell n, so pass ``out`` (n elements of
        x's dtype, any shape) or ``n`` (a new 1-D ``out``).  ``x`` may be
        this rank's shard of ``out`` itself (in place); no other overlap.
        Inputs are staged, registered or captured like ``allreduce``'s; a
        registered or captured input is read in place only when every shard
        has the same length (n a multiple of L * world), else staged."""

    def register_graph_buffers(self) -> None:
        """Collective: exchange the handles of the unregistered inputs that
        captured collectives read in place, so the captured graphs can run.

        ``capture()`` calls it when its block ends.  Every rank must have
        captured the same collectives in the same order."""
