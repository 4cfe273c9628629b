"""The device-memory bytes an all-reduce must move when every rank shares
one GPU (the one-GPU test tier).

On one GPU the ranks' inputs, partial results and outputs all live in the
same memory, and a peer's read of data another rank just read is served from
the shared L2; what must cross HBM at least once is every input read, every
partial result written and read back, and every output written.  Those bytes,
over the call's time, against the device-to-device copy bandwidth measured in
the same run, are the kernels' memory efficiency.
"""
from pyar.comm import algorithms


def shared_gpu_bytes(algo, nbytes, world, staged):
    """Bytes all ``world`` ranks' kernels together must move for one call."""
    moved = 2 * world * nbytes                  # every input read, every output written
    if algo == "twoshot":
        moved += 2 * nbytes                     # the reduced shards: written, read back
    if staged:
        moved += 2 * world * nbytes             # each input copied into scratch first
    return moved


def fused_shared_gpu_bytes(variant, nbytes, out_bytes, world):
    """Bytes all ranks' fused all-reduce + RMSNorm calls must move for one
    call: every input read, each rank's residual read and residual_out
    written, its ``out_bytes`` of outputs (y, quantized codes, scales)
    written.  Two-stage and split add the reduced rows each rank's gather
    buffer receives (every rank pushes its slice into all of them) and reads
    back; "unfused" is the all-reduce into a sum array, then add + RMSNorm (+
    quantization) reading that sum; lamport adds every rank's rows stored
    into every rank's receive slot, read back and emptied there."""
    rows = world * (2 * nbytes + out_bytes)
    if variant == "unfused":
        return shared_gpu_bytes(algorithms.choose(nbytes, world), nbytes, world, False) \
            + world * nbytes + rows
    moved = world * nbytes + rows
    if variant in ("twostage", algorithms.SPLIT):
        moved += 2 * world * nbytes
    if variant == algorithms.LAMPORT:
        moved += 3 * world * world * nbytes
    return moved


def add_rmsnorm_shared_gpu_bytes(nbytes, world):
    """Bytes all ranks' add + RMSNorm kernels (no quantization) must move when
    each runs on its own ``nbytes`` of sums at once: the sum and the residual
    read, y and residual_out written.  The weight is one row, read by every
    block from L2, and is not counted."""
    return 4 * world * nbytes
