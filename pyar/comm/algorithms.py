"""Which all-reduce algorithm a call uses, by message size and world size.

One-shot (every rank reads every peer's whole input) wins while latency
dominates; two-shot (reduce-scatter, then all-gather) moves 2(W-1)/W of the
data per rank instead of W-1 and wins once bandwidth dominates.  The
crossovers below start from published measurements of custom all-reduce on
8-GPU NVLink nodes (one-shot up to about 256-512 KiB at 2-4 ranks, 80-256 KiB
at 8) and are retuned from ``python -m pyar.bench`` output.
"""

ALGORITHMS = ("oneshot", "twoshot")

# world size -> largest message in bytes that still goes one-shot.
ONESHOT_MAX_BYTES = {
    2: 512 * 1024,
    3: 512 * 1024,
    4: 256 * 1024,
    5: 256 * 1024,
    6: 256 * 1024,
    7: 128 * 1024,
    8: 128 * 1024,
}


def choose(nbytes, world):
    """The algorithm ``"auto"`` selects for a message of ``nbytes`` on ``world`` ranks."""
    if world not in ONESHOT_MAX_BYTES:
        raise ValueError(f"no algorithm table for world size {world} (supported: 2..8)")
    return "oneshot" if nbytes <= ONESHOT_MAX_BYTES[world] else "twoshot"


def validate(algo):
    if algo != "auto" and algo not in ALGORITHMS:
        raise ValueError(f"algo must be 'auto' or one of {ALGORITHMS}, got {algo!r}")
    return algo
