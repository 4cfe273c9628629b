"""A rank that never reaches a host-side step of a real communicator: the
others raise, nobody hangs, and everyone can start over.

For each step -- register, the exchange at the end of a capture,
register_graph_buffers, close -- on a fresh Communicator(timeout=2.0):
- every rank but the last enters the step; each must raise
  pyar.CollectiveTimeout within twice the timeout + 10 s naming the step and the
  last rank, and a later call on that communicator raises at once;
- the last rank enters the same step after the others gave up and raises at
  once, marked ``late`` (it must not wait alone);
- every rank closes the failed communicator (returns: the failure is known),
  builds a new one over MPI.COMM_WORLD and gets an exact sum from it.

Usage: host_step_timeouts.py
"""
import time

import numpy as np
from mpi4py import MPI

import pyar
from allreduce_common import bits, run

TIMEOUT = 2.0
SLACK = 10.0
N = 4096 + 5


def register(comm, x, y, stream):
    comm.register(x)


def capture_end(comm, x, y, stream):
    with comm.capture(stream):
        comm.allreduce(x, out=y, stream=stream)


def register_graph_buffers(comm, x, y, stream):
    comm.register_graph_buffers()


def close(comm, x, y, stream):
    comm.close()


STEPS = {"register": (register, "register"),
         "capture end": (capture_end, "the exchange at the end of a capture"),
         "register_graph_buffers": (register_graph_buffers, "register_graph_buffers"),
         "close": (close, "close")}


def one_step(sc, name):
    enter, named = STEPS[name]
    last = sc.world - 1
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=TIMEOUT)
    stream = pyar.Stream()
    x = pyar.asarray(np.ones(N, np.float32), stream=stream, ipc=True)  # registered
    y = pyar.empty((N,), np.float32, stream=stream)
    stream.synchronize()
    sc.mpi.Barrier()

    raised = late = 0
    elapsed = None
    if sc.rank != last:
        started = time.monotonic()
        error = sc.expect_raises(pyar.CollectiveTimeout, lambda: enter(comm, x, y, stream),
                                 f"{name} the last rank never reaches",
                                 contains=(f"{named} (host-side exchange)",
                                           f"rank(s) {last} never arrived"))
        elapsed = time.monotonic() - started
        if error is not None:
            raised = 1
            sc.check(error.missing == (last,) and not error.late,
                     f"{name}: missing {error.missing}, late {error.late}")
            sc.check(2 * TIMEOUT * 0.9 <= elapsed < 2 * TIMEOUT + SLACK,
                     f"{name}: raised after {elapsed:.2f} s; host steps wait twice the "
                     f"{TIMEOUT} s timeout")
        if name != "close":
            started = time.monotonic()
            sc.expect_raises(pyar.CollectiveTimeout,
                             lambda: comm.allreduce(x, out=y, stream=stream),
                             f"{name}: a call after the timeout")
            sc.check(time.monotonic() - started < 1.0, f"{name}: the later call waited")
    else:
        time.sleep(2 * TIMEOUT + 1.0)  # host steps wait twice the timeout
        started = time.monotonic()
        error = sc.expect_raises(pyar.CollectiveTimeout, lambda: enter(comm, x, y, stream),
                                 f"{name}, reached after the others gave up",
                                 contains=("given up",))
        late = int(error is not None and error.late)
        sc.check(time.monotonic() - started < SLACK, f"{name}: the late rank waited")
    started = time.monotonic()
    comm.close()
    sc.check(comm.closed and time.monotonic() - started < TIMEOUT + SLACK,
             f"{name}: close after the failure")

    # Everyone starts over on the same GPU.
    fresh = pyar.Communicator(MPI.COMM_WORLD, max_size=1 << 20, timeout=30.0)
    z = fresh.allreduce(x, stream=stream)
    fresh.synchronize(stream)
    sc.check(np.array_equal(bits(z.get(stream=stream)), bits(np.full(N, sc.world, np.float32))),
             f"{name}: a new communicator after the failure gave a wrong sum")
    fresh.close()
    sc.report(test="host-step-timeout", step=name, timeout=TIMEOUT,
              elapsed=round(sc.max(elapsed or 0.0), 3), raised=sc.sum(raised),
              late_raised=sc.sum(late), expected=sc.world - 1)


def main(sc):
    for name in STEPS:
        one_step(sc, name)


if __name__ == "__main__":
    run("host_step_timeouts", main)
