"""Tier (a) tests of pyar.quant's entry points over every kind
(fp8_per_token, fp8_per_group, mxfp4): quantize/dequantize dispatch within
the rounding bound, non-finite input refused, and the reference modules
importing no GPU code.

Host numpy and ml_dtypes only: they run on any machine, no GPU involved.
"""
import ml_dtypes
import numpy as np
import pytest

from pyar import quant
from pyar.quant import fp8 as fp8_mod
from pyar.quant import mxfp4 as mx_mod
from tests.quant_independent_references import _rng, _sample


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("kind", quant.KINDS)
def test_non_finite_input_rejected(bad, kind):
    y = np.ones((3, 256), np.float32)
    y[2, 17] = bad
    with pytest.raises(ValueError, match=r"non-finite value\(s\).*index \(2, 17\)"):
        quant.quantize(y, kind)


def test_quantize_dispatch_and_kinds():
    y = _sample(_rng(12), (3, 256))
    assert quant.KINDS == ("fp8_per_token", "fp8_per_group", "mxfp4")
    for kind in quant.KINDS:
        q, s = quant.quantize(y, kind, group_size=64, fp8_dtype=ml_dtypes.float8_e4m3fnuz)
        err = np.abs(quant.dequantize(q, s, kind, out_dtype=np.float64) - y)
        assert np.all(err <= quant.rounding_bound(y, s, kind,
                                                  fp8_dtype=ml_dtypes.float8_e4m3fnuz))
    _, s = quant.quantize(y, "fp8_per_group", group_size=64)
    assert s.shape == (3, 4)
    with pytest.raises(ValueError, match="unknown kind"):
        quant.quantize(y, "int8")


def test_module_imports_no_gpu_code():
    import sys
    import subprocess
    code = ("import sys, pyar.quant.reference as r\n"
            "bad = [m for m in sys.modules if m.startswith(('pyar.comm', 'cupy', 'torch'))]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
    # the package's own modules import only numpy and ml_dtypes
    for mod in (fp8_mod, mx_mod):
        src = open(mod.__file__).read()
        assert "pyar._hip" not in src and "pyar.comm" not in src
