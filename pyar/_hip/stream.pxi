# Streams and events.

cdef class Event


cdef class Stream:
    """A HIP stream.  ``Stream()`` creates one (non-blocking by default);
    ``Stream.null()`` is the device's legacy default stream;
    ``Stream.from_handle(h)`` wraps a stream another library made."""
    cdef hipStream_t _handle
    cdef bint _owned
    cdef bint _closed
    cdef object _owner

    def __init__(self, non_blocking=True):
        ensure_loaded()
        flags = PYAR_hipStreamNonBlocking if non_blocking else 0
        check(pyar_rt.hipStreamCreateWithFlags(&self._handle, flags), "hipStreamCreateWithFlags")
        self._owned = True

    @staticmethod
    def from_handle(handle, owner=None):
        """Wrap a foreign stream handle (an int); ``owner`` is kept alive with it."""
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise TypeError(f"stream handle must be an int, not {type(handle).__name__}")
        if handle < 0:
            raise ValueError(f"stream handle must be >= 0, got {handle}")
        cdef Stream stream = Stream.__new__(Stream)
        stream._handle = <hipStream_t><uintptr_t>handle
        stream._owner = owner
        return stream

    @staticmethod
    def null():
        return Stream.from_handle(0)

    @property
    def handle(self):
        return <uintptr_t>self._handle

    @property
    def closed(self):
        return self._closed

    cdef inline hipStream_t checked_handle(self) except? NULL:
        if self._closed:
            raise ValueError("stream is closed")
        return self._handle

    def __cuda_stream__(self):
        return (0, <uintptr_t>self.checked_handle())

    def __repr__(self):
        state = "closed" if self._closed else hex(<uintptr_t>self._handle)
        return f"<pyar.Stream {state}>"

    def __eq__(self, other):
        return isinstance(other, Stream) and (<Stream>other)._handle == self._handle

    def __hash__(self):
        return hash(("pyar.Stream", <uintptr_t>self._handle))

    def synchronize(self):
        cdef hipStream_t handle = self.checked_handle()
        cdef hipError_t status
        ensure_loaded()
        with nogil:
            status = pyar_rt.hipStreamSynchronize(handle)
        check(status, "hipStreamSynchronize")

    def query(self):
        """True when all work queued on the stream has finished."""
        cdef hipStream_t handle = self.checked_handle()
        ensure_loaded()
        cdef hipError_t status = pyar_rt.hipStreamQuery(handle)
        if status == PYAR_hipErrorNotReady:
            pyar_rt.hipGetLastError()
            return False
        check(status, "hipStreamQuery")
        return True

    def wait_event(self, Event event not None):
        """Queue a wait: later work on this stream starts after ``event``."""
        check(pyar_rt.hipStreamWaitEvent(self.checked_handle(), event.checked_handle(), 0),
              "hipStreamWaitEvent")

    def wait(self, other):
        """Later work on this stream starts after everything queued on ``other`` so far."""
        cdef Stream producer = as_stream(other)
        if producer._handle == self._handle:
            return
        event = Event(timing=False)
        event.record(producer)
        self.wait_event(event)

    def record(self, Event event=None):
        """Record ``event`` (a new one if None) on this stream and return it."""
        if event is None:
            event = Event()
        event.record(self)
        return event

    def close(self):
        if self._closed:
            return
        self._closed = True
        if self._owned:
            self._owned = False
            check(pyar_rt.hipStreamDestroy(self._handle), "hipStreamDestroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self._owned and not self._closed:
            pyar_rt.hipStreamDestroy(self._handle)

    # Graph capture (see graph.pxi for Graph).
    def begin_capture(self, mode="global"):
        """Start recording the work queued on this stream into a graph."""
        modes = {"global": PYAR_hipStreamCaptureModeGlobal,
                 "thread_local": PYAR_hipStreamCaptureModeThreadLocal,
                 "relaxed": PYAR_hipStreamCaptureModeRelaxed}
        if mode not in modes:
            raise ValueError(f"capture mode must be one of {sorted(modes)}, got {mode!r}")
        if self._handle == NULL:
            raise ValueError("the null stream cannot be captured; capture a created Stream")
        cdef hipStream_t handle = self.checked_handle()
        ensure_loaded()  # a wrapped foreign stream can come before any other pyar call
        check(pyar_rt.hipStreamBeginCapture(handle, modes[mode]),
              "hipStreamBeginCapture")

    def end_capture(self):
        """Stop recording and return the captured Graph."""
        cdef hipGraph_t graph = NULL
        cdef hipStream_t handle = self.checked_handle()
        ensure_loaded()
        check(pyar_rt.hipStreamEndCapture(handle, &graph), "hipStreamEndCapture")
        return Graph.wrap(graph)

    @property
    def capture_status(self):
        """``"none"``, ``"active"`` or ``"invalidated"``."""
        cdef int status = 0
        cdef hipStream_t handle = self.checked_handle()
        ensure_loaded()
        check(pyar_rt.hipStreamIsCapturing(handle, &status), "hipStreamIsCapturing")
        return {PYAR_hipStreamCaptureStatusNone: "none",
                PYAR_hipStreamCaptureStatusActive: "active",
                PYAR_hipStreamCaptureStatusInvalidated: "invalidated"}.get(status, str(status))

    @property
    def is_capturing(self):
        return self.capture_status == "active"


cdef Stream _null_stream = None


cpdef Stream as_stream(obj):
    """A Stream for ``obj``: None (the null stream), a Stream, an int handle,
    an object with ``__cuda_stream__`` (CuPy, cuda.core), or a PyTorch stream."""
    global _null_stream
    if obj is None:
        if _null_stream is None:
            _null_stream = Stream.null()
        return _null_stream
    if isinstance(obj, Stream):
        return <Stream>obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return Stream.from_handle(obj)
    protocol = getattr(obj, "__cuda_stream__", None)
    if protocol is not None:
        version, handle = protocol() if callable(protocol) else protocol
        return Stream.from_handle(int(handle), owner=obj)
    handle = getattr(obj, "cuda_stream", None)  # torch.cuda.Stream
    if isinstance(handle, int):
        return Stream.from_handle(handle, owner=obj)
    raise TypeError(f"expected a stream (pyar.Stream, int handle, or an object with "
                    f"__cuda_stream__), not {type(obj).__name__}")


def stream_is_capturing(uintptr_t handle):
    """Whether the stream with this handle is capturing; the null stream
    (handle 0) never is.  One runtime call, no Stream object."""
    cdef int status = PYAR_hipStreamCaptureStatusNone
    if handle == 0:
        return False
    ensure_loaded()
    check(pyar_rt.hipStreamIsCapturing(<hipStream_t>handle, &status), "hipStreamIsCapturing")
    return status != PYAR_hipStreamCaptureStatusNone


cdef inline hipStream_t stream_handle(obj) except? NULL:
    if obj is None:
        return NULL
    if type(obj) is Stream:
        return (<Stream>obj).checked_handle()
    return as_stream(obj).checked_handle()


cdef class Event:
    """A HIP event; ``timing=False`` makes a cheaper event for ordering only."""
    cdef hipEvent_t _handle
    cdef bint _closed
    cdef readonly bint timing

    def __init__(self, timing=True):
        ensure_loaded()
        flags = PYAR_hipEventDefault if timing else PYAR_hipEventDisableTiming
        check(pyar_rt.hipEventCreateWithFlags(&self._handle, flags), "hipEventCreateWithFlags")
        self.timing = timing

    cdef inline hipEvent_t checked_handle(self) except? NULL:
        if self._closed:
            raise ValueError("event is closed")
        return self._handle

    @property
    def handle(self):
        return <uintptr_t>self._handle

    @property
    def closed(self):
        return self._closed

    def record(self, stream=None):
        check(pyar_rt.hipEventRecord(self.checked_handle(), stream_handle(stream)),
              "hipEventRecord")
        return self

    def synchronize(self):
        cdef hipEvent_t handle = self.checked_handle()
        cdef hipError_t status
        with nogil:
            status = pyar_rt.hipEventSynchronize(handle)
        check(status, "hipEventSynchronize")

    def query(self):
        """True when the work before the recorded point has finished."""
        cdef hipError_t status = pyar_rt.hipEventQuery(self.checked_handle())
        if status == PYAR_hipErrorNotReady:
            pyar_rt.hipGetLastError()
            return False
        check(status, "hipEventQuery")
        return True

    def elapsed_time(self, Event end not None):
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        cdef float ms = 0
        if not (self.timing and end.timing):
            raise ValueError("elapsed_time needs two events created with timing=True")
        check(pyar_rt.hipEventElapsedTime(&ms, self.checked_handle(), end.checked_handle()),
              "hipEventElapsedTime")
        return ms

    def close(self):
        if not self._closed:
            self._closed = True
            check(pyar_rt.hipEventDestroy(self._handle), "hipEventDestroy")

    def __dealloc__(self):
        if self._handle != NULL and not self._closed:
            pyar_rt.hipEventDestroy(self._handle)
