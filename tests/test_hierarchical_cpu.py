"""The hierarchical communicator without a GPU (tier a): the shard
arithmetic of its pieces, the host-side sum in domain order, and under
mpirun (tests/mpi/hierarchical_cpu.py) the split into IPC domains and rails,
node_size from the argument and PYAR_RANKS_PER_NODE, domains of different
sizes, the dispatch from pyar.Communicator (which hands its split to
HierarchicalCommunicator) and the inter-node sums, and
(tests/mpi/inter_node_cpu.py) the inter-node data path's choice and the
device path's pipeline."""
import shutil

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("mpi4py")

from pyar.comm import domains, hierarchical, rail, shards  # noqa: E402
from tests.mpi_launch import run_scenario  # noqa: E402

needs_mpirun = pytest.mark.skipif(
    shutil.which("mpirun") is None and shutil.which("mpiexec") is None,
    reason="mpirun not installed")


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", [1, 7, 8, 31, 4096, 4099, 1_000_003])
def test_shards_tile_the_piece_in_rank_order(n, world, itemsize):
    lanes = 16 // itemsize
    bounds = [shards.bounds(n, world, itemsize, r) for r in range(world)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    for (_, end), (start, _) in zip(bounds, bounds[1:]):
        assert end == start
    lengths = [hi - lo for lo, hi in bounds]
    full = lanes * -(-n // (lanes * world))
    assert lengths[0] == min(n, full)
    # Full shards first, then at most one partial one, then empty ones.
    assert lengths == sorted(lengths, reverse=True)
    assert sum(0 < length < full for length in lengths) <= 1


def test_full_pieces_give_every_rank_a_whole_buffer():
    """A piece of world * PIECE_SHARD_ELEMENTS elements gives each rank a
    shard of exactly the buffers' size, in every dtype."""
    shard = hierarchical.PIECE_SHARD_ELEMENTS
    for itemsize in (2, 4):
        for world in range(1, 9):
            assert shards.bounds(world * shard, world, itemsize, world - 1) == \
                ((world - 1) * shard, world * shard)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_add_in_order_rounds_once(dtype):
    rng = np.random.default_rng(3)
    parts = rng.standard_normal((3, 1001)).astype(np.float32)
    out = rail.add_in_order(parts, np.empty(1001, dtype), np.empty(1001, np.float32))
    want = ((parts[0] + parts[1]) + parts[2]).astype(dtype)  # float32 adds, one rounding
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8))


def test_send_capacity_pads_to_equal_blocks():
    assert [rail.send_capacity(n, 3) for n in (0, 1, 3, 4, 1000)] == [0, 3, 3, 6, 1002]
    assert rail.choose("auto", 2) == "allgather" and rail.choose("auto", 3) == "reduce_scatter"


@pytest.mark.parametrize("value, expected", [(None, 6), (2, 2), (4, 4), (100, 6)])
def test_ranks_per_domain(monkeypatch, value, expected):
    monkeypatch.delenv(domains.RANKS_PER_NODE, raising=False)
    assert domains.ranks_per_domain(value, 6) == expected
    monkeypatch.setenv(domains.RANKS_PER_NODE, "3")
    assert domains.ranks_per_domain(value, 6) == (3 if value is None else expected)


def test_uneven_message_names_every_size():
    facts = [(None, 0, 0, 0, 4)] * 4 + [(None, 4, 0, 0, 2)] * 2
    text = domains._uneven_message(facts, {(0, 0): 4, (4, 0): 2})
    assert "node of ranks 0-3: 4 ranks; node of ranks 4-5: 2 ranks" in text
    assert "IPC domain sizes 4, 2" in text and "mpirun -H" in text


@needs_mpirun
@pytest.mark.parametrize("nranks", [4, 6, 8])
@pytest.mark.parametrize("mode", ["split", "rail"])
def test_domains_and_rails_under_mpirun(nranks, mode):
    _, rows = run_scenario("hierarchical_cpu", nranks, mode, timeout=240)
    assert rows and all(r["world"] == nranks for r in rows), rows


@needs_mpirun
@pytest.mark.parametrize("nranks", [6, 8])  # shapes 6x1, 3x2, 2x3; 8x1, 4x2, 2x4
def test_hierarchical_pipeline_with_host_stand_ins(nranks):
    """HierarchicalCommunicator, as pyar.Communicator builds it, with host
    memory for device memory and a stand-in for the domain's communicator
    (tests/mpi/hierarchical_pipeline_cpu.py): every node shape of the world, many
    pieces per call, exact bits in the documented order, identical on every
    rank, in place, capture refused, a skipped domain timing out."""
    _, rows = run_scenario("hierarchical_pipeline_cpu", nranks, timeout=300)
    assert len(rows) == 1 and rows[0]["calls"] > 0, rows


@needs_mpirun
@pytest.mark.parametrize("nranks", [4, 6])  # shapes 4x1, 2x2; 6x1, 3x2, 2x3
def test_inter_node_path_choice_and_device_pipeline(nranks):
    """pyar.comm.inter_node under mpirun (tests/mpi/inter_node_cpu.py): "auto"
    stages on this machine's MPI, "device" and PYAR_INTER_NODE=device raise
    on every rank, ranks that disagree raise on every rank; with the
    library's answer replaced, the device path's pipeline on the host
    stand-ins gives the host path's bits in every shape and dtype, and a
    skipped domain times out there too."""
    _, rows = run_scenario("inter_node_cpu", nranks, timeout=300)
    assert len(rows) == 1 and rows[0]["calls"] > 0, rows
