"""Adversarial write-after-read: the seeds' bug, provoked on purpose.

Every call's consumer overwrites the call's input at once (a kernel on the
same stream writing NaN over it) while randomly chosen ranks are delayed (a
spin kernel on the stream before the call) or disturbed (spin kernels over
every multiprocessor on a second stream, started with the call), so that
ranks leave the kernel at different times.  A kernel that returns before
every peer has finished reading its buffers lets a slow peer sum the NaN (or,
for staged inputs, the next call's staged data) into its result.

Calls are queued in rounds of K on one stream with no host synchronization
in between: per call k a distinct input x_k (integers in [-8, 8], one of
PATTERNS patterns per rank, consecutive calls never the same pattern) into a
distinct output y_k (NaN beforehand).  After each round every y_k is compared
bit for bit with the exact sum, which every rank computes from the seeds.
Variants: "staged" (the input is copied into the communicator's scratch by
the kernel, so the next call's kernel overwrites what slow peers read) and
"registered" (x_k was registered: peers read x_k itself, and the NaN
overwrite is the hazard).

Modes:
  main              one-shot and two-shot, fp32/fp16/bf16, both variants,
                    CALLS calls each; then the LL one-shot and two-shot (which
                    read their input in place, never staged nor registered:
                    variant "unstaged"), each at ll_level (its largest input at
                    this world size), LL_CALLS calls per dtype; every mismatch
                    fails the scenario.
  control PATH      the positive control: one-shot only, on a Communicator
                    whose code object PATH was built without the exit barrier
                    (PYAR_TEST_SKIP_EXIT_BARRIER), with a 1 s timeout.  Runs
                    each (dtype, variant) until it sees a wrong result,
                    escalating the disturbance level while it has seen no
                    wrong result, within a call and time budget.  A timeout
                    (barriers compare epochs wrap-safely, but at 3 ranks under
                    MPS a rank's kernel has started over 1 s late) is counted,
                    the round's calls completed before it are still checked,
                    and the control goes on with a fresh communicator.
                    Reports mismatches and timeouts; never fails for them (the
                    test asserts that wrong sums showed).

  wrap              main's calls, fp32 only, each (algo, variant) starting with
                    the epochs WRAP_BEFORE calls before 2**32 (start_epochs_at):
                    every block crosses the 32-bit wrap under the adversarial load.
  control-ll PATH   LL's positive control, the one-shot's: fp32 at LL_LEVEL on a
                    Communicator whose code object PATH was built with one LL
                    generation for every call
                    (PYAR_TEST_LL_MUTATION=kLLOneGeneration), so a fast rank's next
                    call stores over packets a slow peer has not taken yet: the peer
                    sums the next call's data or waits for packets that never come
                    (a timeout).  Runs until it sees either, within a call and time
                    budget; reports them, never fails for them.
  control-start PATH
                    the start barrier's positive control: staged inputs, one-shot
                    and two-shot, on a Communicator whose code object PATH was
                    built without the start barrier (PYAR_TEST_SKIP_PHASE=kStart).
                    The last rank spins before every call, so its kernel's copy
                    of the input into its scratch lands late while the peers'
                    kernels, no longer waiting for it, already read that scratch
                    (still the previous call's input).  Also run against kernels
                    that copy after their start barrier
                    (PYAR_TEST_STAGE_MUTATION=kStageAfterStart): the peers read
                    the scratch while the copy lands.  Runs until it sees wrong
                    results, within a call and time budget; reports them, never
                    fails for them (the test asserts that wrong sums showed).

Usage: allreduce_adversarial.py main | wrap | control PATH | control-start PATH |
       control-ll PATH
"""
import time
import weakref

import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from allreduce_common import (
    ALGOS, DTYPES, LL, LL_ALGOS, NAN_WORD, bits, describe_difference, exact_sum, ll_bytes, rng,
    run, small_integers, start_epochs_at,
)
from tests.gpu_kernels import GpuTestKernels
from tests.mpi_launch import control_build

K = 50            # calls per round
CALLS = 1000      # per (dtype, algo, variant) in main mode
PATTERNS = 5
TAIL_BYTES = 12   # a tail that is not a whole 16-byte pack, and a multiple of 4 bytes


class Level:
    """How hard the ranks are disturbed."""

    def __init__(self, nbytes, delay_p, delay_us, noise_p, noise_us, noise_per_sm):
        self.nbytes = nbytes              # per call, before the tail
        self.delay_p = delay_p            # chance that a rank spins before a call
        self.delay_us = delay_us          # ... for up to this long
        self.noise_p = noise_p            # chance of spin kernels on a second stream
        self.noise_us = noise_us          # ... for up to this long
        self.noise_per_sm = noise_per_sm  # ... with this many blocks per multiprocessor

    def describe(self):
        return dict(bytes=self.nbytes, delay_p=self.delay_p, delay_us=self.delay_us,
                    noise_p=self.noise_p, noise_us=self.noise_us,
                    noise_blocks_per_sm=self.noise_per_sm)


MAIN_LEVEL = Level(1 << 20, 0.3, 200, 0.2, 200, 1)
CONTROL_LEVELS = (
    MAIN_LEVEL,
    Level(2 << 20, 0.5, 200, 0.5, 300, 4),
    Level(4 << 20, 0.5, 300, 0.8, 500, 16),
)
# LL's: MAIN_LEVEL's disturbance with the largest input LL takes (the tail included);
# ll_level gives each LL algorithm's at a world size.
LL_LEVEL = Level(ll_bytes(LL, 1) - 16, 0.3, 200, 0.2, 200, 1)
LL_CALLS = 500          # per (dtype, LL algorithm) in main mode (fp32 only with wrap)
CONTROL_CALLS = 1000    # per (level, dtype, variant), ending at the first mismatch
CONTROL_SECONDS = 150   # overall budget of the control
CONTROL_TIMEOUT = 1.0   # seconds; legitimate waits here last well under a millisecond
WRAP_BEFORE = 300       # wrap mode: calls before the epochs reach 2**32
START_DELAY_US = 300    # control-start: the last rank's delay before each call


def ll_level(algo, world):
    """LL_LEVEL's disturbance with the largest input LL ``algo`` takes on
    ``world`` ranks (the two-shot's grows with the world), the tail included."""
    return Level(ll_bytes(algo, world) - 16, LL_LEVEL.delay_p, LL_LEVEL.delay_us,
                 LL_LEVEL.noise_p, LL_LEVEL.noise_us, LL_LEVEL.noise_per_sm)


# How many call numbers each communicator's kernels have taken: the kernel
# that gives up reports its call's (CollectiveTimeout.sequence), counted from 0
# when the communicator is made; an all-reduce takes one per chunk of the
# scratch buffer (comm.geometry.max_size bytes: pyar.comm.plan.allreduce).
_NUMBERS = weakref.WeakKeyDictionary()


def numbered(comm, x):
    """After an all-reduce of ``x`` on ``comm`` (the only calls here that
    take numbers): the number its next call takes."""
    chunk = comm.geometry.max_size // x.dtype.itemsize
    _NUMBERS[comm] = _NUMBERS.get(comm, 0) + -(-x.size // chunk)
    return _NUMBERS[comm]


class Workload:
    """The buffers of one (dtype, level): input patterns, K inputs per
    variant, K outputs, and the expected sums."""

    def __init__(self, sc, comm, kernels, streams, dtype, level, key, variants):
        self.sc, self.comm, self.kernels = sc, comm, kernels
        self.stream, self.noise_stream = streams
        self.dtype, self.level = dtype, level
        self.n = level.nbytes // dtype.itemsize + TAIL_BYTES // dtype.itemsize
        self.nbytes = self.n * dtype.itemsize
        assert self.nbytes % 4 == 0
        self.sms = pyar.Device(comm.device).multiprocessor_count
        stream = self.stream
        patterns = [[small_integers(dtype, self.n, *key, r, j) for j in range(PATTERNS)]
                    for r in range(sc.world)]
        self.expected = [bits(exact_sum([patterns[r][j] for r in range(sc.world)], dtype))
                         for j in range(PATTERNS)]
        self.sources = [pyar.asarray(p, stream=stream) for p in patterns[sc.rank]]
        del patterns
        self.outs = [pyar.empty((self.n,), dtype, stream=stream) for _ in range(K)]
        self.inputs = {}
        for variant in variants:
            xs = [pyar.empty((self.n,), dtype, stream=stream, ipc=True) for _ in range(K)]
            if variant == "registered":
                for x in xs:
                    comm.register(x)  # collective; kept alive until the communicator closes
            self.inputs[variant] = xs
        self.shared = rng(*key, 1_000_003)              # the same on every rank
        self.local = rng(*key, 2_000_003, sc.rank)      # this rank's disturbances
        self.last = -1
        self.details = 0

    def round(self, algo, variant, tolerate_timeout=False):
        """K calls back to back; returns (how many of this rank's results were
        wrong, whether a call timed out here).  A timeout raises unless
        ``tolerate_timeout``; then only the results of the calls this rank
        completed before the one that gave up are checked (the exception's
        ``sequence``; a call's numbers are the communicator's call count
        around it, more than one where it is chunked).  The host may learn of
        the timeout while it still queues the round's calls (the next call
        raises it) or at the round's synchronize: both count."""
        comm, kernels, stream, level = self.comm, self.kernels, self.stream, self.level
        words = self.nbytes // 4
        xs = self.inputs[variant]
        chosen = []
        for k in range(K):
            j = (self.last + 1 + int(self.shared.integers(PATTERNS - 1))) % PATTERNS
            self.last = j
            chosen.append(j)
            _hip.memcpy_dtod(xs[k].ptr, self.sources[j].ptr, self.nbytes, stream)
            kernels.fill_u32(self.outs[k].ptr, NAN_WORD, words, stream)
        ends = []  # the number the communicator's next call takes, after each call
        completed = K
        try:
            for k in range(K):
                if self.local.random() < level.noise_p:
                    self.noise_stream.wait(stream)  # the noise starts with this call
                    kernels.spin(self.local.uniform(0, level.noise_us), self.noise_stream,
                                 blocks=self.sms * level.noise_per_sm)
                if self.local.random() < level.delay_p:
                    kernels.spin(self.local.uniform(0, level.delay_us), stream)
                comm.allreduce(xs[k], out=self.outs[k], algo=algo, stream=stream)
                ends.append(numbered(comm, xs[k]))
                kernels.fill_u32(xs[k].ptr, NAN_WORD, words, stream)  # the consumer reuses x_k
            comm.synchronize(stream)
        except pyar.CollectiveTimeout as exc:
            if not tolerate_timeout:
                raise
            stream.synchronize()  # the calls queued behind the failed one give up at once
            completed = 0 if exc.sequence is None else sum(end <= exc.sequence for end in ends)
            self.sc.log(f"{self.dtype.name} {algo} {variant}: {exc}; {completed} of the "
                        "round's calls completed before it")
            timed_out = True
        else:
            timed_out = False
        self.noise_stream.synchronize()
        wrong = 0
        for k in range(completed):
            got = self.outs[k].get(stream=stream)
            if not np.array_equal(bits(got), self.expected[chosen[k]]):
                wrong += 1
                if self.details < 5:
                    self.details += 1
                    want = self.expected[chosen[k]].view(self.dtype)
                    self.sc.log(f"{self.dtype.name} {algo} {variant} call {k} of a round: "
                                f"{describe_difference(got, want)}")
        return wrong, timed_out


def setup(sc, kernels_path=None, timeout=60.0):
    kwargs = {} if kernels_path is None else {"kernels": kernels_path}
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=timeout, **kwargs)
    kernels = GpuTestKernels(comm.device)
    streams = (pyar.Stream(), pyar.Stream())
    return comm, kernels, streams


def main_mode(sc, wrap=False):
    comm, kernels, streams = setup(sc)
    variants = ("staged", "registered")
    keep = []
    for d, dtype in enumerate(DTYPES[:1] if wrap else DTYPES):
        work = Workload(sc, comm, kernels, streams, dtype, MAIN_LEVEL, (d, 0), variants)
        keep.append(work.inputs["registered"])
        for algo in ALGOS:
            for variant in variants:
                if wrap:
                    start_epochs_at(comm, 2**32 - WRAP_BEFORE)
                report_rounds(sc, work, algo, variant, wrap, CALLS)
        for a, algo in enumerate(LL_ALGOS):
            ll_work = Workload(sc, comm, kernels, streams, dtype, ll_level(algo, sc.world),
                               (d, 1 + a), ("unstaged",))
            if wrap:
                start_epochs_at(comm, 2**32 - WRAP_BEFORE)
            report_rounds(sc, ll_work, algo, "unstaged", wrap, LL_CALLS)
            del ll_work
    comm.close()


def report_rounds(sc, work, algo, variant, wrap, total):
    """``total`` calls of ``algo`` in rounds of K; every wrong result fails."""
    wrong = calls = 0
    started = time.monotonic()
    for _ in range(total // K):
        wrong += work.round(algo, variant)[0]
        calls += K
    sc.check(wrong == 0, f"{work.dtype.name} {algo} {variant}: {wrong} of {calls} "
                         "results were wrong")
    sc.report(test="adversarial-wrap" if wrap else "adversarial", algo=algo,
              dtype=work.dtype.name, variant=variant, calls=calls, mismatches=sc.sum(wrong),
              seconds=round(sc.max(time.monotonic() - started), 2), **work.level.describe())


def control_mode(sc, kernels_path):
    """A short timeout keeps an unexpected lost flag from eating the budget;
    timeouts are counted apart from wrong results, and the control continues
    on a fresh communicator after one."""
    def connect():
        comm, kernels, streams = setup(sc, kernels_path, timeout=CONTROL_TIMEOUT)
        return comm, kernels, streams

    comm, kernels, streams = connect()
    keep = []  # registered buffers live as long as their communicator
    started = time.monotonic()
    detected = timeouts = calls_total = 0
    out_of_time = False
    for li, level in enumerate(CONTROL_LEVELS):
        for d, dtype in enumerate(DTYPES):
            for variant in ("registered", "staged"):
                work = Workload(sc, comm, kernels, streams, dtype, level, (d, 10 + li),
                                (variant,))
                keep.append(work.inputs.get("registered"))
                calls = found = broken = 0
                while calls < CONTROL_CALLS:
                    wrong, timed_out = work.round("oneshot", variant, tolerate_timeout=True)
                    calls += K
                    found += sc.sum(wrong)
                    if sc.any(timed_out):
                        broken += 1
                        del work
                        comm.close()  # collective; every rank's kernels have returned
                        keep.clear()
                        comm, kernels, streams = connect()
                        work = Workload(sc, comm, kernels, streams, dtype, level, (d, 10 + li),
                                        (variant,))
                        keep.append(work.inputs.get("registered"))
                    out_of_time = sc.max(time.monotonic() - started) > CONTROL_SECONDS
                    if found or out_of_time:
                        break
                del work
                detected += found
                timeouts += broken
                calls_total += calls
                sc.report(test="control", algo="oneshot", dtype=dtype.name, variant=variant,
                          level=li, calls=calls, mismatches=found, timeouts=broken,
                          seconds=round(sc.max(time.monotonic() - started), 2),
                          **level.describe())
                if out_of_time:
                    break
            if out_of_time:
                break
        if detected or out_of_time:
            break  # escalate only while no wrong result has shown
    sc.report(test="control-total", algo="oneshot", calls=calls_total, mismatches=detected,
              timeouts=timeouts, seconds=round(sc.max(time.monotonic() - started), 2))
    comm.close()
    keep.clear()


def control_start_mode(sc, kernels_path):
    """A staged input copied late on the last rank, against kernels without the start
    barrier (or copying after it): the peers sum what that rank's scratch held before
    (the previous call's input), or a mix."""
    comm, kernels, streams = setup(sc, kernels_path, timeout=CONTROL_TIMEOUT)
    late = sc.rank == sc.world - 1
    level = Level(1 << 20, 1.0 if late else 0.0, START_DELAY_US, 0.0, 0, 1)
    work = Workload(sc, comm, kernels, streams, DTYPES[0], level, (0, 20), ("staged",))
    started = time.monotonic()
    for algo in ALGOS:
        calls = found = broken = 0
        while calls < CONTROL_CALLS and not found:
            wrong, timed_out = work.round(algo, "staged", tolerate_timeout=True)
            calls += K
            found += sc.sum(wrong)
            if sc.any(timed_out):
                # Without the start barrier ranks may also lose each other (seen at
                # 3 and 4 ranks); a timed-out communicator refuses further calls,
                # so the next algorithm gets a new one.
                broken += 1
                del work
                comm.close()
                comm, kernels, streams = setup(sc, kernels_path, timeout=CONTROL_TIMEOUT)
                work = Workload(sc, comm, kernels, streams, DTYPES[0], level, (0, 20),
                                ("staged",))
            if sc.max(time.monotonic() - started) > CONTROL_SECONDS:
                break
        sc.report(test="control-start", algo=algo, build=control_build(kernels_path),
                  dtype=DTYPES[0].name, variant="staged",
                  calls=calls, mismatches=found, timeouts=broken, late_rank=sc.world - 1,
                  delay_us=START_DELAY_US, seconds=round(sc.max(time.monotonic() - started), 2))
    comm.close()


def control_ll_mode(sc, kernels_path):
    """LL with one generation: wrong sums or timeouts, counted apart; the
    first of either ends it (a timed-out communicator refuses further calls)."""
    comm, kernels, streams = setup(sc, kernels_path, timeout=CONTROL_TIMEOUT)
    work = Workload(sc, comm, kernels, streams, DTYPES[0], LL_LEVEL, (0, 30), ("unstaged",))
    started = time.monotonic()
    calls = found = broken = 0
    while calls < CONTROL_CALLS and not (found or broken):
        wrong, timed_out = work.round(LL, "unstaged", tolerate_timeout=True)
        calls += K
        found += sc.sum(wrong)
        if sc.any(timed_out):
            broken += 1
        if sc.max(time.monotonic() - started) > CONTROL_SECONDS:
            break
    sc.report(test="control-ll", algo=LL, build=control_build(kernels_path),
              dtype=DTYPES[0].name, variant="unstaged", calls=calls, mismatches=found,
              timeouts=broken, seconds=round(sc.max(time.monotonic() - started), 2),
              **LL_LEVEL.describe())
    del work
    comm.close()


def main(sc):
    mode = sc.argv[0] if sc.argv else "main"
    if mode in ("main", "wrap"):
        main_mode(sc, wrap=mode == "wrap")
    elif mode == "control":
        control_mode(sc, sc.argv[1])
    elif mode == "control-start":
        control_start_mode(sc, sc.argv[1])
    elif mode == "control-ll":
        control_ll_mode(sc, sc.argv[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}: main | wrap | control PATH | "
                         "control-start PATH | control-ll PATH")


if __name__ == "__main__":
    run("allreduce_adversarial", main)
