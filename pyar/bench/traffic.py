"""The device-memory bytes an all-reduce kernel must move, per rank.

Used for the one-GPU tier, where every rank's kernel shares one GPU's memory:
the sum over ranks, over the kernel time, against the copy bandwidth measured
in the same run, is the kernels' memory efficiency.
"""


def kernel_bytes(algo, nbytes, world, staged):
    """Bytes read plus written by one rank's call (each input read once)."""
    if algo == "oneshot":
        moved = world * nbytes + nbytes          # read every input, write the sum
    else:
        shard = nbytes / world
        moved = (world * shard + shard          # reduce-scatter: read W shards, write partial
                 + world * shard + nbytes)      # all-gather: read W shards, write output
    if staged:
        moved += 2 * nbytes                      # copy the input into the scratch buffer
    return moved
