"""The barrier-free fused all-reduce + RMSNorm (lamport: src/kernels/pyar_lamport.h and
allreduce_rmsnorm.cu lamport) under ThreadSanitizer, without a GPU (tier a), through the
host build of tests/protocol_host.py: clean and exact at every world and dtype, with
several rows a block, across the 32-bit epoch wrap, and taking turns with the barrier
one-stage; it records disagreements and absent ranks like the barrier kernels; and each
of its rules' controls (PYAR_TEST_LAMPORT_KEEP_DATA: a reader leaves what it took in the
slot; PYAR_TEST_LAMPORT_ONE_SLOT: every call pushes into slot 0) must be caught.  Its
pushes, polls and emptying stores are 32-bit relaxed atomics a word (each word of the
GPU's 16-byte store is single-copy atomic), so TSan sees no race on a slot: slot misuse
shows as wrong outputs or timeouts, which the controls show it does; the rows' sums and
outputs move as plain memory that TSan watches.
"""
import pytest

from tests.protocol_host import DELAYS, NEEDS_CXX, WORLDS, WRAP_START, assert_clean, detection, run

pytestmark = NEEDS_CXX


@pytest.mark.parametrize("world", WORLDS)
def test_lamport_clean_and_exact(driver, world):
    """Back-to-back calls, every rank overwriting its input at once (no peer reads it): zero
    reports, the exact residual and normed rows; at world 4 also with forty rows on one
    block (each block takes its later rows as they come) and across the 32-bit wrap of
    the epochs its start flags carry; at world 3 taking turns with the barrier one-stage
    (the block epochs advance between lamport calls)."""
    ways = {"twelve rows": ("lamport",)}
    if world == 4:
        ways["forty rows on one block"] = ("lamport", "--tokens", 40, "--blocks", 1)
        ways["across the epoch wrap"] = ("lamport", "--epoch-start", WRAP_START)
    if world == 3:
        ways["taking turns with one-stage"] = ("lamport+onestage",)
    for way, (name, *options) in ways.items():
        outcome = run(driver, name, world, *options, "--calls", 8, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{name} {way} at world {world}")


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_lamport_half_types(driver, dtype):
    outcome = run(driver, "lamport", 3, "--dtype", dtype, "--calls", 6, *DELAYS)
    assert_clean(outcome, f"lamport {dtype}")


LAMPORT_MUTATIONS = {
    "keep-data": "a reader leaves the packs it took: the call two later takes them as its "
                 "own before the peers push",
    "one-slot": "every call pushes into slot 0: a rank one call ahead overwrites packs a "
                "peer has not taken, or the peer's emptying erases its push (a timeout)",
}


# The last rank takes its rows 300 us after its pushes in every call, so its peers
# are a call ahead of its takes in every call, not only when the random delays
# happen to put them there (a run of 40 calls without the lag once kept every
# rank in step and caught nothing).
LAG = ("--reader-delay-us", 300)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mutation", LAMPORT_MUTATIONS)
def test_lamport_mutation_is_caught(driver, mutation, world):
    outcome = run(driver, "lamport", world, "--lamport-mutation", mutation, "--calls", 40,
                  "--timeout-ms", 2000, *LAG, *DELAYS)
    print(f"\nlamport {mutation} at world {world}: {detection(outcome)}")
    assert outcome.caught, (f"lamport {mutation}: {LAMPORT_MUTATIONS[mutation]}; went "
                            f"unseen: {outcome.row}")


@pytest.mark.parametrize("world", [2, 4])
def test_lamport_stays_exact_with_a_lagging_reader(driver, world):
    """The mutations' load without a mutation: the two slots keep every call exact."""
    outcome = run(driver, "lamport", world, "--calls", 40, "--timeout-ms", 2000, *LAG,
                  *DELAYS)
    assert_clean(outcome, f"lamport with a lagging reader at world {world}")


@pytest.mark.parametrize("world", [2, 4, 8])
def test_lamport_disagreeing_calls_are_recorded_and_touch_nothing(driver, world):
    """As the barrier kernels: the start flags carry the digest both ways, a block checks
    every peer's once its first row came (confirm), and a call that disagrees writes
    nothing, on every rank."""
    outcome = run(driver, "lamport", world, "--disagree", f"{world - 1}.3", "--calls", 6,
                  "--seed", world, *DELAYS)
    assert_clean(outcome, f"lamport disagreeing at world {world}")
    row = outcome.row
    assert (row["disagreements"], row["bad_records"], row["touched"]) == (world, 0, 0), row
    assert row["launches"] == 4 * world and row["seconds"] < 30, row


def test_lamport_ignoring_the_signature_is_caught(driver):
    """The control: the start flags' digests ignored, the agreeing ranks norm and write
    their outputs, and nobody records a disagreement."""
    outcome = run(driver, "lamport", 3, "--disagree", "2.3", "--signature-check", "off",
                  "--calls", 6, "--timeout-ms", 1000, *DELAYS)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["disagreements"] == 0 and row["touched"] > 0 and outcome.returncode == 1, row


def test_lamport_absent_rank_times_out_and_is_named(driver):
    outcome = run(driver, "lamport", 3, "--absent", "2.3", "--calls", 6, "--timeout-ms", 1000)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["mismatches"] == 0 and row["timeouts"] == 2, row
    assert row["missing"] == [2] and row["timed_out_calls"] == [3, 3], row
