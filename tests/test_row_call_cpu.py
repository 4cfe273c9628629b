"""The argument checks of allreduce_rmsnorm (pyar.comm.row_kernels.RowCall
and Quantization, which add_rmsnorm and quantize share), without a GPU
(tier a): dtypes, shapes, alignment, devices, outputs and their overlaps,
quantization kinds, group sizes and FP8 dtypes.

How this runs without a GPU:

* Arrays are DeviceArrays on made-up, 16-byte-aligned, non-overlapping
  addresses (the ``dev`` fixture of tests/row_stand_ins.py): the
  constructor makes no GPU call when ``device`` is given, and the checks
  only read ``ptr``, ``shape``, ``dtype``, ``device`` and ``readonly``.
  Nothing is dereferenced.  Every test passes explicit outputs, because a
  missing output is allocated with ``pyar.empty`` (a GPU call).
* The layout the checks read is a RowLayout read from a recording module
  whose ``pyar_rmsnorm_layout`` holds the kernel constants
  (tests/test_row_kernels_abi_cpu.py holds those against the source).
* ``fp8_dtype`` is given explicitly except where
  ``row_kernels.default_fp8_dtype`` (or the ``pyar._hip.Device`` query
  behind it) is replaced; foreign arrays go through
  ``pyar.comm.arguments.asarray``, replaced where a test passes them.
* A call on a closed communicator goes through ``comm.allreduce_rmsnorm``
  on a NodeCommunicator assembled over stand-ins (tests/comm_stand_ins.py).
"""
import types

import numpy as np
import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

import ml_dtypes  # noqa: E402

import pyar  # noqa: E402
from pyar import _hip  # noqa: E402
from pyar.comm import arguments, row_kernels  # noqa: E402
from tests.comm_stand_ins import BF16, F16, F32  # noqa: E402
from tests.row_stand_ins import (  # noqa: E402,F401 - dev: the fixture
    E4M3FN, E4M3FNUZ, ROW_LAYOUT, STREAM, U8, communicator, dev, quant_outputs,
    rmsnorm_arguments, row_call,
)


def test_fake_arrays_make_no_gpu_call(dev):
    # The premise of this file: the checks read these attributes and nothing else.
    a = dev((4, 2880), BF16)
    assert (a.shape, a.dtype, a.device, a.readonly, a.nbytes) == ((4, 2880), BF16, 0, False,
                                                                  4 * 2880 * 2)
    assert a.ptr % 16 == 0 and isinstance(a, pyar.DeviceArray)


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_a_plain_call_is_accepted(dev, dtype):
    hidden = 16384
    call = row_call(dev, tokens=3, hidden=hidden, dtype=dtype)
    assert (call.tokens, call.hidden, call.eps) == (3, hidden, 1e-6)
    assert call.residual_out is call.residual  # in place by default
    assert call.quant is None and call.quantized is None and call.scales is None
    assert (call.quant_code, call.group) == (0, 0)
    assert call.agreement_key() == (3, hidden, str(dtype), 0, 0)
    assert call.outputs() == (call.out, call.residual, None, None)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, U8])
def test_unsupported_dtype(dev, dtype):
    with pytest.raises(TypeError, match="allreduce_rmsnorm supports"):
        row_call(dev, dtype=dtype, hidden=512, out=None)


@pytest.mark.parametrize("shape", [(2880,), (2, 4, 2880), ()])
def test_x_must_be_2d(dev, shape):
    x = dev(shape, BF16)
    with pytest.raises(ValueError, match="must be 2-D"):
        row_call(dev, x=x, residual=dev(shape, BF16), weight=dev((2880,), BF16), out=None)


def test_residual_shape_must_match(dev):
    with pytest.raises(ValueError, match=r"residual has shape \(5, 2880\), x has \(4, 2880\)"):
        row_call(dev, residual=dev((5, 2880), BF16))


@pytest.mark.parametrize("shape", [(2872,), (1, 2880), (2880, 1)])
def test_weight_shape_must_be_hidden(dev, shape):
    with pytest.raises(ValueError, match=r"expected \(2880,\) for hidden size 2880"):
        row_call(dev, weight=dev(shape, BF16))


@pytest.mark.parametrize("which", ["residual", "weight"])
def test_residual_and_weight_dtype_must_match(dev, which):
    wrong = dev((4, 2880) if which == "residual" else (2880,), F16)
    with pytest.raises(TypeError, match=f"{which} has dtype float16, x has bfloat16"):
        row_call(dev, **{which: wrong})


@pytest.mark.parametrize("dtype, hidden, ok", [
    (BF16, 2880, True), (BF16, 2884, False), (BF16, 8, True), (BF16, 4, False),
    (F16, 2888, True), (F16, 2890, False), (F32, 2884, True), (F32, 2882, False),
    (BF16, 16384, True), (BF16, 16392, False), (F32, 16384, True), (F32, 16388, False),
    (BF16, 0, False),
])
def test_hidden_is_whole_packs_up_to_the_maximum(dev, dtype, hidden, ok):
    if ok:
        assert row_call(dev, dtype=dtype, hidden=hidden).hidden == hidden
    else:
        lanes = 16 // np.dtype(dtype).itemsize
        with pytest.raises(ValueError, match=f"hidden size {hidden} is not supported .* "
                                             f"multiple of {lanes} up to 16384"):
            row_call(dev, dtype=dtype, hidden=hidden)


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf"), -float("inf")])
def test_eps_must_be_finite_and_non_negative(dev, eps):
    with pytest.raises(ValueError, match="eps must be finite and >= 0"):
        row_call(dev, eps=eps)


@pytest.mark.parametrize("eps", [0, 0.0, 1e-5, np.float32(1e-6), 1])
def test_eps_is_a_float(dev, eps):
    call = row_call(dev, eps=eps)
    assert type(call.eps) is float and call.eps == float(eps)


@pytest.mark.parametrize("quant", ["fp8", "FP8_PER_TOKEN", "mxfp8", "", 1])
def test_unknown_quant_kind(dev, quant):
    with pytest.raises(ValueError, match="quant must be None or one of"):
        row_call(dev, quant=quant)


def test_fp8_per_group_needs_hidden_divisible_by_group(dev):
    with pytest.raises(ValueError, match=r"hidden \(2880\) divisible by group_size \(128\)"):
        row_call(dev, quant="fp8_per_group", group_size=128)


@pytest.mark.parametrize("dtype, group_size", [
    (BF16, 24), (BF16, 512), (BF16, 4), (BF16, 96), (F32, 256), (F32, 12), (F16, 1024)])
def test_unsupported_group_size(dev, dtype, group_size):
    hidden = group_size * 8  # whole packs and divisible by the group: only the group is wrong
    with pytest.raises(ValueError, match=f"group_size {group_size} is not supported"):
        row_call(dev, dtype=dtype, hidden=hidden, quant="fp8_per_group", group_size=group_size)


@pytest.mark.parametrize("group_size", [0, -128, 128.0, "128", True, None])
def test_group_size_must_be_a_positive_int(dev, group_size):
    with pytest.raises(ValueError, match="group_size must be a positive int"):
        row_call(dev, hidden=1024, quant="fp8_per_group", group_size=group_size)


@pytest.mark.parametrize("dtype, group_size", [
    (BF16, 8), (BF16, 16), (BF16, 64), (BF16, 128), (BF16, 256), (F16, 256), (F32, 4),
    (F32, 128), (BF16, 2880), (BF16, np.int64(32))])
def test_supported_group_sizes(dev, dtype, group_size):
    hidden = 2880 if group_size == 2880 else 1024
    q, s = quant_outputs(dev, "fp8_per_group", 4, hidden, int(group_size))
    call = row_call(dev, dtype=dtype, hidden=hidden, quant="fp8_per_group", group_size=group_size,
                 quantized=q, scales=s, out=None)
    assert call.group == group_size and type(call.group) is int
    assert call.scales.shape == (4, hidden // group_size)


@pytest.mark.parametrize("dtype, hidden", [(BF16, 2888), (F32, 36), (F16, 16376)])
def test_mxfp4_needs_hidden_divisible_by_32(dev, dtype, hidden):
    with pytest.raises(ValueError, match=f"mxfp4 needs hidden divisible by 32, got {hidden}"):
        row_call(dev, dtype=dtype, hidden=hidden, quant="mxfp4")


@pytest.mark.parametrize("fp8_dtype", [np.float16, BF16, np.int8, U8,
                                       ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3b11fnuz])
def test_bad_fp8_dtype(dev, fp8_dtype):
    with pytest.raises(TypeError, match="fp8_dtype must be ml_dtypes.float8_e4m3fn or "
                                        "float8_e4m3fnuz"):
        row_call(dev, quant="fp8_per_token", fp8_dtype=fp8_dtype)


@pytest.mark.parametrize("which", ["x", "residual", "weight", "out", "residual_out",
                                   "quantized", "scales"])
@pytest.mark.parametrize("offset", [2, 8])
def test_misaligned_pointer(dev, which, offset):
    tokens, hidden = 4, 1024
    arrays = {"x": (tokens, hidden), "residual": (tokens, hidden), "weight": (hidden,),
              "out": (tokens, hidden), "residual_out": (tokens, hidden)}
    q, s = quant_outputs(dev, "fp8_per_group", tokens, hidden)
    given = {"quantized": q, "scales": s}
    for name, shape in arrays.items():
        given[name] = dev(shape, BF16)
    bad = given[which]
    given[which] = dev(bad.shape, bad.dtype, at=bad.ptr + offset)
    with pytest.raises(ValueError, match=f"{which} is not 16-byte aligned"):
        row_call(dev, quant="fp8_per_group", **given)


def test_arrays_must_be_on_the_calls_device(dev):
    with pytest.raises(ValueError, match="weight lives on device 1, the call runs on device 0"):
        row_call(dev, weight=dev((2880,), BF16, device=1))


def test_host_arrays_are_refused(dev):
    with pytest.raises(TypeError, match=r"host \(numpy\) array"):
        row_call(dev, residual=np.zeros((4, 2880), BF16))


def test_foreign_arrays_are_ordered_before_the_calls_stream(dev, monkeypatch):
    """Each foreign array, input or output, is viewed for the call's stream:
    its producer orders its pending work before the kernels (asarray's
    ``stream``, which DLPack and the array interface pass on)."""
    views = {}
    asked = []

    def asarray(obj, stream=None):
        asked.append((obj, stream))
        return views[obj]

    monkeypatch.setattr(arguments, "asarray", asarray)
    names = ("x", "residual", "weight", "out", "residual_out", "quantized", "scales")
    shapes = [((4, 2880), BF16)] * 2 + [((2880,), BF16)] + [((4, 2880), BF16)] * 2
    shapes += [((4, 2880), E4M3FN), ((4, 1), F32)]
    foreign = {name: object() for name in names}
    views.update({foreign[name]: dev(*shape) for name, shape in zip(names, shapes)})
    stream = 0x5555
    row_kernels.RowCall(*(foreign[name] for name in names[:3]), 1e-6, foreign["out"],
                    foreign["residual_out"], "fp8_per_token", 128, E4M3FN,
                    foreign["quantized"], foreign["scales"], stream, 0, ROW_LAYOUT)
    name_of = {id(obj): name for name, obj in foreign.items()}
    assert sorted((name_of[id(obj)], s) for obj, s in asked) == sorted(
        (name, stream) for name in names)


@pytest.mark.parametrize("shape, dtype", [((4, 2872), BF16), ((3, 2880), BF16), ((4, 2880), F16),
                                          ((11520,), BF16)])
def test_out_with_wrong_shape_or_dtype(dev, shape, dtype):
    with pytest.raises(ValueError, match="out has shape .* expected"):
        row_call(dev, out=dev(shape, dtype))


def test_read_only_outputs_are_refused(dev):
    with pytest.raises(ValueError, match="out is a read-only array"):
        row_call(dev, out=dev((4, 2880), BF16, readonly=True))
    with pytest.raises(ValueError, match="residual_out is a read-only array"):
        row_call(dev, residual_out=dev((4, 2880), BF16, readonly=True))


def test_output_over_an_input_is_refused(dev):
    x = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps x"):
        row_call(dev, x=x, out=x)
    with pytest.raises(ValueError, match="residual_out overlaps x"):
        row_call(dev, x=x, residual_out=dev((4, 2880), BF16, at=x.ptr + 2 * 2880))
    x, residual = dev((4, 2880), BF16), dev((4, 2880), BF16)
    weight = dev((2880,), BF16)  # allocated last: an out starting 16 bytes before it
    with pytest.raises(ValueError, match="out overlaps weight"):  # overlaps only weight
        row_call(dev, x=x, residual=residual, weight=weight,
              out=dev((4, 2880), BF16, at=weight.ptr - 16))
    residual = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps residual"):
        row_call(dev, residual=residual, out=residual)


def test_outputs_over_each_other_are_refused(dev):
    out = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="out overlaps residual_out"):
        row_call(dev, out=out, residual_out=out)
    q = dev((4, 2880), E4M3FN)
    with pytest.raises(ValueError, match="scales overlaps quantized"):
        row_call(dev, quant="fp8_per_token", quantized=q,
              scales=dev((4, 1), F32, at=q.ptr + 64))


def test_in_place_residual_over_x_is_refused(dev):
    x = dev((4, 2880), BF16)
    with pytest.raises(ValueError, match="residual overlaps x"):
        row_call(dev, x=x, residual=x)


def test_in_place_residual_over_weight_is_refused(dev):
    # In place, residual is written while every row reads weight: it is an
    # output like a separate residual_out, which may not overlap weight.
    residual = dev((4, 2880), BF16)
    weight = dev((2880,), BF16, at=residual.ptr + 2880 * 2)  # residual's second row
    with pytest.raises(ValueError, match="residual_out overlaps weight"):
        row_call(dev, weight=weight, residual_out=residual)  # (residual: a fresh array)
    with pytest.raises(ValueError, match="overlaps"):
        row_call(dev, residual=residual, weight=weight)  # in place


def test_read_only_residual_is_not_written_in_place(dev):
    # residual_out=None writes residual: a read-only residual is refused like
    # a read-only out or residual_out ...
    residual = dev((4, 2880), BF16, readonly=True)
    with pytest.raises(ValueError, match="read-only"):
        row_call(dev, residual=residual)
    # ... and is fine as a pure input.
    separate = dev((4, 2880), BF16)
    assert row_call(dev, residual=residual, residual_out=separate).residual_out is separate


@pytest.mark.parametrize("given", ["quantized", "scales"])
def test_quantized_outputs_need_quant(dev, given):
    q, s = quant_outputs(dev, "fp8_per_token", 4, 2880)
    with pytest.raises(ValueError, match="quantized= and scales= need quant="):
        row_call(dev, **{given: q if given == "quantized" else s})


def test_residual_out_none_or_residual_means_in_place(dev):
    residual = dev((4, 2880), BF16)
    assert row_call(dev, residual=residual).residual_out is residual
    assert row_call(dev, residual=residual, residual_out=residual).residual_out is residual
    # Another view of exactly the same memory is the same array.
    alias = dev((4, 2880), BF16, at=residual.ptr)
    assert row_call(dev, residual=residual, residual_out=alias).residual_out is residual
    separate = dev((4, 2880), BF16)
    call = row_call(dev, residual=residual, residual_out=separate)
    assert call.residual_out is separate
    assert call.outputs().residual_out is separate


@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("quant, fp8_dtype, q_last, q_dtype, s_cols, s_dtype, group, code", [
    ("fp8_per_token", E4M3FN, 1024, E4M3FN, 1, F32, 1024, 1),
    ("fp8_per_token", E4M3FNUZ, 1024, E4M3FNUZ, 1, F32, 1024, 0x11),
    ("fp8_per_group", E4M3FN, 1024, E4M3FN, 8, F32, 128, 1),
    ("fp8_per_group", E4M3FNUZ, 1024, E4M3FNUZ, 8, F32, 128, 0x11),
    ("mxfp4", None, 512, U8, 32, U8, 32, 2),
])
def test_quantized_outputs_per_kind(dev, dtype, quant, fp8_dtype, q_last, q_dtype, s_cols,
                                    s_dtype, group, code):
    tokens, hidden = 5, 1024
    q, s = dev((tokens, q_last), q_dtype), dev((tokens, s_cols), s_dtype)
    call = row_call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                 fp8_dtype=fp8_dtype, quantized=q, scales=s, out=None)
    assert call.quantized is q and call.scales is s
    assert call.out is None  # no normed output unless asked for
    assert (call.quant.kind, call.group, call.quant_code) == (quant, group, code)
    assert call.quant.q_dtype == q_dtype and call.quant.scale_dtype == s_dtype
    assert call.agreement_key() == (tokens, hidden, str(dtype), code, group)
    assert call.outputs() == (None, call.residual, q, s)
    out = dev((tokens, hidden), dtype)
    assert row_call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                 fp8_dtype=fp8_dtype, quantized=q, scales=s, out=out).out is out
    # Each quantized output with a wrong shape or dtype is refused.
    for name, good in (("quantized", q), ("scales", s)):
        wrong_shape = dev((tokens, good.shape[1] * 2), good.dtype)
        other = F16 if good.dtype != F16 else F32
        for wrong in (wrong_shape, dev(good.shape, other)):
            given = {"quantized": q, "scales": s, name: wrong}
            with pytest.raises(ValueError, match=f"{name} has shape .* expected"):
                row_call(dev, tokens=tokens, hidden=hidden, dtype=dtype, quant=quant,
                      fp8_dtype=fp8_dtype, out=None, **given)


def test_fp8_codes_must_have_the_chosen_fp8_dtype(dev):
    q, s = quant_outputs(dev, "fp8_per_token", 4, 2880, fp8_dtype=E4M3FNUZ)
    with pytest.raises(ValueError, match="quantized has shape .* float8_e4m3fn$"):
        row_call(dev, quant="fp8_per_token", fp8_dtype=E4M3FN, quantized=q, scales=s)


@pytest.mark.parametrize("default", [E4M3FN, E4M3FNUZ])
def test_fp8_dtype_defaults_to_the_devices(dev, monkeypatch, default):
    asked = []
    monkeypatch.setattr(row_kernels, "default_fp8_dtype", lambda device: asked.append(device)
                        or default)
    q, s = quant_outputs(dev, "fp8_per_group", 4, 1024, fp8_dtype=default)
    call = row_call(dev, hidden=1024, quant="fp8_per_group", fp8_dtype=None, quantized=q,
                 scales=s)
    assert asked == [0]
    assert call.quant.q_dtype == default
    assert call.quant_code == (0x11 if default == E4M3FNUZ else 1)
    # An explicit fp8_dtype does not ask the device.
    asked.clear()
    row_call(dev, hidden=1024, quant="fp8_per_token", fp8_dtype=E4M3FN,
          quantized=dev((4, 1024), E4M3FN), scales=dev((4, 1), F32))
    mx = quant_outputs(dev, "mxfp4", 4, 1024)
    row_call(dev, hidden=1024, quant="mxfp4", fp8_dtype=None, quantized=mx[0], scales=mx[1])
    assert asked == []


@pytest.mark.parametrize("arch, want", [("gfx942", E4M3FNUZ), ("gfx940", E4M3FNUZ),
                                        ("gfx950", E4M3FN), ("gfx90a", E4M3FN),
                                        ("sm_90", E4M3FN)])
def test_default_fp8_dtype_by_arch(monkeypatch, arch, want):
    monkeypatch.setattr(_hip, "Device",
                        lambda ordinal: types.SimpleNamespace(arch=arch, ordinal=ordinal))
    assert row_kernels.default_fp8_dtype(0) == want


def test_zero_tokens_is_accepted(dev):
    q, s = quant_outputs(dev, "mxfp4", 0, 2880)
    call = row_call(dev, tokens=0, hidden=2880, quant="mxfp4", quantized=q, scales=s)
    assert call.tokens == 0 and call.quantized.shape == (0, 1440)


def test_a_closed_communicator_refuses_the_call(dev):
    comm, recorded = communicator(4)
    comm.close()
    with pytest.raises(ValueError, match="communicator is closed"):
        comm.allreduce_rmsnorm(**rmsnorm_arguments(dev, 4, 1024), stream=STREAM)
    assert recorded.take() == []


def test_empty_outputs_overlap_nothing(dev):
    """An empty array holds no memory: zero rows of out may start anywhere."""
    weight = dev((2880,), BF16)
    out = dev((0, 2880), BF16, at=weight.ptr + 16)
    assert row_call(dev, tokens=0, weight=weight, out=out).out is out
