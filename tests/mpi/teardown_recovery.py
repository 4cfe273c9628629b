"""After a failure, every rank tears down without hanging and the survivors
go on, on the same GPU, over a communicator that leaves the lost rank out.

On a Communicator(timeout=2.0, debug=False), after twelve checked calls (3
dtypes x one-shot/two-shot x staged/registered, each registered buffer
unregistered after its call):
  stop            the lost rank (the last) stops calling pyar; each survivor's
                  next all-reduce raises CollectiveTimeout naming it within
                  timeout + 10 s.
  abort-idle      rank 1 calls abort() between calls: it returns within 1 s;
                  the others' next all-reduce raises CollectiveTimeout naming
                  rank 1 within timeout + 10 s.
  abort-inflight  rank 1 queues an all-reduce and aborts while its kernel
                  waits for the others (who call 0.5 s later): abort()
                  returns within 1 s (its kernel stops waiting), the others
                  raise CollectiveTimeout naming rank 1.
  mismatch        the last rank passes one element more (no PYAR_DEBUG): every
                  rank raises MismatchError (the kernels' start-barrier check);
                  nobody is lost, the rebuild is over every rank.
Then each survivor closes the failed communicator (within twice the timeout
+ 10 s; it returns, no exception), builds a new one over
``COMM_WORLD.Create_group`` of the survivors (collective over them only: the
lost rank takes no part) and all-reduces random data (3 dtypes x one-shot,
two-shot, staged and registered) within the float64 reference's bound.  The
lost rank waits for the survivors without calling pyar, then closes (stop:
CollectiveTimeout, late) or finds its aborted communicator closed.

One row per rank: the failure injected, the rank's role, what it saw, seconds
from the call to the exception (abort: the abort itself), seconds in close(),
and the rebuilt communicator's size and wrong elements.

Usage: teardown_recovery.py stop | abort-idle | abort-inflight | mismatch
"""
import time

import numpy as np
from mpi4py import MPI

import pyar
from allreduce_common import DTYPES, run
from checked_sums import RandomSum

TIMEOUT = 2.0
SLACK = 10.0
N = 65536 + 3
ABORTER = 1


def checked_calls(sc, comm, stream, after, world, rank):
    """Random all-reduces on ``comm``, each checked (``after`` the failure or
    before it); returns the wrong elements."""
    wrong = 0
    for d, dtype in enumerate(DTYPES):
        for a, algo in enumerate(("oneshot", "twoshot")):
            for registered in (False, True):
                data = RandomSum(dtype, N, rank, world, after, d, a, registered)
                x = pyar.asarray(data.mine, stream=stream, ipc=registered)
                if registered:
                    comm.register(x)
                y = comm.allreduce(x, algo=algo, stream=stream)
                comm.synchronize(stream)
                bad = data.wrong(y.get(stream=stream))
                sc.check(bad == 0, f"{'after' if after else 'before'} the failure: "
                                   f"{dtype.name} {algo} "
                                   f"{'registered' if registered else 'staged'}: {bad} of {N} "
                                   "elements beyond the bound")
                wrong += bad
                if registered:
                    comm.unregister(x)
    return wrong


def failing_call(sc, comm, stream, failure, lost):
    """The survivors' call that must fail; returns (what it saw, seconds)."""
    n = N + 1 if failure == "mismatch" and sc.rank == sc.world - 1 else N
    x = pyar.asarray(np.ones(n, np.float32), stream=stream)
    if failure == "abort-inflight":
        time.sleep(0.5)  # the aborting rank's kernel is waiting meanwhile
    expected = pyar.MismatchError if failure == "mismatch" else pyar.CollectiveTimeout
    started = time.monotonic()
    try:
        comm.allreduce(x, stream=stream)
        comm.synchronize(stream)
    except Exception as exc:  # noqa: BLE001 - what the rank saw is the result
        seconds = time.monotonic() - started
        sc.check(isinstance(exc, expected), f"{failure}: raised {type(exc).__name__}: {exc}; "
                                            f"expected {expected.__name__}")
        if isinstance(exc, pyar.CollectiveTimeout):
            sc.check(exc.missing == (lost,), f"{failure}: missing {exc.missing}, lost {lost}")
            sc.check(TIMEOUT * 0.9 <= seconds < TIMEOUT + SLACK,
                     f"{failure}: raised after {seconds:.2f} s with a {TIMEOUT} s timeout")
        return type(exc).__name__, seconds
    sc.check(False, f"{failure}: the call raised nothing")
    return "nothing", time.monotonic() - started


def lost_rank(sc, comm, stream, failure):
    """The rank that is gone: stops calling, or aborts; returns (saw, seconds)."""
    if failure == "stop":
        return "nothing (stopped calling)", 0.0
    if failure == "abort-inflight":
        x = pyar.asarray(np.ones(N, np.float32), stream=stream)
        comm.allreduce(x, stream=stream)  # waits for peers that come 0.5 s later
    started = time.monotonic()
    comm.abort()
    seconds = time.monotonic() - started
    sc.check(comm.closed and seconds < 1.0, f"{failure}: abort() took {seconds:.2f} s")
    sc.expect_raises(ValueError, lambda: comm.allreduce(pyar.zeros((16,)), stream=stream),
                     f"{failure}: a call after abort()", contains=("closed",))
    return "aborted", seconds


def main(sc):
    failure = sc.argv[0]
    lost = {"stop": sc.world - 1, "mismatch": None}.get(failure, ABORTER)
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=TIMEOUT, debug=False)
    stream = pyar.Stream()
    wrong = checked_calls(sc, comm, stream, False, sc.world, sc.rank)
    sc.mpi.Barrier()

    survivor = sc.rank != lost
    if survivor:
        saw, seconds = failing_call(sc, comm, stream, failure, lost)
    else:
        saw, seconds = lost_rank(sc, comm, stream, failure)
    started = time.monotonic()
    close_error = None
    if survivor:
        try:
            comm.close()
        except Exception as exc:  # noqa: BLE001 - a failed check
            close_error = exc
        sc.check(close_error is None, f"{failure}: close() after the failure raised "
                                      f"{type(close_error).__name__}: {close_error}")
        close_s = time.monotonic() - started
        sc.check(comm.closed and close_s < 2 * TIMEOUT + SLACK,
                 f"{failure}: close() took {close_s:.2f} s")

        # Everyone but the lost rank: a communicator of the survivors.
        world_group = sc.mpi.Get_group()
        group = world_group if lost is None else world_group.Excl([lost])
        sub = sc.mpi.Create_group(group, tag=17)
        rebuilt = pyar.Communicator(sub, max_size=1 << 20, timeout=30.0)
        size = rebuilt.world
        wrong += checked_calls(sc, rebuilt, stream, True, size, rebuilt.rank)
        rebuilt.close()
        sub.Free()
        if group is not world_group:
            group.Free()
        world_group.Free()
        done = sc.mpi.Ibarrier()  # lets the lost rank go on
    else:
        size = 0
        sc.mpi.Ibarrier().Wait()  # until the survivors are done, calling nothing
        started = time.monotonic()
        if failure == "stop":
            sc.expect_raises(pyar.CollectiveTimeout, comm.close,
                             "stop: the lost rank's late close()", contains=("given up",))
            saw += "; close: CollectiveTimeout (late)"
        else:
            comm.close()  # already closed by abort(): returns at once
        close_s = time.monotonic() - started
        sc.check(comm.closed, f"{failure}: the lost rank's communicator is not closed")
        done = None
    if done is not None:
        done.Wait()

    for row in sc.mpi.allgather(dict(rank=sc.rank, role="survivor" if survivor else "lost",
                                     saw=saw, seconds=round(seconds, 3),
                                     close_s=round(close_s, 3), rebuilt_world=size)):
        sc.report(test="teardown", failure=failure, timeout=TIMEOUT, **row)
    sc.report(test="teardown-total", failure=failure, lost=lost, wrong=sc.sum(wrong),
              failed_checks=sc.sum(sc.failures))


if __name__ == "__main__":
    run("teardown_recovery", main)
