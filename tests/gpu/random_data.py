"""Random test data and bitwise comparison for the GPU tests."""
import numpy as np


def random_array(rng, dtype, shape):
    """Random contents of every bit pattern (NaNs and all) for bitwise checks."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == np.bool_:
        return rng.integers(0, 2, count, dtype=np.uint8).astype(np.bool_).reshape(shape)
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def assert_bitwise_equal(actual, expected, what=""):
    """Equal bytes, same dtype and shape; names the first differing byte."""
    assert isinstance(actual, np.ndarray), type(actual)
    actual = np.ascontiguousarray(actual)
    expected = np.ascontiguousarray(expected)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    a = actual.view(np.uint8).reshape(-1)
    e = expected.view(np.uint8).reshape(-1)
    bad = np.flatnonzero(a != e)
    assert bad.size == 0, (f"{what}: {bad.size} of {e.size} bytes differ, first at byte "
                           f"{bad[0]}: {a[bad[0]]:#04x} != {e[bad[0]]:#04x}")
