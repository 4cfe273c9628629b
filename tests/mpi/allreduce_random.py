"""Random inputs: every rank sums different random data (seeded by rank,
configuration and iteration); every rank regenerates all ranks' inputs, so it
can check its result against a float64 reference of the whole sum.

Per dtype and size, every input is all-reduced in four ways -- staged out of
place, staged in place (out=x), registered (comm.register) out of place,
registered in place (two-shot and auto only: one-shot refuses it) -- by
one-shot, two-shot, auto and the LL one-shot and two-shot (where they take
the size: up to ll_bytes(algo, world, max_size)).  Required:
- each result is within the dtype's tolerance of the float64 reference:
  |y - ref| <= (W * eps_fp32 + eps_dtype) * sum_r |x_r| (+ the smallest
  subnormal), from fp32 accumulation over W addends and one final rounding;
- all ways and algorithms give bitwise-identical results, equal to staged
  one-shot's (every kernel, the LL two-shot's shard owners included, sums
  in rank order 0..W-1 in fp32 and rounds once);
- every rank's result is bitwise identical (an allgather of hashes);
- out-of-place calls leave their input unchanged.
Also counted (reported, not required): results that differ from a host
emulation of that order (fp32 adds in rank order, one rounding to the dtype).

Sizes: 1, 7, 4095, the largest odd count each LL algorithm takes at this
world size and 2**20 + 3 elements on a communicator with the default scratch
buffer, then on one with max_size = 1 MiB: one element under the scratch
size, exactly the scratch size, one over (two chunks) and 3 scratch sizes + 5
(four chunks, the last of 5 elements).

Usage: allreduce_random.py
"""
import hashlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from allreduce_common import (
    DTYPES, LL_ALGOS, bits, describe_difference, ll_bytes, ll_largest, normal, run,
)

ITERATIONS = 2
SMALL_SCRATCH = 1 << 20
VARIANTS = ("staged", "staged-inplace", "registered", "registered-inplace")
ALGOS = ("oneshot", "twoshot", "auto") + LL_ALGOS
EPS32 = float(np.finfo(np.float32).eps)


def default_sizes(dtype, world):
    # At 2 ranks both LL algorithms take the same largest input.
    largest = sorted({ll_largest(dtype, algo, world) for algo in LL_ALGOS})
    return (1, 7, 4095, *largest, (1 << 20) + 3)


def scratch_sizes(dtype, world):
    s = SMALL_SCRATCH // dtype.itemsize
    return (s - 1, s, s + 1, 3 * s + 5)


def tolerance_scale(dtype, world):
    info = ml_dtypes.finfo(dtype)  # numpy's finfo does not know bfloat16
    return world * EPS32 + float(info.eps), float(info.smallest_subnormal)


class Stats:
    def __init__(self):
        self.rows = {}
        self.notes = 0

    def row(self, dtype, algo):
        return self.rows.setdefault((dtype.name, algo), dict(
            calls=0, mismatches=0, out_of_tolerance=0, variant_differences=0,
            rank_differences=0, input_changed=0, emulation_differences=0))


def reduce_with(sc, comm, stream, variant, algo, mine, registered):
    """One all-reduce of ``mine`` done the ``variant`` way; returns (result
    array on the device, input array or None when the input was consumed)."""
    n, dtype = mine.size, mine.dtype
    if variant == "staged":
        x = pyar.asarray(mine, stream=stream)
        return comm.allreduce(x, algo=algo, stream=stream), x
    if variant == "staged-inplace":
        x = pyar.asarray(mine, stream=stream)
        y = comm.allreduce(x, out=x, algo=algo, stream=stream)
        sc.check(y is x, "in-place allreduce did not return x")
        return y, None
    x = registered.get((dtype.name, n))
    if x is None:
        x = registered[(dtype.name, n)] = pyar.empty((n,), dtype, stream=stream, ipc=True)
        comm.register(x)  # collective: every rank registers the same sizes in order
    x.set(mine, stream=stream)
    if variant == "registered":
        y = pyar.empty((n,), dtype, stream=stream)
        returned = comm.allreduce(x, out=y, algo=algo, stream=stream)
        sc.check(returned is y, "allreduce did not return its out")
        return y, x
    y = comm.allreduce(x, out=x, algo=algo, stream=stream)
    sc.check(y is x, "in-place allreduce did not return x")
    return y, None


def run_size(sc, comm, stream, dtype, n, config, stats, registered):
    world = sc.world
    scale, floor = tolerance_scale(dtype, world)
    ll_takes = {algo: n * dtype.itemsize <= ll_bytes(algo, world, comm.max_size)
                for algo in LL_ALGOS}
    for it in range(ITERATIONS):
        inputs = [normal(dtype, n, config, it, r) for r in range(world)]
        mine = inputs[sc.rank]
        reference = np.zeros(n, np.float64)
        magnitude = np.zeros(n, np.float64)
        emulated = inputs[0].astype(np.float32)
        for r, a in enumerate(inputs):
            a64 = a.astype(np.float64)
            reference += a64
            magnitude += np.abs(a64)
            if r:
                emulated += a.astype(np.float32)
        emulated = emulated.astype(dtype)
        bound = scale * magnitude + floor
        del inputs

        first = None
        digests = []
        for variant in VARIANTS:
            for algo in ALGOS:
                if variant == "registered-inplace" and algo == "oneshot":
                    continue
                if algo in ll_takes and not ll_takes[algo]:
                    continue
                what = f"random {dtype.name} n={n} it={it} {variant} {algo}"
                row = stats.row(dtype, algo)
                y, x = reduce_with(sc, comm, stream, variant, algo, mine, registered)
                comm.synchronize(stream)
                got = y.get(stream=stream)
                row["calls"] += 1
                bad = False
                error = np.abs(got.astype(np.float64) - reference)
                outside = int(np.count_nonzero(~(error <= bound)))  # NaN counts as outside
                if outside:
                    row["out_of_tolerance"] += 1
                    bad = True
                    worst = int(np.nanargmax(np.where(np.isnan(error), np.inf, error / bound)))
                    sc.check(False, f"{what}: {outside} elements outside tolerance, worst at "
                                    f"{worst}: got {float(got.astype(np.float32)[worst])!r}, "
                                    f"reference {reference[worst]!r}, bound {bound[worst]:.3g}")
                if first is None:
                    first = got
                elif not np.array_equal(bits(got), bits(first)):
                    row["variant_differences"] += 1
                    bad = True
                    sc.check(False, f"{what}: not bitwise equal to staged one-shot: "
                                    f"{describe_difference(got, first)}")
                if not np.array_equal(bits(got), bits(emulated)):
                    row["emulation_differences"] += 1
                    stats.notes += 1
                    if stats.notes <= 5:
                            sc.log(f"note: {what} differs from the host emulation of fp32 "
                               f"rank-order summation: {describe_difference(got, emulated)}")
                if x is not None and not np.array_equal(bits(x.get(stream=stream)), bits(mine)):
                    row["input_changed"] += 1
                    bad = True
                    sc.check(False, f"{what}: an out-of-place call changed its input")
                row["mismatches"] += bad
                digests.append((dtype, algo, what, hashlib.sha256(bits(got).tobytes()).digest()))
        # Every rank computed the same results, bit for bit.
        everyone = sc.mpi.allgather([d for _, _, _, d in digests])
        for i, (dt, algo, what, digest) in enumerate(digests):
            differ = [r for r in range(world) if everyone[r][i] != digest]
            if differ:
                row = stats.row(dt, algo)
                row["rank_differences"] += 1
                row["mismatches"] += 1
                sc.check(False, f"{what}: result differs from rank(s) {differ}")


def main(sc):
    stats = Stats()
    config = 0
    for max_size, sizes in ((None, default_sizes), (SMALL_SCRATCH, scratch_sizes)):
        kwargs = {} if max_size is None else {"max_size": max_size}
        comm = pyar.Communicator(MPI.COMM_WORLD, timeout=60.0, **kwargs)
        if max_size is not None:
            sc.check(comm.max_size == max_size, f"max_size {comm.max_size} != {max_size}")
        stream = pyar.Stream()
        registered = {}  # kept alive until the communicator is closed
        for dtype in DTYPES:
            for n in sizes(dtype, sc.world):
                config += 1
                run_size(sc, comm, stream, dtype, n, config, stats, registered)
        comm.close()
        registered.clear()
    for (dtype, algo), row in stats.rows.items():
        totals = {k: sc.sum(v) if k != "calls" else v for k, v in row.items()}
        sc.report(test="random", algo=algo, dtype=dtype, **totals)


if __name__ == "__main__":
    run("allreduce_random", main)
