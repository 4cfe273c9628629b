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
