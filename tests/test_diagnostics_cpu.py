"""pyar.diagnostics and python -m pyar without a GPU: the code-object
readers, the arch and MPS checks, and the one-message exit of the examples
on this machine (Debian's libamdhip64 answers hipErrorNoDevice)."""
import os
import struct
import subprocess
import sys

import pytest

from pyar import diagnostics
from pyar._kernels import targets
from tests.mpi_launch import ROOT, mpirun_command


def fatbin(entries):
    """A fatbin container of (kind, sm number) entries with empty payloads."""
    body = b""
    for kind, arch in entries:
        header = bytearray(64)
        struct.pack_into("<HHIQ", header, 0, kind, 0, 64, 0)
        struct.pack_into("<I", header, 28, arch)
        body += bytes(header)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def bundle(triples):
    """A clang offload bundle naming ``triples``, with empty code objects."""
    data = b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(triples))
    for triple in triples:
        data += struct.pack("<QQQ", 0, 0, len(triple)) + triple.encode()
    return data


def test_fatbin_targets_and_what_runs_where():
    found = targets.fatbin_targets(fatbin([(2, 80), (2, 90), (1, 90)]))
    assert found == [("elf", "sm_80"), ("elf", "sm_90"), ("ptx", "sm_90")]
    assert targets.cuda_runs_on(found, "sm_90")
    assert targets.cuda_runs_on(found, "sm_86")          # sm_80 code, same major
    assert targets.cuda_runs_on(found, "sm_100")         # compute_90 PTX, JIT-compiled
    assert not targets.cuda_runs_on(found, "sm_75")
    assert not targets.cuda_runs_on([("elf", "sm_90")], "sm_100")  # no PTX, newer major
    with pytest.raises(ValueError, match="not a fatbin"):
        targets.fatbin_targets(b"\x7fELF" + bytes(60))


def test_bundle_targets_and_what_runs_where():
    found = targets.bundle_targets(bundle(["host-x86_64-unknown-linux-gnu-",
                                           "hipv4-amdgcn-amd-amdhsa--gfx90a",
                                           "hipv4-amdgcn-amd-amdhsa--gfx942:xnack-"]))
    assert found == ["gfx90a", "gfx942:xnack-"]
    assert targets.hip_runs_on(found, "gfx942:sramecc+:xnack-")
    assert not targets.hip_runs_on(found, "gfx950")
    with pytest.raises(ValueError, match="not a clang offload bundle"):
        targets.bundle_targets(b"garbage")


def test_mps_is_seen_by_its_pipes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not diagnostics.mps_running()
    (tmp_path / "log").write_text("a plain file is not a daemon")
    assert not diagnostics.mps_running()
    os.mkfifo(tmp_path / "control")
    assert diagnostics.mps_running()


def test_sharing_a_gpu_without_mps_is_refused_on_nvidia(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.delenv("PYAR_REQUIRE_MPS", raising=False)
    monkeypatch.setattr(diagnostics._hip, "platform", lambda: "cuda")
    diagnostics.require_mps(["0000:01:00.0", "0000:02:00.0"])   # a GPU each: fine
    with pytest.raises(diagnostics.NotReady) as raised:
        diagnostics.require_mps(["0000:01:00.0"] * 3)
    text = str(raised.value)
    assert "3 ranks share GPU 0000:01:00.0" in text and "nvidia-cuda-mps-control -d" in text
    monkeypatch.setenv("PYAR_REQUIRE_MPS", "0")
    diagnostics.require_mps(["0000:01:00.0"] * 3)
    monkeypatch.delenv("PYAR_REQUIRE_MPS")
    os.mkfifo(tmp_path / "control")
    diagnostics.require_mps(["0000:01:00.0"] * 3)
    monkeypatch.setattr(diagnostics._hip, "platform", lambda: "hip")
    os.unlink(tmp_path / "control")
    diagnostics.require_mps(["0000:01:00.0"] * 3)    # ROCm runs processes side by side


def test_not_ready_pickles_whole():
    import pickle
    problem = diagnostics.NotReady("found", "needs", "fix")
    again = pickle.loads(pickle.dumps(problem))
    assert (again.found, again.needs, again.fix) == ("found", "needs", "fix")
    assert str(again) == str(problem)


def no_gpu_runtime():
    """Why pyar sees no GPU here, or None when it does see one."""
    try:
        diagnostics.require_gpu()
    except diagnostics.NotReady as problem:
        return problem
    return None


needs_no_gpu = pytest.mark.skipif(no_gpu_runtime() is None, reason="a GPU is visible here")


@needs_no_gpu
def test_python_m_pyar_reports_without_a_gpu():
    done = subprocess.run([sys.executable, "-m", "pyar"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    out = done.stdout
    for expected in ("pyar 0.", "runtime:", "devices: none", "code objects allreduce:",
                     "MPI: ", "GPU-aware:", "MPS: ", "not ready:", "pyar needs:", "fix:"):
        assert expected in out, (expected, out)
    assert "Traceback" not in out + done.stderr


def test_python_m_pyar_without_a_runtime():
    env = dict(os.environ, PYAR_PLATFORM="cuda", PYAR_CUDA_LIBRARY="/nonexistent/libcuda.so.1")
    done = subprocess.run([sys.executable, "-m", "pyar"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runtime: none" in done.stdout
    assert "no GPU runtime library could be loaded" in done.stdout
    assert "/nonexistent/libcuda.so.1" in done.stdout and "fix: install the GPU driver" in done.stdout


def test_runtime_version_as_people_write_it(monkeypatch):
    monkeypatch.setattr(diagnostics._hip, "runtime_version", lambda: 50221153)
    monkeypatch.setattr(diagnostics._hip, "platform", lambda: "hip")
    assert diagnostics.runtime_version_text() == "5.2.21153 (50221153)"
    monkeypatch.setattr(diagnostics._hip, "runtime_version", lambda: 13000)
    monkeypatch.setattr(diagnostics._hip, "platform", lambda: "cuda")
    assert diagnostics.runtime_version_text() == "13.0 (13000)"


@needs_no_gpu
def test_example_without_a_gpu_says_so_once_and_fails():
    env = dict(os.environ, PYTHONPATH=ROOT, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    done = subprocess.run(mpirun_command(3) + [sys.executable, "examples/allreduce.py",
                                               "--size", "64K"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert output.count("pyar cannot run here") == 1, output
    assert "pyar needs:" in output and "fix:" in output
    assert "Traceback" not in output
