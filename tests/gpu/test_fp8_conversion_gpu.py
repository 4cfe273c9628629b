"""The FP8 conversion of the fused kernels on the GPU, for every float32 value, and
the codes of a group whose maximum is infinite.

On NVIDIA sm_89 and later the kernels encode E4M3FN codes a pair at a time in hardware
(``encode_e4m3_pair`` in src/kernels/pyar_quant.h, one ``cvt.rn.satfinite`` instruction);
elsewhere the pair is two calls of the software encoder ``encode_e4m3``, which
tests/test_quant_encoders.py checks against the numpy references on the host. Here the two
are compared on the GPU over all 2**32 bit patterns (NaNs aside), so the hardware codes are
the references' too.
"""
import re

import ml_dtypes
import numpy as np
import pytest

import pyar
import pyar._hip as hip
from pyar.comm import row_kernels

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


@pytest.mark.parametrize("fp8_dtype", row_kernels.FP8_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("quant", ["fp8_per_token", "fp8_per_group"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_a_group_holding_infinity_gets_zero_codes(dtype, quant, fp8_dtype):
    """A group whose maximum is infinite gets an infinite scale and the +-0 codes the
    division v / inf gives for its finite values (not NaN, which 0 * inf in the quotient's
    correction term would give); every other group is quantized as without it."""
    tokens, hidden, group = 4, 1024, 128
    finite = np.random.default_rng(7).standard_normal((tokens, hidden)).astype(dtype)
    holes = [(1, 300, np.inf), (2, 5, -np.inf)]
    with_inf = finite.copy()
    for row, column, value in holes:
        with_inf[row, column] = value
    q_inf, s_inf = (a.get() for a in row_kernels.quantize(pyar.asarray(with_inf), quant, group,
                                                           fp8_dtype))
    q_fin, s_fin = (a.get() for a in row_kernels.quantize(pyar.asarray(finite), quant, group,
                                                           fp8_dtype))
    width = hidden if quant == "fp8_per_token" else group
    hit = np.zeros((tokens, hidden), bool)
    for row, column, _ in holes:
        hit[row, column // width * width:(column // width + 1) * width] = True
        assert s_inf[row, column // width] == np.inf, (row, s_inf[row])
    codes, expected = q_inf.view(np.uint8), q_fin.view(np.uint8)
    assert np.array_equal(codes[~hit], expected[~hit])
    assert np.array_equal(s_inf[np.isfinite(s_inf)], s_fin[np.isfinite(s_inf)])
    zeros = (np.copysign(0.0, finite.astype(np.float64))).astype(fp8_dtype).view(np.uint8)
    hit[[r for r, _, _ in holes], [c for _, c, _ in holes]] = False  # inf / inf: unspecified
    assert np.array_equal(codes[hit], zeros[hit]), np.unique(codes[hit])
