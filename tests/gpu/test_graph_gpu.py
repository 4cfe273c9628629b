"""Graph capture and replay: pyar launches and copies captured from a
stream, replayed many times with exactly checkable arithmetic; a CuPy kernel
captured on the same stream; the capture_status transitions and the errors.
"""
import os

import numpy as np
import pytest

import pyar._hip as hip

pytestmark = pytest.mark.gpu

REQUIRE_GPU = os.environ.get("PYAR_REQUIRE_GPU") == "1"


def optional_import(name):
    """The module, or a skip; on the GPU runner (PYAR_REQUIRE_GPU=1) nothing
    skips, so a missing module fails the test there."""
    if REQUIRE_GPU:
        return __import__(name)
    return pytest.importorskip(name)


def cupy_stream(cupy, stream):
    """A CuPy stream object for a pyar Stream: through the CUDA stream
    protocol (``__cuda_stream__``) where CuPy has Stream.from_external (CuPy 14
    deprecates ExternalStream), else ExternalStream on the raw handle."""
    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(stream)
    return cupy.cuda.ExternalStream(stream.handle)


def small_ints(rng, n, low=-8, high=8):
    """float32 integers: sums of a few thousand of them stay exact."""
    return rng.integers(low, high + 1, n).astype(np.float32)


def download(ptr, n, dtype):
    out = np.empty(n, dtype)
    hip.memcpy_dtoh(out, ptr)
    return out


def upload(array):
    mem = hip.DeviceMemory(array.nbytes)
    hip.memcpy_htod(mem.ptr, array)
    return mem


def assert_exact(actual, expected, what):
    bad = np.flatnonzero(actual != expected)
    assert bad.size == 0, (f"{what}: {bad.size} of {expected.size} differ, first [{bad[0]}] "
                           f"{actual[bad[0]]!r} != {expected[bad[0]]!r}")


def test_capture_and_replay_1000(rng, kernels):
    """y += x; z = pattern; y += w, captured once and replayed 1000 times."""
    n = int(rng.integers(1000, 50_000))
    x, w = small_ints(rng, n), small_ints(rng, n)
    y0 = small_ints(rng, n, -1000, 1000)
    pattern = int(rng.integers(0, 2**32, dtype=np.uint64))
    dy, dx, dw = upload(y0), upload(x), upload(w)
    dz = upload(np.zeros(n, np.uint32))
    stream = hip.Stream()
    assert stream.capture_status == "none" and not stream.is_capturing
    stream.begin_capture()
    assert stream.capture_status == "active" and stream.is_capturing
    kernels.axpy_f32(dy.ptr, dx.ptr, 1.0, n, stream=stream)
    kernels.fill_u32(dz.ptr, pattern, n, stream=stream)
    kernels.axpy_f32(dy.ptr, dw.ptr, 1.0, n, stream=stream)
    graph = stream.end_capture()
    assert stream.capture_status == "none"
    assert isinstance(graph, hip.Graph) and not graph.closed
    # Capturing records; nothing ran.
    hip.device_synchronize()
    assert_exact(download(dy.ptr, n, np.float32), y0, "y after capture")
    assert not download(dz.ptr, n, np.uint32).any()
    executable = graph.instantiate()
    assert isinstance(executable, hip.GraphExec) and not executable.closed
    replays = 1000
    for _ in range(replays):
        executable.launch(stream)
    stream.synchronize()
    expected = y0 + np.float32(replays) * (x + w)
    assert_exact(download(dy.ptr, n, np.float32), expected, "y after 1000 replays")
    assert np.all(download(dz.ptr, n, np.uint32) == pattern)
    # Replay on another stream, and through the legacy null stream.
    other = hip.Stream()
    executable.launch(other)
    other.synchronize()
    executable.launch()
    hip.device_synchronize()
    expected = expected + np.float32(2) * (x + w)
    assert_exact(download(dy.ptr, n, np.float32), expected, "y after 2 more replays")
    executable.close()
    executable.close()
    graph.close()
    graph.close()
    assert executable.closed and graph.closed
    with pytest.raises(ValueError):
        executable.launch(stream)
    with pytest.raises(ValueError):
        graph.instantiate()


def test_replay_reads_current_contents(rng, kernels):
    """A graph bakes in addresses, not data: new x between replays is used."""
    n = int(rng.integers(100, 10_000))
    y0 = small_ints(rng, n)
    dy, dx = upload(y0), upload(np.zeros(n, np.float32))
    stream = hip.Stream()
    stream.begin_capture()
    kernels.axpy_f32(dy.ptr, dx.ptr, 1.0, n, stream=stream)
    executable = stream.end_capture().instantiate()
    expected = y0.copy()
    for _ in range(5):
        x = small_ints(rng, n)
        hip.memcpy_htod(dx.ptr, x)
        executable.launch(stream)
        stream.synchronize()
        expected = expected + x
    assert_exact(download(dy.ptr, n, np.float32), expected, "y")


def test_captured_copies_and_memset(rng, kernels):
    """Copies and memsets captured with kernels replay in order: z = y (copy),
    y = 2*y + x, y's first bytes cleared."""
    n = int(rng.integers(1000, 20_000))
    clear = int(rng.integers(1, n))
    y0 = small_ints(rng, n, -4, 4)
    x = small_ints(rng, n)
    dy, dx, dz = upload(y0), upload(x), upload(np.zeros(n, np.float32))
    stream = hip.Stream()
    stream.begin_capture()
    hip.memcpy_dtod(dz.ptr, dy.ptr, n * 4, stream=stream)
    kernels.axpy_f32(dy.ptr, dx.ptr, 2.0, n, stream=stream)
    hip.memset(dy.ptr, 0, clear * 4, stream=stream)
    executable = stream.end_capture().instantiate()
    y = y0.copy()
    for _ in range(3):
        executable.launch(stream)
        z = y.copy()
        y = np.float32(2) * y + x
        y[:clear] = 0
    stream.synchronize()
    assert_exact(download(dz.ptr, n, np.float32), z, "z")
    assert_exact(download(dy.ptr, n, np.float32), y, "y")


def test_capture_errors(kernels):
    null = hip.Stream.null()
    with pytest.raises(ValueError, match="null stream"):
        null.begin_capture()
    assert null.capture_status == "none"
    stream = hip.Stream()
    with pytest.raises(ValueError, match="capture mode"):
        stream.begin_capture("sometimes")
    assert stream.capture_status == "none"
    # Ending a capture that never began is the runtime's error.
    with pytest.raises(hip.HipError) as info:
        stream.end_capture()
    assert info.value.call == "hipStreamEndCapture"
    # The stream is still usable, and so is capture on it.
    for mode in ("global", "thread_local", "relaxed"):
        stream.begin_capture(mode)
        assert stream.capture_status == "active"
        kernels.empty(stream=stream)
        graph = stream.end_capture()
        executable = graph.instantiate()
        executable.launch(stream)
        stream.synchronize()
        executable.close()
        graph.close()


def test_empty_capture(kernels):
    stream = hip.Stream()
    stream.begin_capture()
    graph = stream.end_capture()
    executable = graph.instantiate()
    executable.launch(stream)
    stream.synchronize()
    executable.close()
    graph.close()


def test_capture_context_manager(rng, kernels):
    """pyar._hip.capture: the with-block form of begin/end/instantiate."""
    n = int(rng.integers(100, 5000))
    y0, x = small_ints(rng, n), small_ints(rng, n)
    dy, dx = upload(y0), upload(x)
    stream = hip.Stream()
    with hip.capture(stream) as captured:
        assert stream.capture_status == "active"
        kernels.axpy_f32(dy.ptr, dx.ptr, 1.0, n, stream=stream)
    assert stream.capture_status == "none"
    for _ in range(10):
        captured.replay()
    stream.synchronize()
    assert_exact(download(dy.ptr, n, np.float32), y0 + np.float32(10) * x, "y")
    captured.close()
    with pytest.raises(ValueError):
        captured.replay()
    # A block that raises ends (and discards) the capture.
    with pytest.raises(RuntimeError, match="boom"):
        with hip.capture(stream):
            kernels.axpy_f32(dy.ptr, dx.ptr, 1.0, n, stream=stream)
            raise RuntimeError("boom")
    assert stream.capture_status == "none"
    stream.synchronize()
    assert_exact(download(dy.ptr, n, np.float32), y0 + np.float32(10) * x, "y untouched")


def test_cupy_kernel_in_pyar_graph(rng, kernels):
    """A CuPy kernel on the captured stream (CuPy's view of the pyar Stream) between
    two pyar launches; every replay: y += x (pyar); t = y + w (CuPy);
    y = 0*y + t (pyar).  A replay that ran them out of order would leave y
    behind t."""
    cupy = optional_import("cupy")
    n = int(rng.integers(1000, 50_000))
    x, w = small_ints(rng, n), small_ints(rng, n)
    y0 = small_ints(rng, n, -1000, 1000)
    y_c, x_c, w_c = cupy.asarray(y0), cupy.asarray(x), cupy.asarray(w)
    t_c = cupy.zeros(n, cupy.float32)
    cupy.cuda.Device().synchronize()
    add = cupy.ElementwiseKernel("float32 a, float32 b", "float32 out", "out = a + b",
                                 "pyar_test_graph_add")
    add(y_c, w_c, t_c)  # compile and load outside the capture
    t_c.fill(0)
    cupy.cuda.Device().synchronize()
    stream = hip.Stream()
    external = cupy_stream(cupy, stream)
    stream.begin_capture()
    kernels.axpy_f32(y_c.data.ptr, x_c.data.ptr, 1.0, n, stream=stream)
    with external:
        add(y_c, w_c, t_c)
    kernels.axpy_f32(y_c.data.ptr, t_c.data.ptr, 0.0, n, stream=stream)
    graph = stream.end_capture()
    executable = graph.instantiate()
    replays = 1000
    for _ in range(replays):
        executable.launch(stream)
    stream.synchronize()
    expected = y0 + np.float32(replays) * (x + w)
    assert_exact(cupy.asnumpy(y_c), expected, "y")
    assert_exact(cupy.asnumpy(t_c), expected, "t")
    executable.close()
    graph.close()
