"""The inter-node data path's choice and the MPI library's GPU-awareness
without a GPU (tier a): pyar.comm.inter_node's rules one rank at a time, what
pyar.diagnostics reads from this machine's MPI, and, where
$PYAR_TEST_CUDA_AWARE_MPI names a CUDA-aware Open MPI 4, that its run-time
switch is read through MPI_T (off here: no libcuda).  Under mpirun:
tests/test_hierarchical_cpu.py (tests/mpi/inter_node_cpu.py)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")

from pyar import diagnostics  # noqa: E402
from pyar.comm import inter_node  # noqa: E402
from tests.mpi_launch import CUDA_AWARE_MPI, ROOT, cuda_aware_mpi_env  # noqa: E402

AWARE = diagnostics.GpuAwareness(True, "said yes")
UNAWARE = diagnostics.GpuAwareness(False, "Open MPI v4.1.6: MPIX_Query_cuda_support() = 0")
UNSURE = diagnostics.GpuAwareness(None, "could not tell")


@pytest.mark.parametrize("asked, awareness, rail_method, path", [
    ("auto", AWARE, "auto", "device"),
    ("auto", AWARE, "allgather", "device"),
    ("auto", AWARE, "reduce_scatter", "host"),
    ("auto", UNAWARE, "auto", "host"),
    ("auto", UNSURE, "auto", "host"),
    ("host", AWARE, "auto", "host"),
    ("host", AWARE, "reduce_scatter", "host"),
    ("device", AWARE, "auto", "device"),
    ("device", AWARE, "allgather", "device"),
])
def test_the_path_taken(asked, awareness, rail_method, path):
    assert inter_node.resolve(asked, awareness, rail_method) == path


@pytest.mark.parametrize("awareness", [UNAWARE, UNSURE])
def test_device_without_a_known_gpu_aware_mpi_is_refused(awareness):
    with pytest.raises(ValueError, match="not known to take them") as raised:
        inter_node.resolve("device", awareness)
    assert awareness.why in str(raised.value) and "inter_node='host'" in str(raised.value)


def test_device_with_reduce_scatter_is_refused():
    with pytest.raises(ValueError, match="'allgather'"):
        inter_node.resolve("device", AWARE, "reduce_scatter")


def test_requested_from_the_argument_then_the_variable(monkeypatch):
    monkeypatch.delenv(inter_node.INTER_NODE, raising=False)
    assert inter_node.requested() == "auto"
    monkeypatch.setenv(inter_node.INTER_NODE, " device ")
    assert inter_node.requested() == "device"
    assert inter_node.requested("host") == "host"
    monkeypatch.setenv(inter_node.INTER_NODE, "gpu")
    with pytest.raises(ValueError, match="PYAR_INTER_NODE='gpu'"):
        inter_node.requested()
    with pytest.raises(ValueError, match="inter_node: .* got 'Device'"):
        inter_node.requested("Device")


def test_open_mpi_major_version():
    assert diagnostics._open_mpi_major("Open MPI v5.0.3, package: Open MPI x") == 5
    assert diagnostics._open_mpi_major("Open MPI v4.1.6, package: Debian OpenMPI") == 4
    assert diagnostics._open_mpi_major("MPICH Version: 4.2.0") == 0


def test_this_machines_mpi_is_not_taken_for_gpu_aware():
    """Debian's Open MPI 4.1 is built without CUDA: a definite "no" for CUDA
    (its query answers 0), and for ROCm "no", or "unsure" where the library
    has no ROCm query (Open MPI 4)."""
    cuda = diagnostics.mpi_gpu_awareness("cuda")
    assert cuda.aware is False, cuda
    assert "MPIX_Query_cuda_support() = 0" in cuda.why
    assert diagnostics.mpi_gpu_awareness("hip").aware is not True


def test_open_mpi_4_run_time_switch_is_read():
    """The CUDA-aware Open MPI 4 answers MPIX_Query_cuda_support() = 1 from
    how it was built; the answer must come from opal_cuda_support, read
    through MPI_T: off on a machine without libcuda even when asked for, and
    off when turned off."""
    env = cuda_aware_mpi_env()
    if env is None:
        pytest.skip(f"{CUDA_AWARE_MPI} is not set: no CUDA-aware Open MPI to read")
    probe = ("from pyar import diagnostics\n"
             "print(repr(diagnostics.mpi_gpu_awareness('cuda')))\n")
    for switch in ("1", "0"):
        run_env = {**os.environ, **env, "OMPI_MCA_opal_cuda_support": switch,
                   "OMPI_MCA_opal_warn_on_missing_libcuda": "0"}
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env=run_env)
        assert done.returncode == 0, done.stderr
        said = done.stdout.strip().splitlines()[-1]
        assert "MPIX_Query_cuda_support() = 1 (built with CUDA)" in said, said
        assert "control variable opal_cuda_support = 0" in said and "aware=False" in said, said
