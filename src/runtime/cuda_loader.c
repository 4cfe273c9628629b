/* NVIDIA: each HIP-named table entry is a small adapter onto the CUDA
 * driver API's versioned entry points.  pyar works in each device's primary
 * context, the one the CUDA runtime (CuPy, PyTorch, JAX) uses, so memory and
 * streams are shared with them.  Statuses are CUresult values, which agree
 * with HIP's where pyar tests them (0, 1, 100, 600, 704). */
#include <pthread.h>
#include <string.h>

#include "loader_util.h"
#include "pyar_runtime.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

#define CUDA_MAX_DEVICES 64

static const char *const cuda_libraries[] = {"libcuda.so.1", "libcuda.so", NULL};

/* X(name, symbol, parameters): the driver entry points the adapters use. */
#define PYAR_CUDA_API(X)                                                                 \
  X(cuInit, "cuInit", (unsigned int))                                                    \
  X(cuDriverGetVersion, "cuDriverGetVersion", (int *))                                   \
  X(cuGetErrorName, "cuGetErrorName", (CUresult, const char **))                         \
  X(cuGetErrorString, "cuGetErrorString", (CUresult, const char **))                     \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int *))                                       \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice *, int))                                       \
  X(cuDeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                         \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute", (int *, int, CUdevice))                \
  X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", (char *, int, CUdevice))                 \
  X(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", (int *, CUdevice, CUdevice))         \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))       \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                     \
  X(cuCtxGetCurrent, "cuCtxGetCurrent", (CUcontext *))                                   \
  X(cuCtxGetDevice, "cuCtxGetDevice", (CUdevice *))                                      \
  X(cuCtxSynchronize, "cuCtxSynchronize", (void))                                        \
  X(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", (CUcontext, unsigned int))           \
  X(cuMemGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))                               \
  X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))                                \
  X(cuMemFree, "cuMemFree_v2", (CUdeviceptr))                                            \
  X(cuMemAllocAsync, "cuMemAllocAsync", (CUdeviceptr *, size_t, hipStream_t))            \
  X(cuMemFreeAsync, "cuMemFreeAsync", (CUdeviceptr, hipStream_t))                        \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", (hipMemPool_t *, CUdevice))  \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", (hipMemPool_t, int, void *))         \
  X(cuMemHostAlloc, "cuMemHostAlloc", (void **, size_t, unsigned int))                   \
  X(cuMemFreeHost, "cuMemFreeHost", (void *))                                            \
  X(cuMemsetD8, "cuMemsetD8_v2", (CUdeviceptr, unsigned char, size_t))                   \
  X(cuMemsetD8Async, "cuMemsetD8Async", (CUdeviceptr, unsigned char, size_t, hipStream_t)) \
  X(cuMemcpy, "cuMemcpy", (CUdeviceptr, CUdeviceptr, size_t))                            \
  X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr, const void *, size_t))                \
  X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void *, CUdeviceptr, size_t))                      \
  X(cuMemcpyDtoD, "cuMemcpyDtoD_v2", (CUdeviceptr, CUdeviceptr, size_t))                 \
  X(cuMemcpyAsync, "cuMemcpyAsync", (CUdeviceptr, CUdeviceptr, size_t, hipStream_t))     \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                           \
    (CUdeviceptr, const void *, size_t, hipStream_t))                                    \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", (void *, CUdeviceptr, size_t, hipStream_t)) \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                           \
    (CUdeviceptr, CUdeviceptr, size_t, hipStream_t))                                     \
  X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", (CUdeviceptr *, size_t *, CUdeviceptr)) \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", (void *, int, CUdeviceptr))          \
  X(cuStreamCreate, "cuStreamCreate", (hipStream_t *, unsigned int))                     \
  X(cuStreamDestroy, "cuStreamDestroy_v2", (hipStream_t))                                \
  X(cuStreamSynchronize, "cuStreamSynchronize", (hipStream_t))                           \
  X(cuStreamQuery, "cuStreamQuery", (hipStream_t))                                       \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", (hipStream_t, hipEvent_t, unsigned int))     \
  X(cuEventCreate, "cuEventCreate", (hipEvent_t *, unsigned int))                        \
  X(cuEventDestroy, "cuEventDestroy_v2", (hipEvent_t))                                   \
  X(cuEventRecord, "cuEventRecord", (hipEvent_t, hipStream_t))                           \
  X(cuEventSynchronize, "cuEventSynchronize", (hipEvent_t))                              \
  X(cuEventQuery, "cuEventQuery", (hipEvent_t))                                          \
  X(cuEventElapsedTime, "cuEventElapsedTime", (float *, hipEvent_t, hipEvent_t))         \
  X(cuModuleLoadData, "cuModuleLoadData", (hipModule_t *, const void *))                 \
  X(cuModuleLoad, "cuModuleLoad", (hipModule_t *, const char *))                         \
  X(cuModuleUnload, "cuModuleUnload", (hipModule_t))                                     \
  X(cuModuleGetFunction, "cuModuleGetFunction", (hipFunction_t *, hipModule_t, const char *)) \
  X(cuModuleGetGlobal, "cuModuleGetGlobal_v2",                                           \
    (CUdeviceptr *, size_t *, hipModule_t, const char *))                                \
  X(cuLaunchKernel, "cuLaunchKernel",                                                    \
    (hipFunction_t, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
     unsigned int, unsigned int, hipStream_t, void **, void **))                         \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor,                                         \
    "cuOccupancyMaxActiveBlocksPerMultiprocessor", (int *, hipFunction_t, int, size_t))  \
  X(cuFuncGetAttribute, "cuFuncGetAttribute", (int *, int, hipFunction_t))               \
  X(cuIpcGetMemHandle, "cuIpcGetMemHandle", (hipIpcMemHandle_t *, CUdeviceptr))          \
  X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2",                                         \
    (CUdeviceptr *, hipIpcMemHandle_t, unsigned int))                                    \
  X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", (CUdeviceptr))                           \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", (hipStream_t, int))                 \
  X(cuStreamEndCapture, "cuStreamEndCapture", (hipStream_t, hipGraph_t *))               \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", (hipStream_t, int *))                    \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags",                          \
    (hipGraphExec_t *, hipGraph_t, unsigned long long))                                  \
  X(cuGraphLaunch, "cuGraphLaunch", (hipGraphExec_t, hipStream_t))                       \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", (hipGraphExec_t))                          \
  X(cuGraphDestroy, "cuGraphDestroy", (hipGraph_t))

static struct {
#define PYAR_CUDA_ENTRY(name, symbol, params) CUresult(*name) params;
  PYAR_CUDA_API(PYAR_CUDA_ENTRY)
#undef PYAR_CUDA_ENTRY
} cu;

static CUresult init_status;
static CUcontext primary_context[CUDA_MAX_DEVICES];
static pthread_mutex_t primary_lock = PTHREAD_MUTEX_INITIALIZER;
/* The context this thread last made current through pyar. */
static __thread CUcontext thread_context;

static CUresult retain_primary(int ordinal, CUcontext *context) {
  if (ordinal < 0 || ordinal >= CUDA_MAX_DEVICES) return PYAR_hipErrorInvalidValue;
  CUresult status = PYAR_hipSuccess;
  pthread_mutex_lock(&primary_lock);
  if (!primary_context[ordinal]) {
    CUdevice device;
    status = cu.cuDeviceGet(&device, ordinal);
    if (status == PYAR_hipSuccess) status = cu.cuDevicePrimaryCtxRetain(&primary_context[ordinal], device);
  }
  *context = primary_context[ordinal];
  pthread_mutex_unlock(&primary_lock);
  return status;
}

static hipError_t cuda_set_device(int ordinal) {
  if (init_status != PYAR_hipSuccess) return init_status;
  CUcontext context;
  CUresult status = retain_primary(ordinal, &context);
  if (status == PYAR_hipSuccess) status = cu.cuCtxSetCurrent(context);
  if (status == PYAR_hipSuccess) thread_context = context;
  return status;
}

/* HIP has an implicit current device (0) per thread; CUDA needs a current
 * context.  A thread that already has one (set by pyar, or by CuPy/PyTorch
 * through the runtime) keeps it. */
static CUresult ensure_context(void) {
  if (thread_context) return PYAR_hipSuccess;
  if (init_status != PYAR_hipSuccess) return init_status;
  CUcontext current = NULL;
  CUresult status = cu.cuCtxGetCurrent(&current);
  if (status != PYAR_hipSuccess) return status;
  if (current) {
    thread_context = current;
    return PYAR_hipSuccess;
  }
  return cuda_set_device(0);
}

#define WITH_CONTEXT(call)                         \
  do {                                             \
    CUresult context_status = ensure_context();    \
    if (context_status != PYAR_hipSuccess) return context_status; \
    return call;                                   \
  } while (0)

static hipError_t cuda_get_last_error(void) { return PYAR_hipSuccess; }

static const char *cuda_error_name(hipError_t status) {
  const char *name = NULL;
  if (cu.cuGetErrorName(status, &name) != PYAR_hipSuccess || !name) return "CUDA_ERROR_UNKNOWN_CODE";
  return name;
}

static const char *cuda_error_string(hipError_t status) {
  const char *text = NULL;
  if (cu.cuGetErrorString(status, &text) != PYAR_hipSuccess || !text) return "unrecognized CUDA error code";
  return text;
}

static hipError_t cuda_driver_version(int *version) { return cu.cuDriverGetVersion(version); }

static hipError_t cuda_device_count(int *count) {
  *count = 0;
  if (init_status != PYAR_hipSuccess) return init_status;
  return cu.cuDeviceGetCount(count);
}

static hipError_t cuda_get_device(int *ordinal) {
  CUdevice device;
  CUresult status = ensure_context();
  if (status == PYAR_hipSuccess) status = cu.cuCtxGetDevice(&device);
  if (status == PYAR_hipSuccess) *ordinal = device;
  return status;
}

static hipError_t cuda_device_name(char *name, int len, hipDevice_t ordinal) {
  CUdevice device;
  CUresult status = init_status ? init_status : cu.cuDeviceGet(&device, ordinal);
  return status ? status : cu.cuDeviceGetName(name, len, device);
}

static hipError_t cuda_device_attribute(int *value, hipDeviceAttribute_t attribute, int ordinal) {
  CUdevice device;
  CUresult status = init_status ? init_status : cu.cuDeviceGet(&device, ordinal);
  return status ? status : cu.cuDeviceGetAttribute(value, attribute, device);
}

static hipError_t cuda_pci_bus_id(char *id, int len, int ordinal) {
  CUdevice device;
  CUresult status = init_status ? init_status : cu.cuDeviceGet(&device, ordinal);
  return status ? status : cu.cuDeviceGetPCIBusId(id, len, device);
}

static hipError_t cuda_can_access_peer(int *can, int ordinal, int peer_ordinal) {
  CUdevice device, peer;
  CUresult status = init_status ? init_status : cu.cuDeviceGet(&device, ordinal);
  if (status == PYAR_hipSuccess) status = cu.cuDeviceGet(&peer, peer_ordinal);
  return status ? status : cu.cuDeviceCanAccessPeer(can, device, peer);
}

static hipError_t cuda_enable_peer_access(int peer_ordinal, unsigned int flags) {
  CUcontext peer;
  CUresult status = ensure_context();
  if (status == PYAR_hipSuccess) status = retain_primary(peer_ordinal, &peer);
  return status ? status : cu.cuCtxEnablePeerAccess(peer, flags);
}

static hipError_t cuda_device_synchronize(void) { WITH_CONTEXT(cu.cuCtxSynchronize()); }
static hipError_t cuda_mem_get_info(size_t *free_bytes, size_t *total) {
  WITH_CONTEXT(cu.cuMemGetInfo(free_bytes, total));
}
static hipError_t cuda_malloc(void **ptr, size_t size) {
  WITH_CONTEXT(cu.cuMemAlloc((CUdeviceptr *)ptr, size));
}
/* NVIDIA device memory is coherent at system scope with the right fences; the
 * AMD-only flags of hipExtMallocWithFlags have nothing to select here. */
static hipError_t cuda_malloc_with_flags(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  return cuda_malloc(ptr, size);
}
static hipError_t cuda_free(void *ptr) { WITH_CONTEXT(cu.cuMemFree((CUdeviceptr)ptr)); }
static hipError_t cuda_malloc_async(void **ptr, size_t size, hipStream_t stream) {
  WITH_CONTEXT(cu.cuMemAllocAsync((CUdeviceptr *)ptr, size, stream));
}
static hipError_t cuda_free_async(void *ptr, hipStream_t stream) {
  WITH_CONTEXT(cu.cuMemFreeAsync((CUdeviceptr)ptr, stream));
}
static hipError_t cuda_default_mem_pool(hipMemPool_t *pool, int ordinal) {
  CUdevice device;
  CUresult status = init_status ? init_status : cu.cuDeviceGet(&device, ordinal);
  return status ? status : cu.cuDeviceGetDefaultMemPool(pool, device);
}
/* CUmemPool_attribute numbers its entries like hipMemPoolAttr. */
static hipError_t cuda_mem_pool_set_attribute(hipMemPool_t pool, hipMemPoolAttr attribute,
                                              void *value) {
  WITH_CONTEXT(cu.cuMemPoolSetAttribute(pool, attribute, value));
}
static hipError_t cuda_host_malloc(void **ptr, size_t size, unsigned int flags) {
  WITH_CONTEXT(cu.cuMemHostAlloc(ptr, size, flags));
}
static hipError_t cuda_host_free(void *ptr) { WITH_CONTEXT(cu.cuMemFreeHost(ptr)); }
static hipError_t cuda_memset(void *dst, int value, size_t size) {
  WITH_CONTEXT(cu.cuMemsetD8((CUdeviceptr)dst, (unsigned char)value, size));
}
static hipError_t cuda_memset_async(void *dst, int value, size_t size, hipStream_t stream) {
  WITH_CONTEXT(cu.cuMemsetD8Async((CUdeviceptr)dst, (unsigned char)value, size, stream));
}

static hipError_t cuda_memcpy(void *dst, const void *src, size_t size, hipMemcpyKind kind) {
  CUresult status = ensure_context();
  if (status != PYAR_hipSuccess) return status;
  switch (kind) {
    case PYAR_hipMemcpyHostToDevice: return cu.cuMemcpyHtoD((CUdeviceptr)dst, src, size);
    case PYAR_hipMemcpyDeviceToHost: return cu.cuMemcpyDtoH(dst, (CUdeviceptr)src, size);
    case PYAR_hipMemcpyDeviceToDevice: return cu.cuMemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, size);
    default: return cu.cuMemcpy((CUdeviceptr)dst, (CUdeviceptr)src, size);
  }
}

static hipError_t cuda_memcpy_async(void *dst, const void *src, size_t size, hipMemcpyKind kind,
                                    hipStream_t stream) {
  CUresult status = ensure_context();
  if (status != PYAR_hipSuccess) return status;
  switch (kind) {
    case PYAR_hipMemcpyHostToDevice: return cu.cuMemcpyHtoDAsync((CUdeviceptr)dst, src, size, stream);
    case PYAR_hipMemcpyDeviceToHost: return cu.cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, size, stream);
    case PYAR_hipMemcpyDeviceToDevice:
      return cu.cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, stream);
    default: return cu.cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, stream);
  }
}

static hipError_t cuda_address_range(hipDeviceptr_t *base, size_t *size, hipDeviceptr_t ptr) {
  WITH_CONTEXT(cu.cuMemGetAddressRange((CUdeviceptr *)base, size, (CUdeviceptr)ptr));
}
static hipError_t cuda_pointer_attribute(void *data, hipPointer_attribute attribute, hipDeviceptr_t ptr) {
  if (init_status != PYAR_hipSuccess) return init_status;
  return cu.cuPointerGetAttribute(data, attribute, (CUdeviceptr)ptr);
}
static hipError_t cuda_stream_create(hipStream_t *stream, unsigned int flags) {
  WITH_CONTEXT(cu.cuStreamCreate(stream, flags));
}
static hipError_t cuda_stream_destroy(hipStream_t stream) { WITH_CONTEXT(cu.cuStreamDestroy(stream)); }
static hipError_t cuda_stream_synchronize(hipStream_t stream) { WITH_CONTEXT(cu.cuStreamSynchronize(stream)); }
static hipError_t cuda_stream_query(hipStream_t stream) { WITH_CONTEXT(cu.cuStreamQuery(stream)); }
static hipError_t cuda_stream_wait_event(hipStream_t stream, hipEvent_t event, unsigned int flags) {
  WITH_CONTEXT(cu.cuStreamWaitEvent(stream, event, flags));
}
static hipError_t cuda_event_create(hipEvent_t *event, unsigned int flags) {
  WITH_CONTEXT(cu.cuEventCreate(event, flags));
}
static hipError_t cuda_event_destroy(hipEvent_t event) { WITH_CONTEXT(cu.cuEventDestroy(event)); }
static hipError_t cuda_event_record(hipEvent_t event, hipStream_t stream) {
  WITH_CONTEXT(cu.cuEventRecord(event, stream));
}
static hipError_t cuda_event_synchronize(hipEvent_t event) { WITH_CONTEXT(cu.cuEventSynchronize(event)); }
static hipError_t cuda_event_query(hipEvent_t event) { WITH_CONTEXT(cu.cuEventQuery(event)); }
static hipError_t cuda_event_elapsed(float *ms, hipEvent_t start, hipEvent_t stop) {
  WITH_CONTEXT(cu.cuEventElapsedTime(ms, start, stop));
}
static hipError_t cuda_module_load_data(hipModule_t *module, const void *image) {
  WITH_CONTEXT(cu.cuModuleLoadData(module, image));
}
static hipError_t cuda_module_load(hipModule_t *module, const char *path) {
  WITH_CONTEXT(cu.cuModuleLoad(module, path));
}
static hipError_t cuda_module_unload(hipModule_t module) { WITH_CONTEXT(cu.cuModuleUnload(module)); }
static hipError_t cuda_module_function(hipFunction_t *function, hipModule_t module, const char *name) {
  WITH_CONTEXT(cu.cuModuleGetFunction(function, module, name));
}
static hipError_t cuda_module_global(hipDeviceptr_t *ptr, size_t *size, hipModule_t module,
                                     const char *name) {
  WITH_CONTEXT(cu.cuModuleGetGlobal((CUdeviceptr *)ptr, size, module, name));
}
static hipError_t cuda_launch(hipFunction_t function, unsigned int gx, unsigned int gy, unsigned int gz,
                              unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                              hipStream_t stream, void **params, void **extra) {
  WITH_CONTEXT(cu.cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra));
}
static hipError_t cuda_occupancy(int *blocks, hipFunction_t function, int block_size, size_t shared) {
  WITH_CONTEXT(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks, function, block_size, shared));
}
static hipError_t cuda_function_attribute(int *value, hipFunction_attribute attribute,
                                          hipFunction_t function) {
  WITH_CONTEXT(cu.cuFuncGetAttribute(value, attribute, function));
}
static hipError_t cuda_ipc_get(hipIpcMemHandle_t *handle, void *ptr) {
  WITH_CONTEXT(cu.cuIpcGetMemHandle(handle, (CUdeviceptr)ptr));
}
static hipError_t cuda_ipc_open(void **ptr, hipIpcMemHandle_t handle, unsigned int flags) {
  WITH_CONTEXT(cu.cuIpcOpenMemHandle((CUdeviceptr *)ptr, handle, flags));
}
static hipError_t cuda_ipc_close(void *ptr) { WITH_CONTEXT(cu.cuIpcCloseMemHandle((CUdeviceptr)ptr)); }
static hipError_t cuda_begin_capture(hipStream_t stream, hipStreamCaptureMode mode) {
  WITH_CONTEXT(cu.cuStreamBeginCapture(stream, mode));
}
static hipError_t cuda_end_capture(hipStream_t stream, hipGraph_t *graph) {
  WITH_CONTEXT(cu.cuStreamEndCapture(stream, graph));
}
static hipError_t cuda_is_capturing(hipStream_t stream, hipStreamCaptureStatus *status) {
  WITH_CONTEXT(cu.cuStreamIsCapturing(stream, status));
}
static hipError_t cuda_graph_instantiate(hipGraphExec_t *exec, hipGraph_t graph, unsigned long long flags) {
  WITH_CONTEXT(cu.cuGraphInstantiateWithFlags(exec, graph, flags));
}
static hipError_t cuda_graph_launch(hipGraphExec_t exec, hipStream_t stream) {
  WITH_CONTEXT(cu.cuGraphLaunch(exec, stream));
}
static hipError_t cuda_graph_exec_destroy(hipGraphExec_t exec) { WITH_CONTEXT(cu.cuGraphExecDestroy(exec)); }
static hipError_t cuda_graph_destroy(hipGraph_t graph) { WITH_CONTEXT(cu.cuGraphDestroy(graph)); }

/* CU_DEVICE_ATTRIBUTE_* values, in the order of enum pyar_device_attribute. */
enum { CU_ATTR_CC_MAJOR = 75, CU_ATTR_CC_MINOR = 76 };
static const int cuda_attributes[PYAR_ATTR_COUNT] = {16, CU_ATTR_CC_MAJOR, CU_ATTR_CC_MINOR, 1, 10, 38, 8};

static hipError_t cuda_arch_name(char *name, int len, int ordinal) {
  int major = 0, minor = 0;
  CUresult status = cuda_device_attribute(&major, CU_ATTR_CC_MAJOR, ordinal);
  if (status == PYAR_hipSuccess) status = cuda_device_attribute(&minor, CU_ATTR_CC_MINOR, ordinal);
  if (status == PYAR_hipSuccess) snprintf(name, (size_t)len, "sm_%d%d", major, minor);
  return status;
}

int pyar_load_cuda(pyar_runtime *rt, char *error, size_t error_size) {
  void *lib = pyar_open_first("CUDA", "PYAR_CUDA_LIBRARY", cuda_libraries, rt->library,
                              sizeof rt->library, error, error_size);
  if (!lib) return -1;

#define PYAR_LOAD_CUDA(name, symbol, params)                                         \
  cu.name = (CUresult(*) params)dlsym(lib, symbol);                                  \
  if (!cu.name) {                                                                    \
    char message[600];                                                               \
    snprintf(message, sizeof message, "CUDA: %s lacks %s", rt->library, symbol);     \
    pyar_append_error(error, error_size, message);                                   \
    dlclose(lib);                                                                    \
    return -1;                                                                       \
  }
  PYAR_CUDA_API(PYAR_LOAD_CUDA)
#undef PYAR_LOAD_CUDA

  /* CUDA 13's cuda.h maps cuEventElapsedTime to _v2; older drivers lack it. */
  void *elapsed_v2 = dlsym(lib, "cuEventElapsedTime_v2");
  if (elapsed_v2) cu.cuEventElapsedTime = (CUresult(*)(float *, hipEvent_t, hipEvent_t))elapsed_v2;

  /* A machine with the driver but no usable GPU still loads; every call then
   * answers cuInit's status (CUDA_ERROR_NO_DEVICE, say). */
  init_status = cu.cuInit(0);
  if (cu.cuDriverGetVersion(&rt->runtime_version) != PYAR_hipSuccess) rt->runtime_version = 0;

  rt->hipGetLastError = cuda_get_last_error;
  rt->hipGetErrorName = cuda_error_name;
  rt->hipGetErrorString = cuda_error_string;
  rt->hipDriverGetVersion = cuda_driver_version;
  rt->hipRuntimeGetVersion = cuda_driver_version;
  rt->hipGetDeviceCount = cuda_device_count;
  rt->hipSetDevice = cuda_set_device;
  rt->hipGetDevice = cuda_get_device;
  rt->hipDeviceGetName = cuda_device_name;
  rt->hipDeviceGetAttribute = cuda_device_attribute;
  rt->hipDeviceGetPCIBusId = cuda_pci_bus_id;
  rt->hipDeviceCanAccessPeer = cuda_can_access_peer;
  rt->hipDeviceEnablePeerAccess = cuda_enable_peer_access;
  rt->hipDeviceSynchronize = cuda_device_synchronize;
  rt->hipMemGetInfo = cuda_mem_get_info;
  rt->hipMalloc = cuda_malloc;
  rt->hipExtMallocWithFlags = cuda_malloc_with_flags;
  rt->hipFree = cuda_free;
  rt->hipMallocAsync = cuda_malloc_async;
  rt->hipFreeAsync = cuda_free_async;
  rt->hipDeviceGetDefaultMemPool = cuda_default_mem_pool;
  rt->hipMemPoolSetAttribute = cuda_mem_pool_set_attribute;
  rt->hipHostMalloc = cuda_host_malloc;
  rt->hipHostFree = cuda_host_free;
  rt->hipMemset = cuda_memset;
  rt->hipMemsetAsync = cuda_memset_async;
  rt->hipMemcpy = cuda_memcpy;
  rt->hipMemcpyAsync = cuda_memcpy_async;
  rt->hipMemGetAddressRange = cuda_address_range;
  rt->hipPointerGetAttribute = cuda_pointer_attribute;
  rt->hipStreamCreateWithFlags = cuda_stream_create;
  rt->hipStreamDestroy = cuda_stream_destroy;
  rt->hipStreamSynchronize = cuda_stream_synchronize;
  rt->hipStreamQuery = cuda_stream_query;
  rt->hipStreamWaitEvent = cuda_stream_wait_event;
  rt->hipEventCreateWithFlags = cuda_event_create;
  rt->hipEventDestroy = cuda_event_destroy;
  rt->hipEventRecord = cuda_event_record;
  rt->hipEventSynchronize = cuda_event_synchronize;
  rt->hipEventQuery = cuda_event_query;
  rt->hipEventElapsedTime = cuda_event_elapsed;
  rt->hipModuleLoadData = cuda_module_load_data;
  rt->hipModuleLoad = cuda_module_load;
  rt->hipModuleUnload = cuda_module_unload;
  rt->hipModuleGetFunction = cuda_module_function;
  rt->hipModuleGetGlobal = cuda_module_global;
  rt->hipModuleLaunchKernel = cuda_launch;
  rt->hipModuleOccupancyMaxActiveBlocksPerMultiprocessor = cuda_occupancy;
  rt->hipFuncGetAttribute = cuda_function_attribute;
  rt->hipIpcGetMemHandle = cuda_ipc_get;
  rt->hipIpcOpenMemHandle = cuda_ipc_open;
  rt->hipIpcCloseMemHandle = cuda_ipc_close;
  rt->hipStreamBeginCapture = cuda_begin_capture;
  rt->hipStreamEndCapture = cuda_end_capture;
  rt->hipStreamIsCapturing = cuda_is_capturing;
  rt->hipGraphInstantiateWithFlags = cuda_graph_instantiate;
  rt->hipGraphLaunch = cuda_graph_launch;
  rt->hipGraphExecDestroy = cuda_graph_exec_destroy;
  rt->hipGraphDestroy = cuda_graph_destroy;
  rt->pyarDeviceGetArchName = cuda_arch_name;

  rt->ipc_open_flags = 1; /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */
  rt->signal_malloc_flags = 0;
  memcpy(rt->device_attribute, cuda_attributes, sizeof cuda_attributes);
  rt->platform = PYAR_PLATFORM_CUDA;
  return 0;
}
