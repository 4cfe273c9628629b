"""pyar: a framework-neutral custom all-reduce for the GPUs of one node.

Importing pyar touches no GPU and does not initialize MPI: the runtime is
loaded at the first GPU call, and mpi4py when the communicator layer is first
used (``pyar.Communicator``).
"""
from pyar._hip import (
    Device, DeviceMemory, Event, Graph, GraphExec, HipError, Module, PinnedMemory,
    RuntimeNotFoundError, Stream, capture, get_device, get_device_count, platform, set_device,
)
from pyar.array import DeviceArray, asarray, empty, empty_like, zeros, zeros_like

__version__ = "0.1.0"

_COMM_NAMES = ("Communicator", "CollectiveTimeout", "MismatchError", "PeerAccessError")


def __getattr__(name):
    if name in _COMM_NAMES:
        from pyar import comm
        return getattr(comm, name)
    raise AttributeError(f"module 'pyar' has no attribute {name!r}")


__all__ = [
    "CollectiveTimeout", "Communicator", "Device", "DeviceArray", "DeviceMemory", "Event",
    "Graph", "GraphExec", "HipError", "MismatchError", "Module", "PeerAccessError",
    "PinnedMemory", "RuntimeNotFoundError", "Stream", "asarray", "capture", "empty",
    "empty_like", "get_device", "get_device_count", "platform", "set_device", "zeros",
    "zeros_like",
]
