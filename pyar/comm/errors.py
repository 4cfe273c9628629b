"""Exceptions of the communicator layer; picklable, since ranks exchange them."""


class CollectiveTimeout(RuntimeError):
    """A collective waited longer than the communicator's timeout for peers.

    ``call`` describes the call that timed out, ``missing`` lists the ranks that
    never arrived, ``rank`` is the rank that observed it.  The communicator is
    unusable afterwards: its barrier counters no longer agree across ranks.
    """

    def __init__(self, call, missing, rank, timeout):
        ranks = ", ".join(map(str, missing)) or "unknown"
        super().__init__(f"{call} on rank {rank}: rank(s) {ranks} never arrived within "
                         f"{timeout:g} s (the communicator is now closed to further calls)")
        self.call = call
        self.missing = tuple(missing)
        self.rank = rank
        self.timeout = timeout

    def __reduce__(self):
        return type(self), (self.call, self.missing, self.rank, self.timeout)


class MismatchError(ValueError):
    """Ranks passed disagreeing arguments to one collective (PYAR_DEBUG=1 checks)."""


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
