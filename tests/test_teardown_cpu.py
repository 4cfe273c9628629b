"""Teardown without a GPU (tier a): abort() gives up without a collective
step, and the MPI pattern its docstring gives for going on without a lost
rank works under mpirun (tests/mpi/survivors_cpu.py).
tests/gpu/test_teardown_gpu.py runs both on the GPU.

The communicator is assembled over the stand-ins of tests/comm_stand_ins.py:
its node and resources record the steps close() and abort() take, and the
error record shows, at each step, whether this rank's kernels were told to
stop waiting for peers (its failed word)."""
import gc
import shutil
import weakref

import pytest

pytest.importorskip("mpi4py")

from pyar.comm import kernels  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402
from tests.comm_stand_ins import (  # noqa: E402
    NodeStandIn, RegistryStandIn, array, assemble, captured_graph, error_record,
)
from tests.mpi_launch import run_scenario  # noqa: E402

X, Y = 0x7000_0000_0000, 0x7100_0000_0000


class Resources:
    """What close() and abort() release, recording each step with the error
    record's failed word as it was then."""

    def __init__(self, steps, words):
        self.steps, self.words = steps, words

    def close_mappings(self):
        self.steps.append(("close_mappings", self.words[kernels.FAILED]))

    def free(self):
        self.steps.append("free")


class Node(NodeStandIn):
    """A node communicator whose collective steps a test decides: ``barrier``
    runs in Barrier(); Free() and abandon() are recorded."""

    def __init__(self, steps, barrier):
        super().__init__(world=4)
        self.steps, self.barrier = steps, barrier

    def Barrier(self):  # noqa: N802 - mpi4py's names
        self.barrier()

    def Free(self):  # noqa: N802
        self.steps.append("Free")

    def abandon(self):
        self.steps.append("abandon")


def test_abort_gives_up_without_a_collective_step():
    """abort(): this rank's spinning kernels are told to stop (the error
    record's failed word), graphs closed, mappings closed, memory freed, the
    MPI communicator abandoned -- and nothing waits for a peer."""
    steps, words = [], error_record()

    def barrier():
        pytest.fail("abort took a collective step")

    node = Node(steps, barrier)
    node.Free = lambda: pytest.fail("abort freed the MPI communicator (collective)")
    comm = assemble(world=4, node=node, resources=Resources(steps, words), words=words)
    graph = captured_graph(comm)
    executable = graph.executable
    comm.abort()
    assert steps == [("close_mappings", 1), "free", "abandon"]
    assert executable.closed and graph.executable is None and comm.closed
    with pytest.raises(ValueError, match="closed"):
        comm.allreduce(array(X), out=array(Y))
    comm.abort()
    comm.close()  # both return at once afterwards
    gone = weakref.ref(comm)
    del comm, graph
    gc.collect()  # its finalizer was detached: nothing is released again
    assert gone() is None and steps == [("close_mappings", 1), "free", "abandon"]


def closing(failed):
    """A communicator set up to close while a peer never reaches the
    barrier; ``failed``: its node had failed before.  Returns (comm, the
    steps close() takes, a reference to its buffer registry)."""
    steps, words = [], error_record()

    def barrier():
        steps.append("barrier")
        raise CollectiveTimeout("close (host-side exchange)", (3,), 0, 1.0)

    node = Node(steps, barrier)
    if failed:
        node.failure = CollectiveTimeout("register (host-side exchange)", (3,), 0, 1.0)
    registry = RegistryStandIn()
    comm = assemble(world=4, node=node, resources=Resources(steps, words), words=words,
                    registry=registry)
    return comm, steps, weakref.ref(registry)


@pytest.mark.parametrize("failed", [True, False], ids=["after-a-failure", "healthy"])
def test_close_releases_everything_when_a_peer_never_comes(failed):
    """After a failure, close() makes this rank's waiting kernels stop first
    and returns though a peer never reaches its barrier; on a healthy
    communicator that peer is reported (CollectiveTimeout).  Either way this
    rank's memory is freed and the registered buffers let go."""
    comm, steps, registry = closing(failed)
    if failed:
        comm.close()
    else:
        with pytest.raises(CollectiveTimeout, match="rank\\(s\\) 3 never arrived"):
            comm.close()
    assert steps == [("close_mappings", int(failed)), "barrier", "free", "Free"]
    gc.collect()
    assert comm.closed and registry() is None


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_survivors_go_on_over_a_group_without_the_lost_rank():
    _, rows = run_scenario("survivors_cpu", 3, timeout=120,
                           env={"PYAR_SCENARIO_WATCHDOG": "90"})
    assert rows == [{"test": "survivors-cpu", "world": 3, "failed_checks": 0}]
