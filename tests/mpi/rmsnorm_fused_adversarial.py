"""rmsnorm_fused.py's adversarial, wrap and control modes: rounds of calls
queued with no host sync while ranks are delayed or disturbed and inputs
overwritten with NaN, every output compared bit for bit with an undisturbed
run (``FusedWorkload``); the controls run the same against kernels built
without a barrier or keeping the lamport slots' data, and report what they
find.

Ranks run under mpirun, one GPU a rank; importing needs no GPU.
"""
import time

import ml_dtypes
import numpy as np

import pyar
from pyar import _hip
from allreduce_common import NAN_WORD, normal, rng, small_integers, start_epochs_at
from rmsnorm_fused_common import EPS, FP8, Checker, digest, host, setup
from tests.mpi_launch import control_build


VARIANTS = ("onestage", "twostage")
# The adversarial scenario and its control also run split; epoch wrap does not
# (split's kernel A takes its epochs and barriers from two-stage's code).
BARRIER_VARIANTS = (*VARIANTS, "split")
# lamport has no barrier to leave out: the adversarial scenario and epoch wrap
# run it, and its own control keeps the slots' data (control-lamport).
ADVERSARIAL_VARIANTS = (*BARRIER_VARIANTS, "lamport")
WRAP_VARIANTS = (*VARIANTS, "lamport")


K = 50
PATTERNS = 5
ADVERSARIAL_CALLS = 1000
ADVERSARIAL_SHAPE = (128, 4096)   # 1 MiB of bf16 per call: a long read window
CONTROL_SECONDS = 120
CONTROL_CALLS = 3000
WRAP_BEFORE = 300


class Level:
    def __init__(self, delay_p, delay_us, noise_p, noise_us, noise_per_sm):
        self.delay_p, self.delay_us = delay_p, delay_us
        self.noise_p, self.noise_us, self.noise_per_sm = noise_p, noise_us, noise_per_sm


MAIN_LEVEL = Level(0.3, 200, 0.2, 200, 1)
CONTROL_LEVEL = Level(0.5, 300, 0.8, 500, 16)


class FusedWorkload:
    """K input/output sets for one variant, patterns per rank, and the
    expected bits of every output from an undisturbed run of each pattern."""

    def __init__(self, sc, comm, kernels, streams, dtype, algo, kind, key, registered, level,
                 expected=None):
        self.sc, self.comm, self.kernels = sc, comm, kernels
        self.stream, self.noise_stream = streams
        self.dtype, self.algo, self.kind, self.level = dtype, algo, kind, level
        self.registered = registered
        tokens, hidden = ADVERSARIAL_SHAPE
        self.shape = ADVERSARIAL_SHAPE
        n = tokens * hidden
        stream = self.stream
        self.sms = pyar.Device(comm.device).multiprocessor_count
        # Small integers: sums exact in every dtype and the same in every rank order.
        self.sources = [pyar.asarray(small_integers(dtype, n, *key, sc.rank, j)
                                     .reshape(self.shape), stream=stream)
                        for j in range(PATTERNS)]
        self.residuals = [pyar.asarray(small_integers(dtype, n, *key, 77, j).reshape(self.shape),
                                       stream=stream) for j in range(PATTERNS)]
        self.weight = pyar.asarray((1 + 0.25 * normal(np.float32, hidden, *key, 5)).astype(dtype),
                                   stream=stream)
        self.xs = [pyar.empty(self.shape, dtype, stream=stream, ipc=True) for _ in range(K)]
        if registered:
            for x in self.xs:
                comm.register(x)
        self.outs = [self._outputs() for _ in range(K)]
        self.shared = rng(*key, 1_000_003)
        self.local = rng(*key, 2_000_003, sc.rank)
        self.last = -1
        if expected is not None:  # from a correct build: the control's kernels are not
            self.expected = expected
            return
        self.expected = []
        check = Checker(sc)
        for j in range(PATTERNS):
            _hip.memcpy_dtod(self.xs[0].ptr, self.sources[j].ptr, self.xs[0].nbytes, stream)
            self._call(0, j)
            comm.synchronize(stream)
            got = [host(a, stream) for a in self.outs[0]]
            everyone = [small_integers(dtype, n, *key, r, j).astype(np.float64)
                        for r in range(sc.world)]
            s64 = np.sum(everyone, axis=0).reshape(self.shape)
            abs_sum = np.sum(np.abs(everyone), axis=0).reshape(self.shape)
            check.outputs(f"{dtype.name} {algo} pattern {j}", dtype, s64, abs_sum,
                          self.residuals[j].get(stream=stream), self.weight.get(stream=stream),
                          got[0], got[1], kind, got[2], got[3], 128)
            self.expected.append(digest(*got))
        sc.check(check.failed == 0, f"{algo}: the undisturbed reference run is wrong")

    def _outputs(self):
        tokens, hidden = self.shape
        s = self.stream
        return (pyar.empty(self.shape, self.dtype, stream=s),
                pyar.empty(self.shape, self.dtype, stream=s),
                pyar.empty(self.shape, FP8, stream=s),
                pyar.empty((tokens, hidden // 128), np.float32, stream=s))

    def _call(self, k, j):
        y, r, q, scales = self.outs[k]
        self.comm.allreduce_rmsnorm(self.xs[k], self.residuals[j], self.weight, EPS, out=y,
                                    residual_out=r, stream=self.stream, quant=self.kind,
                                    fp8_dtype=FP8, quantized=q, scales=scales, algo=self.algo)

    def round(self, tolerate_timeout=False):
        comm, kernels, stream, level = self.comm, self.kernels, self.stream, self.level
        chosen = []
        for k in range(K):
            j = (self.last + 1 + int(self.shared.integers(PATTERNS - 1))) % PATTERNS
            self.last = j
            chosen.append(j)
            _hip.memcpy_dtod(self.xs[k].ptr, self.sources[j].ptr, self.xs[k].nbytes, stream)
            for a in self.outs[k]:
                kernels.fill_u32(a.ptr, NAN_WORD, a.nbytes // 4, stream)
        for k in range(K):
            if self.local.random() < level.noise_p:
                self.noise_stream.wait(stream)
                kernels.spin(self.local.uniform(0, level.noise_us), self.noise_stream,
                             blocks=self.sms * level.noise_per_sm)
            if self.local.random() < level.delay_p:
                kernels.spin(self.local.uniform(0, level.delay_us), stream)
            self._call(k, chosen[k])
            kernels.fill_u32(self.xs[k].ptr, NAN_WORD, self.xs[k].nbytes // 4, stream)
        try:
            comm.synchronize(stream)
        except pyar.CollectiveTimeout as exc:
            if not tolerate_timeout:
                raise
            self.noise_stream.synchronize()
            self.sc.log(f"{self.algo}: {exc}")
            return 0, True
        self.noise_stream.synchronize()
        wrong = 0
        for k in range(K):
            if digest(*[host(a, stream) for a in self.outs[k]]) != self.expected[chosen[k]]:
                wrong += 1
        return wrong, False


def adversarial_mode(sc, wrap=False):
    comm, kernels, streams = setup(sc, timeout=60.0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    keep = []
    for a, algo in enumerate(WRAP_VARIANTS if wrap else ADVERSARIAL_VARIANTS):
        for registered in (False, True):
            work = FusedWorkload(sc, comm, kernels, streams, bf16, algo, "fp8_per_group",
                                 (a, registered), registered, MAIN_LEVEL)
            keep.append(work.xs)
            if wrap:
                start_epochs_at(comm, 2**32 - WRAP_BEFORE)
            wrong = calls = 0
            started = time.monotonic()
            while calls < ADVERSARIAL_CALLS:
                wrong += work.round()[0]
                calls += K
            sc.check(wrong == 0, f"{algo}: {wrong} of {calls} calls gave wrong outputs")
            sc.report(test="fused-adversarial-wrap" if wrap else "fused-adversarial",
                      algo=algo, dtype=bf16.name,
                      variant="registered" if registered else "staged", calls=calls,
                      mismatches=sc.sum(wrong),
                      seconds=round(sc.max(time.monotonic() - started), 2))
            del work
    comm.close()
    keep.clear()


def control_mode(sc, mode, kernels_path):
    """"control": the barrier variants, registered inputs under CONTROL_LEVEL;
    "control-start" (one-stage, two-stage) and "control-lamport": staged
    inputs and only the last rank delayed, before every call."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    start = mode != "control"
    late = sc.rank == sc.world - 1
    level = Level(1.0 if late else 0.0, 300, 0.0, 0, 1) if start else CONTROL_LEVEL
    registered = not start
    variants = {"control": BARRIER_VARIANTS, "control-start": VARIANTS,
                "control-lamport": ("lamport",)}[mode]
    for a, algo in enumerate(variants):
        key = (10 + a, 1)
        comm, kernels, streams = setup(sc, timeout=60.0)
        expected = FusedWorkload(sc, comm, kernels, streams, bf16, algo, "fp8_per_group", key,
                                 registered, level).expected
        comm.close()
        comm, kernels, streams = setup(sc, timeout=1.0, kernels=kernels_path)
        work = FusedWorkload(sc, comm, kernels, streams, bf16, algo, "fp8_per_group", key,
                             registered, level, expected)
        # The ranks start the calls together: the 1 s timeout is for the
        # kernels, not for one rank's slower setup.
        sc.mpi.Barrier()
        started = time.monotonic()
        calls = found = timeouts = 0
        while calls < CONTROL_CALLS and time.monotonic() - started < CONTROL_SECONDS:
            wrong, timed_out = work.round(tolerate_timeout=True)
            calls += K
            found += sc.sum(wrong)
            if sc.any(timed_out):
                timeouts += 1
                break  # this communicator refuses further calls
            if found:
                break
        sc.report(test=f"fused-{mode}", algo=algo,
                  build=control_build(kernels_path), dtype=bf16.name,
                  variant="registered" if registered else "staged",
                  calls=calls, mismatches=found, timeouts=timeouts,
                  seconds=round(sc.max(time.monotonic() - started), 2))
        del work
        comm.close()
