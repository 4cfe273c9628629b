/* The HIP runtime functions pyar calls, with ROCm's exact signatures.
 * X(return type, name, parameter list) -- expanded into the dispatch table
 * (pyar_runtime.h), the ROCm loader's dlsym list (hip_loader.c) and the
 * declaration check against the SDK headers (hip_declarations_check.c). */
#ifndef PYAR_HIP_API_H
#define PYAR_HIP_API_H

#define PYAR_HIP_API(X)                                                        \
  X(hipError_t, hipGetLastError, (void))                                       \
  X(const char *, hipGetErrorName, (hipError_t))                               \
  X(const char *, hipGetErrorString, (hipError_t))                             \
  X(hipError_t, hipDriverGetVersion, (int *))                                  \
  X(hipError_t, hipRuntimeGetVersion, (int *))                                 \
  X(hipError_t, hipGetDeviceCount, (int *))                                    \
  X(hipError_t, hipSetDevice, (int))                                           \
  X(hipError_t, hipGetDevice, (int *))                                         \
  X(hipError_t, hipDeviceGetName, (char *, int, hipDevice_t))                  \
  X(hipError_t, hipDeviceGetAttribute, (int *, hipDeviceAttribute_t, int))    \
  X(hipError_t, hipDeviceGetPCIBusId, (char *, int, int))                      \
  X(hipError_t, hipDeviceCanAccessPeer, (int *, int, int))                     \
  X(hipError_t, hipDeviceEnablePeerAccess, (int, unsigned int))                \
  X(hipError_t, hipDeviceSynchronize, (void))                                  \
  X(hipError_t, hipMemGetInfo, (size_t *, size_t *))                           \
  X(hipError_t, hipMalloc, (void **, size_t))                                  \
  X(hipError_t, hipExtMallocWithFlags, (void **, size_t, unsigned int))        \
  X(hipError_t, hipFree, (void *))                                             \
  X(hipError_t, hipMallocAsync, (void **, size_t, hipStream_t))                \
  X(hipError_t, hipFreeAsync, (void *, hipStream_t))                           \
  X(hipError_t, hipDeviceGetDefaultMemPool, (hipMemPool_t *, int))             \
  X(hipError_t, hipMemPoolSetAttribute, (hipMemPool_t, hipMemPoolAttr, void *)) \
  X(hipError_t, hipHostMalloc, (void **, size_t, unsigned int))                \
  X(hipError_t, hipHostFree, (void *))                                         \
  X(hipError_t, hipMemset, (void *, int, size_t))                              \
  X(hipError_t, hipMemsetAsync, (void *, int, size_t, hipStream_t))            \
  X(hipError_t, hipMemcpy, (void *, const void *, size_t, hipMemcpyKind))      \
  X(hipError_t, hipMemcpyAsync,                                                \
    (void *, const void *, size_t, hipMemcpyKind, hipStream_t))                \
  X(hipError_t, hipMemGetAddressRange,                                         \
    (hipDeviceptr_t *, size_t *, hipDeviceptr_t))                              \
  X(hipError_t, hipPointerGetAttribute,                                        \
    (void *, hipPointer_attribute, hipDeviceptr_t))                            \
  X(hipError_t, hipStreamCreateWithFlags, (hipStream_t *, unsigned int))       \
  X(hipError_t, hipStreamDestroy, (hipStream_t))                               \
  X(hipError_t, hipStreamSynchronize, (hipStream_t))                           \
  X(hipError_t, hipStreamQuery, (hipStream_t))                                 \
  X(hipError_t, hipStreamWaitEvent, (hipStream_t, hipEvent_t, unsigned int))   \
  X(hipError_t, hipEventCreateWithFlags, (hipEvent_t *, unsigned int))         \
  X(hipError_t, hipEventDestroy, (hipEvent_t))                                 \
  X(hipError_t, hipEventRecord, (hipEvent_t, hipStream_t))                     \
  X(hipError_t, hipEventSynchronize, (hipEvent_t))                             \
  X(hipError_t, hipEventQuery, (hipEvent_t))                                   \
  X(hipError_t, hipEventElapsedTime, (float *, hipEvent_t, hipEvent_t))        \
  X(hipError_t, hipModuleLoadData, (hipModule_t *, const void *))              \
  X(hipError_t, hipModuleLoad, (hipModule_t *, const char *))                  \
  X(hipError_t, hipModuleUnload, (hipModule_t))                                \
  X(hipError_t, hipModuleGetFunction,                                          \
    (hipFunction_t *, hipModule_t, const char *))                              \
  X(hipError_t, hipModuleGetGlobal,                                            \
    (hipDeviceptr_t *, size_t *, hipModule_t, const char *))                   \
  X(hipError_t, hipModuleLaunchKernel,                                         \
    (hipFunction_t, unsigned int, unsigned int, unsigned int, unsigned int,    \
     unsigned int, unsigned int, unsigned int, hipStream_t, void **, void **)) \
  X(hipError_t, hipModuleOccupancyMaxActiveBlocksPerMultiprocessor,            \
    (int *, hipFunction_t, int, size_t))                                       \
  X(hipError_t, hipFuncGetAttribute, (int *, hipFunction_attribute, hipFunction_t)) \
  X(hipError_t, hipIpcGetMemHandle, (hipIpcMemHandle_t *, void *))             \
  X(hipError_t, hipIpcOpenMemHandle,                                           \
    (void **, hipIpcMemHandle_t, unsigned int))                                \
  X(hipError_t, hipIpcCloseMemHandle, (void *))                                \
  X(hipError_t, hipStreamBeginCapture, (hipStream_t, hipStreamCaptureMode))    \
  X(hipError_t, hipStreamEndCapture, (hipStream_t, hipGraph_t *))              \
  X(hipError_t, hipStreamIsCapturing, (hipStream_t, hipStreamCaptureStatus *)) \
  X(hipError_t, hipGraphInstantiateWithFlags,                                  \
    (hipGraphExec_t *, hipGraph_t, unsigned long long))                        \
  X(hipError_t, hipGraphLaunch, (hipGraphExec_t, hipStream_t))                 \
  X(hipError_t, hipGraphExecDestroy, (hipGraphExec_t))                         \
  X(hipError_t, hipGraphDestroy, (hipGraph_t))

#endif
