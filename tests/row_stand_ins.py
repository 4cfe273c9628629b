"""Stand-ins for the row kernels of allreduce_rmsnorm, on top of
tests/comm_stand_ins.py, so the CPU tests run its argument checks, its
planner and its whole call path without a GPU.

* ``RecordingModule`` stands in for a loaded code object: it records each
  ``get_function(name, argtypes)`` and hands out a ``CheckingFunction``, a
  RecordingFunction that also refuses what pyar._hip.Function.launch would
  (argument count, integer kinds in range, a float for float32);
  ``get_global`` serves ``pyar_rmsnorm_layout`` with LAYOUT_VALUES, the
  kernel constants (a test holds them against the source).
* ``row_kernels()`` is a real pyar.comm.row_kernels.RowKernels over such a
  module: its RowLayout reads the layout through pyar._hip.memcpy_dtoh,
  replaced while it reads by a copy from the module's bytes.
* ``RecordedKernels`` is a real pyar.comm.kernels.KernelSet over three
  recording modules; ``log`` is every launch of any of its functions, in
  order.  ``communicator()`` assembles a NodeCommunicator over it
  (comm_stand_ins.assemble).
* Arrays (the ``dev`` fixture) are DeviceArrays on made-up, 16-byte
  aligned, non-overlapping addresses with ``device`` given, which makes no
  GPU call; the checks only read ``ptr``, ``shape``, ``dtype``, ``device``
  and ``readonly``.  Tests pass every output, because a missing one is
  allocated with pyar.empty (a GPU call).
"""
import math
import operator
import re
import struct

import ml_dtypes
import numpy as np
import pytest

import pyar
from pyar import _hip
from pyar.comm import row_kernels as rk
from pyar.comm.kernels import DTYPE_NAMES, KernelSet
from tests.comm_stand_ins import BF16, F32, RecordingFunction, array, assemble

E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fnuz)
U8 = np.dtype(np.uint8)

# What pyar_rmsnorm_layout holds, in its order (RowLayout's attributes).
LAYOUT_VALUES = {"max_hidden": 16384, "max_row_threads": 1024, "mx_block": 32,
                 "fnuz_flag": 0x10}
LAYOUT_ADDRESS = 0xABC000
# Every spinning fused kernel's block cap, in blocks of 512 threads.
FUSED_CAP = 40
# The null stream: plans are kept for it (the ``sequences`` fixture records them).
STREAM = pyar.Stream.null()

_RANGES = {"uint32": 1 << 32, "uint64": 1 << 64, "ptr": 1 << 64}


class CheckingFunction(RecordingFunction):
    """A RecordingFunction that refuses the arguments pyar._hip.Function.launch
    would refuse, and adds each launch to ``log`` as (name, grid, block,
    args, stream)."""

    def __init__(self, name, argtypes, log):
        super().__init__(name, argtypes)
        self.log = log

    def launch(self, grid, block, args=(), shared_mem=0, stream=None):
        assert len(args) == len(self.argtypes), (self.name, args)
        for kind, value in zip(self.argtypes, args):
            if kind == "float32":
                assert isinstance(value, float), (self.name, kind, value)
            else:
                assert not isinstance(value, (bool, float)), (self.name, kind, value)
                assert 0 <= operator.index(value) < _RANGES[kind], (self.name, kind, value)
        super().launch(grid, block, args, shared_mem, stream)
        self.log.append((self.name, grid, block, tuple(args), stream))


class RecordingModule:
    """A loaded code object: ``requests`` lists each get_function(name,
    argtypes), ``functions`` maps a name to the function handed out last."""

    def __init__(self, log=None, layout=LAYOUT_VALUES):
        self.requests, self.functions = [], {}
        self.log = [] if log is None else log
        self.globals = {"pyar_rmsnorm_layout": (
            LAYOUT_ADDRESS, struct.pack(f"<{len(layout)}Q", *layout.values()))}

    def get_function(self, name, argtypes=()):
        self.requests.append((name, tuple(argtypes)))
        function = self.functions[name] = CheckingFunction(name, argtypes, self.log)
        return function

    def get_global(self, name):
        address, raw = self.globals[name]
        return address, len(raw)

    def copy_global(self, dst, src):
        """pyar._hip.memcpy_dtoh from one of this module's globals."""
        raw, = [raw for address, raw in self.globals.values() if address == src]
        dst[:] = raw


def row_kernels(module=None):
    """A RowKernels over ``module`` (a RecordingModule), its layout read
    from the module's pyar_rmsnorm_layout."""
    module = RecordingModule() if module is None else module
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_hip, "memcpy_dtoh", module.copy_global)
        return rk.RowKernels(module)


ROW_LAYOUT = row_kernels().layout


class RecordedKernels:
    """A KernelSet (``set``) of ``world`` ranks over recording modules for the
    all-reduce, the shard and the row kernels (``rows``: a RowKernels)."""

    def __init__(self, world):
        self.log = []
        self.allreduce_module = RecordingModule(self.log)
        self.shards_module = RecordingModule(self.log)
        self.rows = row_kernels(RecordingModule(self.log))
        self.set = KernelSet(world, self.allreduce_module, self.shards_module, self.rows)

    @property
    def functions(self):
        """Every function asked for, by name."""
        return {**self.allreduce_module.functions, **self.shards_module.functions,
                **self.rows.module.functions}

    def take(self):
        """The launches logged since the last take, in order."""
        taken, self.log[:] = list(self.log), []
        return taken


def fused_blocks(cap=FUSED_CAP, **caps):
    """NodeGeometry.fused_blocks: ``cap`` for every (variant, dtype), and
    ``caps`` by variant name."""
    variants = ("onestage", "twostage", "split", "lamport")
    return {(v, d): caps.get(v, cap) for v in variants for d in DTYPE_NAMES}


def communicator(world=4, max_size=1 << 20, **kwargs):
    """(comm, recorded): a NodeCommunicator of ``world`` ranks
    (comm_stand_ins.assemble, its keyword arguments and geometry overrides
    passed on; every fused cap FUSED_CAP unless given) whose kernels are
    ``recorded`` (a RecordedKernels; a world of one has only its rows)."""
    recorded = RecordedKernels(world)
    kwargs.setdefault("fused_blocks", fused_blocks())
    if world == 1:
        kwargs.pop("fused_blocks")
        return assemble(1, max_size=max_size, rows=recorded.rows, **kwargs), recorded
    return assemble(world, max_size=max_size, kernels_=recorded.set, **kwargs), recorded


_VARIANT = re.compile(r"pyar_allreduce_rmsnorm_(one_stage|two_stage|split|lamport)_")


def variant_of(launches):
    """The allreduce_rmsnorm variant that made ``launches`` (RecordedKernels.take):
    a fused kernel's own, "unfused" for an all-reduce then add_rmsnorm, and
    "alone" for add_rmsnorm by itself (a world of one)."""
    names = [name for name, *_ in launches]
    fused = {m.group(1).replace("_", "") for m in map(_VARIANT.match, names) if m}
    if fused:
        (variant,) = fused
        return variant
    if all(name.startswith("pyar_add_rmsnorm_") for name in names):
        return "alone"
    assert names[0].startswith("pyar_allreduce_") and names[-1].startswith("pyar_add_rmsnorm_")
    return "unfused"


# --- arrays ------------------------------------------------------------------------

class Addresses:
    """Made-up device addresses: 4 KiB aligned, a 4 KiB gap between arrays."""

    def __init__(self):
        self.next = 0x7F00_0000_0000

    def take(self, nbytes):
        ptr = self.next
        self.next += (nbytes + 0x1FFF) // 0x1000 * 0x1000
        return ptr


@pytest.fixture
def dev():
    """make(shape, dtype, *, at=None, device=0, readonly=False): a device
    array at a fresh address, or ``at``."""
    addresses = Addresses()

    def make(shape, dtype, *, at=None, device=0, readonly=False):
        dtype = np.dtype(dtype)
        ptr = addresses.take(math.prod(shape) * dtype.itemsize) if at is None else at
        return array(ptr, shape, dtype, readonly=readonly, device=device)
    return make


def quant_outputs(dev, quant, tokens, hidden, group_size=128, fp8_dtype=E4M3FN):
    """Correctly shaped (quantized, scales) for ``quant``."""
    if quant == "mxfp4":
        return dev((tokens, hidden // 2), U8), dev((tokens, hidden // 32), U8)
    group = hidden if quant == "fp8_per_token" else group_size
    return dev((tokens, hidden), fp8_dtype), dev((tokens, hidden // group), F32)


def row_call(dev, *, tokens=4, hidden=2880, dtype=BF16, x=None, residual=None, weight=None,
             eps=1e-6, out="new", residual_out=None, quant=None, group_size=128,
             fp8_dtype=E4M3FN, quantized=None, scales=None, device=0, stream=None):
    """A RowCall with every array given explicitly ("new": a fresh array)."""
    x = dev((tokens, hidden), dtype) if x is None else x
    residual = dev(x.shape, x.dtype) if residual is None else residual
    weight = dev((x.shape[-1],), x.dtype) if weight is None else weight
    if isinstance(out, str):
        out = dev(x.shape, x.dtype)
    return rk.RowCall(x, residual, weight, eps, out, residual_out, quant, group_size,
                      fp8_dtype, quantized, scales, stream, device, ROW_LAYOUT)


def rmsnorm_arguments(dev, tokens, hidden, dtype=BF16, *, quant=None, out=True,
                      group_size=128, fp8_dtype=E4M3FN):
    """The keyword arguments of comm.allreduce_rmsnorm with every array
    given (``out=False``: none, for a quantized output alone)."""
    given = {"x": dev((tokens, hidden), dtype), "residual": dev((tokens, hidden), dtype),
             "weight": dev((hidden,), dtype),
             "out": dev((tokens, hidden), dtype) if out else None, "quant": quant}
    if quant is not None:
        given["quantized"], given["scales"] = quant_outputs(dev, quant, tokens, hidden,
                                                            group_size, fp8_dtype)
        given["group_size"], given["fp8_dtype"] = group_size, fp8_dtype
    return given


def row_call_of(given, eps=1e-6):
    """The RowCall of comm.allreduce_rmsnorm(**given) (rmsnorm_arguments),
    for the row arguments its kernels take."""
    return rk.RowCall(given["x"], given["residual"], given["weight"], eps, given["out"], None,
                      given["quant"], given.get("group_size", 128),
                      given.get("fp8_dtype", E4M3FN), given.get("quantized"),
                      given.get("scales"), None, 0, ROW_LAYOUT)
