"""pyar.bench's signal floor on a real GPU (tests/mpi/signal_floor.py under
mpirun): the flag exchange completes and times eager and from a graph at 2
and 8 ranks; its positive control, an exchange that only the last rank makes,
shows that the wait is bounded and that the floor refuses to report over
waits that gave up."""
import pytest

from tests.mpi_launch import run_scenario

pytestmark = pytest.mark.gpu


def _rows(results, world):
    rows = [r for r in results if r.get("test") == "signal-floor"]
    assert sorted(r["rank"] for r in rows) == list(range(world)), results
    return rows


@pytest.mark.parametrize("world", [2, 8])
def test_signal_floor_measures_the_exchange(world):
    _, results = run_scenario("signal_floor", world, "measure", timeout=300)
    for row in _rows(results, world):
        assert row["raised"] is None, row
        assert 0 < row["eager_us"] < 1000 and 0 < row["graph_us"] < 1000, row


@pytest.mark.parametrize("world", [2, 4])
def test_signal_floor_control_an_exchange_nobody_answers_gives_up(world):
    _, results = run_scenario("signal_floor", world, "control", timeout=300)
    for row in _rows(results, world):
        assert 0 < row["eager_us"] < 1000, row
        # the last rank's waits for each of its world - 1 peers, and no other
        assert row["raised"] and f"gave up {world - 1} waits" in row["raised"], row
    last = next(r for r in results if r.get("rank") == world - 1)
    assert last["unanswered_ms"] < 100, last   # bounded by its 2 ms timeout
