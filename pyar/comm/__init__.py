"""The communicator layer: mpi4py exchange, buffers, algorithm choice and the
collectives themselves."""
from pyar.comm.errors import CollectiveTimeout, MismatchError, PeerAccessError
from pyar.comm.factory import Communicator
from pyar.comm.protocol import CommunicatorProtocol, NodeCommunicatorProtocol

__all__ = ["CollectiveTimeout", "Communicator", "CommunicatorProtocol", "MismatchError",
           "NodeCommunicatorProtocol", "PeerAccessError"]
