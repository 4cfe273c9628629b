/* ROCm ABI facts pyar hard-codes, because it builds without a HIP SDK:
 * device-attribute numbers, the layouts of hipDeviceProp_t it reads, and the
 * flag values that changed between ROCm releases.  hip_loader.c uses them;
 * hip_declarations_check.c holds each against the SDK headers (names of the
 * form PYAR_<SDK name> are compared with the SDK's value of that name). */
#ifndef PYAR_HIP_ABI_H
#define PYAR_HIP_ABI_H

/* hipDeviceAttribute_t values; the same numbering holds from ROCm 5.2
 * through 7 for these entries. */
#define PYAR_hipDeviceAttributeMultiprocessorCount 63
#define PYAR_hipDeviceAttributeComputeCapabilityMajor 23
#define PYAR_hipDeviceAttributeComputeCapabilityMinor 61
#define PYAR_hipDeviceAttributeMaxThreadsPerBlock 56
#define PYAR_hipDeviceAttributeWarpSize 87
#define PYAR_hipDeviceAttributeL2CacheSize 19
#define PYAR_hipDeviceAttributeMaxSharedMemoryPerBlock 74

/* hipDeviceProp_t as hipGetDeviceProperties fills it before ROCm 6 (called
 * hipDeviceProp_tR0000 from ROCm 6 on), and as hipGetDevicePropertiesR0600
 * fills it from ROCm 6 on.  pyar reads only gcnArchName. */
#define PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET 396
#define PYAR_HIP_PROPS_R0000_SIZE 792
#define PYAR_HIP_PROPS_R0600_ARCH_NAME_OFFSET 1160
#define PYAR_HIP_PROPS_R0600_SIZE 1472

/* hipRuntimeGetVersion answers major*10^7 + minor*10^5 + patch. */
#define PYAR_HIP_VERSION_6_0 60000000
#define PYAR_HIP_VERSION_5_3 50300000

/* hipIpcOpenMemHandle's hipIpcMemLazyEnablePeerAccess: 0 before ROCm 6,
 * 1 from it on. */
#define PYAR_HIP5_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0
#define PYAR_HIP6_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1

/* hipExtMallocWithFlags flags.  hipDeviceMallocUncached arrived in ROCm 5.3;
 * before it, fine-grained memory is the coherent kind. */
#define PYAR_hipDeviceMallocFinegrained 1
#define PYAR_hipDeviceMallocUncached 3

#endif
