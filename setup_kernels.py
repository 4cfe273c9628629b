"""Compiling src/kernels/*.cu into the code objects pyar ships.

CUDA: nvcc -> one fatbin per source (machine code for each sm_XX, plus PTX of
the newest for later GPUs).  ROCm: hipcc --genco -> one code-object bundle per
source.  PYAR_GPU_ARCHS (";"- or ","-separated, e.g. "sm_90" or
"gfx90a;gfx942") overrides the default targets; a toolchain that is missing
is reported and skipped, so the package still builds.
"""
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile

DEFAULT_CUDA_ARCHS = ("sm_80", "sm_90")
DEFAULT_HIP_ARCHS = ("gfx90a", "gfx942", "gfx950")
KERNEL_FLAGS = ("-O3", "-std=c++17")


def log(message):
    print(f"pyar kernels: {message}", file=sys.stderr, flush=True)


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


def find_nvcc():
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    return candidate if os.access(candidate, os.X_OK) else None


def find_hipcc():
    found = shutil.which("hipcc")
    if found:
        return found
    candidate = os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "bin", "hipcc")
    return candidate if os.access(candidate, os.X_OK) else None


def nvcc_command(nvcc, source, output, archs, defines=()):
    """The nvcc line building ``source`` into a fatbin for ``archs``."""
    newest = max(archs, key=lambda a: int(a[3:]))
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    gencode.append(f"-gencode=arch=compute_{newest[3:]},code=compute_{newest[3:]}")
    return [nvcc, "--fatbin", *KERNEL_FLAGS, *gencode, *(f"-D{d}" for d in defines),
            "-I", os.path.dirname(source), "-o", output, source]


def hipcc_command(hipcc, source, output, archs, defines=()):
    """The hipcc line building ``source`` into a code-object bundle for ``archs``."""
    return [hipcc, "--genco", "-x", "hip", *KERNEL_FLAGS, *(f"--offload-arch={a}" for a in archs),
            *(f"-D{d}" for d in defines), "-I", os.path.dirname(source), "-o", output, source]


def hip_environment():
    # Without HIP_PLATFORM=amd, hipcc picks nvcc when it finds one on PATH.
    return dict(os.environ, HIP_PLATFORM="amd")


def supported_hip_archs(hipcc, archs):
    """The archs this hipcc can target (Debian's clang-15 knows gfx90a, not gfx942)."""
    kept = []
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.hip")
        with open(probe, "w") as f:
            f.write("extern \"C\" __global__ void probe() {}\n")
        for arch in archs:
            result = subprocess.run(hipcc_command(hipcc, probe, os.path.join(tmp, "p.co"), [arch]),
                                    env=hip_environment(), capture_output=True, text=True)
            if result.returncode == 0:
                kept.append(arch)
            else:
                log(f"hipcc cannot target {arch}; skipped")
    return kept


def run(command, env=None):
    log(" ".join(command))
    subprocess.run(command, check=True, env=env)


def build(source_dir, output_dir):
    """Compile every .cu in ``source_dir`` into ``output_dir``; returns the files made.

    The compilations run side by side: the fused kernels alone take most of a
    minute per arch, and each is one compiler process on one core."""
    cuda_archs, hip_archs = requested_archs()
    sources = sorted(f for f in os.listdir(source_dir) if f.endswith(".cu"))
    os.makedirs(output_dir, exist_ok=True)
    jobs = []  # (command, environment, output)
    nvcc = find_nvcc() if cuda_archs else None
    if cuda_archs and not nvcc:
        log("nvcc not found: no CUDA kernels built (set CUDA_HOME or put nvcc on PATH)")
    if nvcc:
        for name in sources:
            output = os.path.join(output_dir, name[:-3] + ".fatbin")
            jobs.append((nvcc_command(nvcc, os.path.join(source_dir, name), output, cuda_archs),
                         None, output))
    hipcc = find_hipcc() if hip_archs else None
    if hip_archs and not hipcc:
        log("hipcc not found: no ROCm kernels built (set ROCM_PATH or put hipcc on PATH)")
    if hipcc:
        archs = supported_hip_archs(hipcc, hip_archs)
        if not archs:
            log(f"hipcc targets none of {list(hip_archs)}: no ROCm kernels built")
        for name in sources if archs else ():
            output = os.path.join(output_dir, name[:-3] + ".hsaco")
            jobs.append((hipcc_command(hipcc, os.path.join(source_dir, name), output, archs),
                         hip_environment(), output))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for done in [pool.submit(run, command, env) for command, env, _ in jobs]:
            done.result()  # the first failure, raised here
    made = [output for _, _, output in jobs]
    if not made:
        log("no GPU toolchain: pyar is built without kernels")
    return made
