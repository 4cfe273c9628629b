"""Which targets the kernel build compiles, and with which compiler (tier a):
the parsing of PYAR_GPU_ARCHS, the nvcc line, the probe that drops targets
an AMD compiler cannot build, and the order in which AMD compilers are
tried.  tests/test_kernel_build.py compiles the kernels themselves."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from kernel_build import (amd_compiler_choice, cuda_compiler, gpu_targets,  # noqa: E402
                          hipcc_compiler)

HIPCC = hipcc_compiler.find_hipcc()
needs_hipcc = pytest.mark.skipif(HIPCC is None, reason="hipcc not found (PATH, ROCM_PATH): "
                                 "AMD kernels cannot be compiled here (CI installs hipcc)")


def test_requested_archs_default(monkeypatch):
    monkeypatch.delenv("PYAR_GPU_ARCHS", raising=False)
    assert gpu_targets.requested_archs() == (gpu_targets.DEFAULT_CUDA_ARCHS,
                                             gpu_targets.DEFAULT_HIP_ARCHS)
    assert "sm_80" in gpu_targets.DEFAULT_CUDA_ARCHS and "sm_90" in \
        gpu_targets.DEFAULT_CUDA_ARCHS
    assert set(gpu_targets.DEFAULT_HIP_ARCHS) >= {"gfx90a", "gfx942", "gfx950"}
    monkeypatch.setenv("PYAR_GPU_ARCHS", " ; ,")
    assert gpu_targets.requested_archs() == (gpu_targets.DEFAULT_CUDA_ARCHS,
                                             gpu_targets.DEFAULT_HIP_ARCHS)


@pytest.mark.parametrize("value, expected", [
    ("sm_90", (("sm_90",), ())),
    ("gfx942", ((), ("gfx942",))),
    ("sm_80;sm_90", (("sm_80", "sm_90"), ())),
    ("sm_90, gfx90a ;gfx942", (("sm_90",), ("gfx90a", "gfx942"))),
    ("gfx950,sm_100", (("sm_100",), ("gfx950",))),
])
def test_requested_archs_override(monkeypatch, value, expected):
    monkeypatch.setenv("PYAR_GPU_ARCHS", value)
    assert gpu_targets.requested_archs() == expected


@pytest.mark.parametrize("value, bad", [("sm_90;compute_90", "compute_90"),
                                        ("hopper", "hopper"), ("gfx90a,MI300", "MI300")])
def test_requested_archs_unknown_target(monkeypatch, value, bad):
    monkeypatch.setenv("PYAR_GPU_ARCHS", value)
    with pytest.raises(SystemExit) as caught:
        gpu_targets.requested_archs()
    message = str(caught.value)
    assert "PYAR_GPU_ARCHS" in message and repr(bad) in message


def test_nvcc_command_embeds_ptx_of_the_newest_arch():
    command = cuda_compiler.nvcc_command("nvcc", "/k/a.cu", "/o/a.fatbin", ["sm_90", "sm_80"])
    assert command[:2] == ["nvcc", "--fatbin"]
    assert "-gencode=arch=compute_80,code=sm_80" in command
    assert "-gencode=arch=compute_90,code=sm_90" in command
    assert "-gencode=arch=compute_90,code=compute_90" in command
    assert command[-3:] == ["-o", "/o/a.fatbin", "/k/a.cu"]


def hipcc_is_rocm_5():
    result = subprocess.run([HIPCC, "--version"], capture_output=True, text=True,
                            env=hipcc_compiler.hip_environment())
    match = re.search(r"HIP version:\s*(\d+)\.", result.stdout)
    return bool(match) and int(match.group(1)) < 6


@needs_hipcc
def test_supported_hip_archs():
    kept = amd_compiler_choice.supported_hip_archs(HIPCC, ["gfx90a", "gfx942", "gfx950", "gfx999"])
    assert "gfx90a" in kept
    assert "gfx999" not in kept  # no such chip: every clang refuses it
    if hipcc_is_rocm_5():
        # Debian's HIP 5.2 (clang-15) knows gfx90a/gfx940 but not gfx942/gfx950.
        assert kept == ["gfx90a"]
    assert amd_compiler_choice.supported_hip_archs(HIPCC, []) == []


class FakeCompiler:
    def __init__(self, name, archs):
        self.name, self.archs = name, archs

    def short_name(self):
        return self.name


def test_each_arch_goes_to_the_first_compiler_that_builds_it(monkeypatch, capfd):
    monkeypatch.setattr(amd_compiler_choice, "probe", lambda compiler, arch, cache: None
                        if arch in compiler.archs else f"error: no {arch}")
    rocm = FakeCompiler("ROCm hipcc", {"gfx90a", "gfx942", "gfx950"})
    clang = FakeCompiler("clang++-19", {"gfx90a", "gfx942"})
    hipcc = FakeCompiler("hipcc", {"gfx90a"})
    chosen = amd_compiler_choice.assign_hip_archs([rocm, clang, hipcc], ["gfx90a", "gfx950"], "c")
    assert chosen == {"gfx90a": rocm, "gfx950": rocm}
    chosen = amd_compiler_choice.assign_hip_archs([clang, hipcc], ["gfx90a", "gfx942", "gfx950"],
                                                  "c")
    assert chosen == {"gfx90a": clang, "gfx942": clang}
    lines = capfd.readouterr().err.splitlines()[-3:]
    assert lines == ["pyar kernels: gfx90a: built by clang++-19",
                     "pyar kernels: gfx942: built by clang++-19",
                     "pyar kernels: gfx950: skipped, clang++-19: error: no gfx950; "
                     "hipcc: error: no gfx950"]


def test_amd_compilers_in_order_of_preference(monkeypatch, tmp_path):
    libs = tmp_path / "bitcode"
    libs.mkdir()
    (libs / "ockl.bc").write_bytes(b"BC")
    monkeypatch.setattr(amd_compiler_choice, "find_rocm_hipcc", lambda: "/opt/rocm/bin/hipcc")
    monkeypatch.setattr(amd_compiler_choice, "find_hip_clang", lambda: "/usr/bin/clang++-19")
    monkeypatch.setattr(amd_compiler_choice, "find_device_libs", lambda: str(libs))
    monkeypatch.setattr(amd_compiler_choice, "find_hipcc", lambda: "/usr/bin/hipcc")
    folder = tmp_path / "libs"
    folder.mkdir()
    compilers = amd_compiler_choice.amd_compilers(["gfx90a"], str(folder))
    assert [(type(c).__name__, c.path) for c in compilers] == [
        ("Hipcc", "/opt/rocm/bin/hipcc"), ("HipClang", "/usr/bin/clang++-19"),
        ("Hipcc", "/usr/bin/hipcc")]
    assert os.path.islink(folder / "ockl.bc")  # the device libraries, linked
    command = compilers[1].command("/k/a.cu", "/o/a.co", "gfx942", ["X"])
    assert f"--rocm-device-lib-path={folder}" in command and "--offload-arch=gfx942" in command
    assert compilers[1].stable(command).count("--rocm-device-lib-path=DEVICE_LIBS") == 1
    # ROCm's hipcc, also found on PATH, is listed once
    monkeypatch.setattr(amd_compiler_choice, "find_hipcc", lambda: "/opt/rocm/bin/hipcc")
    (tmp_path / "again").mkdir()
    assert [c.label for c in amd_compiler_choice.amd_compilers([], str(tmp_path / "again"))] == [
        "ROCm hipcc", "clang++-19"]
