"""Streams as the array protocols spell them.

pyar keeps ``None`` for the legacy default (null) stream and a
``pyar._hip.Stream`` for any other.  The protocols pass bare ints: the CUDA
array interface and DLPack on CUDA say 1 for the legacy default stream and
2 for the per-thread one; DLPack on ROCm says 0 for the default stream.
"""
from pyar._hip import Event, Stream, as_stream

# The protocols' "legacy default stream" values; handle 0 is the null stream
# to the runtime itself.
_LEGACY_HANDLES = (0, 1)


def normalize(stream):
    """None for the null stream, else a pyar Stream (from a Stream, an int
    handle, or an object with ``__cuda_stream__``)."""
    if stream is None:
        return None
    stream = as_stream(stream)
    return None if stream.handle == 0 else stream


def from_protocol(handle):
    """The stream a protocol's int names (0 or 1: the legacy default)."""
    if not isinstance(handle, int) or isinstance(handle, bool):
        raise TypeError(f"a stream must be given as an int, not {type(handle).__name__}")
    if handle < 0:
        raise ValueError(f"invalid stream {handle}")
    return None if handle in _LEGACY_HANDLES else Stream.from_handle(handle)


def handle(stream):
    """The runtime handle of a normalized stream (0 for the null stream)."""
    return 0 if stream is None else stream.handle


def wait(consumer, producer):
    """Make later work on ``consumer`` wait for the work queued on
    ``producer`` so far (both normalized).  Free when they are one stream."""
    if handle(consumer) == handle(producer):
        return
    event = Event(timing=False)
    event.record(producer)
    as_stream(consumer).wait_event(event)
