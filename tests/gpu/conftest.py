"""Fixtures the GPU tests share."""
import os
import zlib

import numpy as np
import pytest

from tests.gpu_kernels import GpuTestKernels


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
