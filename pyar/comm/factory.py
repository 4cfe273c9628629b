"""``pyar.Communicator``: split the ranks into IPC domains once, then build
the one-node communicator over one domain or the hierarchical one over
several."""
from pyar.comm import exchange, rail
from pyar.comm import inter_node as inter_node_paths
from pyar.comm.bounded import BoundedComm
from pyar.comm.communicator import (
    DEFAULT_MAX_SIZE, NodeCommunicator, check_max_size, resolve_timeout,
)
from pyar.comm.hierarchical import HierarchicalCommunicator


def Communicator(mpi_comm, device=None, max_size=DEFAULT_MAX_SIZE, timeout=None, *,  # noqa: N802
                 node_size=None, kernels=None, debug=None, inter_node=None,
                 rail_method="auto"):
    """A custom all-reduce over the ranks of ``mpi_comm``, one GPU each
    (pyar.comm.protocol documents every call).

    Collective: every rank of ``mpi_comm`` constructs it together.
    ``device`` defaults to the node-local rank modulo the visible devices;
    several ranks may share one GPU (under MPS).  ``max_size`` is the
    scratch buffer in bytes (larger messages go in chunks); ``timeout``
    bounds every wait for peers, in seconds (default ``PYAR_TIMEOUT`` or
    300); the host-side steps (construction, register, the exchange at the
    end of a capture, close) wait twice it (pyar/comm/bounded.py says why).
    ``node_size`` (default ``PYAR_RANKS_PER_NODE``, else the whole node) is
    the number of ranks per IPC domain (pyar.comm.domains).  ``kernels``
    names a directory of code objects built from src/kernels (allreduce,
    allreduce_rmsnorm, shards and rail, named like the shipped ones) to use
    instead of them.  ``debug`` (default ``PYAR_DEBUG``) checks before each
    call that all ranks passed the same arguments; without it the kernels
    still compare every rank's call at their start and raise MismatchError.

    Over one IPC domain this returns a NodeCommunicator
    (pyar.comm.communicator); over several, a HierarchicalCommunicator
    (pyar.comm.hierarchical), which runs pyar's kernels inside each domain
    and MPI between them: ``inter_node`` (default ``PYAR_INTER_NODE``) picks
    its data path ("auto", "host", "device": pyar.comm.inter_node) and
    ``rail_method`` its inter-node sum (pyar.comm.rail); over one domain
    both are checked and have nothing to pick.
    """
    inter_node_paths.requested(inter_node)
    rail.choose(rail_method, 2)
    check_max_size(max_size)
    timeout = resolve_timeout(timeout)
    wait = 2 * timeout  # host-side steps: pyar/comm/bounded.py says why
    split = exchange.ipc_split(mpi_comm, wait, node_size)
    if split.rail is not None:
        return HierarchicalCommunicator(mpi_comm, split, device, max_size, timeout,
                                        kernels=kernels, debug=debug, rail_method=rail_method,
                                        inter_node=inter_node)
    return NodeCommunicator(BoundedComm(split.domain, wait, "pyar.Communicator()"), device,
                            max_size, timeout, kernels=kernels, debug=debug)
