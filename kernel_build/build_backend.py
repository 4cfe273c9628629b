"""pyar's PEP 517 build backend: setuptools' own, which also asks pip for
NVIDIA's compiler wheels when the build wants CUDA kernels and finds no nvcc.

Under pip's build isolation the environment's packages are installed only
after the build, so a first ``pip install '.[cuda]'`` finds no wheel there:
the backend then asks pip for the same wheels as build requirements
(cuda_wheels_to_request), and the build uses the nvcc of pip's build
environment.
"""
import ctypes
import os

from .build_log import log
from .cuda_compiler import CUDA_COMPILER_WHEELS, find_cuda_compiler
from .gpu_targets import requested_archs


def nvidia_driver_present():
    """Whether the NVIDIA driver's libcuda.so.1 (or $PYAR_CUDA_LIBRARY) loads here."""
    try:
        ctypes.CDLL(os.environ.get("PYAR_CUDA_LIBRARY") or "libcuda.so.1")
    except OSError:
        return False
    return True


def cuda_wheels_to_request():
    """The build requirements to add for CUDA kernels: CUDA_COMPILER_WHEELS
    when the build wants CUDA kernels and finds no nvcc, else [].

    $PYAR_CUDA_WHEELS: "1" always asks for them (unless an nvcc is found),
    "0" never; unset or "auto", CUDA kernels are wanted when PYAR_GPU_ARCHS
    names an sm_ target, or when it is unset and the NVIDIA driver loads
    here (a machine without the driver, a CI runner say, names its targets)."""
    choice = os.environ.get("PYAR_CUDA_WHEELS", "auto").strip().lower()
    if choice not in ("0", "1", "auto", ""):
        raise SystemExit(f"PYAR_CUDA_WHEELS={choice!r}: use 1, 0 or auto")
    if choice == "0":
        return []
    cuda_archs, _ = requested_archs()
    if not cuda_archs or find_cuda_compiler() is not None:
        return []
    named = bool(os.environ.get("PYAR_GPU_ARCHS", "").strip())
    if choice == "auto" and not named and not nvidia_driver_present():
        return []
    log("no nvcc on PATH, in a CUDA toolkit or in this environment's wheels: asking pip for "
        + " ".join(CUDA_COMPILER_WHEELS))
    return list(CUDA_COMPILER_WHEELS)


class _Backend:
    """pyar's PEP 517 build backend (pyproject.toml: ``kernel_build.build_backend:backend``):
    setuptools' build_meta, whose wheel and editable builds also require
    NVIDIA's compiler wheels when cuda_wheels_to_request says so."""

    def __getattr__(self, name):
        from setuptools import build_meta
        return getattr(build_meta, name)

    def get_requires_for_build_wheel(self, config_settings=None):
        from setuptools import build_meta
        return build_meta.get_requires_for_build_wheel(config_settings) + cuda_wheels_to_request()

    def get_requires_for_build_editable(self, config_settings=None):
        from setuptools import build_meta
        return (build_meta.get_requires_for_build_editable(config_settings)
                + cuda_wheels_to_request())


backend = _Backend()
