"""reduce_scatter and all_gather on real GPUs (docs/api.md).

random   Per dtype and count (1, 4097, one over the scratch size, 2**20 + 3,
         and a multiple of 16 bytes times the world size (shards of one length),
         on a communicator with a small scratch buffer, so the large ones go in
         chunks) and per input mode (staged; registered; captured: a graph of
         the calls, its inputs recorded in place, replayed with new data):
         random per-rank inputs (seeded by rank, configuration and mode) are
         reduce-scattered into this rank's shard (x's dtype, and float32 for
         float16/bfloat16), the shard all-gathered back, and the input
         all-reduced once for comparison.  Required:
         - the shard is within the fp32-sum tolerance of the float64 reference
           ((W eps_fp32 + eps_dtype) sum |x_r|; float32 output: W eps_fp32);
         - it holds exactly the bits of the all-reduce's elements (both sum in
           fp32 in rank order; the float32 output rounds to them);
         - the gathered array is exactly the concatenation of every rank's
           shard, hence the all-reduce's result, and the same bits on every rank;
         - with integer-valued inputs (``exact`` rows: counts 4097 and the
           shards of one length) every sum is exact;
         - inputs of out-of-place calls are unchanged;
         - without ``out`` (a new array per call, planned then replayed) the
           same bits as into a given one.
         A world of one: both are copies.
adversarial
         The seeds' bug provoked, as tests/mpi/allreduce_adversarial.py does
         for the all-reduce: rounds of K calls with no host sync, each into its
         own output (NaN beforehand), each input overwritten with NaN right
         after its call, random ranks delayed or disturbed; staged and
         registered inputs; CALLS calls per (operation, variant); zero wrong.
control PATH
         The adversarial rounds against kernels built without the exit barrier
         (PYAR_TEST_SKIP_EXIT_BARRIER), escalating the disturbance while
         nothing was seen, within a call and time budget; reports wrong
         results, never fails for them (the test asserts that some showed).

Usage: shard_collectives.py random | adversarial | all | control PATH
"""
import hashlib
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip
from pyar.comm import shards
from allreduce_adversarial import CONTROL_LEVELS, Level
from allreduce_common import (
    DTYPES, NAN_WORD, bits, count_wrong, describe_difference, disturbed_calls, exact_sum, normal,
    rng, run, small_integers,
)
from tests.gpu_kernels import GpuTestKernels

SMALL_SCRATCH = 256 << 10
MODES = ("staged", "registered", "captured")
EPS32 = float(np.finfo(np.float32).eps)
F32 = np.dtype(np.float32)
K = 50                  # calls per adversarial round
CALLS = 500             # per (operation, variant) in adversarial mode
ADVERSARIAL_LEVEL = Level(256 << 10, 0.3, 200, 0.2, 200, 1)
CONTROL_CALLS = 1000    # per (level, operation, variant)
CONTROL_SECONDS = 60
CONTROL_TIMEOUT = 1.0
PATTERNS = 5
TAIL_BYTES = 12


def counts(dtype, world):
    """1, odd, one over the scratch size, 2**20 + 3, and shards of one length
    (which all_gather reads in place when registered or captured)."""
    over = SMALL_SCRATCH // dtype.itemsize + 5
    even = shards.lanes(dtype.itemsize) * world * 2053
    return (1, 4097, over, (1 << 20) + 3, even)


def out_dtypes(dtype):
    return (dtype,) if dtype == F32 else (dtype, F32)


class Row:
    FIELDS = ("calls", "out_of_tolerance", "allreduce_differences", "gather_differences",
              "rank_differences", "inputs_changed", "inexact")

    def __init__(self):
        self.values = dict.fromkeys(self.FIELDS, 0)

    def bad(self, sc, field, message):
        self.values[field] += 1
        sc.check(False, message)


class Calls:
    """One configuration's arrays and its calls, eager or captured."""

    def __init__(self, sc, comm, stream, dtype, n, mode, registered):
        self.sc, self.comm, self.stream, self.mode = sc, comm, stream, mode
        self.dtype, self.n = dtype, n
        start, end = shards.bounds(n, sc.world, dtype.itemsize, sc.rank)
        self.start, self.end = start, end
        ipc = mode != "staged"  # registered, or recorded in place by a capture
        self.x = pyar.empty((n,), dtype, stream=stream, ipc=ipc)
        if mode == "registered":
            comm.register(self.x)
            registered.append(self.x)
        # all_gather reads its input in place only when every shard is as long.
        even = sc.world * shards.shard_size(n, sc.world, dtype.itemsize) == n
        self.shards = {o: pyar.empty((end - start,), o, stream=stream, ipc=ipc and even)
                       for o in out_dtypes(dtype)}
        if mode == "registered" and even:
            comm.register(self.shards[dtype])
            registered.append(self.shards[dtype])
        self.gathered = pyar.empty((n,), dtype, stream=stream)
        self.summed = pyar.empty((n,), dtype, stream=stream)
        self.graph = None
        if mode == "captured":
            stream.synchronize()
            with comm.capture(stream) as graph:
                self._queue()
            self.graph = graph

    def _queue(self):
        comm, stream = self.comm, self.stream
        for o, out in self.shards.items():
            returned = comm.reduce_scatter(self.x, out=out, stream=stream)
            if returned is not out:
                self.sc.check(False, "reduce_scatter did not return its out")
        comm.all_gather(self.shards[self.dtype], out=self.gathered, stream=stream)
        comm.allreduce(self.x, out=self.summed, stream=stream)

    def run(self, values):
        self.x.set(values, stream=self.stream)
        if self.graph is None:
            self._queue()
        else:
            self.graph.replay(self.stream)
        self.comm.synchronize(self.stream)

    def close(self):
        if self.graph is not None:
            self.graph.close()


def check_config(sc, calls, inputs, row, what, exact):
    dtype, start, end = calls.dtype, calls.start, calls.end
    world = sc.world
    reference = np.zeros(calls.n, np.float64)
    magnitude = np.zeros(calls.n, np.float64)
    for a in inputs:
        reference += a.astype(np.float64)
        magnitude += np.abs(a.astype(np.float64))
    calls.run(inputs[sc.rank])
    summed = calls.summed.get(stream=calls.stream)
    mine = summed[start:end]
    for o, out in calls.shards.items():
        got = out.get(stream=calls.stream)
        row.values["calls"] += 1
        label = f"{what} reduce_scatter to {np.dtype(o).name}"
        eps = 0.0 if o == F32 and dtype != F32 else float(ml_dtypes.finfo(dtype).eps)
        bound = (world * EPS32 + eps) * magnitude[start:end] + float(
            ml_dtypes.finfo(dtype).smallest_subnormal)
        error = np.abs(got.astype(np.float64) - reference[start:end])
        outside = int(np.count_nonzero(~(error <= bound)))
        if outside:
            worst = int(np.nanargmax(np.where(np.isnan(error), np.inf, error / bound)))
            row.bad(sc, "out_of_tolerance", f"{label}: {outside} elements outside tolerance, "
                    f"worst at {start + worst}: got {float(got[worst])!r}, reference "
                    f"{reference[start + worst]!r}")
        if exact and not np.array_equal(got.astype(np.float64), reference[start:end]):
            row.bad(sc, "inexact", f"{label}: integer-valued sums not exact")
        if not np.array_equal(bits(got.astype(dtype)), bits(mine)):
            row.bad(sc, "allreduce_differences", f"{label}: not the all-reduce's bits: "
                    f"{describe_difference(got.astype(dtype), mine)}")
    gathered = calls.gathered.get(stream=calls.stream)
    row.values["calls"] += 1
    if not np.array_equal(bits(gathered), bits(summed)):
        row.bad(sc, "gather_differences", f"{what} all_gather of the shards is not the "
                f"all-reduce: {describe_difference(gathered, summed)}")
    if not np.array_equal(bits(calls.x.get(stream=calls.stream)), bits(inputs[sc.rank])):
        row.bad(sc, "inputs_changed", f"{what}: the input changed")
    return hashlib.sha256(bits(gathered).tobytes()).digest()


def random_mode(sc):
    if sc.world == 1:
        return world_of_one(sc)
    comm = pyar.Communicator(MPI.COMM_WORLD, max_size=SMALL_SCRATCH, timeout=60.0)
    stream = pyar.Stream()
    registered = []  # alive until the communicator closes
    rows = {}
    config = 0
    for dtype in DTYPES:
        for n in counts(dtype, sc.world):
            config += 1
            every = [Calls(sc, comm, stream, dtype, n, mode, registered) for mode in MODES]
            digests = []
            # Integer-valued inputs (exact sums) at two counts; the others random.
            exacts = (False, True) if n in (4097, counts(dtype, sc.world)[-1]) else (False,)
            for exact in exacts:
                make = small_integers if exact else normal
                inputs = [make(dtype, n, config, exact, r) for r in range(sc.world)]
                for calls in every:
                    row = rows.setdefault((dtype.name, calls.mode, exact), Row())
                    what = f"{dtype.name} n={n} {calls.mode}{' exact' if exact else ''}"
                    digests.append((row, what, check_config(sc, calls, inputs, row, what,
                                                            exact)))
                del inputs
            for calls in every:
                calls.close()
            everyone = sc.mpi.allgather([d for _, _, d in digests])
            for i, (row, what, digest) in enumerate(digests):
                differ = [r for r in range(sc.world) if everyone[r][i] != digest]
                if differ:
                    row.bad(sc, "rank_differences", f"{what}: gathered bits differ from "
                            f"rank(s) {differ}")
    fresh_outputs(sc, comm, stream)
    comm.close()
    for (dtype, mode, exact), row in rows.items():
        sc.report(test="shards-random", dtype=dtype, mode=mode, exact=exact,
                  **{k: sc.sum(v) if k != "calls" else v for k, v in row.values.items()})


def fresh_outputs(sc, comm, stream):
    """Without ``out`` each call returns a new array (a replayed plan allocates
    its own): the same bits as into a given ``out``, for every dtype."""
    wrong = 0
    for d, dtype in enumerate(DTYPES):
        n = 4097
        x = pyar.asarray(normal(dtype, n, 77, d, sc.rank), stream=stream)
        given = pyar.empty((shards.length(n, sc.world, dtype.itemsize, sc.rank),), dtype,
                           stream=stream)
        comm.reduce_scatter(x, out=given, stream=stream)
        whole = comm.all_gather(given, n=n, stream=stream)
        comm.synchronize(stream)
        want, want_whole = bits(given.get(stream=stream)), bits(whole.get(stream=stream))
        for _ in range(2):  # planned, then replayed
            shard = comm.reduce_scatter(x, stream=stream)
            gathered = comm.all_gather(shard, n=n, stream=stream)
            comm.synchronize(stream)
            wrong += not sc.check(
                shard is not given and np.array_equal(bits(shard.get(stream=stream)), want)
                and np.array_equal(bits(gathered.get(stream=stream)), want_whole),
                f"{dtype.name}: a new output differs from a given one")
    sc.report(test="shards-fresh", mismatches=sc.sum(wrong))


def world_of_one(sc):
    """Both collectives are copies; a float32 shard of a 16-bit input is refused."""
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=60.0)
    stream = pyar.Stream()
    wrong = 0
    for dtype in DTYPES:
        values = normal(dtype, 4097, 99)
        x = pyar.asarray(values, stream=stream)
        for got in (comm.reduce_scatter(x, stream=stream),
                    comm.all_gather(x, stream=stream, n=4097)):
            comm.synchronize(stream)
            wrong += not sc.check(np.array_equal(bits(got.get(stream=stream)), bits(values)),
                                  f"{dtype.name}: a world of one did not copy")
        if dtype != F32:
            sc.expect_raises(ValueError, lambda: comm.reduce_scatter(
                x, out=pyar.empty((4097,), F32, stream=stream)), "float32 out in a world of one")
    comm.close()
    sc.report(test="shards-world-of-one", mismatches=wrong)


# --- write-after-read ------------------------------------------------------------------

class Workload:
    """K inputs and outputs of one (operation, variant, dtype, level) and the
    expected results of PATTERNS input patterns."""

    def __init__(self, sc, comm, kernels, streams, operation, variant, dtype, level, key):
        self.sc, self.comm, self.kernels = sc, comm, kernels
        self.stream, self.noise_stream = streams
        self.operation, self.variant, self.dtype, self.level = operation, variant, dtype, level
        world, itemsize = sc.world, dtype.itemsize
        n = level.nbytes // itemsize + TAIL_BYTES // itemsize
        if operation == "all_gather" and variant == "registered":
            lanes = shards.lanes(itemsize)
            n = -(-n // (lanes * world)) * lanes * world  # shards of one length
        self.n = n
        start, end = shards.bounds(n, world, itemsize, sc.rank)
        wholes = [[small_integers(dtype, n, *key, r, j) for j in range(PATTERNS)]
                  for r in range(world)]
        if operation == "reduce_scatter":
            mine = [wholes[sc.rank][j] for j in range(PATTERNS)]
            self.expected = [bits(exact_sum([w[j] for w in wholes], dtype)[start:end])
                             for j in range(PATTERNS)]
            out_size = end - start
        else:
            # Rank q contributes its shard of its own pattern j.
            mine = [wholes[sc.rank][j][start:end] for j in range(PATTERNS)]
            self.expected = [bits(np.concatenate([
                wholes[q][j][slice(*shards.bounds(n, world, itemsize, q))]
                for q in range(world)])) for j in range(PATTERNS)]
            out_size = n
        del wholes
        stream = self.stream
        self.sources = [pyar.asarray(p, stream=stream) for p in mine]
        self.in_bytes = self.sources[0].nbytes
        self.outs = [pyar.empty((out_size,), dtype, stream=stream) for _ in range(K)]
        self.inputs = [pyar.empty((mine[0].size,), dtype, stream=stream, ipc=True)
                       for _ in range(K)]
        if variant == "registered":
            for x in self.inputs:
                comm.register(x)  # kept alive until the communicator closes
        self.shared = rng(*key, 1_000_003)
        self.local = rng(*key, 2_000_003, sc.rank)
        self.last = -1
        self.details = 0

    def reads_in_place(self):
        """Whether the calls read the inputs in place (collective): only a
        registered buffer can be unregistered (ValueError otherwise; a
        MismatchError, also one, where the ranks' staged shards differ in
        size), so the first input is unregistered and registered again."""
        x = self.inputs[0]
        try:
            self.comm.unregister(x)
        except ValueError:
            return False
        self.comm.register(x)
        return True

    def round(self, tolerate_timeout=False):
        """K calls back to back; returns (wrong results here, whether a call timed out)."""
        comm, kernels, stream, level = self.comm, self.kernels, self.stream, self.level
        words, out_words = self.in_bytes // 4, self.outs[0].nbytes // 4
        chosen = []
        for k in range(K):
            j = (self.last + 1 + int(self.shared.integers(PATTERNS - 1))) % PATTERNS
            self.last = j
            chosen.append(j)
            if words:
                _hip.memcpy_dtod(self.inputs[k].ptr, self.sources[j].ptr, self.in_bytes, stream)
            if out_words:
                kernels.fill_u32(self.outs[k].ptr, NAN_WORD, out_words, stream)
        collective = getattr(comm, self.operation)

        def call(k):
            collective(self.inputs[k], out=self.outs[k], stream=stream)
            if words:
                kernels.fill_u32(self.inputs[k].ptr, NAN_WORD, words, stream)  # reused at once

        if disturbed_calls(comm, kernels, (stream, self.noise_stream), level, self.local, K,
                           call, tolerate_timeout):
            return 0, True
        wrong, self.details = count_wrong(self.sc, self.outs, self.expected, chosen, stream,
                                          f"{self.operation} {self.variant}", self.details)
        return wrong, False


OPERATIONS = ("reduce_scatter", "all_gather")
VARIANTS = ("staged", "registered")


def connect(kernels_path=None, timeout=60.0):
    kwargs = {} if kernels_path is None else {"kernels": kernels_path}
    comm = pyar.Communicator(MPI.COMM_WORLD, timeout=timeout, **kwargs)
    return comm, GpuTestKernels(comm.device), (pyar.Stream(), pyar.Stream())


def adversarial_mode(sc):
    comm, kernels, streams = connect()
    dtype = DTYPES[0]
    for o, operation in enumerate(OPERATIONS):
        for v, variant in enumerate(VARIANTS):
            work = Workload(sc, comm, kernels, streams, operation, variant, dtype,
                            ADVERSARIAL_LEVEL, (o, v, 30))
            in_place = work.reads_in_place()
            sc.check(in_place == (variant == "registered"),
                     f"{operation} {variant}: reads in place is {in_place}")
            wrong = calls = 0
            started = time.monotonic()
            while calls < CALLS:
                wrong += work.round()[0]
                calls += K
            sc.check(wrong == 0, f"{operation} {variant}: {wrong} of {calls} results wrong")
            sc.report(test="shards-adversarial", operation=operation, variant=variant,
                      dtype=dtype.name, calls=calls, mismatches=sc.sum(wrong),
                      seconds=round(sc.max(time.monotonic() - started), 2),
                      **ADVERSARIAL_LEVEL.describe())
            del work
    comm.close()


def control_mode(sc, kernels_path):
    """Each operation escalates through the levels on its own until one of its
    variants shows a wrong result (or the time is spent): the two operations
    read peers' buffers differently, so one may need more disturbance."""
    comm, kernels, streams = connect(kernels_path, CONTROL_TIMEOUT)
    started = time.monotonic()
    detected = timeouts = calls_total = 0
    dtype = DTYPES[0]

    def spent():
        return sc.max(time.monotonic() - started) > CONTROL_SECONDS

    for o, operation in enumerate(OPERATIONS):
        seen = 0
        for li, level in enumerate(CONTROL_LEVELS):
            for v, variant in enumerate(VARIANTS):
                key = (o, v, 40 + li)
                work = Workload(sc, comm, kernels, streams, operation, variant, dtype, level,
                                key)
                calls = found = broken = 0
                while calls < CONTROL_CALLS:
                    wrong, timed_out = work.round(tolerate_timeout=True)
                    calls += K
                    found += sc.sum(wrong)
                    if sc.any(timed_out):
                        broken += 1
                        del work
                        comm.close()
                        comm, kernels, streams = connect(kernels_path, CONTROL_TIMEOUT)
                        work = Workload(sc, comm, kernels, streams, operation, variant, dtype,
                                        level, key)
                    if found or spent():
                        break
                del work
                seen += found
                timeouts += broken
                calls_total += calls
                sc.report(test="shards-control", operation=operation, variant=variant,
                          level=li, calls=calls, mismatches=found, timeouts=broken,
                          seconds=round(sc.max(time.monotonic() - started), 2))
            if seen or spent():
                break  # escalate only while nothing was seen for this operation
        detected += seen
    sc.report(test="shards-control-total", calls=calls_total, mismatches=detected,
              timeouts=timeouts, seconds=round(sc.max(time.monotonic() - started), 2))
    comm.close()


def main(sc):
    mode = sc.argv[0] if sc.argv else "all"
    if mode in ("random", "all"):
        random_mode(sc)
    if mode in ("adversarial", "all") and sc.world > 1:
        adversarial_mode(sc)
    if mode == "control":
        control_mode(sc, sc.argv[1])
    elif mode not in ("random", "adversarial", "all"):
        raise SystemExit(f"unknown mode {mode!r}: random | adversarial | all | control PATH")


if __name__ == "__main__":
    run("shard_collectives", main)
