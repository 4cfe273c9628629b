"""The byte layout shared with src/kernels/allreduce.cu.

The kernels export their sizes (``pyar_allreduce_layout``); the host packs
the CommState and InputTable structs they read from device memory, and the
call signature every spinning kernel compares across ranks at its start
barrier."""
import collections
import struct

import ml_dtypes
import numpy as np

from pyar import _hip
from pyar.comm.algorithms import LL_ALGORITHMS
from pyar.comm.kernels import QUANT_KIND_NAMES

# failed_offset: where in the Signal the word split's second kernel reads
# (nonzero once a block of this rank failed a call).
_LAYOUT_FIELDS = ("signal_bytes", "max_blocks", "max_ranks", "state_bytes", "threads",
                  "failed_offset")
_STATE = struct.Struct("<8Q8QQII")
_TABLE = struct.Struct("<8Q")


class KernelLayout:
    """Sizes read from a loaded allreduce Module."""

    def __init__(self, module):
        ptr, size = module.get_global("pyar_allreduce_layout")
        raw = bytearray(size)
        _hip.memcpy_dtoh(raw, ptr)
        values = struct.unpack(f"<{len(_LAYOUT_FIELDS)}Q", bytes(raw[:8 * len(_LAYOUT_FIELDS)]))
        for name, value in zip(_LAYOUT_FIELDS, values):
            setattr(self, name, value)
        if _STATE.size != self.state_bytes:
            raise RuntimeError(f"kernel CommState is {self.state_bytes} bytes, host packs "
                               f"{_STATE.size}: pyar's build is inconsistent")


def pack_state(signals, partials, error_ptr, rank, world):
    """CommState bytes: per-rank Signal and partial-scratch addresses as mapped here."""
    pad = [0] * (8 - len(signals))
    return _STATE.pack(*signals, *pad, *partials, *pad, error_ptr, rank, world)


def pack_table(pointers):
    """InputTable bytes: every rank's input address as mapped here."""
    return _TABLE.pack(*pointers, *[0] * (8 - len(pointers)))


TABLE_BYTES = _TABLE.size

# --- the lamport kernels' receive region (src/kernels/pyar_lamport.h) -------------
LAMPORT_EMPTY_WORD = 0x80000000  # kEmptyWord: no pushed pack holds it
LAMPORT_SLOTS = 2


def lamport_region(world, segment_bytes, max_blocks):
    """A receive region as it must start: zero call counters (one per block,
    uint32), then every word of both slots (``world`` segments of
    ``segment_bytes`` each) empty."""
    counters = np.zeros(max_blocks, np.uint32)
    slots = np.full(LAMPORT_SLOTS * world * segment_bytes // 4, LAMPORT_EMPTY_WORD, np.uint32)
    return counters.tobytes() + slots.tobytes()

# --- the LL kernels' receive region (src/kernels/pyar_ll.h) -----------------------
LL_GENERATIONS = 2
LL_PACKET_BYTES = 8  # 4 bytes of data and a 4-byte flag


def ll_region_bytes(world, ll_bytes, max_blocks):
    """A rank's LL receive region: a call counter per block (uint32), then
    two generations of ``world`` segments, each the packets of ``ll_bytes``
    of data.  It starts zeroed: no flag is 0."""
    packets = ll_bytes // 4
    return 4 * max_blocks + LL_GENERATIONS * world * packets * LL_PACKET_BYTES


# --- the call signature (src/kernels/pyar_protocol.h compares it) -----------------
# bits 0-39 elements, 40-47 operation, 48-51 dtype, 52 registered input,
# 53-56 quantization (fused: the QuantKind code & 0xF; reduce_scatter: 1 for a
# float32 output from a 16-bit input), 57 another launch of the same call
# follows (a chunk that is not the call's last), 58-63 zero.  With bit 57 the
# launches of a rank's calls parse into calls one way only: a call of two
# chunks never agrees with two calls of one chunk each.
OPERATIONS = {"oneshot": 1, "twoshot": 2, "onestage": 3, "twostage": 4, "split": 5,
              "reduce_scatter": 6, "all_gather": 7, "lamport": 8, "ll": 9, "ll_twoshot": 10}
SIGNATURE_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.float16): 2,
                    np.dtype(ml_dtypes.bfloat16): 3}
_ELEMENT_BITS = 40
_QUANT_BITS = 4
_COLLECTIVE = {"oneshot": "allreduce", "twoshot": "allreduce", "onestage": "allreduce_rmsnorm",
               "twostage": "allreduce_rmsnorm", "split": "allreduce_rmsnorm",
               "lamport": "allreduce_rmsnorm", "ll": "allreduce", "ll_twoshot": "allreduce"}

Signature = collections.namedtuple("Signature",
                                   "operation elements dtype registered quantization more")
Signature.__doc__ = """A decoded call signature; ``operation`` and ``dtype`` are None
for codes pyar does not know."""


def signature(operation, elements, dtype, registered, quantization=0, more=False):
    """The 64-bit signature of one launch: ``operation`` a key of OPERATIONS,
    ``elements`` the launch's element count (all-reduce: the chunk's; fused:
    tokens * hidden of the chunk; reduce_scatter/all_gather: the whole
    array's), ``registered`` whether peers read the input in place, ``more``
    whether a later chunk of the same call follows."""
    if not 0 <= elements < 1 << _ELEMENT_BITS:
        raise ValueError(f"{elements} elements do not fit the signature's "
                         f"{_ELEMENT_BITS} bits")
    if not 0 <= quantization < 1 << _QUANT_BITS:
        raise ValueError(f"quantization code {quantization} does not fit "
                         f"{_QUANT_BITS} bits")
    return (elements | OPERATIONS[operation] << 40 | SIGNATURE_DTYPES[np.dtype(dtype)] << 48
            | int(bool(registered)) << 52 | quantization << 53 | int(bool(more)) << 57)


def decode_signature(value):
    """The Signature fields of a 64-bit ``value``."""
    operation = next((name for name, code in OPERATIONS.items()
                      if code == value >> 40 & 0xFF), None)
    dtype = next((d for d, code in SIGNATURE_DTYPES.items() if code == value >> 48 & 0xF), None)
    return Signature(operation, value & (1 << _ELEMENT_BITS) - 1, dtype,
                     bool(value >> 52 & 1), value >> 53 & (1 << _QUANT_BITS) - 1,
                     bool(value >> 57 & 1))


def describe_signature(value):
    """One rank's call in words, e.g. "allreduce twoshot 4096 x bfloat16 staged"."""
    if value == 0:
        return "no signature seen (it did not arrive, or not in time)"
    s = decode_signature(value)
    if s.operation is None or s.dtype is None or value >> 58:
        return f"an unknown call (signature {value:#018x})"
    # LL reads its input in place, unregistered: no peer reads it.
    mode = ("registered" if s.registered
            else "unstaged" if s.operation in LL_ALGORITHMS else "staged")
    what = f"{s.elements} x {s.dtype.name} {mode}"
    if s.more:
        what += " (a chunk; more of the call follow)"
    if s.operation == "reduce_scatter":
        out = "float32" if s.quantization else s.dtype.name
        return f"reduce_scatter {what}, {out} output"
    if s.operation == "all_gather":
        return f"all_gather {what}"
    text = f"{_COLLECTIVE[s.operation]} {s.operation} {what}"
    if _COLLECTIVE[s.operation] == "allreduce":
        return text
    if not s.quantization:
        return f"{text}, no quantization"
    kind = QUANT_KIND_NAMES.get(s.quantization, f"kind {s.quantization}")
    return f"{text}, {kind} quantization"
