"""The byte layout shared with src/kernels/allreduce.cu.

The kernels export their sizes (``pyar_allreduce_layout``); the host packs
the CommState and InputTable structs they read from device memory."""
import struct

from pyar import _hip

_LAYOUT_FIELDS = ("signal_bytes", "max_blocks", "max_ranks", "state_bytes", "threads")
_STATE = struct.Struct("<8Q8QQII")
_TABLE = struct.Struct("<8Q")
PACK_BYTES = 16  # the kernels' vector width; also the alignment they need


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

