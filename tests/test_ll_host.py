"""The barrier-free LL all-reduce (src/kernels/pyar_ll.h) under ThreadSanitizer, without
a GPU (tier a), through the host build of tests/protocol_host.py: clean and exact at every
world and dtype, in place too, across the 32-bit epoch wrap, and with few count bits across
its refresh calls; it records disagreements and absent ranks like the barrier kernels; and
each of its rules' controls (PYAR_TEST_LL_MUTATION: one generation, flags without the count,
a packet stored as two 32-bit stores, no refresh) must be caught, one generation also under
the GPU control's lagging reader (PYAR_TEST_READER_DELAY_NS).  Every test runs the
one-shot (ll) and the two-shot (ll_twoshot: shards pushed to their owner, the owners' sums
pushed to every rank, in the two halves of the same segments).
"""
import pytest

from tests.protocol_host import DELAYS, NEEDS_CXX, WORLDS, WRAP_START, assert_clean, detection, run

pytestmark = NEEDS_CXX


LL_KERNELS = ("ll", "ll_twoshot")


def ll_elements(world):
    return 401 if world == 8 else 3001


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_ll_clean_and_exact(driver, kernel, world):
    """Back-to-back LL calls, every rank overwriting its input at once (the seeds' pattern:
    no peer reads it, so nothing can race), out of place and in place: zero reports, exact
    sums; at world 4 also across the 32-bit wrap of the block epochs its start flags carry;
    at world 3 taking turns with one-shot (the block epochs advance between LL calls) and
    with the other LL kernel (both use the same segments); the two-shot at world 8 also
    with an input of three segments (it takes up to world / 2)."""
    ways = {"out of place": (kernel,), "in place": (kernel, "--in-place", 1)}
    if world == 4:
        ways["across the epoch wrap"] = (kernel, "--epoch-start", WRAP_START)
    if world == 3:
        ways["taking turns with one-shot"] = ("oneshot+" + kernel,)
        ways["taking turns with the other LL kernel"] = ("ll+ll_twoshot",)
    elements = ("--elements", ll_elements(world))
    if world == 8 and kernel == "ll_twoshot":
        ways["past one segment"] = (kernel, "--max-size", 8192, "--elements", 6001)
    for way, (name, *options) in ways.items():
        outcome = run(driver, name, world, *elements, *options, "--calls", 8, "--seed", world,
                      *DELAYS)
        assert_clean(outcome, f"{name} {way} at world {world}")


@pytest.mark.parametrize("kernel", LL_KERNELS)
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_ll_half_types(driver, dtype, kernel):
    """Two 16-bit elements a word, an odd count (the last word half empty), in place too."""
    for in_place in (0, 1):
        outcome = run(driver, kernel, 3, "--dtype", dtype, "--elements", 1001,
                      "--in-place", in_place, "--calls", 6, *DELAYS)
        assert_clean(outcome, f"{kernel} {dtype} in place {in_place}")


# 4 count bits: the refresh calls are those with count % 4 < 2. Every 16th call takes 512
# elements, the others 64: a large call's words past 64 were last stored 16 calls before,
# with the same count bits and digest. One word a thread (8 blocks of 64), and rank 3
# starts every call 2 ms late, so its peers poll its packets before it pushes them.
LL_REFRESH = ("--ll-count-bits", 4, "--large-every", 16, "--elements", 512, "--max-size", 8192,
              "--blocks", 8, "--late", "3.2000", "--calls", 40)


@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_ll_refresh_keeps_few_count_bits_sound(driver, kernel):
    """With the refresh, the large calls wait for rank 3's packets: clean and exact. The
    control, no refresh, takes its 16-calls-old packets as the call's: wrong sums."""
    assert_clean(run(driver, kernel, 4, *LL_REFRESH, *DELAYS), f"{kernel} refresh")
    control = run(driver, kernel, 4, *LL_REFRESH, "--ll-mutation", "no-refresh", *DELAYS)
    assert control.caught, f"{kernel} without the refresh went unseen: {control.row}"


LL_MUTATIONS = {
    "one-generation": "every call uses one slot: a rank one call ahead overwrites packets a "
                      "peer has not taken (its wait for them times out)",
    "no-count": "the flag carries no count: a reader takes the packets of the call two back",
    "split-store": "data, then flag, as two 32-bit stores, the data plain: a reader may see "
                   "the flag without the data (on the host a race ThreadSanitizer reports; "
                   "two relaxed 32-bit atomics are never observed apart on x86 under TSan)",
}


# The two-shot alone would pass with one generation: a rank's next call pushes its shards
# only after it took every owner's sums of this call, which the owners push only after they
# took every shard; and it pushes sums only after it took the shards of that next call,
# which a rank pushes only after its own call returned. Calls that mix it with the
# one-shot (whose pushes follow nothing) need the two generations, so its one-generation
# control takes turns with the one-shot, on segments of 4096 packets: the one-shot's 3001
# words reach into the second half, where the two-shot's sums are.
def mutation_run(kernel, mutation):
    if (kernel, mutation) == ("ll_twoshot", "one-generation"):
        return ("ll_twoshot+ll", "--max-size", 16384)
    return (kernel,)


@pytest.mark.parametrize("kernel", LL_KERNELS)
@pytest.mark.parametrize("mutation", LL_MUTATIONS)
def test_ll_mutation_is_caught(driver, mutation, kernel):
    name, *options = mutation_run(kernel, mutation)
    outcome = run(driver, name, 4, *options, "--ll-mutation", mutation, "--calls", 10,
                  "--timeout-ms", 2000, *DELAYS)
    print(f"\n{kernel} {mutation}: {detection(outcome)}")
    assert outcome.caught, (f"{kernel} {mutation}: {LL_MUTATIONS[mutation]}; went unseen: "
                            f"{outcome.row}")


@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_a_lagging_reader_shows_a_single_generation(driver, kernel):
    """The GPU control's load: rank 3 takes its packets 300 us after its pushes in every
    call. Two generations stay exact; with one its peers' next call overwrites them."""
    lag = ("--reader-delay-us", 300, "--calls", 10, "--timeout-ms", 2000)
    assert_clean(run(driver, kernel, 4, *lag), f"{kernel} with a lagging reader")
    name, *options = mutation_run(kernel, "one-generation")
    assert run(driver, name, 4, *options, *lag, "--ll-mutation", "one-generation").caught


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_ll_disagreeing_calls_are_recorded_and_touch_nothing(driver, kernel, world):
    """As test_disagreeing_calls_are_recorded_and_touch_nothing: a packet with this call's
    count bits and another digest ends the wait at once, the start flags record it."""
    outcome = run(driver, kernel, world, "--elements", ll_elements(world), "--disagree",
                  f"{world - 1}.3", "--calls", 6, "--seed", world, *DELAYS)
    assert_clean(outcome, f"{kernel} disagreeing at world {world}")
    row = outcome.row
    assert (row["disagreements"], row["bad_records"], row["touched"]) == (world, 0, 0), row
    assert row["launches"] == 4 * world and row["seconds"] < 30, row


@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_ll_ignoring_the_signature_is_caught(driver, kernel):
    """The control: the packets' digest bits and the start flags ignored, the agreeing
    ranks sum and write their outputs, and nobody records a disagreement."""
    outcome = run(driver, kernel, 3, "--disagree", "2.3", "--signature-check", "off",
                  "--calls", 6, "--timeout-ms", 1000, *DELAYS)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["disagreements"] == 0 and row["touched"] > 0 and outcome.returncode == 1, row


@pytest.mark.parametrize("kernel", LL_KERNELS)
def test_ll_absent_rank_times_out_and_is_named(driver, kernel):
    outcome = run(driver, kernel, 3, "--absent", "2.3", "--calls", 6, "--timeout-ms", 1000)
    assert outcome.reports == 0, outcome.first_report()
    row = outcome.row
    assert row["mismatches"] == 0 and row["timeouts"] == 2, row
    assert row["missing"] == [2] and row["timed_out_calls"] == [3, 3], row
