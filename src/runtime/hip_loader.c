/* ROCm: every table entry is libamdhip64's own function, found by name.
 * What differs between ROCm releases (device-attribute numbering, the
 * device-properties struct, some flag values) is chosen here from
 * hipRuntimeGetVersion, which answers major*10^7 + minor*10^5 + patch. */
#include <string.h>

#include "hip_abi.h"
#include "loader_util.h"
#include "pyar_runtime.h"

static const char *const hip_libraries[] = {
    "libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", NULL};

/* hipDeviceProp_t changed layout in ROCm 6 (hipGetDevicePropertiesR0600);
 * pyar reads only gcnArchName, at its offset in each layout. */
typedef hipError_t (*get_device_properties_fn)(void *, int);
static get_device_properties_fn get_device_properties;
static size_t arch_name_offset;
static size_t properties_size;

static hipError_t hip_device_arch_name(char *name, int len, int device) {
  char properties[4096];
  if (len <= 0 || properties_size > sizeof properties) return PYAR_hipErrorInvalidValue;
  memset(properties, 0, sizeof properties);
  hipError_t status = get_device_properties(properties, device);
  if (status != PYAR_hipSuccess) return status;
  /* gcnArchName is "gfx942:sramecc+:xnack-"; the compilers' name is before ':'. */
  const char *arch = properties + arch_name_offset;
  int n = 0;
  while (n < len - 1 && n < 255 && arch[n] && arch[n] != ':') {
    name[n] = arch[n];
    ++n;
  }
  name[n] = '\0';
  return PYAR_hipSuccess;
}

/* hipDeviceAttribute_t values for enum pyar_device_attribute (hip_abi.h). */
static const int hip_attributes[PYAR_ATTR_COUNT] = {
    [PYAR_ATTR_MULTIPROCESSOR_COUNT] = PYAR_hipDeviceAttributeMultiprocessorCount,
    [PYAR_ATTR_COMPUTE_CAPABILITY_MAJOR] = PYAR_hipDeviceAttributeComputeCapabilityMajor,
    [PYAR_ATTR_COMPUTE_CAPABILITY_MINOR] = PYAR_hipDeviceAttributeComputeCapabilityMinor,
    [PYAR_ATTR_MAX_THREADS_PER_BLOCK] = PYAR_hipDeviceAttributeMaxThreadsPerBlock,
    [PYAR_ATTR_WARP_SIZE] = PYAR_hipDeviceAttributeWarpSize,
    [PYAR_ATTR_L2_CACHE_SIZE] = PYAR_hipDeviceAttributeL2CacheSize,
    [PYAR_ATTR_MAX_SHARED_MEMORY_PER_BLOCK] = PYAR_hipDeviceAttributeMaxSharedMemoryPerBlock,
};

int pyar_load_hip(pyar_runtime *rt, char *error, size_t error_size) {
  void *lib = pyar_open_first("ROCm", "PYAR_HIP_LIBRARY", hip_libraries, rt->library,
                              sizeof rt->library, error, error_size);
  if (!lib) return -1;

#define PYAR_LOAD_SYMBOL(ret, name, params)                                          \
  rt->name = (ret(*) params)dlsym(lib, #name);                                       \
  if (!rt->name) {                                                                   \
    char message[600];                                                               \
    snprintf(message, sizeof message, "ROCm: %s lacks %s", rt->library, #name);      \
    pyar_append_error(error, error_size, message);                                   \
    dlclose(lib);                                                                    \
    return -1;                                                                       \
  }
  PYAR_HIP_API(PYAR_LOAD_SYMBOL)
#undef PYAR_LOAD_SYMBOL

  if (rt->hipRuntimeGetVersion(&rt->runtime_version) != PYAR_hipSuccess) rt->runtime_version = 0;
  int rocm6 = rt->runtime_version >= PYAR_HIP_VERSION_6_0;

  get_device_properties = (get_device_properties_fn)dlsym(lib, "hipGetDevicePropertiesR0600");
  if (rocm6 && get_device_properties) {
    arch_name_offset = PYAR_HIP_PROPS_R0600_ARCH_NAME_OFFSET;
    properties_size = PYAR_HIP_PROPS_R0600_SIZE;
  } else {
    get_device_properties = (get_device_properties_fn)dlsym(lib, "hipGetDeviceProperties");
    arch_name_offset = PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET;
    properties_size = PYAR_HIP_PROPS_R0000_SIZE;
  }
  if (!get_device_properties) {
    char message[600];
    snprintf(message, sizeof message, "ROCm: %s lacks hipGetDeviceProperties", rt->library);
    pyar_append_error(error, error_size, message);
    dlclose(lib);
    return -1;
  }
  rt->pyarDeviceGetArchName = hip_device_arch_name;

  /* hipIpcMemLazyEnablePeerAccess is 0 before ROCm 6 and 1 from it on. */
  rt->ipc_open_flags = rocm6 ? PYAR_HIP6_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
                             : PYAR_HIP5_IPC_MEM_LAZY_ENABLE_PEER_ACCESS;
  /* hipDeviceMallocUncached (3) arrived in ROCm 5.3; before it, fine-grained
   * memory (1) is the coherent kind. */
  rt->signal_malloc_flags = rt->runtime_version >= PYAR_HIP_VERSION_5_3
                                ? PYAR_hipDeviceMallocUncached
                                : PYAR_hipDeviceMallocFinegrained;
  memcpy(rt->device_attribute, hip_attributes, sizeof hip_attributes);
  rt->platform = PYAR_PLATFORM_HIP;
  return 0;
}
