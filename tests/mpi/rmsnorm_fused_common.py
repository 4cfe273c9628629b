"""Shared pieces of the fused all-reduce + residual add + RMSNorm scenario
(tests/mpi/rmsnorm_fused.py and its modes in rmsnorm_fused_*.py; soak.py
takes them too): the quantization kinds and FP8 format, the float64
reference and its bounds (``Checker``), random inputs drawn from every
rank's seed, and a communicator with its test kernels and streams.

Ranks run under mpirun, one GPU a rank; importing needs no GPU.
"""
import hashlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import quant
from pyar.quant._common import half_ulp
from allreduce_common import bits, normal
from tests.gpu_kernels import GpuTestKernels


KINDS = (None, "fp8_per_token", "fp8_per_group", "mxfp4")
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
EPS = 1e-6
_FORMAT = {  # dtype name -> (mantissa bits, smallest normal exponent)
    "float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}


def ulp(v, dtype):
    nmant, emin = _FORMAT[np.dtype(dtype).name]
    return 2 * half_ulp(v, nmant, emin)


def norm_reference(r, weight):
    """y of the stored residual r (any float dtype), in float64."""
    r = r.astype(np.float64)
    return r / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + EPS) * weight.astype(np.float64)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.hexdigest()


class Checker:
    """Compares one call's outputs (host copies) with the references."""

    def __init__(self, sc):
        self.sc = sc
        self.failed = 0

    def fail(self, what, message):
        self.failed += 1
        self.sc.check(False, f"{what}: {message}")

    def outputs(self, what, dtype, s64, abs_sum, residual, weight, y, r, kind=None, q=None,
                scales=None, group=None):
        """s64: the float64 sum; abs_sum: sum over ranks of |x| (for the
        accumulation bound).  Returns whether everything was within bounds."""
        before = self.failed
        r64 = s64 + residual.astype(np.float64)
        # s rounded once to the dtype after fp32 accumulation, then r rounded once.
        bound = (ulp(s64, dtype) / 2 + ulp(r64, dtype) / 2 + 2.0 ** -22 * abs_sum
                 + 2.0 ** -149)
        got_r = r.astype(np.float64)
        err = np.abs(got_r - r64)
        if not np.all(err <= bound):
            i = np.unravel_index(np.argmax(err - bound), err.shape)
            self.fail(what, f"residual_out off at {i}: got {got_r[i]!r}, want {r64[i]!r} "
                            f"(bound {bound[i]:.3g}; {int(np.sum(err > bound))} elements)")
            return False
        y_ref = norm_reference(r, weight)
        if y is not None:
            got_y = y.astype(np.float64)
            bound = ulp(y_ref, dtype) + 1e-5 * np.abs(y_ref) + 1e-30
            err = np.abs(got_y - y_ref)
            if not np.all(err <= bound):
                i = np.unravel_index(np.argmax(err - bound), err.shape)
                self.fail(what, f"y off at {i}: got {got_y[i]!r}, want {y_ref[i]!r} "
                                f"({int(np.sum(err > bound))} elements)")
                return False
        if kind is not None:
            self.quantized(what, kind, y if y is not None else y_ref.astype(dtype), q, scales,
                           group, exact_y=y is not None)
        return self.failed == before

    def quantized(self, what, kind, y, q, scales, group, exact_y):
        """Scales exactly those of the reference quantizer applied to the
        kernel's own y; codes within the format's rounding of y."""
        if exact_y:
            ref_q, ref_scales = quant.quantize(y, kind, group_size=group, fp8_dtype=FP8)
            if not np.array_equal(bits(scales), bits(ref_scales)):
                bad = int(np.sum(bits(scales) != bits(ref_scales)))
                self.fail(what, f"{kind}: {bad} of {scales.size} scales differ from the "
                                "reference's")
                return
        y64 = y.astype(np.float64)
        back = quant.dequantize(q, scales, kind, out_dtype=np.float64)
        bound = quant.rounding_bound(y64, scales, kind, fp8_dtype=FP8) * (1 + 2.0 ** -20) \
            + np.abs(y64) * 2.0 ** -22 + 1e-30
        if not exact_y:
            bound = bound + ulp(y64, y.dtype)  # y itself is only known within rounding
        err = np.abs(back - y64)
        if not np.all(err <= bound):
            i = np.unravel_index(np.argmax(err - bound), err.shape)
            self.fail(what, f"{kind}: dequantized {back[i]!r} at {i}, y {y64[i]!r} "
                            f"({int(np.sum(err > bound))} elements beyond rounding)")


def setup(sc, **kwargs):
    comm = pyar.Communicator(MPI.COMM_WORLD, **kwargs)
    return comm, GpuTestKernels(comm.device), (pyar.Stream(), pyar.Stream())


def host(a, stream):
    return None if a is None else a.get(stream=stream)


def group_size(hidden):
    """128 where it divides the row; 2880 = 45 * 64 takes groups of 64."""
    return 128 if hidden % 128 == 0 else 64


def random_inputs(sc, dtype, tokens, hidden, key, stream):
    """Every rank's x drawn from ``key`` (this rank's on the GPU), their
    float64 sum and sum of magnitudes, a residual and a weight (host and GPU)."""
    xs = [normal(dtype, tokens * hidden, *key, r).reshape(tokens, hidden)
          for r in range(sc.world)]
    s64 = np.sum([x.astype(np.float64) for x in xs], axis=0)
    abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    residual = normal(dtype, tokens * hidden, *key, 99).reshape(tokens, hidden)
    weight = (1 + 0.5 * normal(np.float32, hidden, *key, 98)).astype(dtype)
    return (s64, abs_sum, residual, weight, pyar.asarray(xs[sc.rank], stream=stream),
            pyar.asarray(weight, stream=stream))
