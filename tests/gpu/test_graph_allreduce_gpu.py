"""All-reduce under graph capture, at world sizes 2, 4 and 8 sharing GPU 0.

Inputs a capture reads are not staged: the graph reads them in place through
pointer tables filled when ``comm.capture()`` ends (register_graph_buffers).
"""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLDS = [2, 4, 8]
LL_ALGOS = ("ll", "ll_twoshot")


@pytest.mark.parametrize("world", WORLDS)
def test_graph_replay_with_reused_input_slot(world):
    """A graph of 8 x [producer writes input slot x][delay on some ranks]
    [all-reduce x][consumer overwrites x with NaN], replayed 125 times (1000
    all-reduces) per (dtype, algorithm) with random per-rank delays before
    each replay and spin kernels on a second stream competing for the SMs
    during it: every output exact, zero mismatches.  The LL one-shot and
    two-shot too, 50 replays (400 all-reduces) per dtype each of the largest
    slot it takes at this world size."""
    rows = rows_of(scenario("allreduce_graphs", world, "replay", timeout=420), "graph-replay")
    assert {(r["dtype"], r["algo"]) for r in rows} == {
        (d, a) for d in ("float32", "float16", "bfloat16")
        for a in ("oneshot", "twoshot") + LL_ALGOS}
    for row in rows:
        assert row["calls"] >= (400 if row["algo"] in LL_ALGOS else 1000), row
        assert row["mismatches"] == 0, row


@pytest.mark.parametrize("world", WORLDS)
def test_graph_positive_control(world, request):
    """The same graph with one-shot kernels built without the exit barrier
    must produce wrong results: the graph test sees the seeds' bug.  The
    control reads a larger slot under competing spin kernels (their size and
    weight per world size in tests/mpi/allreduce_graphs.py) and replays until
    it sees a wrong result or 90 s have passed.  Two ranks sharing a GPU read
    at one pace, and no competing kernel put one a graph node behind (no
    wrong sum in 161480 calls): there rank 1 lags 50 us after the start
    barrier (test_graph_replay_with_a_lagging_rank: harmless with the exit
    barrier)."""
    kernels = request.getfixturevalue("lagging_kernels_without_exit_barrier" if world == 2
                                      else "kernels_without_exit_barrier")
    rows = rows_of(scenario("allreduce_graphs", world, "replay", kernels, timeout=300),
                   "graph-control")
    assert rows[0]["mismatches"] > 0, rows


def test_graph_replay_with_a_lagging_rank(kernels_with_a_lagging_rank):
    """The 2-rank control's lag with the exit barrier in place: every output
    of test_graph_replay_with_reused_input_slot's graphs stays exact, so the
    control's wrong sums come from the missing barrier, not from the lag."""
    rows = rows_of(scenario("allreduce_graphs", 2, "lagged", kernels_with_a_lagging_rank,
                            timeout=420), "graph-lagged")
    assert len(rows) == 6, rows
    for row in rows:
        assert row["calls"] >= 1000 and row["mismatches"] == 0, row


@pytest.mark.parametrize("world", WORLDS)
def test_graphs_per_batch_size_with_eager_calls(world):
    """Graphs captured per token count over one shared input buffer, replayed
    in random order with staged eager calls interleaved, against float64;
    ranks capturing in different orders raise MismatchError on every rank."""
    rows = scenario("allreduce_graphs", world, "serve", timeout=300)
    serving = rows_of(rows, "graph-serving")[0]
    assert serving["checked"] >= serving["calls"] and serving["mismatches"] == 0, serving
    assert rows_of(rows, "graph-order-mismatch")[0]["ranks_raised"] == world
    assert rows_of(rows, "graph-after-close")[0]["ranks_raised"] == world
