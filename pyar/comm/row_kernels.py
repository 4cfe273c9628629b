"""The row kernels of src/kernels/allreduce_rmsnorm.cu: residual add +
RMSNorm (+ quantization) after an all-reduce, their argument checks, output
allocation and launch geometry.

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
from pyar.array import DeviceArray
from pyar.comm.arguments import checked_output, device_array, overlaps
from pyar.comm.kernels import (
    ADD_RMSNORM_ARGS, DTYPE_NAMES, PACK_BYTES, QUANT_KIND_NAMES, QUANTIZE_ARGS, Functions,
    row_suffix,
)

QUANT_KINDS = ("fp8_per_token", "fp8_per_group", "mxfp4")
FP8_DTYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e4m3fnuz))
_E8M0 = np.dtype(np.uint8)
_KIND_CODE = {None: 0, "fp8_per_token": 1, "fp8_per_group": 1, "mxfp4": 2}
# Row blocks are whole multiples of the widest warp (AMD's 64 lanes), so
# every warp of a block is full for its shuffles.
ROW_THREAD_QUANTUM = 64
# Rows of at least this many packs: the single-GPU kernels that quantize to
# FP8 take two packs a thread (quantize and add_rmsnorm with an FP8 quant=; a
# row's outputs have the same bits at any packs per thread).  Two packs a
# thread make the FP8 kernels faster on rows this wide; MXFP4 quantize and
# plain add_rmsnorm gain nothing dependable from them, so those keep the
# fewest (docs/tuning.md has the timings).
PAIRED_ROW_PACKS = 512

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


def quant_code(kind):
    """The QuantKind code of a ``quant=`` kind (None: no quantization)."""
    return _KIND_CODE[kind]


class RowLayout:
    """Sizes read from a loaded allreduce_rmsnorm Module (pyar_rmsnorm_layout)."""

    _FIELDS = ("max_hidden", "max_row_threads", "mx_block", "fnuz_flag")

    def __init__(self, module):
        ptr, size = module.get_global("pyar_rmsnorm_layout")
        raw = bytearray(size)
        _hip.memcpy_dtoh(raw, ptr)
        for i, name in enumerate(self._FIELDS):
            setattr(self, name, int.from_bytes(raw[8 * i:8 * i + 8], "little"))

    def packs_per_thread_choices(self, itemsize):
        """Every packs-per-thread value some supported row needs (the kernels
        instantiate exactly these)."""
        widest = row_launch(1, self.max_hidden, itemsize, self.max_row_threads, 1, 1)
        return tuple(1 << i for i in range(widest.packs_per_thread.bit_length()))


RowLaunch = collections.namedtuple("RowLaunch", "packs_per_thread threads blocks")
RowLaunch.__doc__ = """How a row kernel is launched: ``threads`` per block, each
owning ``packs_per_thread`` 16-byte packs of every row (the kernel's p<N>
suffix), and ``blocks``, each taking rows b, b + blocks, ..."""


def row_launch(tokens, hidden, itemsize, max_row_threads, block_cap, max_blocks,
               cap_threads=None, least_per_thread=1):
    """The launch geometry of every row kernel (fused, add_rmsnorm, quantize)
    for ``tokens`` rows of ``hidden`` elements of ``itemsize`` bytes.

    Packs per thread: the fewest (a power of two, at least
    ``least_per_thread``) that keep a row within
    ``max_row_threads`` threads; threads: the row's packs over that, rounded
    up to ROW_THREAD_QUANTUM.  ``block_cap`` counts blocks of ``cap_threads``
    threads (default max_row_threads / 2, the all-reduce kernels' blocks)
    that may be resident at once; the kernels use at most 64 registers a
    thread, so a multiprocessor holds at least max_row_threads // threads
    row blocks for every two such blocks, and the cap scales by that.  At
    most one block per row and at most ``max_blocks``."""
    cap_threads = max_row_threads // 2 if cap_threads is None else cap_threads
    packs = hidden * itemsize // PACK_BYTES
    per_thread = least_per_thread
    while -(-packs // per_thread) > max_row_threads:
        per_thread *= 2
    threads = -(-packs // per_thread)
    threads = -(-threads // ROW_THREAD_QUANTUM) * ROW_THREAD_QUANTUM
    scaled = block_cap * ((2 * cap_threads) // threads) // 2
    return RowLaunch(per_thread, threads, max(1, min(tokens, scaled, max_blocks)))


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



def _check_rows(a, what, operation):
    if a.dtype not in DTYPE_NAMES:
        raise TypeError(f"{what} has dtype {a.dtype}; {operation} supports "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if a.ndim != 2:
        raise ValueError(f"{what} must be 2-D (tokens, hidden), got shape {a.shape}")


def _lanes(hidden, dtype, layout):
    """Elements per 16-byte pack, once ``hidden`` is known to fit the kernels' rows."""
    lanes = PACK_BYTES // dtype.itemsize
    if not 0 < hidden <= layout.max_hidden or hidden % lanes:
        raise ValueError(f"hidden size {hidden} is not supported for {dtype}: it must be a "
                         f"multiple of {lanes} up to {layout.max_hidden}")
    return lanes


def _output(given, what, shape, dtype, stream, device):
    return checked_output(given, what, shape, (dtype,), device, stream)


class RowCall:
    """The checked arrays and scalars of one residual add + RMSNorm (+ quant)."""

    def __init__(self, x, residual, weight, eps, out, residual_out, quant, group_size,
                 fp8_dtype, quantized, scales, stream, device, layout):
        x = device_array(x, "x", device, stream, aligned=True)
        residual = device_array(residual, "residual", device, stream, aligned=True)
        weight = device_array(weight, "weight", device, stream, aligned=True)
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
                if overlaps(a, b):
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
        self._functions = Functions(module)

    def function(self, name, types):
        return self._functions.get(name, types)

    def launch(self, tokens, hidden, dtype, block_cap, max_blocks, cap_threads=None):
        """row_launch for this module's layout."""
        return row_launch(tokens, hidden, np.dtype(dtype).itemsize, self.layout.max_row_threads,
                          block_cap, max_blocks, cap_threads)

    def local_launch(self, tokens, hidden, dtype, quant_code, max_blocks):
        """row_launch of a single-GPU kernel, whose cap is ``max_blocks`` of
        half-size blocks: two packs a thread for FP8 rows of PAIRED_ROW_PACKS
        or more."""
        itemsize = np.dtype(dtype).itemsize
        paired = (QUANT_KIND_NAMES[quant_code & 0xF] == "fp8"
                  and hidden * itemsize // PACK_BYTES >= PAIRED_ROW_PACKS)
        return row_launch(tokens, hidden, itemsize, self.layout.max_row_threads, max_blocks,
                          tokens, least_per_thread=2 if paired else 1)

    def add_rmsnorm(self, call, stream, max_blocks, s=None):
        """Queues the add + RMSNorm (+ quantization) of ``call`` on the sums
        ``s`` (``call.x`` when None; may be ``call.out`` itself)."""
        if call.tokens == 0:
            return
        s = call.x if s is None else s
        function, blocks, threads, args = self.add_rmsnorm_launch(call, s.ptr, 0, call.tokens,
                                                                  max_blocks)
        function.launch(blocks, threads, args, stream=stream)

    def add_rmsnorm_launch(self, call, s_ptr, first, count, max_blocks, failed_ptr=0):
        """(function, blocks, threads, args) of add + RMSNorm (+ quantization)
        of ``call``'s rows [first, first + count) from the ``count`` rows of
        sums at ``s_ptr``: split's second kernel, and the single-GPU step.
        ``failed_ptr``: split's, the Signal word that makes the kernel write
        nothing after a first kernel that failed."""
        # Nothing here waits for a peer: blocks beyond the resident ones just queue.
        geometry = self.local_launch(count, call.hidden, call.x.dtype, call.quant_code,
                                     max_blocks)
        function = self.function(
            "pyar_add_rmsnorm_" + row_suffix(call.x.dtype, call.quant_code,
                                             geometry.packs_per_thread),
            ADD_RMSNORM_ARGS)
        return (function, geometry.blocks, geometry.threads,
                (s_ptr, count, *call.row_args(first, count), failed_ptr))

    def quantize(self, y, quant, quantized, scales, stream, max_blocks):
        tokens, hidden = y.shape
        if tokens == 0:
            return
        geometry = self.local_launch(tokens, hidden, y.dtype, quant.code, max_blocks)
        function = self.function(
            "pyar_quantize_" + row_suffix(y.dtype, quant.code, geometry.packs_per_thread),
            QUANTIZE_ARGS)
        function.launch(geometry.blocks, geometry.threads,
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
    y = device_array(y, "y", device, stream, aligned=True)
    _check_rows(y, "y", "quantize")
    tokens, hidden = y.shape
    lanes = _lanes(hidden, y.dtype, kernels.layout)
    q = Quantization(quant, hidden, lanes, group_size, fp8_dtype, kernels.layout, device)
    quantized = _output(quantized, "quantized", (tokens, q.q_shape_last), q.q_dtype, stream,
                        device)
    scales = _output(scales, "scales", (tokens, q.scale_columns), q.scale_dtype, stream, device)
    for name, a, others in (("quantized", quantized, (y,)), ("scales", scales, (y, quantized))):
        if any(overlaps(a, b) for b in others):
            raise ValueError(f"{name} overlaps its input or the other output")
    kernels.quantize(y, q, quantized, scales, stream, _local_blocks(device))
    return quantized, scales
