"""Input validation shared by the CPU reference implementations (numpy only)."""
import numpy as np
import ml_dtypes

# Floating dtypes the references accept as input: what the fused kernels read and write
# (float16, bfloat16, float32) plus float64, the reference's own working precision.
INPUT_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32),
                np.dtype(np.float64))
_INPUT_NAMES = ", ".join(str(d) for d in INPUT_DTYPES)


def as_float_array(name, where, x, ndim=None):
    """``np.asarray(x)`` checked to be one of INPUT_DTYPES (and of ``ndim`` dimensions)."""
    a = np.asarray(x)
    if a.dtype not in INPUT_DTYPES:
        raise TypeError(f"{where}: {name} has dtype {a.dtype}; expected one of {_INPUT_NAMES}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{where}: {name} must be {ndim}-D, got shape {a.shape}")
    return a


def check_finite(name, where, a64):
    """Reject NaN and +-Inf (the quantizers' policy), naming the first bad element."""
    bad = ~np.isfinite(a64)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: {name} contains {int(bad.sum())} non-finite value(s) "
                         f"(first {float(a64[first])!r} at index {first}); NaN and Inf are "
                         "rejected")


def check_divisible(where, hidden, size, what):
    if hidden % size:
        raise ValueError(f"{where}: hidden size {hidden} (last axis) is not divisible by the "
                         f"{what} {size}")


def half_ulp(v, nmant, emin):
    """Half the spacing of a binary float format's grid at magnitude ``v`` (float64 array).

    For ``2**e <= v < 2**(e+1)`` with ``e >= emin`` the grid spacing is ``2**(e - nmant)``;
    below ``2**emin`` (subnormals, zero) it is ``2**(emin - nmant)``. Round to nearest puts a
    value within half a spacing of its rounded result, whichever binade that lands in.
    """
    v = np.abs(np.asarray(v, dtype=np.float64))
    _, e = np.frexp(v)                   # v = m * 2**e with 0.5 <= m < 1, so floor(log2 v) = e-1
    e = np.where(v > 0, e - 1, emin)
    return np.ldexp(0.5, np.maximum(e, emin) - nmant)
