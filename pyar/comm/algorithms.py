"""Which all-reduce algorithm a call uses, by message size and world size.

One-shot (every rank reads every peer's whole input) wins while latency
dominates; two-shot (reduce-scatter, then all-gather) moves 2(W-1)/W of the
data per rank instead of W-1 and wins once bandwidth dominates.  The
crossovers below start from published measurements of custom all-reduce on
8-GPU NVLink nodes (one-shot up to about 256-512 KiB at 2-4 ranks, 80-256 KiB
at 8) and are retuned from ``python -m pyar.bench`` output.
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
    return _by_size(nbytes, world, ONESHOT_MAX_BYTES, ALGORITHMS)


def validate(algo):
    return _known(algo, ALGORITHMS)


# world size -> largest input (tokens * hidden * itemsize) that the fused
# all-reduce + RMSNorm still runs one-stage.  The variants move the data of
# one-shot and two-shot, so they start from the same crossovers.  One shared
# GPU cannot retune them: there one-stage stays ahead up to 32 MiB at 2 and 4
# ranks (no link to saturate, and fewer kernel phases) and falls behind from
# 2 MiB at 8 (benchmarks/results/h200_one_gpu_fused_*); between GPUs the
# links decide, and the several-GPU run retunes this table.
FUSED_ONESTAGE_MAX_BYTES = dict(ONESHOT_MAX_BYTES)


# world size -> largest input at which a fused kernel still beats the same
# steps unfused (pyar's all-reduce, then the single-GPU add + RMSNorm (+
# quantization) kernel); above it ``"auto"`` runs FUSED_LARGE instead, so
# that allreduce_rmsnorm is never slower than the steps it fuses.  None: no
# crossover measured, the fused kernels run at every size.  Filled from the
# fused_us / unfused_us columns of ``python -m pyar.bench --fused`` (graph
# mode, every quantization kind): the largest size below which fused wins at
# every measured point.  Measured on one H200 shared by the ranks (bf16,
# hidden 4096, 2026-12-03): at 8 ranks fused wins at 16 and 128 tokens (1.06x,
# 1.09x) and loses from 1024 on (0.66x); at 2 ranks it ties from 128 to 1024
# tokens and loses with FP8 at 4096 (0.91x).  Both cross at 1 MiB (128 rows of
# 4096 bf16); the worlds between are not measured yet and take the same.
FUSED_MAX_BYTES = {world: 1 << 20 for world in range(2, 9)}

# world size -> what ``"auto"`` runs past FUSED_MAX_BYTES: SPLIT or UNFUSED.
# Split moves what the unfused steps move less the all-reduce's reduced
# shards (written, then read back: traffic.fused_shared_gpu_bytes), and its
# spinning kernel has one phase after the start barrier where the
# all-reduce's has two; its norms use the whole GPU like the unfused ones.
# Measured on one H200 shared by the ranks (bf16, hidden 4096, graph mode,
# 2026-12-03, split_us / unfused_us of ``python -m pyar.bench --fused``):
# 2 ranks 1024 / 4096 tokens 38 / 116 us against 43 / 141 (1.13x, 1.22x);
# 4 ranks 69 / 221 against 78 / 274 (1.13x, 1.24x); 8 ranks 53 us against 56
# at 256 tokens, but 333 / 2767 against 160 / 523 at 1024 / 4096 (0.48x,
# 0.19x: the reduce-scatter kernel of 8 ranks on 16 resident blocks each).
# 3 ranks take split and 5-7 unfused until they are measured.
FUSED_LARGE = {world: SPLIT if world <= 4 else UNFUSED for world in range(2, 9)}


# The tables above are for a GPU per rank.  Ranks that share one GPU (MPS)
# read their "peers" from the same memory: there is no link to spare, so
# one-stage (every rank reads every row) stays ahead far longer, two-stage
# never leads, and split's capped spinning grid falls behind the unfused
# steps' whole-GPU kernels once the input is large.  world size ->
# (one-stage up to, then split up to; beyond: the unfused steps) in input
# bytes, None for no bound.  Measured on one H200 shared by the ranks (bf16,
# hidden 4096, every quantization kind; the eager rows' forced variants in
# benchmarks/results/h200_one_gpu_fused_w*_bf16_{epilogue_,}session10.json,
# with the quantizing epilogue of 2026-12-04 that costs a third less):
# 2 ranks: one-stage leads at every size (at 4096 and 8192 tokens 0-13% ahead
#   of split, 1.20-1.46x the unfused steps);
# 4 ranks: one-stage leads or is level to 4096 tokens (split 1-10% ahead at
#   4096 with quantization, but one-stage stays ahead of the unfused steps)
#   and leads at 8192 (1.06-1.24x the unfused steps, split 0.80-0.90x);
# 8 ranks: one-stage leads to 64 tokens (512 KiB), split at 128-256 (2 MiB,
#   1.0-1.1x the unfused steps), the unfused steps from 1024 tokens (where
#   one-stage and split take 1.5-2.1x as long, and more beyond).
# 3 ranks take 4's entry and 5-7 take 8's until they are measured.  Split's
# bound at 3-4 ranks still applies to wide rows (below).
SHARED_GPU_FUSED = {2: (None, None), 3: (None, 32 << 20), 4: (None, 32 << 20),
                    **{world: (512 << 10, 2 << 20) for world in range(5, 9)}}
# Rows wider than WIDE_ROW_BYTES take blocks of more than 512 threads, half
# as many resident, and one-stage falls behind split far sooner: world size
# -> one-stage's bound for them.  Measured the same way at hidden 7168 bf16
# (14 KiB rows, ..._h7168_session9.json): one-stage leads to 64 tokens at 2
# ranks (896 KiB; at 128 split is 9-15% ahead with quantization, 3% behind
# without) and to 16 at 4 and 8 (224 KiB; at 64 split is 2-7% ahead with
# quantization at 4 ranks, 6% behind without, and ahead or level at 8).
# Measured again on the H100 with the kernels of 53c5abd (eager forced
# variants; benchmarks/results/h100_one_gpu_fused_*_h16384_session18.json,
# *_f32_h8192_session18.json and *_wide_*_session18.json): at 4 ranks
# one-stage leads or ties split up to 1 MiB at 14 KiB rows (64 tokens) and at
# 32 KiB rows (bfloat16 hidden 16384 and float32 8192, two packs a thread; 32
# tokens), where split had run 0.96-0.99x the unfused steps without
# quantization, and split leads at 2 MiB with quantization; at 8 ranks
# one-stage is level with split or behind it from 448 KiB (a trial at 512
# KiB: 7168 x 32 tokens 0.94-1.12x the unfused steps in graphs, 16384 x 16
# 0.90-1.04x, where split runs 1.01-1.13x).  3 ranks take 4's bound, 5-7
# take 8's.
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
# lamport falls behind.  Measured on one H100 shared by the ranks (bf16,
# graph mode, no quantization, 2026-12-06; lamport_us against the best of
# onestage_us / twostage_us / split_us and unfused_us of ``python -m
# pyar.bench --fused``, benchmarks/results/h100_one_gpu_fused_*_lamport_*):
# 2 ranks: hidden 4096 5.6-7.0 us against 6.3-7.4 up to 512 KiB (1.07-1.14x
#   the best barrier variant, 1.36-1.44x the unfused steps), 0.95x at 1 MiB;
#   hidden 7168 1.07-1.10x up to 448 KiB, 0.96x at 896 KiB;
# 4 ranks: 1.17-1.28x up to 256 KiB at hidden 4096 and 1.18-1.22x up to 224
#   KiB at 7168; 0.91x at 512 KiB and 0.97x at 448 KiB;
# 8 ranks: 1.17-1.19x up to 64 KiB and 1.03x at 128 KiB (hidden 4096),
#   1.03-1.06x up to 56 KiB at 7168; 0.69x at 256 KiB and 0.78x at 224 KiB.
# 3 ranks take 4's bound and 5-7 take 8's until they are measured; with a
# GPU per rank the links may move the bounds (unmeasured).
LAMPORT_MAX_BYTES = {2: 512 << 10, 3: 256 << 10, 4: 256 << 10,
                     **{world: 128 << 10 for world in range(5, 9)}}


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
