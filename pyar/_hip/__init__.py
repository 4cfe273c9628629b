"""Cython binding of the HIP runtime API (on NVIDIA, mapped onto the CUDA
driver API).  Loading is lazy: importing works on any machine, and the first
call that needs a GPU runtime loads one or raises RuntimeNotFoundError."""
from pyar._hip._runtime import (
    Device, DeviceMemory, Event, Function, Graph, GraphExec, IpcHandle, IpcMapping,
    LaunchSequence, Module, PinnedMemory, PoolMemory, Stream, address_range, as_stream,
    device_synchronize, driver_version, get_device, get_device_count, ipc_get_handle, ipc_open,
    library_path, memcpy_dtod, memcpy_dtoh, memcpy_htod, memset, platform, pointer_device,
    runtime_version, set_device, stream_is_capturing, stream_ordered_memory,
)
from pyar._hip.capture import capture
from pyar._hip.errors import HipError, RuntimeNotFoundError

__all__ = [
    "Device", "DeviceMemory", "Event", "Function", "Graph", "GraphExec", "HipError",
    "IpcHandle", "IpcMapping", "LaunchSequence", "Module", "PinnedMemory", "PoolMemory",
    "RuntimeNotFoundError", "Stream",
    "address_range", "as_stream", "capture", "device_synchronize", "driver_version", "get_device",
    "get_device_count", "ipc_get_handle", "ipc_open", "library_path", "memcpy_dtod",
    "memcpy_dtoh", "memcpy_htod", "memset", "platform", "pointer_device", "runtime_version",
    "set_device", "stream_is_capturing", "stream_ordered_memory",
]
