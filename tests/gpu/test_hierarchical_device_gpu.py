"""The hierarchical all-reduce's device data path (pyar.comm.inter_node:
device pointers straight to MPI) on a real GPU, nodes simulated with
node_size, every rank on GPU 0 under MPS on the one-GPU machine.

It needs a CUDA-aware MPI: $PYAR_TEST_CUDA_AWARE_MPI names the prefix of an
Open MPI 4.1 built --with-cuda (scripts/cuda_aware_openmpi.sh of the mpi
branch builds /opt/pyar-ompi-cuda); the worlds run under its mpirun, with
device buffers on (tests.mpi_launch.cuda_aware_mpi_env).  Without it these
tests skip.  The rail kernel's arithmetic alone: test_rail_kernel_gpu.py."""
import pytest

from tests.gpu.scenarios import rows_of, scenario
from tests.mpi_launch import CUDA_AWARE_MPI, cuda_aware_mpi_env

pytestmark = pytest.mark.gpu

# world -> node sizes: 8 = 2x4 and 4x2, 4 = 2x2, 3 = 3x1 (domains of one rank
# send their own 16-bit elements).
SHAPES = {8: (4, 2), 4: (2,), 3: (1,)}


@pytest.fixture(scope="module")
def mpi_env():
    env = cuda_aware_mpi_env()
    if env is None:
        pytest.skip(f"{CUDA_AWARE_MPI} is not set: the device data path needs a CUDA-aware "
                    "MPI (e.g. PYAR_TEST_CUDA_AWARE_MPI=/opt/pyar-ompi-cuda)")
    return env


@pytest.mark.parametrize("world", sorted(SHAPES))
def test_device_path_gives_the_host_paths_bits(world, mpi_env):
    """"auto" takes the device path under the CUDA-aware MPI; random
    per-rank inputs in every dtype, counts 1, 7, 4095, 40001 and 1M+3, many
    pieces per call: within tolerance of float64, bitwise identical on every
    rank, and bitwise equal to the host path's result; registered in place
    gives the same bits."""
    rows = rows_of(scenario("hierarchical", world, "paths", *SHAPES[world], timeout=240,
                            env=mpi_env), "hierarchical-paths")
    assert {r["shape"] for r in rows} == {f"{world // k}x{k}" for k in SHAPES[world]}
    for row in rows:
        assert row["inter_node"] == "device", row
        assert row["calls"] >= 3 * 5 * 2, row
        assert row["mismatches"] == 0 and row["path_differences"] == 0, row


def test_a_rank_on_another_node_that_never_calls(mpi_env):
    """Device path, 2x2: the last rank skips a call; every other rank raises
    CollectiveTimeout within the timeout (plus slack), its own node's from
    the kernel, the other node's from the inter-node all-gather on device
    buffers, which is abandoned with its buffers kept."""
    row = rows_of(scenario("hierarchical", 4, "timeout", 2, timeout=180,
                           env=dict(mpi_env, PYAR_INTER_NODE="device")),
                  "hierarchical-timeout")[0]
    assert row["inter_node"] == "device", row
    assert row["raised"] == row["expected"] == 3, row
    assert row["elapsed"] < row["timeout"] + 10, row
