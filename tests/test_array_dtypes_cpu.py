"""pyar.array's dtypes without a GPU (tier a): the supported set, the mapping
to DLPack's (code, bits, lanes) and back, and the refusal of everything else.

Pure host-side tables: nothing here touches a device.
"""
import ml_dtypes
import numpy as np
import pytest

from pyar.array import SUPPORTED_DTYPES, dtypes
from tests.fake_device_arrays import ALL_DTYPES, EXPECTED_DLPACK


def test_supported_dtypes_are_exactly_the_expected_set():
    assert set(SUPPORTED_DTYPES) == set(ALL_DTYPES)
    # The formats an all-reduce needs must be there whatever ml_dtypes offers.
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                 "float8_e5m2fnuz"):
        assert np.dtype(getattr(ml_dtypes, name)) in SUPPORTED_DTYPES


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_dtype_maps_to_dlpack_and_back(dtype):
    triple = EXPECTED_DLPACK[dtype]
    assert dtypes.to_dlpack(dtype) == triple
    assert dtypes.from_dlpack(*triple) == dtype


@pytest.mark.parametrize("dtype", [np.object_, "U4", "M8[s]", ml_dtypes.int4,
                                   np.dtype([("a", np.float32)])], ids=str)
def test_unsupported_dtype_is_named_with_the_supported_list(dtype):
    with pytest.raises(TypeError) as excinfo:
        dtypes.as_dtype(dtype)
    message = str(excinfo.value)
    assert np.dtype(dtype).name in message
    assert "float32" in message and "bfloat16" in message and "float8_e4m3fn" in message


def test_non_native_byte_order_is_refused():
    with pytest.raises(TypeError, match="byte order"):
        dtypes.as_dtype(">f4" if np.little_endian else "<f4")


def test_unknown_dlpack_dtype_is_refused():
    with pytest.raises(TypeError, match=r"code=2, bits=32, lanes=4"):
        dtypes.from_dlpack(2, 32, 4)
    with pytest.raises(TypeError, match="code=17"):
        dtypes.from_dlpack(17, 4, 1)  # float4: sub-byte, not supported
