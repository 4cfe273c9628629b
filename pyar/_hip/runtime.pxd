# Cython view of src/runtime/pyar_runtime.h: the dispatch table pyar's
# binding calls, under HIP's names on every platform.
from libc.stddef cimport size_t

cdef extern from "pyar_runtime.h" nogil:
    ctypedef int hipError_t
    ctypedef void* hipDeviceptr_t
    ctypedef struct pyar_opaque_stream
    ctypedef struct pyar_opaque_event
    ctypedef struct pyar_opaque_module
    ctypedef struct pyar_opaque_function
    ctypedef struct pyar_opaque_graph
    ctypedef struct pyar_opaque_graph_exec
    ctypedef struct pyar_opaque_mem_pool
    ctypedef pyar_opaque_stream* hipStream_t
    ctypedef pyar_opaque_event* hipEvent_t
    ctypedef pyar_opaque_module* hipModule_t
    ctypedef pyar_opaque_function* hipFunction_t
    ctypedef pyar_opaque_graph* hipGraph_t
    ctypedef pyar_opaque_graph_exec* hipGraphExec_t
    ctypedef pyar_opaque_mem_pool* hipMemPool_t
    ctypedef struct hipIpcMemHandle_t:
        char reserved[64]

    enum:
        PYAR_hipSuccess
        PYAR_hipErrorNotReady
        PYAR_hipErrorNotSupported
        PYAR_hipErrorPeerAccessAlreadyEnabled
        PYAR_hipMemcpyHostToDevice
        PYAR_hipMemcpyDeviceToHost
        PYAR_hipMemcpyDeviceToDevice
        PYAR_hipStreamNonBlocking
        PYAR_hipEventDefault
        PYAR_hipEventDisableTiming
        PYAR_hipHostMallocDefault
        PYAR_hipStreamCaptureModeGlobal
        PYAR_hipStreamCaptureModeThreadLocal
        PYAR_hipStreamCaptureModeRelaxed
        PYAR_hipStreamCaptureStatusNone
        PYAR_hipStreamCaptureStatusActive
        PYAR_hipStreamCaptureStatusInvalidated
        PYAR_HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        PYAR_hipMemPoolAttrReleaseThreshold
        PYAR_HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
        PYAR_HIP_FUNC_ATTRIBUTE_NUM_REGS

    enum:
        PYAR_PLATFORM_NONE
        PYAR_PLATFORM_HIP
        PYAR_PLATFORM_CUDA

    enum:
        PYAR_ATTR_MULTIPROCESSOR_COUNT
        PYAR_ATTR_COMPUTE_CAPABILITY_MAJOR
        PYAR_ATTR_COMPUTE_CAPABILITY_MINOR
        PYAR_ATTR_MAX_THREADS_PER_BLOCK
        PYAR_ATTR_WARP_SIZE
        PYAR_ATTR_L2_CACHE_SIZE
        PYAR_ATTR_MAX_SHARED_MEMORY_PER_BLOCK
        PYAR_ATTR_COUNT

    ctypedef struct pyar_runtime:
        hipError_t (*hipGetLastError)() noexcept nogil
        const char* (*hipGetErrorName)(hipError_t) noexcept nogil
        const char* (*hipGetErrorString)(hipError_t) noexcept nogil
        hipError_t (*hipDriverGetVersion)(int*) noexcept nogil
        hipError_t (*hipRuntimeGetVersion)(int*) noexcept nogil
        hipError_t (*hipGetDeviceCount)(int*) noexcept nogil
        hipError_t (*hipSetDevice)(int) noexcept nogil
        hipError_t (*hipGetDevice)(int*) noexcept nogil
        hipError_t (*hipDeviceGetName)(char*, int, int) noexcept nogil
        hipError_t (*hipDeviceGetAttribute)(int*, int, int) noexcept nogil
        hipError_t (*hipDeviceGetPCIBusId)(char*, int, int) noexcept nogil
        hipError_t (*hipDeviceCanAccessPeer)(int*, int, int) noexcept nogil
        hipError_t (*hipDeviceEnablePeerAccess)(int, unsigned int) noexcept nogil
        hipError_t (*hipDeviceSynchronize)() noexcept nogil
        hipError_t (*hipMemGetInfo)(size_t*, size_t*) noexcept nogil
        hipError_t (*hipMalloc)(void**, size_t) noexcept nogil
        hipError_t (*hipExtMallocWithFlags)(void**, size_t, unsigned int) noexcept nogil
        hipError_t (*hipFree)(void*) noexcept nogil
        hipError_t (*hipMallocAsync)(void**, size_t, hipStream_t) noexcept nogil
        hipError_t (*hipFreeAsync)(void*, hipStream_t) noexcept nogil
        hipError_t (*hipDeviceGetDefaultMemPool)(hipMemPool_t*, int) noexcept nogil
        hipError_t (*hipMemPoolSetAttribute)(hipMemPool_t, int, void*) noexcept nogil
        hipError_t (*hipHostMalloc)(void**, size_t, unsigned int) noexcept nogil
        hipError_t (*hipHostFree)(void*) noexcept nogil
        hipError_t (*hipMemset)(void*, int, size_t) noexcept nogil
        hipError_t (*hipMemsetAsync)(void*, int, size_t, hipStream_t) noexcept nogil
        hipError_t (*hipMemcpy)(void*, const void*, size_t, int) noexcept nogil
        hipError_t (*hipMemcpyAsync)(void*, const void*, size_t, int, hipStream_t) noexcept nogil
        hipError_t (*hipMemGetAddressRange)(hipDeviceptr_t*, size_t*, hipDeviceptr_t) noexcept nogil
        hipError_t (*hipPointerGetAttribute)(void*, int, hipDeviceptr_t) noexcept nogil
        hipError_t (*hipStreamCreateWithFlags)(hipStream_t*, unsigned int) noexcept nogil
        hipError_t (*hipStreamDestroy)(hipStream_t) noexcept nogil
        hipError_t (*hipStreamSynchronize)(hipStream_t) noexcept nogil
        hipError_t (*hipStreamQuery)(hipStream_t) noexcept nogil
        hipError_t (*hipStreamWaitEvent)(hipStream_t, hipEvent_t, unsigned int) noexcept nogil
        hipError_t (*hipEventCreateWithFlags)(hipEvent_t*, unsigned int) noexcept nogil
        hipError_t (*hipEventDestroy)(hipEvent_t) noexcept nogil
        hipError_t (*hipEventRecord)(hipEvent_t, hipStream_t) noexcept nogil
        hipError_t (*hipEventSynchronize)(hipEvent_t) noexcept nogil
        hipError_t (*hipEventQuery)(hipEvent_t) noexcept nogil
        hipError_t (*hipEventElapsedTime)(float*, hipEvent_t, hipEvent_t) noexcept nogil
        hipError_t (*hipModuleLoadData)(hipModule_t*, const void*) noexcept nogil
        hipError_t (*hipModuleLoad)(hipModule_t*, const char*) noexcept nogil
        hipError_t (*hipModuleUnload)(hipModule_t) noexcept nogil
        hipError_t (*hipModuleGetFunction)(hipFunction_t*, hipModule_t, const char*) noexcept nogil
        hipError_t (*hipModuleGetGlobal)(hipDeviceptr_t*, size_t*, hipModule_t, const char*) noexcept nogil
        hipError_t (*hipModuleLaunchKernel)(hipFunction_t, unsigned int, unsigned int,
                                            unsigned int, unsigned int, unsigned int,
                                            unsigned int, unsigned int, hipStream_t,
                                            void**, void**) noexcept nogil
        hipError_t (*hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)(
            int*, hipFunction_t, int, size_t) noexcept nogil
        hipError_t (*hipFuncGetAttribute)(int*, int, hipFunction_t) noexcept nogil
        hipError_t (*hipIpcGetMemHandle)(hipIpcMemHandle_t*, void*) noexcept nogil
        hipError_t (*hipIpcOpenMemHandle)(void**, hipIpcMemHandle_t, unsigned int) noexcept nogil
        hipError_t (*hipIpcCloseMemHandle)(void*) noexcept nogil
        hipError_t (*hipStreamBeginCapture)(hipStream_t, int) noexcept nogil
        hipError_t (*hipStreamEndCapture)(hipStream_t, hipGraph_t*) noexcept nogil
        hipError_t (*hipStreamIsCapturing)(hipStream_t, int*) noexcept nogil
        hipError_t (*hipGraphInstantiateWithFlags)(hipGraphExec_t*, hipGraph_t,
                                                   unsigned long long) noexcept nogil
        hipError_t (*hipGraphLaunch)(hipGraphExec_t, hipStream_t) noexcept nogil
        hipError_t (*hipGraphExecDestroy)(hipGraphExec_t) noexcept nogil
        hipError_t (*hipGraphDestroy)(hipGraph_t) noexcept nogil
        hipError_t (*pyarDeviceGetArchName)(char*, int, int) noexcept nogil
        int platform
        int runtime_version
        unsigned int ipc_open_flags
        unsigned int signal_malloc_flags
        int device_attribute[PYAR_ATTR_COUNT]
        char library[512]

    pyar_runtime pyar_rt
    int pyar_runtime_load(const char* platform, char* error, size_t error_size)
