"""Finding nvcc, and the nvcc line that builds a source into a fatbin.

nvcc makes one fatbin per source: machine code for each sm_XX, plus PTX of
the newest for later GPUs.  find_cuda_compiler takes the first nvcc of:
  1. ``nvcc`` on PATH;
  2. the CUDA toolkit in $CUDA_HOME, else $CUDA_PATH, else /usr/local/cuda;
  3. the nvcc of NVIDIA's pip wheels (nvidia-cuda-nvcc, with nvidia-nvvm,
     nvidia-cuda-crt, nvidia-cuda-runtime and nvidia-cuda-cccl for cicc and
     the headers: CUDA_COMPILER_WHEELS, the ``cuda`` extra), looked for as
     ``nvidia/cu13/bin/nvcc`` (CUDA 12's wheels: ``nvidia/cuda_nvcc/bin``) in
     the site-packages of the environment the build installs into (the
     interpreter's sys.prefix, also inside pip's build isolation), then in
     the user's site-packages, then in every other sys.path entry (pip's
     isolated build environment among them).
Each nvcc found carries where it came from, so the build log can say which
nvcc built the kernels and why that one.
"""
import glob
import os
import re
import shutil
import site
import sys
import sysconfig
from typing import NamedTuple, Tuple

from .gpu_targets import KERNEL_FLAGS


# NVIDIA's compiler as pip wheels (pyproject.toml's ``cuda`` extra lists the
# same).  13.0, the first CUDA 13 release: the runtime layer calls the driver
# API of CUDA 13, and code built by 13.0 (its PTX too) loads on every CUDA 13
# driver (580 and later); nvidia-cuda-nvcc itself leaves the versions of
# nvidia-nvvm (cicc), -crt and -runtime open, so each is pinned here; cccl
# holds <nv/target>, which cuda_fp16.h includes.
# Their versions decide what the wheels' nvcc makes: its cache identity.
CUDA_WHEEL_RELEASE = "13.0"
COMPILER_WHEEL_NAMES = ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt",
                        "nvidia-cuda-runtime", "nvidia-cuda-cccl")
CUDA_COMPILER_WHEELS = tuple(f"{name}=={CUDA_WHEEL_RELEASE}.*" for name in COMPILER_WHEEL_NAMES)


class Nvcc(NamedTuple):
    """An nvcc found: its ``path``; ``origin``, where it came from ("on
    PATH", "from the CUDA toolkit in ...", "from NVIDIA's pip wheels ..."), for
    the log; ``wheels``, ((name, version), ...) of NVIDIA's wheels beside it, or
    () for a toolkit."""
    path: str
    origin: str
    wheels: Tuple[Tuple[str, str], ...] = ()

    def identity(self, version):
        """What the kernel cache keys on: a toolkit by its path and version,
        the wheels by their names and versions (not where pip put them)."""
        if self.wheels:
            return ["pip wheels", [list(w) for w in self.wheels], version]
        return [self.path, version]

    def stable(self, command):
        """``command`` as the cache key sees it: the wheels' nvcc without its folder."""
        return ["nvcc", *command[1:]] if self.wheels and command[:1] == [self.path] else command


def wheel_site_folders():
    """[(folder, description)] where NVIDIA's wheels may be installed, in the
    order they are searched: the site-packages of the environment this
    interpreter installs into (sys.prefix: a venv's own, also while pip
    builds in isolation), the user's site-packages, then the other sys.path
    entries (pip's isolated build environment, $PYTHONPATH)."""
    found, seen = [], set()

    def add(folder, description):
        if not folder or not os.path.isdir(folder):
            return
        key = os.path.realpath(folder)
        if key not in seen:
            seen.add(key)
            found.append((folder, description))

    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib"):
        add(paths.get(key), f"the site-packages of {sys.prefix}")
    if site.ENABLE_USER_SITE:
        add(site.getusersitepackages(), "the user's site-packages")
    for entry in sys.path:
        add(entry or os.getcwd(), "pip's build environment" if "pip-build-env" in (entry or "")
            else "sys.path")
    return found


def _cuda_major(folder):
    """13 for nvidia/cu13; 0 for folders named otherwise (cuda_nvcc: CUDA 12's wheels)."""
    match = re.fullmatch(r"cu(\d+)", os.path.basename(folder))
    return int(match.group(1)) if match else 0


def wheel_nvcc(site_folder):
    """The nvcc of NVIDIA's wheels in ``site_folder``, newest CUDA major first, or None."""
    candidates = [os.path.dirname(os.path.dirname(c))
                  for c in glob.glob(os.path.join(site_folder, "nvidia", "*", "bin", "nvcc"))]
    for folder in sorted(candidates, key=lambda f: (-_cuda_major(f), f)):
        nvcc = os.path.join(folder, "bin", "nvcc")
        if os.access(nvcc, os.X_OK):
            return nvcc
    return None


def installed_wheels(site_folder, names=COMPILER_WHEEL_NAMES):
    """((name, version), ...) of the distributions in ``site_folder`` whose
    names start with one of ``names`` (nvidia-cuda-nvcc, nvidia-cuda-nvcc-cu12)."""
    found = []
    for info in glob.glob(os.path.join(site_folder, "*.dist-info")):
        name, _, version = os.path.basename(info)[:-len(".dist-info")].partition("-")
        name = re.sub(r"[-_.]+", "-", name).lower()
        if name.startswith(names):
            found.append((name, version))
    return tuple(sorted(found))


def find_cuda_compiler():
    """The nvcc to build with (module docstring: the lookup order), or None."""
    found = shutil.which("nvcc")
    if found:
        return Nvcc(found, "on PATH")
    variable = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)), None)
    home = os.environ[variable] if variable else "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    if os.access(candidate, os.X_OK):
        return Nvcc(candidate, f"from the CUDA toolkit in {home}"
                    + (f" (${variable})" if variable else ""))
    for folder, description in wheel_site_folders():
        nvcc = wheel_nvcc(folder)
        if nvcc:
            wheels = installed_wheels(folder)
            listed = ", ".join(f"{n} {v}" for n, v in wheels) or "no wheel metadata"
            where = f"{home} (${variable})" if variable else home
            return Nvcc(nvcc, f"from NVIDIA's pip wheels ({listed}) in {description}, "
                              f"{folder} (no nvcc on PATH or in {where})", wheels)
    return None


def find_nvcc():
    """The path of the nvcc find_cuda_compiler finds, or None."""
    found = find_cuda_compiler()
    return found.path if found else None


def nvcc_command(nvcc, source, output, archs, defines=()):
    """The nvcc line building ``source`` into a fatbin for ``archs``."""
    newest = max(archs, key=lambda a: int(a[3:]))
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{newest[3:]},code=compute_{newest[3:]}")
    return [nvcc, "--fatbin", *KERNEL_FLAGS, "-Xptxas", "-v", *gencode,
            *(f"-D{d}" for d in defines), "-I", os.path.dirname(source), "-o", output, source]

