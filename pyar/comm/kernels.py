"""The kernels' interface as the host sees it: the dtypes they take, how
their entry points are named, the argument types of each, the error record
they write, and the loaded functions of one world, each looked up once.

Every name here mirrors a definition in src/kernels (allreduce.cu,
shards.cu, allreduce_rmsnorm.cu, pyar_rows.h, rail.cu, pyar_protocol.h); the
CPU tests hold each against the source.
"""
import ml_dtypes
import numpy as np

from pyar.comm import algorithms

FLOAT32 = np.dtype(np.float32)
# The element types every collective takes, and their part of a kernel's name.
DTYPE_NAMES = {
    FLOAT32: "f32",
    np.dtype(np.float16): "f16",
    np.dtype(ml_dtypes.bfloat16): "bf16",
}
# The kernels move 16-byte packs; an array they read or write in packs is
# aligned to one.
PACK_BYTES = 16
# QuantKind code (its low 4 bits) -> the kind's part of a row kernel's name.
QUANT_KIND_NAMES = {0: "plain", 1: "fp8", 2: "mxfp4"}

# --- argument types of each entry point ------------------------------------------
# one_shot/two_shot (allreduce.cu): input table, in_offset, the input to stage
# (0: read the table as it is), out, state, n, timeout_ns, signature, call.
ALLREDUCE_ARGS = ("ptr", "uint64", "ptr", "ptr", "ptr", "uint64", "uint64", "uint64", "uint32")
# ll (allreduce.cu, pyar_ll.h): this rank's input, out, state, this rank's LL
# receive region, where a rank's region starts past its two-shot scratch,
# packets per source segment, n, timeout_ns, signature, call.
LL_ARGS = ("ptr", "ptr", "ptr", "ptr", "uint64", "uint64", "uint64", "uint64", "uint64",
           "uint32")
# reduce_scatter/all_gather (shards.cu): input table, in_offset, in_stride,
# out, state, n, shard, first, count, timeout_ns, signature, call.
SHARD_ARGS = ("ptr", "uint64", "uint64", "ptr", "ptr", "uint64", "uint64", "uint64",
              "uint64", "uint64", "uint64", "uint32")
# struct RowArgs (pyar_rows.h): residual, weight, residual_out, y, q,
# scales, hidden, eps, quant, group.
ROW_ARGS = ("ptr", "ptr", "ptr", "ptr", "ptr", "ptr", "uint32", "float32", "uint32", "uint32")
# one_stage/two_stage: input table, pack offset, the input to stage, tokens,
# the row arguments, state, timeout, signature, call.
FUSED_ARGS = ("ptr", "uint64", "ptr", "uint64", *ROW_ARGS, "ptr", "uint64", "uint64", "uint32")
# lamport: this rank's input, tokens, the row arguments, state, this rank's
# receive region, where a region starts past a rank's two-shot scratch, packs
# per source in a slot, timeout, signature, call.
LAMPORT_ARGS = ("ptr", "uint64", *ROW_ARGS, "ptr", "ptr", "uint64", "uint64", "uint64",
                "uint64", "uint32")
# split's first kernel: input table, pack offset, input to stage, tokens,
# hidden, state, timeout, signature, call (the rows' sums only).
SPLIT_ARGS = ("ptr", "uint64", "ptr", "uint64", "uint32", "ptr", "uint64", "uint64", "uint32")
# add_rmsnorm: sums, tokens, the row arguments, the failure word (split) or 0.
ADD_RMSNORM_ARGS = ("ptr", "uint64", *ROW_ARGS, "ptr")
# quantize: y, tokens, hidden, codes, scales, quant, group.
QUANTIZE_ARGS = ("ptr", "uint64", "uint32", "ptr", "ptr", "uint32", "uint32")
# rail sum (rail.cu): rows, pitch, n, domains, out.
RAIL_ARGS = ("ptr", "uint64", "uint64", "uint32", "ptr")

# --- the host-visible error record (uint32 words) ----------------------------------
# [0] failed (timeout or mismatch), [1 + r] rank r never arrived, [9] the
# call's sequence number, [10] the ranks' call signatures disagree,
# [11 + 2r] and [12 + 2r] the low and high words of rank r's signature.
FAILED, MISSING, CALL, MISMATCH, SIGNATURES = 0, 1, 9, 10, 11
ERROR_WORDS = 28


# --- entry point names --------------------------------------------------------------

def allreduce_name(algo, dtype, world):
    return f"pyar_allreduce_{algo.replace('shot', '_shot')}_{DTYPE_NAMES[dtype]}_w{world}"


def allreduce_args(algo):
    return LL_ARGS if algo in algorithms.LL_ALGORITHMS else ALLREDUCE_ARGS


def reduce_scatter_outputs(dtype):
    """reduce_scatter's output dtypes for input ``dtype``: its own, and
    float32 (unrounded sums) for a 16-bit one."""
    return (dtype,) if dtype == FLOAT32 else (dtype, FLOAT32)


def shard_name(operation, dtype, out_dtype, world):
    """reduce_scatter (named by input and output dtype) or all_gather."""
    types = DTYPE_NAMES[dtype]
    if operation == "reduce_scatter":
        types += "_" + DTYPE_NAMES[out_dtype]
    return f"pyar_{operation}_{types}_w{world}"


def row_suffix(dtype, quant_code, packs_per_thread):
    """<dtype>_<quant kind>_p<packs per thread>: the part of a row kernel's
    name after the kernel's own (the fused kernels add _w<world>)."""
    kind = QUANT_KIND_NAMES[quant_code & 0xF]
    return f"{DTYPE_NAMES[np.dtype(dtype)]}_{kind}_p{packs_per_thread}"


def fused_name(variant, dtype, quant_code, packs_per_thread, world):
    """The spinning kernel of a fused variant; split's first kernel is the
    same for every quantization kind."""
    if variant == algorithms.SPLIT:
        return (f"pyar_allreduce_rmsnorm_split_{DTYPE_NAMES[dtype]}_p{packs_per_thread}"
                f"_w{world}")
    return (f"pyar_allreduce_rmsnorm_{variant.replace('stage', '_stage')}_"
            f"{row_suffix(dtype, quant_code, packs_per_thread)}_w{world}")


def fused_args(variant):
    if variant == algorithms.SPLIT:
        return SPLIT_ARGS
    return LAMPORT_ARGS if variant == algorithms.LAMPORT else FUSED_ARGS


def rail_name(rows_dtype, out_dtype):
    return f"pyar_rail_sum_{DTYPE_NAMES[rows_dtype]}_{DTYPE_NAMES[out_dtype]}"


class Functions:
    """The functions of one loaded Module, each looked up once by name."""

    def __init__(self, module):
        self.module = module
        self._found = {}

    def get(self, name, types):
        function = self._found.get(name)
        if function is None:
            function = self._found[name] = self.module.get_function(name, types)
        return function


class KernelSet:
    """The spinning kernels of one world: the all-reduce, shard and fused
    entry points of the loaded code objects (``allreduce``, ``shards`` and
    ``rows``: a pyar.comm.row_kernels.RowKernels)."""

    def __init__(self, world, allreduce, shards, rows):
        self.world = world
        self._allreduce = Functions(allreduce)
        self._shards = Functions(shards)
        self.rows = rows

    def allreduce(self, algo, dtype):
        return self._allreduce.get(allreduce_name(algo, dtype, self.world),
                                   allreduce_args(algo))

    def shard(self, operation, dtype, out_dtype):
        return self._shards.get(shard_name(operation, dtype, out_dtype, self.world), SHARD_ARGS)

    def fused(self, variant, dtype, quant_code, packs_per_thread):
        return self.rows.function(
            fused_name(variant, dtype, quant_code, packs_per_thread, self.world),
            fused_args(variant))

    def every_allreduce(self):
        """Every all-reduce kernel, the LL ones included: they spin too, so
        their occupancy bounds the all-reduce's block cap alike."""
        return [self.allreduce(algo, dtype)
                for algo in algorithms.ALGORITHMS + algorithms.LL_ALGORITHMS
                for dtype in DTYPE_NAMES]

    def every_shard(self):
        return ([self.shard("reduce_scatter", d, o)
                 for d in DTYPE_NAMES for o in reduce_scatter_outputs(d)]
                + [self.shard("all_gather", d, d) for d in DTYPE_NAMES])

    def every_fused(self, variant, dtype):
        """Every kernel of a fused variant and dtype: each quantization kind
        and packs per thread (lamport: one pack a thread only)."""
        per_thread = ((1,) if variant == algorithms.LAMPORT else
                      self.rows.layout.packs_per_thread_choices(dtype.itemsize))
        return [self.fused(variant, dtype, code, p)
                for code in QUANT_KIND_NAMES for p in per_thread]


def block_cap(multiprocessors, occupancy, max_blocks, sharing):
    """Blocks per call of a spinning kernel such that every rank's blocks fit
    on the GPU at once: with half of its block slots left to other kernels,
    and, where ``sharing`` ranks share the GPU, at most one block per
    multiprocessor over all of them.  ``occupancy``: the blocks of the
    kernel one multiprocessor holds.

    Blocks spin on peers, so a block that cannot become resident because
    spinning blocks hold the slots it needs waits until the timeout; the
    ranks on one GPU divide its slots.  Dividing all of them is not enough:
    with every slot spoken for, a rank's collective can queue behind one of
    its own small kernels (a copy, a fill, the caller's work) that finds no
    room beside the peers' spinning blocks; half the slots leave room.  Half
    is not enough either when a kernel's occupancy is high: MPS may keep
    blocks of different processes off one multiprocessor, and a grid spreads
    over as many multiprocessors as it has blocks, so two ranks' grids can
    cover every multiprocessor and keep a third rank's kernel from starting
    until they give up.  A rank alone on its GPU competes with no spinning
    peer there and may use every slot.
    """
    slots = multiprocessors * occupancy
    per_rank = (slots if sharing == 1
                else max(1, min(slots // (2 * sharing), multiprocessors // sharing)))
    return min(max_blocks, multiprocessors, per_rank)
