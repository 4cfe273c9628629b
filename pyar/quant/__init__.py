"""CPU references for the fused all-reduce + residual add + RMSNorm outputs and their
quantized forms (FP8 per token, FP8 per group, MXFP4 per the OCP MX v1.0 spec).

numpy and ml_dtypes only: importing this package touches no GPU. See
:mod:`pyar.quant.reference` for the entry points, :mod:`pyar.quant.fp8` and
:mod:`pyar.quant.mxfp4` for the exact definitions.
"""
from pyar.quant.fp8 import FP8_DTYPES, FP8_MIN_SCALE, fp8_max, round_to_fp8
from pyar.quant.mxfp4 import (E2M1_VALUES, MX_BLOCK_SIZE, decode_e2m1, e8m0_to_float,
                              encode_e2m1, pack_fp4, unpack_fp4)
from pyar.quant.reference import (KINDS, add_rmsnorm_reference, dequantize, quantize,
                                  quantize_fp8_per_group, quantize_fp8_per_token, quantize_mxfp4,
                                  rounding_bound)

__all__ = [
    "E2M1_VALUES", "FP8_DTYPES", "FP8_MIN_SCALE", "KINDS", "MX_BLOCK_SIZE",
    "add_rmsnorm_reference", "decode_e2m1", "dequantize", "e8m0_to_float", "encode_e2m1",
    "fp8_max", "pack_fp4", "quantize", "quantize_fp8_per_group", "quantize_fp8_per_token",
    "quantize_mxfp4", "round_to_fp8", "rounding_bound", "unpack_fp4",
]
