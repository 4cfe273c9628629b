# cython: language_level=3, boundscheck=False, wraparound=False
"""The HIP runtime binding: devices, memory, streams, events, code objects,
kernel launch (one at a time or as prepared sequences), IPC and graphs.  Every call goes through the dispatch table of
src/runtime, which is filled on first use (see loader.pxi)."""

include "loader.pxi"
include "device.pxi"
include "stream.pxi"
include "memory.pxi"
include "module.pxi"
include "sequence.pxi"
include "ipc.pxi"
include "graph.pxi"
