"""Producers that export device memory marked read-only, as a foreign
library would: through DLPack (a versioned capsule with the READ_ONLY flag)
or the CUDA array interface (the data tuple's read-only bit), and a JAX-like
one that marks nothing (JAX leaves both unset though its arrays are
immutable).  They never touch the memory, so the CPU tests use made-up
addresses and the GPU tests real allocations (the producer keeps its owner
alive)."""
import numpy as np

from pyar.array import _dlpack, dtypes


class DLPackExport:
    """``shape`` elements of ``dtype`` at ``ptr`` through ``__dlpack__``:
    versioned (and so able to say ``readonly``) when the consumer passes
    ``max_version`` >= (1, 0), else a legacy capsule."""

    def __init__(self, ptr, shape, dtype, *, readonly=True, device=(_dlpack.kDLCUDA, 0),
                 owner=None):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)
        self.readonly, self.device, self.owner = readonly, device, owner

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        code, bits, _ = dtypes.to_dlpack(self.dtype)
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        return _dlpack.export(self, self.ptr, self.shape, code, bits, *self.device,
                              versioned=versioned, readonly=self.readonly and versioned)


class InterfaceExport:
    """The same memory through ``__cuda_array_interface__`` (version 3, no stream)."""

    def __init__(self, ptr, shape, dtype, *, readonly=True, owner=None):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)
        self.readonly, self.owner = readonly, owner

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "strides": None, "version": 3, "stream": None}


class JaxLikeExport(DLPackExport):
    """Marks nothing read-only, like JAX's exports; pyar knows JAX by the
    type's module."""

    def __init__(self, ptr, shape, dtype, **kwargs):
        super().__init__(ptr, shape, dtype, readonly=False, **kwargs)


JaxLikeExport.__module__ = "jax._src.array"
