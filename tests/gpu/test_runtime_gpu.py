"""The runtime layer on a real GPU: devices, code objects, kernel launch and
argument packing, memory and copies, streams and events, errors.

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
"""
import json
import operator
import os
import pickle
import re
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pyar._hip as hip
from pyar import _kernels
from tests.gpu.random_data import assert_bitwise_equal, random_array

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.float64, np.int8, np.uint8, np.int16, np.uint16,
          np.int32, np.uint32, np.int64, np.uint64, np.bool_]
SIZES = [1, 7, 4095, (1 << 20) + 3]

# pyar_test_store_args' record: u64 pointer, i64, u64, i32, u32, f32, u32 marker.
RECORD = struct.Struct("<QqQiIfI")
MARKER = 0xFEEDBEEF
STORE_ARGTYPES = ("ptr", "ptr", "int32", "int64", "uint32", "uint64", "float32")


# --- helpers ----------------------------------------------------------------------


def device_bytes(ptr, nbytes, stream=None):
    out = np.empty(nbytes, np.uint8)
    hip.memcpy_dtoh(out, ptr, stream=stream)
    if stream is not None:
        hip.as_stream(stream).synchronize()
    return out


def read_record(ptr):
    return RECORD.unpack(device_bytes(ptr, RECORD.size).tobytes())


def f32(value):
    """The float32 nearest ``value``, as a Python float (exactly representable)."""
    return float(np.float32(value))


# --- devices ----------------------------------------------------------------------

def test_device_identity():
    count = hip.get_device_count()
    assert count >= 1
    platform = hip.platform()
    assert platform in ("cuda", "hip")
    assert os.path.basename(hip.library_path())
    current = hip.get_device()
    assert 0 <= current < count
    assert hip.Device().ordinal == current
    for ordinal in range(count):
        device = hip.Device(ordinal)
        assert device.name.strip(), f"device {ordinal} has an empty name"
        arch = device.arch
        if platform == "cuda":
            assert re.fullmatch(r"sm_\d{2,3}[a-z]?", arch), arch
            major, minor = device.compute_capability
            assert arch.startswith(f"sm_{major}{minor}"), (arch, major, minor)
            assert device.warp_size == 32
        else:
            assert re.fullmatch(r"gfx[0-9a-f]{3,4}", arch.split(":")[0]), arch
            assert device.warp_size in (32, 64)
        assert device.multiprocessor_count > 0
        assert device.max_threads_per_block >= 256
        assert device.max_shared_memory_per_block >= 16 * 1024
        assert device.l2_cache_size > 0
        assert re.fullmatch(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]",
                            device.pci_bus_id), device.pci_bus_id
        free, total = device.memory_info()
        assert 0 < free <= total, (free, total)
        assert total >= 1 << 30
        assert repr(device).startswith(f"<pyar.Device {ordinal}:")
        assert operator.index(device) == ordinal
    bus_ids = {hip.Device(i).pci_bus_id for i in range(count)}
    assert len(bus_ids) == count, "two devices report the same PCI bus id"
    hip.set_device(current)
    assert hip.get_device() == current


def test_device_ordinal_validation():
    count = hip.get_device_count()
    with pytest.raises(ValueError, match="out of range"):
        hip.Device(count)
    with pytest.raises(ValueError):
        hip.set_device(-1)
    with pytest.raises(TypeError):
        hip.Device("0")
    assert hip.driver_version() > 0
    assert hip.runtime_version() > 0


def test_memory_info_sees_an_allocation(rng):
    device = hip.Device()
    nbytes = int(rng.integers(512, 1024)) << 20  # 0.5-1 GiB: far above allocator noise
    free_before, total = device.memory_info()
    with hip.DeviceMemory(nbytes) as mem:
        free_during, total_during = device.memory_info()
        assert total_during == total
        assert mem.ptr != 0 and mem.size == nbytes and not mem.closed
        # Other processes may allocate meanwhile; only a drop of at least most of
        # the allocation is checked.
        assert free_before - free_during >= nbytes // 2, (free_before, free_during, nbytes)
    assert mem.closed and mem.ptr == 0


# --- code objects and launch --------------------------------------------------------

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


# --- memory and copies ---------------------------------------------------------------

@pytest.mark.parametrize("count", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_device_memory(dtype, count, rng):
    host = random_array(rng, dtype, (count,))
    mem = hip.DeviceMemory(host.nbytes)
    assert mem.size == host.nbytes
    assert hip.pointer_device(mem.ptr) == mem.device == hip.get_device()
    hip.memcpy_htod(mem.ptr, host)
    back = np.empty_like(host)
    hip.memcpy_dtoh(back, mem)  # an object with .ptr works as the address
    assert_bitwise_equal(back, host, f"{np.dtype(dtype).name}[{count}]")
    mem.free()
    mem.free()


@pytest.mark.parametrize("uncached", [False, True])
def test_device_memory_basics(uncached, rng):
    nbytes = int(rng.integers(1, 1 << 16)) * 16 + int(rng.integers(1, 16))
    mem = hip.DeviceMemory(nbytes, uncached=uncached)
    base, size = hip.address_range(mem.ptr)
    assert base == mem.ptr and size >= nbytes
    inner = mem.ptr + int(rng.integers(0, nbytes))
    assert hip.address_range(inner) == (base, size)
    host = random_array(rng, np.uint8, nbytes)
    hip.memcpy_htod(mem.ptr, host)
    assert_bitwise_equal(device_bytes(mem.ptr, nbytes), host)
    assert "bytes at" in repr(mem)
    with mem:
        pass
    assert mem.closed and "freed" in repr(mem)
    empty = hip.DeviceMemory(0)
    assert empty.ptr == 0 and empty.size == 0
    empty.free()
    with pytest.raises(ValueError):
        hip.DeviceMemory(-1)
    with pytest.raises(TypeError):
        hip.DeviceMemory(1.5)


def test_memset(rng):
    nbytes = int(rng.integers(10_000, 1 << 20))
    before = random_array(rng, np.uint8, nbytes)
    mem = hip.DeviceMemory(nbytes)
    stream = hip.Stream()
    expected = before.copy()
    hip.memcpy_htod(mem.ptr, before)
    for use_stream in (False, True, False, True):
        start = int(rng.integers(0, nbytes))
        length = int(rng.integers(0, nbytes - start + 1))
        value = int(rng.integers(0, 256))
        hip.memset(mem.ptr + start, value, length, stream=stream if use_stream else None)
        expected[start:start + length] = value
    stream.synchronize()
    hip.device_synchronize()
    assert_bitwise_equal(device_bytes(mem.ptr, nbytes), expected)
    for value in (-1, 256):
        with pytest.raises(ValueError):
            hip.memset(mem.ptr, value, 1)
    with pytest.raises(TypeError):
        hip.memset(mem.ptr, 1.0, 1)


def test_device_to_device_copies(rng):
    nbytes = int(rng.integers(100_000, 1 << 21))
    src_host = random_array(rng, np.uint8, nbytes)
    dst_host = random_array(rng, np.uint8, nbytes)
    src, dst = hip.DeviceMemory(nbytes), hip.DeviceMemory(nbytes)
    hip.memcpy_htod(src.ptr, src_host)
    hip.memcpy_htod(dst.ptr, dst_host)
    stream = hip.Stream()
    expected = dst_host.copy()
    for use_stream in (False, True, True, False):
        length = int(rng.integers(1, nbytes // 2))
        s = int(rng.integers(0, nbytes - length))
        d = int(rng.integers(0, nbytes - length))
        hip.memcpy_dtod(dst.ptr + d, src.ptr + s, length, stream=stream if use_stream else None)
        expected[d:d + length] = src_host[s:s + length]
        if use_stream:
            stream.synchronize()
    hip.memcpy_dtod(dst.ptr, src.ptr, 0)  # zero bytes: nothing happens
    assert_bitwise_equal(device_bytes(dst.ptr, nbytes), expected)
    # Whole buffer, then back to host through an async copy into pinned memory.
    hip.memcpy_dtod(dst, src, nbytes, stream=stream)
    pinned = hip.PinnedMemory(nbytes)
    view = np.frombuffer(pinned, np.uint8)
    view[:] = 0
    hip.memcpy_dtoh(view, dst.ptr, stream=stream)
    stream.synchronize()
    assert_bitwise_equal(view, src_host)


def test_pinned_memory(rng):
    nbytes = int(rng.integers(1, 1 << 16))
    pinned = hip.PinnedMemory(nbytes)
    assert pinned.size == nbytes and pinned.ptr != 0
    view = np.frombuffer(pinned, np.uint8)
    assert view.size == nbytes and view.flags.writeable
    data = random_array(rng, np.uint8, nbytes)
    view[:] = data
    assert bytes(memoryview(pinned)) == data.tobytes()
    with pytest.raises(BufferError):
        pinned.free()  # still viewed
    del view
    pinned.free()
    pinned.free()
    with pytest.raises(ValueError):
        memoryview(pinned)


# --- streams and events ----------------------------------------------------------------

@pytest.mark.parametrize("how", ["wait_event", "wait", "record"])
def test_async_copies_ordered_across_streams(how, rng, kernels):
    """Stream A: (delay) H2D of x and y, y = a*y + x, event; stream B waits on
    the event and copies y to pinned memory.  Without the wait B would read y
    before A's work, which the delay at the head of A makes certain."""
    n = int(rng.integers(50_000, 400_000))
    a = float(rng.integers(-4, 5))
    x = rng.integers(-1000, 1001, n).astype(np.float32)
    y = rng.integers(-1000, 1001, n).astype(np.float32)
    pin_x, pin_y, pin_out = (hip.PinnedMemory(n * 4) for _ in range(3))
    hx, hy, out = (np.frombuffer(p, np.float32) for p in (pin_x, pin_y, pin_out))
    hx[:] = x
    hy[:] = y
    out[:] = np.nan
    dx, dy = hip.DeviceMemory(n * 4), hip.DeviceMemory(n * 4)
    hip.memset(dy.ptr, 0xFF, n * 4)  # NaN until A's copy lands
    stream_a, stream_b = hip.Stream(), hip.Stream()
    kernels.spin(30_000, stream=stream_a)
    hip.memcpy_htod(dx.ptr, hx, stream=stream_a)
    hip.memcpy_htod(dy.ptr, hy, stream=stream_a)
    kernels.axpy_f32(dy.ptr, dx.ptr, a, n, stream=stream_a)
    if how == "wait_event":
        event = hip.Event(timing=False)
        event.record(stream_a)
        stream_b.wait_event(event)
    elif how == "wait":
        stream_b.wait(stream_a)
    else:
        event = stream_a.record()
        assert isinstance(event, hip.Event)
        stream_b.wait_event(event)
    hip.memcpy_dtoh(out, dy.ptr, stream=stream_b)
    stream_b.synchronize()
    expected = (np.float32(a) * y + x).astype(np.float32)  # small integers: exact
    bad = np.flatnonzero(out != expected)
    assert bad.size == 0, f"{bad.size} of {n} wrong, first [{bad[0]}] {out[bad[0]]} != {expected[bad[0]]}"
    assert stream_a.query()  # B waited on all of A's work


def test_event_elapsed_time(kernels):
    stream = hip.Stream()
    start, end = hip.Event(), hip.Event()
    start.record(stream)
    kernels.spin(20_000, stream=stream)  # 20 ms
    end.record(stream)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 16.0 <= ms < 5000.0, ms
    assert end.elapsed_time(start) < 0
    cheap = hip.Event(timing=False)
    cheap.record(stream)
    cheap.synchronize()
    with pytest.raises(ValueError, match="timing"):
        start.elapsed_time(cheap)
    for event in (start, end, cheap):
        event.close()
        event.close()
        assert event.closed
    with pytest.raises(ValueError, match="closed"):
        start.record(stream)


def test_query_semantics(kernels):
    stream = hip.Stream()
    stream.synchronize()
    assert stream.query()
    kernels.spin(300_000, stream=stream)  # 300 ms
    event = hip.Event()
    event.record(stream)
    assert not event.query()
    assert not stream.query()
    event.synchronize()
    assert event.query()
    stream.synchronize()
    assert stream.query()
    # query() of NotReady must not leave an error behind for the next call.
    with hip.DeviceMemory(64) as mem:
        hip.memset(mem.ptr, 1, 64)
        assert np.all(device_bytes(mem.ptr, 64) == 1)


def test_stream_handles_and_protocols(rng, kernels):
    stream = hip.Stream()
    assert stream.handle != 0 and not stream.closed
    assert stream.__cuda_stream__() == (0, stream.handle)
    wrapped = hip.Stream.from_handle(stream.handle)
    assert wrapped == stream and hash(wrapped) == hash(stream)
    assert hip.as_stream(stream) is stream
    assert hip.as_stream(stream.handle) == stream
    assert hip.as_stream(None).handle == 0
    assert hip.Stream.null().handle == 0
    assert hip.as_stream(wrapped) is wrapped

    class Foreign:
        def __cuda_stream__(self):
            return (0, stream.handle)

    assert hip.as_stream(Foreign()) == stream
    with pytest.raises(TypeError):
        hip.as_stream("stream")
    with pytest.raises(TypeError):
        hip.Stream.from_handle(1.0)
    # Work on a wrapped handle runs on the same stream as the original.
    n = int(rng.integers(1000, 10_000))
    pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
    mem = hip.DeviceMemory(n * 4)
    kernels.spin(20_000, stream=stream)
    kernels.fill_u32(mem.ptr, pattern, n, stream=Foreign())
    out = np.zeros(n, np.uint32)
    hip.memcpy_dtoh(out, mem.ptr, stream=wrapped)
    wrapped.synchronize()
    assert np.all(out == pattern)
    # The legacy null stream and a blocking created stream.
    blocking = hip.Stream(non_blocking=False)
    kernels.fill_u32(mem.ptr, pattern ^ 0xFFFFFFFF, n, stream=hip.Stream.null())
    blocking.synchronize()
    hip.Stream.null().synchronize()
    assert np.all(device_bytes(mem.ptr, n * 4).view(np.uint32) == pattern ^ 0xFFFFFFFF)
    wrapped.close()  # does not destroy a stream it does not own
    assert stream.query()
    blocking.close()
    stream.close()
    stream.close()
    assert stream.closed
    with pytest.raises(ValueError, match="closed"):
        stream.synchronize()


# --- errors --------------------------------------------------------------------------

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
