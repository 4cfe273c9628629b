"""Teardown without a GPU (tier a): abort() gives up without a collective
step, and the MPI pattern its docstring gives for going on without a lost
rank works under mpirun (tests/mpi/survivors_cpu.py).
tests/gpu/test_teardown_gpu.py runs both on the GPU."""
import shutil
import types
import weakref

import pytest

pytest.importorskip("mpi4py")

from pyar.comm import communicator  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402
from tests.mpi_launch import run_scenario  # noqa: E402
from tests.test_buffer_lifetime_cpu import Graph, _NoStep  # noqa: E402
from tests.test_eager_cpu import X, Y, array, comm  # noqa: E402,F401 - the fixture


def test_abort_gives_up_without_a_collective_step(comm):
    """abort(): this rank's spinning kernels are told to stop (the error
    record's failed word), graphs closed, mappings closed, memory freed, the
    MPI communicator abandoned -- and nothing waits for a peer."""
    steps = []
    words = [0] * communicator._ERROR_WORDS
    comm._error_words = words
    comm._finalizer = types.SimpleNamespace(detach=lambda: steps.append("detach"))
    comm._captures = weakref.WeakSet()
    graph = Graph()
    comm._captures.add(graph)
    comm._resources = types.SimpleNamespace(
        close_mappings=lambda: steps.append(("close_mappings", words[0])),
        free=lambda: steps.append("free"))
    comm._node = types.SimpleNamespace(
        failure=None, abandon=lambda: steps.append("abandon"), step=lambda name: _NoStep(),
        Barrier=lambda: pytest.fail("abort took a collective step"),
        Free=lambda: pytest.fail("abort freed the MPI communicator (collective)"))
    comm._closed = False
    comm.abort()
    assert steps == ["detach", ("close_mappings", 1), "free", "abandon"]
    assert graph.executable is None and comm.closed
    with pytest.raises(ValueError, match="closed"):
        comm.allreduce(array(X), out=array(Y))
    comm.abort()
    comm.close()  # both return at once afterwards
    assert steps[-1] == "abandon" and len(steps) == 4


def closing(comm, failed):
    """``comm`` set up to close: a peer never reaches the barrier; returns
    the steps close() takes and the error record."""
    steps = []
    words = [0] * communicator._ERROR_WORDS
    comm._error_words = words
    comm._finalizer = types.SimpleNamespace(detach=lambda: None)
    comm._captures = weakref.WeakSet()
    comm._resources = types.SimpleNamespace(
        close_mappings=lambda: steps.append(("close_mappings", words[0])),
        free=lambda: steps.append("free"))

    def barrier():
        steps.append("barrier")
        raise CollectiveTimeout("close (host-side exchange)", (3,), 0, 1.0)

    comm._node = types.SimpleNamespace(failure=None, step=lambda name: _NoStep(),
                                       Barrier=barrier, Free=lambda: steps.append("Free"))
    comm._failure = CollectiveTimeout("allreduce call 7", (3,), 0, 1.0) if failed else None
    comm._closed = False
    return steps


@pytest.mark.parametrize("failed", [True, False], ids=["after-a-failure", "healthy"])
def test_close_releases_everything_when_a_peer_never_comes(comm, failed):
    """After a failure, close() makes this rank's waiting kernels stop first
    and returns though a peer never reaches its barrier; on a healthy
    communicator that peer is reported (CollectiveTimeout).  Either way this
    rank's memory is freed and the registered buffers let go."""
    steps = closing(comm, failed)
    comm._registry = object()
    if failed:
        comm.close()
    else:
        with pytest.raises(CollectiveTimeout, match="rank\\(s\\) 3 never arrived"):
            comm.close()
    assert steps == [("close_mappings", int(failed)), "barrier", "free", "Free"]
    assert comm.closed and comm._registry is None


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_survivors_go_on_over_a_group_without_the_lost_rank():
    _, rows = run_scenario("survivors_cpu", 3, timeout=120,
                           env={"PYAR_SCENARIO_WATCHDOG": "90"})
    assert rows == [{"test": "survivors-cpu", "world": 3, "failed_checks": 0}]
