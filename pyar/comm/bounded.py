"""Host-side collectives that give up: every MPI step of a communicator (its
construction, register, the exchange at the end of a capture, close, the
PYAR_DEBUG agreement) is bounded, like the kernels' waits, by twice the
communicator's timeout: a peer may legitimately reach the step up to one
timeout late, after its own wait in a kernel gave up (a rank that skipped a
call goes on to close() while the others wait out the kernel timeout).
A rank that never reaches the step makes the others raise
CollectiveTimeout naming the step and the ranks that did not arrive, instead
of waiting in MPI forever.

How a step ends the same way on every rank:
1. each rank sends an arrival token to every peer (point to point, on a
   private duplicate of the communicator, tagged with the step's number),
   then starts the step's collective, non-blocking, and tests it until the
   deadline;
2. each rank then starts a non-blocking logical AND of "it completed in
   time" and, if it timed out, raises at once without waiting for it: the
   vote is already posted, so a rank that arrives late completes the step
   (everyone else had posted it), completes the vote, sees the peers' "no"
   and raises too instead of walking into the next step alone;
3. a rank that timed out names the peers whose tokens it never received.
After a timeout the MPI communicator still holds the abandoned requests, so
it is never used again: later steps raise the same error at once, and it is
never freed either (Open MPI crashes progressing requests of a freed
communicator): a failed communicator leaks its MPI communicator and requests,
which stay referenced in ``_ABANDONED``.
"""
import pickle
import time

import numpy as np
from mpi4py import MPI

from pyar.comm.errors import CollectiveTimeout

_FIRST_PAUSE = 1e-5  # seconds between tests of a pending step, doubling up to
_LAST_PAUSE = 1e-3   # this, so that ranks sharing cores do not starve each other
_TAGS = 1 << 15      # MPI guarantees tags below 32768
_ABANDONED: list = []  # requests and communicators a timeout left behind


def completes(request, deadline, spin=0.0):
    """Whether ``request`` completes before ``deadline`` (time.monotonic).

    Tested without pause for its first ``spin`` seconds, then with pauses
    doubling from _FIRST_PAUSE to _LAST_PAUSE.  Open MPI progresses a
    non-blocking collective only inside calls like Test (no progress thread
    by default), so a data-moving step that must not stall spins; a step
    that only waits for peers to arrive sleeps at once."""
    spin_until = time.monotonic() + spin
    pause = _FIRST_PAUSE
    while not request.Test():
        now = time.monotonic()
        if now >= deadline:
            return False
        if now >= spin_until:
            time.sleep(pause)
            pause = min(2 * pause, _LAST_PAUSE)
    return True


def abandon(*left):
    """Keep what a timed-out step left behind (requests MPI may still
    progress, their buffers, their communicator) referenced for good."""
    _ABANDONED.append(left)


def _agree_in_time(comm, finished, deadline):
    """Step 2 above: True when every rank finished in time.  A rank that did
    not finish votes and returns False without waiting for the vote."""
    vote = np.array([finished], dtype=np.bool_)
    everyone = np.zeros(1, dtype=np.bool_)
    request = comm.Iallreduce(vote, everyone, op=MPI.LAND)
    # Every rank posted the vote right after its own step: this wait is short
    # unless a rank died in between.
    if finished and completes(request, deadline):
        return bool(everyone[0])
    abandon(request, vote, everyone)  # MPI may still write `everyone`
    return False


def arrive(comm, step, timeout):
    """Return once every rank of ``comm`` (any intra-communicator, e.g. the
    caller's) has called ``arrive`` for ``step``; raise CollectiveTimeout on
    every rank that waited ``timeout`` seconds.  Names no ranks: point-to-point
    tokens on the caller's communicator could be taken by its own receives."""
    deadline = time.monotonic() + timeout
    barrier = comm.Ibarrier()
    finished = completes(barrier, deadline)
    if not finished:
        abandon(barrier)
    if not _agree_in_time(comm, finished, deadline + timeout):
        raise CollectiveTimeout(f"{step} (host-side exchange)", (), comm.Get_rank(), timeout,
                                late=finished)


class BoundedComm:
    """The node-local MPI communicator of a pyar communicator, with the few
    collectives pyar uses (mpi4py's names) bounded by ``timeout`` seconds.

    ``step(name)`` names what the ranks are doing for the error message
    (``step`` until then).  Owns ``comm`` (``Free`` frees it).
    """

    def __init__(self, comm, timeout, step="a host-side exchange"):
        self._comm = comm
        self._tokens = comm.Dup()  # arrival tokens never meet pyar's or the caller's messages
        self.timeout = timeout
        self.failure = None
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._steps = 0
        self._step = step

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    def Free(self):
        if self.failure is not None:
            self.abandon()
            return
        self._tokens.Free()
        self._comm.Free()

    def abandon(self):
        """Leave the MPI communicator behind without another collective step
        (``Communicator.abort``); it is never used or freed again."""
        abandon(self._comm, self._tokens)

    def step(self, name):
        """``with node.step("register"):`` -- the collectives inside report
        timeouts as that step."""
        return _Step(self, name)

    def allgather(self, value):
        data = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
        size = np.array([data.size], dtype=np.int64)
        sizes = np.zeros(self._size, dtype=np.int64)
        self._bounded(lambda: self._comm.Iallgather(size, sizes))
        received = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        self._bounded(lambda: self._comm.Iallgatherv(data, [received, sizes, offsets, MPI.BYTE]))
        return [pickle.loads(received[o:o + s].tobytes()) for o, s in zip(offsets, sizes)]

    def allreduce(self, value, op=MPI.SUM):
        """Of picklable Python values, like mpi4py's ``allreduce``."""
        values = self.allgather(value)
        result = values[0]
        for v in values[1:]:
            result = op(result, v)
        return result

    def Barrier(self):
        self._bounded(self._comm.Ibarrier)

    def _bounded(self, start):
        if self.failure is not None:
            raise self.failure
        self._steps += 1
        tag = self._steps % _TAGS
        peers = [r for r in range(self._size) if r != self._rank]
        sends = [self._tokens.Isend(np.empty(0, np.uint8), dest=p, tag=tag) for p in peers]
        tokens = [self._tokens.Irecv(np.empty(0, np.uint8), source=p, tag=tag) for p in peers]
        deadline = time.monotonic() + self.timeout
        request = start()
        finished = completes(request, deadline)
        if _agree_in_time(self._comm, finished, deadline + self.timeout):
            MPI.Request.Waitall(sends + tokens)  # posted before the step by every peer
            return
        abandon(request, sends, tokens)
        missing = [p for p, token in zip(peers, tokens) if not token.Test()]
        for p, token in zip(peers, tokens):
            if p in missing:
                token.Cancel()
                token.Wait()
        self.failure = CollectiveTimeout(f"{self._step} (host-side exchange)", missing,
                                         self._rank, self.timeout, late=finished)
        raise self.failure


class _Step:
    def __init__(self, comm, name):
        self._comm = comm
        self._name = name

    def __enter__(self):
        self._outer = self._comm._step
        self._comm._step = self._name

    def __exit__(self, *exc):
        self._comm._step = self._outer
        return False
