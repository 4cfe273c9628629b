"""pyar's own HIP declarations against a real HIP SDK (tier a).

pyar builds without an SDK, so it declares the HIP functions, constants, ABI
facts and opaque types it uses itself (src/runtime).  This compiles
src/runtime/hip_declarations_check.c against the SDK's headers (CI installs
Debian's libamdhip64-dev): static assertions hold every declared signature and
constant to the SDK's, and a small program compares the sizes of pyar's opaque
types with the SDK's.  Mutation tests prove each kind of check can fail.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME = os.path.join(ROOT, "src", "runtime")
CHECK = "hip_declarations_check.c"


def hip_include_dir():
    """The directory holding hip/hip_runtime_api.h, or None."""
    candidates = [os.environ.get("PYAR_HIP_INCLUDE"), "/usr/include",
                  os.path.join(os.environ.get("ROCM_PATH", "/opt/rocm"), "include")]
    for directory in filter(None, candidates):
        if os.path.isfile(os.path.join(directory, "hip", "hip_runtime_api.h")):
            return directory
    return None


INCLUDE = hip_include_dir()
CC = shutil.which(os.environ.get("CC", "gcc"))

pytestmark = [
    pytest.mark.skipif(INCLUDE is None, reason="HIP headers (hip/hip_runtime_api.h) not found; "
                       "install libamdhip64-dev or set PYAR_HIP_INCLUDE"),
    pytest.mark.skipif(CC is None, reason="no C compiler (gcc) to compile the check"),
]

WARNINGS = ["-std=c11", "-Wall", "-Wextra", "-Werror"]


def compile_object(runtime_dir, output, *flags):
    command = [CC, *WARNINGS, *flags, "-I", runtime_dir, "-c",
               os.path.join(runtime_dir, CHECK), "-o", output]
    return subprocess.run(command, capture_output=True, text=True)


def build_and_run(runtime_dir, tmp_path):
    """Compile both flavours of the check from ``runtime_dir``, link and run.
    Returns (stage, CompletedProcess) of the first stage that failed, or of the run."""
    sdk = compile_object(runtime_dir, str(tmp_path / "sdk.o"),
                         "-D__HIP_PLATFORM_AMD__", "-I", INCLUDE)
    if sdk.returncode:
        return "compile", sdk
    own = compile_object(runtime_dir, str(tmp_path / "own.o"), "-DPYAR_CHECK_OWN_TYPES")
    if own.returncode:
        return "compile-own", own
    program = str(tmp_path / "check")
    link = subprocess.run([CC, str(tmp_path / "sdk.o"), str(tmp_path / "own.o"), "-o", program],
                          capture_output=True, text=True)
    if link.returncode:
        return "link", link
    return "run", subprocess.run([program], capture_output=True, text=True)


def test_declarations_match_the_sdk(tmp_path):
    stage, result = build_and_run(RUNTIME, tmp_path)
    assert (stage, result.returncode) == ("run", 0), result.stdout + result.stderr
    types = re.findall(r"^\s*X\((\w+)\)", read(CHECK), re.M)
    assert result.stdout.strip() == f"ok: {len(types)} types"


def read(name):
    with open(os.path.join(RUNTIME, name)) as f:
        return f.read()


def test_every_declaration_is_checked():
    """A constant, ABI fact or type added to pyar's headers without a check fails here."""
    check = read(CHECK)
    checked_constants = set(re.findall(r"PYAR_CHECK_CONSTANT\((\w+)\)", check))
    constants = re.findall(r"^#define PYAR_(\w+)[ \t]+\S", read("pyar_hip_constants.h"), re.M)
    assert constants, "no constants parsed from pyar_hip_constants.h"
    assert set(constants) - checked_constants == set()

    abi = re.findall(r"^#define (PYAR_\w+)[ \t]+\S", read("hip_abi.h"), re.M)
    assert len(abi) >= 7 + 4
    for name in abi:
        # PYAR_<SDK name> is compared by name; the others appear in a check.
        sdk_name = name[len("PYAR_"):]
        assert sdk_name in checked_constants or re.search(rf"\b{name}\b", check), name

    types = set(re.findall(r"^\s*X\((\w+)\)", check, re.M))
    declared = {re.search(r"(\w+)\s*;\s*$", line).group(1)
                for line in read("pyar_hip_types.h").splitlines() if line.startswith("typedef")}
    assert declared and declared - types == set()

    # The check must see the SDK's types, never pyar's.
    assert not re.search(r'#include\s+"pyar_hip_types\.h"', read("pyar_hip_api.h"))
    assert not re.search(r'#include\s+"pyar_hip_types\.h"', read("pyar_hip_constants.h"))
    assert not re.search(r'#include\s+"pyar_hip_types\.h"', read("hip_abi.h"))


def test_loader_uses_the_checked_abi_header():
    """hip_loader.c takes its ROCm numbers from hip_abi.h, not from literals."""
    loader = read("hip_loader.c")
    assert '#include "hip_abi.h"' in loader
    for literal in ("63", "396", "792", "1160", "1472", "50300000", "60000000"):
        assert not re.search(rf"\b{literal}\b", loader), f"hip_loader.c hard-codes {literal}"


# Each mutation makes one of pyar's declarations wrong; the check must fail,
# at the stage given, with a message naming what is wrong.
MUTATIONS = [
    ("pyar_hip_api.h", "X(hipError_t, hipMalloc, (void **, size_t))",
     "X(hipError_t, hipMalloc, (void **, unsigned int))", "compile", "hipMalloc"),
    ("pyar_hip_api.h", "X(hipError_t, hipMemcpy, (void *, const void *, size_t, hipMemcpyKind))",
     "X(hipError_t, hipMemcpy, (void *, const void *, size_t, int))", "compile", "hipMemcpy"),
    ("pyar_hip_api.h", "X(hipError_t, hipGraphLaunch, (hipGraphExec_t, hipStream_t))",
     "X(hipError_t, hipGraphLaunch, (hipGraph_t, hipStream_t))", "compile", "hipGraphLaunch"),
    ("pyar_hip_constants.h", "#define PYAR_hipErrorNotReady 600",
     "#define PYAR_hipErrorNotReady 601", "compile", "hipErrorNotReady"),
    ("pyar_hip_constants.h", "#define PYAR_hipStreamCaptureModeRelaxed 2",
     "#define PYAR_hipStreamCaptureModeRelaxed 1", "compile", "hipStreamCaptureModeRelaxed"),
    ("hip_abi.h", "#define PYAR_hipDeviceAttributeWarpSize 87",
     "#define PYAR_hipDeviceAttributeWarpSize 88", "compile", "hipDeviceAttributeWarpSize"),
    ("hip_abi.h", "#define PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET 396",
     "#define PYAR_HIP_PROPS_R0000_ARCH_NAME_OFFSET 400", "compile", "gcnArchName"),
    ("hip_abi.h", "#define PYAR_HIP_PROPS_R0000_SIZE 792",
     "#define PYAR_HIP_PROPS_R0000_SIZE 800", "compile", "sizeof"),
    ("pyar_hip_types.h", "typedef struct { char reserved[64]; } hipIpcMemHandle_t;",
     "typedef struct { char reserved[32]; } hipIpcMemHandle_t;", "run", "hipIpcMemHandle_t"),
    ("pyar_hip_types.h", "typedef int hipMemcpyKind;",
     "typedef long long hipMemcpyKind;", "run", "hipMemcpyKind"),
]


@pytest.mark.parametrize("header, original, wrong, stage, named", MUTATIONS,
                         ids=[f"{m[0]}:{m[4]}" for m in MUTATIONS])
def test_a_wrong_declaration_fails_the_check(tmp_path, header, original, wrong, stage, named):
    runtime = tmp_path / "runtime"
    shutil.copytree(RUNTIME, runtime)
    path = runtime / header
    text = path.read_text()
    assert text.count(original) == 1, f"{header} no longer contains {original!r}: update the test"
    path.write_text(text.replace(original, wrong))

    failed_at, result = build_and_run(str(runtime), tmp_path)
    output = result.stdout + result.stderr
    assert failed_at == stage and result.returncode != 0, output
    assert named in output, output
