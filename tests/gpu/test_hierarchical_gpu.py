"""The all-reduce across IPC domains (pyar.comm.hierarchical) on a real GPU,
nodes simulated with node_size, every rank on GPU 0 under MPS on the one-GPU
machine: one mpirun launch per world size, each covering its node shapes one
after another (tests/mpi/hierarchical.py)."""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

# world -> node sizes: 8 = 2x4 and 4x2, 6 = 2x3 and 3x2, 4 = 2x2, 3 = 3x1.
SHAPES = {8: (4, 2), 6: (3, 2), 4: (2,), 3: (1,)}


@pytest.mark.parametrize("world", sorted(SHAPES))
def test_random_sums_across_simulated_nodes(world):
    """Random per-rank inputs against float64 in every dtype, counts 1, 7,
    4095, 40001 (past the scratch) and fp32 1M+3, staged and registered in
    place, many pieces per call; bitwise identical on every rank; the fused
    call against float64; capture refused with CaptureError."""
    rows = rows_of(scenario("hierarchical", world, "sums", *SHAPES[world], timeout=240),
                   "hierarchical")
    assert {r["shape"] for r in rows} == {f"{world // k}x{k}" for k in SHAPES[world]}
    for row in rows:
        assert row["calls"] >= 3 * 4 + 1, row
        assert row["mismatches"] == 0, row
        assert row["fused_calls"] == 2, row


@pytest.mark.parametrize("world, node_size", [(4, 2), (6, 3)])
def test_a_rank_on_another_node_that_never_calls(world, node_size):
    """The last rank skips a call: every other rank raises CollectiveTimeout
    within the timeout (plus slack), its own node's from the kernel,
    the other nodes' from the inter-node step."""
    row = rows_of(scenario("hierarchical", world, "timeout", node_size, timeout=180),
                  "hierarchical-timeout")[0]
    assert row["raised"] == row["expected"] == world - 1, row
    assert row["elapsed"] < row["timeout"] + 10, row
