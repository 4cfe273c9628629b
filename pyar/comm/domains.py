"""Which ranks share an IPC domain, and the rails that join the domains.

An IPC domain is a set of ranks whose GPUs map each other's memory: pyar's
kernels move data inside one.  It is a node (``Split_type(COMM_TYPE_SHARED)``)
or, with ``node_size=k`` / ``PYAR_RANKS_PER_NODE=k``, consecutive groups of k
ranks of a node (PCIe machines whose GPUs reach each other only within a
socket; one machine simulating several nodes in tests).  A rail is the ranks
with the same rank inside their domain, one per domain, in domain order: the
hierarchical all-reduce's inter-node step runs over it.

Pure MPI (no GPU): collective over the communicator, and every rank raises
the same error for a bad ``node_size`` or domains of different sizes.
"""
import os
from typing import NamedTuple, Optional

from mpi4py import MPI

RANKS_PER_NODE = "PYAR_RANKS_PER_NODE"


def ranks_per_domain(node_size, node_ranks):
    """The IPC domain size for a node of ``node_ranks`` ranks: ``node_size``,
    else $PYAR_RANKS_PER_NODE, else the whole node (never more than it)."""
    source = "node_size"
    if node_size is None:
        text = os.environ.get(RANKS_PER_NODE, "").strip()
        if not text:
            return node_ranks
        source = f"{RANKS_PER_NODE}={text!r}"
        try:
            node_size = int(text)
        except ValueError:
            raise ValueError(f"{source} is not a whole number of ranks") from None
    if isinstance(node_size, bool) or not isinstance(node_size, int) or node_size < 1:
        raise ValueError(f"{source} must be a positive number of ranks, got {node_size!r}")
    return min(node_size, node_ranks)


class Split(NamedTuple):
    """This rank's IPC domain (ranks in the caller's order) and its rail
    (None when one domain holds every rank); ``domains`` is their number,
    ``domain_index`` this rank's domain among them (the rail rank) and
    ``node_rank`` this rank's rank on its node (which picks its GPU)."""
    domain: MPI.Intracomm
    rail: Optional[MPI.Intracomm]
    domains: int
    domain_index: int
    node_rank: int

    def free(self):
        self.domain.Free()
        if self.rail is not None:
            self.rail.Free()


def split(comm, node_size=None):
    """Split ``comm`` into IPC domains and rails (collective over ``comm``).

    Raises ValueError on every rank when ``node_size`` (or the variable) is
    not a positive int, or when the domains differ in size (nodes with
    different numbers of ranks, or a node size that ``node_size`` does not
    divide): the message names every node's and domain's size.
    """
    rank = comm.Get_rank()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        node_rank, node_ranks = node.Get_rank(), node.Get_size()
        try:
            size, problem = ranks_per_domain(node_size, node_ranks), None
        except ValueError as exc:
            size, problem = 1, f"rank {rank}: {exc}"
        node_first = node.bcast(rank)  # names the node: its first rank in comm
        group = node_rank // size
        domain = node.Split(group, key=node_rank)
    finally:
        node.Free()
    facts = comm.allgather((problem, node_first, group, domain.Get_rank(), domain.Get_size()))
    problems = [p for p, *_ in facts if p is not None]
    domain_ids = sorted({(first, g) for _, first, g, _, _ in facts})
    sizes = {(first, g): domain_size for _, first, g, _, domain_size in facts}
    if problems or len(set(sizes.values())) > 1:
        domain.Free()
        if problems:
            raise ValueError("; ".join(problems))
        raise ValueError(_uneven_message(facts, sizes))
    index = domain_ids.index((node_first, group))
    if len(domain_ids) == 1:
        return Split(domain, None, 1, 0, node_rank)
    rail = comm.Split(domain.Get_rank(), key=index)
    return Split(domain, rail, len(domain_ids), index, node_rank)


def _uneven_message(facts, sizes):
    nodes = {}
    for rank, (_, first, _, _, _) in enumerate(facts):
        nodes.setdefault(first, []).append(rank)
    node_text = "; ".join(f"node of ranks {_ranges(ranks)}: {len(ranks)} ranks"
                          for ranks in nodes.values())
    domain_text = ", ".join(str(sizes[d]) for d in sorted(sizes))
    return (f"pyar needs the same number of ranks in every IPC domain, but the nodes hold "
            f"different numbers of ranks or split unevenly ({node_text}; IPC domain sizes "
            f"{domain_text}); launch the same number of ranks per node (mpirun -H "
            f"host1:4,host2:4 ...) and choose a node_size / {RANKS_PER_NODE} that divides it")


def _ranges(ranks):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans, start = [], ranks[0]
    for previous, current in zip(ranks, ranks[1:] + [None]):
        if current != previous + 1:
            spans.append(str(start) if start == previous else f"{start}-{previous}")
            start = current
    return ", ".join(spans)
