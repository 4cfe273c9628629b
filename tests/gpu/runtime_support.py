"""Pieces shared by the runtime layer's GPU tests (tests/gpu/test_runtime_*_gpu.py):
the repository root and a synchronous read of device bytes."""
import os

import numpy as np

import pyar._hip as hip

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def device_bytes(ptr, nbytes, stream=None):
    out = np.empty(nbytes, np.uint8)
    hip.memcpy_dtoh(out, ptr, stream=stream)
    if stream is not None:
        hip.as_stream(stream).synchronize()
    return out
