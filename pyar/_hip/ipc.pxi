# Inter-process memory handles.  A handle names a whole allocation; pyar
# always exports the allocation's base with the offset of the pointer inside
# it, because the runtime may hand out sub-allocations and the peer's mapping
# of the base can sit at any address.


class IpcHandle:
    """What a peer process needs to map device memory: the 64-byte runtime
    handle of the allocation, the offset of the exported pointer within it,
    and the allocation's size.  Picklable, so it can travel through MPI."""

    __slots__ = ("handle", "offset", "size")

    def __init__(self, handle, offset, size):
        if not isinstance(handle, bytes):
            raise TypeError(f"an IPC handle must be bytes, not {type(handle).__name__}")
        if len(handle) != 64:
            raise ValueError(f"an IPC handle is 64 bytes, got {len(handle)}")
        for what, value in (("offset", offset), ("size", size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"IPC {what} must be an int, not {type(value).__name__}")
        if offset < 0 or size < 0 or offset > size:
            raise ValueError(f"bad IPC offset/size: {offset}/{size}")
        self.handle = handle
        self.offset = offset
        self.size = size

    def __reduce__(self):
        return IpcHandle, (self.handle, self.offset, self.size)

    def __eq__(self, other):
        return (isinstance(other, IpcHandle) and other.handle == self.handle
                and other.offset == self.offset and other.size == self.size)

    def __hash__(self):
        return hash((self.handle, self.offset, self.size))

    def __repr__(self):
        return f"<pyar.IpcHandle offset={self.offset} size={self.size}>"


def ipc_get_handle(ptr):
    """The IpcHandle for device address ``ptr`` (anywhere inside an allocation)."""
    cdef hipIpcMemHandle_t handle
    cdef hipDeviceptr_t base = NULL
    cdef size_t size = 0
    cdef uintptr_t address = as_pointer(ptr)
    ensure_loaded()
    check(pyar_rt.hipMemGetAddressRange(&base, &size, <hipDeviceptr_t>address),
          "hipMemGetAddressRange")
    check(pyar_rt.hipIpcGetMemHandle(&handle, base), "hipIpcGetMemHandle")
    return IpcHandle((<char*>handle.reserved)[:64], address - <uintptr_t>base, size)


cdef class IpcMapping:
    """A peer's allocation mapped into this process; ``ptr`` is the exported
    pointer (base + offset).  ``close()`` unmaps it, once."""
    cdef readonly uintptr_t base
    cdef readonly uintptr_t ptr
    cdef readonly object handle
    cdef bint _open

    def __init__(self, handle):
        cdef hipIpcMemHandle_t raw
        cdef void* base = NULL
        cdef hipError_t status
        if not isinstance(handle, IpcHandle):
            raise TypeError(f"expected a pyar.IpcHandle, not {type(handle).__name__}")
        ensure_loaded()
        memcpy(raw.reserved, <const char*>handle.handle, 64)
        with nogil:
            status = pyar_rt.hipIpcOpenMemHandle(&base, raw, pyar_rt.ipc_open_flags)
        check(status, "hipIpcOpenMemHandle")
        self.base = <uintptr_t>base
        self.ptr = self.base + <uintptr_t>handle.offset
        self.handle = handle
        self._open = True

    @property
    def closed(self):
        return not self._open

    def close(self):
        if self._open:
            self._open = False
            check(pyar_rt.hipIpcCloseMemHandle(<void*>self.base), "hipIpcCloseMemHandle")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self._open:
            pyar_rt.hipIpcCloseMemHandle(<void*>self.base)


def ipc_open(handle):
    """Map a peer's exported memory; returns an IpcMapping."""
    return IpcMapping(handle)
