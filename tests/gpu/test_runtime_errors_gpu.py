"""The runtime layer on a real GPU: errors (HipError's fields and pickling) and
the runtime working on after them, in a child process and in this one.

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
Marked ``gpu``: where no GPU is visible they skip (tests/conftest.py), except
under PYAR_REQUIRE_GPU=1, where that is a failure.
"""
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pyar._hip as hip
from tests.gpu.runtime_support import ROOT, device_bytes

pytestmark = pytest.mark.gpu


_BAD_CALL = r"""
import json, pickle, sys
import numpy as np
import pyar._hip as hip
mem = hip.DeviceMemory(1 << 16)
hip.memcpy_htod(mem.ptr, np.arange(1 << 14, dtype=np.uint32))
result = {}
try:
    hip.memcpy_dtod(8, mem.ptr, 1 << 16)
except hip.HipError as error:
    copy = pickle.loads(pickle.dumps(error))
    result = dict(status=error.status, name=error.name, call=error.call,
                  message=error.message, text=str(error), is_runtime=isinstance(error, RuntimeError),
                  pickled=[copy.status, copy.name, copy.call, copy.message, str(copy)])
else:
    result = dict(status=None)
# The runtime still works: allocate, launch, copy, synchronize.
from tests.gpu_kernels import GpuTestKernels
k = GpuTestKernels()
other = hip.DeviceMemory(1 << 16)
hip.memcpy_dtod(other.ptr, mem.ptr, 1 << 16)
k.fill_u32(mem.ptr, 0x12345678, 16)
hip.device_synchronize()
back = np.empty(1 << 14, np.uint32)
hip.memcpy_dtoh(back, other.ptr)
result["after_ok"] = bool(np.array_equal(back, np.arange(1 << 14, dtype=np.uint32)))
head = np.empty(16, np.uint32)
hip.memcpy_dtoh(head, mem.ptr)
result["after_kernel_ok"] = bool(np.all(head == 0x12345678))
print("RESULT " + json.dumps(result))
"""


def test_hip_error_on_bad_copy():
    """A copy to address 8 raises HipError with status, name, call and message;
    it pickles; and the process's runtime works afterwards (no sticky error).
    Run in a child so that a driver which poisons the context cannot take the
    rest of the suite with it."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", _BAD_CALL], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"child failed:\n{done.stdout}\n{done.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["status"] is not None, "memcpy_dtod to address 8 did not raise"
    assert isinstance(result["status"], int) and result["status"] != 0
    assert result["call"] == "hipMemcpy"
    assert result["name"].startswith("CUDA_ERROR_" if hip.platform() == "cuda" else "hipError")
    assert result["message"]
    assert result["is_runtime"]
    assert result["name"] in result["text"] and "hipMemcpy" in result["text"]
    assert result["pickled"] == [result["status"], result["name"], result["call"],
                                 result["message"], result["text"]]
    assert result["after_ok"] and result["after_kernel_ok"], result


def test_hip_error_in_process_then_recovers(rng, kernels):
    """Failures that leave the context usable, in this process: the next calls succeed."""
    with pytest.raises(hip.HipError) as info:
        kernels.module.get_function("pyar_missing_" + str(int(rng.integers(1 << 30))))
    error = info.value
    assert error.status != 0 and error.name and error.message
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.status, copy.name, copy.call, copy.message) == (
        error.status, error.name, error.call, error.message)
    with pytest.raises(hip.HipError) as info:
        hip.pointer_device(0x10)  # not a device address
    assert info.value.call == "hipPointerGetAttribute"
    n = int(rng.integers(1, 5000))
    pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
    with hip.DeviceMemory(n * 4) as mem:
        kernels.fill_u32(mem.ptr, pattern, n)
        hip.device_synchronize()
        assert np.all(device_bytes(mem.ptr, n * 4).view(np.uint32) == pattern)
