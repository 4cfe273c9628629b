"""What the build compiles for: the GPU targets, and the language flags
that every compilation shares, so that nvcc and the AMD compilers see the
same C++.

PYAR_GPU_ARCHS (";"- or ","-separated, e.g. "sm_90" or "gfx90a;gfx942")
overrides the default targets; a toolchain that is missing is reported and
skipped, so the package still builds.
"""
import os

DEFAULT_CUDA_ARCHS = ("sm_80", "sm_90")
DEFAULT_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950")
KERNEL_FLAGS = ("-O3", "-std=c++17")


def requested_archs():
    value = os.environ.get("PYAR_GPU_ARCHS", "")
    archs = [a.strip() for a in value.replace(",", ";").split(";") if a.strip()]
    cuda = tuple(a for a in archs if a.startswith("sm_"))
    hip = tuple(a for a in archs if a.startswith("gfx"))
    unknown = [a for a in archs if not a.startswith(("sm_", "gfx"))]
    if unknown:
        raise SystemExit(f"PYAR_GPU_ARCHS: unknown target(s) {unknown}; use sm_XX or gfxXXX")
    if archs:
        return cuda, hip
    return DEFAULT_CUDA_ARCHS, DEFAULT_HIP_ARCHS
