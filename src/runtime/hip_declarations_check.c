/* Holds pyar's own HIP declarations against a real HIP SDK.
 *
 * pyar builds with no SDK: it declares the HIP functions it calls
 * (pyar_hip_api.h), their constants (pyar_hip_constants.h), ROCm ABI facts
 * (hip_abi.h) and opaque types (pyar_hip_types.h) itself.  This file is never
 * part of the package; tests/test_hip_declarations.py compiles it with
 *
 *   gcc -std=c11 -D__HIP_PLATFORM_AMD__ -I<SDK include> -Isrc/runtime -Werror
 *
 * in two flavours:
 *
 * 1. Default: the SDK's <hip/hip_runtime_api.h> supplies every type (pyar's
 *    pyar_hip_types.h is NOT included), and static assertions require that
 *    - every X entry of PYAR_HIP_API has exactly the SDK prototype's type,
 *    - every PYAR_<name> constant equals the SDK's <name>,
 *    - the device-attribute numbers and hipDeviceProp_t layouts hip_loader.c
 *      uses are the SDK's.
 *    It also records the size and alignment of every type pyar declares
 *    opaquely, and defines main(), which compares them with (2).
 * 2. -DPYAR_CHECK_OWN_TYPES: only pyar_hip_types.h, recording the same sizes
 *    and alignments of pyar's own declarations.
 *
 * Linking (1) with (2) and running the program reports every type whose size
 * or alignment differs (exit status 1), or prints "ok" (exit status 0). */
#include <stddef.h>

/* The types pyar passes across the runtime boundary. */
#define PYAR_CHECKED_TYPES(X)                                                  \
  X(hipError_t)                                                                \
  X(hipDevice_t)                                                               \
  X(hipDeviceptr_t)                                                            \
  X(hipStream_t)                                                               \
  X(hipEvent_t)                                                                \
  X(hipModule_t)                                                               \
  X(hipFunction_t)                                                             \
  X(hipGraph_t)                                                                \
  X(hipGraphExec_t)                                                            \
  X(hipMemPool_t)                                                              \
  X(hipIpcMemHandle_t)                                                         \
  X(hipMemcpyKind)                                                             \
  X(hipDeviceAttribute_t)                                                      \
  X(hipPointer_attribute)                                                      \
  X(hipStreamCaptureMode)                                                      \
  X(hipStreamCaptureStatus)                                                    \
  X(hipMemPoolAttr)                                                            \
  X(hipFunction_attribute)

#define PYAR_TYPE_NAME(type) #type,
#define PYAR_TYPE_SIZE(type) sizeof(type),
#define PYAR_TYPE_ALIGN(type) _Alignof(type),

#ifdef PYAR_CHECK_OWN_TYPES
/* ---- (2) pyar's own declarations ------------------------------------- */
#include "pyar_hip_types.h"

const size_t pyar_own_type_sizes[] = {PYAR_CHECKED_TYPES(PYAR_TYPE_SIZE)};
const size_t pyar_own_type_aligns[] = {PYAR_CHECKED_TYPES(PYAR_TYPE_ALIGN)};

#else
/* ---- (1) the SDK's declarations -------------------------------------- */
#include <hip/hip_runtime_api.h>
#include <stdio.h>

#include "hip_abi.h"
#include "pyar_hip_api.h"
#include "pyar_hip_constants.h"

#ifdef PYAR_HIP_TYPES_H
#error "pyar_hip_types.h must not be seen here: the SDK's types are the reference"
#endif

/* Signatures: &name has type ret (*) params exactly (no conversions). */
#define PYAR_CHECK_SIGNATURE(ret, name, params)                                \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&name), ret(*) params), \
                 "pyar_hip_api.h: " #name " is not declared " #ret " " #name #params \
                 " in the HIP SDK");
PYAR_HIP_API(PYAR_CHECK_SIGNATURE)

/* hip_loader.c finds this one separately (its struct changed in ROCm 6). */
PYAR_CHECK_SIGNATURE(hipError_t, hipGetDeviceProperties, (hipDeviceProp_t *, int))

/* Constants: PYAR_<name> == <name>. */
#define PYAR_CHECK_VALUE(name, value)                                          \
  _Static_assert((long long)(value) == (long long)(name),                      \
                 "pyar's value of " #name " differs from the HIP SDK's");
#define PYAR_CHECK_CONSTANT(name) PYAR_CHECK_VALUE(name, PYAR_##name)

/* pyar_hip_constants.h */
PYAR_CHECK_CONSTANT(hipSuccess)
PYAR_CHECK_CONSTANT(hipErrorInvalidValue)
PYAR_CHECK_CONSTANT(hipErrorNoDevice)
PYAR_CHECK_CONSTANT(hipErrorNotReady)
PYAR_CHECK_CONSTANT(hipErrorNotSupported)
PYAR_CHECK_CONSTANT(hipErrorPeerAccessAlreadyEnabled)
PYAR_CHECK_CONSTANT(hipMemcpyHostToHost)
PYAR_CHECK_CONSTANT(hipMemcpyHostToDevice)
PYAR_CHECK_CONSTANT(hipMemcpyDeviceToHost)
PYAR_CHECK_CONSTANT(hipMemcpyDeviceToDevice)
PYAR_CHECK_CONSTANT(hipMemcpyDefault)
PYAR_CHECK_CONSTANT(hipStreamDefault)
PYAR_CHECK_CONSTANT(hipStreamNonBlocking)
PYAR_CHECK_CONSTANT(hipEventDefault)
PYAR_CHECK_CONSTANT(hipEventDisableTiming)
PYAR_CHECK_CONSTANT(hipHostMallocDefault)
PYAR_CHECK_CONSTANT(hipStreamCaptureModeGlobal)
PYAR_CHECK_CONSTANT(hipStreamCaptureModeThreadLocal)
PYAR_CHECK_CONSTANT(hipStreamCaptureModeRelaxed)
PYAR_CHECK_CONSTANT(hipStreamCaptureStatusNone)
PYAR_CHECK_CONSTANT(hipStreamCaptureStatusActive)
PYAR_CHECK_CONSTANT(hipStreamCaptureStatusInvalidated)
PYAR_CHECK_CONSTANT(HIP_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
PYAR_CHECK_CONSTANT(hipMemPoolAttrReleaseThreshold)
PYAR_CHECK_CONSTANT(HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
PYAR_CHECK_CONSTANT(HIP_FUNC_ATTRIBUTE_NUM_REGS)

/* hip_abi.h: device attributes */
PYAR_CHECK_CONSTANT(hipDeviceAttributeMultiprocessorCount)
PYAR_CHECK_CONSTANT(hipDeviceAttributeComputeCapabilityMajor)
PYAR_CHECK_CONSTANT(hipDeviceAttributeComputeCapabilityMinor)
PYAR_CHECK_CONSTANT(hipDeviceAttributeMaxThreadsPerBlock)
PYAR_CHECK_CONSTANT(hipDeviceAttributeWarpSize)
PYAR_CHECK_CONSTANT(hipDeviceAttributeL2CacheSize)
PYAR_CHECK_CONSTANT(hipDeviceAttributeMaxSharedMemoryPerBlock)

/* hip_abi.h: values that depend on the ROCm release, checked against the
 * release of these headers. */
PYAR_CHECK_CONSTANT(hipDeviceMallocFinegrained)
#if HIP_VERSION >= PYAR_HIP_VERSION_5_3
PYAR_CHECK_CONSTANT(hipDeviceMallocUncached)
#else
#ifdef hipDeviceMallocUncached
#error "HIP before 5.3 has hipDeviceMallocUncached: hip_loader.c assumes it does not"
#endif
#endif

#if HIP_VERSION >= PYAR_HIP_VERSION_6_0
PYAR_CHECK_VALUE(hipIpcMemLazyEnablePeerAccess, PYAR_HIP6_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
PYAR_CHECK_VALUE(offsetof(hipDeviceProp_tR0600, gcnArchName),
                 PYAR_HIP_PROPS_R0600_ARCH_NAME_OFFSET)
PYAR_CHECK_VALUE(sizeof(hipDeviceProp_tR0600), PYAR_HIP_PROPS_R0600_SIZE)
PYAR_CHECK_VALUE(offsetof(hipDeviceProp_tR0000, gcnArchName),
                 PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET)
PYAR_CHECK_VALUE(sizeof(hipDeviceProp_tR0000), PYAR_HIP_PROPS_R0000_SIZE)
#else
PYAR_CHECK_VALUE(hipIpcMemLazyEnablePeerAccess, PYAR_HIP5_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
PYAR_CHECK_VALUE(offsetof(hipDeviceProp_t, gcnArchName), PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET)
PYAR_CHECK_VALUE(sizeof(hipDeviceProp_t), PYAR_HIP_PROPS_R0000_SIZE)
#endif
/* hip_loader.c copies at most 255 characters of gcnArchName. */
_Static_assert(sizeof(((hipDeviceProp_t *)0)->gcnArchName) >= 256,
               "hipDeviceProp_t.gcnArchName is shorter than hip_loader.c assumes");

/* pyar copies IPC handles as 64 raw bytes (pyar/_hip/ipc.pxi). */
PYAR_CHECK_VALUE(sizeof(hipIpcMemHandle_t), 64)
PYAR_CHECK_VALUE(HIP_IPC_HANDLE_SIZE, 64)

/* Sizes for the comparison with pyar_hip_types.h, done at run time. */
extern const size_t pyar_own_type_sizes[];
extern const size_t pyar_own_type_aligns[];
static const char *const type_names[] = {PYAR_CHECKED_TYPES(PYAR_TYPE_NAME)};
static const size_t sdk_type_sizes[] = {PYAR_CHECKED_TYPES(PYAR_TYPE_SIZE)};
static const size_t sdk_type_aligns[] = {PYAR_CHECKED_TYPES(PYAR_TYPE_ALIGN)};

int main(void) {
  int failures = 0;
  for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; ++i) {
    if (sdk_type_sizes[i] != pyar_own_type_sizes[i] ||
        sdk_type_aligns[i] != pyar_own_type_aligns[i]) {
      printf("%s: HIP SDK size %zu align %zu, pyar_hip_types.h size %zu align %zu\n",
             type_names[i], sdk_type_sizes[i], sdk_type_aligns[i], pyar_own_type_sizes[i],
             pyar_own_type_aligns[i]);
      ++failures;
    }
  }
  if (failures) return 1;
  printf("ok: %zu types\n", sizeof type_names / sizeof type_names[0]);
  return 0;
}
#endif
