"""IPC domains, rails and the inter-node sum under mpirun, with no GPU:
tests/test_hierarchical_cpu.py runs it on 4, 6 and 8 ranks (one machine, so
one shared-memory node; smaller domains come from node_size).

Modes:
  split     pyar.comm.domains.split for every node_size that divides the
            world, from the argument and from PYAR_RANKS_PER_NODE (the
            argument wins): domain members, rails, their order; bad values
            and domains of different sizes raise ValueError on every rank
            with the sizes in the text; pyar.Communicator splits once and
            hands the split to HierarchicalCommunicator exactly when there
            are several domains.
  rail      pyar.comm.rail.Rail over the rails of every split: sums of random
            float32 shards into float32, float16 and bfloat16, both methods,
            against the float64 sum, bitwise identical on every rank of a
            rail ("allgather": bitwise equal to the sum in domain order);
            then a rail whose last rank never calls: the others raise
            CollectiveTimeout within the wait.

Usage: hierarchical_cpu.py split | rail
"""
import os
import sys
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

from allreduce_common import bits, run

import pyar  # noqa: F401,E402
from pyar.comm import domains, factory, hierarchical, rail  # noqa: E402
from pyar.comm.errors import CollectiveTimeout  # noqa: E402

WAIT = 0.5
SLACK = 10.0  # ranks share two cores with the rest of the test run


def divisors(world):
    return [k for k in range(1, world + 1) if world % k == 0]


def check_split(sc, split, k, how):
    world, rank = sc.world, sc.rank
    members = sorted(split.domain.allgather(rank))
    want = list(range(rank // k * k, rank // k * k + k))
    sc.check(members == want, f"{how}: domain {members}, want {want}")
    sc.check(split.domain.Get_rank() == rank % k, f"{how}: domain rank {split.domain.Get_rank()}")
    sc.check(split.domains == world // k and split.domain_index == rank // k,
             f"{how}: {split.domains} domains, index {split.domain_index}")
    sc.check(split.node_rank == rank, f"{how}: node rank {split.node_rank} (one node)")
    if k == world:
        sc.check(split.rail is None, f"{how}: one domain, yet a rail")
        return
    if not sc.check(split.rail is not None, f"{how}: several domains, no rail"):
        return
    rail_members = split.rail.allgather(rank)
    sc.check(rail_members == list(range(rank % k, world, k)),
             f"{how}: rail {rail_members} (in rail order)")
    sc.check(split.rail.Get_rank() == rank // k, f"{how}: rail rank {split.rail.Get_rank()}")


def split_mode(sc):
    world = MPI.COMM_WORLD
    checked = 0
    for k in divisors(sc.world):
        split = domains.split(world, k)
        check_split(sc, split, k, f"node_size={k}")
        split.free()
        os.environ[domains.RANKS_PER_NODE] = str(k)
        split = domains.split(world)
        check_split(sc, split, k, f"{domains.RANKS_PER_NODE}={k}")
        split.free()
        split = domains.split(world, sc.world)  # the argument wins over the variable
        check_split(sc, split, sc.world, f"node_size={sc.world} with the variable {k}")
        split.free()
        del os.environ[domains.RANKS_PER_NODE]
        checked += 1
    split = domains.split(world, 4 * sc.world)  # no domain is larger than its node
    check_split(sc, split, sc.world, "node_size larger than the node")
    split.free()
    split = domains.split(world)
    check_split(sc, split, sc.world, "no node_size: the whole node")
    split.free()

    for bad in (0, -2, 2.0, "2", True):
        sc.expect_raises(ValueError, lambda: domains.split(world, bad), f"node_size={bad!r}",
                         contains=("node_size", "positive"))
    os.environ[domains.RANKS_PER_NODE] = "two"
    sc.expect_raises(ValueError, lambda: domains.split(world), "PYAR_RANKS_PER_NODE=two",
                     contains=("PYAR_RANKS_PER_NODE='two'", "whole number"))
    del os.environ[domains.RANKS_PER_NODE]

    # Domains of different sizes: 4 + 2 at 6 ranks, 3 + 3 + 2 at 8, 3 + 1 at 4.
    k = {4: 3, 6: 4, 8: 3}[sc.world]
    sizes = [min(k, sc.world - start) for start in range(0, sc.world, k)]
    sc.expect_raises(ValueError, lambda: domains.split(world, k), f"uneven node_size={k}",
                     contains=("same number of ranks", f"node of ranks 0-{sc.world - 1}: "
                               f"{sc.world} ranks", "IPC domain sizes " +
                               ", ".join(map(str, sizes))))

    check_dispatch(sc, divisors(sc.world)[1])
    sc.report(test="hierarchical-split", node_sizes=checked)


def check_dispatch(sc, k):
    """pyar.Communicator builds a HierarchicalCommunicator over several
    domains (its constructor replaced by a recorder: no GPU here), handing it
    the split into domains of ``k`` ranks, and the one-node communicator
    over one (which then fails for want of a GPU, on every rank)."""
    made = []
    real = hierarchical.HierarchicalCommunicator.__init__

    def record(self, mpi_comm, split, *args, **options):
        # What the split holds, then freed: the communicator owns its split.
        made.append(((split.domain.Get_size(), split.domains, split.rail is not None), args,
                     options))
        split.free()

    hierarchical.HierarchicalCommunicator.__init__ = record
    shape = (k, sc.world // k, True)  # domain size, domains, a rail
    try:
        got = factory.Communicator(MPI.COMM_WORLD, None, 1 << 20, 7.0, node_size=k, debug=False)
        sc.check(type(got) is hierarchical.HierarchicalCommunicator,
                 f"node_size={k}: Communicator() gave {type(got).__name__}")
        options = {"kernels": None, "debug": False, "rail_method": "auto", "inter_node": None}
        sc.check(made == [(shape, (None, 1 << 20, 7.0), options)],
                 f"node_size={k}: HierarchicalCommunicator got {made}")
        made.clear()
        os.environ[domains.RANKS_PER_NODE] = str(k)
        got = factory.Communicator(MPI.COMM_WORLD)
        sc.check(type(got) is hierarchical.HierarchicalCommunicator,
                 f"{domains.RANKS_PER_NODE}={k}: Communicator() gave {type(got).__name__}")
        sc.check([m[0] for m in made] == [shape],
                 f"{domains.RANKS_PER_NODE}={k}: HierarchicalCommunicator got {made}")
        del os.environ[domains.RANKS_PER_NODE]
        made.clear()
        try:
            factory.Communicator(MPI.COMM_WORLD, timeout=7.0)
        except Exception:  # noqa: BLE001 - no GPU: the one-node path fails, as it should
            pass
        sc.check(made == [], f"one domain, yet HierarchicalCommunicator got {made}")
        sc.expect_raises(ValueError, lambda: factory.Communicator(
            MPI.COMM_WORLD, timeout=-1.0, node_size=k), "a negative timeout", contains=("timeout",))
    finally:
        hierarchical.HierarchicalCommunicator.__init__ = real


def inputs(n, rank, key):
    return np.random.default_rng([20261203, key, rank, n]).standard_normal(n, np.float32)


def rail_mode(sc):
    world = MPI.COMM_WORLD
    dtypes = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
    tolerance = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
    sums = 0
    for k in divisors(sc.world)[:-1]:
        split = domains.split(world, k)
        members = split.rail.allgather(sc.rank)
        for method in ("allgather", "reduce_scatter"):
            line = rail.Rail(split.rail, 30.0, members, sc.rank, method)
            for n in (1, 5, 1000, 4097):
                for dtype in dtypes:
                    send = np.zeros(rail.send_capacity(n, split.domains) + 3, np.float32)
                    send[:n] = inputs(n, sc.rank, k)
                    result = np.empty(n, dtype)
                    line.sum(send, result, "test sum")
                    parts = np.stack([inputs(n, r, k) for r in members])
                    reference = parts.astype(np.float64).sum(axis=0)
                    error = np.abs(result.astype(np.float64) - reference).max()
                    scale = np.abs(reference).max()
                    how = f"node_size={k} {method} n={n} {dtype}"
                    sc.check(error <= tolerance[str(dtype)] * scale,
                             f"{how}: error {error:.3g} of {scale:.3g}")
                    digests = split.rail.allgather(bits(result).tobytes())
                    sc.check(all(d == digests[0] for d in digests),
                             f"{how}: the rail's ranks got different bits")
                    if method == "allgather":
                        ordered = rail.add_in_order(parts, np.empty(n, dtype),
                                                    np.empty(n, np.float32))
                        sc.check(np.array_equal(bits(result), bits(ordered)),
                                 f"{how}: not the sum in domain order")
                    sums += 1
            sc.check(line.method == method, f"method {line.method} != {method}")
            sc.check(rail.Rail(split.rail, 1.0, members, sc.rank).method ==
                     ("allgather" if split.domains == 2 else "reduce_scatter"),
                     f"auto at {split.domains} domains")
        split.free()
    sc.expect_raises(ValueError, lambda: rail.choose("ring", 2), "an unknown method",
                     contains=("ring",))
    timeout_checks(sc)
    sc.report(test="hierarchical-rail", sums=sums)


def timeout_checks(sc):
    """The last rank of each rail never calls: the others raise CollectiveTimeout
    within the wait, and again at once on the next call."""
    k = divisors(sc.world)[1]
    split = domains.split(MPI.COMM_WORLD, k)
    members = split.rail.allgather(sc.rank)
    line = rail.Rail(split.rail, WAIT, members, sc.rank, "allgather")
    send, result = np.ones(64, np.float32), np.empty(64, np.float32)
    if split.domain_index != split.domains - 1:
        started = time.monotonic()
        error = sc.expect_raises(CollectiveTimeout, lambda: line.sum(send, result, "call 9"),
                                 "a rail whose last rank never calls",
                                 contains=("call 9", "inter-node step", "rail of ranks"))
        elapsed = time.monotonic() - started
        sc.check(WAIT * 0.9 <= elapsed < WAIT + SLACK, f"raised after {elapsed:.2f} s")
        again = sc.expect_raises(CollectiveTimeout, lambda: line.sum(send, result, "call 10"),
                                 "the next call on the failed rail")
        sc.check(again is error, "the next call raised another error")
    # The rail is never freed: the ranks that gave up left a request on it.
    split.domain.Free()
    MPI.COMM_WORLD.Barrier()


if __name__ == "__main__":
    mode = sys.argv[1]
    run(f"hierarchical_cpu {mode}", {"split": split_mode, "rail": rail_mode}[mode])
