"""The barrier-free kernels built with PYAR_EARLY_LOADS=1 (pyar_lamport.h: a call's first
loads issued before its block begins the epoch; off in the shipped kernels until a GPU has
measured it) under ThreadSanitizer, without a GPU, through the host build of
tests/protocol_host.py: the LL one-shot and two-shot and the lamport kernel clean and exact
at every world, in place, across the epoch wrap and taking turns with the barrier kernels;
their slot controls still caught."""
import pytest

from tests.protocol_host import (DELAYS, NEEDS_CXX, WORLDS, WRAP_START, assert_clean,
                                 build_driver, run)

pytestmark = NEEDS_CXX


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("early_loads"), ("PYAR_EARLY_LOADS=1",))


@pytest.mark.parametrize("world", WORLDS)
def test_early_loads_clean_and_exact(early, world):
    elements = ("--elements", 401 if world == 8 else 3001)
    ways = {f"{kernel} {way}": (kernel, *elements, *options)
            for kernel in ("ll", "ll_twoshot")
            for way, options in (("out of place", ()), ("in place", ("--in-place", 1)))}
    ways["lamport"] = ("lamport",)
    if world == 4:
        ways["ll across the epoch wrap"] = ("ll", *elements, "--epoch-start", WRAP_START)
        ways["lamport across the epoch wrap"] = ("lamport", "--epoch-start", WRAP_START)
        ways["lamport, forty rows on one block"] = ("lamport", "--tokens", 40, "--blocks", 1)
    if world == 3:
        ways["ll taking turns with one-shot"] = ("oneshot+ll", *elements)
        ways["lamport taking turns with one-stage"] = ("lamport+onestage",)
    for way, (name, *options) in ways.items():
        outcome = run(early, name, world, *options, "--calls", 8, "--seed", world, *DELAYS)
        assert_clean(outcome, f"{way} at world {world}, early loads")


@pytest.mark.parametrize("name, mutation", [
    ("ll", ("--ll-mutation", "one-generation")),
    ("lamport", ("--lamport-mutation", "one-slot")),
    ("lamport", ("--lamport-mutation", "keep-data")),
])
def test_early_loads_slot_controls_are_caught(early, name, mutation):
    outcome = run(early, name, 4, *mutation, "--calls", 40, "--timeout-ms", 2000, *DELAYS)
    assert outcome.caught, f"{name} {mutation} went unseen with early loads: {outcome.row}"
