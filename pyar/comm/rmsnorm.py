"""Residual add + RMSNorm (+ quantization) after an all-reduce: argument checks,
output allocation and the kernels of src/kernels/allreduce_rmsnorm.cu.

``Communicator.allreduce_rmsnorm`` runs the fused collective; ``add_rmsnorm``
and ``quantize`` here are the same steps on one GPU (a world of one, and the
unfused baseline the benchmark measures against).
"""
import collections
import functools
import math

import ml_dtypes
import numpy as np

from pyar import _hip, _kernels
from pyar.array import DeviceArray, asarray, empty

DTYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float16): "f16",
    np.dtype(ml_dtypes.bfloat16): "bf16",
}
QUANT_KINDS = ("fp8_per_token", "fp8_per_group", "mxfp4")
FP8_DTYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz))
PACK_BYTES = 16
_E8M0 = np.dtype(np.uint8)
_KIND_CODE = {None: 0, "fp8_per_token": 1, "fp8_per_group": 1, "mxfp4": 2}
_ROW_TYPES = ("ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "uint32", "float32", "uint32", "uint32")
FUSED_TYPES = ("ptr", "uint64", "uint64", *_ROW_TYPES, "ptr", "uint64", "uint32")

FusedOutputs = collections.namedtuple("FusedOutputs", "out residual_out quantized scales")
FusedOutputs.__doc__ = """What ``allreduce_rmsnorm`` returns.

out           the normed output y (None when a quantized output was asked for
              without ``out``)
residual_out  r = sum + residual (the residual array itself when in place)
quantized     FP8 codes (tokens, hidden) or packed E2M1 (tokens, hidden // 2); None
              without ``quant``
scales        float32 (tokens, 1) or (tokens, hidden // group_size), or E8M0 codes
              uint8 (tokens, hidden // 32); None without ``quant``
"""


class RowLayout:
    """Sizes read from a loaded allreduce_rmsnorm Module (pyar_rmsnorm_layout)."""

    _FIELDS = ("max_hidden", "threads", "mx_block", "fnuz_flag")

    def __init__(self, module):
        ptr, size = module.get_global("pyar_rmsnorm_layout")
        raw = bytearray(size)
        _hip.memcpy_dtoh(raw, ptr)
        for i, name in enumerate(self._FIELDS):
            setattr(self, name, int.from_bytes(raw[8 * i:8 * i + 8], "little"))

    def rows_per_pass(self, hidden, itemsize):
        """Rows a block holds at once (RowPass in the kernels): a thread has
        registers for its packs of a max_hidden row, and narrower rows share them."""
        lanes = PACK_BYTES // itemsize
        slots = self.max_hidden // lanes // self.threads
        packs = hidden // lanes
        return slots // -(-packs // self.threads)


def default_fp8_dtype(device):
    """float8_e4m3fnuz on gfx94x (MI300), whose FP8 hardware uses it; float8_e4m3fn
    elsewhere (NVIDIA, gfx950)."""
    arch = _hip.Device(device).arch
    return FP8_DTYPES[1] if arch.startswith("gfx94") else FP8_DTYPES[0]


class Quantization:
    """A checked ``quant=`` choice: kind, FP8 dtype, elements per scale."""

    def __init__(self, kind, hidden, lanes, group_size, fp8_dtype, layout, device):
        if kind not in QUANT_KINDS:
            raise ValueError(f"quant must be None or one of {QUANT_KINDS}, got {kind!r}")
        self.kind = kind
        if kind == "mxfp4":
            self.group = layout.mx_block
            if hidden % self.group:
                raise ValueError(f"mxfp4 needs hidden divisible by {self.group}, got {hidden}")
            self.q_shape_last, self.scale_dtype = hidden // 2, _E8M0
            self.q_dtype = np.dtype(np.uint8)
            self.flags = 0
        else:
            self.q_dtype = (default_fp8_dtype(device) if fp8_dtype is None
                            else np.dtype(fp8_dtype))
            if self.q_dtype not in FP8_DTYPES:
                raise TypeError(f"fp8_dtype must be ml_dtypes.float8_e4m3fn or "
                                f"float8_e4m3fnuz, got {fp8_dtype!r}")
            self.group = hidden if kind == "fp8_per_token" else self._group(group_size, hidden,
                                                                            lanes)
            self.q_shape_last, self.scale_dtype = hidden, np.dtype(np.float32)
            self.flags = layout.fnuz_flag if self.q_dtype == FP8_DTYPES[1] else 0
        self.scale_columns = hidden // self.group
        self.code = _KIND_CODE[kind] | self.flags

    @staticmethod
    def _group(group_size, hidden, lanes):
        if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
                or group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        group_size = int(group_size)
        if hidden % group_size:
            raise ValueError(f"fp8_per_group needs hidden ({hidden}) divisible by group_size "
                             f"({group_size})")
        packs = group_size // lanes
        if group_size != hidden and (group_size % lanes or packs & (packs - 1) or packs > 32):
            raise ValueError(f"group_size {group_size} is not supported for this dtype: use "
                             f"{lanes} times a power of two up to {32 * lanes}, or hidden "
                             "(one scale per token)")
        return group_size


def _device_array(x, what, device):
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what} is a host (numpy) array; copy it to the GPU with "
                        "pyar.asarray first")
    if not isinstance(x, DeviceArray):
        x = asarray(x)
    if x.size and x.device != device:
        raise ValueError(f"{what} lives on device {x.device}, the call runs on device {device}")
    if x.size and x.ptr % PACK_BYTES:
        raise ValueError(f"{what} is not {PACK_BYTES}-byte aligned (address {x.ptr:#x})")
    return x


def _check_rows(a, what, operation):
    if a.dtype not in DTYPES:
        raise TypeError(f"{what} has dtype {a.dtype}; {operation} supports "
                        f"{', '.join(str(d) for d in DTYPES)}")
    if a.ndim != 2:
        raise ValueError(f"{what} must be 2-D (tokens, hidden), got shape {a.shape}")


def _lanes(hidden, dtype, layout):
    """Elements per 16-byte pack, once ``hidden`` is known to fit the kernels' rows."""
    lanes = PACK_BYTES // dtype.itemsize
    if not 0 < hidden <= layout.max_hidden or hidden % lanes:
        raise ValueError(f"hidden size {hidden} is not supported for {dtype}: it must be a "
                         f"multiple of {lanes} up to {layout.max_hidden}")
    return lanes


def _overlaps(a, b):
    return a.size and b.size and a.ptr < b.ptr + b.nbytes and b.ptr < a.ptr + a.nbytes


def _output(given, what, shape, dtype, stream, device):
    if given is None:
        return empty(shape, dtype, stream=stream)
    given = _device_array(given, what, device)
    if given.shape != shape or given.dtype != dtype:
        raise ValueError(f"{what} has shape {given.shape} and dtype {given.dtype}; expected "
                         f"{shape} and {dtype}")
    if given.readonly:
        raise ValueError(f"{what} is a read-only array")
    return given


class RowCall:
    """The checked arrays and scalars of one residual add + RMSNorm (+ quant)."""

    def __init__(self, x, residual, weight, eps, out, residual_out, quant, group_size,
                 fp8_dtype, quantized, scales, stream, device, layout):
        x = _device_array(x, "x", device)
        residual = _device_array(residual, "residual", device)
        weight = _device_array(weight, "weight", device)
        _check_rows(x, "x", "allreduce_rmsnorm")
        for name, a in (("residual", residual), ("weight", weight)):
            if a.dtype != x.dtype:
                raise TypeError(f"{name} has dtype {a.dtype}, x has {x.dtype}; they must match")
        if residual.shape != x.shape:
            raise ValueError(f"residual has shape {residual.shape}, x has {x.shape}; they "
                             "must match")
        tokens, hidden = x.shape
        if weight.shape != (hidden,):
            raise ValueError(f"weight has shape {weight.shape}; expected ({hidden},) for "
                             f"hidden size {hidden}")
        lanes = _lanes(hidden, x.dtype, layout)
        eps = float(eps)
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
        self.quant = None if quant is None else Quantization(
            quant, hidden, lanes, group_size, fp8_dtype, layout, device)
        if self.quant is None and (quantized is not None or scales is not None):
            raise ValueError("quantized= and scales= need quant=")
        self.x, self.residual, self.weight, self.eps = x, residual, weight, eps
        self.tokens, self.hidden = tokens, hidden
        want_out = out is not None or self.quant is None
        self.out = _output(out, "out", x.shape, x.dtype, stream, device) if want_out else None
        self.residual_out = (residual if residual_out is None or _same(residual_out, residual)
                             else _output(residual_out, "residual_out", x.shape, x.dtype,
                                          stream, device))
        if self.quant is None:
            self.quantized = self.scales = None
        else:
            q = self.quant
            self.quantized = _output(quantized, "quantized", (tokens, q.q_shape_last),
                                     q.q_dtype, stream, device)
            self.scales = _output(scales, "scales", (tokens, q.scale_columns), q.scale_dtype,
                                  stream, device)
        self._check_aliasing()

    def _check_aliasing(self):
        inputs = [("x", self.x), ("weight", self.weight)]
        if self.residual_out is self.residual:  # in place: residual is an output too
            if self.residual.readonly:
                raise ValueError("residual is read-only and residual_out=None writes it in "
                                 "place; pass residual_out")
            outputs = [("residual", self.residual)]
        else:
            inputs.append(("residual", self.residual))
            outputs = [("residual_out", self.residual_out)]
        outputs += [(n, a) for n, a in (("out", self.out), ("quantized", self.quantized),
                                        ("scales", self.scales)) if a is not None]
        for i, (name, a) in enumerate(outputs):
            for other, b in inputs + outputs[:i]:
                if _overlaps(a, b):
                    raise ValueError(f"{name} overlaps {other}; outputs must be separate arrays "
                                     "(only residual_out may be residual itself)")

    @property
    def quant_code(self):
        return 0 if self.quant is None else self.quant.code

    @property
    def group(self):
        return 0 if self.quant is None else self.quant.group

    def agreement_key(self):
        """What every rank's call must agree on."""
        return (self.tokens, self.hidden, str(self.x.dtype), self.quant_code, self.group)

    def row_args(self, first, count):
        """The kernels' row arguments for tokens [first, first + count)."""
        row = self.hidden * self.x.dtype.itemsize

        def at(a, row_bytes):
            return 0 if a is None else a.ptr + first * row_bytes

        q = self.quant
        return (at(self.residual, row), self.weight.ptr, at(self.residual_out, row),
                at(self.out, row),
                at(self.quantized, q.q_shape_last * q.q_dtype.itemsize if q else 0),
                at(self.scales, q.scale_columns * q.scale_dtype.itemsize if q else 0),
                self.hidden, self.eps, self.quant_code, self.group)

    def outputs(self):
        return FusedOutputs(self.out, self.residual_out, self.quantized, self.scales)


def _same(a, b):
    return isinstance(a, DeviceArray) and a.ptr == b.ptr and a.nbytes == b.nbytes \
        and a.shape == b.shape and a.dtype == b.dtype


class RowKernels:
    """The single-GPU kernels of allreduce_rmsnorm.cu in one loaded Module."""

    def __init__(self, module):
        self.module = module
        self.layout = RowLayout(module)
        self._functions = {}

    def function(self, name, types):
        function = self._functions.get(name)
        if function is None:
            function = self._functions[name] = self.module.get_function(name, types)
        return function

    def passes(self, tokens, hidden, dtype):
        """Blocks that give every block rows: one per pass of rows."""
        per_pass = self.layout.rows_per_pass(hidden, np.dtype(dtype).itemsize)
        return max(1, -(-tokens // per_pass))

    def add_rmsnorm(self, call, stream, max_blocks):
        if call.tokens == 0:
            return
        function = self.function(f"pyar_add_rmsnorm_{DTYPES[call.x.dtype]}",
                                 ("ptr", "uint64", *_ROW_TYPES))
        function.launch(min(max_blocks, self.passes(call.tokens, call.hidden, call.x.dtype)),
                        self.layout.threads,
                        (call.x.ptr, call.tokens, *call.row_args(0, call.tokens)), stream=stream)

    def quantize(self, y, quant, quantized, scales, stream, max_blocks):
        tokens, hidden = y.shape
        if tokens == 0:
            return
        function = self.function(f"pyar_quantize_{DTYPES[y.dtype]}",
                                 ("ptr", "uint64", "uint32", "ptr", "ptr", "uint32", "uint32"))
        function.launch(min(max_blocks, self.passes(tokens, hidden, y.dtype)), self.layout.threads,
                        (y.ptr, tokens, hidden, quantized.ptr, scales.ptr, quant.code,
                         quant.group), stream=stream)


@functools.lru_cache(maxsize=None)
def _kernels_for(device):
    return RowKernels(_kernels.load("allreduce_rmsnorm", device))


@functools.lru_cache(maxsize=None)
def _local_blocks(device):
    """Enough blocks to fill the GPU; these kernels wait for nothing."""
    return _hip.Device(device).multiprocessor_count * 2


def add_rmsnorm(s, residual, weight, eps=1e-6, out=None, residual_out=None, stream=None, *,
                quant=None, group_size=128, fp8_dtype=None, quantized=None, scales=None):
    """Residual add + RMSNorm (+ quantization) on one GPU, with the same
    arithmetic as ``Communicator.allreduce_rmsnorm`` after its sum: ``s`` is
    the already-reduced input.  Returns FusedOutputs."""
    device = _hip.get_device()
    kernels = _kernels_for(device)
    call = RowCall(s, residual, weight, eps, out, residual_out, quant, group_size, fp8_dtype,
                   quantized, scales, stream, device, kernels.layout)
    kernels.add_rmsnorm(call, stream, _local_blocks(device))
    return call.outputs()


def quantize(y, quant, group_size=128, fp8_dtype=None, quantized=None, scales=None,
             stream=None):
    """Quantize y (tokens, hidden) on the GPU like the fused kernels do; returns
    ``(quantized, scales)``."""
    device = _hip.get_device()
    kernels = _kernels_for(device)
    y = _device_array(y, "y", device)
    _check_rows(y, "y", "quantize")
    tokens, hidden = y.shape
    lanes = _lanes(hidden, y.dtype, kernels.layout)
    q = Quantization(quant, hidden, lanes, group_size, fp8_dtype, kernels.layout, device)
    quantized = _output(quantized, "quantized", (tokens, q.q_shape_last), q.q_dtype, stream,
                        device)
    scales = _output(scales, "scales", (tokens, q.scale_columns), q.scale_dtype, stream, device)
    for name, a, others in (("quantized", quantized, (y,)), ("scales", scales, (y, quantized))):
        if any(_overlaps(a, b) for b in others):
            raise ValueError(f"{name} overlaps its input or the other output")
    kernels.quantize(y, q, quantized, scales, stream, _local_blocks(device))
    return quantized, scales
