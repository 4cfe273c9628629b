"""Device arrays: ``DeviceArray`` (C-contiguous GPU memory with numpy
dtypes, bfloat16 and float8 included), constructors, and zero-copy exchange
with other libraries through DLPack and the CUDA array interface.

This layer sits on pyar._hip alone; creating views of foreign arrays makes no
GPU call.
"""
from pyar.array.creation import asarray, empty, empty_like, zeros, zeros_like
from pyar.array.device_array import DeviceArray
from pyar.array.dtypes import SUPPORTED_DTYPES

__all__ = ["DeviceArray", "SUPPORTED_DTYPES", "asarray", "empty", "empty_like", "zeros",
           "zeros_like"]
