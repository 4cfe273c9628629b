"""The all-reduce on a real GPU, at world sizes 2, 3, 4 and 8 (and 1 for the
API), every rank on GPU 0 under MPS on the one-GPU machine.

Each test runs one scenario of tests/mpi/allreduce_*.py under mpirun
(tests.mpi_launch.run_scenario); a scenario covers fp32/fp16/bf16 and both
algorithms itself (and the LL one-shot and two-shot, forced only, at sizes
within their limits), to keep the number of mpirun launches down, checks
every result on every rank, exits non-zero on every rank when any check
failed, and prints summary rows (test, world, algo, dtype, calls,
mismatches, ...) that the test asserts on and the GPU runner tabulates.
"""
import pytest

from tests.gpu.scenarios import rows_of, scenario

pytestmark = pytest.mark.gpu

WORLDS = [2, 3, 4, 8]


# --- correctness ------------------------------------------------------------------

# Across the epoch wrap: a test hook (allreduce_common.start_epochs_at, the runtime's
# memcpy into each rank's Signal area between calls) starts every block's epoch a few
# calls before 2**32, so the scenario's barriers compare epochs across the wrap.
WRAP = [False, True]
WRAP_IDS = ["epochs-from-zero", "across-epoch-wrap"]
# The barrier-free LL one-shot and two-shot, forced only: every correctness scenario
# runs them at sizes they take (up to LL_MAX_BYTES = 256 KiB for the one-shot, world/2
# times that for the two-shot: pyar.comm.plan.ll_largest).
ALGOS = ("oneshot", "twoshot")
LL_ALGOS = ("ll", "ll_twoshot")
WITH_LL = ALGOS + LL_ALGOS


@pytest.mark.parametrize("wrap", WRAP, ids=WRAP_IDS)
@pytest.mark.parametrize("world", WORLDS)
def test_probe_all_ones(world, wrap):
    """Every rank's input is all ones -> every element of every call equals
    the world size exactly: 50 calls per (dtype, algo, size), sizes 1, 7, 4095,
    2**20 + 3 (LL one-shot and two-shot: the largest odd count each takes at
    this world size instead), each into an output poisoned with NaN just
    before; with ``wrap`` each size starts 25 calls before the epochs reach
    2**32."""
    args, test = (("wrap",), "probe-wrap") if wrap else ((), "probe")
    rows = rows_of(scenario("allreduce_probe", world, *args), test)
    assert {(r["dtype"], r["algo"]) for r in rows} == {
        (d, a) for d in ("float32", "float16", "bfloat16") for a in WITH_LL}
    for row in rows:
        assert row["calls"] >= 4 * 50, row
        assert row["mismatches"] == 0, row


@pytest.mark.parametrize("world", WORLDS)
def test_random_inputs(world):
    """Random per-rank inputs against a float64 reference with a per-dtype
    tolerance; sizes 1, 7, 4095, 2**20 + 3, and around and over a 1 MiB
    scratch buffer (chunked), the largest odd count each LL algorithm takes;
    staged/registered, out of place/in place, one-shot/two-shot/auto/LL
    one-shot/LL two-shot (where they take the size); bitwise identical across
    ranks, ways and algorithms; out-of-place inputs unchanged."""
    rows = rows_of(scenario("allreduce_random", world, timeout=420), "random")
    assert {(r["dtype"], r["algo"]) for r in rows} == {
        (d, a) for d in ("float32", "float16", "bfloat16")
        for a in ("oneshot", "twoshot", "auto") + LL_ALGOS}
    for row in rows:
        assert row["calls"] > 0, row
        assert row["mismatches"] == 0, row
        for key in ("out_of_tolerance", "variant_differences", "rank_differences",
                    "input_changed"):
            assert row[key] == 0, (key, row)


@pytest.mark.parametrize("wrap", WRAP, ids=WRAP_IDS)
@pytest.mark.parametrize("world", WORLDS)
def test_adversarial_write_after_read(world, wrap):
    """The seeds' bug provoked: 1000 calls per (dtype, algo, variant), queued
    50 at a time with no host sync; every caller overwrites its input with NaN
    right after each call while random ranks are delayed or disturbed; staged
    and registered inputs; then the LL one-shot and two-shot, 500 calls per
    dtype each of its largest input at this world size (read in place:
    "unstaged").  Zero mismatches.  With ``wrap``: fp32 only, each
    (algo, variant) starting 300 calls before the epochs reach 2**32."""
    mode, test = ("wrap", "adversarial-wrap") if wrap else ("main", "adversarial")
    rows = rows_of(scenario("allreduce_adversarial", world, mode, timeout=420), test)
    dtypes = ("float32",) if wrap else ("float32", "float16", "bfloat16")
    assert {(r["dtype"], r["algo"], r["variant"]) for r in rows} == {
        (d, a, v) for d in dtypes for a in ALGOS
        for v in ("staged", "registered")} | {
        (d, a, "unstaged") for d in dtypes for a in LL_ALGOS}
    for row in rows:
        assert row["calls"] >= (500 if row["algo"] in LL_ALGOS else 1000), row
        assert row["mismatches"] == 0, row


# --- the positive control -----------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS)
def test_positive_control_detects_missing_exit_barrier(world, kernels_without_exit_barrier):
    """The adversarial scenario against a test-only build of the kernels with
    the exit barrier compiled out (PYAR_TEST_SKIP_EXIT_BARRIER) must see wrong
    results: proof that the adversarial test can see the seeds' bug.

    One-shot only: that is the kernel whose exit barrier is load-bearing.  In
    two-shot, peers finish reading a rank's input and partial scratch before
    the mid barrier, so a two-shot kernel without its exit barrier is still
    correct (see the comment in allreduce.cu) and no test can tell.  The
    scenario escalates the disturbance (sizes, delays, noise) while it has
    seen nothing, within a budget of calls and time.

    Barriers compare epochs wrap-safely ("reached", not "equal"), so a fast
    rank that stores the next call's start flag before a slow peer saw this
    one does not strand the peer: the missing exit barrier shows as what the
    seeds' users saw, wrong sums."""
    rows = scenario("allreduce_adversarial", world, "control", kernels_without_exit_barrier,
                    timeout=420)
    total = rows_of(rows, "control-total")[0]
    tried = rows_of(rows, "control")
    assert total["mismatches"] > 0, (
        f"the adversarial scenario saw no wrong result in {total['calls']} one-shot calls "
        f"without the exit barrier on {world} ranks ({total['timeouts']} timeouts): it cannot "
        f"detect the bug it exists for\n{tried}")


def assert_late_staged_input_is_seen(world, kernels_path, without):
    """The control-start scenario (staged inputs, the last rank delayed before every
    call) against the control build ``kernels_path``: one-shot and two-shot must both
    show wrong results."""
    rows = rows_of(scenario("allreduce_adversarial", world, "control-start", kernels_path,
                            timeout=420), "control-start")
    assert {r["algo"] for r in rows} == {"oneshot", "twoshot"}, rows
    for row in rows:
        assert row["mismatches"] > 0, (
            f"no wrong result in {row['calls']} {row['algo']} calls {without} on {world} "
            f"ranks ({row['timeouts']} timeouts): the control cannot see it\n{rows}")


@pytest.mark.parametrize("world", WORLDS)
def test_positive_control_detects_missing_start_barrier(world, kernels_without_start_barrier):
    """Kernels built without the start barrier (PYAR_TEST_SKIP_PHASE=kStart),
    staged inputs, the last rank delayed before every call: its kernel's copy
    into its scratch lands after the peers' kernels read that scratch, and they
    sum the previous call's input.  One-shot and two-shot must both show wrong
    results -- proof that the start barrier is what keeps them out."""
    assert_late_staged_input_is_seen(world, kernels_without_start_barrier,
                                     "without the start barrier")


@pytest.mark.parametrize("world", [2, 8])
def test_positive_control_detects_a_late_staging_copy(world, kernels_staging_after_start):
    """The same scenario against kernels that copy a staged input into the scratch
    after their start barrier, the late (last) rank 20 us after it
    (PYAR_TEST_STAGE_MUTATION=kStageAfterStart, PYAR_TEST_STAGE_DELAY_NS): the late
    rank's start flag lets the peers read its scratch before its copy lands.
    One-shot and two-shot must both show wrong results -- proof that the copy's place
    before the barrier is what keeps them out."""
    assert_late_staged_input_is_seen(world, kernels_staging_after_start,
                                     "copying the staged input after the start barrier")


@pytest.mark.parametrize("world", WORLDS)
def test_positive_control_detects_a_single_ll_generation(world, kernels_with_one_ll_generation,
                                                        ll_kernels_with_a_lagging_reader):
    """LL kernels that use one generation of receive slots for every call
    (PYAR_TEST_LL_MUTATION=kLLOneGeneration), the last rank lagging 50 us
    between its pushes and its takes (PYAR_TEST_READER_DELAY_NS): its peers'
    next call stores over packets it has not taken, which the adversarial load
    must show as wrong sums or as its wait for them timing out.  The shipped
    two generations under the same lag pass every call.  Without the lag a
    reader takes its packets right after its pushes: a window too short for a
    peer's next call to land in."""
    lagging = rows_of(scenario("allreduce_adversarial", world, "control-ll",
                               ll_kernels_with_a_lagging_reader, timeout=420), "control-ll")
    assert [(r["mismatches"], r["timeouts"]) for r in lagging] == [(0, 0)], lagging
    assert lagging[0]["calls"] >= 1000, lagging
    rows = rows_of(scenario("allreduce_adversarial", world, "control-ll",
                            kernels_with_one_ll_generation, timeout=420), "control-ll")
    assert [r["algo"] for r in rows] == ["ll"], rows
    for row in rows:
        assert row["mismatches"] > 0 or row["timeouts"] > 0, (
            f"LL with one generation gave no wrong sum and no timeout in {row['calls']} calls "
            f"on {world} ranks: the adversarial scenario cannot see it\n{row}")


# --- failures are reported, never hang ----------------------------------------------

@pytest.mark.parametrize("world", WORLDS)
def test_timeout_and_debug_mismatch(world):
    """PYAR_DEBUG=1: disagreeing sizes or dtypes raise MismatchError naming the
    ranks on every rank, before any kernel runs.  Communicator(timeout=2.0):
    when the last rank skips a call, every other rank's synchronize raises
    CollectiveTimeout within timeout + 10 s naming exactly that rank, later
    calls raise too, and every process exits cleanly (one-shot, two-shot, and
    the LL one-shot and two-shot)."""
    rows = scenario("allreduce_failures", world, timeout=240,
                    env={"PYAR_DEBUG": "1", "PYAR_TIMEOUT": "30"})
    mismatch = rows_of(rows, "debug-mismatch")[0]
    assert mismatch["ranks_raised"] == 2 * world, mismatch
    timeouts = rows_of(rows, "timeout")
    assert {r["algo"] for r in timeouts} == set(WITH_LL)
    for row in timeouts:
        assert row["raised"] == world - 1, row
        assert row["missing"] == [world - 1], row
        assert row["timeout"] * 0.9 <= row["elapsed"] < row["timeout"] + 10, row


@pytest.mark.parametrize("world", [2, 4])
def test_host_steps_never_hang(world):
    """A rank that never reaches register, the exchange at the end of a
    capture, register_graph_buffers or close: every other rank raises
    CollectiveTimeout naming the step and that rank within twice the timeout + 10 s,
    the late rank raises at once when it gets there, close() returns, and a
    new communicator on the same GPU sums exactly."""
    rows = rows_of(scenario("host_step_timeouts", world, timeout=300), "host-step-timeout")
    assert [r["step"] for r in rows] == [
        "register", "capture end", "register_graph_buffers", "close"]
    for row in rows:
        assert row["raised"] == world - 1, row
        assert row["late_raised"] == 1, row
        assert 2 * row["timeout"] * 0.9 <= row["elapsed"] < 2 * row["timeout"] + 10, row


# --- the API ------------------------------------------------------------------------

@pytest.mark.parametrize("world", [1] + WORLDS)
def test_api_and_bad_input(world):
    """Bad arguments raise the documented errors on every rank and leave the
    communicator usable (wrong dtype -> TypeError, wrong out -> ValueError,
    host arrays -> TypeError, misaligned out -> ValueError, closed ->
    ValueError, ...); streams in every accepted form; 2-d and empty arrays;
    world size 1: a copy, in place a no-op."""
    rows = rows_of(scenario("allreduce_api", world, timeout=240), "api")
    assert rows[0]["mismatches"] == 0, rows


def test_freed_registered_buffer_is_not_reused():
    """A registered buffer is freed and a new one of the same size allocated
    (usually at the same address): its all-reduce must sum the new contents,
    not read through the peers' mappings of the freed buffer."""
    rows = rows_of(scenario("allreduce_api", 2, "stale-registration", timeout=240),
                   "stale-registration")
    assert rows[0]["mismatches"] == 0, rows
