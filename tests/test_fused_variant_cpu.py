"""Which allreduce_rmsnorm variant runs, without a GPU (tier a): the
tables of pyar.comm.algorithms, fused_plan.variant (what ``algo="auto"``
runs), and the refusals of a call before anything is queued.

How this runs without a GPU: calls go through ``comm.allreduce_rmsnorm``
on a NodeCommunicator assembled over stand-ins (tests/comm_stand_ins.py,
tests/row_stand_ins.py), whose recording kernels tell which variant ran
by the names of the kernels launched; the ``sequences`` fixture records
the plans calls are kept as.  A world of one asks pyar._hip.Device for its
multiprocessors, replaced here by a stand-in.  Arrays are DeviceArrays on
made-up addresses (nothing is dereferenced).
"""
import types

import pytest

pytest.importorskip("mpi4py")  # pyar.comm initializes MPI (a singleton here)

from pyar import _hip  # noqa: E402
from pyar.comm import algorithms, fused_plan, layout  # noqa: E402
from tests.comm_stand_ins import BF16, F32, RegistryStandIn, geometry  # noqa: E402
from tests.comm_stand_ins import sequences  # noqa: E402,F401 - the fixture
from tests.row_stand_ins import (  # noqa: E402,F401 - dev: the fixture
    ROW_LAYOUT, STREAM, communicator, dev, rmsnorm_arguments, variant_of,
)


@pytest.fixture(autouse=True)
def plans(sequences):
    """Every call here keeps its plan in a RecordingSequence."""
    return sequences


@pytest.fixture
def without_lamport(monkeypatch):
    """The tables of the barrier-bound variants alone: "auto" never picks
    lamport (its own tests below)."""
    monkeypatch.setattr(algorithms, "LAMPORT_MAX_BYTES", dict.fromkeys(range(2, 9), 0))


@pytest.fixture
def one_gpu(monkeypatch):
    """pyar._hip.Device of a GPU with 132 multiprocessors (a world of one
    fills it with add_rmsnorm's blocks)."""
    monkeypatch.setattr(_hip, "Device",
                        lambda ordinal: types.SimpleNamespace(multiprocessor_count=132))


def picked(comm, recorded, dev, tokens, hidden, algo="auto", dtype=BF16):
    """The variant a call of ``tokens`` rows of ``hidden`` runs on ``comm``."""
    comm.allreduce_rmsnorm(**rmsnorm_arguments(dev, tokens, hidden, dtype), algo=algo,
                           stream=STREAM)
    return variant_of(recorded.take())


@pytest.mark.parametrize("world", [2, 5, 8])
def test_auto_picks_the_variant_by_input_bytes(dev, without_lamport, world):
    comm, recorded = communicator(world)
    limit = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    hidden = 1024
    for tokens, want in ((limit // (2 * hidden), "onestage"),
                         (limit // (2 * hidden) + 1, "twostage")):
        given = rmsnorm_arguments(dev, tokens, hidden)
        comm.allreduce_rmsnorm(**given, stream=STREAM)
        launches = recorded.take()
        assert variant_of(launches) == want
        # staged (not registered), every row in one chunk
        (_, _, _, args, _), = launches
        assert args[0] == comm.geometry.staged_table and args[3] == tokens
    # An explicit choice is kept.
    assert picked(comm, recorded, dev, 1, hidden, "twostage") == "twostage"


def test_a_row_larger_than_the_scratch_is_refused(dev):
    comm, _ = communicator(2, max_size=4096)
    with pytest.raises(ValueError, match="does not fit"):
        comm.allreduce_rmsnorm(**rmsnorm_arguments(dev, 2, 4096, F32))  # 16 KiB rows


def test_algo_is_checked_first():
    comm, _ = communicator(2)
    with pytest.raises(ValueError, match="'threestage'"):
        comm.allreduce_rmsnorm(None, None, None, algo="threestage")


# --- the tables -----------------------------------------------------------------------

SIZES = [0, 1, 16, 4096, 65536, 128 * 1024, 128 * 1024 + 16, 256 * 1024, 256 * 1024 + 16,
         512 * 1024, 512 * 1024 + 16, 1 << 20, 64 << 20, 1 << 30]


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_has_one_crossover_at_the_table(world, monkeypatch):
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, world, None)  # fused at every size
    picks = [algorithms.choose_fused(n, world) for n in SIZES]
    assert set(picks) <= set(algorithms.FUSED_VARIANTS)
    assert picks[0] == "onestage" and picks[-1] == "twostage", picks
    switch = picks.index("twostage")
    assert picks == ["onestage"] * switch + ["twostage"] * (len(picks) - switch), picks
    limit = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    assert algorithms.choose_fused(limit, world) == "onestage"
    assert algorithms.choose_fused(limit + 1, world) == "twostage"


def test_fused_table_covers_worlds_2_to_8():
    assert algorithms.FUSED_VARIANTS == ("onestage", "twostage")
    assert sorted(algorithms.FUSED_ONESTAGE_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.FUSED_ONESTAGE_MAX_BYTES.values():
        assert isinstance(limit, int) and limit > 0 and limit % 16 == 0


@pytest.mark.parametrize("world", [-1, 0, 1, 9, 16])
def test_choose_fused_rejects_worlds_outside_2_to_8(world):
    with pytest.raises(ValueError, match=r"world size %d \(supported: 2..8\)" % world):
        algorithms.choose_fused(4096, world)


@pytest.mark.parametrize("algo", ["auto", "onestage", "twostage", "split", "unfused",
                                  "lamport"])
def test_validate_fused_accepts(algo):
    assert algorithms.validate_fused(algo) == algo


@pytest.mark.parametrize("algo", ["", "oneshot", "one_stage", "ONESTAGE", "threestage", "SPLIT",
                                  "splits", None, 1])
def test_validate_fused_rejects_naming_the_algo(algo):
    with pytest.raises(ValueError) as error:
        algorithms.validate_fused(algo)
    assert "algo must be 'auto' or one of" in str(error.value)
    assert str(error.value).endswith(f"got {algo!r}")


@pytest.mark.parametrize("large", [algorithms.SPLIT, algorithms.UNFUSED])
@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_runs_the_large_table_past_the_fused_crossover(world, large, monkeypatch):
    limit = 3 << 20
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, world, limit)
    monkeypatch.setitem(algorithms.FUSED_LARGE, world, large)
    assert algorithms.choose_fused(limit, world) in algorithms.FUSED_VARIANTS
    assert algorithms.choose_fused(limit + 16, world) == large
    assert algorithms.choose_fused(1 << 30, world) == large
    # The other worlds keep their own entry.
    other = 2 if world != 2 else 3
    assert algorithms.choose_fused(1 << 30, other) == algorithms.FUSED_LARGE[other]
    # Below the crossover the one-stage/two-stage choice is unchanged.
    small = algorithms.FUSED_ONESTAGE_MAX_BYTES[world]
    assert algorithms.choose_fused(small, world) == "onestage"
    assert algorithms.choose_fused(small + 16, world) == "twostage"


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_with_the_shipped_tables_orders_the_three_paths(world):
    """onestage, then twostage, then the shipped FUSED_LARGE (split or
    unfused) as the input grows (a variant may have no sizes of its own when
    the next crossover comes first)."""
    large = algorithms.FUSED_LARGE[world]
    order = ("onestage", "twostage", large)
    picks = [order.index(algorithms.choose_fused(n, world)) for n in SIZES]
    assert picks == sorted(picks), picks
    assert picks[0] == 0 and picks[-1] == 2, picks
    assert algorithms.choose_fused(algorithms.FUSED_MAX_BYTES[world] + 16, world) == large


def test_fused_crossover_table_covers_worlds_2_to_8():
    assert sorted(algorithms.FUSED_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.FUSED_MAX_BYTES.values():
        assert limit is None or (isinstance(limit, int) and limit > 0 and limit % 16 == 0)
    assert algorithms.UNFUSED not in algorithms.FUSED_VARIANTS
    assert sorted(algorithms.FUSED_LARGE) == list(range(2, 9))
    assert set(algorithms.FUSED_LARGE.values()) <= {algorithms.SPLIT, algorithms.UNFUSED}


@pytest.mark.parametrize("world", range(2, 9))
def test_ranks_sharing_a_gpu_take_onestage_then_split_then_the_unfused_steps(world):
    """The shared-GPU table: one-stage up to its first bound, split up to the
    second, the unfused steps beyond; never two-stage.  Without a first bound
    (2-4 ranks) one-stage at every size."""
    onestage_max, split_max = algorithms.SHARED_GPU_FUSED[world]
    order = ("onestage", algorithms.SPLIT, algorithms.UNFUSED)
    picks = [order.index(algorithms.choose_fused(n, world, shared_gpu=True))
             for n in sorted(SIZES + [8 << 20, (8 << 20) + 16, 32 << 20, (32 << 20) + 16])]
    assert picks == sorted(picks), picks
    if onestage_max is None:
        assert algorithms.choose_fused(1 << 40, world, shared_gpu=True) == "onestage"
        return
    assert algorithms.choose_fused(onestage_max, world, shared_gpu=True) == "onestage"
    assert algorithms.choose_fused(onestage_max + 16, world, shared_gpu=True) == algorithms.SPLIT
    if split_max is None:
        assert algorithms.choose_fused(1 << 40, world, shared_gpu=True) == algorithms.SPLIT
    else:
        assert algorithms.choose_fused(split_max, world, shared_gpu=True) == algorithms.SPLIT
        assert algorithms.choose_fused(split_max + 16, world, shared_gpu=True) == \
            algorithms.UNFUSED


@pytest.mark.parametrize("world", range(2, 9))
def test_wide_rows_on_a_shared_gpu_leave_onestage_at_their_own_bound(world):
    """Rows over WIDE_ROW_BYTES leave one-stage at SHARED_GPU_WIDE_ONESTAGE_MAX;
    split's bound is the same for every row width; rows of WIDE_ROW_BYTES
    and narrower keep SHARED_GPU_FUSED's one-stage bound."""
    wide = algorithms.WIDE_ROW_BYTES + 16
    limit = algorithms.SHARED_GPU_WIDE_ONESTAGE_MAX[world]
    onestage_max, split_max = algorithms.SHARED_GPU_FUSED[world]
    assert 0 < limit < (onestage_max or 1 << 40) and limit % 16 == 0
    assert algorithms.choose_fused(limit, world, True, wide) == "onestage"
    assert algorithms.choose_fused(limit + 16, world, True, wide) == algorithms.SPLIT
    assert algorithms.choose_fused(limit + 16, world, True, algorithms.WIDE_ROW_BYTES) == \
        "onestage"
    if split_max is not None:
        assert algorithms.choose_fused(split_max + 16, world, True, wide) == algorithms.UNFUSED
    # A GPU per rank: the row width does not matter.
    assert algorithms.choose_fused(limit + 16, world, False, wide) == \
        algorithms.choose_fused(limit + 16, world)


def test_shared_gpu_table_covers_worlds_2_to_8():
    assert sorted(algorithms.SHARED_GPU_FUSED) == list(range(2, 9))
    for onestage_max, split_max in algorithms.SHARED_GPU_FUSED.values():
        assert onestage_max is None or (onestage_max > 0 and onestage_max % 16 == 0)
        assert split_max is None or (split_max % 16 == 0 and split_max > (onestage_max or 0))
    with pytest.raises(ValueError, match=r"world size 9 \(supported: 2..8\)"):
        algorithms.choose_fused(4096, 9, shared_gpu=True)


# --- what "auto" runs on a communicator -------------------------------------------------

@pytest.mark.parametrize("shared_gpu", [False, True])
def test_auto_takes_the_table_of_its_topology(dev, without_lamport, shared_gpu):
    """Measured on one H200: at 4 ranks 256 and 1024 rows of 4096 bf16 (2 and
    8 MiB) run one-stage on a shared GPU; with a GPU per rank the first runs
    the GPU-per-rank table's large path."""
    comm, recorded = communicator(4, shared_gpu=shared_gpu)
    picks = [picked(comm, recorded, dev, tokens, 4096) for tokens in (256, 1024)]
    assert picks == (["onestage", "onestage"] if shared_gpu else
                     [algorithms.choose_fused(n, 4) for n in (2 << 20, 8 << 20)])
    assert shared_gpu or picks[0] == algorithms.FUSED_LARGE[4]
    # Rows of 7168 bf16 (14 KiB): 64 rows run one-stage on a shared GPU, 128 split.
    hidden = 7168
    picks = [picked(comm, recorded, dev, tokens, hidden) for tokens in (64, 128)]
    assert picks == (["onestage", algorithms.SPLIT] if shared_gpu else
                     [algorithms.choose_fused(n * hidden * 2, 4) for n in (64, 128)])


@pytest.mark.parametrize("large", [algorithms.SPLIT, algorithms.UNFUSED])
def test_auto_picks_the_large_path_past_the_crossover(dev, without_lamport, monkeypatch,
                                                     large):
    comm, recorded = communicator(4)
    monkeypatch.setitem(algorithms.FUSED_MAX_BYTES, 4, 64 << 10)
    monkeypatch.setitem(algorithms.FUSED_LARGE, 4, large)
    # 64 KiB, then one row more
    picks = [picked(comm, recorded, dev, tokens, 1024) for tokens in (32, 33)]
    assert picks[0] in algorithms.FUSED_VARIANTS and picks[1] == large
    # Forced, both stay selectable whatever the table says.
    for algo in (algorithms.SPLIT, algorithms.UNFUSED):
        assert picked(comm, recorded, dev, 1, 1024, algo) == algo


@pytest.mark.parametrize("world", [2, 5, 8])
@pytest.mark.parametrize("shared_gpu", [False, True])
def test_auto_runs_lamport_up_to_its_bound_unregistered(dev, world, shared_gpu):
    registry = RegistryStandIn()
    comm, recorded = communicator(world, shared_gpu=shared_gpu, registry=registry)
    limit = algorithms.LAMPORT_MAX_BYTES[world]
    hidden = 1024
    fits = limit // (2 * hidden)
    given = rmsnorm_arguments(dev, fits, hidden)
    x = given["x"]
    registry.tables[(x.ptr, x.nbytes)] = 0x5300_0000_0000
    comm.allreduce_rmsnorm(**given, stream=STREAM)
    (_, _, _, args, _), = launches = recorded.take()
    assert variant_of(launches) == "lamport"
    # peers never read x: this rank's own x, a signature of a staged input
    assert args[0] == x.ptr
    assert args[-2] == layout.signature("lamport", x.size, BF16, False)
    assert picked(comm, recorded, dev, fits + 1, hidden) == algorithms.choose_fused(
        (fits + 1) * hidden * 2, world, shared_gpu, hidden * 2)


@pytest.mark.parametrize("world", range(2, 9))
def test_choose_fused_takes_lamport_only_where_it_fits(world):
    limit = algorithms.LAMPORT_MAX_BYTES[world]
    for shared_gpu in (False, True):
        assert algorithms.choose_fused(16, world, shared_gpu, 16, True) == "lamport"
        assert algorithms.choose_fused(limit, world, shared_gpu, 16, True) == "lamport"
        for nbytes in (limit + 16, 16):
            fits = nbytes > limit
            assert algorithms.choose_fused(nbytes, world, shared_gpu, 16, fits) == \
                algorithms.choose_fused(nbytes, world, shared_gpu, 16)


def test_lamport_table_covers_worlds_2_to_8_within_one_segment():
    assert sorted(algorithms.LAMPORT_MAX_BYTES) == list(range(2, 9))
    for limit in algorithms.LAMPORT_MAX_BYTES.values():
        assert isinstance(limit, int) and 0 <= limit <= algorithms.LAMPORT_SEGMENT_BYTES
        assert limit % 16 == 0


@pytest.mark.parametrize("world", [1, 2, 8])
def test_forced_lamport_refuses_what_its_kernels_and_slots_do_not_take(dev, one_gpu, world):
    """Alike at every world size (a world of one would run add_rmsnorm): rows
    over one pack a thread, inputs over one receive segment; "auto" then
    picks another variant."""
    comm, recorded = communicator(world, max_size=4 << 20)
    with pytest.raises(ValueError, match=r"algo='lamport' takes rows up to 16384 bytes \(one "
                                         r"16-byte pack per thread\), got 32768"):
        picked(comm, recorded, dev, 1, 16384, "lamport")
    with pytest.raises(ValueError, match=r"algo='lamport' takes inputs up to 1048576 bytes "
                                         r"\(its receive slots\), got 1056768"):
        picked(comm, recorded, dev, 129, 4096, "lamport")
    small, small_recorded = communicator(world, max_size=64 << 10)  # the slots shrink with it
    with pytest.raises(ValueError, match=r"takes inputs up to 65536 bytes"):
        picked(small, small_recorded, dev, 9, 4096, "lamport")
    # 16 KiB rows
    assert picked(comm, recorded, dev, 8, 8192, "lamport") == (
        "lamport" if world > 1 else "alone")
    if world > 1:
        assert picked(comm, recorded, dev, 1, 16384) != "lamport"
        assert picked(comm, recorded, dev, 129, 4096) != "lamport"


def test_variant_is_the_table_choice_with_lamport_where_its_kernels_take_it():
    """fused_plan.variant: the communicator's table for its world and
    topology, with lamport only where lamport_refusal finds nothing."""
    node = geometry(4, max_size=4 << 20)
    segment = fused_plan.lamport_segment(node.max_size)
    assert segment == node.lamport_bytes == algorithms.LAMPORT_SEGMENT_BYTES
    assert fused_plan.lamport_refusal(ROW_LAYOUT, segment, 4096, 4096) is None
    assert fused_plan.variant(node, ROW_LAYOUT, 4096, 4096) == "lamport"
    too_wide = fused_plan.lamport_refusal(ROW_LAYOUT, segment, 32768, 32768)
    assert too_wide == "takes rows up to 16384 bytes (one 16-byte pack per thread), got 32768"
    assert fused_plan.variant(node, ROW_LAYOUT, 32768, 32768) == algorithms.choose_fused(
        32768, 4, False, 32768)
    shared = geometry(4, max_size=4 << 20, shared_gpu=True)
    assert fused_plan.variant(shared, ROW_LAYOUT, 8 << 20, 8192) == algorithms.choose_fused(
        8 << 20, 4, True, 8192)
