"""The inter-node step of the hierarchical all-reduce: the sum of one float32
shard over a rail (one rank per IPC domain, pyar.comm.domains), on host
buffers, with the same bits on every rank of the rail.

MPI does not promise that ``Allreduce`` gives every rank the same bits (an
implementation may reduce in a different order on each rank), so neither
method below uses it; each element's sum is formed once, in one order:
- "allgather": every rank receives every domain's shard and adds them in
  domain order, each rank the same additions (N - 1 shards in per rank: one
  step, the least latency, the same bytes as any all-reduce at 2 domains);
- "reduce_scatter": ``Reduce_scatter_block`` sums block j on one rank, then
  ``Allgather`` hands the sums out (2 (N - 1) / N shards in per rank: the
  least traffic beyond 2 domains, in two steps).
"auto" takes the first at 2 domains and the second beyond.

On the device data path (pyar.comm.inter_node) the shards are device memory
and only "allgather" runs: ``gather_on_device`` hands MPI the device
addresses, and pyar.comm.rail_kernel adds the rows on the GPU.  MPI's
non-blocking reductions do not take device pointers (Open MPI 4.1's
CUDA-aware reductions are blocking ones; its ``Ireduce_scatter_block`` on
device memory runs the CPU's sum on device addresses and crashes).

Every MPI step is non-blocking and bounded: after ``wait`` seconds without
completion the rail raises CollectiveTimeout and is failed for good.  An
abandoned request may still be progressed by MPI, so its buffers and the
communicator are kept (never freed), as pyar.comm.bounded does.
"""
import time

import numpy as np
from mpi4py import MPI

from pyar.comm import bounded
from pyar.comm.errors import CollectiveTimeout

METHODS = ("auto", "allgather", "reduce_scatter")
# Tested without pause for its first second (bounded.completes says why):
# the whole of any step that is not waiting for a late peer.
_SPIN = 1.0


def choose(method, domains, on_device=False):
    """The method "auto" (or ``method``) means for ``domains`` domains, on
    host (or device, ``on_device``) buffers."""
    if method not in METHODS:
        raise ValueError(f"rail method must be one of {METHODS}, got {method!r}")
    if on_device:
        if method == "reduce_scatter":
            raise ValueError("rail_method='reduce_scatter' needs the host data path: on "
                             "device memory MPI's non-blocking Ireduce_scatter_block is not "
                             "GPU-aware (Open MPI's crashes); the device path sums with "
                             "'allgather' (use inter_node='host' for 'reduce_scatter')")
        return "allgather"
    if method == "auto":
        return "allgather" if domains <= 2 else "reduce_scatter"
    return method


def send_capacity(elements, domains):
    """Float32 elements a send buffer needs for a shard of ``elements``:
    Reduce_scatter_block takes equal blocks, so the shard is padded."""
    return domains * -(-elements // domains)


class Rail:
    """Sums over ``comm`` (this rank's rail, ranks in domain order);
    ``ranks`` are the rail's ranks in the caller's communicator, for error
    messages; every step waits at most ``wait`` seconds.  ``on_device``:
    the device data path (``gather_on_device``; method "allgather")."""

    def __init__(self, comm, wait, ranks, rank, method="auto", on_device=False):
        self.comm = comm
        self.domains = comm.Get_size()
        self.on_device = on_device
        self.method = choose(method, self.domains, on_device)
        self.wait = wait
        self.ranks = tuple(ranks)
        self.rank = rank
        self.failure = None
        self._buffers = {}

    def sum(self, send, result, what):
        """``result`` (``len(result)`` elements, any float dtype) = the sum
        over the rail of ``send`` (float32, at least
        ``send_capacity(len(result), domains)`` elements; its padding is
        scratch).  ``what`` names the call in a CollectiveTimeout."""
        if self.failure is not None:
            raise self.failure
        n = len(result)
        if n == 0:
            return result
        if self.method == "allgather":
            gathered = self._buffer("gathered", self.domains * n)
            self._complete(self.comm.Iallgather(send[:n], gathered), gathered, what)
            parts = gathered.reshape(self.domains, n)
        else:
            block = send_capacity(n, self.domains) // self.domains
            mine = self._buffer("block", block)
            self._complete(self.comm.Ireduce_scatter_block(
                send[:block * self.domains], mine, op=MPI.SUM), mine, what)
            gathered = self._buffer("gathered", self.domains * block)
            self._complete(self.comm.Iallgather(mine, gathered), gathered, what)
            parts = gathered[:n].reshape(1, n)
        add_in_order(parts, result, self._buffer("total", n) if result.dtype != np.float32
                     else None)
        return result

    def gather_on_device(self, send, receive, nbytes, what, owners):
        """Every rail rank's ``nbytes`` at device address ``send`` into
        device address ``receive``, in domain order (``domains * nbytes``
        bytes); ``owners`` hold that memory and are kept for good if MPI is
        abandoned with the request (it may still write them)."""
        if self.failure is not None:
            raise self.failure
        request = self.comm.Iallgather([MPI.buffer.fromaddress(send, nbytes), MPI.BYTE],
                                       [MPI.buffer.fromaddress(receive, self.domains * nbytes),
                                        MPI.BYTE])
        self._complete(request, owners, what)

    def _buffer(self, name, elements):
        buffer = self._buffers.get(name)
        if buffer is None or buffer.size < elements:
            buffer = self._buffers[name] = np.empty(elements, np.float32)
        return buffer[:elements]

    def _complete(self, request, buffer, what):
        if bounded.completes(request, time.monotonic() + self.wait, spin=_SPIN):
            return
        bounded.abandon(request, buffer, self.comm)
        self._buffers.clear()  # MPI may still write the old ones
        self.failure = CollectiveTimeout(
            f"{what} (inter-node step over the rail of ranks "
            f"{', '.join(map(str, self.ranks))})", (), self.rank, self.wait)
        raise self.failure

    def free(self):
        """Collective over the rail, unless it failed: then it is kept."""
        if self.failure is None:
            self.comm.Free()


def add_in_order(parts, result, total=None):
    """``result`` = parts[0] + parts[1] + ... (rows of float32, added in
    row order in float32), rounded once to ``result``'s dtype; ``total`` is
    a float32 scratch row when ``result`` is not float32."""
    total = result if total is None else total
    np.copyto(total, parts[0])
    for part in parts[1:]:
        total += part
    if total is not result:
        np.copyto(result, total, casting="unsafe")
    return result
