"""Capturing stream work into a replayable graph, as a context manager.

    with pyar.capture(stream) as graph:
        ...launches, copies, collectives, CuPy or PyTorch kernels on ``stream``...
    graph.replay()          # on the capture stream, or graph.replay(other)
    graph.close()
"""
from pyar._hip._runtime import as_stream


class capture:
    """Records everything queued on ``stream`` inside the ``with`` block.

    ``mode`` is the runtime's capture mode: ``"global"`` (default: other
    threads may not run unsafe calls meanwhile), ``"thread_local"`` or
    ``"relaxed"``.  On leaving the block the graph is instantiated; if the
    block raised, the capture is ended and discarded.
    """

    def __init__(self, stream, mode="global"):
        self.stream = as_stream(stream)
        self.mode = mode
        self.graph = None
        self.executable = None

    def __enter__(self):
        self.stream.begin_capture(self.mode)
        return self

    def __exit__(self, exc_type, exc, tb):
        graph = self.stream.end_capture()
        if exc_type is not None:
            graph.close()
            return False
        self.graph = graph
        self.executable = graph.instantiate()
        return False

    def replay(self, stream=None):
        """Launch the captured work once more, on ``stream`` (default: the capture stream)."""
        if self.executable is None:
            raise ValueError("nothing to replay: the capture has not completed or is closed")
        self.executable.launch(self.stream if stream is None else stream)

    def close(self):
        if self.executable is not None:
            self.executable.close()
            self.executable = None
        if self.graph is not None:
            self.graph.close()
            self.graph = None
