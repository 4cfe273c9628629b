"""The FP8 conversion of the fused kernels on the GPU, for every float32 value.

On NVIDIA sm_89 and later the kernels encode E4M3FN codes a pair at a time in hardware
(``encode_e4m3_pair`` in src/kernels/pyar_quant.h, one ``cvt.rn.satfinite`` instruction);
elsewhere the pair is two calls of the software encoder ``encode_e4m3``, which
tests/test_quant_encoders.py checks against the numpy references on the host. Here the two
are compared on the GPU over all 2**32 bit patterns (NaNs aside), so the hardware codes are
the references' too.
"""
import re

import numpy as np
import pytest

import pyar._hip as hip

pytestmark = pytest.mark.gpu


def _mismatches(kernels, fnuz):
    """(count, one float32 value) of the values whose pair codes differ from
    encode_e4m3(v, fnuz)."""
    function = kernels.module.get_function("pyar_test_e4m3fn_pair_mismatches",
                                           ("uint32", "ptr", "ptr"))
    out = np.zeros(2, np.uint64)
    with hip.DeviceMemory(out.nbytes) as mem:
        hip.memset(mem.ptr, 0, out.nbytes)
        function.launch(4096, 256, (int(fnuz), mem.ptr, mem.ptr + 8))
        hip.device_synchronize()
        hip.memcpy_dtoh(out, mem.ptr)
    return int(out[0]), np.uint32(out[1] & 0xFFFFFFFF).view(np.float32)


def _converts_in_hardware():
    """NVIDIA sm_89 and later: elsewhere the pair is the software encoder itself."""
    arch = re.match(r"sm_(\d+)", hip.Device(hip.get_device()).arch)
    return hip.platform() == "cuda" and arch is not None and int(arch.group(1)) >= 89


def test_e4m3fn_pair_is_the_software_encoder_for_every_float32(kernels):
    if not _converts_in_hardware():
        pytest.skip("this GPU has no E4M3 conversion instruction: encode_e4m3_pair is "
                    "encode_e4m3 twice, nothing to compare")
    count, example = _mismatches(kernels, fnuz=False)
    assert count == 0, f"{count} float32 values encode differently, e.g. {example!r}"


def test_e4m3fn_pair_check_finds_other_codes(kernels):
    """Positive control: against E4M3FNUZ codes (another bias and saturation) the same
    comparison finds most values."""
    count, example = _mismatches(kernels, fnuz=True)
    assert count > 2**31, count
