"""Compiling src/kernels/*.cu into the code objects pyar ships.

CUDA: nvcc -> one fatbin per source (machine code for each sm_XX, plus PTX of
the newest for later GPUs).  The first nvcc found of (find_cuda_compiler):
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
Under pip's build isolation the environment's packages are installed only
after the build, so a first ``pip install '.[cuda]'`` finds no wheel there:
pyar's build backend (``backend`` below) then asks pip for the same wheels
as build requirements (cuda_wheels_to_request), and the build uses the nvcc
of pip's build environment.  The log says which nvcc built the kernels and
where it came from.

ROCm: one code object per (source, arch), bundled per source into a .hsaco.
Each arch is built by the first of these compilers that can target it:
  1. ROCm's hipcc, when a ROCm installation is found ($ROCM_PATH or /opt/rocm):
     what users of MI300/MI355 have; it knows gfx950;
  2. a clang with HIP support, $PYAR_HIP_CLANG or Debian's clang++-19, given
     the bitcode of Debian's rocm-device-libs (plus the ISA-version file of
     gfx942, which ROCm 5.2's libraries lack): gfx90a and gfx942;
  3. any other hipcc on PATH (Debian's HIP 5.2, clang-15): gfx90a.
The log says which compiler built which arch and why an arch was skipped.

PYAR_GPU_ARCHS (";"- or ","-separated, e.g. "sm_90" or "gfx90a;gfx942")
overrides the default targets; a toolchain that is missing is reported and
skipped, so the package still builds.

Every compiler output is cached under a hash of everything that decides it:
the source and each header it includes, the compiler's identity and version
(a toolkit's path; for NVIDIA's wheels, their names and versions, not their
path, so pip's throw-away build environment and the installed wheels share
entries; the device libraries' contents), the command line with its flags,
arch and defines.  The cache lives in build/kernel-cache of this source tree, or
in $PYAR_KERNEL_CACHE; deleting it forces a full rebuild.  Compilations run
side by side, one per core, and the log has one line per source, arch and
compiler: compiled (with its time) or cached.

The build also writes kernel_resources.md next to the code objects: the
registers and spills of every kernel, from the compilers' own reports
(AMD: -Rpass-analysis=kernel-resource-usage; CUDA: ptxas -v), and logs per
source and arch the kernels that spill to memory (AMD: VGPR spills or
scratch; SGPR spills go to VGPR lanes and are only listed in the table).
"""
import concurrent.futures
import ctypes
import glob
import hashlib
import json
import os
import re
import shutil
import site
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import NamedTuple, Tuple

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = ("sm_80", "sm_90")
DEFAULT_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950")
KERNEL_FLAGS = ("-O3", "-std=c++17")
REPORT_NAME = "kernel_resources.md"
# What the AMD compilers report per kernel; ptxas -v says the same for CUDA.
AMD_RESOURCE_REMARKS = "-Rpass-analysis=kernel-resource-usage"


# What the build said, for the top of its report (pip hides the build's output).
_logged = []


def log(message):
    _logged.append(message)
    sys.stderr.write(f"pyar kernels: {message}\n")  # one write: the threads' lines stay whole
    sys.stderr.flush()


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


# ---------------------------------------------------------------------------
# Finding the compilers


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
    """pyar's PEP 517 build backend (pyproject.toml: ``setup_kernels:backend``):
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


def hip_environment():
    # Without HIP_PLATFORM=amd, hipcc picks nvcc when it finds one on PATH.
    return dict(os.environ, HIP_PLATFORM="amd")


# ---------------------------------------------------------------------------
# Command lines


def nvcc_command(nvcc, source, output, archs, defines=()):
    """The nvcc line building ``source`` into a fatbin for ``archs``."""
    newest = max(archs, key=lambda a: int(a[3:]))
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{newest[3:]},code=compute_{newest[3:]}")
    return [nvcc, "--fatbin", *KERNEL_FLAGS, "-Xptxas", "-v", *gencode,
            *(f"-D{d}" for d in defines), "-I", os.path.dirname(source), "-o", output, source]


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


# ---------------------------------------------------------------------------
# The cache


def cache_folder():
    return os.environ.get("PYAR_KERNEL_CACHE") or os.path.join(ROOT, "build", "kernel-cache")


_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def included_files(source, include_dirs):
    """``source`` and every file it includes (transitively) that is found next
    to the including file or in ``include_dirs``; system headers are covered
    by the compiler's identity."""
    found, pending = [], [os.path.abspath(source)]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.append(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for name in _INCLUDE.findall(text):
            for folder in (os.path.dirname(path), *include_dirs):
                candidate = os.path.abspath(os.path.join(folder, name))
                if os.path.isfile(candidate):
                    pending.append(candidate)
                    break
    return found


class Job:
    """One compiler run: ``argv(source, output)`` -> a command line;
    ``stable(command)`` -> the command without its build-specific paths."""

    def __init__(self, source, target, compiler, identity, argv, environment=None,
                 stable=lambda command: command):
        self.source, self.target, self.compiler = source, target, compiler
        self.identity, self.argv, self.environment = identity, argv, environment
        self.stable = stable

    def key(self):
        digest = hashlib.sha256()
        digest.update(json.dumps([self.identity,
                                  self.stable(self.argv("SOURCE", "OUTPUT"))]).encode())
        for path in included_files(self.source, [os.path.dirname(self.source)]):
            with open(path, "rb") as f:
                digest.update(os.path.basename(path).encode() + b"\0" + f.read())
        return digest.hexdigest()

    def describe(self):
        return f"{os.path.basename(self.source)} {self.target} {self.compiler}"


def run_cached(job, cache):
    """The cache entry (a folder holding ``output`` and ``log``) of ``job``,
    compiling it unless an entry exists."""
    entry = os.path.join(cache, job.key())
    if os.path.isfile(os.path.join(entry, "output")):
        log(f"{job.describe()}: cached")
        return entry
    os.makedirs(cache, exist_ok=True)
    work = tempfile.mkdtemp(dir=cache, prefix="tmp-")
    try:
        started = time.monotonic()
        result = subprocess.run(job.argv(job.source, os.path.join(work, "output")),
                                capture_output=True, text=True, env=job.environment)
        if result.returncode != 0:
            raise RuntimeError(f"{job.describe()} failed:\n"
                               + " ".join(job.argv(job.source, "OUTPUT")) + "\n"
                               + strip_remarks(result.stdout + result.stderr))
        with open(os.path.join(work, "log"), "w") as f:
            f.write(result.stdout + result.stderr)
        try:
            os.rename(work, entry)
        except OSError:  # another build stored the same entry meanwhile
            if not os.path.isfile(os.path.join(entry, "output")):
                raise
        log(f"{job.describe()}: compiled in {time.monotonic() - started:.0f} s")
        return entry
    finally:
        shutil.rmtree(work, ignore_errors=True)


def strip_remarks(text):
    """A compiler's messages without the resource-usage remarks."""
    return "\n".join(line for line in text.splitlines()
                     if "kernel-resource-usage" not in line and line.strip() != "^"
                     and not re.match(r"\s*\d+ \|", line))


# ---------------------------------------------------------------------------
# Choosing a compiler per AMD arch


def probe(compiler, arch, cache):
    """None when ``compiler`` builds an empty kernel for ``arch``, else why not
    (the compiler's first error line).  Remembered in the cache."""
    key = hashlib.sha256(json.dumps(["probe", compiler.identity(), arch,
                                     compiler.stable(compiler.command("S", "O", arch))]
                                    ).encode()).hexdigest()
    remembered = os.path.join(cache, "probe-" + key)
    if os.path.isfile(remembered):
        with open(remembered) as f:
            return json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "probe.hip")
        with open(source, "w") as f:
            f.write('extern "C" __global__ void probe() {}\n')
        result = subprocess.run(compiler.command(source, os.path.join(tmp, "p.co"), arch),
                                capture_output=True, text=True, env=compiler.environment)
    reason = None
    if result.returncode != 0:
        errors = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line]
        reason = (errors or ["exit status %d" % result.returncode])[0].split(";")[0].strip()
    os.makedirs(cache, exist_ok=True)
    with open(remembered, "w") as f:
        json.dump(reason, f)
    return reason


def amd_compilers(archs, folder):
    """The AMD compilers found, most preferred first."""
    compilers = []
    rocm = find_rocm_hipcc()
    if rocm:
        compilers.append(Hipcc(rocm, "ROCm hipcc"))
    clang = find_hip_clang()
    device_libs = find_device_libs() if clang else None
    if clang and device_libs:
        compilers.append(HipClang.prepare(clang, device_libs, archs, folder))
    elif clang:
        log(f"{clang}: no ROCm device libraries (apt-get install rocm-device-libs): not used")
    hipcc = find_hipcc()
    if hipcc and hipcc != rocm:
        compilers.append(Hipcc(hipcc, "hipcc"))
    return compilers


def assign_hip_archs(compilers, archs, cache):
    """{arch: compiler} for the archs some compiler can build; logs the rest."""
    chosen = {}
    for arch in archs:
        reasons = []
        for compiler in compilers:
            reason = probe(compiler, arch, cache)
            if reason is None:
                chosen[arch] = compiler
                break
            reasons.append(f"{compiler.short_name()}: {reason}")
        if arch in chosen:
            log(f"{arch}: built by {chosen[arch].short_name()}"
                + (f" (skipped {'; '.join(reasons)})" if reasons else ""))
        else:
            log(f"{arch}: skipped, " + ("; ".join(reasons) if reasons else "no AMD compiler"))
    return chosen


def supported_hip_archs(hipcc, archs):
    """The archs this hipcc can target (Debian's clang-15 knows gfx90a, not gfx942)."""
    compiler = Hipcc(hipcc, "hipcc")
    return [a for a in archs if probe(compiler, a, cache_folder()) is None]


# ---------------------------------------------------------------------------
# Code-object bundles (the format of clang-offload-bundler)

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
BUNDLE_ALIGNMENT = 4096  # as clang aligns each code object
HOST_TRIPLE = "host-x86_64-unknown-linux--"


def write_bundle(path, code_objects):
    """One bundle holding ``{arch: ELF bytes}``, as hipcc --genco makes it."""
    entries = [(HOST_TRIPLE, b"")] + [(f"hipv4-amdgcn-amd-amdhsa--{arch}", code)
                                      for arch, code in sorted(code_objects.items())]
    header_size = len(BUNDLE_MAGIC) + 8 + sum(24 + len(t) for t, _ in entries)
    offset = -(-header_size // BUNDLE_ALIGNMENT) * BUNDLE_ALIGNMENT
    header, body = [BUNDLE_MAGIC, struct.pack("<Q", len(entries))], b""
    for triple, code in entries:
        body += b"\0" * (offset - header_size - len(body))
        header += [struct.pack("<QQQ", offset, len(code), len(triple)), triple.encode()]
        body += code
        offset = -(-(header_size + len(body)) // BUNDLE_ALIGNMENT) * BUNDLE_ALIGNMENT
    with open(path, "wb") as f:
        f.write(b"".join(header) + body)


def read_bundle(data):
    """{triple: payload} of a bundle (what clang-offload-bundler --list shows)."""
    if not data.startswith(BUNDLE_MAGIC):
        raise ValueError(f"not a clang offload bundle: {data[:24]!r}")
    count, = struct.unpack_from("<Q", data, len(BUNDLE_MAGIC))
    entries, position = {}, len(BUNDLE_MAGIC) + 8
    for _ in range(count):
        offset, size, triple_size = struct.unpack_from("<QQQ", data, position)
        position += 24
        triple = data[position:position + triple_size].decode()
        position += triple_size
        entries[triple] = data[offset:offset + size]
    return entries


# ---------------------------------------------------------------------------
# Registers and spills


def amd_resources(text):
    """[{kernel, VGPRs, AGPRs, SGPRs, scratch, VGPR spill, SGPR spill,
    occupancy}] from clang's kernel-resource-usage remarks."""
    fields = {"VGPRs": "vgprs", "AGPRs": "agprs", "SGPRs": "sgprs",
              "ScratchSize [bytes/lane]": "scratch", "VGPRs Spill": "vgpr_spill",
              "SGPRs Spill": "sgpr_spill", "Occupancy [waves/SIMD]": "occupancy"}
    rows = []
    for match in re.finditer(r"remark:\s+(Function Name|[A-Za-z][\w \[\]/]*?): (\S+) \[", text):
        name, value = match.group(1), match.group(2)
        if name == "Function Name":
            rows.append({"kernel": value})
        elif rows and name in fields:
            rows[-1][fields[name]] = int(value)
    return rows


def cuda_resources(text):
    """[{kernel, arch, registers, spill_stores, spill_loads, stack}] from ptxas -v."""
    rows, current, properties_of = [], None, None
    for line in text.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
        if entry:
            current = {"kernel": entry.group(1), "arch": entry.group(2)}
            rows.append(current)
            continue
        properties = re.search(r"Function properties for (\S+)", line)
        if properties:  # also printed for device functions that were not inlined
            properties_of = properties.group(1)
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads", line)
        if frame and current and properties_of == current["kernel"]:
            current.update(stack=int(frame.group(1)), spill_stores=int(frame.group(2)),
                           spill_loads=int(frame.group(3)))
        registers = re.search(r"Used (\d+) registers", line)
        if registers and current:
            current["registers"] = int(registers.group(1))
    return rows


def resource_row(row):
    """(table cells from "registers" on, whether the kernel spills to memory)."""
    if "vgprs" in row:  # AMD: SGPRs spill into VGPR lanes, VGPRs into scratch memory
        return [row["vgprs"], f"{row.get('agprs', 0)}/{row.get('sgprs', 0)}",
                f"{row.get('vgpr_spill', 0)} VGPRs, {row.get('sgpr_spill', 0)} SGPRs",
                row.get("scratch", 0), row.get("occupancy", "")], \
            bool(row.get("vgpr_spill", 0) or row.get("scratch", 0))
    stores, loads = row.get("spill_stores", 0), row.get("spill_loads", 0)
    return [row.get("registers", ""), "", f"{stores} B stores, {loads} B loads",
            row.get("stack", 0), ""], bool(stores or loads)


def resource_report(results):
    """The markdown table of every kernel's registers and spills, and one
    summary line per (source, arch)."""
    lines = ["| source | arch | compiler | kernel | registers | AGPRs/SGPRs | spill | "
             "scratch or stack bytes | occupancy |", "| --- " * 9 + "|"]
    summary = []
    for source, arch, compiler, rows in results:
        spilled, most = [], 0
        for row in rows:
            cells, spills = resource_row(row)
            most = max(most, cells[0] or 0)
            if spills:
                spilled.append(row["kernel"])
            lines.append("| " + " | ".join(str(c) for c in [source, row.get("arch", arch),
                                                                compiler, row["kernel"], *cells])
                         + " |")
        summary.append(f"{source} {arch}: {len(rows)} kernels, at most {most} registers, "
                       + (f"{len(spilled)} spill to memory: {', '.join(spilled)}" if spilled
                          else "no spills to memory"))
    return "\n".join(lines) + "\n", summary


# ---------------------------------------------------------------------------
# The build


def build(source_dir, output_dir, defines=(), names=None):
    """Compile every .cu in ``source_dir`` (or those in ``names``) into
    ``output_dir``; returns the code objects made.  ``defines`` are passed to
    every compilation (the test-only builds)."""
    del _logged[:]
    cuda_archs, hip_archs = requested_archs()
    sources = sorted(f for f in os.listdir(source_dir) if f.endswith(".cu")
                     and (names is None or f in names))
    os.makedirs(output_dir, exist_ok=True)
    cache = cache_folder()
    jobs = []  # (output file, job)
    compiler = find_cuda_compiler() if cuda_archs else None
    if cuda_archs and not compiler:
        log("nvcc not found: no CUDA kernels built (put nvcc on PATH, set CUDA_HOME, or "
            "install NVIDIA's compiler wheels: pip install '.[cuda]')")
    if compiler:
        nvcc = compiler.path
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        release = re.search(r"release (\d+\.\d+)", version)
        label = f"nvcc {release.group(1)}" if release else "nvcc"
        log(f"CUDA compiler: {label} ({nvcc}) {compiler.origin}")
        for name in sources:
            jobs.append((name[:-3] + ".fatbin", Job(
                os.path.join(source_dir, name), ",".join(cuda_archs), label,
                compiler.identity(version),
                lambda s, o: nvcc_command(nvcc, s, o, cuda_archs, defines),
                stable=compiler.stable)))
    with tempfile.TemporaryDirectory() as device_libs:
        compilers = amd_compilers(hip_archs, device_libs) if hip_archs else []
        if hip_archs and not compilers:
            log("no AMD compiler (ROCm's hipcc, clang++-19 with rocm-device-libs, hipcc): "
                "no ROCm kernels built")
        chosen = assign_hip_archs(compilers, hip_archs, cache) if compilers else {}
        for name in sources:
            for arch, compiler in chosen.items():
                jobs.append((name[:-3] + ".hsaco", Job(
                    os.path.join(source_dir, name), arch, compiler.short_name(),
                    compiler.identity(),
                    lambda s, o, c=compiler, a=arch: c.command(s, o, a, defines),
                    compiler.environment, compiler.stable)))
        # the biggest sources first: they are the longest compilations
        jobs.sort(key=lambda item: -os.path.getsize(item[1].source))
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            futures = [pool.submit(run_cached, job, cache) for _, job in jobs]
            entries = [future.result() for future in futures]  # the first failure raises
    made, bundles, results = [], {}, []
    for (output, job), entry in zip(jobs, entries):
        with open(os.path.join(entry, "log")) as f:
            text = f.read()
        path = os.path.join(output_dir, output)
        if output.endswith(".fatbin"):
            shutil.copyfile(os.path.join(entry, "output"), path)
            made.append(path)
            rows = cuda_resources(text)
            for arch in cuda_archs:
                results.append((output[:-7], arch, job.compiler,
                                [r for r in rows if r["arch"] == arch]))
        else:
            with open(os.path.join(entry, "output"), "rb") as f:
                bundles.setdefault(path, {})[job.target] = f.read()
            results.append((output[:-6], job.target, job.compiler, amd_resources(text)))
    for path, code_objects in bundles.items():
        write_bundle(path, code_objects)
        made.append(path)
    if not made:
        log("no GPU toolchain: pyar is built without kernels")
        return made
    table, summary = resource_report(results)
    for line in summary:
        log(line)
    with open(os.path.join(output_dir, REPORT_NAME), "w") as f:
        f.write("# The kernel build\n\n" + "".join(f"    {line}\n" for line in _logged)
                + "\n# Registers and spills per kernel\n\n" + table)
    log(f"registers and spills of every kernel: {os.path.join(output_dir, REPORT_NAME)}")
    return sorted(made)
