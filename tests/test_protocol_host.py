"""The kernels' cross-rank protocol under ThreadSanitizer, without a GPU (tier a).

src/kernels/host/protocol_driver.cpp builds the collective kernels of src/kernels (the same
sources and pyar_protocol.h) as host C++ through the host flavour of the portability layer
(src/kernels/host/pyar_device_host.h, selected by PYAR_HOST_BUILD): ranks and blocks are
threads of one process, a block's GPU threads are fibers of its thread, flags are
std::atomic_ref with the GPU's release/acquire orders, peers' buffers are ordinary memory.
The driver runs the Communicator's call sequence (staged -- each kernel copying its input
into the rank's scratch before its start barrier --, copied by the host first as an input
that is not 16-byte aligned is, registered, in place, chunked) back to back, every rank overwriting its input as soon as its call returns (the seeds'
pattern), with random delays of ranks and of GPU threads, and checks every result exactly
(integer inputs; the fused kernels' normed output too, for its exact float32 bits). The
fused kernels launch with the geometry of row_kernels.row_launch at the host's thread counts
(at most 128 threads a row block), so small hidden sizes reach every packs-per-thread
variant, and two-stage pushes its reduced packs into every rank's gather buffer (the
partial region of each rank's buffer, as Communicator maps it).

Under ThreadSanitizer an access that no barrier orders is a report even when the schedule
happened to give the right sum, so a missing barrier is seen deterministically, not only
when the timing goes wrong as on the GPU. Hence:
  - every kernel at world sizes 2, 3, 4 and 8 runs with zero reports and exact sums (the
    reduce_scatter and all_gather kernels of shards.cu too: every dtype, float32 sums of
    16-bit inputs, counts that leave shards short or empty), also across the 32-bit wrap of
    the per-block epochs (whose control, an epoch comparison that
    is not wrap-safe, must be caught);
  - a kernel that never waits at `mid` (or, split, at `exit`), run after 2**31 calls that
    left those slots alone, keeps them current for the next kernel that does (whose
    control, start barriers without those stores, must be caught);
  - a rank that stops calling makes its peers' bounded spins give up, and their error
    records name it;
  - ranks whose calls disagree (another call signature on one rank) all record the
    disagreement with every rank's signature, write no output and stop, without a report
    and without waiting -- split too, whose kernel B (waiting for no peer) skips after its
    kernel A failed; its control, a build whose start barrier ignores the signatures
    (PYAR_TEST_IGNORE_SIGNATURE), runs the call and writes the outputs, and split's kernel
    B given no failure word writes them after a kernel A that failed;
  - the mutation table: every barrier of every kernel left out in turn (the driver is built
    with -DPYAR_TEST_SKIP_PHASE=host::skipped_phase, the protocol's test-only define, and
    --skip picks the phase) must be caught, by a report or a wrong sum; the barriers proven
    redundant must stay uncaught (their proof, checked);
  - the staging copy's controls (PYAR_TEST_STAGE_MUTATION): every staging kernel copying its
    input after its start barrier, or copying the packs of the next block instead of its own,
    must be caught;
  - the barrier-free LL all-reduce: tests/test_ll_host.py.

The build and its runs: tests/protocol_host.py.
"""
import pytest

from tests.protocol_host import (
    DELAYS, NEEDS_CXX, WORLDS, WRAP_START, assert_clean, detection, run,
)

pytestmark = NEEDS_CXX


# --- every kernel, every world, every way the host calls it ---------------------------------

# (options, kernels): how Communicator calls the all-reduce; in place over a registered
# input is two-shot only (Communicator._plan), chunked calls use a 2 KiB scratch.
ALLREDUCE_WAYS = {
    "staged": (("--variant", "staged"), ("oneshot", "twoshot")),
    "copied": (("--variant", "copied"), ("oneshot", "twoshot")),
    "registered": (("--variant", "registered"), ("oneshot", "twoshot")),
    "staged-in-place": (("--variant", "staged", "--in-place", "1"), ("oneshot", "twoshot")),
    "registered-in-place": (("--variant", "registered", "--in-place", "1"), ("twoshot",)),
    "staged-chunked": (("--variant", "staged", "--max-size", "2048"), ("oneshot", "twoshot")),
    "copied-chunked": (("--variant", "copied", "--max-size", "2048"), ("oneshot", "twoshot")),
    "registered-chunked": (("--variant", "registered", "--max-size", "2048"),
                           ("oneshot", "twoshot")),
}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kernel", ["oneshot", "twoshot"])
def test_allreduce_clean_and_exact(driver, kernel, world):
    """Back-to-back calls in every way the host makes them: zero reports, exact sums."""
    for way, (options, kernels) in ALLREDUCE_WAYS.items():
        if kernel not in kernels:
            continue
        outcome = run(driver, kernel, world, *options, "--calls", 12, "--seed", world,
                      *DELAYS)
        assert_clean(outcome, f"{kernel} {way} at world {world}")
        assert outcome.row["calls"] == 12


FUSED = ("onestage", "twostage", "split")
SHARDS = ("reducescatter", "allgather")
# (options, (packs per thread, threads, blocks) of the first launch): float32 rows of 200,
# 1000 and 2040 elements are 50, 250 and 510 packs, one, two and four a thread; the last
# lanes of each block hold clamped copies. --blocks counts 64-thread blocks, as the GPU's
# cap counts the all-reduce's: 4 of them are 2 blocks of 128 threads. In chunks of 2 rows
# (8 KiB scratch, 4000-byte rows): 3 launches a call.
FUSED_WAYS = {
    "staged": (("--variant", "staged"), (1, 64, 3)),
    "staged-chunked": (("--variant", "staged", "--max-size", 8192, "--tokens", 5,
                        "--hidden", 1000, "--blocks", 4), (2, 128, 2)),
    "registered-chunked": (("--variant", "registered", "--max-size", 8192, "--tokens", 5,
                            "--hidden", 1000, "--blocks", 4), (2, 128, 2)),
    "staged-4-per-thread": (("--variant", "staged", "--tokens", 6, "--hidden", 2040,
                             "--blocks", 4), (4, 128, 2)),
}


def assert_geometry(outcome, expected, what):
    row = outcome.row
    assert (row["packs_per_thread"], row["threads"], row["blocks"]) == expected, (what, row)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kernel", FUSED)
def test_fused_clean_and_exact(driver, kernel, world):
    """The fused kernels staged and registered in chunks, at one, two and four packs a
    thread: zero reports, exact residual sums and normed outputs."""
    for way, (options, geometry) in FUSED_WAYS.items():
        outcome = run(driver, kernel, world, *options, "--calls", 5, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{kernel} {way} at world {world}")
        assert_geometry(outcome, geometry, f"{kernel} {way} at world {world}")


# Two-shot all-reduces and two-stage fused calls taking turns, as "auto" interleaves them:
# both kernels use the partial region of every rank (two-shot its own shard, two-stage the
# gather buffer its peers push into).
MIXED = "twoshot+twostage"


@pytest.mark.parametrize("world", WORLDS)
def test_twoshot_and_twostage_share_the_partial_region(driver, world):
    """Calls alternating between the two kernels that use the partial region, staged and
    registered in chunks: zero reports, exact sums and normed outputs."""
    for way, (options, _) in FUSED_WAYS.items():
        if way in ("staged-chunked", "staged-4-per-thread"):
            continue
        outcome = run(driver, MIXED, world, *options, "--calls", 6, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{MIXED} {way} at world {world}")


# 16-bit rows of 200 and 2000 elements: 25 packs (one a thread, 64 threads) and 250 (two
# a thread, 128 threads).
HALF_RUNS = (("oneshot", 3, ()), ("twoshot", 3, ()),
             ("onestage", 2, (("--hidden", 200), (1, 64, 3))),
             ("twostage", 3, (("--hidden", 2000, "--tokens", 6, "--blocks", 4), (2, 128, 2))))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_types_clean_and_exact(driver, dtype):
    for kernel, world, fused in HALF_RUNS:
        options, geometry = fused or ((), None)
        outcome = run(driver, kernel, world, "--dtype", dtype, *options, "--calls", 5, *DELAYS)
        assert_clean(outcome, f"{kernel} {dtype} at world {world}")
        if geometry:
            assert_geometry(outcome, geometry, f"{kernel} {dtype}")


@pytest.mark.parametrize("kernel", ["oneshot", "twoshot", *FUSED, *SHARDS])
@pytest.mark.parametrize("variant", ["staged", "registered"])
def test_epochs_across_the_32_bit_wrap(driver, kernel, variant):
    """Every block's epoch starts 4 calls before 2**32 (the test hook, as if 2**32 - 4 calls
    had run) and the calls go on past it: the wrap-safe comparison keeps every barrier."""
    calls = 5 if kernel in FUSED else 10
    outcome = run(driver, kernel, 4, "--variant", variant, "--epoch-start", WRAP_START,
                  "--calls", calls, *DELAYS)
    assert_clean(outcome, f"{kernel} {variant} across the epoch wrap")


def test_epoch_wrap_catches_a_comparison_that_is_not_wrap_safe(driver):
    """The wrap tests' positive control: barriers that compare epochs as plain unsigned
    numbers (PYAR_TEST_REACHED_UNSIGNED) let the first call after the wrap through without
    waiting (0xffffffff >= 0); across the wrap that is caught, from zero it is not."""
    options = ("--epoch-start", WRAP_START, "--reached", "unsigned", "--calls", 8,
               "--timeout-ms", 500, *DELAYS)  # a peer left behind gives up soon
    across = run(driver, "oneshot", 4, *options)
    assert across.caught, f"an unsigned epoch comparison across the wrap went unseen: {across.row}"
    from_zero = run(driver, "oneshot", 4, "--reached", "unsigned", "--calls", 8, *DELAYS)
    assert_clean(from_zero, "an unsigned epoch comparison far from the wrap")


# (kernels, phase): each kernel that never waits at a phase, taking turns with one whose
# barrier there is needed (two-shot's exit barrier is redundant: it cannot show a stale
# exit slot).
IDLE_THEN_WAITING = (("oneshot+twoshot", "mid"), ("onestage+twostage", "mid"),
                     ("reducescatter+twoshot", "mid"), ("allgather+twostage", "mid"),
                     ("split+oneshot", "exit"), ("split+onestage", "exit"))


@pytest.mark.parametrize("kernels,phase", IDLE_THEN_WAITING)
def test_idle_phase_slots_are_kept_current(driver, kernels, phase):
    """The phase's slots start 2**31 calls older than the epoch (--stale: as if that many
    calls of kernels not waiting there had run since the last one that did), across the
    32-bit wrap. The first call, a kernel that never waits there, stores the epoch into them
    at its start barrier, so the second call's barrier there waits for its peers: zero
    reports, exact results. The control: start barriers without those stores
    (PYAR_TEST_NO_IDLE_FILL) leave the slots looking reached, the barrier passes at once
    and a rank reads shards not yet written (mid) or overwrites an input a peer still
    reads (exit)."""
    options = ("--epoch-start", WRAP_START, "--stale", phase, "--calls", 6,
               "--timeout-ms", 2000, *DELAYS)
    assert_clean(run(driver, kernels, 4, *options),
                 f"{kernels} after 2**31 calls without {phase}")
    control = run(driver, kernels, 4, *options, "--idle-fill", "off")
    assert control.caught, f"{kernels}: stale {phase} slots went unseen: {control.row}"


@pytest.mark.parametrize("kernel", ["oneshot", "twoshot", "onestage", "twostage", *SHARDS])
def test_absent_rank_times_out_and_is_named(driver, kernel):
    """Rank 2 of 3 makes no call from its fourth on: the others' bounded spins give up after
    the timeout, and the error record names rank 2 and the call, without a report."""
    # 1 s: under ThreadSanitizer on a loaded 2-core machine a present but slow peer once
    # took over 300 ms to reach a barrier, and that wait timed out too.
    outcome = run(driver, kernel, 3, "--absent", "2.3", "--calls", 6, "--timeout-ms", 1000)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["mismatches"] == 0 and row["timeouts"] == 2, row
    assert row["missing"] == [2] and row["timed_out_calls"] == [3, 3], row


# --- reduce_scatter and all_gather ---------------------------------------------------------

# How Communicator calls them: staged or registered, in one launch or in chunks of the
# shards (a 2 KiB scratch: 128 float32 elements per rank and launch for reduce_scatter at
# world 4); 3001 elements leave the last shard short, 7 leave the last ranks' shards empty
# and a part of a pack in the first.
SHARD_WAYS = {
    "staged": ("--variant", "staged"),
    "registered": ("--variant", "registered"),
    "staged-chunked": ("--variant", "staged", "--max-size", 2048, "--elements", 5003),
    "registered-chunked": ("--variant", "registered", "--max-size", 2048, "--elements", 5003),
    "staged-tiny": ("--variant", "staged", "--elements", 7),
}


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kernel", SHARDS)
def test_shards_clean_and_exact(driver, kernel, world):
    """reduce_scatter and all_gather back to back in every way the host calls them: zero
    reports, every rank's shard of the sum (reduce_scatter) or the whole array (all_gather)
    exact."""
    for way, options in SHARD_WAYS.items():
        outcome = run(driver, kernel, world, *options, "--calls", 8, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{kernel} {way} at world {world}")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_shards_half_types_and_float32_sums(driver, dtype):
    """16-bit inputs: reduce_scatter into the input's type and into float32 (the
    hierarchical communicator's partial sums), all_gather; odd counts."""
    for kernel, options in (("reducescatter", ()), ("reducescatter", ("--out", "f32")),
                            ("allgather", ())):
        for variant in ("staged", "registered"):
            outcome = run(driver, kernel, 3, "--dtype", dtype, *options, "--variant", variant,
                          "--elements", 1001, "--calls", 5, *DELAYS)
            assert_clean(outcome, f"{kernel} {dtype} {options} {variant}")


# --- calls that disagree -----------------------------------------------------------------

DISAGREE_WAYS = {"staged": ("--variant", "staged"), "registered": ("--variant", "registered"),
                 "registered-chunked": None}  # the kernel's own chunked way (mutation_ways)


def disagree_ways(kernel):
    return {way: options or mutation_ways(kernel)["chunked"]
            for way, options in DISAGREE_WAYS.items()}


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("kernel", ["oneshot", "twoshot", *FUSED, *SHARDS])
def test_disagreeing_calls_are_recorded_and_touch_nothing(driver, kernel, world):
    """The last rank's fourth call carries another signature (its element count plus one):
    every rank's error record says the ranks disagreed, names a chunk of that call and every
    rank's signature; no rank wrote any byte of its outputs (poisoned before the call), so
    no block read a peer's data (and split's kernel B normed nothing); every rank stops
    there (4 calls each), without waiting for a timeout (60 s here) and without a report."""
    for way, options in disagree_ways(kernel).items():
        outcome = run(driver, kernel, world, *options, "--disagree", f"{world - 1}.3",
                      "--calls", 6, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{kernel} {way} disagreeing at world {world}")
        row = outcome.row
        assert (row["disagreements"], row["bad_records"], row["touched"]) == (world, 0, 0), row
        assert row["launches"] % (4 * world) == 0 and row["seconds"] < 30, row


@pytest.mark.parametrize("kernel", ["oneshot", "twoshot", *FUSED, *SHARDS])
def test_ignoring_the_signature_is_caught(driver, kernel):
    """The control: built to ignore the signatures, the start barrier lets the disagreeing
    call through; it writes its outputs and nobody records a disagreement."""
    outcome = run(driver, kernel, 3, "--disagree", "2.3", "--signature-check", "off",
                  "--calls", 6, *DELAYS)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["disagreements"] == 0 and row["touched"] > 0 and outcome.returncode == 1, row


def test_split_kernel_b_without_the_failure_word_is_caught(driver):
    """Split's control: kernel A records the disagreement and skips, but a kernel B given no
    failure word (as the single-GPU step is) norms the gather buffer's stale sums and
    writes y and the residual."""
    outcome = run(driver, "split", 3, "--disagree", "2.3", "--failed-word", "off",
                  "--calls", 6, *DELAYS)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["disagreements"] == 3 and row["touched"] > 0 and outcome.returncode == 1, row


# --- the mutation table -----------------------------------------------------------------

# Barriers each kernel has, and those proven redundant (the proof lives in the kernel).
KERNEL_PHASES = {
    "oneshot": ("start", "exit"),
    "twoshot": ("start", "mid", "exit"),
    "onestage": ("start", "exit"),
    "twostage": ("start", "mid", "exit"),
    "split": ("start", "mid"),
    MIXED: ("start", "mid", "exit"),
    "reducescatter": ("start", "exit"),
    "allgather": ("start", "exit"),
}
REDUNDANT = {
    ("twoshot", "exit"): "peers read the input and the partial scratch only before mid; "
                         "the partial scratch is rewritten after the next start, the staged "
                         "input by the next kernel before it, both after this call's mid "
                         "(allreduce.cu)",
    ("twostage", "exit"): "peers read the input only before mid (block b's mid waits for "
                          "every rank's block b, which reads only block b's rows); peers "
                          "push into the gather buffer only after the next call's start "
                          "barrier, which needs this rank's start flag, stored once its "
                          "whole previous kernel returned (allreduce_rmsnorm.cu)",
    (MIXED, "exit"): "every write into any rank's partial region (two-shot's shard, "
                     "two-stage's pushes) follows the writer's start barrier, and every "
                     "read of it precedes the end of the reader's kernel: both reasons above",
}


def mutation_ways(kernel):
    """Staged, registered, and registered in chunks: the chunks of one call run back to
    back, the next launch's peers pushing into (or reading) what this one used."""
    chunked = (ALLREDUCE_WAYS["registered-chunked"][0] if kernel in ("oneshot", "twoshot")
               else SHARD_WAYS["registered-chunked"] if kernel in SHARDS
               else FUSED_WAYS["registered-chunked"][0])
    return {"staged": ("--variant", "staged"), "registered": ("--variant", "registered"),
            "chunked": chunked}


def test_every_barrier_removal_is_caught(driver):
    """Each barrier of each kernel (and of two-shot and two-stage taking turns) left out in
    turn, at world 4, staged, registered and registered in chunks: caught by a
    ThreadSanitizer report or a wrong sum, except the barriers proven redundant, which
    must stay uncaught. Prints the table mutation x detection."""
    rows, missed, refuted = [], [], []
    for kernel, phases in KERNEL_PHASES.items():
        ways = mutation_ways(kernel)
        for phase in phases:
            calls = {"oneshot": 10, "twoshot": 10, MIXED: 6, "reducescatter": 10,
                     "allgather": 10}.get(kernel, 4)
            found = {way: detection(run(driver, kernel, 4, *options, "--skip", phase,
                                         "--calls", calls, *DELAYS))
                     for way, options in ways.items()}
            reason = REDUNDANT.get((kernel, phase))
            caught = [w for w, d in found.items() if d != "not caught"]
            if reason is None and len(caught) < len(found):
                missed.append((kernel, phase, found))
            if reason is not None and caught:
                refuted.append((kernel, phase, found))
            rows.append((f"{kernel} without {phase}", *found.values(),
                         "redundant: " + reason if reason else ""))
    header = ("mutation", *mutation_ways("oneshot"), "note")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    print()
    for row in (header, *rows):
        print("  ".join(f"{c:<{w}}" for c, w in zip(row, widths)) + "  " + row[-1])
    assert not missed, f"barrier removals nobody caught: {missed}"
    assert not refuted, f"barriers listed as redundant whose removal was caught: {refuted}"


# --- the staging copy --------------------------------------------------------------------

STAGE_MUTATIONS = {
    "after-start": "each block copies its packs after the start barrier: a peer that passed "
                   "it may read the scratch before the copy (or while it lands)",
    "other-block": "block b copies the packs block b + 1 of the peers reads: their reader met "
                   "block b + 1 of this rank, whose release does not order block b's stores",
}


@pytest.mark.parametrize("kernel", ["oneshot", "twoshot", *FUSED])
@pytest.mark.parametrize("mutation", STAGE_MUTATIONS)
def test_staging_copy_out_of_order_is_caught(driver, kernel, mutation):
    """The in-kernel staging copy's positive controls (PYAR_TEST_STAGE_MUTATION, --stage),
    staged inputs at world 4 on 3 blocks (3001 float32 elements: 750 packs, 12 blocks'
    worth of 64 threads capped at 3; fused: 12 rows on 3 blocks): a copy the start barrier does not order for its
    readers is caught by a ThreadSanitizer report or a wrong sum. The same calls with the
    copy where the kernels make it are clean (test_*_clean_and_exact)."""
    outcome = run(driver, kernel, 4, "--variant", "staged", "--stage", mutation,
                  "--calls", 6, "--timeout-ms", 5000, *DELAYS)
    assert outcome.caught, f"{kernel}: {STAGE_MUTATIONS[mutation]}; went unseen: {outcome.row}"


# --- the LL all-reduce (pyar_ll.h) -------------------------------------------------------

# 3001 float32 elements on 3 blocks of 64 threads: 16 words a thread; 401 at world 8
# (a quick run under TSan).
