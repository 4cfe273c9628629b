"""The rail's sum kernel (src/kernels/rail.cu, pyar.comm.rail_kernel) on a
real GPU, in this process, against the host path's arithmetic
(pyar.comm.rail.add_in_order): bitwise equal for every row and output dtype,
1 to 8 domains, counts around the kernel's groups of 4 and 1M+3, on random
rows and on rows whose sum depends on the order of the additions, sums near
16-bit rounding boundaries, overflow, infinities and NaN (NaN only as NaN: which
NaN an invalid addition gives is the processor's choice, x86 and GPUs choose
differently).  So the device and host data paths of the hierarchical
all-reduce give the same bits.  The positive control: the same comparison
against the reverse order finds differences."""
import ml_dtypes
import numpy as np
import pytest

import pyar
from pyar import _hip, _kernels
from pyar.comm import rail, rail_kernel
from tests.gpu.random_data import assert_bitwise_equal

pytestmark = pytest.mark.gpu

F32, F16, BF16 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
PAIRS = [(F32, F32), (F32, F16), (F32, BF16), (F16, F16), (BF16, BF16)]  # (rows, out)
COUNTS = [1, 3, 4, 5, 1001, (1 << 20) + 3]
SENTINEL = 0xA5


@pytest.fixture(scope="module")
def rail_sum():
    return rail_kernel.RailSum(_kernels.load("rail"), _hip.get_device())


def on_device(rail_sum, rows, out_dtype):
    """The kernel's sum of ``rows`` (domains x n) into a new array, laid out
    as the device path lays them out (rows ``pitch(n)`` apart); the bytes
    past the result must stay as they were."""
    domains, n = rows.shape
    pitch = rail_kernel.pitch(n)
    padded = np.zeros((domains, pitch), rows.dtype)
    padded[:, :n] = rows
    stream = pyar.Stream()
    gathered = pyar.asarray(padded.ravel(), stream=stream, ipc=True)
    out = pyar.asarray(np.full((n + 8) * out_dtype.itemsize, SENTINEL, np.uint8),
                       stream=stream)
    rail_sum.launch(gathered.ptr, rows.dtype, n, domains, out.ptr, out_dtype, stream)
    got = out.get(stream=stream)
    stream.synchronize()
    stream.close()
    assert np.all(got[n * out_dtype.itemsize:] == SENTINEL), "wrote past the result"
    return got[:n * out_dtype.itemsize].view(out_dtype)


def on_host(rows, out_dtype):
    n = rows.shape[1]
    with np.errstate(all="ignore"):  # inf - inf and overflow are part of the test
        return rail.add_in_order(rows.astype(np.float32), np.empty(n, out_dtype),
                                 None if out_dtype == F32 else np.empty(n, np.float32))


def assert_same_sums(got, want):
    """Bitwise equal, except that a NaN may be any NaN."""
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(nan, np.isnan(got.astype(np.float32))), "NaN in different places"
    assert_bitwise_equal(got[~nan], want[~nan])


def order_sensitive_rows(domains, n, rng, dtype):
    """Rows whose float32 sum depends on the order: a large value, its
    negation, then small ones, kept in this order and lost in the reverse;
    plus sums near 16-bit rounding boundaries, inf, NaN."""
    rows = rng.standard_normal((domains, n)).astype(np.float32)
    big = np.float32(2.0 ** 25) if dtype == F32 else np.float32(2.0 ** 12)
    rows[0, 0::3] = big
    if domains > 1:
        rows[1, 0::3] = -big
        rows[2:, 0::3] = 0.75  # kept after big - big, lost when added to either first
    if n > 8:
        rows[:, 1] = np.float32(1.0 + 2.0 ** -11)  # between two float16 values
        rows[:, 2] = np.float32(1.0 + 2.0 ** -8)   # between two bfloat16 values
        rows[0, 4] = np.inf
        rows[-1, 5] = np.nan
        if domains > 1:
            rows[1, 7] = -np.inf
            rows[0, 7] = np.inf
    return rows.astype(dtype)


@pytest.mark.parametrize("rows_dtype, out_dtype", PAIRS, ids=lambda d: d.name)
@pytest.mark.parametrize("domains", [1, 2, 3, 8])
@pytest.mark.parametrize("n", COUNTS)
def test_kernel_adds_like_the_host_path(rail_sum, rows_dtype, out_dtype, domains, n, rng):
    for rows in (rng.standard_normal((domains, n)).astype(rows_dtype),
                 order_sensitive_rows(domains, n, rng, rows_dtype)):
        assert_same_sums(on_device(rail_sum, rows, out_dtype), on_host(rows, out_dtype))


@pytest.mark.parametrize("rows_dtype, out_dtype", [(F32, F32), (F32, F16)],
                         ids=lambda d: d.name)
def test_comparison_sees_the_order(rail_sum, rows_dtype, out_dtype, rng):
    """Positive control: against the rows added in reverse order the
    comparison fails, so the bitwise test above can tell orders apart."""
    rows = order_sensitive_rows(3, 4099, rng, rows_dtype)
    got = on_device(rail_sum, rows, out_dtype)
    reverse = on_host(rows[::-1].copy(), out_dtype)
    assert not np.array_equal(got.view(np.uint8), reverse.view(np.uint8))
