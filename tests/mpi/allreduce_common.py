"""Shared pieces of the all-reduce GPU scenarios (tests/mpi/allreduce_*.py),
which tests/gpu/test_allreduce_gpu.py runs under mpirun, every rank on GPU
``rank % devices`` (all on GPU 0 on the one-GPU machine, under MPS).

How a scenario fails, so that no rank is left waiting for a peer:
- a failed check never raises: it is printed and counted, and ``run`` agrees
  across ranks (an MPI all-reduce of the failure flags) whether any rank
  failed; then every rank exits 1;
- an unexpected exception prints its traceback and aborts the whole job
  (``MPI.Abort``), which mpirun reports as a failure;
- a watchdog (faulthandler) dumps every thread's stack and exits the rank if
  it is still running after $PYAR_SCENARIO_WATCHDOG seconds (a hang).

Summary rows (``tests.mpi_launch.report``) come from rank 0 only and hold
totals over all ranks: ``calls`` is the number of collective calls (each rank
made that many), ``mismatches`` the number of (rank, call) results that were
wrong.
"""
import faulthandler
import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from pyar.comm import plan  # noqa: E402
from pyar.comm.algorithms import LL, LL_MAX_BYTES, LL_TWOSHOT  # noqa: E402
from tests.mpi_launch import report as _report  # noqa: E402

DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
ALGOS = ("oneshot", "twoshot")
# The barrier-free LL one-shot and two-shot, forced with algo= and refused above
# their largest input (ll_bytes): the scenarios run them too, within that limit.
LL_ALGOS = (LL, LL_TWOSHOT)
WITH_LL = ALGOS + LL_ALGOS
NAN_BYTE = 0xFF  # 0xff.. is a NaN in fp32, fp16 and bf16
NAN_WORD = 0xFFFFFFFF
SEED = 20261202 ^ int(os.environ.get("PYAR_TEST_SEED", "0"))
DEFAULT_WATCHDOG = 540.0

_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(array):
    """The raw bits of a host array (for bitwise comparisons; NaN-safe)."""
    return np.ascontiguousarray(array).view(_UNSIGNED[array.dtype.itemsize])


def ll_bytes(algo, world, max_size=LL_MAX_BYTES):
    """The largest input LL ``algo`` takes on ``world`` ranks of a communicator
    made with ``max_size`` (the one-shot: a segment, LL_MAX_BYTES or max_size
    when smaller; the two-shot: ``world`` halves of one)."""
    return plan.ll_largest(algo, plan.ll_segment(max_size), world)


def ll_largest(dtype, algo, world):
    """The largest odd element count of ``dtype`` that LL ``algo`` takes on
    ``world`` ranks (every scenario's max_size is at least LL_MAX_BYTES)."""
    return (ll_bytes(algo, world) // dtype.itemsize - 1) | 1


def rng(*key):
    """A generator seeded by the scenario seed and ``key`` (ints)."""
    return np.random.default_rng([SEED, *[int(k) for k in key]])


def small_integers(dtype, n, *key):
    """Integers in [-8, 8] as ``dtype``: any sum of up to 8 of them is exact in
    fp32, fp16 and bf16, in any order."""
    return rng(*key).integers(-8, 9, size=n, dtype=np.int8).astype(dtype)


def normal(dtype, n, *key):
    return rng(*key).standard_normal(n, dtype=np.float32).astype(dtype)


def exact_sum(arrays, dtype):
    """Sum of integer-valued arrays, exactly, as ``dtype``."""
    total = np.zeros(arrays[0].shape, np.int32)
    for a in arrays:
        total += a.astype(np.float32).astype(np.int32)
    return total.astype(np.float32).astype(dtype)


def describe_difference(got, want):
    """A short description of where two same-shape host arrays differ."""
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g != w)
    if bad.size == 0:
        return "equal"
    g32 = got.astype(np.float32)
    nans = int(np.count_nonzero(np.isnan(g32[bad])))
    first = int(bad[0])
    return (f"{bad.size} of {got.size} elements differ ({nans} NaN), first at {first}: "
            f"got {g32[first]!r}, want {float(want.astype(np.float32)[first])!r}")


class Scenario:
    """One rank's view of a scenario: its rank, the world, failure counting."""

    def __init__(self, name):
        self.name = name
        self.mpi = MPI.COMM_WORLD
        self.rank = self.mpi.Get_rank()
        self.world = self.mpi.Get_size()
        self.failures = 0
        self.argv = sys.argv[1:]
        watchdog = float(os.environ.get("PYAR_SCENARIO_WATCHDOG", DEFAULT_WATCHDOG))
        faulthandler.dump_traceback_later(watchdog, exit=True)

    def log(self, message):
        print(f"[{self.name} rank {self.rank}/{self.world}] {message}", flush=True)

    def check(self, ok, message):
        """Count and print a failed check; never raises."""
        if not ok:
            self.failures += 1
            if self.failures <= 40:
                self.log("FAIL: " + message)
            elif self.failures == 41:
                self.log("FAIL: (further failures not printed)")
        return bool(ok)

    def expect_raises(self, kinds, call, what, contains=()):
        """Check that ``call()`` raises one of ``kinds``; returns the exception."""
        try:
            call()
        except kinds as exc:
            text = str(exc)
            for part in contains:
                self.check(part in text, f"{what}: message {text!r} lacks {part!r}")
            return exc
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            self.check(False, f"{what}: raised {type(exc).__name__}: {exc}; expected "
                              f"{_names(kinds)}")
            return None
        self.check(False, f"{what}: raised nothing; expected {_names(kinds)}")
        return None

    def sum(self, value):
        return self.mpi.allreduce(value, op=MPI.SUM)

    def max(self, value):
        return self.mpi.allreduce(value, op=MPI.MAX)

    def any(self, flag):
        return self.mpi.allreduce(bool(flag), op=MPI.LOR)

    def report(self, **fields):
        """A summary row from rank 0 (pass totals that every rank computed)."""
        if self.rank == 0:
            _report(world=self.world, **fields)


def _names(kinds):
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(k.__name__ for k in kinds)


def run(name, main):
    """Run ``main(scenario)`` on this rank and exit with the agreed status."""
    scenario = Scenario(name)
    try:
        main(scenario)
    except BaseException:  # noqa: BLE001 - abort the job rather than leave peers waiting
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        scenario.mpi.Abort(1)
    failed = scenario.any(scenario.failures)
    faulthandler.cancel_dump_traceback_later()
    if failed:
        scenario.log(f"{scenario.failures} failed check(s) here; some rank failed: exit 1")
        sys.stdout.flush()
        sys.exit(1)


def poison(array, stream):
    """Overwrite a device array with NaN (every byte 0xff), queued on ``stream``."""
    from pyar import _hip
    if array.nbytes:
        _hip.memset(array.ptr, NAN_BYTE, array.nbytes, stream)


def start_epochs_at(comm, epoch):
    """Test hook (collective, between calls): every block's epoch in this rank's Signal,
    and every flag slot of it, is set to ``epoch`` on every rank, as if that many calls had
    run -- so that a scenario crosses the 32-bit wrap of the epochs within a few calls.

    Writes the start of the Signal area of the communicator's buffer
    (src/kernels/pyar_protocol.h: ``flags[phases][max_blocks][max_ranks]``, uint64 words
    holding the epoch in their low half (a start flag's high half, the call's digest,
    matters only once the slot reached the next epoch, which the peers' next call
    stores), then ``epoch[max_blocks]``, uint32; then ``failed[max_blocks]`` and
    ``some_block_failed``, uint32, and ``signature[2][max_blocks][max_ranks]``, uint64,
    which it leaves alone) with the runtime's memcpy, after every rank's calls have
    finished and before any rank's next call (peers store into this rank's flags).
    The sizes come from the communicator's own code object (its KernelLayout); the
    Signal area ends where the scratch starts (comm.geometry.scratch); the scenarios'
    communicators span COMM_WORLD, whose barrier orders the ranks."""
    from pyar import _hip
    from pyar.comm.layout import KernelLayout
    lay = KernelLayout(comm.load_module("allreduce"))
    signal = comm.geometry.scratch - lay.signal_bytes
    if comm.geometry.failed_word != signal + lay.failed_offset:
        raise AssertionError(f"the Signal area does not start at {signal:#x}: its failure "
                             f"word is at {comm.geometry.failed_word:#x}")
    flags = 3 * lay.max_blocks * lay.max_ranks
    signatures = -(-(lay.failed_offset + 4) // 8) * 8  # uint64-aligned after the word
    expected = -(-(signatures + 8 * 2 * lay.max_blocks * lay.max_ranks) // 16) * 16
    if (lay.failed_offset, lay.signal_bytes) != (8 * flags + 8 * lay.max_blocks, expected):
        raise AssertionError(f"unexpected Signal layout: {lay.signal_bytes} bytes, failure "
                             f"word at {lay.failed_offset}, for {lay.max_blocks} blocks and "
                             f"{lay.max_ranks} ranks")
    comm.synchronize()
    _hip.device_synchronize()
    MPI.COMM_WORLD.Barrier()
    _hip.memcpy_htod(signal, np.full(flags, epoch, np.uint64).tobytes()
                     + np.full(lay.max_blocks, epoch, np.uint32).tobytes())
    _hip.device_synchronize()
    MPI.COMM_WORLD.Barrier()


def disturbed_calls(comm, kernels, streams, level, local, count, call, tolerate_timeout=False):
    """Queue ``call(k)`` for k < ``count`` on ``streams[0]`` with no host sync in
    between, each after a spin of up to ``level.delay_us`` with probability
    ``level.delay_p`` (a slow rank) and with spin kernels on ``streams[1]`` over
    the multiprocessors with probability ``level.noise_p`` (a disturbed one),
    drawn from ``local``; then wait for them.  Returns whether one timed out:
    with ``tolerate_timeout`` a CollectiveTimeout is printed and reported so,
    else raised.  ``level``: tests/mpi/allreduce_adversarial.py's Level."""
    import pyar
    stream, noise_stream = streams
    sms = pyar.Device(comm.device).multiprocessor_count
    for k in range(count):
        if local.random() < level.noise_p:
            noise_stream.wait(stream)  # the noise starts with this call
            kernels.spin(local.uniform(0, level.noise_us), noise_stream,
                         blocks=sms * level.noise_per_sm)
        if local.random() < level.delay_p:
            kernels.spin(local.uniform(0, level.delay_us), stream)
        call(k)
    try:
        comm.synchronize(stream)
    except pyar.CollectiveTimeout as exc:
        if not tolerate_timeout:
            raise
        noise_stream.synchronize()
        print(f"[rank {comm.rank}] {exc}", flush=True)
        return True
    noise_stream.synchronize()
    return False


def count_wrong(sc, outs, expected, chosen, stream, label, shown, most=5):
    """How many of ``outs[k]`` differ bitwise from ``expected[chosen[k]]`` (raw
    bits); the first differences are printed, ``most`` in all counting the
    ``shown`` before.  Returns (wrong, shown)."""
    wrong = 0
    for k, out in enumerate(outs):
        got = out.get(stream=stream)
        want = expected[chosen[k]]
        if not np.array_equal(bits(got), want):
            wrong += 1
            if shown < most:
                shown += 1
                sc.log(f"{label} call {k} of a round: "
                       f"{describe_difference(got, want.view(got.dtype))}")
    return wrong, shown
