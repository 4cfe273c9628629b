"""reduce_scatter and all_gather on a real GPU (docs/api.md), at world sizes 1
(copies), 2, 3, 4 and 8, every rank on GPU 0 under MPS on the one-GPU machine. One
mpirun launch per world runs tests/mpi/shard_collectives.py's random and adversarial
modes together (a launch costs seconds under MPS); the positive control is a launch of
its own against kernels built without the exit barrier."""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLDS = [2, 3, 4, 8]
DTYPES = ("float32", "float16", "bfloat16")


@pytest.mark.parametrize("world", [1] + WORLDS)
def test_reduce_scatter_and_all_gather(world):
    """Random per-rank inputs, every dtype, counts 1, 4097, one over the 256 KiB
    scratch buffer, 2**20 + 3 and shards of one length, staged / registered /
    graph-captured: each
    shard within the fp32-sum tolerance of float64, exactly the all-reduce's
    bits, exact for integer-valued inputs; the gathered shards are the
    all-reduce's result, bitwise the same on every rank; inputs unchanged.
    Then the adversarial write-after-read rounds: 500 calls per (operation,
    staged/registered), every input overwritten with NaN right after its call
    while random ranks are delayed or disturbed, zero wrong results.  A world
    of one: both are copies."""
    rows = scenario("shard_collectives", world, "all", timeout=300)
    if world == 1:
        assert rows_of(rows, "shards-world-of-one")[0]["mismatches"] == 0, rows
        return
    random = rows_of(rows, "shards-random")
    assert {(r["dtype"], r["mode"], r["exact"]) for r in random} == {
        (d, m, e) for d in DTYPES for m in ("staged", "registered", "captured")
        for e in (False, True)}
    for row in random:
        assert row["calls"] > 0, row
        for key in ("out_of_tolerance", "allreduce_differences", "gather_differences",
                    "rank_differences", "inputs_changed", "inexact"):
            assert row[key] == 0, (key, row)
    assert rows_of(rows, "shards-fresh")[0]["mismatches"] == 0, rows
    adversarial = rows_of(rows, "shards-adversarial")
    assert {(r["operation"], r["variant"]) for r in adversarial} == {
        (o, v) for o in ("reduce_scatter", "all_gather") for v in ("staged", "registered")}
    for row in adversarial:
        assert row["calls"] >= 500 and row["mismatches"] == 0, row


@pytest.mark.parametrize("world", [4])
def test_positive_control_detects_missing_exit_barrier(world, kernels_without_exit_barrier):
    """The adversarial rounds against the kernels built without the exit barrier
    (PYAR_TEST_SKIP_EXIT_BARRIER) must see wrong results for both operations:
    without it a rank returns while slow peers still read its input (registered)
    or its scratch (staged), and overwrites them."""
    rows = scenario("shard_collectives", world, "control", kernels_without_exit_barrier, timeout=300)
    total = rows_of(rows, "shards-control-total")[0]
    tried = rows_of(rows, "shards-control")
    for operation in ("reduce_scatter", "all_gather"):
        seen = sum(r["mismatches"] for r in tried if r["operation"] == operation)
        assert seen > 0, (
            f"no wrong {operation} result in {total['calls']} calls without the exit barrier "
            f"on {world} ranks ({total['timeouts']} timeouts): the adversarial test cannot see "
            f"the bug it exists for\n{tried}")
