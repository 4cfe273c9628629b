"""The MPI side of the communicator (pyar.comm.exchange) under mpirun, with
no GPU: tests/test_comm_cpu.py runs it on 2 and 3 ranks, and on 9 for the
world-size limit.

Modes:
  exchange      ipc_split, run_everywhere, check_agreement, agree_min, and
                what Communicator() checks collectively before its first GPU
                call (max_size/timeout agreement; without a GPU, the device
                step fails on every rank instead of hanging).
  too-many      (run on 9 ranks) Communicator() refuses more than 8 ranks on
                every rank.
  unpicklable   a step fails on one rank with an exception that cannot be
                pickled: every rank must still raise (a hang is reported by
                the watchdog, which exits with status 3).
  bounded       the host-side steps bounded by the timeout (pyar.comm.bounded):
                the node communicator's collectives give the right values;
                when the last rank never reaches a step (a named one, then
                Communicator() itself) the others raise CollectiveTimeout
                naming the step and that rank within timeout + slack, later
                steps raise at once, and the last rank, arriving after they
                gave up, raises too (``late``) instead of waiting alone.

Usage: comm_cpu_exchange.py exchange | too-many | unpicklable | bounded
"""
import faulthandler
import os
import sys
import threading
import time

from mpi4py import MPI

from allreduce_common import run

import pyar  # noqa: E402
from pyar.comm import exchange  # noqa: E402
from pyar.comm.bounded import BoundedComm  # noqa: E402
from pyar.comm.errors import CollectiveTimeout, MismatchError  # noqa: E402

TIMEOUT = 0.5
SLACK = 10.0  # ranks share two cores with the rest of the test run


class StepFailed(ValueError):
    pass


def check_ipc_split(sc):
    """One machine: one IPC domain of every rank, in their order, and no rail."""
    world = MPI.COMM_WORLD
    split = exchange.ipc_split(world)
    node = split.domain
    sc.check(isinstance(node, MPI.Intracomm), f"ipc_split's domain is {type(node).__name__}")
    sc.check(split.rail is None and split.domains == 1, f"one node, yet {split.domains} domains")
    sc.check(node.Get_size() == sc.world, f"node size {node.Get_size()} != {sc.world}")
    sc.check(node.Get_rank() == sc.rank, f"node rank {node.Get_rank()} != world rank {sc.rank}")
    split.free()
    # A sub-communicator works the same way (ranks in reverse order here).
    reverse = world.Split(0, key=sc.world - 1 - sc.rank)
    split = exchange.ipc_split(reverse)
    sc.check(split.domain.Get_rank() == reverse.Get_rank(),
             "ipc_split does not keep the rank order")
    split.free()
    reverse.Free()
    for bad in (None, object(), 42, MPI.COMM_NULL):
        sc.expect_raises(TypeError, lambda: exchange.ipc_split(bad), f"ipc_split({bad!r})")


def check_run_everywhere(sc):
    world = MPI.COMM_WORLD
    got = exchange.run_everywhere(world, lambda r: r * 10, sc.rank)
    sc.check(got == sc.rank * 10, f"run_everywhere returned {got!r}")

    def fail_on(ranks):
        def step():
            if sc.rank in ranks:
                raise StepFailed(f"boom on {sc.rank}")
            return "fine"
        return step

    # Rank 1 fails: it raises its own error, every other rank a RuntimeError naming rank 1.
    try:
        exchange.run_everywhere(world, fail_on({1}))
    except StepFailed as exc:
        sc.check(sc.rank == 1, f"rank {sc.rank} raised the failing step's error: {exc}")
        sc.check(str(exc) == "boom on 1", f"message {exc}")
    except RuntimeError as exc:
        sc.check(sc.rank != 1, f"the failing rank raised RuntimeError: {exc}")
        sc.check("rank 1 failed" in str(exc) and "StepFailed" in str(exc)
                 and "boom on 1" in str(exc), f"message {exc!r} does not name rank 1's error")
    else:
        sc.check(False, "run_everywhere with a failing rank raised nothing")

    # Every rank but 0 fails: rank 0 names the first failing rank.
    if sc.world > 2:
        try:
            exchange.run_everywhere(world, fail_on(set(range(1, sc.world))))
        except StepFailed as exc:
            sc.check(sc.rank != 0 and str(exc) == f"boom on {sc.rank}", f"rank {sc.rank}: {exc}")
        except RuntimeError as exc:
            sc.check(sc.rank == 0 and "rank 1 failed" in str(exc), f"rank {sc.rank}: {exc}")
        else:
            sc.check(False, "run_everywhere with failing ranks raised nothing")

    # Every rank fails: each raises its own.
    error = sc.expect_raises(StepFailed,
                             lambda: exchange.run_everywhere(world, fail_on(range(sc.world))),
                             "run_everywhere failing everywhere")
    if error is not None:
        sc.check(str(error) == f"boom on {sc.rank}", f"rank {sc.rank} raised {error}")


def check_agreement(sc):
    world = MPI.COMM_WORLD
    sc.check(exchange.check_agreement(world, "a value", (4, "float32")) is None,
             "check_agreement of equal values")
    odd = 1 if sc.world > 2 else sc.world - 1  # the rank that disagrees
    value = (4097 if sc.rank == odd else 4096, "float32")
    rest = [r for r in range(sc.world) if r != odd]
    error = sc.expect_raises(
        MismatchError, lambda: exchange.check_agreement(world, "the element count", value),
        "check_agreement of different values",
        contains=("the element count", f"ranks {rest}: (4096, 'float32')",
                  f"ranks [{odd}]: (4097, 'float32')"))
    if error is not None:
        sc.check(isinstance(error, ValueError), "MismatchError is not a ValueError")
    sc.check(exchange.agree_min(world, 10 - sc.rank) == 10 - (sc.world - 1), "agree_min")
    sc.check(exchange.agree_min(world, 7) == 7, "agree_min of equal values")


def check_communicator(sc):
    world = MPI.COMM_WORLD
    # Disagreeing sizes or timeouts would chunk differently: caught before any GPU call.
    sc.expect_raises(MismatchError,
                     lambda: pyar.Communicator(world, max_size=(1 << 20) * (1 + sc.rank)),
                     "Communicator with max_size differing across ranks",
                     contains=("max_size",))
    sc.expect_raises(MismatchError,
                     lambda: pyar.Communicator(world, timeout=5.0 + sc.rank),
                     "Communicator with timeouts differing across ranks")
    # max_size is rounded up to whole 16-byte packs before it is compared.
    sc.expect_raises(MismatchError,
                     lambda: pyar.Communicator(world, max_size=4096 + 16 * sc.rank),
                     "Communicator with max_size differing by a pack")
    try:
        count = pyar.get_device_count()
    except Exception:  # noqa: BLE001 - no GPU runtime or no device: the case tested below
        count = 0
    if sc.any(count > 0):
        sc.log("a GPU is visible: the no-GPU construction check is skipped")
        return
    # No GPU: the first GPU step fails on every rank, and none waits for the others.
    try:
        pyar.Communicator(world, max_size=(1 << 20) - sc.rank % 16)  # same after rounding
    except MismatchError as exc:
        sc.check(False, f"max_size was compared before rounding: {exc}")
    except Exception as exc:  # noqa: BLE001 - the expected outcome
        sc.check(isinstance(exc, (pyar.HipError, pyar.RuntimeNotFoundError)),
                 f"Communicator without a GPU raised {type(exc).__name__}: {exc}")
    else:
        sc.check(False, "Communicator without a GPU raised nothing")


def exchange_mode(sc):
    check_ipc_split(sc)
    check_run_everywhere(sc)
    check_agreement(sc)
    check_communicator(sc)
    # Still in step after all the failures.
    total = MPI.COMM_WORLD.allreduce(1)
    sc.check(total == sc.world, f"final allreduce gave {total}")
    sc.report(test="comm-cpu-exchange", failed_checks=sc.sum(sc.failures))


def too_many_mode(sc):
    sc.expect_raises(ValueError, lambda: pyar.Communicator(MPI.COMM_WORLD),
                     f"Communicator on {sc.world} ranks", contains=("at most 8",))
    sc.report(test="comm-cpu-too-many", failed_checks=sc.sum(sc.failures))


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()  # an attribute pickle refuses


def unpicklable_mode(sc):
    # A hang is the failure here: the watchdog ends it with a stack dump.  It
    # starts once every rank is here, so a peer slow to start under a loaded
    # test run is not taken for a hang.
    MPI.COMM_WORLD.Barrier()
    faulthandler.dump_traceback_later(float(os.environ.get("PYAR_HANG_SECONDS", "20")),
                                      exit=True)

    def step():
        if sc.rank == 1:
            raise Unpicklable("cannot travel")
        return 1

    try:
        exchange.run_everywhere(MPI.COMM_WORLD, step)
    except Exception as exc:  # noqa: BLE001 - any error on every rank is acceptable
        sc.log(f"raised {type(exc).__name__}: {exc}")
        if sc.rank == 0:
            sc.check("rank 1" in str(exc), f"rank 0's error does not name rank 1: {exc}")
    else:
        sc.check(False, "no rank may return normally when rank 1 failed")
    sc.report(test="comm-cpu-unpicklable", failed_checks=sc.sum(sc.failures))


def expect_timeout(sc, call, what, contains):
    """``call()`` must raise CollectiveTimeout after about TIMEOUT seconds."""
    start = time.monotonic()
    error = sc.expect_raises(CollectiveTimeout, call, what, contains=contains)
    waited = time.monotonic() - start
    sc.check(1.8 * TIMEOUT <= waited <= 2 * TIMEOUT + SLACK,
             f"{what}: raised after {waited:.1f} s, expected about {2 * TIMEOUT} s")
    return error


def expect_late(sc, call, what):
    """The rank that came after the others gave up: raises at once."""
    start = time.monotonic()
    error = sc.expect_raises(CollectiveTimeout, call, what, contains=("given up",))
    sc.check(error is None or error.late, f"{what}: the error is not marked late")
    sc.check(time.monotonic() - start < SLACK, f"{what}: waited before raising")


def bounded_mode(sc):
    world = MPI.COMM_WORLD
    late = sc.world - 1
    # The domain's bounded communicator as pyar.Communicator(timeout=TIMEOUT) makes it.
    node = BoundedComm(exchange.ipc_split(world, 2 * TIMEOUT).domain, 2 * TIMEOUT,
                       "pyar.Communicator()")
    sc.check(node.Get_rank() == sc.rank and node.Get_size() == sc.world, "node ranks")
    got = node.allgather({"rank": sc.rank, "payload": "x" * (100 * sc.rank)})
    sc.check(got == [{"rank": r, "payload": "x" * (100 * r)} for r in range(sc.world)],
             f"allgather gave {got!r}")
    sc.check(exchange.agree_min(node, 10 - sc.rank) == 11 - sc.world, "agree_min")
    sc.check(exchange.run_everywhere(node, lambda: sc.rank + 1) == sc.rank + 1,
             "run_everywhere")
    sc.expect_raises(MismatchError, lambda: exchange.check_agreement(
        node, "the element count", 4096 + (sc.rank == late)), "check_agreement",
        contains=(f"ranks [{late}]: 4097",))
    node.Barrier()

    if sc.rank != late:
        with node.step("register"):
            error = expect_timeout(sc, lambda: node.allgather("handles"),
                                   "a step the last rank never reaches",
                                   contains=("register (host-side exchange)", f"rank {sc.rank}",
                                             f"rank(s) {late} never arrived"))
        sc.check(error is None or (error.missing == (late,) and not error.late),
                 f"missing {getattr(error, 'missing', None)}")
        start = time.monotonic()
        sc.expect_raises(CollectiveTimeout, node.Barrier, "a step after the timeout",
                         contains=("register",))
        sc.check(time.monotonic() - start < 1.0, "a step after the timeout waited")
    else:
        time.sleep(2 * TIMEOUT + 1.0)  # host steps wait twice the timeout
        expect_late(sc, lambda: node.allgather("handles"), "the step, reached late")
    node.Free()

    # Communicator() itself: the last rank constructs late.  Without a GPU
    # the others would fail at the device step, after the arrival check.
    if sc.rank != late:
        expect_timeout(sc, lambda: pyar.Communicator(world, timeout=TIMEOUT),
                       "Communicator() the last rank never calls",
                       contains=("pyar.Communicator() (host-side exchange)",
                                 "not every rank arrived"))
    else:
        time.sleep(2 * TIMEOUT + 1.0)  # host steps wait twice the timeout
        expect_late(sc, lambda: pyar.Communicator(world, timeout=TIMEOUT),
                    "Communicator(), called late")
    total = world.allreduce(1)
    sc.check(total == sc.world, f"MPI.COMM_WORLD after the timeouts: allreduce gave {total}")
    sc.report(test="comm-cpu-bounded", failed_checks=sc.sum(sc.failures))


def main(sc):
    mode = sc.argv[0] if sc.argv else "exchange"
    {"exchange": exchange_mode, "too-many": too_many_mode,
     "unpicklable": unpicklable_mode, "bounded": bounded_mode}[mode](sc)


if __name__ == "__main__":
    sys.exit(run("comm_cpu_exchange", main))
