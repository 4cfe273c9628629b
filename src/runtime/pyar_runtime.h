/* The HIP-named C surface pyar's binding calls: one dispatch table, filled
 * at first use either straight from ROCm's libamdhip64 (hip_loader.c) or by
 * adapters onto the CUDA driver API (cuda_loader.c).  Nothing here links
 * against a GPU library; both are found with dlopen. */
#ifndef PYAR_RUNTIME_H
#define PYAR_RUNTIME_H

#include "pyar_hip_types.h"
#include "pyar_hip_constants.h"
#include "pyar_hip_api.h"

enum pyar_platform { PYAR_PLATFORM_NONE = 0, PYAR_PLATFORM_HIP = 1, PYAR_PLATFORM_CUDA = 2 };

/* Device attributes pyar reads; each platform maps them to its own enum. */
enum pyar_device_attribute {
  PYAR_ATTR_MULTIPROCESSOR_COUNT,
  PYAR_ATTR_COMPUTE_CAPABILITY_MAJOR,
  PYAR_ATTR_COMPUTE_CAPABILITY_MINOR,
  PYAR_ATTR_MAX_THREADS_PER_BLOCK,
  PYAR_ATTR_WARP_SIZE,
  PYAR_ATTR_L2_CACHE_SIZE,
  PYAR_ATTR_MAX_SHARED_MEMORY_PER_BLOCK,
  PYAR_ATTR_COUNT
};

typedef struct pyar_runtime {
#define PYAR_TABLE_ENTRY(ret, name, params) ret(*name) params;
  PYAR_HIP_API(PYAR_TABLE_ENTRY)
#undef PYAR_TABLE_ENTRY
  /* Architecture name as the compilers spell it: "gfx942", "sm_90". */
  hipError_t (*pyarDeviceGetArchName)(char *name, int len, int device);

  /* Values that differ between platforms or ROCm releases. */
  int platform;
  int runtime_version;
  unsigned int ipc_open_flags;      /* lazily enable peer access */
  unsigned int signal_malloc_flags; /* hipExtMallocWithFlags: uncached */
  int device_attribute[PYAR_ATTR_COUNT];
  char library[512];                /* the path dlopen resolved */
} pyar_runtime;

extern pyar_runtime pyar_rt;

/* Fill pyar_rt.  platform is "hip", "cuda" or NULL/"" (ROCm first, then
 * CUDA, preferring one that sees a device).  Returns 0, or -1 with a message
 * naming every library tried in error.  Not thread-safe: the binding calls it
 * under a lock, once. */
int pyar_runtime_load(const char *platform, char *error, size_t error_size);

/* Per-platform loaders; each returns 0 or -1 and appends to error. */
int pyar_load_hip(pyar_runtime *rt, char *error, size_t error_size);
int pyar_load_cuda(pyar_runtime *rt, char *error, size_t error_size);

#endif
