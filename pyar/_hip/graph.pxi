# Graphs captured from streams, instantiated and replayed.


cdef class GraphExec


cdef class Graph:
    """A captured graph (``Stream.end_capture()``); instantiate it to replay."""
    cdef hipGraph_t _handle
    cdef bint _alive

    @staticmethod
    cdef Graph wrap(hipGraph_t handle):
        cdef Graph graph = Graph.__new__(Graph)
        graph._handle = handle
        graph._alive = handle != NULL
        return graph

    @property
    def closed(self):
        return not self._alive

    def instantiate(self):
        cdef GraphExec exec_ = GraphExec.__new__(GraphExec)
        if not self._alive:
            raise ValueError("graph is destroyed")
        check(pyar_rt.hipGraphInstantiateWithFlags(&exec_._handle, self._handle, 0),
              "hipGraphInstantiateWithFlags")
        exec_._alive = True
        return exec_

    def close(self):
        if self._alive:
            self._alive = False
            check(pyar_rt.hipGraphDestroy(self._handle), "hipGraphDestroy")

    def __dealloc__(self):
        if self._alive:
            pyar_rt.hipGraphDestroy(self._handle)


cdef class GraphExec:
    """An instantiated graph: ``launch(stream)`` replays it."""
    cdef hipGraphExec_t _handle
    cdef bint _alive

    @property
    def closed(self):
        return not self._alive

    def launch(self, stream=None):
        if not self._alive:
            raise ValueError("graph executable is destroyed")
        check(pyar_rt.hipGraphLaunch(self._handle, stream_handle(stream)), "hipGraphLaunch")

    def close(self):
        if self._alive:
            self._alive = False
            check(pyar_rt.hipGraphExecDestroy(self._handle), "hipGraphExecDestroy")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self._alive:
            pyar_rt.hipGraphExecDestroy(self._handle)
