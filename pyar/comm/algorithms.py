"""Which all-reduce algorithm a call uses, by message size and world size.

One-shot (every rank reads every peer's whole input) wins while latency
dominates; two-shot (reduce-scatter, then all-gather) moves 2(W-1)/W of the
data per rank instead of W-1 and wins once bandwidth dominates.  Every table
below maps a world size (2-8) to a bound or a choice; PROVENANCE names the
measurement behind each (device, date, results file under
benchmarks/results/), and docs/tuning.md holds its numbers and reasoning.
World sizes that have not been measured take a measured neighbour's entry.
The measurements ran with the ranks sharing one GPU, so the tables for a GPU
per rank rest on published crossovers and on those runs.
"""

ALGORITHMS = ("oneshot", "twoshot")
FUSED_VARIANTS = ("onestage", "twostage")
# two-stage cut at its `mid` barrier into two kernels: the spinning
# reduce-scatter on its capped grid, then the norms on the whole GPU.
SPLIT = "split"
UNFUSED = "unfused"  # allreduce_rmsnorm's steps as separate kernels
# one-stage with pushed rows: every rank stores its rows into every rank's
# receive slot and polls its own (src/kernels/pyar_lamport.h): no barrier
# before the data moves, none at the end; for inputs up to LAMPORT_MAX_BYTES.
LAMPORT = "lamport"
# the barrier-free LL push one-shot all-reduce (src/kernels/pyar_ll.h): every
# rank stores its input in 8-byte packets (4 bytes of data, a 4-byte flag)
# into every rank's receive slot; for inputs up to LL_MAX_BYTES.  Forced by
# ``algo="ll"``; ``"auto"`` runs it up to LL_AUTO_MAX_BYTES unless the
# communicator was made with PYAR_AUTO_LL=0 (pyar.comm.plan.auto_ll_bytes).
LL = "ll"
# the barrier-free LL push two-shot (pyar_ll.h, ll_twoshot): every rank pushes
# shard q of its input to rank q, which sums its shard and pushes the sum to
# every rank; forced only (``algo="ll_twoshot"``): slower than the LL one-shot
# wherever both take the input, and than the barrier one-shot past LL_AUTO_MAX_BYTES.
# It moves 2(W-1)/W of the one-shot LL's bytes per rank per W, in two steps,
# and takes inputs up to W/2 segments (pyar.comm.plan.ll_largest).
LL_TWOSHOT = "ll_twoshot"
LL_ALGORITHMS = (LL, LL_TWOSHOT)
# The largest input ``algo="ll"`` takes (the communicator's max_size when
# that is smaller): a rank's receive region holds 2 generations x world
# segments of twice this (a packet carries 4 bytes of data in 8).
LL_MAX_BYTES = 256 << 10

# world size -> largest input that ``"auto"`` runs as LL (unless PYAR_AUTO_LL=0).
# LL saves the barrier one-shot's two flag round trips but moves twice the
# bytes (a packet carries 4 bytes of data in 8) from every rank to every
# rank, so past these sizes the one-shot, which reads each peer's input once,
# is faster again; the more ranks, the sooner.
LL_AUTO_MAX_BYTES = {2: 256 << 10, 3: 128 << 10, 4: 128 << 10,
                     **{world: 32 << 10 for world in range(5, 9)}}

# world size -> largest message in bytes that still goes one-shot.  One-shot
# reads W-1 whole peer inputs, so the more ranks, the sooner two-shot's
# smaller share pays for its second phase.  The bounds are the published
# crossovers of custom all-reduce on 8-GPU NVLink nodes; a GPU per rank's
# links decide them, which one shared GPU cannot measure.
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
    return _by_size(nbytes, world, ONESHOT_MAX_BYTES, ALGORITHMS)


def validate(algo):
    return _known(algo, ALGORITHMS + LL_ALGORITHMS)


# world size -> largest input (tokens * hidden * itemsize) that the fused
# all-reduce + RMSNorm runs one-stage with a GPU per rank.  The variants move
# the data of one-shot and two-shot, so they take the same crossovers.
FUSED_ONESTAGE_MAX_BYTES = dict(ONESHOT_MAX_BYTES)


# world size -> largest input at which a fused kernel still beats the same
# steps unfused (pyar's all-reduce, then the single-GPU add + RMSNorm (+
# quantization) kernel); above it ``"auto"`` runs FUSED_LARGE instead, so
# that allreduce_rmsnorm is never slower than the steps it fuses.  None: the
# fused kernels run at every size.  A fused kernel is capped to the blocks
# that can all be resident while they spin on their peers; past about 1 MiB
# that loses to unfused kernels that take the whole GPU.
FUSED_MAX_BYTES = {world: 1 << 20 for world in range(2, 9)}

# world size -> what ``"auto"`` runs past FUSED_MAX_BYTES: SPLIT or UNFUSED.
# Split moves what the unfused steps move less the all-reduce's reduced
# shards (written, then read back: traffic.fused_shared_gpu_bytes), and its
# spinning kernel has one phase after the start barrier where the
# all-reduce's has two; its norms use the whole GPU like the unfused ones.
# At 5-8 ranks its reduce-scatter has too few blocks a rank and falls far
# behind the unfused all-reduce.
FUSED_LARGE = {world: SPLIT if world <= 4 else UNFUSED for world in range(2, 9)}


# The tables above are for a GPU per rank.  Ranks that share one GPU (MPS)
# read their "peers" from the same memory: there is no link to spare, so
# one-stage (every rank reads every row) stays ahead far longer, two-stage
# never leads, and split's capped spinning grid falls behind the unfused
# steps' whole-GPU kernels once the input is large.  world size ->
# (one-stage up to, then split up to; beyond: the unfused steps) in input
# bytes, None for no bound.  Split's bound at 3-4 ranks applies to wide rows
# (below).
SHARED_GPU_FUSED = {2: (None, None), 3: (None, 32 << 20), 4: (None, 32 << 20),
                    **{world: (512 << 10, 2 << 20) for world in range(5, 9)}}
# Rows wider than WIDE_ROW_BYTES take blocks of more than 512 threads, half
# as many resident, and one-stage falls behind split far sooner: world size
# -> one-stage's bound for them on a shared GPU.
WIDE_ROW_BYTES = 8 << 10
SHARED_GPU_WIDE_ONESTAGE_MAX = {**{world: 1 << 20 for world in range(2, 5)},
                                **{world: 256 << 10 for world in range(5, 9)}}


# A rank's receive slots for LAMPORT hold 2 * world segments of this size:
# the largest input ``algo="lamport"`` takes (the communicator's max_size
# when that is smaller).
LAMPORT_SEGMENT_BYTES = 1 << 20
# world size -> largest input (tokens * hidden * itemsize) that ``"auto"``
# runs as LAMPORT, on either topology.  Lamport saves the start and exit
# barriers' round trips while every block holds one row; once blocks take
# several rows (past the block cap: 16 blocks of 512 threads at 8 ranks on a
# shared GPU), each further row waits for its pushed packs in turn and
# lamport falls behind.
LAMPORT_MAX_BYTES = {2: 512 << 10, 3: 256 << 10, 4: 256 << 10,
                     **{world: 128 << 10 for world in range(5, 9)}}

# table name -> the measurement its values come from: device, date, results
# file (a glob) under benchmarks/results/.
PROVENANCE = {
    "ONESHOT_MAX_BYTES": "published 8-GPU NVLink crossovers, checked on one H200 shared "
                         "by 8 ranks, 2026-12-03, "
                         "benchmarks/results/h200_allreduce_w8_bf16_1k_*.json",
    "FUSED_ONESTAGE_MAX_BYTES": "ONESHOT_MAX_BYTES's crossovers, checked on one H200 shared "
                                "by the ranks, 2026-12-04, "
                                "benchmarks/results/h200_fused_w*_bf16_h4096.json",
    "FUSED_MAX_BYTES": "one H200 shared by the ranks, 2026-12-03, "
                       "benchmarks/results/h200_fused_split_w*_bf16_h4096*.json",
    "FUSED_LARGE": "one H200 shared by the ranks, 2026-12-03, "
                   "benchmarks/results/h200_fused_split_w*_bf16_h4096*.json",
    "SHARED_GPU_FUSED": "one H200 shared by the ranks, 2026-12-04, "
                        "benchmarks/results/h200_fused_w*_bf16_h4096.json",
    "SHARED_GPU_WIDE_ONESTAGE_MAX": "one H100 shared by the ranks, 2026-12-06, "
                                    "benchmarks/results/h100_fused_wide*_w*.json",
    "LAMPORT_MAX_BYTES": "one H100 shared by the ranks, 2026-12-06, "
                         "benchmarks/results/h100_fused_lamport_w*.json",
    "LL_AUTO_MAX_BYTES": "one H100 shared by the ranks, 2026-12-07, "
                         "benchmarks/results/h100_latency_w*.json",
}


def choose_fused(nbytes, world, shared_gpu=False, row_bytes=0, lamport_fits=False):
    """The allreduce_rmsnorm variant ``"auto"`` selects for an input of
    ``nbytes`` in rows of ``row_bytes``: LAMPORT up to LAMPORT_MAX_BYTES when
    the input ``lamport_fits`` (the communicator's receive slots and the
    lamport kernels' rows), else one of FUSED_VARIANTS, or FUSED_LARGE's
    choice (SPLIT or UNFUSED) past the fused crossover; SHARED_GPU_FUSED's
    when the ranks share one GPU."""
    if lamport_fits and nbytes <= _entry(LAMPORT_MAX_BYTES, world):
        return LAMPORT
    if shared_gpu:
        onestage_max, split_max = _entry(SHARED_GPU_FUSED, world)
        if row_bytes > WIDE_ROW_BYTES:
            onestage_max = SHARED_GPU_WIDE_ONESTAGE_MAX[world]
        if onestage_max is None or nbytes <= onestage_max:
            return FUSED_VARIANTS[0]
        return SPLIT if split_max is None or nbytes <= split_max else UNFUSED
    variant = _by_size(nbytes, world, FUSED_ONESTAGE_MAX_BYTES, FUSED_VARIANTS)
    limit = FUSED_MAX_BYTES[world]
    return FUSED_LARGE[world] if limit is not None and nbytes > limit else variant


def validate_fused(algo):
    return _known(algo, FUSED_VARIANTS + (SPLIT, UNFUSED, LAMPORT))


def _by_size(nbytes, world, small_max_bytes, names):
    small, large = names
    return small if nbytes <= _entry(small_max_bytes, world) else large


def _entry(table, world):
    if world not in table:
        raise ValueError(f"no algorithm table for world size {world} (supported: 2..8)")
    return table[world]


def _known(algo, names):
    if algo != "auto" and algo not in names:
        raise ValueError(f"algo must be 'auto' or one of {names}, got {algo!r}")
    return algo
