"""The communicator layer: mpi4py exchange, buffers, algorithm choice and the
collectives themselves."""
from pyar.comm.communicator import Communicator
from pyar.comm.errors import CollectiveTimeout, MismatchError, PeerAccessError

__all__ = ["CollectiveTimeout", "Communicator", "MismatchError", "PeerAccessError"]
