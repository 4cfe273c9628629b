"""What pyar says on a GPU machine: ``python -m pyar`` finds the device and
its kernels, and ranks sharing an NVIDIA GPU without MPS get one message and
a non-zero exit, from the examples' check and from Communicator() itself."""
import os
import subprocess
import sys

import pytest

from tests.mpi_launch import ROOT, mpirun_command

pytestmark = pytest.mark.gpu

MPI_ENV = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", PYTHONUNBUFFERED="1")


def run(command, env=None, timeout=300):
    full = dict(os.environ, PYTHONPATH=ROOT, **MPI_ENV)
    full.update(env or {})
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=full)


def platform():
    done = run([sys.executable, "-c", "import pyar; print(pyar.platform())"])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_python_m_pyar_finds_the_gpu_and_its_kernels():
    done = run([sys.executable, "-m", "pyar"])
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "devices: " in out and "devices: none" not in out
    assert "kernels for it: yes" in out and "kernels for it: NO" not in out
    assert out.rstrip().endswith("ready")


@pytest.fixture
def no_mps(tmp_path):
    """One GPU for every rank, and an MPS pipe directory where no daemon listens."""
    if platform() != "cuda":
        pytest.skip("MPS is NVIDIA's; ROCm runs processes on one GPU side by side")
    return {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0"}


def test_example_refuses_a_shared_gpu_without_mps_once(no_mps):
    done = run(mpirun_command(2) + [sys.executable, "examples/allreduce.py", "--size", "64K"],
               env=no_mps)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert output.count("pyar cannot run here") == 1, output
    assert "2 ranks share GPU" in output and "nvidia-cuda-mps-control -d" in output
    assert "Traceback" not in output


COMMUNICATOR_WITHOUT_MPS = """
from mpi4py import MPI
import pyar
from pyar import diagnostics
try:
    pyar.Communicator(MPI.COMM_WORLD)
except diagnostics.NotReady as problem:
    print("REFUSED", MPI.COMM_WORLD.Get_rank(), str(problem).splitlines()[0], flush=True)
else:
    print("ACCEPTED", MPI.COMM_WORLD.Get_rank(), flush=True)
"""


def test_communicator_refuses_a_shared_gpu_without_mps_on_every_rank(no_mps):
    done = run(mpirun_command(2) + [sys.executable, "-c", COMMUNICATOR_WITHOUT_MPS], env=no_mps)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith(("REFUSED",
                                                                                 "ACCEPTED")))
    assert [line.split()[:2] for line in lines] == [["REFUSED", "0"], ["REFUSED", "1"]], lines
    # The positive control: allowed explicitly, the same ranks build the communicator.
    done = run(mpirun_command(2) + [sys.executable, "-c", COMMUNICATOR_WITHOUT_MPS],
               env=dict(no_mps, PYAR_REQUIRE_MPS="0"))
    assert done.stdout.split().count("ACCEPTED") == 2, done.stdout + done.stderr
