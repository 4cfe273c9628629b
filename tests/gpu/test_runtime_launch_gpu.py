"""The runtime layer on a real GPU: code objects (from files and bytes, their
functions and globals) and kernel launch with its argument packing, grid and
block shapes, occupancy and resources.

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
Marked ``gpu``: where no GPU is visible they skip (tests/conftest.py), except
under PYAR_REQUIRE_GPU=1, where that is a failure.
"""
import os
import re
import struct

import numpy as np
import pytest

import pyar._hip as hip
from pyar import _kernels
from tests.gpu.random_data import assert_bitwise_equal, random_array
from tests.gpu.runtime_support import ROOT, device_bytes

pytestmark = pytest.mark.gpu

# pyar_test_store_args' record: u64 pointer, i64, u64, i32, u32, f32, u32 marker.
RECORD = struct.Struct("<QqQiIfI")
MARKER = 0xFEEDBEEF
STORE_ARGTYPES = ("ptr", "ptr", "int32", "int64", "uint32", "uint64", "float32")


def read_record(ptr):
    return RECORD.unpack(device_bytes(ptr, RECORD.size).tobytes())


def f32(value):
    """The float32 nearest ``value``, as a Python float (exactly representable)."""
    return float(np.float32(value))


def launch_store_args(function, record, pointer, i32, i64, u32, u64, value, stream=None):
    function.launch(1, 1, (record, pointer, i32, i64, u32, u64, value), stream=stream)
    if stream is None:
        hip.device_synchronize()
    else:
        stream.synchronize()


STORE_CASES = {
    "limits_low": (0, -2**31, -2**63, 0, 0, -0.0),
    "limits_high": (2**64 - 1, 2**31 - 1, 2**63 - 1, 2**32 - 1, 2**64 - 1, float("inf")),
    "minus_one": (1, -1, -1, 2**32 - 1, 2**64 - 1, -1.0),
    "small": (0x1000, 7, -9, 1, 2, f32(1e-45)),  # float32's smallest subnormal
    "float_extremes": (2**63, 2**31 - 2, -(2**62), 2**31, 2**63, f32(3.4028234663852886e38)),
}


@pytest.mark.parametrize("case", sorted(STORE_CASES))
def test_store_args_limits(case, rng, kernels):
    record = hip.DeviceMemory(RECORD.size)
    hip.memcpy_htod(record.ptr, random_array(rng, np.uint8, RECORD.size))
    pointer, i32, i64, u32, u64, value = STORE_CASES[case]
    kernels.store_args(record.ptr, pointer, i32, i64, u32, u64, value)
    hip.device_synchronize()
    got = device_bytes(record.ptr, RECORD.size).tobytes()
    expected = RECORD.pack(pointer, i64, u64, i32, u32, value, MARKER)
    assert got == expected, (case, RECORD.unpack(got), RECORD.unpack(expected))


def test_store_args_random(rng, kernels):
    """Random values of every type, on a created stream; the pointer argument
    given once as an int and once as an object with ``.ptr``."""
    record = hip.DeviceMemory(RECORD.size)
    target = hip.DeviceMemory(4096)
    stream = hip.Stream()
    function = kernels.module.get_function("pyar_test_store_args", STORE_ARGTYPES)
    assert function.name == "pyar_test_store_args"
    assert function.argtypes == STORE_ARGTYPES
    for round_ in range(20):
        hip.memcpy_htod(record.ptr, random_array(rng, np.uint8, RECORD.size))
        i32 = int(rng.integers(-2**31, 2**31, dtype=np.int64))
        i64 = int(rng.integers(-2**63, 2**63 - 1, dtype=np.int64))
        u32 = int(rng.integers(0, 2**32, dtype=np.uint64))
        u64 = int(rng.integers(0, 2**64 - 1, dtype=np.uint64, endpoint=True))
        value = f32(rng.standard_normal() * 10.0 ** rng.integers(-30, 30))
        pointer_obj = target if round_ % 2 else target.ptr + int(rng.integers(0, 4096))
        launch_store_args(function, record, pointer_obj, i32, i64, u32, u64, value, stream)
        expected_pointer = target.ptr if round_ % 2 else pointer_obj
        got = read_record(record.ptr)
        assert got == (expected_pointer, i64, u64, i32, u32, value, MARKER), round_


def test_store_args_numpy_scalars(rng, kernels):
    """numpy scalars pack like the Python numbers they hold."""
    record = hip.DeviceMemory(RECORD.size)
    hip.memcpy_htod(record.ptr, random_array(rng, np.uint8, RECORD.size))
    i32 = np.int32(rng.integers(-2**31, 0))
    i64 = np.int64(rng.integers(-2**63, 0))
    u32 = np.uint32(rng.integers(2**31, 2**32))
    u64 = np.uint64(rng.integers(2**63, 2**64 - 1, dtype=np.uint64))
    value = np.float32(rng.standard_normal())
    kernels.store_args(record.ptr, 0xABC0, i32, i64, u32, u64, value)
    hip.device_synchronize()
    assert read_record(record.ptr) == (0xABC0, int(i64), int(u64), int(i32), int(u32),
                                       float(value), MARKER)


def test_launch_argument_errors(rng, kernels):
    function = kernels.module.get_function("pyar_test_store_args", STORE_ARGTYPES)
    record = hip.DeviceMemory(RECORD.size)
    good = [record.ptr, 0, 1, 2, 3, 4, 5.0]

    def args_with(index, value):
        args = list(good)
        args[index] = value
        return tuple(args)

    with pytest.raises(TypeError, match="takes 7 arguments, got 6"):
        function.launch(1, 1, tuple(good[:6]))
    with pytest.raises(TypeError, match="takes 7 arguments, got 8"):
        function.launch(1, 1, tuple(good) + (1,))
    bad = [
        (2, 2**31, OverflowError), (2, -2**31 - 1, OverflowError), (2, "1", TypeError),
        (3, 2**63, OverflowError), (3, -2**63 - 1, OverflowError),
        (4, -1, OverflowError), (4, 2**32, OverflowError), (5, -1, OverflowError),
        (5, 2**64, OverflowError), (6, "x", TypeError), (6, None, TypeError),
        (0, -8, ValueError), (1, "ptr", TypeError), (1, 1.0, TypeError),
    ]
    for index, value, error in bad:
        with pytest.raises(error, match=rf"argument {index}\b") as info:
            function.launch(1, 1, args_with(index, value))
        assert STORE_ARGTYPES[index] in str(info.value), (index, value, str(info.value))
    for grid in (0, (1, 0), (1, 1, 1, 1), -1):
        with pytest.raises(ValueError):
            function.launch(grid, 1, tuple(good))
    with pytest.raises(ValueError):
        function.launch(1, 0, tuple(good))
    with pytest.raises(ValueError, match="unknown type"):
        kernels.module.get_function("pyar_test_store_args", ("ptr", "int8"))
    with pytest.raises(hip.HipError) as info:
        kernels.module.get_function("pyar_no_such_kernel", ())
    assert info.value.call == "hipModuleGetFunction"
    # The rejected launches left nothing behind: a good one still works.
    i32 = int(rng.integers(-2**31, 2**31, dtype=np.int64))
    launch_store_args(function, record, 0x4000, i32, -5, 6, 7, 0.5)
    assert read_record(record.ptr) == (0x4000, -5, 7, i32, 6, 0.5, MARKER)


def test_launch_grid_and_block_shapes(rng, kernels):
    """fill_u32 over more words than one grid pass covers, with 1-, 2- and 3-d
    dims given to the raw Function."""
    function = kernels.module.get_function("pyar_test_fill_u32", ("ptr", "uint32", "uint64"))
    n = int(rng.integers(100_000, 300_000))
    mem = hip.DeviceMemory((n + 64) * 4)
    for grid, block in ((7, 64), ((3, 1), (32, 2)), ((2, 1, 1), (16, 1, 2))):
        before = random_array(rng, np.uint32, n + 64)
        hip.memcpy_htod(mem.ptr, before)
        pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
        function.launch(grid, block, (mem.ptr, pattern, n))
        hip.device_synchronize()
        words = device_bytes(mem.ptr, (n + 64) * 4).view(np.uint32)
        assert np.all(words[:n] == pattern), (grid, block)
        # The kernel indexes with blockIdx.x/blockDim.x only, so extra y/z
        # blocks or threads rewrite the same words: exactly n words change.
        assert_bitwise_equal(words[n:], before[n:], f"past the end, {grid}x{block}")


def test_launch_rejects_float_for_integer_argument(kernels):
    """A float given for an integer parameter is a caller's mistake (numpy and
    ctypes refuse it too); packing it silently truncated would launch with a
    different value than the caller wrote."""
    function = kernels.module.get_function("pyar_test_store_args", STORE_ARGTYPES)
    record = hip.DeviceMemory(RECORD.size)
    good = [record.ptr, 0, 1, 2, 3, 4, 5.0]
    for index in (2, 3, 4, 5):  # int32, int64, uint32, uint64
        for value in (1.5, 2.0, np.float64(3.0)):
            args = list(good)
            args[index] = value
            with pytest.raises(TypeError, match=rf"argument {index}\b"):
                function.launch(1, 1, tuple(args))
    hip.device_synchronize()


def test_occupancy(kernels):
    function = kernels.module.get_function("pyar_test_spin", ("uint64",))
    blocks = function.max_active_blocks_per_multiprocessor(32)
    assert blocks >= 1
    assert function.max_active_blocks_per_multiprocessor(1024) <= blocks


def test_function_resources(kernels):
    """Registers and local (spill/stack) bytes of loaded kernels: a trivial
    kernel uses a few registers and no local memory; a row kernel of
    allreduce_rmsnorm.cu, bounded to 1024-thread blocks, fits the 64
    registers a thread such a block has on NVIDIA."""
    empty = kernels.module.get_function("pyar_test_empty").resources
    assert empty["local_bytes"] == 0 and 0 <= empty["registers"] <= 32, empty
    row = _kernels.load("allreduce_rmsnorm").get_function("pyar_add_rmsnorm_bf16_plain_p1")
    got = row.resources
    assert got["registers"] > empty["registers"], got
    if hip.platform() == "cuda":
        assert got["registers"] <= 64, got


def test_module_from_file(rng):
    path = _kernels.path("test_kernels")
    assert path.endswith(".fatbin" if hip.platform() == "cuda" else ".hsaco")
    module = hip.Module.from_file(path)
    assert module.source == path and not module.closed
    fill = module.get_function("pyar_test_fill_u32", ("ptr", "uint32", "uint64"))
    n = int(rng.integers(1000, 5000))
    pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
    with hip.DeviceMemory(n * 4) as mem:
        hip.memset(mem.ptr, 0, n * 4)
        fill.launch(-(-n // 256), 256, (mem.ptr, pattern, n))
        hip.device_synchronize()
        assert np.all(device_bytes(mem.ptr, n * 4).view(np.uint32) == pattern)
    # The module from bytes and the one from the file are separate loads.
    with open(path, "rb") as f:
        other = hip.Module.from_bytes(f.read(), source="copy")
    other.get_function("pyar_test_empty").launch(1, 1)
    hip.device_synchronize()
    other.unload()
    assert other.closed
    with pytest.raises(ValueError, match="unloaded"):
        other.get_function("pyar_test_empty")
    other.unload()  # twice is fine
    module.unload()
    with pytest.raises(FileNotFoundError):
        hip.Module.from_file(path + ".missing")
    with pytest.raises(ValueError):
        hip.Module.from_bytes(b"")
    with pytest.raises(TypeError):
        hip.Module.from_bytes("not bytes")
    with pytest.raises(hip.HipError) as info:
        hip.Module.from_bytes(b"this is not a code object\n" * 4)
    assert info.value.call == "hipModuleLoadData"


def test_get_global_allreduce_layout():
    module = _kernels.load("allreduce")
    ptr, size = module.get_global("pyar_allreduce_layout")
    assert size == 6 * 8
    assert hip.pointer_device(ptr) == hip.get_device()
    values = struct.unpack("<6Q", device_bytes(ptr, size).tobytes())
    signal_bytes, max_blocks, max_ranks, state_bytes, threads, failed_offset = values
    # Cross-check with the constants of the source the code object was built from.
    source = "\n".join(open(os.path.join(ROOT, "src", "kernels", name)).read()
                        for name in ("pyar_protocol.h", "allreduce.cu"))
    constants = {name: int(value) for name, value in
                 re.findall(r"constexpr int (k\w+) = (\d+);", source)}
    assert max_ranks == constants["kMaxRanks"] == 8
    assert max_blocks == constants["kMaxBlocks"]
    # kThreads is PYAR_THREADS, which only the host build overrides.
    assert threads == int(re.search(r"#define PYAR_THREADS (\d+)", source).group(1))
    assert threads % 32 == 0 and threads <= 1024
    # Signal holds at least the flags [phases][blocks][ranks] and epochs [blocks].
    assert signal_bytes >= 4 * max_blocks * (3 * max_ranks + 1)
    assert signal_bytes % 4 == 0
    # The host packing of CommState (pyar/comm/layout.py), loaded by path: importing
    # the pyar.comm package would initialize MPI in the test process.
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_pyar_layout_under_test", os.path.join(ROOT, "pyar", "comm", "layout.py"))
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    assert state_bytes == layout._STATE.size
    kernel_layout = layout.KernelLayout(module)
    assert (kernel_layout.signal_bytes, kernel_layout.max_blocks, kernel_layout.max_ranks,
            kernel_layout.state_bytes, kernel_layout.threads,
            kernel_layout.failed_offset) == values
    # split's kernel B reads a word inside the Signal, past the flags and epochs.
    assert 4 * max_blocks * (3 * max_ranks + 1) <= failed_offset < signal_bytes
    assert failed_offset % 4 == 0
    with pytest.raises(hip.HipError) as info:
        module.get_global("pyar_no_such_global")
    assert info.value.call == "hipModuleGetGlobal"
