"""The host build of the kernels under ThreadSanitizer, shared by
tests/test_protocol_host.py (the barrier kernels), tests/test_ll_host.py (the LL
all-reduce) and tests/test_lamport_host.py (the lamport fused kernel):
src/kernels/host/protocol_driver.cpp's build flags and
build (tests/conftest.py's ``driver`` fixture builds it once a pytest run),
one run of it and what the run found."""
import json
import os
import re
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "src", "kernels")
DRIVER = os.path.join(KERNELS, "host", "protocol_driver.cpp")
CXX = shutil.which("g++")

# Each test module of the host build sets it as its pytestmark.
NEEDS_CXX = pytest.mark.skipif(
    CXX is None, reason="no g++ on PATH: the host build of the kernels cannot be compiled")

CXXFLAGS = ["-std=c++20", "-O1", "-g", "-fsanitize=thread", "-DPYAR_HOST_BUILD",
            "-DPYAR_TEST_SKIP_PHASE=host::skipped_phase",
            "-DPYAR_TEST_REACHED_UNSIGNED=host::unsigned_reached",
            "-DPYAR_TEST_IGNORE_SIGNATURE=host::ignore_signature",
            "-DPYAR_TEST_NO_IDLE_FILL=host::no_idle_fill",
            "-DPYAR_TEST_STAGE_MUTATION=host::stage_mutation",
            "-DPYAR_TEST_LL_MUTATION=host::ll_mutation", "-Wall", "-Wno-unknown-pragmas",
            "-DPYAR_TEST_LL_COUNT_BITS=host::ll_count_bits",
            "-DPYAR_TEST_READER_DELAY_NS=host::reader_delay_ns",
            "-DPYAR_TEST_LAMPORT_KEEP_DATA=host::lamport_keep_data",
            "-DPYAR_TEST_LAMPORT_ONE_SLOT=host::lamport_one_slot"]
# halt_on_error: the first report ends the run (a mutation needs one); exitcode tells a
# report from a wrong sum (1) or bad usage (2).
TSAN_OPTIONS = "halt_on_error=1 exitcode=66"
TSAN_EXIT = 66
WORLDS = [2, 3, 4, 8]
# Random delays: one delay point (a peer load or a flag store) in 400 sleeps up to 200 us,
# and a third of the calls start up to 300 us late on each rank.
DELAYS = ("--jitter", "400", "--sleep-us", "200", "--delay-us", "300")
WRAP_START = str(2**32 - 4)  # epochs 2**32 - 3 .. 2**32 - 1, 0, 1, ... in the first calls


def build_driver(folder):
    """protocol_driver.cpp under ThreadSanitizer into ``folder``; its path."""
    exe = os.path.join(str(folder), "protocol_driver")
    cmd = [CXX, *CXXFLAGS, "-I", KERNELS, DRIVER, "-o", exe, "-pthread"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, " ".join(cmd) + "\n" + done.stdout + done.stderr
    print(f"\nhost build under ThreadSanitizer: {time.monotonic() - started:.1f} s")
    return exe


class Outcome:
    def __init__(self, done):
        self.returncode = done.returncode
        self.stderr = done.stderr
        self.reports = len(re.findall(r"WARNING: ThreadSanitizer", done.stderr))
        rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
        self.row = json.loads(rows[-1]) if rows else None

    @property
    def wrong(self):
        return self.row is not None and (self.row["mismatches"] or self.row["timeouts"])

    @property
    def caught(self):
        return self.reports > 0 or self.wrong

    def first_report(self):
        match = re.search(r"WARNING: ThreadSanitizer.*?(?=\n\n|\Z)", self.stderr, re.S)
        return match.group(0)[:3000] if match else self.stderr[-3000:]


# Older ThreadSanitizer runtimes cannot place their shadow memory under the address
# randomization of newer kernels (vm.mmap_rnd_bits = 32, e.g. Ubuntu 24.04); such a
# run is repeated with randomization off for the process (setarch -R).
MAPPING_FAILURE = "ThreadSanitizer: unexpected memory mapping"


def run(driver, kernel, world, *options, timeout=300):
    env = dict(os.environ, TSAN_OPTIONS=TSAN_OPTIONS)
    cmd = [driver, kernel, str(world), *map(str, options)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    if MAPPING_FAILURE in done.stderr and shutil.which("setarch"):
        done = subprocess.run(["setarch", os.uname().machine, "-R", *cmd], capture_output=True,
                              text=True, timeout=timeout, env=env, check=False)
    if MAPPING_FAILURE in done.stderr:
        pytest.skip("ThreadSanitizer cannot map its shadow memory on this kernel, and "
                    f"setarch -R did not help: {done.stderr.strip()[:300]}")
    outcome = Outcome(done)
    assert outcome.returncode in (0, 1, TSAN_EXIT), " ".join(cmd) + "\n" + done.stderr[-3000:]
    return outcome


def assert_clean(outcome, what):
    assert outcome.reports == 0, f"{what}: ThreadSanitizer reported\n{outcome.first_report()}"
    assert outcome.row is not None, f"{what}: no result\n{outcome.stderr[-3000:]}"
    assert outcome.row["mismatches"] == 0 and outcome.row["timeouts"] == 0, (what, outcome.row)
    assert outcome.returncode == 0, (what, outcome.row)


def detection(outcome):
    """What caught a mutation run, in words."""
    if outcome.reports:
        return "TSan report"
    if outcome.wrong:
        return (f"{outcome.row['mismatches']} wrong, {outcome.row['timeouts']} timed out")
    return "not caught"
