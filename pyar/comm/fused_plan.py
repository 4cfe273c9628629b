"""What allreduce_rmsnorm queues, as a function of values (pyar/comm/plan.py
says why): the variant "auto" picks, the refusals of a forced one, and the
Copy and Launch records of each variant.

``call`` is a checked pyar.comm.row_kernels.RowCall; ``kernels`` a
pyar.comm.kernels.KernelSet, whose ``rows`` (RowKernels) launch the local
kernels.
"""
from pyar.comm import algorithms, layout
from pyar.comm.kernels import PACK_BYTES
from pyar.comm.plan import Launch, allreduce, allreduce_algorithm, chunk_input


def lamport_segment(max_size):
    """The bytes of one lamport receive segment: the most a lamport call
    takes (LAMPORT_SEGMENT_BYTES, or ``max_size`` when that is smaller)."""
    return min(algorithms.LAMPORT_SEGMENT_BYTES, max_size)


def lamport_refusal(row_layout, segment_bytes, nbytes, row_bytes):
    """Why the lamport kernels cannot take an input of ``nbytes`` in rows
    of ``row_bytes``, or None when they can."""
    widest = row_layout.max_row_threads * PACK_BYTES
    if row_bytes > widest:
        return (f"takes rows up to {widest} bytes (one 16-byte pack per thread), "
                f"got {row_bytes}")
    if nbytes > segment_bytes:
        return f"takes inputs up to {segment_bytes} bytes (its receive slots), got {nbytes}"
    return None


def variant(geometry, row_layout, nbytes, row_bytes):
    """What ``algo="auto"`` runs for an input of ``nbytes`` in rows of ``row_bytes``."""
    fits = lamport_refusal(row_layout, geometry.lamport_bytes, nbytes, row_bytes) is None
    return algorithms.choose_fused(nbytes, geometry.world, geometry.shared_gpu, row_bytes, fits)


def launch_geometry(geometry, kernels, algo, dtype, tokens, hidden, quant_code):
    """The fused kernel and its RowLaunch for ``tokens`` rows."""
    rows = kernels.rows.launch(tokens, hidden, dtype, geometry.fused_blocks[(algo, dtype)],
                               geometry.max_blocks, geometry.threads)
    return kernels.fused(algo, dtype, quant_code, rows.packs_per_thread), rows


def allreduce_rmsnorm(geometry, kernels, call, algo, registered, sums=None):
    """The steps of one allreduce_rmsnorm with variant ``algo`` (as chosen);
    ``sums``: the unfused path's sum array when the call has no ``out``."""
    if algo == algorithms.UNFUSED:
        return unfused(geometry, kernels, call, registered, sums)
    if algo == algorithms.LAMPORT:
        return [lamport(geometry, kernels, call)]
    return fused(geometry, kernels, call, algo, registered)


def fused(geometry, kernels, call, algo, registered):
    """One-stage, two-stage or split, chunk by chunk.  Split's second kernel
    follows its first on the same stream (in a captured graph too: both
    are steps), reading the sums from this rank's gather buffer, which the
    next chunk's first kernel fills again only after every rank's start
    barrier (the proof at split_reduce), and writing nothing once a first
    kernel of this rank failed (the Signal's failure word: a failed call
    leaves stale sums there)."""
    steps = []
    dtype = call.x.dtype
    row_bytes = call.hidden * dtype.itemsize
    chunk = geometry.max_size // row_bytes
    for first in range(0, call.tokens, chunk):
        count = min(chunk, call.tokens - first)
        table, in_offset, stage_from, copy = chunk_input(
            geometry, call.x, first * row_bytes, count * row_bytes, registered)
        if copy is not None:
            steps.append(copy)
        function, rows = launch_geometry(geometry, kernels, algo, dtype, count, call.hidden,
                                         call.quant_code)
        details = f"({algo}, {count} x {call.hidden} {dtype})"
        signature = layout.signature(algo, count * call.hidden, dtype, registered is not None,
                                     call.quant_code & 0xF, more=first + count < call.tokens)
        if algo != algorithms.SPLIT:
            steps.append(Launch(function, rows.blocks, rows.threads,
                                (table, in_offset, stage_from, count,
                                 *call.row_args(first, count), geometry.state,
                                 geometry.timeout_ns, signature),
                                "allreduce_rmsnorm", details))
            continue
        steps.append(Launch(function, rows.blocks, rows.threads,
                            (table, in_offset, stage_from, count, call.hidden, geometry.state,
                             geometry.timeout_ns, signature), "allreduce_rmsnorm", details))
        steps.append(Launch(*kernels.rows.add_rmsnorm_launch(
            call, geometry.partial, first, count, geometry.local_blocks,
            geometry.failed_word)))
    return steps


def lamport(geometry, kernels, call):
    """The one launch of a lamport call (it fits one receive segment: the
    communicator refuses what does not)."""
    dtype = call.x.dtype
    function, rows = launch_geometry(geometry, kernels, algorithms.LAMPORT, dtype, call.tokens,
                                     call.hidden, call.quant_code)
    signature = layout.signature(algorithms.LAMPORT, call.tokens * call.hidden, dtype, False,
                                 call.quant_code & 0xF)
    return Launch(function, rows.blocks, rows.threads,
                  (call.x.ptr, call.tokens, *call.row_args(0, call.tokens), geometry.state,
                   geometry.lamport_region, geometry.lamport_region - geometry.partial,
                   geometry.lamport_bytes // PACK_BYTES, geometry.timeout_ns, signature),
                  "allreduce_rmsnorm", f"(lamport, {call.tokens} x {call.hidden} {dtype})")


def unfused(geometry, kernels, call, registered, sums):
    """The same outputs from the separate steps: the all-reduce's (into
    ``out``, or ``sums`` when only quantized output is wanted), then add +
    RMSNorm (+ quantization) on this GPU, in place over the sum (a row's
    sums are loaded before its y is stored)."""
    s = call.out if call.out is not None else sums
    algo = allreduce_algorithm(geometry, call.x, s, "auto", registered is not None)
    return [*allreduce(geometry, kernels, call.x, s, algo, registered),
            Launch(*kernels.rows.add_rmsnorm_launch(call, s.ptr, 0, call.tokens,
                                                    geometry.local_blocks))]
