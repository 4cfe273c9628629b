"""Fixtures the GPU tests share."""
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from tests.gpu_kernels import GpuTestKernels
from tests.mpi_launch import ROOT

REQUIRE_GPU = os.environ.get("PYAR_REQUIRE_GPU") == "1"


@pytest.fixture
def seed(request):
    """Differs per test (its id) and per run when PYAR_TEST_SEED is set."""
    base = int(os.environ.get("PYAR_TEST_SEED", "0"))
    return (zlib.crc32(request.node.nodeid.encode()) ^ base) & 0xFFFFFFFF


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def kernels():
    return GpuTestKernels()


def _device_platform_and_arch():
    # In a subprocess, like conftest's probe: the test process itself stays
    # off the GPU (the scenarios' ranks share it under MPS).
    probe = "import pyar\nprint(pyar.platform(), pyar.Device(0).arch)\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2:
        raise AssertionError(f"cannot read the GPU's arch:\n{done.stdout}\n{done.stderr}")
    return words[0], words[1].split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"


def _unavailable(reason):
    if REQUIRE_GPU:
        pytest.fail(reason)
    pytest.skip(reason)


# Rank 1's blocks start reading 50 us after the start barrier (pyar_protocol.h).
LAG = ("PYAR_TEST_LAG_RANK=1", "PYAR_TEST_LAG_NS=50000")
# The positive controls' test-only kernel builds: fixture name -> defines.
CONTROL_BUILDS = {
    "control_kernels": ("PYAR_TEST_SKIP_EXIT_BARRIER", "PYAR_TEST_SKIP_MID_BARRIER"),
    "start_control_kernels": ("PYAR_TEST_SKIP_PHASE=kStart",),
    "signature_control_kernels": ("PYAR_TEST_IGNORE_SIGNATURE=1",),
    # The last rank's late copy also waits 20 us, so its peers read its scratch
    # before the copy lands.
    "stage_control_kernels": ("PYAR_TEST_STAGE_MUTATION=kStageAfterStart",
                              "PYAR_TEST_STAGE_DELAY_NS=20000"),
    "lagging_kernels": LAG,
    "lagging_control_kernels": ("PYAR_TEST_SKIP_EXIT_BARRIER", "PYAR_TEST_SKIP_MID_BARRIER",
                                *LAG),
    "lamport_control_kernels": ("PYAR_TEST_LAMPORT_KEEP_DATA=1",),
    # pyar_ll.h's mutation, which the host build sets from a variable, is a
    # constant here; the enumerator resolves inside namespace pyar.
    # The last rank lags 50 us between its pushes and its takes in every call
    # (PYAR_TEST_READER_DELAY_NS): its peers start their next call meanwhile.
    "ll_control_kernels": ("PYAR_TEST_LL_MUTATION=kLLOneGeneration",
                           "PYAR_TEST_READER_DELAY_NS=50000"),
    "ll_lagging_kernels": ("PYAR_TEST_READER_DELAY_NS=50000",),
}
# The code objects a Communicator loads (by these names, from kernels=DIR).
CONTROL_SOURCES = ("allreduce", "allreduce_rmsnorm", "shards")


def build_controls(out_dir, platform, arch, defines):
    """src/kernels/allreduce.cu, allreduce_rmsnorm.cu and shards.cu built into
    ``out_dir`` for ``arch`` with the test-only ``defines``."""
    sys.path.insert(0, ROOT)
    from kernel_build import cuda_compiler, hipcc_compiler

    env = None
    if platform == "cuda":
        compiler = cuda_compiler.find_nvcc()
        if compiler is None:
            _unavailable("nvcc not found (PATH, CUDA_HOME, /usr/local/cuda, the nvidia-cuda-nvcc "
                         "wheel): cannot build the "
                         "positive control's kernels")
        command, suffix = cuda_compiler.nvcc_command, ".fatbin"
    else:
        compiler = hipcc_compiler.find_hipcc()
        if compiler is None:
            _unavailable("hipcc not found: cannot build the positive control's kernels")
        command, suffix = hipcc_compiler.hipcc_command, ".hsaco"
        env = hipcc_compiler.hip_environment()
    os.makedirs(out_dir, exist_ok=True)
    builds = []
    for kernel in CONTROL_SOURCES:
        source = os.path.join(ROOT, "src", "kernels", kernel + ".cu")
        output = os.path.join(out_dir, kernel + suffix)
        line = command(compiler, source, output, (arch,), defines)
        builds.append((line, output, subprocess.Popen(
            line, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)))
    for line, output, process in builds:
        log, _ = process.communicate(timeout=900)
        assert process.returncode == 0, f"{' '.join(line)}\n{log}"
        assert os.path.getsize(output) > 0
    return str(out_dir)


def _build_control_kernels(tmp_path_factory, name, defines):
    """The control build ``name`` for this GPU; pass it as Communicator(kernels=...).
    ``$PYAR_CONTROL_KERNELS/<name>``, when it holds every code object, is used
    as it is: the GPU machine's time is scarce, and these can be built
    elsewhere from the same sources (``python -m tests.gpu.conftest DIR ARCH``)."""
    prebuilt = os.path.join(os.environ.get("PYAR_CONTROL_KERNELS", ""), name)
    if os.environ.get("PYAR_CONTROL_KERNELS") and all(
            os.path.exists(os.path.join(prebuilt, kernel + ".fatbin"))
            for kernel in CONTROL_SOURCES):
        return prebuilt
    platform, arch = _device_platform_and_arch()
    return build_controls(str(tmp_path_factory.mktemp(name)), platform, arch, defines)


@pytest.fixture(scope="session")
def kernels_without_exit_barrier(tmp_path_factory):
    """The kernels without the barrier after which peers stop reading a rank's input
    (PYAR_TEST_SKIP_EXIT_BARRIER: one-shot, one-stage, reduce_scatter and all_gather;
    PYAR_TEST_SKIP_MID_BARRIER: two-stage), once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "control_kernels",
                                  CONTROL_BUILDS["control_kernels"])


@pytest.fixture(scope="session")
def kernels_with_a_lagging_rank(tmp_path_factory):
    """The shipped kernels with rank 1 reading 50 us after the start barrier
    (PYAR_TEST_LAG_RANK), once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "lagging_kernels",
                                  CONTROL_BUILDS["lagging_kernels"])


@pytest.fixture(scope="session")
def lagging_kernels_without_exit_barrier(tmp_path_factory):
    """kernels_without_exit_barrier with rank 1 lagging like kernels_with_a_lagging_rank,
    once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "lagging_control_kernels",
                                  CONTROL_BUILDS["lagging_control_kernels"])


@pytest.fixture(scope="session")
def kernels_without_start_barrier(tmp_path_factory):
    """The kernels without the start barrier (PYAR_TEST_SKIP_PHASE=kStart), once per pytest
    run."""
    return _build_control_kernels(tmp_path_factory, "start_control_kernels",
                                  CONTROL_BUILDS["start_control_kernels"])


@pytest.fixture(scope="session")
def kernels_keeping_lamport_data(tmp_path_factory):
    """The kernels whose lamport reader leaves every pack it took in its slot
    (PYAR_TEST_LAMPORT_KEEP_DATA=1): the slots' positive control, once per
    pytest run."""
    return _build_control_kernels(tmp_path_factory, "lamport_control_kernels",
                                  CONTROL_BUILDS["lamport_control_kernels"])


@pytest.fixture(scope="session")
def kernels_with_one_ll_generation(tmp_path_factory):
    """The kernels whose LL all-reduce uses one generation of receive slots for
    every call (PYAR_TEST_LL_MUTATION=kLLOneGeneration), with the last rank a
    lagging reader: LL's positive control, once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "ll_control_kernels",
                                  CONTROL_BUILDS["ll_control_kernels"])


@pytest.fixture(scope="session")
def ll_kernels_with_a_lagging_reader(tmp_path_factory):
    """The shipped LL all-reduce (two generations) with the last rank a lagging
    reader (PYAR_TEST_READER_DELAY_NS): the load of LL's positive control,
    which these kernels must pass, once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "ll_lagging_kernels",
                                  CONTROL_BUILDS["ll_lagging_kernels"])


@pytest.fixture(scope="session")
def kernels_ignoring_signatures(tmp_path_factory):
    """The kernels whose start barrier does not compare the ranks' call signatures
    (PYAR_TEST_IGNORE_SIGNATURE=1): the mismatch tests' positive control, once per pytest
    run."""
    return _build_control_kernels(tmp_path_factory, "signature_control_kernels",
                                  CONTROL_BUILDS["signature_control_kernels"])


@pytest.fixture(scope="session")
def kernels_staging_after_start(tmp_path_factory):
    """The kernels that copy a staged input into the scratch after their start barrier
    instead of before it (PYAR_TEST_STAGE_MUTATION=kStageAfterStart): the staging copy's
    positive control, once per pytest run."""
    return _build_control_kernels(tmp_path_factory, "stage_control_kernels",
                                  CONTROL_BUILDS["stage_control_kernels"])


if __name__ == "__main__":
    # python -m tests.gpu.conftest DIR ARCH: every control build for an NVIDIA ARCH (sm_90)
    # into DIR/<name>, for PYAR_CONTROL_KERNELS.
    for control, control_defines in CONTROL_BUILDS.items():
        print(build_controls(os.path.join(sys.argv[1], control), "cuda", sys.argv[2],
                             control_defines), flush=True)
