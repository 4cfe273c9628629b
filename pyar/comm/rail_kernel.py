"""The rail's sum on the GPU, for the device data path of the hierarchical
all-reduce (pyar.comm.inter_node): src/kernels/rail.cu adds the rows MPI's
all-gather left in one device buffer (row d: domain d's shard) in domain
order in float32 and rounds once, the additions of
pyar.comm.rail.add_in_order on the host path, so both paths give the same
bits.

Rows are ``pitch(n)`` elements apart: the kernel reads 4 elements at a time,
so each row starts 16 bytes (float32) or 8 bytes (16-bit) into an aligned
buffer; the all-gather sends the padding with the shard.
"""
import numpy as np

from pyar import _hip
from pyar.comm.kernels import RAIL_ARGS, Functions, rail_name

LANES = 4      # elements per thread and step (rail.cu: kRailLanes)
THREADS = 256  # rail.cu: kRailThreads


def pitch(n):
    """Elements from one row to the next for shards of ``n`` elements."""
    return -(-n // LANES) * LANES


class RailSum:
    """The kernels of code object ``module`` (pyar._kernels "rail") on
    ``device``."""

    def __init__(self, module, device):
        self._functions = Functions(module)
        # Nothing here waits for a peer: blocks beyond the resident ones just queue.
        self._max_blocks = 2 * _hip.Device(device).multiprocessor_count

    def launch(self, rows, rows_dtype, n, domains, out, out_dtype, stream):
        """Queue out[i] = sum over d of rows[d * pitch(n) + i] (i < n) on
        ``stream``; ``rows`` and ``out`` are device addresses, ``rows_dtype``
        float32 or ``out_dtype``."""
        rows_dtype, out_dtype = np.dtype(rows_dtype), np.dtype(out_dtype)
        function = self._functions.get(rail_name(rows_dtype, out_dtype), RAIL_ARGS)
        quads = -(-n // LANES)
        blocks = max(1, min(-(-quads // THREADS), self._max_blocks))
        function.launch(blocks, THREADS, (rows, pitch(n), n, domains, out), stream=stream)
