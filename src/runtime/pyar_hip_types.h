/* pyar's own declarations of the HIP types it passes across the runtime
 * boundary.  They have the ABI of ROCm's and of the CUDA driver API's
 * (opaque pointers, 32-bit enums, a 64-byte IPC handle), so pyar builds with
 * no SDK installed.  tests/test_hip_declarations.py compiles
 * hip_declarations_check.c against real HIP headers to keep them honest. */
#ifndef PYAR_HIP_TYPES_H
#define PYAR_HIP_TYPES_H

#include <stddef.h>

typedef int hipError_t;
typedef int hipDevice_t;
typedef void *hipDeviceptr_t;
typedef struct pyar_opaque_stream *hipStream_t;
typedef struct pyar_opaque_event *hipEvent_t;
typedef struct pyar_opaque_module *hipModule_t;
typedef struct pyar_opaque_function *hipFunction_t;
typedef struct pyar_opaque_graph *hipGraph_t;
typedef struct pyar_opaque_graph_exec *hipGraphExec_t;
typedef struct pyar_opaque_mem_pool *hipMemPool_t;
typedef struct { char reserved[64]; } hipIpcMemHandle_t;

/* C enums in the SDK; 32-bit integers at the ABI level. */
typedef int hipMemcpyKind;
typedef int hipDeviceAttribute_t;
typedef int hipPointer_attribute;
typedef int hipStreamCaptureMode;
typedef int hipStreamCaptureStatus;
typedef int hipMemPoolAttr;
typedef int hipFunction_attribute;

#endif
