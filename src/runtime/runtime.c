/* Choosing the platform: an explicit request is honoured or fails; otherwise
 * ROCm is tried first, then CUDA, and a runtime that sees a device wins over
 * one that merely loads (Debian's libamdhip64 loads on any machine). */
#include <stdio.h>
#include <string.h>

#include "pyar_runtime.h"

pyar_runtime pyar_rt;

static int device_count(const pyar_runtime *rt) {
  int count = 0;
  if (rt->hipGetDeviceCount(&count) != PYAR_hipSuccess) return 0;
  return count;
}

int pyar_runtime_load(const char *platform, char *error, size_t error_size) {
  error[0] = '\0';
  if (platform && platform[0]) {
    if (strcmp(platform, "hip") == 0) return pyar_load_hip(&pyar_rt, error, error_size);
    if (strcmp(platform, "cuda") == 0) return pyar_load_cuda(&pyar_rt, error, error_size);
    snprintf(error, error_size, "PYAR_PLATFORM=%s: expected 'hip' or 'cuda'", platform);
    return -1;
  }

  pyar_runtime hip, cuda;
  memset(&hip, 0, sizeof hip);
  memset(&cuda, 0, sizeof cuda);
  int hip_ok = pyar_load_hip(&hip, error, error_size) == 0;
  if (hip_ok && device_count(&hip) > 0) {
    pyar_rt = hip;
    return 0;
  }
  int cuda_ok = pyar_load_cuda(&cuda, error, error_size) == 0;
  if (cuda_ok && (device_count(&cuda) > 0 || !hip_ok)) {
    pyar_rt = cuda;
    return 0;
  }
  if (hip_ok) {
    pyar_rt = hip;
    return 0;
  }
  return -1;
}
