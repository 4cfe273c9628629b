# Device and pinned host memory; memset and copies.
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_ANY_CONTIGUOUS, PyBUF_WRITABLE, PyBUF_FORMAT


cdef uintptr_t as_pointer(obj) except? 0:
    """A device address from an int or from anything with an int ``.ptr``."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj < 0:
            raise ValueError(f"a device pointer cannot be negative: {obj}")
        return obj
    ptr = getattr(obj, "ptr", None)
    if isinstance(ptr, int):
        return ptr
    raise TypeError(f"expected a device pointer (int or an object with .ptr), "
                    f"not {type(obj).__name__}")


cdef size_t checked_size(size, str what) except? 0:
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"{what} must be an int, not {type(size).__name__}")
    if size < 0:
        raise ValueError(f"{what} must be >= 0, got {size}")
    return size


cdef class DeviceMemory:
    """``size`` bytes of device memory on the current device, freed by
    ``free()``, by the context manager, or when the object is collected.
    ``uncached=True`` selects memory whose writes reach peers without cache
    maintenance (AMD: hipDeviceMallocUncached; NVIDIA: ordinary memory)."""
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef readonly int device
    cdef bint _owned

    def __init__(self, size, uncached=False):
        cdef size_t nbytes = checked_size(size, "size")
        cdef void* ptr = NULL
        cdef int device = 0
        ensure_loaded()
        check(pyar_rt.hipGetDevice(&device), "hipGetDevice")
        if nbytes:
            if uncached:
                check(pyar_rt.hipExtMallocWithFlags(&ptr, nbytes, pyar_rt.signal_malloc_flags),
                      "hipExtMallocWithFlags")
            else:
                check(pyar_rt.hipMalloc(&ptr, nbytes), "hipMalloc")
        self.ptr = <uintptr_t>ptr
        self.size = nbytes
        self.device = device
        self._owned = True

    @property
    def closed(self):
        return not self._owned

    def free(self):
        """Release the memory now; later calls do nothing."""
        cdef hipError_t status
        cdef void* ptr = <void*>self.ptr
        if not self._owned:
            return
        self._owned = False
        self.ptr = 0
        if ptr != NULL:
            with nogil:
                status = pyar_rt.hipFree(ptr)
            check(status, "hipFree")

    close = free

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __dealloc__(self):
        if self._owned and self.ptr:
            pyar_rt.hipFree(<void*>self.ptr)

    def __repr__(self):
        state = "freed" if not self._owned else f"{self.size} bytes at {self.ptr:#x}"
        return f"<pyar.DeviceMemory {state} on device {self.device}>"


# The stream-ordered pool: devices whose default pool has pyar's release
# threshold, and whether this runtime/device offers the pool at all.
cdef set _configured_pools = set()
cdef bint _pool_unsupported = False
# Bytes the device's default pool keeps for reuse when freed memory is not
# asked back.  Finite: CuPy, PyTorch and JAX allocate from the same device,
# and a pool that never gives memory back would starve them.
DEFAULT_RELEASE_THRESHOLD = 1 << 30
# Frees whose stream was capturing a graph when the array went away (a free
# there would be recorded into the graph): (pointer, stream, device), done
# once the capture has ended.
cdef list _frees_after_capture = []


def _release_threshold():
    text = os.environ.get("PYAR_POOL_RELEASE_THRESHOLD", "")
    if not text.strip():
        return DEFAULT_RELEASE_THRESHOLD
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < (1 << 64):
        raise ValueError(f"PYAR_POOL_RELEASE_THRESHOLD must be a byte count in [0, 2**64), "
                         f"got {text!r}")
    return value


cdef hipError_t configure_pool(int device, uint64_t threshold) noexcept:
    cdef hipMemPool_t pool = NULL
    cdef hipError_t status = pyar_rt.hipDeviceGetDefaultMemPool(&pool, device)
    if status == PYAR_hipSuccess:
        status = pyar_rt.hipMemPoolSetAttribute(pool, PYAR_hipMemPoolAttrReleaseThreshold,
                                                &threshold)
    return status


cdef class PoolMemory:
    """``size`` bytes from the current device's stream-ordered pool
    (hipMallocAsync), allocated on ``stream`` and given back to the pool on
    that stream by ``free()`` or when the object is collected (hipFreeAsync):
    neither waits for the device.  Work on other streams must be ordered
    before the free.  Memory allocated without a stream (the null stream) may
    have been used on any, so its free waits for the device like hipFree.
    Pool memory cannot be exported to other processes (IPC); ``DeviceMemory``
    can.  Make these with ``stream_ordered_memory``."""
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef readonly int device
    cdef Stream _stream  # None: the null stream; holds a wrapped stream's owner
    cdef bint _owned

    def __init__(self):
        raise TypeError("PoolMemory comes from pyar._hip.stream_ordered_memory()")

    @property
    def closed(self):
        return not self._owned

    @property
    def stream(self):
        return self._stream

    cdef void release(self) noexcept:
        cdef void* ptr = <void*>self.ptr
        if not self._owned:
            return
        self._owned = False
        self.ptr = 0
        if ptr == NULL:
            return
        if self._stream is None or self._stream._closed:
            # No stream orders the memory's work (it may have been used on any
            # stream), or its stream is gone: wait for the device, as hipFree does.
            free_on(ptr, NULL, self.device, True)
        elif stream_capturing(self._stream._handle):
            _frees_after_capture.append((<uintptr_t>ptr, self._stream, self.device))
        else:
            free_on(ptr, self._stream._handle, self.device, False)
        if _frees_after_capture:
            free_after_capture()

    def free(self):
        """Give the memory back to the pool, ordered after the work queued on
        its stream so far; later calls do nothing."""
        self.release()

    close = free

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __dealloc__(self):
        self.release()

    def __repr__(self):
        state = "freed" if not self._owned else f"{self.size} bytes at {self.ptr:#x}"
        return f"<pyar.PoolMemory {state} on device {self.device}>"


cdef bint stream_capturing(hipStream_t handle) noexcept:
    cdef int status = PYAR_hipStreamCaptureStatusNone
    if handle == NULL:
        return False  # the legacy stream never captures
    return (pyar_rt.hipStreamIsCapturing(handle, &status) == PYAR_hipSuccess
            and status != PYAR_hipStreamCaptureStatusNone)


cdef void free_on(void* ptr, hipStream_t handle, int device, bint wait) noexcept:
    """hipFreeAsync on ``device`` (the memory's, not necessarily the current one)."""
    cdef int current = device
    pyar_rt.hipGetDevice(&current)
    if current != device:
        pyar_rt.hipSetDevice(device)
    if wait:
        pyar_rt.hipDeviceSynchronize()
    pyar_rt.hipFreeAsync(ptr, handle)
    if current != device:
        pyar_rt.hipSetDevice(current)


cdef void free_after_capture() noexcept:
    cdef Stream stream
    cdef list waiting = []
    for entry in _frees_after_capture:
        stream = entry[1]
        if stream._closed:
            free_on(<void*><uintptr_t>entry[0], NULL, entry[2], True)
        elif stream_capturing(stream._handle):
            waiting.append(entry)
        else:
            free_on(<void*><uintptr_t>entry[0], stream._handle, entry[2], False)
    _frees_after_capture[:] = waiting


def stream_ordered_memory(size, stream=None):
    """``size`` bytes on the current device, allocated in stream order on
    ``stream``: a PoolMemory, or a DeviceMemory where the runtime or device
    has no stream-ordered pool.  ``stream=None``: the memory may be used on
    any stream, so freeing it waits for the device; ``Stream.null()`` orders
    it on the legacy stream instead.  A stream given as a bare int handle may
    be destroyed before the memory goes, so that memory is freed as if it had
    no stream.  Refused on a stream that is capturing a graph (the allocation
    would belong to the graph)."""
    global _pool_unsupported
    cdef size_t nbytes = checked_size(size, "size")
    cdef PoolMemory memory
    cdef Stream owner = None if stream is None else as_stream(stream)
    cdef hipStream_t handle = NULL if owner is None else owner.checked_handle()
    if stream_capturing(handle):
        raise RuntimeError("cannot allocate on a stream that is capturing a graph (the memory "
                           "would belong to the graph): allocate before the capture and pass "
                           "out=")
    if _frees_after_capture:
        free_after_capture()
    cdef void* ptr = NULL
    cdef int device = 0
    cdef hipError_t status
    ensure_loaded()
    if _pool_unsupported:
        return DeviceMemory(nbytes)
    check(pyar_rt.hipGetDevice(&device), "hipGetDevice")
    if nbytes:
        if device not in _configured_pools:
            # A device or runtime without a usable default pool (old drivers,
            # some virtualized or shared setups) says so here: use hipMalloc.
            if configure_pool(device, _release_threshold()) != PYAR_hipSuccess:
                pyar_rt.hipGetLastError()
                _pool_unsupported = True
                return DeviceMemory(nbytes)
            _configured_pools.add(device)
        status = pyar_rt.hipMallocAsync(&ptr, nbytes, handle)
        if status == PYAR_hipErrorNotSupported:
            pyar_rt.hipGetLastError()
            _pool_unsupported = True
            return DeviceMemory(nbytes)
        check(status, "hipMallocAsync")
    memory = PoolMemory.__new__(PoolMemory)
    memory.ptr = <uintptr_t>ptr
    memory.size = nbytes
    memory.device = device
    # A stream known only by its handle (an int, no owner kept) may be
    # destroyed before the memory goes: such memory is freed like memory
    # allocated without a stream.
    memory._stream = owner if owner is not None and (
        owner._handle == NULL or owner._owned or owner._owner is not None) else None
    memory._owned = True
    return memory


cdef class PinnedMemory:
    """Page-locked host memory (truly asynchronous copies); exposes the buffer
    protocol, so ``numpy.frombuffer(m, dtype)`` views it."""
    cdef readonly uintptr_t ptr
    cdef readonly size_t size
    cdef bint _owned
    cdef Py_ssize_t _exports

    def __init__(self, size):
        cdef size_t nbytes = checked_size(size, "size")
        cdef void* ptr = NULL
        ensure_loaded()
        check(pyar_rt.hipHostMalloc(&ptr, nbytes if nbytes else 1, PYAR_hipHostMallocDefault),
              "hipHostMalloc")
        self.ptr = <uintptr_t>ptr
        self.size = nbytes
        self._owned = True

    def __getbuffer__(self, Py_buffer* view, int flags):
        if not self._owned:
            raise ValueError("pinned memory is freed")
        view.buf = <void*>self.ptr
        view.obj = self
        view.len = self.size
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = "B"
        view.ndim = 1
        view.shape = <Py_ssize_t*>&view.len
        view.strides = &view.itemsize
        view.suboffsets = NULL
        view.internal = NULL
        self._exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self._exports -= 1

    def free(self):
        if not self._owned:
            return
        if self._exports:
            raise BufferError("pinned memory is still viewed by a buffer export")
        self._owned = False
        check(pyar_rt.hipHostFree(<void*>self.ptr), "hipHostFree")
        self.ptr = 0

    def __dealloc__(self):
        if self._owned and self.ptr:
            pyar_rt.hipHostFree(<void*>self.ptr)


def memset(dst, value, size, stream=None):
    """Set ``size`` bytes at ``dst`` to ``value``; asynchronous when a stream is given."""
    cdef void* ptr = <void*>as_pointer(dst)
    cdef size_t nbytes = checked_size(size, "size")
    cdef hipStream_t handle
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"memset value must be an int, not {type(value).__name__}")
    if not 0 <= value <= 255:
        raise ValueError(f"memset value must be a byte (0..255), got {value}")
    handle = stream_handle(stream)
    ensure_loaded()
    if stream is None:
        check(pyar_rt.hipMemset(ptr, value, nbytes), "hipMemset")
    else:
        check(pyar_rt.hipMemsetAsync(ptr, value, nbytes, handle), "hipMemsetAsync")


cdef int copy(void* dst, const void* src, size_t nbytes, int kind, stream) except -1:
    cdef hipError_t status
    cdef hipStream_t handle = stream_handle(stream)  # checked even for empty copies
    if nbytes == 0:
        return 0
    ensure_loaded()
    if stream is None:
        with nogil:
            status = pyar_rt.hipMemcpy(dst, src, nbytes, kind)
        return check(status, "hipMemcpy")
    with nogil:
        status = pyar_rt.hipMemcpyAsync(dst, src, nbytes, kind, handle)
    return check(status, "hipMemcpyAsync")


def memcpy_htod(dst, src, stream=None):
    """Copy the bytes of the contiguous host buffer ``src`` to device address ``dst``."""
    cdef Py_buffer view
    cdef void* ptr = <void*>as_pointer(dst)
    PyObject_GetBuffer(src, &view, PyBUF_ANY_CONTIGUOUS)
    try:
        copy(ptr, view.buf, view.len, PYAR_hipMemcpyHostToDevice, stream)
    finally:
        PyBuffer_Release(&view)


def memcpy_dtoh(dst, src, stream=None):
    """Fill the writable contiguous host buffer ``dst`` from device address ``src``."""
    cdef Py_buffer view
    cdef const void* ptr = <const void*>as_pointer(src)
    PyObject_GetBuffer(dst, &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE)
    try:
        copy(view.buf, ptr, view.len, PYAR_hipMemcpyDeviceToHost, stream)
    finally:
        PyBuffer_Release(&view)


def memcpy_dtod(dst, src, size, stream=None):
    """Copy ``size`` bytes between device addresses."""
    cdef void* dst_ptr = <void*>as_pointer(dst)
    cdef const void* src_ptr = <const void*>as_pointer(src)
    cdef size_t nbytes = checked_size(size, "size")
    copy(dst_ptr, src_ptr, nbytes, PYAR_hipMemcpyDeviceToDevice, stream)


def pointer_device(ptr):
    """The ordinal of the device that owns device address ``ptr``."""
    cdef int device = -1
    cdef uintptr_t address = as_pointer(ptr)
    ensure_loaded()
    check(pyar_rt.hipPointerGetAttribute(&device, PYAR_HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                         <hipDeviceptr_t>address),
          "hipPointerGetAttribute")
    return device


def address_range(ptr):
    """(base, size) of the allocation containing device address ``ptr``."""
    cdef hipDeviceptr_t base = NULL
    cdef size_t size = 0
    cdef uintptr_t address = as_pointer(ptr)
    ensure_loaded()
    check(pyar_rt.hipMemGetAddressRange(&base, &size, <hipDeviceptr_t>address),
          "hipMemGetAddressRange")
    return <uintptr_t>base, size
