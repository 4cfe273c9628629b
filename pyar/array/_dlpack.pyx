# cython: language_level=3
"""DLPack capsules, both ways: ``export`` wraps a device pointer in a
``dltensor`` / ``dltensor_versioned`` capsule that keeps a Python object
alive until the consumer calls the deleter, and ``consume`` takes ownership
of a producer's capsule.  Only the C ABI lives here; what the fields mean for
pyar (dtypes, contiguity, streams) is decided by the Python modules.

The structs are declared here rather than taken from dlpack.h so that the
build needs no DLPack headers; their layout is the stable ABI of DLPack 1.x.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport malloc, free
from cpython.ref cimport PyObject, Py_INCREF
from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.pycapsule cimport (
    PyCapsule_CheckExact, PyCapsule_New, PyCapsule_IsValid, PyCapsule_GetPointer,
    PyCapsule_SetName, PyCapsule_GetName,
)

cdef extern from "Python.h":
    ctypedef int PyGILState_STATE
    PyGILState_STATE PyGILState_Ensure() nogil
    void PyGILState_Release(PyGILState_STATE) nogil
    int Py_IsInitialized() nogil
    void Py_DecRef(PyObject*) nogil


ctypedef struct DLPackVersion:
    uint32_t major
    uint32_t minor

ctypedef struct DLDevice:
    int32_t device_type  # a C enum: int-sized on every ABI DLPack supports
    int32_t device_id

ctypedef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

ctypedef struct DLTensor:
    void* data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t* shape
    int64_t* strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void* manager_ctx
    void (*deleter)(DLManagedTensor*) noexcept nogil

cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void* manager_ctx
    void (*deleter)(DLManagedTensorVersioned*) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor


# The version pyar writes into versioned capsules and passes as max_version:
# 1.1 is the first to name the float8 type codes.
DLPACK_VERSION = (1, 1)

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3
kDLROCM = 10
kDLROCMHost = 11
kDLCUDAManaged = 13

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1

# Capsule names must outlive the capsules, so they are C string literals.
cdef const char* NAME = b"dltensor"
cdef const char* USED_NAME = b"used_dltensor"
cdef const char* VERSIONED_NAME = b"dltensor_versioned"
cdef const char* USED_VERSIONED_NAME = b"used_dltensor_versioned"


# --- export -----------------------------------------------------------------------

cdef void release_holder(void* holder) noexcept nogil:
    # A deleter may run on any thread, with or without the GIL.  After the
    # interpreter is gone the holder cannot be released; leaking it is the
    # only safe choice.
    cdef PyGILState_STATE state
    if holder == NULL or not Py_IsInitialized():
        return
    state = PyGILState_Ensure()
    Py_DecRef(<PyObject*>holder)
    PyGILState_Release(state)


cdef void delete_managed(DLManagedTensor* self) noexcept nogil:
    release_holder(self.manager_ctx)
    free(self)


cdef void delete_versioned(DLManagedTensorVersioned* self) noexcept nogil:
    release_holder(self.manager_ctx)
    free(self)


cdef void destroy_capsule(object capsule) noexcept:
    # A consumer that took the tensor renamed the capsule and now owns the
    # deleter call; only an unconsumed capsule still holds the tensor.
    cdef PyObject* exc_type
    cdef PyObject* exc_value
    cdef PyObject* exc_tb
    cdef DLManagedTensor* managed
    if not PyCapsule_IsValid(capsule, NAME):
        return
    # Releasing the holder may run arbitrary finalizers; they must not see
    # (or clobber) an exception that is propagating while the capsule dies.
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb)
    managed = <DLManagedTensor*>PyCapsule_GetPointer(capsule, NAME)
    if managed.deleter != NULL:
        managed.deleter(managed)
    PyErr_Restore(exc_type, exc_value, exc_tb)


cdef void destroy_versioned_capsule(object capsule) noexcept:
    cdef PyObject* exc_type
    cdef PyObject* exc_value
    cdef PyObject* exc_tb
    cdef DLManagedTensorVersioned* managed
    if not PyCapsule_IsValid(capsule, VERSIONED_NAME):
        return
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb)
    managed = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, VERSIONED_NAME)
    if managed.deleter != NULL:
        managed.deleter(managed)
    PyErr_Restore(exc_type, exc_value, exc_tb)


cdef int fill_tensor(DLTensor* tensor, int64_t* dims, uintptr_t data, tuple shape,
                     int code, int bits, int device_type, int device_id) except -1:
    cdef int ndim = len(shape)
    cdef int64_t stride = 1
    cdef int64_t size = 1
    cdef int i
    for i in range(ndim - 1, -1, -1):
        dims[i] = shape[i]
        # DLPack >= 1.2 forbids NULL strides for ndim > 0, and older
        # consumers accept explicit compact strides too.
        dims[ndim + i] = stride
        stride *= dims[i]
        size *= dims[i]
    # The spec asks for a NULL data pointer on empty tensors.
    tensor.data = NULL if size == 0 else <void*>data
    tensor.device.device_type = device_type
    tensor.device.device_id = device_id
    tensor.ndim = ndim
    tensor.dtype.code = code
    tensor.dtype.bits = bits
    tensor.dtype.lanes = 1
    tensor.shape = dims
    tensor.strides = dims + ndim
    tensor.byte_offset = 0
    return 0


def export(holder, uintptr_t data, tuple shape, int code, int bits, int device_type,
           int device_id, *, bint versioned, bint readonly=False, bint copied=False):
    """A DLPack capsule viewing ``shape`` C-contiguous elements at ``data``.

    ``holder`` is kept alive until the consumer calls the deleter (or the
    capsule is collected unconsumed).  ``versioned`` selects a
    ``dltensor_versioned`` capsule (DLPack >= 1.0), which alone can say
    ``readonly`` and ``copied``.
    """
    cdef int ndim = len(shape)
    cdef DLManagedTensor* managed
    cdef DLManagedTensorVersioned* versioned_managed
    # One allocation holds the struct, then shape[ndim], then strides[ndim].
    cdef size_t dims_bytes = 2 * ndim * sizeof(int64_t)
    if versioned:
        versioned_managed = <DLManagedTensorVersioned*>malloc(
            sizeof(DLManagedTensorVersioned) + dims_bytes)
        if versioned_managed == NULL:
            raise MemoryError("cannot allocate a DLPack tensor")
        try:
            fill_tensor(&versioned_managed.dl_tensor, <int64_t*>(versioned_managed + 1), data,
                        shape, code, bits, device_type, device_id)
        except BaseException:
            free(versioned_managed)
            raise
        versioned_managed.version.major = DLPACK_VERSION[0]
        versioned_managed.version.minor = DLPACK_VERSION[1]
        versioned_managed.flags = ((FLAG_READ_ONLY if readonly else 0)
                                   | (FLAG_IS_COPIED if copied else 0))
        versioned_managed.manager_ctx = <void*>holder
        versioned_managed.deleter = delete_versioned
        Py_INCREF(holder)
        try:
            return PyCapsule_New(versioned_managed, VERSIONED_NAME, destroy_versioned_capsule)
        except BaseException:
            delete_versioned(versioned_managed)
            raise
    managed = <DLManagedTensor*>malloc(sizeof(DLManagedTensor) + dims_bytes)
    if managed == NULL:
        raise MemoryError("cannot allocate a DLPack tensor")
    try:
        fill_tensor(&managed.dl_tensor, <int64_t*>(managed + 1), data, shape, code, bits,
                    device_type, device_id)
    except BaseException:
        free(managed)
        raise
    managed.manager_ctx = <void*>holder
    managed.deleter = delete_managed
    Py_INCREF(holder)
    try:
        return PyCapsule_New(managed, NAME, destroy_capsule)
    except BaseException:
        delete_managed(managed)
        raise


# --- import -----------------------------------------------------------------------

cdef class ImportedTensor:
    """A producer's tensor that pyar consumed: the fields of its DLTensor,
    read once, and the duty to call the producer's deleter, which happens
    exactly once, when this object is collected.  Arrays viewing the tensor
    keep this object alive."""
    cdef void* _managed
    cdef bint _versioned
    cdef readonly uintptr_t ptr
    cdef readonly tuple shape
    cdef readonly object strides
    cdef readonly int code
    cdef readonly int bits
    cdef readonly int lanes
    cdef readonly int device_type
    cdef readonly int device_id
    cdef readonly bint is_readonly
    cdef readonly tuple version

    def __init__(self):
        raise TypeError("ImportedTensor objects come from pyar.array._dlpack.consume()")

    def __dealloc__(self):
        cdef DLManagedTensor* managed
        cdef DLManagedTensorVersioned* versioned
        if self._managed == NULL:
            return
        if self._versioned:
            versioned = <DLManagedTensorVersioned*>self._managed
            if versioned.deleter != NULL:
                versioned.deleter(versioned)
        else:
            managed = <DLManagedTensor*>self._managed
            if managed.deleter != NULL:
                managed.deleter(managed)
        self._managed = NULL

    def __repr__(self):
        return (f"<pyar DLPack tensor shape={self.shape} dtype=({self.code}, {self.bits}, "
                f"{self.lanes}) device=({self.device_type}, {self.device_id})>")


cdef ImportedTensor read_tensor(ImportedTensor owner, DLTensor* tensor):
    cdef int i
    if tensor.ndim < 0:
        raise BufferError(f"DLPack tensor has a negative ndim ({tensor.ndim})")
    if tensor.ndim and tensor.shape == NULL:
        raise BufferError("DLPack tensor has ndim > 0 but no shape")
    owner.shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    if tensor.strides == NULL:
        owner.strides = None
    else:
        owner.strides = tuple(tensor.strides[i] for i in range(tensor.ndim))
    owner.ptr = <uintptr_t>tensor.data + <uintptr_t>tensor.byte_offset
    owner.code = tensor.dtype.code
    owner.bits = tensor.dtype.bits
    owner.lanes = tensor.dtype.lanes
    owner.device_type = tensor.device.device_type
    owner.device_id = tensor.device.device_id
    return owner


def consume(capsule):
    """Take ownership of the tensor in a DLPack capsule and return an
    ImportedTensor.  The capsule is renamed ``used_dltensor[_versioned]``,
    as the protocol requires, so that its destructor leaves the tensor to us.
    A versioned tensor of an unknown major version is released at once and
    raises BufferError."""
    cdef ImportedTensor owner
    cdef DLManagedTensorVersioned* versioned
    cdef DLManagedTensor* managed
    if PyCapsule_IsValid(capsule, VERSIONED_NAME):
        versioned = <DLManagedTensorVersioned*>PyCapsule_GetPointer(capsule, VERSIONED_NAME)
        PyCapsule_SetName(capsule, USED_VERSIONED_NAME)
        owner = ImportedTensor.__new__(ImportedTensor)
        owner._managed = versioned
        owner._versioned = True
        owner.version = (versioned.version.major, versioned.version.minor)
        if versioned.version.major != DLPACK_VERSION[0]:
            # Only version and deleter keep their place across major
            # versions; dropping ``owner`` calls the deleter.
            raise BufferError(f"DLPack tensor has version {owner.version}; pyar reads "
                              f"major version {DLPACK_VERSION[0]}")
        owner.is_readonly = (versioned.flags & FLAG_READ_ONLY) != 0
        return read_tensor(owner, &versioned.dl_tensor)
    if PyCapsule_IsValid(capsule, NAME):
        managed = <DLManagedTensor*>PyCapsule_GetPointer(capsule, NAME)
        PyCapsule_SetName(capsule, USED_NAME)
        owner = ImportedTensor.__new__(ImportedTensor)
        owner._managed = managed
        owner._versioned = False
        owner.version = None
        owner.is_readonly = False
        return read_tensor(owner, &managed.dl_tensor)
    if not PyCapsule_CheckExact(capsule):
        raise TypeError(f"expected a DLPack capsule, got {type(capsule).__name__}")
    name = PyCapsule_GetName(capsule)
    if name != NULL and (<bytes>name).startswith(b"used_"):
        raise BufferError("this DLPack capsule was already consumed; ask the producer's "
                          "__dlpack__ for a new one")
    raise TypeError(f"expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', "
                    f"got one named {(<bytes>name).decode() if name != NULL else None!r}")
