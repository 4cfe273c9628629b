"""The fused all-reduce + residual add + RMSNorm (+ quantization) on real ranks.

Modes:
  random        Per-rank random x against a float64 reference built from every
                rank's input: one-stage, two-stage, split, lamport (which
                refuses rows over 16 KiB and inputs over 1 MiB) and auto;
                fp32/fp16/bf16;
                token counts from 1 to 300 (chunked through a 1 MiB scratch),
                hidden sizes 512 to 16384 incl. 2880 and 7168; no quant, FP8
                per token, FP8 per group of 128 and MXFP4; staged and
                registered inputs, residual in place and out of place.
                residual_out within rounding of the float64 sum, y within
                rounding of the norm of the stored residual, quantized output
                after dequantization within the format's rounding and scales
                exactly; outputs bitwise identical across ranks and between
                the variants (split is held to two-stage's bits only: equal
                bits are within the bounds two-stage was checked against).
                Then bad input raises on every rank.
  unfused       algo="unfused" (the steps as separate kernels, what "auto"
                runs past the fused crossover) against the reference and
                bitwise against the two-stage kernel, with and without out.
  adversarial   The seeds' bug provoked for each variant (split, lamport too), like
                allreduce_adversarial.py: rounds of K calls queued with no host
                sync, every caller overwrites its input with NaN right after
                each call while random ranks are delayed or disturbed; staged
                and registered inputs; every output (y, residual_out, FP8 codes
                and scales) compared bit for bit with an undisturbed run.
  wrap          adversarial (one-stage, two-stage, lamport), each (variant,
                input) starting with the epochs WRAP_BEFORE calls before 2**32
                (start_epochs_at): every block crosses the 32-bit wrap under
                the adversarial load.
  control PATH  The same against kernels built without the barrier each
                variant relies on (one-stage: exit, two-stage and split's
                first kernel: mid); runs until
                it sees wrong outputs, within a budget; reports, never fails.
  control-start PATH
                The start barrier's control: kernels built without it
                (PYAR_TEST_SKIP_PHASE=kStart), staged inputs, the last rank
                delayed before every call, so its kernel's copy into its
                scratch lands after the peers read that scratch (also run
                against kernels that copy after their start barrier,
                PYAR_TEST_STAGE_MUTATION=kStageAfterStart); reports, never
                fails.
  control-lamport PATH
                The lamport slots' control: kernels that leave every taken
                pack in the slot (PYAR_TEST_LAMPORT_KEEP_DATA), the last rank
                delayed before every call, so its peers take the rows it
                pushed two calls before; reports, never fails.
  serve         A server's decode loop: graphs captured per (token count,
                hidden) on first use, token counts drawn from 1..256, hidden
                4096 and 7168, CALLS calls replayed with fresh inputs and a
                quantization that depends on the token count; every output
                equal, bit for bit, to the leading rows of an eager call over
                all rows that is checked against the float64 reference.
"""
import hashlib
import time

import ml_dtypes
import numpy as np
from mpi4py import MPI

import pyar
from pyar import _hip, quant
from pyar.quant._common import half_ulp
from allreduce_common import (
    DTYPES, NAN_WORD, bits, normal, rng, run, small_integers, start_epochs_at,
)
from tests.gpu_kernels import GpuTestKernels
from tests.mpi_launch import control_build

VARIANTS = ("onestage", "twostage")
# The adversarial scenario and its control also run split; epoch wrap does not
# (split's kernel A takes its epochs and barriers from two-stage's code).
BARRIER_VARIANTS = (*VARIANTS, "split")
# lamport has no barrier to leave out: the adversarial scenario and epoch wrap
# run it, and its own control keeps the slots' data (control-lamport).
ADVERSARIAL_VARIANTS = (*BARRIER_VARIANTS, "lamport")
WRAP_VARIANTS = (*VARIANTS, "lamport")
KINDS = (None, "fp8_per_token", "fp8_per_group", "mxfp4")
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
EPS = 1e-6
_FORMAT = {  # dtype name -> (mantissa bits, smallest normal exponent)
    "float32": (23, -126), "float16": (10, -14), "bfloat16": (7, -126)}


def ulp(v, dtype):
    nmant, emin = _FORMAT[np.dtype(dtype).name]
    return 2 * half_ulp(v, nmant, emin)


def norm_reference(r, weight):
    """y of the stored residual r (any float dtype), in float64."""
    r = r.astype(np.float64)
    return r / np.sqrt(np.mean(r * r, axis=-1, keepdims=True) + EPS) * weight.astype(np.float64)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(np.ascontiguousarray(a).view(np.uint8).tobytes())
    return h.hexdigest()


class Checker:
    """Compares one call's outputs (host copies) with the references."""

    def __init__(self, sc):
        self.sc = sc
        self.failed = 0

    def fail(self, what, message):
        self.failed += 1
        self.sc.check(False, f"{what}: {message}")

    def outputs(self, what, dtype, s64, abs_sum, residual, weight, y, r, kind=None, q=None,
                scales=None, group=None):
        """s64: the float64 sum; abs_sum: sum over ranks of |x| (for the
        accumulation bound).  Returns whether everything was within bounds."""
        before = self.failed
        r64 = s64 + residual.astype(np.float64)
        # s rounded once to the dtype after fp32 accumulation, then r rounded once.
        bound = (ulp(s64, dtype) / 2 + ulp(r64, dtype) / 2 + 2.0 ** -22 * abs_sum
                 + 2.0 ** -149)
        got_r = r.astype(np.float64)
        err = np.abs(got_r - r64)
        if not np.all(err <= bound):
            i = np.unravel_index(np.argmax(err - bound), err.shape)
            self.fail(what, f"residual_out off at {i}: got {got_r[i]!r}, want {r64[i]!r} "
                            f"(bound {bound[i]:.3g}; {int(np.sum(err > bound))} elements)")
            return False
        y_ref = norm_reference(r, weight)
        if y is not None:
            got_y = y.astype(np.float64)
            bound = ulp(y_ref, dtype) + 1e-5 * np.abs(y_ref) + 1e-30
            err = np.abs(got_y - y_ref)
            if not np.all(err <= bound):
                i = np.unravel_index(np.argmax(err - bound), err.shape)
                self.fail(what, f"y off at {i}: got {got_y[i]!r}, want {y_ref[i]!r} "
                                f"({int(np.sum(err > bound))} elements)")
                return False
        if kind is not None:
            self.quantized(what, kind, y if y is not None else y_ref.astype(dtype), q, scales,
                           group, exact_y=y is not None)
        return self.failed == before

    def quantized(self, what, kind, y, q, scales, group, exact_y):
        """Scales exactly those of the reference quantizer applied to the
        kernel's own y; codes within the format's rounding of y."""
        if exact_y:
            ref_q, ref_scales = quant.quantize(y, kind, group_size=group, fp8_dtype=FP8)
            if not np.array_equal(bits(scales), bits(ref_scales)):
                bad = int(np.sum(bits(scales) != bits(ref_scales)))
                self.fail(what, f"{kind}: {bad} of {scales.size} scales differ from the "
                                "reference's")
                return
        y64 = y.astype(np.float64)
        back = quant.dequantize(q, scales, kind, out_dtype=np.float64)
        bound = quant.rounding_bound(y64, scales, kind, fp8_dtype=FP8) * (1 + 2.0 ** -20) \
            + np.abs(y64) * 2.0 ** -22 + 1e-30
        if not exact_y:
            bound = bound + ulp(y64, y.dtype)  # y itself is only known within rounding
        err = np.abs(back - y64)
        if not np.all(err <= bound):
            i = np.unravel_index(np.argmax(err - bound), err.shape)
            self.fail(what, f"{kind}: dequantized {back[i]!r} at {i}, y {y64[i]!r} "
                            f"({int(np.sum(err > bound))} elements beyond rounding)")


def setup(sc, **kwargs):
    comm = pyar.Communicator(MPI.COMM_WORLD, **kwargs)
    return comm, GpuTestKernels(comm.device), (pyar.Stream(), pyar.Stream())


def host(a, stream):
    return None if a is None else a.get(stream=stream)


# --- random ---------------------------------------------------------------------------

RANDOM_SHAPES = [(1, 4096), (7, 2880), (64, 7168), (300, 4096), (3, 16384), (33, 512)]


def lamport_takes(tokens, hidden, dtype):
    """Whether algo="lamport" takes the input in random mode's communicator:
    rows of one pack (16 bytes) per thread of 1024, inputs within one receive
    segment (the 1 MiB max_size)."""
    row_bytes = hidden * dtype.itemsize
    return row_bytes <= 1024 * 16 and tokens * row_bytes <= 1 << 20


def group_size(hidden):
    """128 where it divides the row; 2880 = 45 * 64 takes groups of 64."""
    return 128 if hidden % 128 == 0 else 64


def random_inputs(sc, dtype, tokens, hidden, key, stream):
    """Every rank's x drawn from ``key`` (this rank's on the GPU), their
    float64 sum and sum of magnitudes, a residual and a weight (host and GPU)."""
    xs = [normal(dtype, tokens * hidden, *key, r).reshape(tokens, hidden)
          for r in range(sc.world)]
    s64 = np.sum([x.astype(np.float64) for x in xs], axis=0)
    abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    residual = normal(dtype, tokens * hidden, *key, 99).reshape(tokens, hidden)
    weight = (1 + 0.5 * normal(np.float32, hidden, *key, 98)).astype(dtype)
    return (s64, abs_sum, residual, weight, pyar.asarray(xs[sc.rank], stream=stream),
            pyar.asarray(weight, stream=stream))


def random_mode(sc):
    comm, _, (stream, _) = setup(sc, max_size=1 << 20)
    check = Checker(sc)
    rows = {}
    calls = 0
    keep = []
    for d, dtype in enumerate(DTYPES):
        for shape_index, (tokens, hidden) in enumerate(RANDOM_SHAPES):
            s64, abs_sum, residual, weight, x_dev, w_dev = random_inputs(
                sc, dtype, tokens, hidden, (d, shape_index), stream)
            for ki, kind in enumerate(KINDS):
                registered = ki % 2 == 1
                if registered:
                    x_reg = pyar.asarray(x_dev.get(stream=stream), stream=stream, ipc=True)
                    comm.register(x_reg)
                    keep.append(x_reg)
                for algo in ("onestage", "twostage", "split", "lamport", "auto"):
                    in_place = algo in ("twostage", "split")
                    res_dev = pyar.asarray(residual, stream=stream)
                    if algo == "lamport" and not lamport_takes(tokens, hidden, dtype):
                        sc.expect_raises(ValueError, lambda: comm.allreduce_rmsnorm(
                            x_dev, res_dev, w_dev, EPS, stream=stream, algo="lamport"),
                            f"{dtype.name} {tokens}x{hidden} lamport", ("algo='lamport'",))
                        continue
                    out = pyar.empty((tokens, hidden), dtype, stream=stream)
                    got = comm.allreduce_rmsnorm(
                        x_reg if registered else x_dev, res_dev, w_dev, EPS, out=out,
                        residual_out=None if in_place else pyar.empty_like(res_dev),
                        stream=stream, quant=kind, algo=algo, group_size=group_size(hidden),
                        fp8_dtype=None if kind is None or kind == "mxfp4" else FP8)
                    comm.synchronize(stream)
                    calls += 1
                    y, r = host(got.out, stream), host(got.residual_out, stream)
                    q, scales = host(got.quantized, stream), host(got.scales, stream)
                    what = f"{dtype.name} {tokens}x{hidden} {kind} {algo} " + \
                        ("registered" if registered else "staged")
                    if in_place and got.residual_out is not res_dev:
                        check.fail(what, "residual_out=None did not update residual in place")
                    group = group_size(hidden) if kind == "fp8_per_group" else None
                    if algo != "split":  # split: two-stage's bits (variant_differences)
                        check.outputs(what, dtype, s64, abs_sum, residual, weight, y, r, kind,
                                      q, scales, group)
                    rows.setdefault((dtype.name, algo), [0, 0])
                    rows[(dtype.name, algo)][0] += 1
                    h = digest(y, r, q, scales)
                    everyone = sc.mpi.allgather(h)
                    if len(set(everyone)) != 1:
                        rows[(dtype.name, algo)][1] += 1
                        check.fail(what, "outputs differ between ranks")
                    rows.setdefault(("variants", what.rsplit(" ", 2)[0] + str(registered)),
                                    set()).add(h)
    variant_differences = sum(1 for k, v in rows.items() if k[0] == "variants" and len(v) != 1)
    sc.check(variant_differences == 0,
             f"{variant_differences} configurations gave different bits in different variants")
    failed = sc.sum(check.failed)
    for (name, algo), value in sorted((k, v) for k, v in rows.items() if k[0] != "variants"):
        sc.report(test="fused-random", dtype=name, algo=algo, calls=value[0],
                  rank_differences=value[1])
    sc.report(test="fused-random-total", calls=calls, mismatches=failed,
              variant_differences=variant_differences)
    bad_input(sc, comm, stream)
    comm.close()
    keep.clear()


def bad_input(sc, comm, stream):
    """Every rank raises the same clear error; nothing is launched."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = pyar.zeros((4, 4096), bf16, stream=stream)
    res = pyar.zeros((4, 4096), bf16, stream=stream)
    w = pyar.zeros((4096,), bf16, stream=stream)
    cases = [
        (TypeError, lambda: comm.allreduce_rmsnorm(pyar.zeros((4, 4096), np.float64), res, w),
         "dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, pyar.zeros((5, 4096), bf16), w),
         "residual has shape"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, pyar.zeros((2048,), bf16)),
         "weight has shape"),
        (TypeError, lambda: comm.allreduce_rmsnorm(x, pyar.zeros((4, 4096), np.float16), w),
         "residual has dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            pyar.zeros((4, 20), bf16), pyar.zeros((4, 20), bf16), pyar.zeros((20,), bf16)),
         "hidden size 20"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            pyar.zeros((1, 32768), bf16), pyar.zeros((1, 32768), bf16),
            pyar.zeros((32768,), bf16)), "hidden size 32768"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, out=pyar.zeros((4, 2048), bf16)),
         "out has shape"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, out=x), "overlaps"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="int4"), "quant"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="fp8_per_group",
                                                    group_size=96), "group_size"),
        (ValueError, lambda: comm.allreduce_rmsnorm(
            x, res, w, quant="mxfp4", quantized=pyar.zeros((4, 4096), np.uint8)),
         "quantized has shape"),
        (TypeError, lambda: comm.allreduce_rmsnorm(x, res, w, quant="fp8_per_token",
                                                   fp8_dtype=np.float16), "fp8_dtype"),
        (ValueError, lambda: comm.allreduce_rmsnorm(x, res, w, algo="threestage"), "algo"),
        (TypeError, lambda: comm.allreduce_rmsnorm(np.zeros((4, 4096), bf16), res, w), "host"),
    ]
    raised = 0
    for kinds, call, phrase in cases:
        raised += sc.expect_raises(kinds, call, f"bad input ({phrase})", (phrase,)) is not None
    # The communicator still works afterwards.
    got = comm.allreduce_rmsnorm(x, res, w, stream=stream)
    comm.synchronize(stream)
    sc.check(not np.isnan(got.out.get(stream=stream).astype(np.float32)).any(),
             "a call after the errors returned NaN")
    comm.close()
    sc.expect_raises(ValueError, lambda: comm.allreduce_rmsnorm(x, res, w), "closed",
                     ("closed",))
    sc.report(test="fused-bad-input", cases=len(cases), raised=sc.sum(raised) // sc.world)


# --- adversarial and its control ----------------------------------------------------

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


# --- serving -----------------------------------------------------------------------

SERVE_CALLS = 2000
SERVE_HIDDEN = (4096, 7168)
MAX_TOKENS = 256
POOL = 4


def serve_mode(sc):
    comm, _, (stream, _) = setup(sc, timeout=60.0)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    check = Checker(sc)
    shared = rng(31, 1)
    pools = {}
    for hidden in SERVE_HIDDEN:
        shape = (MAX_TOKENS, hidden)
        mine = [normal(bf16, MAX_TOKENS * hidden, 31, hidden, sc.rank, p).reshape(shape)
                for p in range(POOL)]
        sums, abs_sums = [], []
        for p in range(POOL):
            s = np.empty(shape, np.float64)
            sc.mpi.Allreduce(mine[p].astype(np.float64), s, op=MPI.SUM)
            a = np.empty(shape, np.float64)
            sc.mpi.Allreduce(np.abs(mine[p].astype(np.float64)), a, op=MPI.SUM)
            sums.append(s)
            abs_sums.append(a)
        residuals = [normal(bf16, MAX_TOKENS * hidden, 31, hidden, 1000 + p).reshape(shape)
                     for p in range(POOL)]
        weight = (1 + 0.5 * normal(np.float32, hidden, 31, hidden, 7)).astype(bf16)
        static = dict(
            x=pyar.empty(shape, bf16, stream=stream), res=pyar.empty(shape, bf16, stream=stream),
            y=pyar.empty(shape, bf16, stream=stream), r=pyar.empty(shape, bf16, stream=stream),
            q=pyar.empty(shape, np.uint8, stream=stream),
            scales=pyar.empty((MAX_TOKENS, hidden // 32), np.float32, stream=stream),
            w=pyar.asarray(weight, stream=stream))
        pools[hidden] = dict(
            x=[pyar.asarray(m, stream=stream) for m in mine],
            res=[pyar.asarray(r, stream=stream) for r in residuals],
            host_res=residuals, sums=sums, abs_sums=abs_sums, weight=weight, static=static,
            graphs={}, golden={})
    graphs = 0
    started = time.monotonic()
    for call in range(SERVE_CALLS):
        hidden = SERVE_HIDDEN[call % 2]
        tokens = int(shared.integers(1, MAX_TOKENS + 1))
        p = int(shared.integers(POOL))
        pool = pools[hidden]
        st = pool["static"]
        kind = KINDS[tokens % len(KINDS)]
        view = _views(st, tokens, hidden, kind)
        if tokens not in pool["graphs"]:
            with comm.capture(stream) as graph:
                comm.allreduce_rmsnorm(view["x"], view["res"], st["w"], EPS, out=view["y"],
                                       residual_out=view["r"], stream=stream, quant=kind,
                                       fp8_dtype=FP8, quantized=view.get("q"),
                                       scales=view.get("scales"))
            pool["graphs"][tokens] = graph
            graphs += 1
        golden = _golden(comm, check, stream, pool, hidden, p, kind)
        _load_inputs(st, pool, p, tokens * hidden * 2, stream)
        pool["graphs"][tokens].replay(stream)
        comm.synchronize(stream)
        for name, a in view.items():
            got, want = host(a, stream), golden[name][:tokens]
            if not np.array_equal(bits(got), bits(want)):
                check.fail(f"call {call}: {tokens}x{hidden} {kind}",
                           f"{name}: {int(np.sum(bits(got) != bits(want)))} elements differ from "
                           "the checked eager call's")
    failed = sc.sum(check.failed)
    sc.report(test="fused-serve", calls=SERVE_CALLS, graphs=sc.max(graphs), mismatches=failed,
              seconds=round(sc.max(time.monotonic() - started), 2))
    for pool in pools.values():
        for graph in pool["graphs"].values():
            graph.close()
        pool["graphs"].clear()
    comm.close()


def _load_inputs(static, pool, p, nbytes, stream):
    """Pool entry p's input and residual into the static buffers, outputs
    filled with 0xFF so that anything a call leaves unwritten shows."""
    _hip.memcpy_dtod(static["x"].ptr, pool["x"][p].ptr, nbytes, stream)
    _hip.memcpy_dtod(static["res"].ptr, pool["res"][p].ptr, nbytes, stream)
    for name in ("y", "r", "q", "scales"):
        _hip.memset(static[name].ptr, 0xFF, static[name].nbytes, stream)


def _golden(comm, check, stream, pool, hidden, p, kind):
    """All MAX_TOKENS rows of pool entry p through an eager call, checked
    against the float64 reference.  Rows are computed independently and
    bitwise alike by both variants (the random mode checks it), so every
    replay's outputs must equal the leading rows of these bits: an exact
    check that costs a comparison, not a reference, per call."""
    key = (p, kind)
    if key not in pool["golden"]:
        st = pool["static"]
        view = _views(st, MAX_TOKENS, hidden, kind)
        _load_inputs(st, pool, p, st["x"].nbytes, stream)
        comm.allreduce_rmsnorm(view["x"], view["res"], st["w"], EPS, out=view["y"],
                               residual_out=view["r"], stream=stream, quant=kind,
                               fp8_dtype=FP8, quantized=view.get("q"),
                               scales=view.get("scales"))
        comm.synchronize(stream)
        got = {name: host(a, stream) for name, a in view.items()}
        bf16 = np.dtype(ml_dtypes.bfloat16)
        check.outputs(f"eager {MAX_TOKENS}x{hidden} {kind} (pool {p})", bf16, pool["sums"][p],
                      pool["abs_sums"][p], pool["host_res"][p], pool["weight"], got["y"],
                      got["r"], kind, got.get("q"), got.get("scales"), 128)
        pool["golden"][key] = got
    return pool["golden"][key]


def _views(static, tokens, hidden, kind):
    """Leading rows of the static buffers, as the arrays one call uses."""
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def rows(name, width, dtype):
        a = static[name]
        return pyar.DeviceArray.from_pointer(a.ptr, (tokens, width), dtype, owner=a,
                                             device=a.device)

    view = {name: rows(name, hidden, bf16) for name in ("x", "res", "y", "r")}
    if kind in ("fp8_per_token", "fp8_per_group"):
        view["q"] = rows("q", hidden, FP8)
        groups = 1 if kind == "fp8_per_token" else hidden // 128
        view["scales"] = rows("scales", groups, np.float32)
    elif kind == "mxfp4":
        view["q"] = rows("q", hidden // 2, np.uint8)
        view["scales"] = rows("scales", hidden // 32, np.uint8)
    return view


# --- unfused -----------------------------------------------------------------------

UNFUSED_SHAPES = [(7, 2880), (300, 4096), (3, 16384)]


def unfused_mode(sc):
    """algo="unfused" (what "auto" runs past the fused crossover): the
    all-reduce, then the single-GPU add + RMSNorm (+ quantization) kernel;
    its outputs within the float64 reference's bounds and bitwise those of
    the fused two-stage kernel, with out and with only a quantized output."""
    comm, _, (stream, _) = setup(sc, max_size=1 << 20)
    check = Checker(sc)
    calls = differences = 0
    for d, dtype in enumerate(DTYPES):
        for shape_index, (tokens, hidden) in enumerate(UNFUSED_SHAPES):
            s64, abs_sum, residual, weight, x_dev, w_dev = random_inputs(
                sc, dtype, tokens, hidden, (d, shape_index, 7), stream)
            for kind in KINDS:
                for with_out in (True, False) if kind else (True,):
                    hashes = {}
                    for algo in ("twostage", "unfused"):
                        res_dev = pyar.asarray(residual, stream=stream)
                        got = comm.allreduce_rmsnorm(
                            x_dev, res_dev, w_dev, EPS,
                            out=pyar.empty((tokens, hidden), dtype, stream=stream)
                            if with_out else None,
                            residual_out=pyar.empty_like(res_dev), stream=stream, quant=kind,
                            algo=algo, group_size=group_size(hidden),
                            fp8_dtype=None if kind is None or kind == "mxfp4" else FP8)
                        comm.synchronize(stream)
                        y, r = host(got.out, stream), host(got.residual_out, stream)
                        q, scales = host(got.quantized, stream), host(got.scales, stream)
                        what = f"{dtype.name} {tokens}x{hidden} {kind} {algo} out={with_out}"
                        group = group_size(hidden) if kind == "fp8_per_group" else None
                        check.outputs(what, dtype, s64, abs_sum, residual, weight, y, r, kind,
                                      q, scales, group)
                        hashes[algo] = digest(y, r, q, scales)
                        calls += 1
                    if hashes["twostage"] != hashes["unfused"]:
                        differences += 1
                        check.fail(what, "unfused outputs differ from the two-stage kernel's")
    sc.report(test="fused-unfused", calls=calls, mismatches=sc.sum(check.failed),
              variant_differences=sc.sum(differences))
    comm.close()


def main(sc):
    mode = sc.argv[0] if sc.argv else "random"
    if mode == "random":
        random_mode(sc)
    elif mode == "unfused":
        unfused_mode(sc)
    elif mode in ("adversarial", "wrap"):
        adversarial_mode(sc, wrap=mode == "wrap")
    elif mode in ("control", "control-start", "control-lamport"):
        control_mode(sc, mode, sc.argv[1])
    elif mode == "serve":
        serve_mode(sc)
    else:
        raise SystemExit(f"unknown mode {mode!r}: random | unfused | adversarial | wrap | "
                         "control PATH | control-start PATH | control-lamport PATH | serve")


if __name__ == "__main__":
    run("rmsnorm_fused", main)
