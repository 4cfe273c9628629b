"""hipcc, ROCm's or Debian's (HIP 5.2): finding it, the environment it
needs and its command lines.  amd_compiler_choice says which archs each
one builds.
"""
import os
import re
import shutil
import subprocess

from .gpu_targets import KERNEL_FLAGS

# What the AMD compilers report per kernel; ptxas -v says the same for CUDA.
AMD_RESOURCE_REMARKS = "-Rpass-analysis=kernel-resource-usage"


def find_rocm_hipcc():
    """The hipcc of a ROCm installation ($ROCM_PATH, /opt/rocm), or None."""
    for root in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        candidate = os.path.join(root, "bin", "hipcc") if root else None
        if candidate and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    return None


def find_hipcc():
    """A hipcc: on PATH, else the ROCm installation's."""
    found = shutil.which("hipcc")
    return os.path.realpath(found) if found else find_rocm_hipcc()


def hip_environment():
    # Without HIP_PLATFORM=amd, hipcc picks nvcc when it finds one on PATH.
    return dict(os.environ, HIP_PLATFORM="amd")


def hipcc_command(hipcc, source, output, archs, defines=()):
    """The hipcc line building ``source`` into a code-object bundle for ``archs``."""
    return [hipcc, "--genco", "-x", "hip", *KERNEL_FLAGS, *(f"--offload-arch={a}" for a in archs),
            *(f"-D{d}" for d in defines), "-I", os.path.dirname(source), "-o", output, source]


class Hipcc:
    """A hipcc (ROCm's or Debian's) building one arch's code object."""

    def __init__(self, path, label):
        self.path, self.label = path, label
        self.environment = hip_environment()
        self._version = None

    def version(self):
        if self._version is None:
            result = subprocess.run([self.path, "--version"], capture_output=True, text=True,
                                    env=self.environment)
            self._version = result.stdout + result.stderr
        return self._version

    def identity(self):
        return [self.path, self.version()]

    def short_name(self):
        match = re.search(r"HIP version:\s*(\d+\.\d+)", self.version())
        return f"{self.label} (HIP {match.group(1)})" if match else self.label

    def stable(self, command):
        """``command`` without the paths that differ from build to build."""
        return command

    def command(self, source, output, arch, defines=()):
        return [self.path, "--genco", "--no-gpu-bundle-output", "-x", "hip", *KERNEL_FLAGS,
                f"--offload-arch={arch}", AMD_RESOURCE_REMARKS, *(f"-D{d}" for d in defines),
                "-I", os.path.dirname(source), "-o", output, source]

