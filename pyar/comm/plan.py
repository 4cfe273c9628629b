"""What a collective queues, as a function of values: a node's geometry and
its kernels in, named Copy and Launch records out.

Nothing here touches the GPU or MPI, so a test builds a NodeGeometry with
made-up addresses, hands in stand-in kernels, and reads the records.  The
communicator checks a call's arguments, asks the planner for its steps,
queues them and keeps them as the call's plan (pyar/comm/_eager.pyx).
"""
import dataclasses
from typing import Any, Mapping, NamedTuple, Optional

from pyar.comm import algorithms, layout, shards
from pyar.comm.kernels import PACK_BYTES


@dataclasses.dataclass(frozen=True)
class NodeGeometry:
    """One rank's view of its connected node, fixed once connected.

    Sizes: ``world`` ranks, this one ``rank``; ``max_size`` bytes of
    scratch per rank; the spinning kernels' ``threads`` per block and their
    compiled-in ``max_blocks``; the block caps (pyar.comm.kernels.block_cap)
    of the all-reduce (``allreduce_blocks``), the shard kernels
    (``shard_blocks``) and each fused (variant, dtype) (``fused_blocks``);
    ``local_blocks``, enough blocks to fill the GPU for a kernel that waits
    for no peer; ``shared_gpu`` when every rank shares its GPU.
    Addresses (this rank's device memory): ``state`` (CommState),
    ``staged_table`` (every rank's scratch as mapped here), ``scratch``,
    ``partial`` (two-shot and split's gather buffer), ``failed_word`` (the
    Signal word split's second kernel reads), ``lamport_region`` (the
    lamport kernels' receive region) and ``lamport_bytes`` (one receive
    segment), ``ll_region`` (the LL all-reduce's receive region) and
    ``ll_bytes`` (the data one of its segments holds: the largest LL call);
    ``auto_ll_bytes``, the largest input ``"auto"`` runs as LL (0: none).
    ``timeout_ns`` bounds every wait of the kernels."""
    world: int
    rank: int
    max_size: int
    threads: int
    max_blocks: int
    allreduce_blocks: int
    shard_blocks: int
    fused_blocks: Mapping[Any, int]
    local_blocks: int
    shared_gpu: bool
    state: int
    staged_table: int
    scratch: int
    partial: int
    failed_word: int
    lamport_region: int
    lamport_bytes: int
    ll_region: int
    ll_bytes: int
    timeout_ns: int
    auto_ll_bytes: int = 0


class Copy(NamedTuple):
    """A device-to-device copy queued on the call's stream."""
    dst: int
    src: int
    nbytes: int


class Launch(NamedTuple):
    """A kernel launch.  A spinning kernel (one that waits for peers) takes
    the call's number as its last argument, after ``args``, and ``kind`` and
    ``details`` describe the call in a timeout report; a local kernel (one
    that waits for no peer) has ``kind`` None and no call number."""
    function: Any
    grid: int
    block: int
    args: tuple
    kind: Optional[str] = None
    details: Optional[str] = None


def ll_segment(max_size):
    """The data one LL receive segment holds: the largest input
    ``algo="ll"`` takes (LL_MAX_BYTES, or ``max_size`` when that is smaller)."""
    return min(algorithms.LL_MAX_BYTES, max_size)


def auto_ll_bytes(world, ll_bytes, enabled):
    """The largest input ``"auto"`` runs as LL on ``world`` ranks whose LL
    segments hold ``ll_bytes``: LL_AUTO_MAX_BYTES's bound where ``enabled``
    (PYAR_AUTO_LL not 0 on any rank), else 0."""
    if not enabled or world < 2:
        return 0
    return min(algorithms.LL_AUTO_MAX_BYTES[world], ll_bytes)


def ll_largest(algo, ll_bytes, world):
    """The largest input LL ``algo`` takes on ``world`` ranks whose LL
    segments hold ``ll_bytes``: a segment (one-shot: every source's whole
    input), or ``world`` halves of one (two-shot: a source's shard, then its
    sum, each in half a segment; 4-byte words)."""
    if algo == algorithms.LL_TWOSHOT:
        return world * (ll_bytes // 8) * 4
    return ll_bytes


def ll_refusal(algo, ll_bytes, world, x, out):
    """Why LL ``algo``, whose segments hold ``ll_bytes``, cannot take this
    call on ``world`` ranks, or None."""
    largest = ll_largest(algo, ll_bytes, world)
    if x.nbytes > largest:
        how = ("its receive segment" if algo == algorithms.LL else
               f"{world} halves of its receive segment")
        return (f"takes inputs of at most {largest} bytes ({how}: LL_MAX_BYTES "
                f"{algorithms.LL_MAX_BYTES}, or max_size when smaller), not {x.nbytes}")
    itemsize = x.dtype.itemsize
    if x.ptr % itemsize or out.ptr % itemsize:
        return f"needs x and out aligned to their element size ({itemsize} bytes)"
    return None


def allreduce_algorithm(geometry, x, out, algo, registered):
    """The all-reduce algorithm a call runs: ``algo``, or for "auto" LL up to
    ``geometry.auto_ll_bytes`` (it reads its input in place, so an in-place
    call over a registered input takes it too), else the table's choice."""
    if algo in algorithms.LL_ALGORITHMS:
        refusal = ll_refusal(algo, geometry.ll_bytes, geometry.world, x, out)
        if refusal:
            raise ValueError(f"algo={algo!r} {refusal}")
        return algo
    in_place_registered = registered and out.ptr == x.ptr
    if algo == "auto":
        if (x.nbytes <= geometry.auto_ll_bytes
                and ll_refusal(algorithms.LL, geometry.ll_bytes, geometry.world, x,
                               out) is None):
            return algorithms.LL
        algo = algorithms.choose(x.nbytes, geometry.world)
        # One-shot writes its output while peers still read its input.
        return "twoshot" if in_place_registered else algo
    if algo == "oneshot" and in_place_registered:
        raise ValueError("algo='oneshot' cannot write in place over a registered input "
                         "(peers are still reading it); use 'twoshot' or 'auto'")
    return algo


def chunk_input(geometry, x, offset, nbytes, registered):
    """(input table, pack offset, input to stage, copy step) of one chunk's
    kernel: the registered table read in place; or the chunk staged into
    this rank's scratch buffer (which the staged table names on every rank)
    by the kernel itself, before its start barrier (the address to stage
    from; no copy); or, for an input that is not 16-byte aligned (the kernel
    copies whole packs), by a Copy queued before the kernel, which then
    stages nothing."""
    if registered is not None:
        return registered, offset // PACK_BYTES, 0, None
    if (x.ptr + offset) % PACK_BYTES == 0:
        return geometry.staged_table, 0, x.ptr + offset, None
    return geometry.staged_table, 0, 0, Copy(geometry.scratch, x.ptr + offset, nbytes)


def ll(geometry, kernels, x, out, algo=algorithms.LL):
    """The one launch of an LL all-reduce (``algo``: one-shot or two-shot):
    it reads x in place (never staged, never registered: no peer reads it)
    and fits its segments.  A thread handles a word of the input (one-shot)
    or of a rank's shard (two-shot)."""
    words = -(-x.nbytes // 4)
    if algo == algorithms.LL_TWOSHOT:
        words = -(-words // geometry.world)
    blocks = min(geometry.allreduce_blocks, max(1, -(-words // geometry.threads)))
    signature = layout.signature(algo, x.size, x.dtype, False)
    return Launch(kernels.allreduce(algo, x.dtype), blocks, geometry.threads,
                  (x.ptr, out.ptr, geometry.state, geometry.ll_region,
                   geometry.ll_region - geometry.partial, geometry.ll_bytes // 4, x.size,
                   geometry.timeout_ns, signature),
                  "allreduce", f"({algo}, {x.size} x {x.dtype})")


def allreduce(geometry, kernels, x, out, algo, registered):
    """The steps of one all-reduce of ``x`` into ``out`` with ``algo`` (as
    allreduce_algorithm chose it), chunk by chunk; ``registered``: the input
    table peers read x through, or None (staged)."""
    if algo in algorithms.LL_ALGORITHMS:
        return [ll(geometry, kernels, x, out, algo)]
    steps = []
    function = kernels.allreduce(algo, x.dtype)
    itemsize = x.dtype.itemsize
    lanes = PACK_BYTES // itemsize
    chunk = geometry.max_size // itemsize
    for first in range(0, x.size, chunk):
        count = min(chunk, x.size - first)
        offset = first * itemsize
        table, in_offset, stage_from, copy = chunk_input(geometry, x, offset,
                                                         count * itemsize, registered)
        if copy is not None:
            steps.append(copy)
        packs = count // lanes
        work = packs if algo == "oneshot" else -(-packs // geometry.world)
        blocks = min(geometry.allreduce_blocks, max(1, -(-work // geometry.threads)))
        signature = layout.signature(algo, count, x.dtype, registered is not None,
                                     more=first + count < x.size)
        steps.append(Launch(function, blocks, geometry.threads,
                            (table, in_offset, stage_from, out.ptr + offset, geometry.state,
                             count, geometry.timeout_ns, signature),
                            "allreduce", f"({algo}, {count} x {x.dtype})"))
    return steps


def _shard_blocks(geometry, count, itemsize):
    """Blocks of a reduce_scatter/all_gather launch covering ``count``
    elements of each shard: a thread per pack, within the cap."""
    packs = -(-count // shards.lanes(itemsize))
    return min(geometry.shard_blocks, max(1, -(-packs // geometry.threads)))


def reduce_scatter(geometry, kernels, x, out, registered):
    """The steps of one reduce_scatter, a run of every shard per launch.
    Staged: the run of shard q goes to scratch element q * count, where
    every rank's kernel reads the run of its own shard."""
    steps = []
    n, itemsize, world = x.size, x.dtype.itemsize, geometry.world
    shard = shards.shard_size(n, world, itemsize)
    function = kernels.shard("reduce_scatter", x.dtype, out.dtype)
    signature = layout.signature("reduce_scatter", n, x.dtype, registered is not None,
                                 int(out.dtype != x.dtype))
    most = shards.chunk_elements(geometry.max_size // itemsize // world, itemsize)
    for first, count in shards.chunks(n, world, itemsize, most):
        if registered is not None:
            table, in_offset, in_stride = registered, first, shard
        elif count == shard:  # the whole shards: the scratch holds x as it is
            table, in_offset, in_stride = geometry.staged_table, 0, count
            steps.append(Copy(geometry.scratch, x.ptr, x.nbytes))
        else:
            table, in_offset, in_stride = geometry.staged_table, 0, count
            for q in range(world):
                run = shards.run_length(n, world, itemsize, q, first, count)
                if run:
                    steps.append(Copy(geometry.scratch + q * count * itemsize,
                                      x.ptr + (q * shard + first) * itemsize, run * itemsize))
        steps.append(Launch(
            function, _shard_blocks(geometry, count, itemsize), geometry.threads,
            (table, in_offset, in_stride, out.ptr + first * out.dtype.itemsize, geometry.state,
             n, shard, first, count, geometry.timeout_ns, signature),
            "reduce_scatter",
            f"({n} x {x.dtype} to {out.dtype}, shard elements {first}..{first + count})"))
    return steps


def all_gather(geometry, kernels, x, out, registered):
    """The steps of one all_gather, a run of every shard per launch.
    Staged: this rank's run goes to scratch element 0."""
    steps = []
    n, itemsize, world = out.size, x.dtype.itemsize, geometry.world
    shard = shards.shard_size(n, world, itemsize)
    function = kernels.shard("all_gather", x.dtype, x.dtype)
    signature = layout.signature("all_gather", n, x.dtype, registered is not None)
    most = shards.chunk_elements(geometry.max_size // itemsize, itemsize)
    for first, count in shards.chunks(n, world, itemsize, most):
        if registered is not None:
            table, in_offset = registered, first
        else:
            table, in_offset = geometry.staged_table, 0
            run = shards.run_length(n, world, itemsize, geometry.rank, first, count)
            if run:
                steps.append(Copy(geometry.scratch, x.ptr + first * itemsize, run * itemsize))
        steps.append(Launch(
            function, _shard_blocks(geometry, count, itemsize), geometry.threads,
            (table, in_offset, 0, out.ptr, geometry.state, n, shard, first, count,
             geometry.timeout_ns, signature),
            "all_gather", f"({n} x {x.dtype}, shard elements {first}..{first + count})"))
    return steps
