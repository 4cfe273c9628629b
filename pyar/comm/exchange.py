"""The MPI side of a communicator: node-local grouping, handle exchange and
agreement checks.  Every function here is collective over ``comm`` and needs
no GPU, so the CPU test tier runs them under mpirun."""
from mpi4py import MPI

from pyar.comm.bounded import BoundedComm, arrive
from pyar.comm.errors import MismatchError


def node_local(comm, wait=None):
    """The sub-communicator of ``comm``'s ranks that share this node; with
    ``wait`` (seconds), a BoundedComm over it whose steps wait that long, and
    a rank of ``comm`` that does not arrive within it makes the others raise
    CollectiveTimeout.

    Raises NotImplementedError on every rank when ``comm`` spans several
    nodes: pyar moves data only through intra-node IPC.
    """
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"expected an mpi4py intra-communicator, not {type(comm).__name__}")
    if wait is not None:
        arrive(comm, "pyar.Communicator()", wait)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    spans_nodes = comm.allreduce(node.Get_size() != comm.Get_size(), op=MPI.LOR)
    if spans_nodes:
        node.Free()
        raise NotImplementedError(
            "the communicator spans several nodes; pyar all-reduces among the GPUs of one "
            "node (split it with Split_type(MPI.COMM_TYPE_SHARED))")
    return node if wait is None else BoundedComm(node, wait, "pyar.Communicator()")


def run_everywhere(comm, step, *args):
    """Run ``step(*args)`` on every rank; if it raised on any rank, raise on all.

    A setup step that fails on one rank (an IPC handle that will not open, an
    allocation that does not fit) would otherwise leave the others waiting in
    the next collective forever.
    """
    try:
        result, error = step(*args), None
    except Exception as exc:  # re-raised below, on every rank
        result, error = None, exc
    # Only text crosses ranks: an exception need not be picklable.
    summaries = comm.allgather(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(rank, text) for rank, text in enumerate(summaries) if text is not None]
    if failed:
        if error is not None:
            raise error
        rank, text = failed[0]
        raise RuntimeError(f"rank {rank} failed: {text}")
    return result


def check_agreement(comm, what, value):
    """Raise MismatchError on every rank unless all ranks passed the same ``value``."""
    values = comm.allgather(value)
    if all(v == values[0] for v in values):
        return
    groups = {}
    for rank, v in enumerate(values):
        groups.setdefault(repr(v), []).append(rank)
    detail = "; ".join(f"ranks {ranks}: {v}" for v, ranks in groups.items())
    raise MismatchError(f"ranks disagree on {what}: {detail}")


def agree_min(comm, value):
    return comm.allreduce(value, op=MPI.MIN)
