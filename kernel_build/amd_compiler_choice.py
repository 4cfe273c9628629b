"""Which AMD compiler builds which gfx arch.

Every gfx arch is compiled on its own.  The compilers differ in the archs
they know (clang-19 lacks gfx950, Debian's hipcc gfx942), so each arch goes
to the first of these compilers that can target it:
  1. ROCm's hipcc, when a ROCm installation is found ($ROCM_PATH or /opt/rocm):
     what users of MI300/MI355 have; it knows gfx950;
  2. a clang with HIP support, $PYAR_HIP_CLANG or Debian's clang++-19, given
     the bitcode of Debian's rocm-device-libs (plus the ISA-version file of
     gfx942, which ROCm 5.2's libraries lack): gfx90a and gfx942;
  3. any other hipcc on PATH (Debian's HIP 5.2, clang-15): gfx90a.
Whether a compiler can target an arch is tried on an empty kernel (probe).
The log says which compiler built which arch and why an arch was skipped.
"""
import hashlib
import json
import os
import subprocess
import tempfile

from .build_log import log
from .compile_cache import cache_folder
from .hip_clang_compiler import HipClang, find_device_libs, find_hip_clang
from .hipcc_compiler import Hipcc, find_hipcc, find_rocm_hipcc


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
