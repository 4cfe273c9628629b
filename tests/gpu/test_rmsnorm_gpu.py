"""The fused all-reduce + residual add + RMSNorm (+ FP8 / MXFP4 quantization)
on a real GPU, at world sizes 2, 4 and 8 (and 1 for the single-rank path),
every rank on GPU 0 under MPS on the one-GPU machine.

Each test runs a mode of tests/mpi/rmsnorm_fused.py under mpirun; the scenario
checks every output on every rank and reports summary rows asserted here.
"""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLDS = [2, 4, 8]


@pytest.mark.parametrize("world", [1] + WORLDS)
def test_fused_random(world):
    """Per-rank random inputs against a float64 reference from every rank's
    input: one-stage, two-stage, split, lamport and auto, 3 dtypes, 6 shapes
    (1..300 tokens, hidden 512..16384 incl. 2880 and 7168, chunked), 4 output
    kinds, staged and registered; outputs identical across ranks and variants
    (split bit for bit two-stage's); lamport refuses the shapes its kernels
    and slots do not take; then every bad input raises its clear error on
    every rank."""
    rows = scenario("rmsnorm_fused", world, "random", timeout=420)
    total = rows_of(rows, "fused-random-total")[0]
    # lamport takes 11 of the 18 (dtype, shape): rows up to 16 KiB, inputs up to 1 MiB
    assert total["calls"] == 3 * 6 * 4 * 4 + 11 * 4, total
    assert total["mismatches"] == 0, total
    assert total["variant_differences"] == 0, total
    for row in rows_of(rows, "fused-random"):
        assert row["rank_differences"] == 0, row
    bad = rows_of(rows, "fused-bad-input")[0]
    assert bad["raised"] == bad["cases"], bad


@pytest.mark.parametrize("world", WORLDS)
def test_unfused_path_matches_the_fused_kernels(world):
    """algo="unfused": pyar's all-reduce, then the single-GPU add + RMSNorm
    (+ quantization) kernel; 3 dtypes, 3 shapes, every output kind, with and
    without out: within the float64 reference's bounds on every rank and
    bitwise the two-stage kernel's outputs."""
    row = rows_of(scenario("rmsnorm_fused", world, "unfused", timeout=420), "fused-unfused")[0]
    assert row["calls"] == 3 * 3 * 7 * 2, row
    assert row["mismatches"] == 0, row
    assert row["variant_differences"] == 0, row


@pytest.mark.parametrize("wrap", [False, True], ids=["epochs-from-zero", "across-epoch-wrap"])
@pytest.mark.parametrize("world", WORLDS)
def test_fused_adversarial_write_after_read(world, wrap):
    """1000 calls per (variant, staged/registered), queued 50 at a time; every
    caller overwrites its input with NaN right after each call while random
    ranks are delayed or disturbed; every output (y, residual_out, FP8 codes,
    scales) bit for bit as in an undisturbed run.  Split (no exit barrier:
    the proof at split_reduce) and lamport (no barrier at all: the proof at
    `lamport`) run it too.  With ``wrap`` every (one-stage, two-stage or
    lamport, input) starts 300 calls before the epochs reach 2**32 (a test
    hook: allreduce_common.start_epochs_at)."""
    mode, test = ("wrap", "fused-adversarial-wrap") if wrap else (
        "adversarial", "fused-adversarial")
    rows = rows_of(scenario("rmsnorm_fused", world, mode, timeout=420), test)
    variants = ("onestage", "twostage", "lamport") + (() if wrap else ("split",))
    assert {(r["algo"], r["variant"]) for r in rows} == {
        (a, v) for a in variants for v in ("staged", "registered")}
    for row in rows:
        assert row["calls"] >= 1000, row
        assert row["mismatches"] == 0, row


def assert_late_staged_input_is_seen(world, kernels_path, without):
    """The fused control-start scenario (staged inputs, the last rank delayed before
    every call) against the control build ``kernels_path``: both variants must show
    wrong outputs."""
    rows = rows_of(scenario("rmsnorm_fused", world, "control-start", kernels_path,
                            timeout=420), "fused-control-start")
    assert {r["algo"] for r in rows} == {"onestage", "twostage"}
    for row in rows:
        assert row["mismatches"] > 0, (
            f"{row['algo']} {without} gave no wrong output in {row['calls']} calls on "
            f"{world} ranks: the control cannot see it\n{row}")


@pytest.mark.parametrize("world", WORLDS)
def test_fused_positive_control_start_barrier(world, kernels_without_start_barrier):
    """Kernels built without the start barrier, staged inputs, the last rank
    delayed before every call: the peers read its scratch before its kernel's
    copy lands, and both variants must show wrong outputs."""
    assert_late_staged_input_is_seen(world, kernels_without_start_barrier,
                                     "without its start barrier")


@pytest.mark.parametrize("world", [2, 8])
def test_fused_positive_control_staging_copy(world, kernels_staging_after_start):
    """The same with kernels that copy a staged input after their start barrier
    (PYAR_TEST_STAGE_MUTATION=kStageAfterStart), the late (last) rank 20 us after
    it: the peers read its scratch before its copy lands, and both variants must
    show wrong outputs."""
    assert_late_staged_input_is_seen(world, kernels_staging_after_start,
                                     "copying its staged input after the start barrier")


@pytest.mark.parametrize("world", WORLDS)
def test_fused_positive_control(world, kernels_without_exit_barrier):
    """The adversarial scenario against kernels built without the barrier each
    variant relies on -- one-stage without its exit barrier (the seeds' bug),
    two-stage and split's first kernel without `mid`, after which peers no
    longer read a rank's input (and, for split, all sums have arrived) --
    must see wrong outputs for every variant."""
    rows = rows_of(scenario("rmsnorm_fused", world, "control", kernels_without_exit_barrier,
                            timeout=420), "fused-control")
    assert {r["algo"] for r in rows} == {"onestage", "twostage", "split"}
    for row in rows:
        assert row["mismatches"] > 0, (
            f"{row['algo']} without its barrier gave no wrong output in {row['calls']} calls "
            f"on {world} ranks: the adversarial test cannot see the bug\n{row}")


@pytest.mark.parametrize("world", WORLDS)
def test_lamport_positive_control(world, kernels_keeping_lamport_data):
    """Kernels whose lamport reader leaves the packs it took in its slot, the
    last rank delayed before every call: its peers find its rows of two calls
    before still in the slot, take them for this call's, and must show wrong
    outputs (the shipped kernels pass the same delays in the adversarial
    test)."""
    rows = rows_of(scenario("rmsnorm_fused", world, "control-lamport",
                            kernels_keeping_lamport_data, timeout=420), "fused-control-lamport")
    assert [r["algo"] for r in rows] == ["lamport"], rows
    for row in rows:
        assert row["mismatches"] > 0, (
            f"lamport keeping its slots' data gave no wrong output in {row['calls']} calls on "
            f"{world} ranks: the control cannot see stale rows\n{row}")


@pytest.mark.parametrize("world", WORLDS)
def test_fused_serving_sequence(world):
    """2000 calls, token counts drawn from 1..256, hidden 4096 and 7168, each
    replayed through a graph captured for its token count on first use, with
    the quantization depending on the token count; every output compared bit
    for bit with an eager call over all 256 rows that is checked against the
    float64 reference."""
    row = rows_of(scenario("rmsnorm_fused", world, "serve", timeout=420), "fused-serve")[0]
    assert row["calls"] == 2000, row
    assert row["mismatches"] == 0, row
    assert row["graphs"] > 100, row
