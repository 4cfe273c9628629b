"""Exceptions of the communicator layer; picklable, since ranks exchange them."""


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than the communicator's timeout for peers.

    ``call`` describes the call (or host-side step) that timed out,
    ``missing`` lists the ranks that never arrived (empty where they cannot be
    told), ``rank`` is the rank that observed it.  ``late`` means this rank
    arrived after its peers had given up on it.  ``sequence`` is the 32-bit
    number of the kernel call that gave up, where a kernel did (None for a
    host-side step): this rank's earlier calls on the stream completed; the
    results of that call and of every later one are not to be used.  The
    communicator is unusable afterwards: its barrier counters no longer agree
    across ranks.
    """

    def __init__(self, call, missing, rank, timeout, late=False, sequence=None):
        if late:
            what = f"the other ranks had given up after waiting {timeout:g} s for this one"
        elif missing:
            what = (f"rank(s) {', '.join(map(str, missing))} never arrived within "
                    f"{timeout:g} s")
        else:
            what = f"not every rank arrived within {timeout:g} s"
        super().__init__(f"{call} on rank {rank}: {what} (the communicator is now closed "
                         "to further calls)")
        self.call = call
        self.missing = tuple(missing)
        self.rank = rank
        self.timeout = timeout
        self.late = late
        self.sequence = sequence

    def __reduce__(self):
        return type(self), (self.call, self.missing, self.rank, self.timeout, self.late,
                            self.sequence)


class MismatchError(ValueError):
    """Ranks passed disagreeing arguments to one collective.

    Raised on every rank before any launch when PYAR_DEBUG=1 checks the
    arguments across ranks; without it, by the kernels' start barrier, which
    compares every rank's call signature (operation, elements, dtype, staged
    or registered input, quantization) and touches no peer's data when they
    differ.  The second kind fails the communicator like a CollectiveTimeout.
    """


class PeerAccessError(RuntimeError):
    """This rank's GPU cannot reach a peer rank's GPU, which the collectives
    need: each rank reads the others' memory directly."""

    def __init__(self, rank, bus_id, peer_rank, peer_bus_id, detail=""):
        super().__init__(
            f"rank {rank} (GPU {bus_id}) has no peer access to rank {peer_rank} "
            f"(GPU {peer_bus_id}){': ' + detail if detail else ''}; pyar needs every pair "
            "of GPUs in the communicator connected (NVLink, xGMI, or PCIe peer-to-peer; "
            "`nvidia-smi topo -p2p r` or `rocm-smi --showtopo` shows which are)")
        self.rank = rank
        self.bus_id = bus_id
        self.peer_rank = peer_rank
        self.peer_bus_id = peer_bus_id
        self.detail = detail

    def __reduce__(self):
        return type(self), (self.rank, self.bus_id, self.peer_rank, self.peer_bus_id,
                            self.detail)
