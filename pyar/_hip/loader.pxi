# Loading the runtime once, under a lock, and turning statuses into HipError.
import operator
import os
import threading

from libc.stdint cimport uintptr_t, int32_t, uint32_t, int64_t, uint64_t
from libc.string cimport memcpy, memset as c_memset
from pyar._hip.runtime cimport *

from pyar._hip.errors import HipError, RuntimeNotFoundError

cdef bint _loaded = False
_load_lock = threading.Lock()


cdef int _load() except -1:
    global _loaded
    cdef char error[4096]
    with _load_lock:
        if _loaded:
            return 0
        request = os.environ.get("PYAR_PLATFORM", "").strip().lower().encode()
        if pyar_runtime_load(request, error, sizeof(error)) != 0:
            raise RuntimeNotFoundError(error.decode(errors="replace"))
        _loaded = True
    return 0


cdef inline int ensure_loaded() except -1:
    if not _loaded:
        _load()
    return 0


cdef int raise_error(hipError_t status, str call) except -1:
    # HIP keeps the last error per thread; clear it so that the next,
    # unrelated query does not report this failure again.
    pyar_rt.hipGetLastError()
    name = pyar_rt.hipGetErrorName(status).decode(errors="replace")
    message = pyar_rt.hipGetErrorString(status).decode(errors="replace")
    raise HipError(int(status), name, call, message)


cdef inline int check(hipError_t status, str call) except -1:
    if status != PYAR_hipSuccess:
        raise_error(status, call)
    return 0


def platform():
    """``"hip"`` or ``"cuda"``: the runtime pyar loaded (loading it if needed)."""
    ensure_loaded()
    return "hip" if pyar_rt.platform == PYAR_PLATFORM_HIP else "cuda"


def library_path():
    """The GPU library pyar opened, as dlopen was given it."""
    ensure_loaded()
    return pyar_rt.library.decode()


def driver_version():
    cdef int version = 0
    ensure_loaded()
    check(pyar_rt.hipDriverGetVersion(&version), "hipDriverGetVersion")
    return version


def runtime_version():
    """HIP: major*10**7 + minor*10**5 + patch.  CUDA: the driver's API version."""
    cdef int version = 0
    ensure_loaded()
    check(pyar_rt.hipRuntimeGetVersion(&version), "hipRuntimeGetVersion")
    return version
