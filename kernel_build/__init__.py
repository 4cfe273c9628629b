"""Compiling src/kernels/*.cu into the code objects pyar ships, and pyar's
PEP 517 build backend.

setup.py runs build_kernels.build in its build_py step, so wheels, builds
from the sdist and editable installs all compile the kernels;
pyproject.toml names build_backend.backend as the build backend.  The
package sits beside pyar, not inside it: it is build-time code that runs
compilers, and pyar never imports it.

One concept a module.  A module imports only modules listed below it, so
the imports point one way:

  build_backend        setuptools' backend, plus NVIDIA's compiler wheels as
                       build requirements when CUDA kernels want them
  build_kernels        the build: jobs per source and target, code objects,
                       kernel_resources.md
  amd_compiler_choice  which AMD compiler builds which gfx arch
  hip_clang_compiler   a plain clang with HIP support and Debian's device libraries
  hipcc_compiler       ROCm's or Debian's hipcc
  cuda_compiler        finding nvcc (also in NVIDIA's pip wheels) and its command line
  compile_cache        compiler outputs, kept under a hash of all that decides them
  offload_bundle       clang offload bundles (.hsaco), written and read
  kernel_resources     registers and spills per kernel, from the compilers' reports
  gpu_targets          the GPU targets (PYAR_GPU_ARCHS) and the flags every
                       compilation shares
  build_log            the build's messages, also the head of the report
"""
