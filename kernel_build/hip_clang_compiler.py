"""A plain clang with HIP support building AMD code objects where no ROCm is
installed: $PYAR_HIP_CLANG or Debian's clang++-19, given the bitcode of
Debian's rocm-device-libs.  ROCm 5.2's libraries lack the ISA-version file
of gfx942, so the build makes it with the llvm-as beside the clang; with
it, the clang builds gfx90a and gfx942.
"""
import glob
import hashlib
import os
import re
import shutil
import subprocess

from .build_log import log
from .gpu_targets import KERNEL_FLAGS
from .hipcc_compiler import AMD_RESOURCE_REMARKS, Hipcc


def find_hip_clang():
    """$PYAR_HIP_CLANG (which must exist), else Debian's clang++-19, or None."""
    named = os.environ.get("PYAR_HIP_CLANG")
    if named:
        found = shutil.which(named)
        if not found:
            raise SystemExit(f"PYAR_HIP_CLANG={named!r}: no such compiler")
        return found
    return shutil.which("clang++-19")


def find_device_libs():
    """The folder of the ROCm device-library bitcode (Debian's rocm-device-libs)."""
    candidates = [os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "amdgcn", "bitcode"),
                  *sorted(glob.glob("/usr/lib/*/amdgcn/bitcode")), "/usr/lib/amdgcn/bitcode"]
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "ockl.bc")):
            return folder
    return None


class HipClang(Hipcc):
    """A plain clang with HIP support (Debian's clang++-19) and a prepared
    folder of device libraries: Debian's bitcode, plus the ISA-version file
    of every requested gfx9 arch the libraries lack."""

    def __init__(self, path, device_libs, folder):
        super().__init__(path, os.path.basename(path))
        self.environment = None
        self.device_libs, self.folder = device_libs, folder
        self._digest = None

    def short_name(self):
        match = re.search(r"clang version (\d+\.\d+\.\d+)", self.version())
        return f"{self.label} ({match.group(1)})" if match else self.label

    def identity(self):
        # The generated ISA-version files follow from the clang's version and
        # the arch, both in the key already: hash the installed libraries only.
        if self._digest is None:
            digest = hashlib.sha256()
            for name in sorted(os.listdir(self.device_libs)):
                with open(os.path.join(self.device_libs, name), "rb") as f:
                    digest.update(name.encode() + b"\0" + f.read())
            self._digest = digest.hexdigest()
        return [self.path, self.version(), self._digest]

    def stable(self, command):
        return [c.replace(self.folder, "DEVICE_LIBS") for c in command]

    def command(self, source, output, arch, defines=()):
        return [self.path, "-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output",
                *KERNEL_FLAGS, "-mcode-object-version=5", f"--offload-arch={arch}",
                "--rocm-path=/usr", f"--rocm-device-lib-path={self.folder}",
                AMD_RESOURCE_REMARKS, *(f"-D{d}" for d in defines),
                "-I", os.path.dirname(source), "-o", output, source]

    @classmethod
    def prepare(cls, clang, device_libs, archs, folder):
        """The clang with ``folder`` filled: links to the device libraries and
        the missing ISA-version files (``__oclc_ISA_version`` = 9402 for
        gfx942), made with the llvm-as beside the clang."""
        for name in os.listdir(device_libs):
            os.symlink(os.path.join(device_libs, name), os.path.join(folder, name))
        for arch in archs:
            isa = isa_version_file(arch)
            if isa is None or os.path.exists(os.path.join(folder, isa[0])):
                continue
            assembler = llvm_tool(clang, "llvm-as")
            if assembler is None:
                log(f"no llvm-as beside {clang}: cannot make {isa[0]}")
                continue
            text = ('target triple = "amdgcn-amd-amdhsa"\n'
                    f'target datalayout = "{AMDGCN_DATALAYOUT}"\n'
                    "@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr "
                    f"addrspace(4) constant i32 {isa[1]}, align 4\n")
            subprocess.run([assembler, "-o", os.path.join(folder, isa[0])], input=text,
                           text=True, check=True, capture_output=True)
        return cls(clang, device_libs, folder)


# The data layout of Debian's device-library bitcode (clang-15), so linking
# the generated ISA-version file adds no layout-mismatch warning.
AMDGCN_DATALAYOUT = ("e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-i64:64-"
                     "v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-"
                     "v2048:2048-n32:64-S32-A5-G1-ni:7:8:9-p7:160:256:256:32-p8:128:128-"
                     "p9:192:256:256:32")


def isa_version_file(arch):
    """("oclc_isa_version_942.bc", 9402) for gfx942; None for non-gfx9 names."""
    match = re.fullmatch(r"gfx9([0-9a-f])([0-9a-f])", arch)
    if not match:
        return None
    return f"oclc_isa_version_9{match.group(1)}{match.group(2)}.bc", \
        9000 + int(match.group(1), 16) * 100 + int(match.group(2), 16)


def llvm_tool(clang, tool):
    """``tool`` from the same LLVM as ``clang`` (clang++-19 -> llvm-as-19)."""
    folder = os.path.dirname(os.path.realpath(clang))
    suffix = re.search(r"(-\d+)?$", shutil.which(clang) or clang).group(0)
    for candidate in (os.path.join(folder, tool), shutil.which(tool + suffix) if suffix else None):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None
