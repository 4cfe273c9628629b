"""All-reduce under graph capture, at world sizes 2, 4 and 8 sharing GPU 0.

Inputs a capture reads are not staged: the graph reads them in place through
pointer tables filled when ``comm.capture()`` ends (register_graph_buffers).
"""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLDS = [2, 4, 8]


@pytest.mark.parametrize("world", WORLDS)
def test_graph_replay_with_reused_input_slot(world):
    """A graph of 8 x [producer writes input slot x][delay on some ranks]
    [all-reduce x][consumer overwrites x with NaN], replayed 125 times (1000
    all-reduces) per (dtype, algorithm) with random per-rank delays before
    each replay and spin kernels on a second stream competing for the SMs
    during it: every output exact, zero mismatches."""
    rows = rows_of(scenario("allreduce_graphs", world, "replay", timeout=420), "graph-replay")
    assert {(r["dtype"], r["algo"]) for r in rows} == {
        (d, a) for d in ("float32", "float16", "bfloat16") for a in ("oneshot", "twoshot")}
    for row in rows:
        assert row["calls"] >= 1000, row
        assert row["mismatches"] == 0, row


@pytest.mark.parametrize("world", WORLDS)
def test_graph_positive_control(world, kernels_without_exit_barrier):
    """The same graph with one-shot kernels built without the exit barrier
    must produce wrong results: the graph test sees the seeds' bug.  The
    control reads a larger slot under competing spin kernels (their size and
    weight per world size in tests/mpi/allreduce_graphs.py) and replays until
    it sees a wrong result or 90 s have passed."""
    rows = rows_of(scenario("allreduce_graphs", world, "replay", kernels_without_exit_barrier,
                            timeout=300), "graph-control")
    assert rows[0]["mismatches"] > 0, rows


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
