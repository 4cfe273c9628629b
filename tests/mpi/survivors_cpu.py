"""The MPI side of going on without a lost rank, with no GPU (the pattern
Communicator.abort's docstring gives): the last rank stops taking part; the
others' bounded step raises CollectiveTimeout naming it, they abandon the
failed node communicator, make one of the survivors with
``COMM_WORLD.Create_group`` (the lost rank takes no part in it) and run
bounded steps on it that give the right values; only then is the lost rank
let go, and its own late step raises instead of waiting alone.

Usage: survivors_cpu.py
"""
import time

from allreduce_common import run

from pyar.comm import exchange  # noqa: E402
from pyar.comm.bounded import BoundedComm  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402

WAIT = 0.5
SLACK = 10.0  # ranks share two cores with the rest of the test run


def bounded_node(comm, wait):
    """The bounded MPI communicator a one-node pyar.Communicator runs its
    host-side steps on (pyar/comm/factory.py builds it the same way)."""
    return BoundedComm(exchange.ipc_split(comm, wait).domain, wait, "pyar.Communicator()")


def main(sc):
    lost = sc.world - 1
    node = bounded_node(sc.mpi, WAIT)
    node.Barrier()  # every rank is there once
    if sc.rank != lost:
        started = time.monotonic()
        error = sc.expect_raises(CollectiveTimeout, node.Barrier, "a step the lost rank misses",
                                 contains=(f"rank(s) {lost} never arrived",))
        sc.check(time.monotonic() - started < WAIT + SLACK, "the step waited too long")
        sc.check(error is None or error.missing == (lost,), f"missing {error and error.missing}")
        node.Free()  # failed: abandoned, not freed

        group = sc.mpi.Get_group().Excl([lost])
        survivors = sc.mpi.Create_group(group, tag=23)
        sc.check(survivors.Get_size() == sc.world - 1, f"{survivors.Get_size()} survivors")
        fresh = bounded_node(survivors, 30.0)
        ranks = fresh.allgather(sc.rank)
        sc.check(ranks == list(range(lost)), f"the survivors' communicator holds {ranks}")
        fresh.Barrier()
        fresh.Free()
        survivors.Free()
        group.Free()
        sc.mpi.Ibarrier().Wait()  # lets the lost rank go on
    else:
        sc.mpi.Ibarrier().Wait()
        error = sc.expect_raises(CollectiveTimeout, node.Barrier, "the lost rank's late step",
                                 contains=("given up",))
        sc.check(error is None or error.late, "the lost rank's error is not marked late")
        node.Free()
    sc.report(test="survivors-cpu", failed_checks=sc.sum(sc.failures))


if __name__ == "__main__":
    run("survivors_cpu", main)
