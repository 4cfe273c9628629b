"""Teardown after a failure on a real GPU, at 4 ranks under MPS: a rank that
stops calling, a rank that aborts (between calls, and while its kernel waits
for the others), and disagreeing calls; the survivors close, rebuild over a
Create_group communicator without the lost rank on the same GPU, and sum
random data correctly (tests/mpi/teardown_recovery.py).

Each scenario prints one ``teardown`` row per rank (failure, role, what the
rank saw, seconds to the exception, seconds in close, the rebuilt world) --
the rows of issue 17's closing table -- and a ``teardown-total`` row.
"""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLD = 4
TIMEOUT = 2.0  # the scenario's


def rows_for(failure):
    rows = scenario("teardown_recovery", WORLD, failure, timeout=240)
    total = rows_of(rows, "teardown-total")[0]
    assert total["wrong"] == 0 and total["failed_checks"] == 0, total
    ranks = sorted(rows_of(rows, "teardown"), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == list(range(WORLD)), ranks
    return total, ranks


def check_survivors(ranks, lost, saw):
    for row in ranks:
        if row["rank"] == lost:
            continue
        assert row["role"] == "survivor" and row["saw"] == saw, row
        assert TIMEOUT * 0.9 <= row["seconds"] < TIMEOUT + 10, row
        assert row["close_s"] < 2 * TIMEOUT + 10, row
        assert row["rebuilt_world"] == WORLD - 1, row


def test_a_rank_that_stops_calling():
    """The last rank stops calling: the other three raise CollectiveTimeout
    naming it within the timeout (+10 s), close within twice the timeout
    (+10 s), rebuild over the 3 survivors and sum random data within the
    float64 bound; the lost rank's own late close raises CollectiveTimeout."""
    total, ranks = rows_for("stop")
    assert total["lost"] == WORLD - 1
    check_survivors(ranks, WORLD - 1, "CollectiveTimeout")
    assert ranks[-1]["role"] == "lost" and "late" in ranks[-1]["saw"], ranks[-1]


@pytest.mark.parametrize("failure", ["abort-idle", "abort-inflight"])
def test_a_rank_that_aborts(failure):
    """Rank 1 calls abort() between calls, or while its own all-reduce waits
    for the others: abort() returns within 1 s, the others raise
    CollectiveTimeout naming rank 1, close, rebuild over the 3 survivors and
    sum random data within the float64 bound."""
    total, ranks = rows_for(failure)
    assert total["lost"] == 1
    check_survivors(ranks, 1, "CollectiveTimeout")
    assert ranks[1]["saw"] == "aborted" and ranks[1]["seconds"] < 1.0, ranks[1]


def test_disagreeing_calls_then_rebuild():
    """The last rank passes one element more, without PYAR_DEBUG: every rank
    raises MismatchError (the kernels' start-barrier agreement, issue 17
    item 2), closes, and a new communicator over all 4 ranks sums correctly."""
    total, ranks = rows_for("mismatch")
    assert total["lost"] is None
    for row in ranks:
        assert row["saw"] == "MismatchError" and row["rebuilt_world"] == WORLD, row
        assert row["close_s"] < 2 * TIMEOUT + 10, row
