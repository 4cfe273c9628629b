"""Which elements of an n-element array each rank owns in reduce_scatter and
all_gather, and how a call is cut into launches.

The shard rule, the same for every collective that shards an array: with
L = 16 // itemsize elements per 16-byte pack and W ranks,
``shard = L * ceil(n / (L * W))`` and rank r owns the contiguous elements
``[min(n, r * shard), min(n, (r + 1) * shard))``.  Shards follow rank order;
every shard but the last non-empty one is ``shard`` elements long, the last
may be shorter, and when n is small the last ranks' shards are empty (n = 1
on 4 ranks: rank 0 owns the element, ranks 1-3 own nothing).  Shards start
on whole packs, so each rank's part is 16-byte aligned in a 16-byte aligned
array.
"""
from pyar.comm.kernels import PACK_BYTES


def lanes(itemsize):
    """Elements per 16-byte pack."""
    return PACK_BYTES // itemsize


def shard_size(n, world, itemsize):
    """The rule's ``shard``: the length of every shard but the last ones."""
    per_pack = lanes(itemsize)
    return per_pack * -(-n // (per_pack * world))


def bounds(n, world, itemsize, rank):
    """``(start, end)``: the elements ``rank`` owns."""
    shard = shard_size(n, world, itemsize)
    return min(n, rank * shard), min(n, (rank + 1) * shard)


def length(n, world, itemsize, rank):
    """How many elements ``rank`` owns."""
    start, end = bounds(n, world, itemsize, rank)
    return end - start


def chunk_elements(per_launch, itemsize):
    """The longest run of a shard one launch covers when a launch may move
    ``per_launch`` elements per rank (the scratch buffer's share): whole packs.
    Raises ValueError when not even one pack fits."""
    per_pack = lanes(itemsize)
    count = per_launch // per_pack * per_pack
    if count == 0:
        raise ValueError(f"the scratch buffer holds {per_launch} elements of {itemsize} "
                         f"bytes per rank, less than one {PACK_BYTES}-byte pack: raise "
                         "max_size")
    return count


def chunks(n, world, itemsize, count):
    """``(first, count)`` of each launch: elements ``[q * shard + first,
    q * shard + first + count)`` of every rank q's shard, clipped to the shard
    (``run_length``), ``count`` at most the given one."""
    shard = shard_size(n, world, itemsize)
    count = min(count, shard)
    return [(first, min(count, shard - first)) for first in range(0, shard, count)]


def run_length(n, world, itemsize, q, first, count):
    """How many elements of rank q's shard the launch ``(first, count)`` covers."""
    shard = shard_size(n, world, itemsize)
    return max(0, min(min(n, (q + 1) * shard) - (q * shard + first), count))
