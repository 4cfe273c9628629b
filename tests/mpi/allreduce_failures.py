"""Failures that must be reported, never hang: disagreeing arguments under
PYAR_DEBUG, and a peer that never arrives.

1. Debug mismatch.  Run with PYAR_DEBUG=1 and PYAR_TIMEOUT=30 in the
   environment (the test sets them), the communicator is made with the
   defaults, so both come from the environment.  The last rank passes one
   element more than the others, then another dtype: every rank must raise
   pyar.MismatchError naming both groups of ranks and both values, before
   any kernel runs; afterwards an agreed call still works.
2. Timeout, once per algorithm (the LL one-shot and two-shot included, at
   an odd count within their limits at every world size), on a fresh
   Communicator(timeout=2.0, debug=False).  After a few good calls the last
   rank skips one call; the others' synchronize() must raise
   pyar.CollectiveTimeout within timeout + 10 s (and not before about the
   timeout) whose .missing is exactly the skipping rank, and every later
   call and synchronize on that communicator raises it again.  The skipping
   rank does not call, so it does not wait; its own communicator saw no
   error.  Every rank then closes the communicator and exits normally.

Usage: allreduce_failures.py
"""
import pickle
import time

import numpy as np
from mpi4py import MPI

import pyar
from allreduce_common import LL_ALGOS, WITH_LL, bits, run

TIMEOUT = 2.0
SLACK = 10.0


def debug_mismatch(sc):
    last = sc.world - 1
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20)
    sc.check(comm.debug is True, f"PYAR_DEBUG=1 did not enable debug checks ({comm.debug!r})")
    sc.check(comm.timeout == 30.0, f"PYAR_TIMEOUT=30 gave timeout {comm.timeout!r}")
    stream = pyar.Stream()
    others = "ranks [" + ", ".join(map(str, range(last))) + "]"
    raised = 0

    n = 4096 + (sc.rank == last)
    x = pyar.asarray(np.ones(n, np.float32), stream=stream)
    error = sc.expect_raises(pyar.MismatchError, lambda: comm.allreduce(x, stream=stream),
                             "different sizes under PYAR_DEBUG",
                             contains=(others, f"ranks [{last}]", "4096", "4097"))
    raised += error is not None

    dtype = np.float16 if sc.rank == last else np.float32
    x = pyar.asarray(np.ones(4096, dtype), stream=stream)
    error = sc.expect_raises(pyar.MismatchError, lambda: comm.allreduce(x, stream=stream),
                             "different dtypes under PYAR_DEBUG",
                             contains=(others, f"ranks [{last}]", "float16", "float32"))
    raised += error is not None
    if error is not None:
        copy = pickle.loads(pickle.dumps(error))
        sc.check(type(copy) is type(error) and str(copy) == str(error),
                 "MismatchError does not survive pickling")

    # Nothing was launched: the communicator still works, every rank agreeing.
    x = pyar.asarray(np.ones(4096, np.float32), stream=stream)
    for algo in WITH_LL:
        y = comm.allreduce(x, algo=algo, stream=stream)
        comm.synchronize(stream)
        sc.check(np.array_equal(y.get(stream=stream), np.full(4096, sc.world, np.float32)),
                 f"after the MismatchErrors, a {algo} call gave a wrong sum")
    comm.close()
    sc.report(test="debug-mismatch", calls=2, mismatches=2 * sc.world - sc.sum(raised),
              ranks_raised=sc.sum(raised))


def timeout(sc, algo):
    last = sc.world - 1
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=TIMEOUT, debug=False)
    sc.check(comm.timeout == TIMEOUT and comm.debug is False,
             f"timeout {comm.timeout!r}, debug {comm.debug!r}")
    stream = pyar.Stream()
    # LL: within both LL algorithms' limits at every world size (the one-shot's,
    # 256 KiB, is the smaller).
    n = 65536 - 3 if algo in LL_ALGOS else 65536 + 3
    x = pyar.asarray(np.ones(n, np.float32), stream=stream)
    y = pyar.empty((n,), np.float32, stream=stream)
    want = bits(np.full(n, sc.world, np.float32))
    for _ in range(3):
        comm.allreduce(x, out=y, algo=algo, stream=stream)
    comm.synchronize(stream)
    sc.check(np.array_equal(bits(y.get(stream=stream)), want),
             f"{algo}: wrong sum before the timeout")
    sc.mpi.Barrier()

    elapsed = None
    missing = None
    if sc.rank != last:
        started = time.monotonic()
        error = None
        try:
            comm.allreduce(x, out=y, algo=algo, stream=stream)
            comm.synchronize(stream)
        except pyar.CollectiveTimeout as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - a failed check
            sc.check(False, f"{algo}: expected CollectiveTimeout, got {type(exc).__name__}: {exc}")
        elapsed = time.monotonic() - started
        sc.check(error is not None,
                 f"{algo}: no CollectiveTimeout though rank {last} never called")
        if error is not None:
            missing = list(error.missing)
            sc.check(last in error.missing, f"{algo}: .missing {error.missing} lacks rank {last}")
            sc.check(set(error.missing) == {last},
                     f"{algo}: .missing {error.missing} names ranks that did call")
            sc.check(error.rank == comm.rank, f"{algo}: .rank {error.rank} != {comm.rank}")
            sc.check(error.timeout == TIMEOUT, f"{algo}: .timeout {error.timeout}")
            sc.check("allreduce" in str(error.call), f"{algo}: .call {error.call!r}")
            sc.check(f"rank(s) {last} never arrived" in str(error),
                     f"{algo}: message {str(error)!r} does not name rank {last}")
            sc.check(isinstance(error, RuntimeError), "CollectiveTimeout is not a RuntimeError")
            sc.check(TIMEOUT * 0.9 <= elapsed < TIMEOUT + SLACK,
                     f"{algo}: raised after {elapsed:.2f} s with a {TIMEOUT} s timeout")
            copy = pickle.loads(pickle.dumps(error))
            sc.check((copy.call, copy.missing, copy.rank, copy.timeout, str(copy))
                     == (error.call, error.missing, error.rank, error.timeout, str(error)),
                     f"{algo}: CollectiveTimeout does not survive pickling")
            # The communicator is unusable from now on, and says so.
            sc.expect_raises(pyar.CollectiveTimeout,
                             lambda: comm.allreduce(x, out=y, algo=algo, stream=stream),
                             f"{algo}: a call after the timeout")
            sc.expect_raises(pyar.CollectiveTimeout, lambda: comm.synchronize(stream),
                             f"{algo}: synchronize after the timeout")
            sc.expect_raises(pyar.CollectiveTimeout, lambda: comm.register(x),
                             f"{algo}: register after the timeout")
    else:
        # The rank that skipped never waited for anyone, and nothing failed here.
        try:
            comm.synchronize(stream)
        except Exception as exc:  # noqa: BLE001 - a failed check
            sc.check(False, f"{algo}: the skipping rank's synchronize raised "
                            f"{type(exc).__name__}: {exc}")
    comm.close()  # collective: the skipping rank waits here for the others
    sc.check(comm.closed, f"{algo}: not closed after close()")
    longest = sc.max(elapsed or 0.0)
    sc.report(test="timeout", algo=algo, timeout=TIMEOUT, elapsed=round(longest, 3),
              skipped_rank=last, missing=missing, raised=sc.sum(missing is not None),
              expected=sc.world - 1)


def main(sc):
    debug_mismatch(sc)
    for algo in WITH_LL:
        timeout(sc, algo)


if __name__ == "__main__":
    run("allreduce_failures", main)
