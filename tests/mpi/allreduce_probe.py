"""Deterministic probe: every rank's input is all ones, so every element of
every call's result must equal the world size exactly.

For each dtype (fp32, fp16, bf16), algorithm (one-shot, two-shot, the LL
one-shot and two-shot) and size (1, 7, 4095, 2**20 + 3 elements; for the LL
algorithms, which take at most ll_bytes(algo, world), the largest odd count
within that instead of 2**20 + 3): CALLS calls, queued BATCH at a time on one
stream into distinct outputs that were overwritten with NaN just before the
call (so a call that wrote nothing, or only part, cannot pass on a previous
call's result).  The input must be unchanged afterwards.

With ``wrap``, every size starts with the epochs CALLS // 2 calls before 2**32
(start_epochs_at), so every block that size uses crosses the 32-bit wrap.

Usage: allreduce_probe.py [wrap]
"""
import numpy as np
from mpi4py import MPI

import pyar
from allreduce_common import (
    DTYPES, LL_ALGOS, WITH_LL, bits, describe_difference, ll_largest, poison, run,
    start_epochs_at,
)

SIZES = (1, 7, 4095, (1 << 20) + 3)
CALLS = 50
BATCH = 10


def sizes(dtype, algo, world):
    if algo in LL_ALGOS:
        return SIZES[:-1] + (ll_largest(dtype, algo, world),)
    return SIZES


def main(sc):
    wrap = sc.argv == ["wrap"]
    with pyar.Communicator(MPI.COMM_WORLD, timeout=60.0) as comm:
        stream = pyar.Stream()
        for dtype in DTYPES:
            for algo in WITH_LL:
                calls = mismatches = 0
                for n in sizes(dtype, algo, sc.world):
                    ones = np.ones(n, dtype)
                    x = pyar.asarray(ones, stream=stream)
                    outs = [pyar.empty((n,), dtype, stream=stream) for _ in range(BATCH)]
                    want = np.full(n, sc.world, dtype)
                    if wrap:
                        start_epochs_at(comm, 2**32 - CALLS // 2)
                    for _ in range(CALLS // BATCH):
                        for y in outs:
                            poison(y, stream)
                            returned = comm.allreduce(x, out=y, algo=algo, stream=stream)
                            sc.check(returned is y, "allreduce did not return its out")
                        comm.synchronize(stream)
                        for y in outs:
                            got = y.get(stream=stream)
                            calls += 1
                            if not np.array_equal(bits(got), bits(want)):
                                mismatches += 1
                                sc.check(False, f"probe {dtype.name} {algo} n={n}: "
                                                f"{describe_difference(got, want)}")
                    sc.check(np.array_equal(bits(x.get(stream=stream)), bits(ones)),
                             f"probe {dtype.name} {algo} n={n}: the input changed")
                total = sc.sum(mismatches)
                sc.report(test="probe-wrap" if wrap else "probe", algo=algo,
                          dtype=dtype.name, calls=calls, mismatches=total,
                          sizes=list(sizes(dtype, algo, sc.world)))


if __name__ == "__main__":
    run("allreduce_probe", main)
