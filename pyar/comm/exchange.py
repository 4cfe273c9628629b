"""The MPI side of a communicator: node-local grouping, handle exchange and
agreement checks.  Every function here is collective over ``comm`` and needs
no GPU, so the CPU test tier runs them under mpirun."""
from mpi4py import MPI

from pyar.comm import domains
from pyar.comm.bounded import arrive
from pyar.comm.errors import MismatchError


def ipc_split(comm, wait=None, node_size=None):
    """``comm`` split into IPC domains and rails (pyar.comm.domains.split);
    with ``wait`` (seconds), a rank of ``comm`` that does not arrive within it
    makes the others raise CollectiveTimeout first."""
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"expected an mpi4py intra-communicator, not {type(comm).__name__}")
    if wait is not None:
        arrive(comm, "pyar.Communicator()", wait)
    return domains.split(comm, node_size)


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
