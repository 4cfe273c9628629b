"""The runtime layer on a real GPU: streams and events (ordering across
streams, timing, queries, handles and the stream protocols).

Every test draws its own random data (seeded by the test id and
$PYAR_TEST_SEED, printed on failure) so that no two tests check the same bytes.
Marked ``gpu``: where no GPU is visible they skip (tests/conftest.py), except
under PYAR_REQUIRE_GPU=1, where that is a failure.
"""
import numpy as np
import pytest

import pyar._hip as hip
from tests.gpu.runtime_support import device_bytes

pytestmark = pytest.mark.gpu


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
