"""IPC memory handles on a real GPU: the handle of a pointer inside an
allocation, pickling, a garbage handle, and the two-process exchange of
tests/mpi/ipc_pair.py under mpirun (both ranks on GPU 0)."""
import os
import pickle
import shutil

import numpy as np
import pytest

import pyar._hip as hip
from tests.mpi_launch import run_scenario

pytestmark = pytest.mark.gpu


def test_handle_of_interior_pointer(rng):
    nbytes = int(rng.integers(1 << 20, 4 << 20))
    memory = hip.DeviceMemory(nbytes)
    offset = int(rng.integers(1, nbytes // 16)) * 16
    handle = hip.ipc_get_handle(memory.ptr + offset)
    assert isinstance(handle, hip.IpcHandle)
    assert len(handle.handle) == 64
    assert handle.offset == offset
    assert handle.size == hip.address_range(memory.ptr)[1] >= nbytes
    base_handle = hip.ipc_get_handle(memory)  # an object with .ptr
    assert base_handle.offset == 0 and base_handle.handle == handle.handle
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and hash(copy) == hash(handle) and copy is not handle
    assert copy != base_handle
    other = hip.DeviceMemory(nbytes)
    assert hip.ipc_get_handle(other.ptr).handle != handle.handle
    with pytest.raises(ValueError):
        hip.IpcHandle(b"\0" * 63, 0, 1)
    with pytest.raises(ValueError):
        hip.IpcHandle(b"\0" * 64, 2, 1)  # offset past the end
    with pytest.raises(TypeError):
        hip.IpcHandle(bytearray(64), 0, 1)
    with pytest.raises(TypeError):
        hip.ipc_open(("not", "a", "handle"))


def test_garbage_handle_raises(rng):
    garbage = hip.IpcHandle(rng.integers(0, 256, 64, dtype=np.uint8).tobytes(), 0, 1 << 20)
    with pytest.raises(hip.HipError) as info:
        hip.ipc_open(garbage)
    assert info.value.call == "hipIpcOpenMemHandle"
    assert info.value.status != 0
    zeros = hip.IpcHandle(bytes(64), 0, 1 << 20)
    with pytest.raises(hip.HipError):
        hip.ipc_open(zeros)
    # The failures left nothing behind.
    with hip.DeviceMemory(4096) as memory:
        data = rng.integers(0, 256, 4096, dtype=np.uint8)
        hip.memcpy_htod(memory.ptr, data)
        back = np.empty_like(data)
        hip.memcpy_dtoh(back, memory.ptr)
        assert np.array_equal(back, data)


@pytest.mark.skipif(shutil.which("mpirun") is None and shutil.which("mpiexec") is None
                    and os.environ.get("PYAR_REQUIRE_GPU") != "1",
                    reason="mpirun not installed")
def test_ipc_between_two_processes(rng):
    if os.environ.get("PYAR_REQUIRE_GPU") != "1":  # on the GPU runner nothing skips
        pytest.importorskip("mpi4py")
    seed = int(rng.integers(0, 2**31))
    _, results = run_scenario("ipc_pair", 2, seed, timeout=300)
    rows = [r for r in results if r.get("test") == "ipc"]
    assert sorted(r["rank"] for r in rows) == [0, 1], results
    for row in rows:
        assert row["ok"], row
        assert row["seed"] == seed
        assert not row["failures"]
        assert row["exported_offset"] > 0  # base + offset, not the base
